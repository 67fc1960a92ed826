// libnvfs-direct's C API (include/nvfs/direct.h): attach, the read entry
// points (the paths themselves are file.hpp's and read.cpp's), detach; the
// handle's lifetime; the library's constructor and fork handlers.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <linux/magic.h>

#include <new>

#include "direct/credentials.hpp"
#include "direct/epoch.hpp"
#include "direct/export.hpp"
#include "direct/fault.hpp"
#include "direct/fd_table.hpp"
#include "direct/file.hpp"
#include "direct/libc.hpp"
#include "direct/lazy.hpp"
#include "direct/map.hpp"
#include "direct/preload.hpp"
#include "direct/proof_fds.hpp"
#include "direct/session.hpp"
#include "nvfs/direct.h"

namespace nvfs::direct {

namespace {

void FreeHandle(nvfs_direct* f) {
  MapsRelease(f);
  Snapshot* s = f->snapshot.load(std::memory_order_acquire);
  if (s != nullptr) FreeSnapshot(s);
  if (f->session != nullptr) f->session->Unref();
  delete f;
}

// The session's reason for a daemon's refusal of a file.
int WhyOfMapError(int err) {
  switch (err) {
    case EXDEV: case ENODEV: case EINVAL: case EISDIR: case ENOENT: case ESTALE:
      return NVFS_DIRECT_NOT_NVFS;
    case EBADF: case EACCES: case EPERM:
      return NVFS_DIRECT_NOT_READABLE;
    case ENOMEM:
      return NVFS_DIRECT_NO_MEMORY;
    default:
      return NVFS_DIRECT_REFUSED;
  }
}

// Whether a descriptor's writes may go direct, as far as its flags tell:
// open for writing (O_WRONLY or O_RDWR), and not O_APPEND (whose writes the
// kernel places at the end, whatever the offset).
int ClassifyWrite(int flags) {
  if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY || (flags & (O_APPEND | O_PATH | O_DIRECT)) != 0) {
    return NVFS_DIRECT_NOT_WRITABLE;
  }
  return NVFS_DIRECT_ACTIVE;
}

// What a descriptor is, before any session: NVFS_DIRECT_ACTIVE when it may
// be attached as far as the process can tell (read directly if *readable;
// a write-only one for its writes alone), and its flags in *flags.
int Classify(int fd, struct stat* st, int* flags, bool* readable) {
  *flags = -1;
  *readable = false;
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) return NVFS_DIRECT_NOT_NVFS;
  if (!TestMode()) {
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0 || fs.f_type != FUSE_SUPER_MAGIC) return NVFS_DIRECT_NOT_NVFS;
  }
  *flags = libc::Get(&libc::Table::fcntl)(fd, F_GETFL);
  if (*flags < 0 || (*flags & O_PATH) != 0) return NVFS_DIRECT_NOT_READABLE;
  if ((*flags & O_DIRECT) != 0) return NVFS_DIRECT_O_DIRECT;
  *readable = (*flags & O_ACCMODE) != O_WRONLY;
  if (!*readable && ClassifyWrite(*flags) != NVFS_DIRECT_ACTIVE) return NVFS_DIRECT_NOT_READABLE;
  return NVFS_DIRECT_ACTIVE;
}

void PrepareFork() {
  MapsPrepareFork();
  SessionsPrepareFork();
  EpochPrepareFork();
  FaultPrepareFork();
}
void ParentAfterFork() {
  FaultAfterFork();
  EpochParentAfterFork();
  SessionsParentAfterFork();
  MapsParentAfterFork();
}
void ChildAfterFork() {
  ProofFdsChildAfterFork();  // a take-out of the parent's did not come along
  MapsChildAfterFork();  // its direct maps become the kernel's: it has no listener
  LazyChildAfterFork();  // nor a resolver, and the parent's userfaultfd is the parent's
  CredentialsChildAfterFork();  // before the child runs any code of its own
  WritersChildAfterFork();
  FaultAfterFork();
  EpochChildAfterFork();
  SessionsChildAfterFork();
}

__attribute__((constructor)) void LibraryInit() {
  libc::Resolve();
  pthread_atfork(PrepareFork, ParentAfterFork, ChildAfterFork);
  PreloadInit();
}

}  // namespace

