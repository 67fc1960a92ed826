// The daemon's control socket (control.hpp; doc/integrity.md section 11).
#include "daemon/control.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <thread>

#include "nvfs/control.hpp"

namespace nvfs::control {

struct Server::State {
  Filesystem* fs = nullptr;
  std::string socket_path;
  struct stat namespace_stat {};
  int listen_fd = -1;
  int wake_fd = -1;
  ino_t socket_ino = 0;
  std::thread thread;

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
  iovec iov{&req, sizeof req};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof cbuf;
  const ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
  int passed = -1;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
        cm->cmsg_len == CMSG_LEN(sizeof(int)) && passed < 0) {
      std::memcpy(&passed, CMSG_DATA(cm), sizeof(int));
    }
  }
  struct stat st {};
  if (n != static_cast<ssize_t>(sizeof req) || req.magic != kMagic || req.version != kVersion ||
      req.op != kOpGrow || (msg.msg_flags & MSG_CTRUNC) != 0) {
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
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    int conn = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
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
  if (geteuid() != 0) {
    *why = "the daemon is not root (only root may make sockets in /run/nvfs)";
    return nullptr;
  }
  auto s = std::make_unique<State>();
  s->fs = &fs;
  s->socket_path = SocketPath(mount_dev);
  if (stat(namespace_path.c_str(), &s->namespace_stat) != 0) {
    *why = namespace_path + ": " + std::strerror(errno);
    return nullptr;
  }
  if (mkdir("/run/nvfs", 0755) != 0 && errno != EEXIST) {
    *why = std::string("cannot make /run/nvfs: ") + std::strerror(errno);
    return nullptr;
  }
  struct stat dir;
  if (lstat("/run/nvfs", &dir) != 0 || !S_ISDIR(dir.st_mode) || dir.st_uid != 0 ||
      (dir.st_mode & (S_IWGRP | S_IWOTH))) {
    *why = "/run/nvfs is not a directory writable by root alone";
    return nullptr;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (s->socket_path.size() >= sizeof addr.sun_path) {
    *why = "socket path too long";
    return nullptr;
  }
  std::memcpy(addr.sun_path, s->socket_path.c_str(), s->socket_path.size() + 1);
  s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd < 0) {
    *why = std::string("socket: ") + std::strerror(errno);
    return nullptr;
  }
  // A socket left there is a killed daemon's, of a mount gone since.
  (void)unlink(s->socket_path.c_str());
  // Made 0600 before it can be reached: the umask covers the bind.
  const mode_t old_mask = umask(0177);
  const int bound = bind(s->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old_mask);
  struct stat st;
  if (bound != 0 || chmod(s->socket_path.c_str(), 0600) != 0 || listen(s->listen_fd, 8) != 0 ||
      stat(s->socket_path.c_str(), &st) != 0) {
    *why = s->socket_path + ": " + std::strerror(errno);
    CloseFd(s->listen_fd);
    (void)unlink(s->socket_path.c_str());
    return nullptr;
  }
  s->socket_ino = st.st_ino;
  s->wake_fd = eventfd(0, EFD_CLOEXEC);
  if (s->wake_fd < 0) {
    *why = std::string("eventfd: ") + std::strerror(errno);
    CloseFd(s->listen_fd);
    (void)unlink(s->socket_path.c_str());
    return nullptr;
  }
  return std::unique_ptr<Server>(new Server(std::move(s)));
}

Server::Server(std::unique_ptr<State> state) : state_(std::move(state)) {}

Server::~Server() { Stop(); }

bool Server::Serve() {
  State* s = state_.get();
  if (s->thread.joinable() || s->listen_fd < 0) return false;
  try {
    s->thread = std::thread([s] { s->Run(); });
  } catch (const std::system_error&) {
    return false;
  }
  return true;
}

void Server::Stop() {
  State* s = state_.get();
  if (s->thread.joinable()) {
    const uint64_t one = 1;
    (void)!write(s->wake_fd, &one, sizeof one);
    s->thread.join();
  }
  if (s->listen_fd >= 0) {
    struct stat st;
    if (stat(s->socket_path.c_str(), &st) == 0 && st.st_ino == s->socket_ino) {
      (void)unlink(s->socket_path.c_str());
    }
    CloseFd(s->listen_fd);
  }
  CloseFd(s->wake_fd);
}

const std::string& Server::socket_path() const { return state_->socket_path; }

}  // namespace nvfs::control
