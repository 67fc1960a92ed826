// libnvfs-direct as LD_PRELOAD (preload.hpp): the interposed calls, each
// libc's own plus what the descriptor table (fd_table.hpp) must learn.
//
// The interposed names are resolved to these definitions in every object
// of the program, so this file must not see the large-file redirections
// (open would be defined as open64) nor the fortified inline wrappers.
#undef _FILE_OFFSET_BITS
#undef _FORTIFY_SOURCE

#include "direct/preload.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <linux/close_range.h>

#include "direct/export.hpp"
#include "direct/fd_table.hpp"
#include "direct/file.hpp"
#include "direct/libc.hpp"
#include "direct/map.hpp"

namespace nvfs::direct {

namespace {

ssize_t ServePread(int fd, void* buf, size_t count, off_t offset,
                   ssize_t (*real)(int, void*, size_t, off_t)) {
  const iovec one{buf, count};
  ssize_t n;
  return FdServe(fd, &one, 1, offset, &n) ? n : real(fd, buf, count, offset);
}

ssize_t ServePreadv(int fd, const iovec* iov, int iovcnt, off_t offset,
                    ssize_t (*real)(int, const iovec*, int, off_t)) {
  ssize_t n;
  return FdServe(fd, iov, iovcnt, offset, &n) ? n : real(fd, iov, iovcnt, offset);
}

bool SameFile(const char* a, const char* b, size_t b_len) {
  const char* slash = strrchr(a, '/');
  const char* base = slash == nullptr ? a : slash + 1;
  // The entry's last component.
  size_t start = b_len;
  while (start > 0 && b[start - 1] != '/') --start;
  return strlen(base) == b_len - start && memcmp(base, b + start, b_len - start) == 0;
}

}  // namespace

void PreloadInit() {
  const char* list = getenv("LD_PRELOAD");
  if (list == nullptr) return;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&PreloadInit), &info) == 0 || info.dli_fname == nullptr) return;
  // ld.so separates the entries with spaces or colons.
  for (const char* p = list; *p != '\0';) {
    const size_t len = strcspn(p, " :");
    if (len > 0 && SameFile(info.dli_fname, p, len)) {
      SetPreloaded();
      return;
    }
    p += len;
    if (*p != '\0') ++p;
  }
}

}  // namespace nvfs::direct

using namespace nvfs::direct;

// --- reads -------------------------------------------------------------------

NVFS_DIRECT_EXPORT ssize_t pread(int fd, void* buf, size_t count, off_t offset) {
  return ServePread(fd, buf, count, offset, libc::Get(&libc::Table::pread));
}

NVFS_DIRECT_EXPORT ssize_t pread64(int fd, void* buf, size_t count, off_t offset) {
  return ServePread(fd, buf, count, offset, libc::Get(&libc::Table::pread64));
}

// _FORTIFY_SOURCE's spellings: a read larger than the buffer is libc's to
// report (it aborts).
NVFS_DIRECT_EXPORT ssize_t __pread_chk(int fd, void* buf, size_t count, off_t offset, size_t buflen) {
  if (count > buflen) return libc::Get(&libc::Table::pread_chk)(fd, buf, count, offset, buflen);
  return ServePread(fd, buf, count, offset, libc::Get(&libc::Table::pread));
}

NVFS_DIRECT_EXPORT ssize_t __pread64_chk(int fd, void* buf, size_t count, off_t offset, size_t buflen) {
  if (count > buflen) return libc::Get(&libc::Table::pread64_chk)(fd, buf, count, offset, buflen);
  return ServePread(fd, buf, count, offset, libc::Get(&libc::Table::pread64));
}

NVFS_DIRECT_EXPORT ssize_t preadv(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  return ServePreadv(fd, iov, iovcnt, offset, libc::Get(&libc::Table::preadv));
}

NVFS_DIRECT_EXPORT ssize_t preadv64(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  return ServePreadv(fd, iov, iovcnt, offset, libc::Get(&libc::Table::preadv64));
}

