// The read path's slow half (file.hpp): snapshots of runs and their
// refresh, reads across extents and iovecs, and the kernel behind them.
#include <errno.h>
#include <limits.h>

#include <algorithm>
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

// Refreshes of runs one read may make before it goes to the kernel (a file
// changing under it faster than it can be asked about).
constexpr int kMaxRefreshes = 8;

// Extents a handle keeps of one state of its file: windows asked for at
// different offsets are merged up to this, and the older ones dropped after.
constexpr uint32_t kMaxExtents = 4096;

// A refresh answered for another inode than the handle's.
constexpr int kMapOtherFile = -100;

Snapshot* NewSnapshot(Session* session, const MapReply& r, uint32_t count) {
  void* mem = ::operator new(sizeof(Snapshot) + size_t{count} * sizeof(Extent), std::nothrow);
  if (mem == nullptr) return nullptr;
  auto* s = new (mem) Snapshot;
  s->session = session;
  s->ns_base = session->ns_base;
  s->seq_word = &session->table[r.slot].seq;
  s->seq = r.seq;
  s->size = r.size;
  s->slot = r.slot;
  s->writable = (r.flags & kMapWritable) != 0;
  s->append_word = nullptr;
  s->append_tag = 0;
  if (r.append_at != 0 && r.append_at % sizeof(uint64_t) == 0 &&
      r.append_at <= session->ns_size - sizeof(uint64_t)) {
    s->append_word = reinterpret_cast<std::atomic<uint64_t>*>(
        const_cast<std::byte*>(session->ns_base + r.append_at));
    if (s->writable) s->append_tag = format::AppendTag(r.append_word);
  }
  s->count = count;
  return s;
}

// The file is read through the kernel from now on.
void MakeGone(nvfs_direct* f, int why) {
  f->why.store(why, std::memory_order_release);
  Snapshot* old = f->snapshot.exchange(nullptr, std::memory_order_acq_rel);
  if (old != nullptr) Retire(old, FreeSnapshot);
}

// Asks for the runs at `offset` and publishes them, unless another thread
// already replaced `observed`. False: this read goes to the kernel.
bool Refresh(nvfs_direct* f, Snapshot* observed, uint64_t offset) {
  Session* session = f->session;
  if (session == nullptr) return false;
  MapReply reply;
  Snapshot* old;
  int status;
  {
    std::lock_guard lock(session->mu);
    if (f->snapshot.load(std::memory_order_acquire) != observed) return true;
    if (f->why.load(std::memory_order_acquire) != NVFS_DIRECT_ACTIVE) return false;
    status = session->MapLocked(f->fd, offset, &reply);
    if (status == Session::kMapOk && f->ino != 0 && reply.ino != f->ino) status = kMapOtherFile;
    if (status == Session::kMapOk) {
      f->ino = reply.ino;
      Snapshot* fresh = BuildSnapshot(session, reply, observed);
      if (fresh == nullptr) return false;
      old = f->snapshot.exchange(fresh, std::memory_order_acq_rel);
    }
  }
  if (status == Session::kMapGone || status == kMapOtherFile || status == Session::kMapEnded) {
    MakeGone(f, status == kMapOtherFile     ? NVFS_DIRECT_NOT_NVFS
                : status == Session::kMapEnded ? NVFS_DIRECT_NO_NAMESPACE
                                               : NVFS_DIRECT_GONE);
    return false;
  }
  if (status != Session::kMapOk) return false;
  if (old != nullptr) Retire(old, FreeSnapshot);
  return true;
}

// Where a read writes: a position in an iovec array.
struct Cursor {
  const iovec* iov;
  int iovcnt;
  int index = 0;
  size_t in = 0;  // bytes of iov[index] already written

  // Copies `n` bytes from `src`, or zeros when src is null.
  void Put(const std::byte* src, size_t n) {
    while (n > 0) {
      while (iov[index].iov_len == in) {
        ++index;
        in = 0;
      }
      const size_t k = std::min(n, iov[index].iov_len - in);
      char* dst = static_cast<char*>(iov[index].iov_base) + in;
      if (src == nullptr) {
        std::memset(dst, 0, k);
      } else {
        CopyRacing(dst, src, k);
        src += k;
      }
      in += k;
      n -= k;
    }
  }
};

enum class Step { kCopied, kRefresh, kGone, kMediaError, kKernel };

// Calls fn(extent piece, ns offset or kDirectHole, len) for the pieces of
// [offset, offset + n); false, with *gap at the first byte no extent covers.
template <class Fn>
bool ForEachPiece(const Snapshot* s, uint64_t offset, uint64_t n, uint64_t* gap, Fn&& fn) {
  uint64_t pos = offset;
  const Extent* e = nullptr;
  const Extent* const last = s->extents() + s->count;
  while (pos < offset + n) {
    if (e == nullptr || e == last || pos - e->file_offset >= e->len) {
      e = s->Find(pos);
      if (e == nullptr) {
        *gap = pos;
        return false;
      }
    }
    const uint64_t within = pos - e->file_offset;
    const uint64_t k = std::min(e->len - within, offset + n - pos);
    fn(e->ns_offset == kDirectHole ? kDirectHole : e->ns_offset + within, k);
    pos += k;
    ++e;
  }
  return true;
}

