// The daemon's side of the control socket (include/nvfs/control.hpp): one
// thread, one request at a time, so a grow never runs twice at once and a
// client that stalls holds up only other control requests, never the mount.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "nvfs/fs.hpp"

namespace nvfs::control {

class Server {
 public:
  // Binds control::SocketPath(mount_dev) (nvfs/paths.hpp), mode 0600 (root
  // only). nullptr, with one line in *why, when it cannot (the mount goes
  // on; nvfs-resize then says the daemon cannot be asked).
  static std::unique_ptr<Server> Create(Filesystem& fs, dev_t mount_dev,
                                        const std::string& namespace_path, std::string* why);
  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // Starts the thread (after fuse_daemonize). False if it cannot.
  bool Serve();
  // Ends the thread (waits for a grow in progress) and removes the socket.
  void Stop();
  const std::string& socket_path() const;

  struct State;

 private:
  explicit Server(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace nvfs::control
