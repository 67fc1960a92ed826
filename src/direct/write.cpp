// The write path (file.hpp, Write; doc/integrity.md section 11).
//
// A store cannot be checked after the fact, as a read's copy is: the
// check comes first, and the daemon's grace period covers the time between
// it and the end of the store. Each thread that stores has a slot in its
// process's page of the writers' file (direct_abi.hpp). It makes the
// slot's gen odd, fences, and then checks what its runs were given for:
// the file's slot seq, the namespace's identity in its own mapping, that
// its mapping is the writable one of this proof and that the daemon has
// not stopped direct writes. Only then does it store and flush, and it
// makes the gen even after. The daemon moves the file's seq before a
// block leaves the file, and reuses the block only once every gen it saw
// odd after that has moved (src/daemon/direct_writers.cpp): a store that passed its check
// lands in a block of its own file, or in one still waiting to be reused.
//
// An overwrite of bytes the file has: no lock, no request, no system call
// (but msync where the namespace's flush is by the page). A write past the
// end or into a hole: one request for the blocks (kOpAllocate, which keeps
// a reserve past the end for the appends that follow), the store, and one
// request that exposes what was stored (kOpCommit: the size, the times,
// in one transaction). An append into the reserve costs the commit alone,
// and the ones after it nothing: the commit opened the file's append word,
// which they move themselves (StoreChunk; src/fs/direct.cpp says why).
#include <errno.h>
#include <limits.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cpuid.h>
#include <cstring>
#include <new>

#include "direct/epoch.hpp"
#include "direct/fault.hpp"
#include "direct/file.hpp"
#include "direct/libc.hpp"
#include "direct/session.hpp"
#include "nvfs/direct.h"

namespace nvfs::direct {

namespace {

constexpr int kMaxRefreshes = 8;
constexpr size_t kLine = 64;

// --- flushes ---------------------------------------------------------------------

enum class LineFlush { kUnknown, kClwb, kClflushopt, kClflush };
std::atomic<LineFlush> line_flush{LineFlush::kUnknown};

LineFlush DetectLineFlush() {
  unsigned a, b, c, d;
  LineFlush f = LineFlush::kClflush;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    if (b & (1u << 24)) {
      f = LineFlush::kClwb;
    } else if (b & (1u << 23)) {
      f = LineFlush::kClflushopt;
    }
  }
  line_flush.store(f, std::memory_order_relaxed);
  return f;
}

__attribute__((target("clwb"))) void FlushClwb(const char* p, const char* end) {
  for (; p < end; p += kLine) __builtin_ia32_clwb(p);
}
__attribute__((target("clflushopt"))) void FlushClflushopt(const char* p, const char* end) {
  for (; p < end; p += kLine) __builtin_ia32_clflushopt(p);
}

// Makes [p, p + len) of the namespace's mapping durable, as the daemon's
// own flush does (nvfs::Media): false if it could not (msync failed).
bool Persist(const Session* s, std::byte* p, size_t len) {
  switch (s->flush) {
    case kDirectFlushNone:
      return true;  // memory: the store is all there is
    case kDirectFlushFence:
      __builtin_ia32_sfence();
      return true;
    case kDirectFlushCacheLine: {
      const char* begin = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) & ~(kLine - 1));
      const char* end = reinterpret_cast<const char*>(p) + len;
      LineFlush f = line_flush.load(std::memory_order_relaxed);
      if (f == LineFlush::kUnknown) f = DetectLineFlush();
      if (f == LineFlush::kClwb) {
        FlushClwb(begin, end);
      } else if (f == LineFlush::kClflushopt) {
        FlushClflushopt(begin, end);
      } else {
        for (const char* q = begin; q < end; q += kLine) __builtin_ia32_clflush(q);
      }
      __builtin_ia32_sfence();
      return true;
    }
    default: {
      const uintptr_t page = 4096;
      const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
      const uintptr_t end = reinterpret_cast<uintptr_t>(p) + len;
      return msync(reinterpret_cast<void*>(start), end - start, MS_SYNC) == 0;
    }
  }
}

// --- the thread's slot in the writers' page -------------------------------------

