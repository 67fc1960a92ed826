// libnvfs-direct as LD_PRELOAD (preload.hpp).
//
// The descriptor table: one entry per descriptor number (chunks of 1024,
// made at the first read of a number in them, never freed), holding the
// number's handle, kNotDirect (read through the kernel: a negative result
// cached, so a descriptor that is not an nvfs file costs no system call
// after its first read), or null (not looked at yet, including descriptors
// opened before the library was loaded). A handle is reached without a
// lock, inside a read section (epoch.hpp), and retired when its number is
// freed or reused.
//
// A number is forgotten (its entry cleared, its generation moved) before
// and after every call that frees it (close, close_range, closefrom, dup2
// and dup3 onto it, fclose, fcloseall, freopen and closedir, which close
// inside libc, fcntl F_SETFL, which may set O_DIRECT) and after every call
// that returns a new one (open and its kin, fopen, freopen, dup, fcntl
// F_DUPFD, socket, socketpair, accept, pipe, eventfd, epoll_create,
// memfd_create, opendir, recvmsg's SCM_RIGHTS), so a number reused for
// another file never reads the old file's bytes when either its close or
// its reuse was seen. Both unseen (a raw system call, io_uring, a libc
// internal close such as pclose's, followed by, say, signalfd) is the one
// way left for a stale entry. A read that classifies a number installs its
// handle only if the generation did not move meanwhile.
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
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <linux/close_range.h>

#include <atomic>
#include <new>

#include "direct/epoch.hpp"
#include "direct/export.hpp"
#include "direct/file.hpp"
#include "direct/libc.hpp"
#include "direct/session.hpp"
#include "nvfs/direct.h"