nvfs_direct* Attach(int fd, uint64_t offset) {
  struct stat st;
  int flags;
  bool readable;
  const int why = Classify(fd, &st, &flags, &readable);
  // A descriptor refused as unreadable may still be refused for writing
  // for its own reason (write-only and O_APPEND).
  const int write_why =
      why == NVFS_DIRECT_ACTIVE || (why == NVFS_DIRECT_NOT_READABLE && flags >= 0)
          ? ClassifyWrite(flags) : why;
  auto* f = new (std::nothrow) nvfs_direct(fd, readable, why, write_why);
  if (f == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  if (why != NVFS_DIRECT_ACTIVE) return f;
  // A session found gone on its first request is replaced once.
  for (int attempt = 0; attempt < 2; ++attempt) {
    int session_why = NVFS_DIRECT_ACTIVE;
    Session* session = SessionFor(st.st_dev, &session_why);
    if (session == nullptr) {
      f->why.store(session_why, std::memory_order_relaxed);
      // A session of an earlier mount that had the same device number
      // (its daemon gone): found gone on its reconnect, and replaced.
      if (session_why == NVFS_DIRECT_GONE) continue;
      return f;
    }
    // A write-only descriptor is mapped for a writer alone: the session
    // proves it may write the namespace first.
    MapReply reply;
    const int status = session->Map(fd, offset, &reply, /*for_write=*/!readable);
    if (status == Session::kMapNoWrites) {
      f->write_why.store(session->write_why(), std::memory_order_relaxed);
      f->why.store(NVFS_DIRECT_NOT_READABLE, std::memory_order_relaxed);
      session->Unref();
      return f;
    }
    if (status == Session::kMapGone) {
      session->Unref();
      f->why.store(NVFS_DIRECT_GONE, std::memory_order_relaxed);
      continue;
    }
    if (status == Session::kMapEnded) {
      session->Unref();
      f->why.store(NVFS_DIRECT_NO_NAMESPACE, std::memory_order_relaxed);
      return f;
    }
    f->session = session;
    f->why.store(NVFS_DIRECT_ACTIVE, std::memory_order_relaxed);
    if (status == Session::kMapOk) {
      // Without memory for it, the first read asks again.
      f->ino = reply.ino;
      f->snapshot.store(BuildSnapshot(session, reply, nullptr), std::memory_order_release);
      if (!readable && (reply.flags & kMapWritable) == 0) {
        f->write_why.store(NVFS_DIRECT_PRIVILEGED, std::memory_order_relaxed);
      }
    } else if (status > 0) {
      f->why.store(WhyOfMapError(status), std::memory_order_relaxed);
    }
    // kMapUnavailable: active without runs; the first read asks again.
    return f;
  }
  return f;
}

void HandleUnref(nvfs_direct* f) {
  if (f->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) FreeHandle(f);
}

void RetireHandle(nvfs_direct* f) {
  Retire(f, [](void* p) { HandleUnref(static_cast<nvfs_direct*>(p)); });
}

}  // namespace nvfs::direct

using namespace nvfs::direct;

NVFS_DIRECT_EXPORT nvfs_direct* nvfs_direct_attach(int fd) {
  DepthGuard depth;
  return Attach(fd, 0);
}

NVFS_DIRECT_EXPORT ssize_t nvfs_direct_pread(nvfs_direct* f, void* buf, size_t count, off_t offset) {
  if (tls.depth != 0 || !f->readable) return libc::Get(&libc::Table::pread)(f->fd, buf, count, offset);
  DepthGuard depth;
  if (count <= kChunk && offset >= 0) {
    ReadSection section;
    if (section.Enter()) {
      const Snapshot* s = f->snapshot.load(std::memory_order_acquire);
      if (s != nullptr) {
        const ssize_t n = ReadFast(s, buf, count, static_cast<uint64_t>(offset));
        if (n != kSlow) return n;
      }
    }
  }
  const iovec one{buf, count};
  return ReadSlow(f, &one, 1, offset);
}

NVFS_DIRECT_EXPORT ssize_t nvfs_direct_preadv(nvfs_direct* f, const struct iovec* iov, int iovcnt,
                                              off_t offset) {
  if (tls.depth != 0 || !f->readable) return libc::Get(&libc::Table::preadv)(f->fd, iov, iovcnt, offset);
  DepthGuard depth;
  return ReadSlow(f, iov, iovcnt, offset);
}

NVFS_DIRECT_EXPORT ssize_t nvfs_direct_pwrite(nvfs_direct* f, const void* buf, size_t count,
                                              off_t offset) {
  if (tls.depth != 0) return libc::Get(&libc::Table::pwrite)(f->fd, buf, count, offset);
  DepthGuard depth;
  const iovec one{const_cast<void*>(buf), count};
  const ssize_t r = Write(f, &one, 1, offset, 0);
  const int saved = errno;
  MapsAfterWrite(f);
  errno = saved;
  return r;
}

