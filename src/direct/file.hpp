// An attached file (the nvfs_direct handle) and the read path over it.
//
// What a handle knows of its file's runs is one immutable Snapshot: the
// slot, the seq the runs are valid for, the size at that seq, and extents
// of the file sorted by offset. A refresh (the slot's seq moved, or a read
// past the known extents) builds a new snapshot and publishes it with one
// atomic exchange; the old one is retired (epoch.hpp). Readers never lock.
//
// A read copies first and checks after (doc/integrity.md section 10): the
// slot's seq loaded with acquire must equal the snapshot's before the copy,
// and after it (behind an acquire fence) the seq must still equal it and
// the namespace's identity in the process's own mapping (mount_count and
// uuid) must be unchanged. The daemon moves the seq before any block the
// file gave up can be reused, so a copy that may have seen another file's
// bytes always fails the check and is thrown away.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "direct/epoch.hpp"
#include "direct/session.hpp"
#include "nvfs/direct.h"
#include "nvfs/direct_abi.hpp"
#include "nvfs/format.hpp"
#include "util/races.hpp"

namespace nvfs::direct {

// `len` bytes of the file at `file_offset` lie at `ns_offset` of the
// namespace (kDirectHole: zeros).
struct Extent {
  uint64_t file_offset;
  uint64_t len;
  uint64_t ns_offset;
};

struct Snapshot {
  Session* session;
  const std::byte* ns_base;        // session->ns_base
  const std::atomic<uint64_t>* seq_word;  // the slot's seq
  uint64_t seq;   // even: the state the extents and size are valid for
  uint64_t size;  // the file's size at seq
  uint32_t slot;
  // The daemon said the file may be written directly at seq (kMapWritable):
  // its extents past `size` are blocks it keeps there (a reserve).
  bool writable;
  // The file's append word in the namespace mapping (MapReply::append_at;
  // null when not given), and the tag it had open at seq for a writable
  // snapshot (0: none): a write at its end appends by moving it.
  std::atomic<uint64_t>* append_word;
  uint64_t append_tag;
  uint32_t count;  // extents, sorted, not overlapping
  Extent* extents() { return reinterpret_cast<Extent*>(this + 1); }
  const Extent* extents() const { return reinterpret_cast<const Extent*>(this + 1); }

  // The extent holding byte `offset`, or null when it is not known.
  [[gnu::always_inline]] const Extent* Find(uint64_t offset) const {
    const Extent* e = extents();
    uint32_t lo = 0, hi = count;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      if (e[mid].file_offset <= offset) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo == 0) return nullptr;
    const Extent* found = &e[lo - 1];
    return offset - found->file_offset < found->len ? found : nullptr;
  }
};
static_assert(sizeof(Snapshot) % alignof(Extent) == 0);

}  // namespace nvfs::direct

// The handle of include/nvfs/direct.h.
struct nvfs_direct {
  const int fd;
  // Opened for reading (not O_WRONLY): a write-only descriptor is attached
  // for its writes alone, and its reads are the kernel's (EBADF).
  const bool readable;
  // NVFS_DIRECT_ACTIVE while attached to a session (reads are direct if
  // `readable`), else why not.
  std::atomic<int> why;
  // Null while the file is not read directly, or before its first runs.
  std::atomic<nvfs::direct::Snapshot*> snapshot{nullptr};
  nvfs::direct::Session* session = nullptr;  // referenced while the handle lives
  // The inode the first answer named (0 before it): a later answer for
  // another inode means the descriptor number now names another file (it
  // was closed and reused under a racing read), which the kernel serves.
  uint64_t ino = 0;  // protected by session->mu
  // The owner's reference (dropped one epoch after detach or the close of a
  // preloaded descriptor), and one per reader in the slow path, which leaves
  // its read section to ask the daemon.
  std::atomic<uint32_t> refs{1};
  // The preload's list of handles whose descriptor was closed from a signal
  // handler that interrupted the library (preload.cpp); retired later.
  nvfs_direct* pending_next = nullptr;

