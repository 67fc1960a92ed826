// The daemon's control socket (control.hpp; doc/integrity.md section 11).
#include "daemon/control.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "daemon/socket_server.hpp"
#include "nvfs/control.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::control {

struct Server::State {
  Filesystem* fs = nullptr;
  std::string socket_path;
  struct stat namespace_stat {};
  daemon::SocketServer socket;  // the listening socket, its thread

  void Run();
  void Handle(int conn);
};

namespace {

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

// One request: the grow's size and the proof, a descriptor of the very
// namespace, open for reading and writing.
void Server::State::Handle(int conn) {
  const timeval timeout{2, 0};  // a client that sends nothing is dropped
  (void)setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  Reply reply{};
  reply.magic = kMagic;
  const auto say = [&](int error, const char* fmt, auto... args) {
    reply.error = error;
    std::snprintf(reply.message, sizeof reply.message, fmt, args...);
  };
  Request req{};
  int passed = -1;
  bool bad = false;  // ancillary data cut short (room for one descriptor only)
  const ssize_t n = ReceiveWithFd<1>(conn, &req, sizeof req, 0, &passed, &bad);
  struct stat st {};
  if (n != static_cast<ssize_t>(sizeof req) || req.magic != kMagic || req.version != kVersion ||
      req.op != kOpGrow || bad) {
    say(EPROTO, "malformed request");
  } else if (passed < 0 || fstat(passed, &st) != 0) {
    say(EPERM, "no descriptor of the namespace came with the request");
  } else if (S_ISCHR(namespace_stat.st_mode)
                 ? (!S_ISCHR(st.st_mode) || st.st_rdev != namespace_stat.st_rdev)
                 : (st.st_dev != namespace_stat.st_dev || st.st_ino != namespace_stat.st_ino)) {
    say(EPERM, "the descriptor passed is not of the namespace this mount serves");
  } else if ((fcntl(passed, F_GETFL) & O_ACCMODE) != O_RDWR) {
    say(EPERM, "the namespace's descriptor is not open for reading and writing");
  } else {
    Result<Filesystem::GrowResult> grown = fs->Grow(req.size);
    if (!grown.ok()) {
      say(grown.code(), "%s", grown.error().message.c_str());
    } else {
      reply.old_blocks = grown->old_blocks;
      reply.new_blocks = grown->new_blocks;
      reply.block_size = grown->block_size;
      reply.added_free_blocks = grown->added_free_blocks;
      reply.added_free_inodes = grown->added_free_inodes;
    }
  }
  CloseFd(passed);
  (void)send(conn, &reply, sizeof reply, MSG_NOSIGNAL);
}

void Server::State::Run() {
  for (;;) {
    pollfd fds[2] = {{socket.listen_fd(), POLLIN, 0}, {socket.wake_fd(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    int conn = accept4(socket.listen_fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    ucred peer{};
    socklen_t len = sizeof peer;
    // Root only (the socket is 0600 and root's; this says so again).
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.uid == 0) {
      Handle(conn);
    }
    CloseFd(conn);
  }
}

std::unique_ptr<Server> Server::Create(Filesystem& fs, dev_t mount_dev,
                                       const std::string& namespace_path, std::string* why) {
  auto s = std::make_unique<State>();
  if (!daemon::RootAndNamespace(namespace_path, &s->namespace_stat, why)) return nullptr;
  s->fs = &fs;
  s->socket_path = SocketPath(mount_dev);
  // Root only; the peer's credentials say so again (Run).
  if (!s->socket.Listen(s->socket_path, 0600, 8, 0, why)) return nullptr;
  return std::unique_ptr<Server>(new Server(std::move(s)));
}

Server::Server(std::unique_ptr<State> state) : state_(std::move(state)) {}

Server::~Server() { Stop(); }

bool Server::Serve() {
  State* s = state_.get();
  return s->socket.Start([s] { s->Run(); });
}

void Server::Stop() { state_->socket.Stop(); }

const std::string& Server::socket_path() const { return state_->socket_path; }

}  // namespace nvfs::control
