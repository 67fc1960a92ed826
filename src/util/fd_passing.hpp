// Passing a descriptor with a message over a unix socket (SCM_RIGHTS), as
// the daemon's two sockets do (the direct-read protocol,
// src/direct/protocol.hpp, and the control protocol,
// include/nvfs/control.hpp), on both sides. Header-only and dependent on
// libc alone: libnvfs-direct, which links no nvfs library, uses it too.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

namespace nvfs {

// One sendmsg of `size` bytes with descriptor `fd` attached (none if
// fd < 0): what both sides send. Returns as sendmsg.
inline ssize_t SendWithFd(int sock, const void* data, size_t size, int fd, int flags) {
  iovec iov{const_cast<void*>(data), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  return sendmsg(sock, &msg, flags);
}

// The descriptors that came with a message recvmsg just received into
// `msg` (with MSG_CMSG_CLOEXEC): the first goes to *fd when *fd < 0 and
// nothing was amiss before (*bad false); every other is closed and sets
// *bad, as does ancillary data of another kind or ancillary data cut short
// (MSG_CTRUNC). A server refuses a message with *bad set.
inline void TakeDescriptors(msghdr* msg, int* fd, bool* bad) {
  for (cmsghdr* cm = CMSG_FIRSTHDR(msg); cm != nullptr; cm = CMSG_NXTHDR(msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
      *bad = true;
      continue;
    }
    const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int passed;
      std::memcpy(&passed, CMSG_DATA(cm) + i * sizeof(int), sizeof passed);
      if (*fd < 0 && !*bad) {
        *fd = passed;
      } else {
        close(passed);
        *bad = true;
      }
    }
  }
  if (msg->msg_flags & MSG_CTRUNC) *bad = true;
}

// One recvmsg of at most `size` bytes into `data` (`flags` besides
// MSG_CMSG_CLOEXEC), with room for kMaxFds descriptors: what came with it
// goes through TakeDescriptors (more than kMaxFds is MSG_CTRUNC, so *bad).
// Returns as recvmsg.
template <size_t kMaxFds>
ssize_t ReceiveWithFd(int sock, void* data, size_t size, int flags, int* fd, bool* bad) {
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n >= 0) TakeDescriptors(&msg, fd, bad);
  return n;
}

}  // namespace nvfs