bool TouchesPoison(const Snapshot* s, uint64_t offset, uint64_t n) {
  bool touched = false;
  uint64_t gap;
  ForEachPiece(s, offset, n, &gap, [&](uint64_t ns_off, uint64_t len) {
    if (ns_off != kDirectHole && FaultTouchesPoison(s->session->fault, ns_off, len)) touched = true;
  });
  return touched;
}

// One chunk of a read, in its own section: *copied bytes went to `dst`
// (fewer than `len` at the end of the file) when kCopied; `dst` may have
// been written and moved otherwise (the caller passes a copy).
Step CopyChunk(nvfs_direct* f, Cursor& dst, uint64_t offset, size_t len, size_t* copied,
               Snapshot** observed, uint64_t* refresh_at) {
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
  // Zeros since a change of credentials or a fork: the refresh proves the
  // session again (or ends it). The counter first, then the mark (file.hpp,
  // ReadFast, says why).
  const uint64_t revocations = session->Revocations();
  if (session->Revoked()) return Step::kRefresh;
  const uint64_t seq = s->seq_word->load(std::memory_order_acquire);
  if (!SeqIs(seq, s->seq)) return Step::kRefresh;
  // Cut short by the size: an append by word may have moved it. The word
  // opened when these runs were given (its tag): its end is the size, and
  // the runs past the size hold the bytes below it (the seq check after
  // the copy says whether they still do). Another: the runs are asked for
  // again (the daemon folds the word first).
  uint64_t size = s->size;
  if (offset + len > size && s->append_word != nullptr) {
    const uint64_t word = s->append_word->load(std::memory_order_acquire);
    if (format::AppendEnd(word) > size) {
      if (s->append_tag == 0 || format::AppendTag(word) != s->append_tag) return Step::kRefresh;
      size = format::AppendEnd(word);
    }
  }
  const uint64_t n = offset >= size ? 0 : std::min<uint64_t>(len, size - offset);
  uint64_t gap;
  if (!ForEachPiece(s, offset, n, &gap, [](uint64_t, uint64_t) {})) {
    *refresh_at = gap;
    return Step::kRefresh;
  }
  const bool poisoned_before = session->fault->poisoned.load(std::memory_order_acquire) != 0;
  const bool skip_copy = poisoned_before && TouchesPoison(s, offset, n);
  // In the fault handler's reach from the copy to the identity check.
  tls.in_copy = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if (!skip_copy) {
    // Into the caller's cursor (a copy of it), which it keeps only when
    // this returns kCopied.
    ForEachPiece(s, offset, n, &gap, [&](uint64_t ns_off, uint64_t k) {
      dst.Put(ns_off == kDirectHole ? nullptr : s->ns_base + ns_off, k);
    });
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  const bool same_seq = SeqIs(s->seq_word->load(std::memory_order_relaxed), seq);
  const bool same_mount = session->IdentityHolds();
  // Zeros mapped under the copy and the namespace mapped again by a new
  // proof before the checks above would pass them: the counter moved.
  const bool same_mapping = session->Revocations() == revocations && !session->Revoked();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tls.in_copy = 0;
  if (!same_seq || (same_mount && !same_mapping)) return Step::kRefresh;
  if (!same_mount) {
    // Zeros came under the copy (and maybe the mapping is back already).
    if (session->Revoked() || session->Revocations() != revocations) return Step::kRefresh;
    session->gone.store(true, std::memory_order_release);
    return Step::kGone;
  }
  if (session->fault->poisoned.load(std::memory_order_acquire) != 0 && TouchesPoison(s, offset, n)) {
    return Step::kMediaError;
  }
  *copied = static_cast<size_t>(n);
  return Step::kCopied;
}


}  // namespace

iovec* IovFrom(const iovec* iov, int iovcnt, size_t skip, size_t max, int* count) {
  auto* out = new (std::nothrow) iovec[static_cast<size_t>(iovcnt)];
  if (out == nullptr) return nullptr;
  int n = 0;
  for (int i = 0; i < iovcnt && max > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    const size_t k = std::min(iov[i].iov_len - skip, max);
    out[n++] = {static_cast<char*>(iov[i].iov_base) + skip, k};
    max -= k;
    skip = 0;
  }
  *count = n;
  return out;
}

void FreeSnapshot(void* p) {
  auto* s = static_cast<Snapshot*>(p);
  s->~Snapshot();
  ::operator delete(s);
}