// Flags 0, or RWF_DONTCACHE (Linux 6.14: buffered I/O that leaves nothing
// in the page cache): a direct read copies from the namespace and caches
// nothing, so the request is met as asked. RWF_NOWAIT, RWF_HIPRI and the
// rest mean something to the kernel, and get its answer; offset -1 (the
// file position) is the kernel's too.
#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080
#endif
static bool DirectFlags(int flags) { return flags == 0 || flags == RWF_DONTCACHE; }

NVFS_DIRECT_EXPORT ssize_t preadv2(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags) {
  auto* real = libc::Get(&libc::Table::preadv2);
  ssize_t n;
  if (DirectFlags(flags) && FdServe(fd, iov, iovcnt, offset, &n)) return n;
  return real(fd, iov, iovcnt, offset, flags);
}

NVFS_DIRECT_EXPORT ssize_t preadv64v2(int fd, const struct iovec* iov, int iovcnt, off_t offset,
                                      int flags) {
  auto* real = libc::Get(&libc::Table::preadv64v2);
  ssize_t n;
  if (DirectFlags(flags) && FdServe(fd, iov, iovcnt, offset, &n)) return n;
  return real(fd, iov, iovcnt, offset, flags);
}

// --- writes --------------------------------------------------------------------
// Of a file opened for writing (O_RDWR or O_WRONLY, not O_APPEND) on an nvfs mount, by a process
// that may write the namespace: stored from its own mapping (write.cpp).
// Flags 0, RWF_DSYNC and RWF_SYNC (every direct write is durable when it
// returns); the rest, and offset -1, are the kernel's (Write, write.cpp,
// hands them on: DirectWriteFlags in file.hpp).

NVFS_DIRECT_EXPORT ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  const iovec one{const_cast<void*>(buf), count};
  ssize_t n;
  if (FdServeWrite(fd, &one, 1, offset, 0, &n)) return n;
  const ssize_t r = libc::Get(&libc::Table::pwrite)(fd, buf, count, offset);
  if (r > 0) FdAfterKernelWrite(fd);
  return r;
}

NVFS_DIRECT_EXPORT ssize_t pwrite64(int fd, const void* buf, size_t count, off_t offset) {
  const iovec one{const_cast<void*>(buf), count};
  ssize_t n;
  if (FdServeWrite(fd, &one, 1, offset, 0, &n)) return n;
  const ssize_t r = libc::Get(&libc::Table::pwrite64)(fd, buf, count, offset);
  if (r > 0) FdAfterKernelWrite(fd);
  return r;
}

NVFS_DIRECT_EXPORT ssize_t pwritev(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  ssize_t n;
  if (FdServeWrite(fd, iov, iovcnt, offset, 0, &n)) return n;
  const ssize_t r = libc::Get(&libc::Table::pwritev)(fd, iov, iovcnt, offset);
  if (r > 0) FdAfterKernelWrite(fd);
  return r;
}

NVFS_DIRECT_EXPORT ssize_t pwritev64(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  ssize_t n;
  if (FdServeWrite(fd, iov, iovcnt, offset, 0, &n)) return n;
  const ssize_t r = libc::Get(&libc::Table::pwritev64)(fd, iov, iovcnt, offset);
  if (r > 0) FdAfterKernelWrite(fd);
  return r;
}

NVFS_DIRECT_EXPORT ssize_t pwritev2(int fd, const struct iovec* iov, int iovcnt, off_t offset,
                                    int flags) {
  ssize_t n;
  if (FdServeWrite(fd, iov, iovcnt, offset, flags, &n)) return n;
  const ssize_t r = libc::Get(&libc::Table::pwritev2)(fd, iov, iovcnt, offset, flags);
  if (r > 0) FdAfterKernelWrite(fd);
  return r;
}

NVFS_DIRECT_EXPORT ssize_t pwritev64v2(int fd, const struct iovec* iov, int iovcnt, off_t offset,
                                       int flags) {
  ssize_t n;
  if (FdServeWrite(fd, iov, iovcnt, offset, flags, &n)) return n;
  const ssize_t r = libc::Get(&libc::Table::pwritev64v2)(fd, iov, iovcnt, offset, flags);
  if (r > 0) FdAfterKernelWrite(fd);
  return r;
}

