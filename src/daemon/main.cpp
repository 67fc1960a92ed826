// nvfs: mounts an nvfs namespace through FUSE (libfuse3, low-level API).
//
//   nvfs [-f] [-d] [-s] [-o OPTION,...] DEVICE MOUNTPOINT
//
// Life cycle, in this order, so that every refusal happens before anything
// is mounted and leaves the namespace untouched or cleanly unmounted:
//   1. parse the command line (fuse_opt): nvfs's own options are taken out,
//      the rest goes to libfuse (fuse_session_new rejects what it does not
//      know, before the namespace is opened); the libfuse loaded must be
//      the one the transport was written for (src/fuse/transport.hpp);
//   2. mount the core (Filesystem::Mount): a missing, foreign, damaged or
//      in-use namespace fails here with one line and exit status 1;
//   3. mount the FUSE file system, detach (unless -f), serve requests;
//   4. on umount, SIGTERM, SIGINT or SIGHUP: leave the loop, unmount FUSE,
//      then Filesystem::Unmount (exact counters, state clean) and exit 0.
// After kill -9 nothing of this runs: every operation that returned is
// durable already, and the next mount recovers (journal, orphans).
//
// The command line is options.cpp's, the mount's life serve.cpp's, the
// sockets' control.cpp's and direct_server.cpp's.
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "daemon/host.hpp"
#include "daemon/options.hpp"
#include "daemon/say.hpp"
#include "daemon/serve.hpp"
#include "fuse/transport.hpp"

namespace {

// mount -o remount,... of a fuse.nvfs mount runs us (mount.fuse3) with
// "remount": the namespace is served already, by the daemon of that
// mount, and the kernel makes the change itself (ro/rw, the mount's
// flags). Hand it to mount(8) (-i: no helper, so not us again), as
// libfuse's own mount helpers do; no second daemon starts.
int Remount(const nvfs::daemon::CommandLine& cl) {
  std::string opts = "remount";
  for (const std::string& o : cl.vfs_options) opts += "," + o;
  const std::string mountpoint = cl.positional[1];
  execlp("mount", "mount", "-i", "-o", opts.c_str(), mountpoint.c_str(),
         static_cast<char*>(nullptr));
  nvfs::daemon::Say("remount: cannot run mount(8): %s", std::strerror(errno));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  fuse_args args = FUSE_ARGS_INIT(argc, argv);
  std::unique_ptr<fuse_args, void (*)(fuse_args*)> args_owner(&args, fuse_opt_free_args);
  nvfs::daemon::CommandLine cl;
  if (const int status = nvfs::daemon::ParseCommandLine(&args, &cl); status >= 0) return status;
  if (cl.remount) return Remount(cl);
  // Before anything is opened: the transport is written for one libfuse.
  if (const std::string why = nvfs::LibfuseUnsupported(fuse_version(), fuse_pkgversion());
      !why.empty()) {
    nvfs::daemon::Say("%s", why.c_str());
    return 1;
  }
  nvfs::daemon::CloseInheritedDescriptors();
  nvfs::daemon::DaemonOptions options;
  if (const int status = nvfs::daemon::CheckOptions(cl, &options); status >= 0) return status;
  if (!nvfs::daemon::AddMountArgs(&args, cl, options.device)) return 1;

  nvfs::daemon::Daemon served(cl, options);
  if (const int status = served.Mount(&args); status != 0) return status;
  served.OpenSockets();
  if (const int status = served.Detach(); status != 0) return status;
  if (const int status = served.Start(); status != 0) return status;
  return served.Run();
}