// The snapshot of the reply, keeping what `old` knew of the same state of
// the file outside the reply's window (clipped to it), as long as all of it
// fits in kMaxExtents; the window alone otherwise.
Snapshot* BuildSnapshot(Session* session, const MapReply& r, const Snapshot* old) {
  uint64_t end = r.start;
  for (uint32_t i = 0; i < r.run_count; ++i) end += r.runs[i].len;
  const bool same_state = old != nullptr && old->session == session && old->seq == r.seq &&
                          old->slot == r.slot && old->size == r.size &&
                          old->writable == ((r.flags & kMapWritable) != 0);
  uint32_t before = 0, after = 0;  // old extents (pieces of) before and after the window
  if (same_state) {
    for (uint32_t i = 0; i < old->count; ++i) {
      const Extent& e = old->extents()[i];
      if (e.file_offset < r.start) ++before;
      if (e.file_offset + e.len > end) ++after;
    }
    if (before + after + r.run_count > kMaxExtents) before = after = 0;
  }
  Snapshot* s = NewSnapshot(session, r, before + r.run_count + after);
  if (s == nullptr) return nullptr;
  Extent* out = s->extents();
  uint32_t n = 0;
  for (uint32_t i = 0; before != 0 && n < before; ++i) {
    Extent piece = old->extents()[i];
    if (piece.file_offset >= r.start) break;
    piece.len = std::min(piece.len, r.start - piece.file_offset);
    out[n++] = piece;
  }
  uint64_t file_off = r.start;
  for (uint32_t i = 0; i < r.run_count; ++i) {
    out[n++] = {file_off, r.runs[i].len, r.runs[i].offset};
    file_off += r.runs[i].len;
  }
  for (uint32_t i = 0; after != 0 && i < old->count; ++i) {
    Extent piece = old->extents()[i];
    if (piece.file_offset + piece.len <= end) continue;
    if (piece.file_offset < end) {
      const uint64_t cut = end - piece.file_offset;
      piece.file_offset = end;
      piece.len -= cut;
      if (piece.ns_offset != kDirectHole) piece.ns_offset += cut;
    }
    out[n++] = piece;
  }
  s->count = n;
  return s;
}

ssize_t ReadKernel(const nvfs_direct* f, const struct iovec* iov, int iovcnt, off_t offset) {
  if (iovcnt == 1) return libc::Get(&libc::Table::pread)(f->fd, iov[0].iov_base, iov[0].iov_len, offset);
  return libc::Get(&libc::Table::preadv)(f->fd, iov, iovcnt, offset);
}

ssize_t ReadSlow(nvfs_direct* f, const struct iovec* iov, int iovcnt, off_t offset) {
  if (offset < 0 || iovcnt <= 0 || iovcnt > IOV_MAX ||
      f->why.load(std::memory_order_acquire) != NVFS_DIRECT_ACTIVE) {
    return ReadKernel(f, iov, iovcnt, offset);
  }
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len > SSIZE_MAX - total) return ReadKernel(f, iov, iovcnt, offset);  // EINVAL
    total += iov[i].iov_len;
  }
  total = std::min(total, kMaxRw);
  Cursor dst{iov, iovcnt};
  size_t done = 0;
  int refreshes = 0;
  while (done < total) {
    const size_t len = std::min(kChunk, total - done);
    size_t copied = 0;
    Snapshot* observed = nullptr;
    uint64_t at = 0;
    Cursor chunk = dst;
    const Step step = CopyChunk(f, chunk, static_cast<uint64_t>(offset) + done, len, &copied,
                                &observed, &at);
    if (step == Step::kCopied) {
      dst = chunk;
      done += copied;
      refreshes = 0;
      if (copied < len) return static_cast<ssize_t>(done);  // the end of the file
      continue;
    }
    if (step == Step::kMediaError) {
      if (done > 0) return static_cast<ssize_t>(done);
      errno = EIO;
      return -1;
    }
    if (step == Step::kGone) MakeGone(f, NVFS_DIRECT_GONE);
    if (step == Step::kRefresh && ++refreshes <= kMaxRefreshes && Refresh(f, observed, at)) continue;
    break;  // the rest through the kernel
  }
  if (done == total) return static_cast<ssize_t>(done);
  if (done == 0) return ReadKernel(f, iov, iovcnt, offset);
  int count = 0;
  // Only what is left of `total` (the cap) is asked for.
  iovec* rest = IovFrom(iov, iovcnt, done, total - done, &count);
  if (rest == nullptr) return static_cast<ssize_t>(done);
  const ssize_t r = ReadKernel(f, rest, count, offset + static_cast<off_t>(done));
  delete[] rest;
  return r < 0 ? static_cast<ssize_t>(done) : static_cast<ssize_t>(done) + r;
}

}  // namespace nvfs::direct
