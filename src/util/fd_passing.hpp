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

#include <cerrno>
#include <cstddef>
#include <cstring>

// Linux 6.16 (uapi asm-generic/socket.h); Debian 12's headers predate it.
#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif

namespace nvfs {

// Whether the peers of unix socket `sock` may send it descriptors
// (SO_PASSRIGHTS). Set on a listening socket before listen(), it holds for
// every connection accepted from it, from the connect on; a peer's sendmsg
// with descriptors then fails with EPERM, and none reaches this side.
// False, with errno, on a kernel without the option (ENOPROTOOPT).
inline bool AcceptDescriptors(int sock, bool accept) {
  const int value = accept ? 1 : 0;
  return setsockopt(sock, SOL_SOCKET, SO_PASSRIGHTS, &value, sizeof value) == 0;
}

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

// The most descriptors one message can carry (the kernel's SCM_MAX_FD).
// A receiver with room for fewer makes the kernel drop the rest itself, in
// the receiving thread: a last close of a file the sender chose, which can
// wait (daemon/reaper.hpp).
inline constexpr size_t kMaxPassedFds = 253;

// Every descriptor that came with one message, none closed.
struct PassedFds {
  int fds[kMaxPassedFds];
  size_t count = 0;
  bool other = false;  // ancillary data of another kind, or cut short
};

// One recvmsg of at most `size` bytes into `data` (`flags` besides
// MSG_CMSG_CLOEXEC), with room for as many descriptors as a message can
// carry; all of them go to *passed, for the caller to release.
inline ssize_t ReceiveWithFds(int sock, void* data, size_t size, int flags, PassedFds* passed) {
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  passed->count = 0;
  passed->other = false;
  const ssize_t n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
      passed->other = true;
      continue;
    }
    const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count && passed->count < kMaxPassedFds; ++i) {
      std::memcpy(&passed->fds[passed->count++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) passed->other = true;
  return n;
}

}  // namespace nvfs