// The times of what was written directly, set before the kernel's fsync.
NVFS_DIRECT_EXPORT int fsync(int fd) {
  FdSettle(fd, /*closing=*/false);
  return libc::Get(&libc::Table::fsync)(fd);
}

NVFS_DIRECT_EXPORT int fdatasync(int fd) {
  FdSettle(fd, /*closing=*/false);
  return libc::Get(&libc::Table::fdatasync)(fd);
}

// --- maps ----------------------------------------------------------------------
// Of a file on an nvfs mount, by a process that may read (for a writable
// shared map: write) the namespace: the file's blocks mapped from it
// (map.hpp). munmap, mremap and madvise look at the direct maps first.

NVFS_DIRECT_EXPORT void* mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  void* result;
  if (FdServeMap(fd, addr, length, prot, flags, offset, &result)) return result;
  return libc::Get(&libc::Table::mmap)(addr, length, prot, flags, fd, offset);
}

NVFS_DIRECT_EXPORT void* mmap64(void* addr, size_t length, int prot, int flags, int fd,
                                off_t offset) {
  void* result;
  if (FdServeMap(fd, addr, length, prot, flags, offset, &result)) return result;
  return libc::Get(&libc::Table::mmap64)(addr, length, prot, flags, fd, offset);
}

NVFS_DIRECT_EXPORT int munmap(void* addr, size_t length) {
  if (tls.depth != 0) return libc::Munmap(addr, length);
  DepthGuard depth;
  return UnmapRange(addr, length);
}

NVFS_DIRECT_EXPORT void* mremap(void* old_addr, size_t old_len, size_t new_len, int flags, ...) {
  void* new_addr = nullptr;
  if ((flags & MREMAP_FIXED) != 0) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
  }
  if (tls.depth == 0) {
    DepthGuard depth;
    void* result;
    if (RemapRange(old_addr, old_len, new_len, flags, new_addr, &result)) return result;
  }
  return libc::Get(&libc::Table::mremap)(old_addr, old_len, new_len, flags, new_addr);
}

NVFS_DIRECT_EXPORT int madvise(void* addr, size_t length, int advice) {
  if (tls.depth == 0) {
    DepthGuard depth;
    int result;
    if (AdviseRange(addr, length, advice, &result)) return result;
  }
  return libc::Get(&libc::Table::madvise)(addr, length, advice);
}

// --- changes of a file's size or blocks ------------------------------------------
// Through the kernel, as ever; then this process's direct maps of the file
// follow before the call returns (map.hpp), whether the library was
// preloaded or linked: a load past a new end faults at once, as with the
// kernel's own maps.

namespace {

void AfterChange(int fd) {
  if (!MapsAny() || fd < 0) return;
  const int saved = errno;
  struct stat st {};
  if (fstat(fd, &st) == 0) MapsAfterChange(st.st_dev, st.st_ino);
  errno = saved;
}

void AfterChangeAt(const char* path) {
  if (!MapsAny() || path == nullptr) return;
  const int saved = errno;
  struct stat st {};
  if (stat(path, &st) == 0) MapsAfterChange(st.st_dev, st.st_ino);
  errno = saved;
}

}  // namespace

NVFS_DIRECT_EXPORT int ftruncate(int fd, off_t length) noexcept {
  const int r = libc::Get(&libc::Table::ftruncate)(fd, length);
  if (r == 0) AfterChange(fd);
  return r;
}

NVFS_DIRECT_EXPORT int ftruncate64(int fd, off_t length) noexcept {
  const int r = libc::Get(&libc::Table::ftruncate64)(fd, length);
  if (r == 0) AfterChange(fd);
  return r;
}

NVFS_DIRECT_EXPORT int truncate(const char* path, off_t length) noexcept {
  const int r = libc::Get(&libc::Table::truncate)(path, length);
  if (r == 0) AfterChangeAt(path);
  return r;
}