  // Writes (write.cpp): NVFS_DIRECT_ACTIVE while pwrite may store
  // directly (as far as is known before the first write), else why the
  // kernel writes.
  std::atomic<int> write_why;
  // Stored into since its times were last set by a request (fsync, close).
  std::atomic<bool> written{false};
  // Blocks were kept past the end for it: given back when it is closed.
  std::atomic<bool> reserved{false};
  // The end of the furthest write of this handle: a write past it asks
  // RLIMIT_FSIZE first (write.cpp).
  std::atomic<uint64_t> written_end{0};
  // NVFS_DIRECT_ACTIVE if its last nvfs_direct_mmap was direct, else why not.
  std::atomic<int> map_why{NVFS_DIRECT_ACTIVE};
  // It mapped its file directly: the file stays registered with the
  // daemon while it lives (map.hpp, MapsRelease). Set under the maps' lock.
  std::atomic<bool> map_held{false};
  // Its entry in the writers' page's list of inodes to set the times of,
  // while it holds the inode (-1: none).
  std::atomic<int> dirty_index{-1};

  nvfs_direct(int f, bool r, int w, int ww) : fd(f), readable(r), why(w), write_why(ww) {}
  // What nvfs_direct_why says of its reads.
  int read_why() const {
    const int w = why.load(std::memory_order_acquire);
    return w == NVFS_DIRECT_ACTIVE && !readable ? NVFS_DIRECT_NOT_READABLE : w;
  }
};

