// The preload's descriptor table (fd_table.hpp).
#include "direct/fd_table.hpp"

#include <sys/mman.h>

#include "direct/map.hpp"

#include <errno.h>

#include <atomic>
#include <new>

#include "direct/epoch.hpp"
#include "direct/file.hpp"
#include "direct/proof_fds.hpp"
#include "direct/session.hpp"
#include "nvfs/direct.h"

namespace nvfs::direct {

namespace {

// Set once by the constructor, before the program runs.
std::atomic<bool> preloaded{false};

constexpr unsigned kFdsPerChunk = 1024;
constexpr unsigned kChunks = 1024;  // numbers past 2^20 go to the kernel
static_assert(kFdsPerChunk * kChunks - 1 == kMaxFd);

struct FdEntry {
  std::atomic<nvfs_direct*> handle{nullptr};
  std::atomic<uint64_t> generation{0};  // moved whenever the number is forgotten
};
struct FdChunk {
  FdEntry entries[kFdsPerChunk];
};
std::atomic<FdChunk*> chunks[kChunks];

// A number read through the kernel is marked with why (an odd value:
// handles are aligned).
nvfs_direct* NotDirect(int why) {
  return reinterpret_cast<nvfs_direct*>((static_cast<uintptr_t>(why) << 1) | 1);
}
bool IsNotDirect(const nvfs_direct* h) { return reinterpret_cast<uintptr_t>(h) & 1; }
int NotDirectWhy(const nvfs_direct* h) { return static_cast<int>(reinterpret_cast<uintptr_t>(h) >> 1); }

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
  if (old != nullptr && !IsNotDirect(old)) Release(old);
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
  ProofFdsNoteClosed(static_cast<unsigned>(fd), static_cast<unsigned>(fd));
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
  const int why = h->why.load(std::memory_order_relaxed);
  if (why != NVFS_DIRECT_ACTIVE) {
    HandleUnref(h);  // never published
    value = NotDirect(why);
  }
  nvfs_direct* expected = nullptr;
  if (!e->handle.compare_exchange_strong(expected, value, std::memory_order_acq_rel)) {
    if (!IsNotDirect(value)) HandleUnref(h);  // another reader's classification stands
    return true;
  }
  if (e->generation.load(std::memory_order_seq_cst) != generation) {
    // Closed or reused meanwhile: what was looked at may be the old file.
    nvfs_direct* mine = value;
    if (e->handle.compare_exchange_strong(mine, nullptr, std::memory_order_acq_rel) &&
        !IsNotDirect(value)) {
      RetireHandle(value);
    }
    return false;
  }
  return true;
}

// The handle of `fd` with a reference for the caller, the number looked at
// first if it was not yet (classify); null when the kernel serves it (not
// an nvfs file, `usable` says no, or the number moved while looked at).
// `usable` runs inside the read section. REQUIRES: tls.depth set.
template <class Usable>
nvfs_direct* HandleFor(int fd, off_t offset, bool classify, Usable&& usable) {
  for (int pass = 0; pass < 2; ++pass) {
    FdEntry* e = Find(fd);
    {
      ReadSection section;
      if (!section.Enter()) return nullptr;
      nvfs_direct* h = e == nullptr ? nullptr : e->handle.load(std::memory_order_acquire);
      if (IsNotDirect(h)) return nullptr;
      if (h != nullptr) {
        if (!usable(h)) return nullptr;
        HandleRef(h);
        return h;
      }
    }
    if (!classify || pass == 1 || !Classify(fd, offset)) return nullptr;
  }
  return nullptr;
}

}  // namespace

bool FdServeWrite(int fd, const iovec* iov, int iovcnt, off_t offset, int flags,
                  ssize_t* result) {
  if (!preloaded.load(std::memory_order_relaxed) || tls.depth != 0 || offset < 0 || iovcnt <= 0) {
    return false;
  }
  DepthGuard depth;
  nvfs_direct* h = HandleFor(fd, offset, /*classify=*/true, [](const nvfs_direct* f) {
    return f->write_why.load(std::memory_order_acquire) == NVFS_DIRECT_ACTIVE;
  });
  if (h == nullptr) return false;
  *result = Write(h, iov, iovcnt, offset, flags);
  const int saved = errno;
  MapsAfterWrite(h);
  HandleUnref(h);
  errno = saved;
  return true;
}

bool FdServeMap(int fd, void* addr, size_t length, int prot, int flags, off_t offset,
                void** result) {
  if (!preloaded.load(std::memory_order_relaxed) || tls.depth != 0 || fd < 0 ||
      (flags & MAP_ANONYMOUS) != 0) {
    return false;
  }
  DepthGuard depth;
  nvfs_direct* h = HandleFor(fd, offset < 0 ? 0 : offset, /*classify=*/true,
                             [](const nvfs_direct*) { return true; });
  if (h == nullptr) return false;
  int why = NVFS_DIRECT_ACTIVE;
  const bool served = MapFile(h, addr, length, prot, flags, offset, result, &why);
  const int saved = errno;
  h->map_why.store(why, std::memory_order_relaxed);
  HandleUnref(h);
  errno = saved;
  return served;
}

void FdAfterKernelWrite(int fd) {
  if (!preloaded.load(std::memory_order_relaxed) || !MapsAny()) return;
  DepthGuard depth;
  nvfs_direct* h = HandleFor(fd, 0, /*classify=*/false, [](const nvfs_direct*) { return true; });
  if (h == nullptr) return;
  const int saved = errno;
  MapsAfterWrite(h);
  HandleUnref(h);
  errno = saved;
}