NVFS_DIRECT_EXPORT int truncate64(const char* path, off_t length) noexcept {
  const int r = libc::Get(&libc::Table::truncate64)(path, length);
  if (r == 0) AfterChangeAt(path);
  return r;
}

NVFS_DIRECT_EXPORT int fallocate(int fd, int mode, off_t offset, off_t len) {
  const int r = libc::Get(&libc::Table::fallocate)(fd, mode, offset, len);
  if (r == 0) AfterChange(fd);
  return r;
}

NVFS_DIRECT_EXPORT int fallocate64(int fd, int mode, off_t offset, off_t len) {
  const int r = libc::Get(&libc::Table::fallocate64)(fd, mode, offset, len);
  if (r == 0) AfterChange(fd);
  return r;
}

NVFS_DIRECT_EXPORT int posix_fallocate(int fd, off_t offset, off_t len) {
  const int r = libc::Get(&libc::Table::posix_fallocate)(fd, offset, len);
  if (r == 0) AfterChange(fd);
  return r;
}

NVFS_DIRECT_EXPORT int posix_fallocate64(int fd, off_t offset, off_t len) {
  const int r = libc::Get(&libc::Table::posix_fallocate64)(fd, offset, len);
  if (r == 0) AfterChange(fd);
  return r;
}

// --- calls that free a number --------------------------------------------------

NVFS_DIRECT_EXPORT int close(int fd) {
  FdSettle(fd, /*closing=*/true);
  FdClosing(fd);
  const int r = libc::Get(&libc::Table::close)(fd);
  FdForget(fd);
  return r;
}

NVFS_DIRECT_EXPORT int close_range(unsigned first, unsigned last, int flags) noexcept {
  const bool closes = (flags & CLOSE_RANGE_CLOEXEC) == 0;
  if (closes) FdClosingRange(first, last);
  auto* real = libc::Get(&libc::Table::close_range);
  const int r = real != nullptr ? real(first, last, flags)
                                : static_cast<int>(syscall(SYS_close_range, first, last, flags));
  if (closes) FdForgetRange(first, last);
  return r;
}

NVFS_DIRECT_EXPORT void closefrom(int low) noexcept {
  const unsigned first = low < 0 ? 0 : static_cast<unsigned>(low);
  FdClosingRange(first, UINT_MAX);
  auto* real = libc::Get(&libc::Table::closefrom);
  if (real != nullptr) {
    real(low);
  } else {
    syscall(SYS_close_range, first, ~0u, 0);
  }
  FdForgetRange(first, UINT_MAX);
}

NVFS_DIRECT_EXPORT int dup2(int oldfd, int newfd) noexcept {
  if (oldfd != newfd) FdClosing(newfd);
  const int r = libc::Get(&libc::Table::dup2)(oldfd, newfd);
  if (r >= 0) FdForget(r);
  return r;
}

NVFS_DIRECT_EXPORT int dup3(int oldfd, int newfd, int flags) noexcept {
  if (oldfd != newfd) FdClosing(newfd);
  const int r = libc::Get(&libc::Table::dup3)(oldfd, newfd, flags);
  if (r >= 0) FdForget(r);
  return r;
}

NVFS_DIRECT_EXPORT int fclose(FILE* stream) {
  const int fd = stream != nullptr ? fileno(stream) : -1;
  FdClosing(fd);
  const int r = libc::Get(&libc::Table::fclose)(stream);
  if (fd >= 0) FdForget(fd);
  return r;
}

// Closes every stream inside libc: which numbers were freed is not known,
// so all are forgotten.
NVFS_DIRECT_EXPORT int fcloseall(void) {
  const int r = libc::Get(&libc::Table::fcloseall)();
  FdForgetRange(0, kMaxFd);
  return r;
}

NVFS_DIRECT_EXPORT int closedir(DIR* dir) {
  const int fd = dirfd(dir);
  FdClosing(fd);
  const int r = libc::Get(&libc::Table::closedir)(dir);
  if (fd >= 0) FdForget(fd);
  return r;
}