namespace nvfs::direct {

namespace {

// Set once by the constructor, before the program runs.
std::atomic<bool> preloaded{false};

constexpr unsigned kFdsPerChunk = 1024;
constexpr unsigned kChunks = 1024;  // numbers past 2^20 go to the kernel
constexpr unsigned kMaxFd = kFdsPerChunk * kChunks - 1;

struct FdEntry {
  std::atomic<nvfs_direct*> handle{nullptr};
  std::atomic<uint64_t> generation{0};  // moved whenever the number is forgotten
};
struct FdChunk {
  FdEntry entries[kFdsPerChunk];
};
std::atomic<FdChunk*> chunks[kChunks];

nvfs_direct* const kNotDirect = reinterpret_cast<nvfs_direct*>(uintptr_t{1});

// Handles forgotten from a signal handler that interrupted the library on
// its thread (retiring takes a lock): retired by the next forget outside one.
std::atomic<nvfs_direct*> pending{nullptr};

FdEntry* Find(int fd) {
  if (fd < 0 || static_cast<unsigned>(fd) > kMaxFd) return nullptr;
  FdChunk* c = chunks[static_cast<unsigned>(fd) / kFdsPerChunk].load(std::memory_order_acquire);
  return c == nullptr ? nullptr : &c->entries[static_cast<unsigned>(fd) % kFdsPerChunk];
}

FdEntry* FindOrMake(int fd) {
  if (fd < 0 || static_cast<unsigned>(fd) > kMaxFd) return nullptr;
  std::atomic<FdChunk*>& slot = chunks[static_cast<unsigned>(fd) / kFdsPerChunk];
  FdChunk* c = slot.load(std::memory_order_acquire);
  if (c == nullptr) {
    auto* fresh = new (std::nothrow) FdChunk;
    if (fresh == nullptr) return nullptr;
    if (slot.compare_exchange_strong(c, fresh, std::memory_order_acq_rel)) {
      c = fresh;
    } else {
      delete fresh;
    }
  }
  return &c->entries[static_cast<unsigned>(fd) % kFdsPerChunk];
}

void Release(nvfs_direct* h) {
  if (tls.depth != 0) {
    nvfs_direct* head = pending.load(std::memory_order_relaxed);
    do {
      h->pending_next = head;
    } while (!pending.compare_exchange_weak(head, h, std::memory_order_release,
                                            std::memory_order_relaxed));
    return;
  }
  DepthGuard depth;
  for (nvfs_direct* p = pending.exchange(nullptr, std::memory_order_acquire); p != nullptr;) {
    nvfs_direct* next = p->pending_next;
    RetireHandle(p);
    p = next;
  }
  RetireHandle(h);
}

void ForgetEntry(FdEntry& e) {
  e.generation.fetch_add(1, std::memory_order_seq_cst);
  if (e.handle.load(std::memory_order_relaxed) == nullptr) return;
  nvfs_direct* old = e.handle.exchange(nullptr, std::memory_order_acq_rel);
  if (old != nullptr && old != kNotDirect) Release(old);
}

// errno is kept: these run around the program's own calls.
void Forget(int fd) {
  if (!preloaded.load(std::memory_order_relaxed)) return;
  FdEntry* e = Find(fd);
  if (e == nullptr) return;
  const int saved = errno;
  ForgetEntry(*e);
  errno = saved;
}

void ForgetRange(unsigned first, unsigned last) {
  if (!preloaded.load(std::memory_order_relaxed) || first > kMaxFd) return;
  const int saved = errno;
  if (last > kMaxFd) last = kMaxFd;
  for (unsigned c = first / kFdsPerChunk; c <= last / kFdsPerChunk; ++c) {
    FdChunk* chunk = chunks[c].load(std::memory_order_acquire);
    if (chunk == nullptr) continue;
    const unsigned lo = c == first / kFdsPerChunk ? first % kFdsPerChunk : 0;
    const unsigned hi = c == last / kFdsPerChunk ? last % kFdsPerChunk : kFdsPerChunk - 1;
    for (unsigned i = lo; i <= hi; ++i) ForgetEntry(chunk->entries[i]);
  }
  errno = saved;
}

// Before a call that may free `fd`: ours (a session socket) or the program's.
void Closing(int fd) {
  if (fd < 0) return;
  SessionsNoteClosed(static_cast<unsigned>(fd), static_cast<unsigned>(fd));
  Forget(fd);
}

int Fresh(int fd) {
  if (fd >= 0) Forget(fd);
  return fd;
}

// Looks at a descriptor not seen before and installs what it is. False: the
// read goes to the kernel this time (no memory, or the number was freed or
// reused while it was looked at).
bool Classify(int fd, off_t offset) {
  FdEntry* e = FindOrMake(fd);
  if (e == nullptr) return false;
  const uint64_t generation = e->generation.load(std::memory_order_seq_cst);
  nvfs_direct* h = Attach(fd, static_cast<uint64_t>(offset));
  if (h == nullptr) return false;
  nvfs_direct* value = h;
  if (h->why.load(std::memory_order_relaxed) != NVFS_DIRECT_ACTIVE) {
    HandleUnref(h);  // never published
    value = kNotDirect;
  }
  nvfs_direct* expected = nullptr;
  if (!e->handle.compare_exchange_strong(expected, value, std::memory_order_acq_rel)) {
    if (value != kNotDirect) HandleUnref(h);  // another reader's classification stands
    return true;
  }
  if (e->generation.load(std::memory_order_seq_cst) != generation) {
    // Closed or reused meanwhile: what was looked at may be the old file.
    nvfs_direct* mine = value;
    if (e->handle.compare_exchange_strong(mine, nullptr, std::memory_order_acq_rel) &&
        value != kNotDirect) {
      RetireHandle(value);
    }
    return false;
  }
  return true;
}

// pread and preadv: the descriptor's handle if it has one, else the kernel.
// `kernel` reads through libc.
template <class Kernel>
ssize_t Serve(int fd, const iovec* iov, int iovcnt, off_t offset, Kernel&& kernel) {
  if (!preloaded.load(std::memory_order_relaxed) || tls.depth != 0 || offset < 0 || iovcnt <= 0) {
    return kernel();
  }
  DepthGuard depth;
  FdEntry* e = Find(fd);
  for (int pass = 0; pass < 2; ++pass) {
    nvfs_direct* h = nullptr;
    {
      ReadSection section;
      if (!section.Enter()) break;
      h = e == nullptr ? nullptr : e->handle.load(std::memory_order_acquire);
      if (h == kNotDirect) break;
      if (h != nullptr) {
        if (iovcnt == 1 && iov[0].iov_len <= kChunk) {
          const Snapshot* s = h->snapshot.load(std::memory_order_acquire);
          if (s != nullptr) {
            const ssize_t n = ReadFast(s, iov[0].iov_base, iov[0].iov_len, static_cast<uint64_t>(offset));
            if (n != kSlow) return n;
          }
        }
        HandleRef(h);  // the slow path leaves the section
      }
    }
    if (h == nullptr) {
      if (pass == 1 || !Classify(fd, offset)) break;
      e = Find(fd);
      continue;
    }
    const ssize_t n = ReadSlow(h, iov, iovcnt, offset);
    const int saved = errno;
    HandleUnref(h);
    errno = saved;
    return n;
  }
  return kernel();
}

ssize_t ServePread(int fd, void* buf, size_t count, off_t offset,
                   ssize_t (*real)(int, void*, size_t, off_t)) {
  const iovec one{buf, count};
  return Serve(fd, &one, 1, offset, [&] { return real(fd, buf, count, offset); });
}

ssize_t ServePreadv(int fd, const iovec* iov, int iovcnt, off_t offset,
                    ssize_t (*real)(int, const iovec*, int, off_t)) {
  return Serve(fd, iov, iovcnt, offset, [&] { return real(fd, iov, iovcnt, offset); });
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
      preloaded.store(true, std::memory_order_relaxed);
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

// Flags 0 only: RWF_NOWAIT, RWF_HIPRI and the rest mean something to the
// kernel; offset -1 (the file position) is the kernel's too.
NVFS_DIRECT_EXPORT ssize_t preadv2(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags) {
  auto* real = libc::Get(&libc::Table::preadv2);
  if (flags != 0 || offset < 0) return real(fd, iov, iovcnt, offset, flags);
  return Serve(fd, iov, iovcnt, offset, [&] { return real(fd, iov, iovcnt, offset, flags); });
}

NVFS_DIRECT_EXPORT ssize_t preadv64v2(int fd, const struct iovec* iov, int iovcnt, off_t offset,
                                      int flags) {
  auto* real = libc::Get(&libc::Table::preadv64v2);
  if (flags != 0 || offset < 0) return real(fd, iov, iovcnt, offset, flags);
  return Serve(fd, iov, iovcnt, offset, [&] { return real(fd, iov, iovcnt, offset, flags); });
}

// --- calls that free a number --------------------------------------------------

NVFS_DIRECT_EXPORT int close(int fd) {
  Closing(fd);
  const int r = libc::Get(&libc::Table::close)(fd);
  Forget(fd);
  return r;
}

NVFS_DIRECT_EXPORT int close_range(unsigned first, unsigned last, int flags) noexcept {
  const bool closes = (flags & CLOSE_RANGE_CLOEXEC) == 0;
  if (closes) {
    SessionsNoteClosed(first, last);
    ForgetRange(first, last);
  }
  auto* real = libc::Get(&libc::Table::close_range);
  const int r = real != nullptr ? real(first, last, flags)
                                : static_cast<int>(syscall(SYS_close_range, first, last, flags));
  if (closes) ForgetRange(first, last);
  return r;
}

NVFS_DIRECT_EXPORT void closefrom(int low) noexcept {
  const unsigned first = low < 0 ? 0 : static_cast<unsigned>(low);
  SessionsNoteClosed(first, UINT_MAX);
  ForgetRange(first, UINT_MAX);
  auto* real = libc::Get(&libc::Table::closefrom);
  if (real != nullptr) {
    real(low);
  } else {
    syscall(SYS_close_range, first, ~0u, 0);
  }
  ForgetRange(first, UINT_MAX);
}

NVFS_DIRECT_EXPORT int dup2(int oldfd, int newfd) noexcept {
  if (oldfd != newfd) Closing(newfd);
  const int r = libc::Get(&libc::Table::dup2)(oldfd, newfd);
  if (r >= 0) Forget(r);
  return r;
}

NVFS_DIRECT_EXPORT int dup3(int oldfd, int newfd, int flags) noexcept {
  if (oldfd != newfd) Closing(newfd);
  const int r = libc::Get(&libc::Table::dup3)(oldfd, newfd, flags);
  if (r >= 0) Forget(r);
  return r;
}

NVFS_DIRECT_EXPORT int fclose(FILE* stream) {
  const int fd = stream != nullptr ? fileno(stream) : -1;
  Closing(fd);
  const int r = libc::Get(&libc::Table::fclose)(stream);
  if (fd >= 0) Forget(fd);
  return r;
}

// Closes every stream inside libc: which numbers were freed is not known,
// so all are forgotten.
NVFS_DIRECT_EXPORT int fcloseall(void) {
  const int r = libc::Get(&libc::Table::fcloseall)();
  ForgetRange(0, kMaxFd);
  return r;
}

NVFS_DIRECT_EXPORT int closedir(DIR* dir) {
  const int fd = dirfd(dir);
  Closing(fd);
  const int r = libc::Get(&libc::Table::closedir)(dir);
  if (fd >= 0) Forget(fd);
  return r;
}

namespace {

int AfterFcntl(int fd, int cmd, int r) {
  if (r < 0) return r;
  if (cmd == F_SETFL) Forget(fd);  // O_DIRECT may have come (or gone)
  if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) Forget(r);
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

NVFS_DIRECT_EXPORT int open(const char* path, int flags, ...) {
  NVFS_OPEN_MODE(flags);
  return Fresh(libc::Get(&libc::Table::open)(path, flags, mode));
}

NVFS_DIRECT_EXPORT int open64(const char* path, int flags, ...) {
  NVFS_OPEN_MODE(flags);
  return Fresh(libc::Get(&libc::Table::open64)(path, flags, mode));
}

NVFS_DIRECT_EXPORT int openat(int dirfd, const char* path, int flags, ...) {
  NVFS_OPEN_MODE(flags);
  return Fresh(libc::Get(&libc::Table::openat)(dirfd, path, flags, mode));
}

NVFS_DIRECT_EXPORT int openat64(int dirfd, const char* path, int flags, ...) {
  NVFS_OPEN_MODE(flags);
  return Fresh(libc::Get(&libc::Table::openat64)(dirfd, path, flags, mode));
}

#undef NVFS_OPEN_MODE

NVFS_DIRECT_EXPORT int __open_2(const char* path, int flags) {
  return Fresh(libc::Get(&libc::Table::open_2)(path, flags));
}

NVFS_DIRECT_EXPORT int __open64_2(const char* path, int flags) {
  return Fresh(libc::Get(&libc::Table::open64_2)(path, flags));
}

NVFS_DIRECT_EXPORT int __openat_2(int dirfd, const char* path, int flags) {
  return Fresh(libc::Get(&libc::Table::openat_2)(dirfd, path, flags));
}

NVFS_DIRECT_EXPORT int __openat64_2(int dirfd, const char* path, int flags) {
  return Fresh(libc::Get(&libc::Table::openat64_2)(dirfd, path, flags));
}

NVFS_DIRECT_EXPORT int creat(const char* path, mode_t mode) {
  return Fresh(libc::Get(&libc::Table::creat)(path, mode));
}

NVFS_DIRECT_EXPORT int creat64(const char* path, mode_t mode) {
  return Fresh(libc::Get(&libc::Table::creat64)(path, mode));
}

namespace {

FILE* FreshStream(FILE* f) {
  if (f != nullptr) Fresh(fileno(f));
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
  Closing(old);
  FILE* f = libc::Get(&libc::Table::freopen)(path, mode, stream);
  if (old >= 0) Forget(old);
  return FreshStream(f);
}

NVFS_DIRECT_EXPORT FILE* freopen64(const char* path, const char* mode, FILE* stream) {
  const int old = stream != nullptr ? fileno(stream) : -1;
  Closing(old);
  FILE* f = libc::Get(&libc::Table::freopen64)(path, mode, stream);
  if (old >= 0) Forget(old);
  return FreshStream(f);
}

NVFS_DIRECT_EXPORT DIR* opendir(const char* path) {
  DIR* d = libc::Get(&libc::Table::opendir)(path);
  if (d != nullptr) Fresh(dirfd(d));
  return d;
}

NVFS_DIRECT_EXPORT int dup(int fd) noexcept { return Fresh(libc::Get(&libc::Table::dup)(fd)); }

NVFS_DIRECT_EXPORT int socket(int domain, int type, int protocol) noexcept {
  return Fresh(libc::Get(&libc::Table::socket)(domain, type, protocol));
}

NVFS_DIRECT_EXPORT int socketpair(int domain, int type, int protocol, int sv[2]) noexcept {
  const int r = libc::Get(&libc::Table::socketpair)(domain, type, protocol, sv);
  if (r == 0) {
    Fresh(sv[0]);
    Fresh(sv[1]);
  }
  return r;
}

NVFS_DIRECT_EXPORT int accept(int fd, struct sockaddr* addr, socklen_t* len) {
  return Fresh(libc::Get(&libc::Table::accept)(fd, addr, len));
}

NVFS_DIRECT_EXPORT int accept4(int fd, struct sockaddr* addr, socklen_t* len, int flags) {
  return Fresh(libc::Get(&libc::Table::accept4)(fd, addr, len, flags));
}

// Descriptors received over a socket (SCM_RIGHTS) are new numbers too.
NVFS_DIRECT_EXPORT ssize_t recvmsg(int fd, struct msghdr* msg, int flags) {
  const ssize_t r = libc::Get(&libc::Table::recvmsg)(fd, msg, flags);
  if (r >= 0 && msg != nullptr && msg->msg_controllen != 0 && preloaded.load(std::memory_order_relaxed)) {
    for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
        Fresh(received);
      }
    }
  }
  return r;
}

NVFS_DIRECT_EXPORT int pipe(int fds[2]) noexcept {
  const int r = libc::Get(&libc::Table::pipe)(fds);
  if (r == 0) {
    Fresh(fds[0]);
    Fresh(fds[1]);
  }
  return r;
}

NVFS_DIRECT_EXPORT int pipe2(int fds[2], int flags) noexcept {
  const int r = libc::Get(&libc::Table::pipe2)(fds, flags);
  if (r == 0) {
    Fresh(fds[0]);
    Fresh(fds[1]);
  }
  return r;
}

NVFS_DIRECT_EXPORT int eventfd(unsigned count, int flags) noexcept {
  return Fresh(libc::Get(&libc::Table::eventfd)(count, flags));
}

NVFS_DIRECT_EXPORT int epoll_create(int size) noexcept {
  return Fresh(libc::Get(&libc::Table::epoll_create)(size));
}

NVFS_DIRECT_EXPORT int epoll_create1(int flags) noexcept {
  return Fresh(libc::Get(&libc::Table::epoll_create1)(flags));
}

NVFS_DIRECT_EXPORT int memfd_create(const char* name, unsigned flags) noexcept {
  return Fresh(libc::Get(&libc::Table::memfd_create)(name, flags));
}