void FdSettle(int fd, bool closing) {
  if (!preloaded.load(std::memory_order_relaxed) || tls.depth != 0) return;
  DepthGuard depth;
  FdEntry* e = Find(fd);
  nvfs_direct* h = nullptr;
  {
    ReadSection section;
    if (!section.Enter()) return;
    h = e == nullptr ? nullptr : e->handle.load(std::memory_order_acquire);
    if (h == nullptr || IsNotDirect(h)) return;
    if (!h->written.load(std::memory_order_relaxed) && !(closing && h->reserved.load(std::memory_order_relaxed)) &&
        !(closing && h->map_held.load(std::memory_order_relaxed))) {
      return;
    }
    HandleRef(h);
  }
  const int saved = errno;
  if (closing) MapsRelease(h);
  Settle(h, closing);
  HandleUnref(h);
  errno = saved;
}

bool FdServe(int fd, const iovec* iov, int iovcnt, off_t offset, ssize_t* result) {
  if (!preloaded.load(std::memory_order_relaxed) || tls.depth != 0 || offset < 0 || iovcnt <= 0) {
    return false;
  }
  DepthGuard depth;
  FdEntry* e = Find(fd);
  for (int pass = 0; pass < 2; ++pass) {
    nvfs_direct* h = nullptr;
    {
      ReadSection section;
      if (!section.Enter()) break;
      h = e == nullptr ? nullptr : e->handle.load(std::memory_order_acquire);
      if (IsNotDirect(h)) break;
      if (h != nullptr && !h->readable) break;  // write-only: the kernel's EBADF
      if (h != nullptr) {
        if (iovcnt == 1 && iov[0].iov_len <= kChunk) {
          const Snapshot* s = h->snapshot.load(std::memory_order_acquire);
          if (s != nullptr) {
            const ssize_t n = ReadFast(s, iov[0].iov_base, iov[0].iov_len, static_cast<uint64_t>(offset));
            if (n != kSlow) {
              *result = n;
              return true;
            }
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
    *result = ReadSlow(h, iov, iovcnt, offset);
    const int saved = errno;
    HandleUnref(h);
    errno = saved;
    return true;
  }
  return false;
}


int FdWhy(int fd, bool write) {
  if (!preloaded.load(std::memory_order_relaxed)) {
    errno = ENOSYS;
    return -1;
  }
  if (tls.depth != 0) return NVFS_DIRECT_REFUSED;  // from a signal handler inside the library
  DepthGuard depth;
  for (int pass = 0; pass < 2; ++pass) {
    FdEntry* e = Find(fd);
    {
      ReadSection section;
      if (!section.Enter()) return NVFS_DIRECT_REFUSED;
      nvfs_direct* h = e == nullptr ? nullptr : e->handle.load(std::memory_order_acquire);
      if (h != nullptr) {
        if (IsNotDirect(h)) return NotDirectWhy(h);
        const int why = h->why.load(std::memory_order_relaxed);
        if (!write) return h->read_why();
        return why != NVFS_DIRECT_ACTIVE && why != NVFS_DIRECT_NOT_READABLE
                   ? why : h->write_why.load(std::memory_order_relaxed);
      }
    }
    if (!Classify(fd, 0)) break;
  }
  return NVFS_DIRECT_REFUSED;  // the number was freed or reused while it was looked at
}

void FdForgetNotDirect() {
  if (!preloaded.load(std::memory_order_relaxed) || tls.depth != 0) return;
  DepthGuard depth;
  for (std::atomic<FdChunk*>& slot : chunks) {
    FdChunk* chunk = slot.load(std::memory_order_acquire);
    if (chunk == nullptr) continue;
    for (FdEntry& e : chunk->entries) {
      nvfs_direct* h = e.handle.load(std::memory_order_relaxed);
      if (h == nullptr) continue;
      if (!IsNotDirect(h)) {
        // A handle's reason is read inside a section: the number may be
        // closed, and the handle retired, meanwhile.
        ReadSection section;
        if (!section.Enter()) return;
        h = e.handle.load(std::memory_order_acquire);
        if (h == nullptr || IsNotDirect(h) ||
            h->why.load(std::memory_order_acquire) == NVFS_DIRECT_ACTIVE) {
          continue;
        }
      }
      // Forgotten only if the entry still holds what was looked at (a
      // handle freed and another installed at the same address is
      // forgotten too, which costs it one more look).
      if (!e.handle.compare_exchange_strong(h, nullptr, std::memory_order_acq_rel)) continue;
      e.generation.fetch_add(1, std::memory_order_seq_cst);
      if (!IsNotDirect(h)) RetireHandle(h);
    }
  }
}

void SetPreloaded() { preloaded.store(true, std::memory_order_relaxed); }
bool Preloaded() { return preloaded.load(std::memory_order_relaxed); }

void FdForget(int fd) { Forget(fd); }
void FdForgetRange(unsigned first, unsigned last) { ForgetRange(first, last); }
void FdClosing(int fd) { Closing(fd); }
void FdClosingRange(unsigned first, unsigned last) {
  ProofFdsNoteClosed(first, last);
  ForgetRange(first, last);
}
int FdFresh(int fd) { return Fresh(fd); }

}  // namespace nvfs::direct