namespace {

int AfterFcntl(int fd, int cmd, int r) {
  if (r < 0) return r;
  if (cmd == F_SETFL) FdForget(fd);  // O_DIRECT may have come (or gone)
  if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) FdForget(r);
  return r;
}

}  // namespace

// The third argument is passed on as glibc's own fcntl reads it: one
// pointer-sized word, whatever the command.
NVFS_DIRECT_EXPORT int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return AfterFcntl(fd, cmd, libc::Get(&libc::Table::fcntl)(fd, cmd, arg));
}

NVFS_DIRECT_EXPORT int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  auto* real = libc::Get(&libc::Table::fcntl64);
  if (real == nullptr) real = libc::Get(&libc::Table::fcntl);
  return AfterFcntl(fd, cmd, real(fd, cmd, arg));
}

// --- calls that return a number ------------------------------------------------

#define NVFS_OPEN_MODE(flags)                      \
  mode_t mode = 0;                                 \
  if (__OPEN_NEEDS_MODE(flags)) {                  \
    va_list ap;                                    \
    va_start(ap, flags);                           \
    mode = static_cast<mode_t>(va_arg(ap, int));   \
    va_end(ap);                                    \
  }

// An open with O_TRUNC (creat too) changes the file as ftruncate does.
static int Opened(int fd, int flags) {
  if ((flags & O_TRUNC) != 0) AfterChange(fd);
  return FdFresh(fd);
}

NVFS_DIRECT_EXPORT int open(const char* path, int flags, ...) {
  NVFS_OPEN_MODE(flags);
  return Opened(libc::Get(&libc::Table::open)(path, flags, mode), flags);
}

NVFS_DIRECT_EXPORT int open64(const char* path, int flags, ...) {
  NVFS_OPEN_MODE(flags);
  return Opened(libc::Get(&libc::Table::open64)(path, flags, mode), flags);
}

NVFS_DIRECT_EXPORT int openat(int dirfd, const char* path, int flags, ...) {
  NVFS_OPEN_MODE(flags);
  return Opened(libc::Get(&libc::Table::openat)(dirfd, path, flags, mode), flags);
}

NVFS_DIRECT_EXPORT int openat64(int dirfd, const char* path, int flags, ...) {
  NVFS_OPEN_MODE(flags);
  return Opened(libc::Get(&libc::Table::openat64)(dirfd, path, flags, mode), flags);
}

#undef NVFS_OPEN_MODE

NVFS_DIRECT_EXPORT int __open_2(const char* path, int flags) {
  return FdFresh(libc::Get(&libc::Table::open_2)(path, flags));
}

NVFS_DIRECT_EXPORT int __open64_2(const char* path, int flags) {
  return FdFresh(libc::Get(&libc::Table::open64_2)(path, flags));
}

NVFS_DIRECT_EXPORT int __openat_2(int dirfd, const char* path, int flags) {
  return FdFresh(libc::Get(&libc::Table::openat_2)(dirfd, path, flags));
}

NVFS_DIRECT_EXPORT int __openat64_2(int dirfd, const char* path, int flags) {
  return FdFresh(libc::Get(&libc::Table::openat64_2)(dirfd, path, flags));
}

NVFS_DIRECT_EXPORT int creat(const char* path, mode_t mode) {
  return Opened(libc::Get(&libc::Table::creat)(path, mode), O_TRUNC);
}

NVFS_DIRECT_EXPORT int creat64(const char* path, mode_t mode) {
  return Opened(libc::Get(&libc::Table::creat64)(path, mode), O_TRUNC);
}

namespace {

FILE* FreshStream(FILE* f) {
  if (f != nullptr) FdFresh(fileno(f));
  return f;
}

}  // namespace

NVFS_DIRECT_EXPORT FILE* fopen(const char* path, const char* mode) {
  return FreshStream(libc::Get(&libc::Table::fopen)(path, mode));
}