// Every writers' page this process mapped (never unmapped while the
// library lives), for WritersWaitOutOthers.
constexpr int kMaxPages = 64;
std::atomic<DirectWriterPage*> pages[kMaxPages];

struct SlotCache {
  const Session* session = nullptr;
  uint64_t generation = 0;
  DirectWriterThread* slot = nullptr;
};

// Gives the thread's slots back when it exits (the pages stay mapped while
// the library lives, so this never touches freed memory).
struct ThreadSlots {
  static constexpr int kCached = 4;
  SlotCache cache[kCached];
  int next = 0;
  ~ThreadSlots() {
    for (SlotCache& c : cache) {
      if (c.slot != nullptr) c.slot->owner.store(0, std::memory_order_release);
    }
  }
};
thread_local ThreadSlots thread_slots;

uint64_t ThreadId() {
  static thread_local uint64_t tid = 0;
  if (tid == 0) tid = static_cast<uint64_t>(syscall(SYS_gettid));
  return tid;
}

void NotePage(DirectWriterPage* page) {
  for (auto& p : pages) {
    DirectWriterPage* cur = p.load(std::memory_order_acquire);
    if (cur == page) return;
    if (cur == nullptr) {
      DirectWriterPage* expected = nullptr;
      if (p.compare_exchange_strong(expected, page, std::memory_order_acq_rel) || expected == page) {
        return;
      }
    }
  }
}

// This thread's slot in `s`'s page: claimed at its first store there. Null
// when every slot is another thread's (the write goes to the kernel).
DirectWriterThread* ThreadSlot(Session* s, DirectWriterPage* page) {
  const uint64_t generation = s->writer_generation.load(std::memory_order_acquire);
  ThreadSlots& t = thread_slots;
  for (SlotCache& c : t.cache) {
    if (c.session == s && c.generation == generation && c.slot != nullptr) return c.slot;
  }
  const uint64_t me = ThreadId();
  for (DirectWriterThread& slot : page->threads) {
    uint64_t free = 0;
    if (slot.owner.load(std::memory_order_relaxed) == 0 &&
        slot.owner.compare_exchange_strong(free, me, std::memory_order_acq_rel)) {
      NotePage(page);
      SlotCache& c = t.cache[t.next];
      t.next = (t.next + 1) % ThreadSlots::kCached;
      if (c.slot != nullptr) c.slot->owner.store(0, std::memory_order_release);
      c = {s, generation, &slot};
      return &slot;
    }
  }
  return nullptr;
}

// --- the source of a write: a position in an iovec array ---------------------------

struct Source {
  const iovec* iov;
  int iovcnt;
  int index = 0;
  size_t in = 0;

  void Take(std::byte* dst, size_t n) {
    while (n > 0) {
      while (iov[index].iov_len == in) {
        ++index;
        in = 0;
      }
      const size_t k = std::min(n, iov[index].iov_len - in);
      std::memcpy(dst, static_cast<const char*>(iov[index].iov_base) + in, k);
      dst += k;
      in += k;
      n -= k;
    }
  }
};

enum class Step { kStored, kRefresh, kAllocate, kGone, kMediaError, kKernel };

#ifdef NVFS_DIRECT_TEST_HOOKS
// NVFS_DIRECT_TEST_STORE_DELAY_MS, read at every store.
void TestStoreDelay() {
  const char* ms = getenv("NVFS_DIRECT_TEST_STORE_DELAY_MS");
  if (ms == nullptr) return;
  const long v = strtol(ms, nullptr, 10);
  const timespec t{v / 1000, (v % 1000) * 1000000};
  nanosleep(&t, nullptr);
}
#endif

// Calls fn(ns offset, len) for the pieces of [offset, offset + n) in `s`;
// false, with *gap at the first byte that lies in a hole or in no extent
// (*hole says which).
template <class Fn>
bool ForEachBlockPiece(const Snapshot* s, uint64_t offset, uint64_t n, uint64_t* gap, Fn&& fn,
                       bool* hole = nullptr) {
  uint64_t pos = offset;
  while (pos < offset + n) {
    const Extent* e = s->Find(pos);
    if (e == nullptr || e->ns_offset == kDirectHole) {
      *gap = pos;
      if (hole != nullptr) *hole = e != nullptr || pos >= s->size;
      return false;
    }
    const uint64_t within = pos - e->file_offset;
    const uint64_t k = std::min(e->len - within, offset + n - pos);
    fn(e->ns_offset + within, k);
    pos += k;
  }
  return true;
}