NVFS_DIRECT_EXPORT ssize_t nvfs_direct_pwritev(nvfs_direct* f, const struct iovec* iov, int iovcnt,
                                               off_t offset) {
  if (tls.depth != 0) return libc::Get(&libc::Table::pwritev)(f->fd, iov, iovcnt, offset);
  DepthGuard depth;
  const ssize_t r = Write(f, iov, iovcnt, offset, 0);
  const int saved = errno;
  MapsAfterWrite(f);
  errno = saved;
  return r;
}

NVFS_DIRECT_EXPORT int nvfs_direct_fsync(nvfs_direct* f) {
  if (tls.depth == 0) {
    DepthGuard depth;
    Settle(f, /*closing=*/false);
  }
  return libc::Get(&libc::Table::fsync)(f->fd);
}

NVFS_DIRECT_EXPORT int nvfs_direct_write_why(const nvfs_direct* f) {
  if (f == nullptr) return NVFS_DIRECT_NO_MEMORY;
  const int why = f->why.load(std::memory_order_acquire);
  // Unreadable says nothing of writing: a write-only descriptor's own reason.
  return why != NVFS_DIRECT_ACTIVE && why != NVFS_DIRECT_NOT_READABLE
             ? why : f->write_why.load(std::memory_order_acquire);
}

NVFS_DIRECT_EXPORT int nvfs_direct_why(const nvfs_direct* f) {
  return f == nullptr ? NVFS_DIRECT_NO_MEMORY : f->read_why();
}

NVFS_DIRECT_EXPORT const char* nvfs_direct_strwhy(int why) {
  switch (why) {
    case NVFS_DIRECT_ACTIVE: return "read directly from the namespace";
    case NVFS_DIRECT_NOT_NVFS: return "not a regular file on an nvfs mount";
    case NVFS_DIRECT_NO_SERVER: return "the mount serves no direct sessions";
    case NVFS_DIRECT_NO_NAMESPACE: return "this process may not read the namespace";
    case NVFS_DIRECT_NOT_READABLE: return "the descriptor is not open for reading";
    case NVFS_DIRECT_O_DIRECT: return "opened with O_DIRECT: the kernel serves it";
    case NVFS_DIRECT_REFUSED: return "the daemon refused the session or the file";
    case NVFS_DIRECT_GONE: return "the daemon that served the file went away";
    case NVFS_DIRECT_NO_MEMORY: return "out of memory";
    case NVFS_DIRECT_NOT_WRITABLE: return "the descriptor is not open for reading and writing (or is O_APPEND)";
    case NVFS_DIRECT_NO_WRITE_NAMESPACE: return "this process may not write the namespace";
    case NVFS_DIRECT_NO_WRITES: return "the mount serves no direct writes";
    case NVFS_DIRECT_PRIVILEGED: return "set-ID, capability, immutable or append-only: the kernel writes it";
    case NVFS_DIRECT_MAP_FLAGS: return "flags or a protection direct maps do not serve: the kernel maps it";
    default: return "unknown reason";
  }
}

NVFS_DIRECT_EXPORT void* nvfs_direct_mmap(nvfs_direct* f, void* addr, size_t length, int prot,
                                          int flags, off_t offset) {
  if (tls.depth == 0) {
    DepthGuard depth;
    void* result;
    int why = NVFS_DIRECT_ACTIVE;
    const bool served = MapFile(f, addr, length, prot, flags, offset, &result, &why);
    f->map_why.store(why, std::memory_order_relaxed);
    if (served) return result;
  }
  return libc::Mmap(addr, length, prot, flags, f->fd, offset);
}

NVFS_DIRECT_EXPORT int nvfs_direct_munmap(void* addr, size_t length) {
  if (tls.depth != 0) return libc::Munmap(addr, length);
  DepthGuard depth;
  return UnmapRange(addr, length);
}

NVFS_DIRECT_EXPORT int nvfs_direct_mmap_why(const nvfs_direct* f) {
  return f->map_why.load(std::memory_order_relaxed);
}

NVFS_DIRECT_EXPORT int nvfs_direct_addr_why(const void* addr) {
  if (tls.depth != 0) return NVFS_DIRECT_REFUSED;
  DepthGuard depth;
  return MapWhy(addr);
}

NVFS_DIRECT_EXPORT void nvfs_direct_detach(nvfs_direct* f) {
  if (f == nullptr) return;
  if (tls.depth == 0) {
    DepthGuard depth;
    Settle(f, /*closing=*/true);
    MapsRelease(f);
  }
  DepthGuard depth;
  RetireHandle(f);
}

NVFS_DIRECT_EXPORT int nvfs_direct_fd_why(int fd) { return FdWhy(fd, /*write=*/false); }
NVFS_DIRECT_EXPORT int nvfs_direct_fd_write_why(int fd) { return FdWhy(fd, /*write=*/true); }