NVFS_DIRECT_EXPORT FILE* fopen64(const char* path, const char* mode) {
  return FreshStream(libc::Get(&libc::Table::fopen64)(path, mode));
}

NVFS_DIRECT_EXPORT FILE* freopen(const char* path, const char* mode, FILE* stream) {
  const int old = stream != nullptr ? fileno(stream) : -1;
  FdClosing(old);
  FILE* f = libc::Get(&libc::Table::freopen)(path, mode, stream);
  if (old >= 0) FdForget(old);
  return FreshStream(f);
}

NVFS_DIRECT_EXPORT FILE* freopen64(const char* path, const char* mode, FILE* stream) {
  const int old = stream != nullptr ? fileno(stream) : -1;
  FdClosing(old);
  FILE* f = libc::Get(&libc::Table::freopen64)(path, mode, stream);
  if (old >= 0) FdForget(old);
  return FreshStream(f);
}

NVFS_DIRECT_EXPORT DIR* opendir(const char* path) {
  DIR* d = libc::Get(&libc::Table::opendir)(path);
  if (d != nullptr) FdFresh(dirfd(d));
  return d;
}

NVFS_DIRECT_EXPORT int dup(int fd) noexcept { return FdFresh(libc::Get(&libc::Table::dup)(fd)); }

NVFS_DIRECT_EXPORT int socket(int domain, int type, int protocol) noexcept {
  return FdFresh(libc::Get(&libc::Table::socket)(domain, type, protocol));
}

NVFS_DIRECT_EXPORT int socketpair(int domain, int type, int protocol, int sv[2]) noexcept {
  const int r = libc::Get(&libc::Table::socketpair)(domain, type, protocol, sv);
  if (r == 0) {
    FdFresh(sv[0]);
    FdFresh(sv[1]);
  }
  return r;
}

NVFS_DIRECT_EXPORT int accept(int fd, struct sockaddr* addr, socklen_t* len) {
  return FdFresh(libc::Get(&libc::Table::accept)(fd, addr, len));
}

NVFS_DIRECT_EXPORT int accept4(int fd, struct sockaddr* addr, socklen_t* len, int flags) {
  return FdFresh(libc::Get(&libc::Table::accept4)(fd, addr, len, flags));
}

// Descriptors received over a socket (SCM_RIGHTS) are new numbers too.
NVFS_DIRECT_EXPORT ssize_t recvmsg(int fd, struct msghdr* msg, int flags) {
  const ssize_t r = libc::Get(&libc::Table::recvmsg)(fd, msg, flags);
  if (r >= 0 && msg != nullptr && msg->msg_controllen != 0 && Preloaded()) {
    for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
        FdFresh(received);
      }
    }
  }
  return r;
}

NVFS_DIRECT_EXPORT int pipe(int fds[2]) noexcept {
  const int r = libc::Get(&libc::Table::pipe)(fds);
  if (r == 0) {
    FdFresh(fds[0]);
    FdFresh(fds[1]);
  }
  return r;
}

NVFS_DIRECT_EXPORT int pipe2(int fds[2], int flags) noexcept {
  const int r = libc::Get(&libc::Table::pipe2)(fds, flags);
  if (r == 0) {
    FdFresh(fds[0]);
    FdFresh(fds[1]);
  }
  return r;
}

NVFS_DIRECT_EXPORT int eventfd(unsigned count, int flags) noexcept {
  return FdFresh(libc::Get(&libc::Table::eventfd)(count, flags));
}

NVFS_DIRECT_EXPORT int epoll_create(int size) noexcept {
  return FdFresh(libc::Get(&libc::Table::epoll_create)(size));
}

NVFS_DIRECT_EXPORT int epoll_create1(int flags) noexcept {
  return FdFresh(libc::Get(&libc::Table::epoll_create1)(flags));
}

NVFS_DIRECT_EXPORT int memfd_create(const char* name, unsigned flags) noexcept {
  return FdFresh(libc::Get(&libc::Table::memfd_create)(name, flags));
}