// The inode goes on the writers' page's list of those whose times the
// daemon sets within kTimesMilliseconds, unless it is there already.
void NoteWritten(nvfs_direct* f, DirectWriterPage* page, uint64_t ino) {
  f->written.store(true, std::memory_order_relaxed);
  const int index = f->dirty_index.load(std::memory_order_relaxed);
  if (index >= 0 && page->dirty[index].load(std::memory_order_relaxed) == ino) return;
  for (uint32_t i = 0; i < kDirectWriterDirty; ++i) {
    uint64_t expected = 0;
    if (page->dirty[i].load(std::memory_order_relaxed) == ino) {
      f->dirty_index.store(static_cast<int>(i), std::memory_order_relaxed);
      return;
    }
    if (page->dirty[i].compare_exchange_strong(expected, ino, std::memory_order_acq_rel)) {
      f->dirty_index.store(static_cast<int>(i), std::memory_order_relaxed);
      return;
    }
  }
  // A full list: the times are set at the next fsync or close.
}

// One chunk of a write, in its own section: the bytes of [offset, offset +
// len) stored and flushed (kStored; *end_stored past s->size when it
// extends the file, and *seq the seq its runs were valid at). Anything
// else stored nothing that counts (the caller starts the chunk over, or
// writes it through the kernel, which writes every byte again).
Step StoreChunk(nvfs_direct* f, Source& src, uint64_t offset, size_t len, Snapshot** observed,
                uint64_t* refresh_at, bool* extends, uint64_t* seq_out) {
  ReadSection section;
  if (!section.Enter()) return Step::kKernel;
  Snapshot* s = f->snapshot.load(std::memory_order_acquire);
  *observed = s;
  *refresh_at = offset;
  if (s == nullptr) {
    return f->why.load(std::memory_order_acquire) == NVFS_DIRECT_ACTIVE ? Step::kRefresh
                                                                         : Step::kKernel;
  }
  Session* session = s->session;
  if (session->gone.load(std::memory_order_acquire)) return Step::kGone;
  if (!s->writable || !session->writable.load(std::memory_order_acquire) || session->Revoked()) {
    return Step::kRefresh;
  }
  DirectWriterPage* page = session->writer_page.load(std::memory_order_acquire);
  const uint64_t writable_size = session->writable_size.load(std::memory_order_acquire);
  uint64_t gap;
  bool inside = true;
  bool hole = false;
  if (!ForEachBlockPiece(
          s, offset, len, &gap,
          [&](uint64_t ns_off, uint64_t k) {
            if (ns_off + k > writable_size) inside = false;
          },
          &hole)) {
    // A hole, or past the blocks known past the end: blocks first. Runs
    // not known yet inside the file: asked for.
    *refresh_at = gap;
    return hole ? Step::kAllocate : Step::kRefresh;
  }
  if (!inside) return Step::kKernel;  // grown since the proof: mapped read-only there
  DirectWriterThread* slot = page == nullptr ? nullptr : ThreadSlot(session, page);
  if (slot == nullptr) return Step::kKernel;
  *extends = offset + len > s->size;
  *seq_out = s->seq;
  const auto* header = reinterpret_cast<const DirectTableHeader*>(session->table);
  const uint64_t revocations = session->Revocations();

  // Inside: from here to the even gen the daemon waits for this thread.
  // The store of the odd gen before the loads of the check: the daemon's
  // membarrier makes this thread fence when it scans (src/daemon/direct_writers.cpp), so a
  // compiler barrier is all it needs here; without the registration, a
  // fence of its own (which also waits for the last store's 4 KiB to drain,
  // about half the cost of an overwrite).
  const uint64_t gen = slot->gen.load(std::memory_order_relaxed);
  slot->gen.store(gen + 1, std::memory_order_relaxed);
  if (WritersAsymmetric()) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  tls.in_copy = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const bool poisoned_before = session->fault->poisoned.load(std::memory_order_acquire) != 0;
  bool ok = s->seq_word->load(std::memory_order_acquire) == s->seq && session->IdentityHolds() &&
            !session->Revoked() && session->writable.load(std::memory_order_relaxed) &&
            header->write_state.load(std::memory_order_relaxed) == 0;
  if (ok && poisoned_before) {
    bool touched = false;
    ForEachBlockPiece(s, offset, len, &gap, [&](uint64_t ns_off, uint64_t k) {
      if (FaultTouchesPoison(session->fault, ns_off, k)) touched = true;
    });
    if (touched) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
      tls.in_copy = 0;
      slot->gen.store(gen + 2, std::memory_order_release);
      return Step::kMediaError;
    }
  }
