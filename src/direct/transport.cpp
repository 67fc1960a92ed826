#include "direct/transport.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "direct/libc.hpp"

namespace nvfs::direct {

namespace {

// Where the library's socket goes, above what programs use in the main.
constexpr int kHighFd = 256;

void CloseFd(int fd) {
  if (fd >= 0) libc::Get(&libc::Table::close)(fd);
}

int SendAll(int sock, const void* data, size_t len, int send_fd) {
  const auto* p = static_cast<const char*>(data);
  bool fd_sent = send_fd < 0;
  while (len > 0) {
    const ssize_t n = SendWithFd(sock, p, len, fd_sent ? -1 : send_fd, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? ETIMEDOUT : errno;
    }
    fd_sent = true;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return 0;
}


// Reads at most `max` bytes, at least `min`, in as few calls as the data
// comes in; *got says how many. Descriptors that come along go to *fd (the
// first) or are closed. `patient`: the socket's receive timeout only
// delays (else it fails the read, ETIMEDOUT).
int RecvSome(int sock, void* data, size_t max, size_t min, size_t* got, int* fd,
             bool patient = false) {
  auto* p = static_cast<char*>(data);
  *got = 0;
  while (*got < min) {
    iovec iov{p + *got, max - *got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = libc::Get(&libc::Table::recvmsg)(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR || (patient && (errno == EAGAIN || errno == EWOULDBLOCK))) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? ETIMEDOUT : errno;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (*fd < 0) {
          *fd = received;
        } else {
          CloseFd(received);
        }
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) return EPROTO;
    if (n == 0) return ECONNRESET;
    *got += static_cast<size_t>(n);
  }
  return 0;
}

// Reads exactly `len` bytes.
int RecvAll(int sock, void* data, size_t len, int* fd) {
  size_t got = 0;
  return len == 0 ? 0 : RecvSome(sock, data, len, len, &got, fd);
}

// A write request is answered in microseconds: the reply is waited for by
// polling, at most kSpinMicroseconds, before the thread sleeps in recvmsg
// (a sleeping thread's wake-up costs tens of microseconds on a virtual
// machine whose idle CPU halted: more than the request itself).
constexpr int64_t kSpinMicroseconds = 50;

void SpinForReply(int sock) {
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    pollfd p{sock, POLLIN, 0};
    if (poll(&p, 1, 0) != 0) return;
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const int64_t us = (now.tv_sec - start.tv_sec) * 1000000 + (now.tv_nsec - start.tv_nsec) / 1000;
    if (us >= kSpinMicroseconds) return;
  }
}

}  // namespace

int TransportConnect(const char* path, uid_t peer_uid, int* sock_out) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (std::strlen(path) >= sizeof addr.sun_path) return ENAMETOOLONG;
  std::strcpy(addr.sun_path, path);
  int sock = libc::Get(&libc::Table::socket)(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return errno;
  // Kept out of the low numbers a program expects open() to hand it (a
  // program that closed 0 to reopen it, say), where the limit leaves room.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur > 2 * kHighFd) {
    const int high = libc::Get(&libc::Table::fcntl)(sock, F_DUPFD_CLOEXEC, kHighFd);
    if (high >= 0) {
      CloseFd(sock);
      sock = high;
    }
  }
  const timeval timeout{kReplyTimeoutSeconds, 0};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  int err = 0;
  while (connect(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno == EINTR) continue;
    err = errno;
    break;
  }
  if (err == 0) {
    ucred peer{};
    socklen_t len = sizeof peer;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
      err = errno;
    } else if (peer.uid != 0 && peer.uid != peer_uid) {
      err = EPERM;
    }
  }
  if (err != 0) {
    CloseFd(sock);
    return err;
  }
  *sock_out = sock;
  return 0;
}

int TransportRecvAll(int sock, void* data, size_t len) {
  size_t got = 0;
  int fd = -1;
  const int err = len == 0 ? 0 : RecvSome(sock, data, len, len, &got, &fd, /*patient=*/true);
  CloseFd(fd);
  return err;
}

int TransportCall(int sock, const Request& req, int send_fd, void* reply, size_t reply_max,
                  size_t min_ok, int* recv_fd) {
  int received = -1;
  int err = SendAll(sock, &req, sizeof req, send_fd);
  ReplyHeader h{};
  if (err == 0 && req.op >= kOpAllocate) SpinForReply(sock);
  // One reply is in flight: it is read whole in one call when it has come
  // whole (the daemon sends it in one), its header first otherwise.
  std::memset(reply, 0, reply_max);
  size_t got = 0;
  if (err == 0) err = RecvSome(sock, reply, reply_max, sizeof h, &got, &received);
  if (err == 0) std::memcpy(&h, reply, sizeof h);
  if (err == 0 && (h.magic != kMagic || h.op != req.op || h.size < sizeof h || h.size > reply_max ||
                   (h.error == 0 && h.size < min_ok) || got > h.size)) {
    err = EPROTO;
  }
  if (err == 0 && got < h.size) {
    err = RecvAll(sock, static_cast<char*>(reply) + got, h.size - got, &received);
  }
  if (err == 0 && recv_fd != nullptr) {
    *recv_fd = received;
  } else {
    CloseFd(received);
    if (recv_fd != nullptr) *recv_fd = -1;
  }
  return err;
}

}  // namespace nvfs::direct