namespace nvfs::direct {

// Reads at most this much in one section: a longer read is done in chunks,
// each copied and checked on its own (as FUSE splits a read into requests
// of max_read), so a refresh never throws away more than a chunk.
inline constexpr size_t kChunk = size_t{1} << 20;

// pread(2) returns at most this many bytes (MAX_RW_COUNT).
inline constexpr size_t kMaxRw = 0x7ffff000;

inline constexpr ssize_t kSlow = -1;

// A copy is good only while the slot's seq is the snapshot's: the check
// that makes a direct read safe (doc/integrity.md section 10). A build with
// NVFS_DIRECT_NO_RECHECK, a library the tests build to show that the race
// test fails without it (tests/mount/meson.build; never installed), skips it.
[[gnu::always_inline]] inline bool SeqIs(uint64_t now, uint64_t want) {
#ifdef NVFS_DIRECT_NO_RECHECK
  (void)now;
  (void)want;
  return true;
#else
  return now == want;
#endif
}

// The read in one piece: one extent covers [offset, offset + count) (or it
// is at or past the end of the file), no page of the mapping is poisoned,
// and the copy passed the check. kSlow: anything else, with `buf` possibly
// written; the slow path starts over.
// REQUIRES: inside a read section; count <= kChunk.
// True if the file's append word says it is longer than `s` knows.
inline bool AppendedPast(const Snapshot* s) {
  if (s->append_word == nullptr) return false;
  return format::AppendEnd(s->append_word->load(std::memory_order_acquire)) > s->size;
}

[[gnu::always_inline]] inline ssize_t ReadFast(const Snapshot* s, void* buf, size_t count,
                                               uint64_t offset) {
  const Session* session = s->session;
  // The counter, then no revocation under way: a new proof moves the
  // counter before it maps the namespace again and clears the mark after,
  // so zeros met by the copy show in one or the other afterwards.
  const uint64_t revocations = session->Revocations();
  const uint64_t seq = s->seq_word->load(std::memory_order_acquire);
  if (!SeqIs(seq, s->seq) || session->fault->poisoned.load(std::memory_order_relaxed) != 0 ||
      session->gone.load(std::memory_order_relaxed) || session->Revoked()) {
    return kSlow;
  }
  size_t n = 0;
  const Extent* e = nullptr;
  if (offset < s->size) {
    n = s->size - offset < count ? static_cast<size_t>(s->size - offset) : count;
    e = s->Find(offset);
    if (e == nullptr || n > e->len - (offset - e->file_offset)) return kSlow;
  }
  // Cut short by the size: an append by word may have moved it.
  if (n < count && AppendedPast(s)) return kSlow;
  // In the fault handler's reach from the copy to the identity check (a
  // lost superblock page reads as zeros: the identity no longer holds).
  tls.in_copy = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if (e == nullptr) {
    // At or past the end: nothing to copy.
  } else if (e->ns_offset == kDirectHole) {
    std::memset(buf, 0, n);
  } else {
    CopyRacing(buf, s->ns_base + e->ns_offset + (offset - e->file_offset), n);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  // The revocation too: zeros mapped under the copy (marked before they
  // come), or zeros and the namespace mapped again by a new proof (which
  // moves the counter first), can leave the seq and the identity words as
  // they were (a table slot whose seq is 0 reads as zeros do).
  const bool same = SeqIs(s->seq_word->load(std::memory_order_relaxed), seq) &&
                    session->IdentityHolds() && session->Revocations() == revocations &&
                    !session->Revoked();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tls.in_copy = 0;
  if (!same || session->fault->poisoned.load(std::memory_order_relaxed) != 0) return kSlow;
  return static_cast<ssize_t>(n);
}

// Everything else: reads across extents, iovecs, refreshes of runs, a
// session gone, media errors, and the kernel when all else fails (and for
// handles not read directly). Returns as preadv(2).
// REQUIRES: not inside a read section; the handle stays alive (the caller
// holds a reference or owns it).
ssize_t ReadSlow(nvfs_direct* f, const struct iovec* iov, int iovcnt, off_t offset);

// The iovecs from `skip` bytes on, at most `max` bytes of them (to hand
// the rest of a read or a write to the kernel); null without memory.
iovec* IovFrom(const iovec* iov, int iovcnt, size_t skip, size_t max, int* count);

// Through the kernel, on the handle's descriptor.
ssize_t ReadKernel(const nvfs_direct* f, const struct iovec* iov, int iovcnt, off_t offset);

#ifndef RWF_DSYNC
#define RWF_DSYNC 0x00000002
#endif
#ifndef RWF_SYNC
#define RWF_SYNC 0x00000004
#endif
// pwritev2's flags a direct write serves: 0, RWF_DSYNC and RWF_SYNC (every
// direct write is durable when it returns); the rest are the kernel's.
inline bool DirectWriteFlags(int flags) { return (flags & ~(RWF_DSYNC | RWF_SYNC)) == 0; }

// A pwritev(2) (flags: pwritev2's, of which only DirectWriteFlags' are
// served directly)
// on the handle: stored from the process's own mapping where the file may
// be written directly, through the kernel otherwise (write.cpp,
// doc/integrity.md section 11). REQUIRES: as ReadSlow.
ssize_t Write(nvfs_direct* f, const struct iovec* iov, int iovcnt, off_t offset, int flags);
// Before the handle's descriptor is closed, or fsync'ed: the times of a
// file written directly are set (one request), and a reserve kept for it
// past the end is given back (close only).
void Settle(nvfs_direct* f, bool closing);

// The snapshot of a reply, keeping what `old` (may be null) knew of the
// same state of the file; null without memory. (read.cpp)
Snapshot* BuildSnapshot(Session* session, const MapReply& reply, const Snapshot* old);
// Frees a snapshot no reader can hold any more (a Retire() callback).
void FreeSnapshot(void* snapshot);

// Attaches to `fd`, asking first for the runs at `offset`. Null only
// without memory.
nvfs_direct* Attach(int fd, uint64_t offset);

// Drops the owner's reference one epoch later (after detach, or when a
// preloaded descriptor is closed).
void RetireHandle(nvfs_direct* f);

// A reference for the slow path. REQUIRES: inside a read section that
// loaded `f`, or the owner.
inline void HandleRef(nvfs_direct* f) { f->refs.fetch_add(1, std::memory_order_relaxed); }
void HandleUnref(nvfs_direct* f);

// Records `entry` of the thread's calls into the library: a call made from
// a signal handler that interrupted the library on this thread (depth > 0)
// goes straight to the kernel (no lock, no section).
class DepthGuard {
 public:
  DepthGuard() { ++tls.depth; }
  ~DepthGuard() { --tls.depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

}  // namespace nvfs::direct