#ifdef NVFS_DIRECT_TEST_HOOKS
  // The tests' build (tests/mount/meson.build, never installed) holds a store
  // between its check and its bytes, to show what the grace period and
  // the mount's guard keep out.
  if (ok) TestStoreDelay();
#endif
  // An append at the end of the file's open append word: the word is the
  // commit (src/fs/direct.cpp says why that is safe). Its end is the file's
  // size, so every byte below it was stored by someone: none is exposed
  // that was not written.
  uint64_t word = 0;
  bool by_word = false;
  if (ok && *extends && s->append_tag != 0 && offset >= s->size) {
    word = s->append_word->load(std::memory_order_acquire);
    by_word = format::AppendTag(word) == s->append_tag && format::AppendEnd(word) == offset &&
              offset + len < format::kAppendEndMask &&
              reinterpret_cast<const std::byte*>(s->append_word) + sizeof(uint64_t) <=
                  session->ns_base + writable_size;
  }
  bool persisted = true;
  bool moved = false;
  if (ok) {
    auto* base = const_cast<std::byte*>(session->ns_base);
    ForEachBlockPiece(s, offset, len, &gap, [&](uint64_t ns_off, uint64_t k) {
      src.Take(base + ns_off, k);
      persisted &= Persist(session, base + ns_off, k);
    });
    // The bytes durable first, then the word that exposes them.
    if (by_word && persisted &&
        s->append_word->compare_exchange_strong(
            word, format::AppendWord(s->append_tag, offset + len), std::memory_order_acq_rel)) {
      moved = true;
      persisted = Persist(session, reinterpret_cast<std::byte*>(s->append_word), sizeof(uint64_t));
    }
  }
  // The stores went to the namespace only if its mapping was still there
  // all along: another thread's change of credentials waits for this store
  // before it maps zeros (WritersWaitOutOthers), so only a change made by
  // a signal handler that interrupted this very store can have put zeros
  // under it, and this thread's own program order shows it here. (A full
  // fence here would wait for the store's 4 KiB to drain: about a third of
  // an overwrite's cost.)
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const bool still = session->IdentityHolds() && !session->Revoked() &&
                     session->Revocations() == revocations;
  const bool poisoned = session->fault->poisoned.load(std::memory_order_acquire) != 0;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tls.in_copy = 0;
  slot->gen.store(gen + 2, std::memory_order_release);
  if (!ok) {
    if (!session->GuardedIdentityHolds() && !session->Revoked()) {
      session->gone.store(true, std::memory_order_release);
      return Step::kGone;
    }
    return Step::kRefresh;
  }
  if (!still) return Step::kKernel;  // written again, whole, by the kernel
  if (poisoned) {
    bool touched = false;
    ForEachBlockPiece(s, offset, len, &gap, [&](uint64_t ns_off, uint64_t k) {
      if (FaultTouchesPoison(session->fault, ns_off, k)) touched = true;
    });
    if (touched) return Step::kMediaError;
  }
  if (!persisted) return Step::kMediaError;
  if (moved) *extends = false;  // committed: the times within kTimesMilliseconds
  if (!*extends) NoteWritten(f, page, f->ino);
  return Step::kStored;
}

}  // namespace

void WritersChildAfterFork() {
  for (auto& p : pages) p.store(nullptr, std::memory_order_relaxed);
}

