// One mount's life, steps 2 to 4 of main.cpp's list: the core mounted, the
// FUSE session mounted and its INIT served, the direct-read and control
// sockets bound, the daemon detached, the transport's and the sockets'
// threads started, requests served until the session ends, and everything
// taken down again in order.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>

#include "daemon/control.hpp"
#include "daemon/direct_server.hpp"
#include "daemon/options.hpp"
#include "fuse/adapter.hpp"
#include "fuse/uring.hpp"
#include "nvfs/fs.hpp"

namespace nvfs::daemon {

class Daemon {
 public:
  // `cl` and `options` must outlive the Daemon.
  Daemon(const CommandLine& cl, const DaemonOptions& options);
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Each step returns 0 to go on, else the exit status (1), having said why
  // and undone what was done before it (the namespace is left clean).
  // The FUSE session (from `args`), the core, the FUSE mount, INIT served.
  int Mount(fuse_args* args);
  // Binds the direct-read socket (direct=on) and the control socket (a
  // read-write mount) before the daemon detaches; a refusal leaves the
  // mount without them.
  void OpenSockets();
  // fuse_daemonize (unless -f).
  int Detach();
  // The rings (io_uring) and the sockets' threads, after the fork; says the
  // "mounted on" line.
  int Start();
  // Serves until the session ends, then takes everything down; the exit
  // status.
  int Run();

 private:
  // Unmounts the FUSE mount (if `fuse_mounted`), removes the signal
  // handlers and unmounts the core; returns 1.
  int GiveUp(bool fuse_mounted);

  const CommandLine& cl_;
  const DaemonOptions& options_;
  FuseAdapter adapter_;
  std::unique_ptr<fuse_session, void (*)(fuse_session*)> session_{nullptr,
                                                                  fuse_session_destroy};
  // Direct reads' server: declared before the filesystem, whose inode
  // cache writes into its table to the end, so that it goes after it.
  std::unique_ptr<direct::Server> direct_;
  std::unique_ptr<control::Server> control_;
  std::unique_ptr<Filesystem> fs_;
  std::unique_ptr<UringTransport> ring_;
  // The FUSE mount's device number, from mountinfo once INIT is served
  // (Mount); the sockets are named by it, and the namespace's mark names it.
  std::optional<dev_t> mount_dev_;
  bool use_ring_ = false;
  std::string direct_note_ = "direct reads off";
};

}  // namespace nvfs::daemon
