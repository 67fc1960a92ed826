// The skeleton the daemon's two sockets share, the direct-read socket
// (direct_server.cpp) and the control socket (control.cpp): a unix
// stream socket bound in /run/nvfs, an eventfd that tells the serving
// thread to return, the thread, and at the end the socket file removed if
// it is still the one bound here. What is served, and to whom (each
// checks its peer's credentials itself), is theirs.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "daemon/reaper.hpp"

namespace nvfs::daemon {

// What both servers check first: the daemon is root (only root may make
// sockets in /run/nvfs), and the namespace at `namespace_path` is there;
// its identity goes to *namespace_stat, which a client's proof is checked
// against. False with one line in *why.
bool RootAndNamespace(const std::string& namespace_path, struct stat* namespace_stat,
                      std::string* why);

// What a server does with the descriptors and connections of its clients,
// so that no client can make it wait (doc/integrity.md section 10). A
// descriptor whose close cannot wait (the namespace itself; a regular file
// or directory of this mount, whose close sends no FLUSH, as open sets
// noflush, and whose last close only queues a RELEASE) is closed at once;
// any other goes to the reaper, counted against the client's uid.
class ClientDescriptors {
 public:
  // False with one line in *why if there is no memory for the reaper.
  bool Start(const struct stat& namespace_stat, dev_t mount_dev, std::string* why);
  // Starts the reaper's thread: after the daemon detaches (Reaper::Run),
  // before the server takes its first connection. False with one line in
  // *why if it cannot.
  bool Serve(std::string* why) { return reaper_->Run(why); }

  // The descriptor is of the very namespace (its file, or its device).
  bool IsNamespace(int fd) const;
  bool IsNamespace(const struct statx& stx) const;
  // Closes `fd`, passed by `owner`, here if that cannot wait, else on the
  // reaper's thread.
  void Release(int fd, uid_t owner) const noexcept;
  // Ends a connection of `owner`: shut down both ways first, so that no
  // message can be queued after; if messages are still queued (they may
  // hold descriptors, released at the socket's last close) the reaper
  // closes it.
  void CloseConnection(int fd, uid_t owner) const noexcept;
  // Descriptors of `owner` handed to the reaper whose close has not returned.
  unsigned Pending(uid_t owner) const noexcept { return reaper_->Pending(owner); }

 private:
  struct stat namespace_stat_ {};
  dev_t mount_dev_ = 0;
  std::unique_ptr<Reaper> reaper_;
};

class SocketServer {
 public:
  SocketServer() = default;
  ~SocketServer() { Stop(); }
  SocketServer(const SocketServer&) = delete;
  SocketServer& operator=(const SocketServer&) = delete;

  // Makes /run/nvfs if needed (it must be root's and writable by root
  // alone: a socket in it is then a daemon's, and clients check the same),
  // removes a socket left at `path` by a killed daemon, and binds `path`
  // with `mode` (under a umask that allows no more, so it is never more
  // open than that), listening with `backlog`. `type_flags` are added to
  // SOCK_STREAM | SOCK_CLOEXEC (SOCK_NONBLOCK, say). Unless
  // `descriptors_from_connect`, no connection accepted from it may pass
  // descriptors (SO_PASSRIGHTS off, from before listen()) until the server
  // allows it on that connection (AcceptDescriptors, util/fd_passing.hpp);
  // descriptors_gated() says whether the kernel could be told (Linux 6.16
  // and later). False with one line in *why, nothing left behind.
  bool Listen(const std::string& path, mode_t mode, int backlog, int type_flags,
              bool descriptors_from_connect, std::string* why);
  bool descriptors_gated() const { return descriptors_gated_; }

  // Starts the server's threads, once the daemon has detached: the reaper
  // of `descriptors` (ClientDescriptors::Serve), then `run` on a thread of
  // its own, which returns once wake_fd() polls readable. False if either
  // cannot start (or `run` is running, or nothing listens).
  bool Start(ClientDescriptors& descriptors, std::function<void()> run);
  // Wakes the thread and waits for it to return. Idempotent.
  void Join();
  // Join(), then removes the socket file if it is still the one bound here
  // and closes both descriptors. Idempotent.
  void Stop();

  int listen_fd() const { return listen_fd_; }
  int wake_fd() const { return wake_fd_; }

 private:
  std::string path_;
  int listen_fd_ = -1;
  ino_t socket_ino_ = 0;  // the socket file bound here
  int wake_fd_ = -1;      // eventfd: Join() ends the thread
  bool descriptors_gated_ = false;
  std::thread thread_;
};

}  // namespace nvfs::daemon
