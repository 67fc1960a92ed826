// The daemon's control socket (control.hpp; doc/integrity.md section 12).
#include "daemon/control.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "daemon/socket_server.hpp"
#include "nvfs/control.hpp"
#include "nvfs/paths.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::control {

struct Server::State {
  Filesystem* fs = nullptr;
  std::string socket_path;
  struct stat namespace_stat {};
  daemon::SocketServer socket;  // the listening socket, its thread
  daemon::ClientDescriptors descriptors;

  void Run();
  void Handle(int conn);
};

// One request: the grow's size and the proof, a descriptor of the very
// namespace, open for reading and writing.
void Server::State::Handle(int conn) {
  const timeval timeout{2, 0};  // a client that sends nothing is dropped
  (void)setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  Reply reply{};
  reply.magic = kMagic;
  const auto say = [&](int error, const std::string& message) {
    reply.error = error;
    std::snprintf(reply.message, sizeof reply.message, "%s", message.c_str());
  };
  Request req{};
  PassedFds passed;
  const ssize_t n = ReceiveWithFds(conn, &req, sizeof req, MSG_WAITALL, &passed);
  const int fd = n >= 0 && passed.count == 1 && !passed.other ? passed.fds[0] : -1;
  if (n != static_cast<ssize_t>(sizeof req) || req.magic != kMagic || req.version != kVersion ||
      req.op != kOpGrow || (n >= 0 && (passed.count > 1 || passed.other))) {
    say(EPROTO, "malformed request");
  } else if (fd < 0) {
    say(EPERM, "no descriptor of the namespace came with the request");
  } else if (!descriptors.IsNamespace(fd)) {
    say(EPERM, "the descriptor passed is not of the namespace this mount serves");
  } else if ((fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR) {
    say(EPERM, "the namespace's descriptor is not open for reading and writing");
  } else {
    try {
      Result<Filesystem::GrowResult> grown = fs->Grow(req.size);
      if (!grown.ok()) {
        say(grown.code(), grown.error().message);
      } else {
        reply.old_blocks = grown->old_blocks;
        reply.new_blocks = grown->new_blocks;
        reply.block_size = grown->block_size;
        reply.added_free_blocks = grown->added_free_blocks;
        reply.added_free_inodes = grown->added_free_inodes;
      }
    } catch (const std::bad_alloc&) {
      say(ENOMEM, "out of memory");
    }
  }
  for (size_t i = 0; n >= 0 && i < passed.count; ++i) descriptors.Release(passed.fds[i], 0);
  (void)send(conn, &reply, sizeof reply, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Server::State::Run() {
  for (;;) {
    pollfd fds[2] = {{socket.listen_fd(), POLLIN, 0}, {socket.wake_fd(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    const int conn = accept4(socket.listen_fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    ucred peer{};
    socklen_t len = sizeof peer;
    // Root only (the socket is 0600 and root's; this says so again).
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.uid == 0) {
      Handle(conn);
    }
    descriptors.CloseConnection(conn, peer.uid);
  }
}

std::unique_ptr<Server> Server::Create(Filesystem& fs, dev_t mount_dev,
                                       const std::string& namespace_path, std::string* why) {
  auto s = std::make_unique<State>();
  if (!daemon::RootAndNamespace(namespace_path, &s->namespace_stat, why)) return nullptr;
  s->fs = &fs;
  s->socket_path = SocketPath(mount_dev);
  if (!s->descriptors.Start(s->namespace_stat, mount_dev, why)) return nullptr;
  // Root only; the peer's credentials say so again (Run).
  // Only root can connect, and nvfs-resize sends its descriptor with its
  // first message: descriptors are taken from the connect on.
  if (!s->socket.Listen(s->socket_path, 0600, 8, 0, /*descriptors_from_connect=*/true, why)) {
    return nullptr;
  }
  return std::unique_ptr<Server>(new Server(std::move(s)));
}

Server::Server(std::unique_ptr<State> state) : state_(std::move(state)) {}

Server::~Server() { Stop(); }

bool Server::Serve() {
  State* s = state_.get();
  return s->socket.Start(s->descriptors, [s] { s->Run(); });
}

void Server::Stop() { state_->socket.Stop(); }

const std::string& Server::socket_path() const { return state_->socket_path; }

}  // namespace nvfs::control
