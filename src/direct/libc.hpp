// libc's own definitions of the calls libnvfs-direct interposes
// (preload.cpp, fault.cpp, credentials.cpp), found with dlsym(RTLD_NEXT)
// once, at load.
//
// The library defines pread, close, sigaction and the rest itself, and a
// call from inside the library to `close` binds to that definition, not to
// libc's: every call the library makes for itself goes through these
// pointers instead.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "direct/export.hpp"

namespace nvfs::direct::libc {

struct Table {
  ssize_t (*pread)(int, void*, size_t, off_t);
  ssize_t (*pread64)(int, void*, size_t, off_t);
  ssize_t (*pread_chk)(int, void*, size_t, off_t, size_t);
  ssize_t (*pread64_chk)(int, void*, size_t, off_t, size_t);
  ssize_t (*preadv)(int, const struct iovec*, int, off_t);
  ssize_t (*preadv64)(int, const struct iovec*, int, off_t);
  ssize_t (*preadv2)(int, const struct iovec*, int, off_t, int);
  ssize_t (*preadv64v2)(int, const struct iovec*, int, off_t, int);
  ssize_t (*pwrite)(int, const void*, size_t, off_t);
  ssize_t (*pwrite64)(int, const void*, size_t, off_t);
  ssize_t (*pwritev)(int, const struct iovec*, int, off_t);
  ssize_t (*pwritev64)(int, const struct iovec*, int, off_t);
  ssize_t (*pwritev2)(int, const struct iovec*, int, off_t, int);
  ssize_t (*pwritev64v2)(int, const struct iovec*, int, off_t, int);
  int (*fsync)(int);
  int (*fdatasync)(int);

  int (*close)(int);
  int (*close_range)(unsigned, unsigned, int);
  void (*closefrom)(int);
  int (*dup)(int);
  int (*dup2)(int, int);
  int (*dup3)(int, int, int);
  int (*fcntl)(int, int, ...);
  int (*ftruncate)(int, off_t);
  int (*ftruncate64)(int, off_t);
  int (*truncate)(const char*, off_t);
  int (*truncate64)(const char*, off_t);
  int (*fallocate)(int, int, off_t, off_t);
  int (*fallocate64)(int, int, off_t, off_t);
  int (*posix_fallocate)(int, off_t, off_t);
  int (*posix_fallocate64)(int, off_t, off_t);
  int (*fcntl64)(int, int, ...);
  int (*open)(const char*, int, ...);
  int (*open64)(const char*, int, ...);
  int (*open_2)(const char*, int);
  int (*open64_2)(const char*, int);
  int (*openat)(int, const char*, int, ...);
  int (*openat64)(int, const char*, int, ...);
  int (*openat_2)(int, const char*, int);
  int (*openat64_2)(int, const char*, int);
  int (*creat)(const char*, mode_t);
  int (*creat64)(const char*, mode_t);
  FILE* (*fopen)(const char*, const char*);
  FILE* (*fopen64)(const char*, const char*);
  FILE* (*freopen)(const char*, const char*, FILE*);
  FILE* (*freopen64)(const char*, const char*, FILE*);
  int (*fclose)(FILE*);
  int (*fcloseall)(void);
  ssize_t (*recvmsg)(int, struct msghdr*, int);
  DIR* (*opendir)(const char*);
  int (*closedir)(DIR*);
  int (*socket)(int, int, int);
  int (*socketpair)(int, int, int, int*);
  int (*accept)(int, struct sockaddr*, socklen_t*);
  int (*accept4)(int, struct sockaddr*, socklen_t*, int);
  int (*pipe)(int*);
  int (*pipe2)(int*, int);
  int (*eventfd)(unsigned, int);
  int (*epoll_create)(int);
  int (*epoll_create1)(int);
  int (*memfd_create)(const char*, unsigned);

  void* (*mmap)(void*, size_t, int, int, int, off_t);
  void* (*mmap64)(void*, size_t, int, int, int, off_t);
  int (*munmap)(void*, size_t);
  void* (*mremap)(void*, size_t, size_t, int, ...);
  int (*madvise)(void*, size_t, int);

  int (*sigaction)(int, const struct sigaction*, struct sigaction*);

  int (*setuid)(uid_t);
  int (*seteuid)(uid_t);
  int (*setreuid)(uid_t, uid_t);
  int (*setresuid)(uid_t, uid_t, uid_t);
  int (*setgid)(gid_t);
  int (*setegid)(gid_t);
  int (*setregid)(gid_t, gid_t);
  int (*setresgid)(gid_t, gid_t, gid_t);
  int (*setgroups)(size_t, const gid_t*);
  int (*initgroups)(const char*, gid_t);
  int (*setfsuid)(uid_t);
  int (*setfsgid)(gid_t);
  int (*capset)(void*, void*);
  int (*unshare)(int);
  int (*setns)(int, int);
  long (*syscall)(long, ...);
  int (*clone)(int (*)(void*), void*, int, void*, ...);
};

// Filled by Resolve(); a pointer is null where libc lacks the call.
extern Table real;

// Fills `real`. Run by the library's constructor; safe to call again (a
// call that reaches the library before its constructor ran resolves it).
// Uninstrumented, like Get: the interposed sigaction may be called by
// ThreadSanitizer's start-up (export.hpp).
NVFS_DIRECT_UNINSTRUMENTED void Resolve();

// The pointer, resolved first if the constructor has not run yet.
template <class F>
NVFS_DIRECT_UNINSTRUMENTED inline F Get(F Table::*member) {
  if (real.*member == nullptr) Resolve();
  return real.*member;
}

// The library's own mappings (the namespace, the table, zeros), never the
// preload's mmap.
inline void* Mmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  return Get(&Table::mmap)(addr, len, prot, flags, fd, offset);
}
inline int Munmap(void* addr, size_t len) { return Get(&Table::munmap)(addr, len); }

}  // namespace nvfs::direct::libc