void WritersWaitOutOthers() {
  if (pages[0].load(std::memory_order_acquire) == nullptr) return;
  // The caller's marks before the loads below, here and (for writers that
  // rely on the barrier) in every thread that may be storing.
  if (!WritersAsymmetric() || syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  const uint64_t me = static_cast<uint64_t>(syscall(SYS_gettid));
  for (auto& p : pages) {
    DirectWriterPage* page = p.load(std::memory_order_acquire);
    if (page == nullptr) break;
    for (DirectWriterThread& t : page->threads) {
      const uint64_t owner = t.owner.load(std::memory_order_acquire);
      if (owner == 0 || owner == me) continue;
      const uint64_t gen = t.gen.load(std::memory_order_acquire);
      if ((gen & 1) == 0) continue;
      while (t.gen.load(std::memory_order_acquire) == gen) sched_yield();
    }
  }
}

namespace {

ssize_t WriteKernel(const nvfs_direct* f, const iovec* iov, int iovcnt, off_t offset, int flags) {
  if (flags != 0) return libc::Get(&libc::Table::pwritev2)(f->fd, iov, iovcnt, offset, flags);
  if (iovcnt == 1) {
    return libc::Get(&libc::Table::pwrite)(f->fd, iov[0].iov_base, iov[0].iov_len, offset);
  }
  return libc::Get(&libc::Table::pwritev)(f->fd, iov, iovcnt, offset);
}

// The rest of a write from `done` bytes on, through the kernel; returns
// the whole count as pwritev would.
ssize_t RestThroughKernel(const nvfs_direct* f, const iovec* iov, int iovcnt, off_t offset,
                          int flags, size_t done, size_t total) {
  if (done == 0) return WriteKernel(f, iov, iovcnt, offset, flags);
  int n = 0;
  iovec* rest = IovFrom(iov, iovcnt, done, total - done, &n);
  if (rest == nullptr) return static_cast<ssize_t>(done);
  const ssize_t r = WriteKernel(f, rest, n, offset + static_cast<off_t>(done), flags);
  delete[] rest;
  return r < 0 ? static_cast<ssize_t>(done) : static_cast<ssize_t>(done) + r;
}

enum class Asked { kOk, kKernel, kFailed };  // kFailed: errno says why

// Publishes the runs of `reply` for the handle.
bool Publish(nvfs_direct* f, Session* session, const MapReply& reply, Snapshot* observed) {
  Snapshot* fresh = BuildSnapshot(session, reply, observed);
  if (fresh == nullptr) return false;
  Snapshot* old = f->snapshot.exchange(fresh, std::memory_order_acq_rel);
  if (old != nullptr) Retire(old, FreeSnapshot);
  return true;
}

// A write request naming the handle's file by inode. The daemon names a
// file only for the connection that passed its descriptor (a new
// connection since, after a change of credentials or a reconnect, has not):
// its EBADF asks for the descriptor, and the request goes again with it.
// REQUIRES: session->mu held.
int CallNamedLocked(Session* session, Request req, nvfs_direct* f, MapReply* reply) {
  const int status = session->CallLocked(req, -1, reply);
  if (status != EBADF || f->fd < 0) return status;
  req.ino = 0;
  return session->CallLocked(req, f->fd, reply);
}

// A request for the handle's file with the session's lock held: kOpMap for
// writing, kOpAllocate or kOpCommit, its runs published. kFailed with
// errno for an error the write returns (ENOSPC, EFBIG, EROFS, EDQUOT,
// EIO); kKernel for everything else.
Asked Ask(nvfs_direct* f, const Request& req, Snapshot* observed) {
  Session* session = f->session;
  if (session == nullptr) return Asked::kKernel;
  MapReply reply;
  std::lock_guard lock(session->mu);
  if (req.op == kOpMap && f->snapshot.load(std::memory_order_acquire) != observed) {
    return Asked::kOk;  // another thread refreshed it
  }
  // A write request names the file by its inode once it is known (no
  // descriptor to pass: protocol.hpp); a map passes the descriptor.
  Request named = req;
  int fd = f->fd;
  if (req.op != kOpMap && f->ino != 0) {
    named.ino = f->ino;
    fd = -1;
  }
  const int status = fd >= 0 ? session->CallLocked(named, fd, &reply)
                              : CallNamedLocked(session, named, f, &reply);
  if (status == Session::kMapOk) {
    if (f->ino != 0 && reply.ino != f->ino) {
      f->write_why.store(NVFS_DIRECT_NOT_NVFS, std::memory_order_release);
      return Asked::kKernel;
    }
    f->ino = reply.ino;
    if ((reply.flags & kMapWritable) == 0) {
      f->write_why.store(NVFS_DIRECT_PRIVILEGED, std::memory_order_release);
    }
    if (!Publish(f, session, reply, observed)) return Asked::kKernel;
    return (reply.flags & kMapWritable) != 0 ? Asked::kOk : Asked::kKernel;
  }
  if (status == Session::kMapNoWrites) {
    // A refusal for this time only (a change of credentials under way, a
    // reconnect that failed) writes this write through the kernel; the
    // session's own answer (it may not write the namespace, the mount
    // serves no direct writes) holds for the handle.
    const int why = session->write_why();
    if (why != NVFS_DIRECT_ACTIVE && why != NVFS_DIRECT_REFUSED && why != NVFS_DIRECT_NO_MEMORY) {
      f->write_why.store(why, std::memory_order_release);
    }
    return Asked::kKernel;
  }
  if (status == Session::kMapGone || status == Session::kMapEnded) {
    f->write_why.store(NVFS_DIRECT_GONE, std::memory_order_release);
    return Asked::kKernel;
  }
  if (status == EAGAIN) {
    errno = EAGAIN;
    return Asked::kFailed;
  }
  if (req.op != kOpMap && (status == ENOSPC || status == EFBIG || status == EDQUOT)) {
    errno = status;
    return Asked::kFailed;
  }
  // EROFS, EPERM, EBADF and the rest: the kernel's write gives the answer.
  return Asked::kKernel;
}

// Blocks kept past the end after a write that ends at `end`: twice the
// write, or a quarter of the file, between kMinReserve and kMaxReserve (a
// file that grows by appends asks for blocks ever more rarely).
uint64_t Reserve(uint64_t len, uint64_t end) {
  return std::clamp<uint64_t>(std::max(2 * len, end / 4), kMinReserve, kMaxReserve);
}

}  // namespace

ssize_t Write(nvfs_direct* f, const iovec* iov, int iovcnt, off_t offset, int flags) {
  const int kernel_flags = flags;
  if (offset < 0 || iovcnt <= 0 || iovcnt > IOV_MAX ||
      !DirectWriteFlags(flags) ||
      f->why.load(std::memory_order_acquire) != NVFS_DIRECT_ACTIVE ||
      f->write_why.load(std::memory_order_acquire) != NVFS_DIRECT_ACTIVE) {
    return WriteKernel(f, iov, iovcnt, offset, kernel_flags);
  }
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len > SSIZE_MAX - total) return WriteKernel(f, iov, iovcnt, offset, kernel_flags);
    total += iov[i].iov_len;
  }
  total = std::min(total, kMaxRw);
  if (total == 0) return WriteKernel(f, iov, iovcnt, offset, kernel_flags);
  // A file may not grow past RLIMIT_FSIZE: the kernel says so (SIGXFSZ,
  // EFBIG). Asked for every write past the end this handle last wrote
  // (appends into a reserve, or by word, ask the daemon nothing).
  bool checked_limit = false;
  if (static_cast<uint64_t>(offset) + total > f->written_end.load(std::memory_order_relaxed)) {
    rlimit lim{};
    if (getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
        static_cast<uint64_t>(offset) + total > lim.rlim_cur) {
      return WriteKernel(f, iov, iovcnt, offset, kernel_flags);
    }
    checked_limit = true;
  }
  Source src{iov, iovcnt};
  size_t done = 0;
  int refreshes = 0;
  while (done < total) {
    const size_t len = std::min(kChunk, total - done);
    const uint64_t at = static_cast<uint64_t>(offset) + done;
    Source chunk = src;
    Snapshot* observed = nullptr;
    uint64_t refresh_at = 0, seq = 0;
    bool extends = false;
    const Step step = StoreChunk(f, chunk, at, len, &observed, &refresh_at, &extends, &seq);
    if (step == Step::kStored && extends) {
      // The bytes are durable: now the size that exposes them.
      const Request req{kMagic, kVersion, kOpCommit, 0, at, at + len, seq,
                        at + len + Reserve(len, at + len)};
      const Asked a = Ask(f, req, observed);
      if (a == Asked::kFailed && errno == EAGAIN && ++refreshes <= kMaxRefreshes) {
        // The file changed under the store: those blocks may not be its
        // own any more. Stored again, into fresh runs.
        (void)Ask(f, Request{kMagic, kVersion, kOpMap, kMapForWrite, at, 0, 0, 0},
                  f->snapshot.load(std::memory_order_acquire));
        continue;
      }
      if (a != Asked::kOk) {
        if (a == Asked::kFailed && errno != EAGAIN) {
          if (done > 0) return static_cast<ssize_t>(done);
          return -1;
        }
        break;  // the rest (this chunk included) through the kernel
      }
      // The commit set the times; the kernel forgets its cached ones within
      // a second, or at this descriptor's fsync or close (Settle).
      f->written.store(true, std::memory_order_relaxed);
    }
    if (step == Step::kStored) {
      src = chunk;
      done += len;
      refreshes = 0;
      continue;
    }
    if (step == Step::kMediaError) {
      if (done > 0) return static_cast<ssize_t>(done);
      errno = EIO;
      return -1;
    }
    if (step == Step::kGone || step == Step::kKernel || ++refreshes > kMaxRefreshes) break;
    Request req{kMagic, kVersion, kOpMap, kMapForWrite, refresh_at, 0, 0, 0};
    if (step == Step::kAllocate) {
      // Past the end or into a hole: blocks first. A file may not grow
      // past RLIMIT_FSIZE: the kernel says so (SIGXFSZ, EFBIG).
      if (!checked_limit) {
        rlimit lim{};
        if (getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
            static_cast<uint64_t>(offset) + total > lim.rlim_cur) {
          break;
        }
        checked_limit = true;
      }
      const uint64_t from = std::min<uint64_t>(refresh_at, at);
      req = Request{kMagic, kVersion, kOpAllocate, 0, from, at + len - from, 0,
                    at + len + Reserve(len, at + len)};
    }
    const Asked a = Ask(f, req, observed);
    if (a == Asked::kFailed) {
      if (done > 0) return static_cast<ssize_t>(done);
      return -1;
    }
    if (a != Asked::kOk) break;
    if (step == Step::kAllocate) f->reserved.store(true, std::memory_order_relaxed);
  }
  if (done > 0) {
    const uint64_t end = static_cast<uint64_t>(offset) + done;
    uint64_t known = f->written_end.load(std::memory_order_relaxed);
    while (known < end &&
           !f->written_end.compare_exchange_weak(known, end, std::memory_order_relaxed)) {
    }
  }
  if (done == total) return static_cast<ssize_t>(done);
  return RestThroughKernel(f, iov, iovcnt, offset, kernel_flags, done, total);
}

void Settle(nvfs_direct* f, bool closing) {
  Session* session = f->session;
  if (session == nullptr || f->ino == 0) return;
  const bool written = f->written.exchange(false, std::memory_order_acq_rel);
  const bool reserved = closing && f->reserved.exchange(false, std::memory_order_acq_rel);
  if (!written && !reserved) return;
  MapReply reply;
  std::lock_guard lock(session->mu);
  if (written) {
    // The times (start == end), committed before this returns.
    (void)CallNamedLocked(session, Request{kMagic, kVersion, kOpCommit, 0, 0, 0, 0, 0, f->ino, 0}, f,
                          &reply);
  }
  if (reserved) {
    (void)CallNamedLocked(session, Request{kMagic, kVersion, kOpTrim, 0, 0, 0, 0, 0, f->ino, 0}, f,
                          &reply);
  }
}

}  // namespace nvfs::direct
