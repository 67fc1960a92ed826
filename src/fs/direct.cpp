// What the core does for direct readers (src/direct/): the slot table it
// keeps current, and the runs of a file as byte ranges of the namespace.
// The copy-then-check rule that makes a direct read safe is argued in
// doc/integrity.md section 10; the core's part is that every change of a
// file's mapping or size moves its slot (MappingChange), and a slot given
// up moves too (InodeCache::Delete).
#include <sys/stat.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include "fs/fs_impl.hpp"

namespace nvfs {

void FsImpl::SetDirectTable(DirectSlot* table, uint32_t count) {
  cache_->SetDirectTable(table, count);
}

void FsImpl::SetDirectWatch(void (*changed)(void* ctx, uint32_t slot), void* ctx) {
  cache_->SetDirectWatch(DirectWatch{changed, ctx});
}

namespace {

// The runs of `inode` from the block holding `offset` on, up to `limit`
// bytes of the file (rounded up to a block), into `m`; past the size they
// end at the first hole. REQUIRES: the inode lock held.
Status FillRuns(FsImpl& fs, Bmap& bmap, uint32_t shift, uint64_t ino, const format::Inode& inode,
                uint64_t offset, uint64_t limit, DirectRun* runs, size_t max_runs,
                Filesystem::DirectMapping* m) {
  uint64_t index = offset >> shift;
  m->start = index << shift;
  const uint64_t size_blocks = (inode.size + (uint64_t{1} << shift) - 1) >> shift;
  // Rounded up without the sum: `limit` may be a client's (a commit's
  // map_end), and limit + block - 1 wraps near 2^64 to almost nothing.
  const uint64_t limit_blocks =
      (limit >> shift) + ((limit & ((uint64_t{1} << shift) - 1)) != 0 ? 1 : 0);
  const uint64_t end = std::min(limit_blocks, bmap.max_blocks());
  while (index < end && m->run_count < max_runs) {
    uint64_t run;
    const uint64_t phys = bmap.Lookup(inode, index, end - index, &run);
    if (phys == Bmap::kCorrupt) return fs.BadMap(ino);
    if (index >= size_blocks && phys == 0) break;
    if (index < size_blocks && index + run > size_blocks && phys == 0) run = size_blocks - index;
    runs[m->run_count++] = {phys == 0 ? kDirectHole : phys << shift, run << shift};
    index += run;
  }
  return Status::Ok();
}

// The word's namespace offset and value, into `m`.
void NoteWord(const Media& media, const format::Inode& inode, Filesystem::DirectMapping* m) {
  m->append_at =
      static_cast<uint64_t>(reinterpret_cast<const std::byte*>(&inode.append_end) - media.base());
  m->append_word = AppendWordOf(inode);
}

}  // namespace

Result<Filesystem::DirectMapping> FsImpl::DirectMap(uint64_t ino, uint64_t offset,
                                                    DirectRun* runs, size_t max_runs) {
  if (cache_->direct_table() == nullptr || max_runs == 0) return Error(EINVAL);
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  CachedInode* ci = ref->get();
  NVFS_TRY(SettleAppend(ci));
  // Held shared: no MappingChange runs, so the seq read below is even and
  // the runs are the file's at that seq.
  std::shared_lock lock(ci->lock);
  const format::Inode& inode = *ci->media;
  if (!S_ISREG(inode.mode)) return Error(S_ISDIR(inode.mode) ? EISDIR : EINVAL);
  if (cache_->Opens(ci) == 0) return Error(EBADF);
  DirectSlot* slot = cache_->AssignSlot(ci);
  if (slot == nullptr) return Error(ENOSPC);
  DirectMapping m;
  m.slot = static_cast<uint32_t>(slot - cache_->direct_table());
  m.seq = slot->seq.load(std::memory_order_relaxed);
  m.size = inode.size;
  NoteWord(*media_, inode, &m);
  NVFS_TRY(FillRuns(*this, *bmap_, geometry_->block_shift(), ino, inode, offset, inode.size, runs,
                    max_runs, &m));
  return m;
}

void FsImpl::SetExternalGrace(epoch::ExternalGrace* grace) {
  grace_.store(grace, std::memory_order_release);
  alloc_->SetExternalGrace(grace);
}

// --- appends by word -------------------------------------------------------------
//
// A direct writer appending at the word's end stores and flushes its bytes
// in blocks the file keeps past its size, then moves the end by
// compare-and-swap, inside its writer's section after checking the file's
// slot seq (src/direct/write.cpp). The word is the commit: the file's size
// is max(size, end). Three rules make that safe (doc/integrity.md
// section 11):
//  - Only here is a word closed, and every close moves the slot's seq
//    first: a section that begins after it stores nothing (its seq check
//    fails), so no compare-and-swap of it can follow.
//  - A close folds with a compare-and-swap loop: a writer's move lands
//    before it (and is folded) or fails (and the writer asks the daemon).
//  - A word opens only when the writers' grace period of the latest close
//    is over: a section that began before a close and still holds that
//    word's old value has ended before any word opens again, so a value
//    can never come back to meet it (nor a reused inode's).
// A file with an open word is on the orphan list (put there in the
// transaction that opens it), so a mount after a crash folds the word
// (ProcessOrphans) before it frees the blocks past the size.

Status FsImpl::CloseAppend(CachedInode* ci) {
  const format::Inode& inode = *ci->media;
  if (AppendWordOf(inode) == 0) return Status::Ok();
  const MappingChange change(ci);  // before the fold: see above
  // The grace ticket on every way out, a failed fold's too (its seq moved).
  struct Ticket {
    FsImpl& fs;
    ~Ticket() {
      epoch::ExternalGrace* grace = fs.grace_.load(std::memory_order_acquire);
      if (grace == nullptr) return;
      const uint64_t ticket = grace->Start();
      uint64_t cur = fs.append_closed_.load(std::memory_order_relaxed);
      while (cur < ticket &&
             !fs.append_closed_.compare_exchange_weak(cur, ticket, std::memory_order_release)) {
      }
    }
  } ticket{*this};
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return FoldAppend(ci->ino, inode, /*leave_list=*/true);
}

Status FsImpl::FoldAppend(uint64_t ino, const format::Inode& inode, bool leave_list) {
  const uint64_t at =
      static_cast<uint64_t>(reinterpret_cast<const std::byte*>(&inode.append_end) - media_->base());
  uint64_t w = AppendWordOf(inode);
  if (w == 0) return Status::Ok();
  // Honest writers move a word whose close began at most once per thread
  // inside a store (their seq check fails after); a process that keeps
  // moving it (it may write the namespace: it can write anything) must not
  // hold a daemon thread here. After kMaxSwaps the last value seen is
  // folded and the word stored closed: a move made in between is lost, and
  // only such a process makes one.
  constexpr int kMaxSwaps = 1024;
  for (int tries = 0;; ++tries) {
    // A regular file's only (ValidateInode); bounded again here, as the
    // word moves under the daemon.
    const uint64_t size = S_ISREG(inode.mode) ? SizeWithWord(inode, w, bmap_->max_size()) : 0;
    if (size > inode.size) {
      OrphanTx tx(*this, "append fold");
      tx.Set(inode.size, size);
      NVFS_TRY(tx.Commit());
    }
    if (tries == kMaxSwaps) {
      media_->Store64(at, 0);
      break;
    }
    if (media_->CompareExchange64(at, &w, 0)) break;
  }
  media_->Persist(at, sizeof inode.append_end);
  // On the orphan list for the word alone (a linked file): off it again,
  // or the next mount would free blocks it keeps past its size (fallocate's
  // KEEP_SIZE). An unlinked one stays for its reclaim.
  if (leave_list && inode.nlink != 0 && (inode.flags & format::kInodeFlagOrphan)) {
    OrphanTx tx(*this, "append closed");
    NVFS_TRY(OrphanRemove(tx, ino));
    NVFS_TRY(tx.Commit());
  }
  return Status::Ok();
}

bool FsImpl::AppendGraceOver() {
  epoch::ExternalGrace* grace = grace_.load(std::memory_order_acquire);
  if (grace == nullptr) return false;
  const uint64_t closed = append_closed_.load(std::memory_order_acquire);
  return closed == 0 || grace->Completed() >= closed;
}

Status FsImpl::SettleAppend(CachedInode* ci) {
  if (AppendWordOf(*ci->media) == 0) return Status::Ok();
  std::unique_lock lock(ci->lock);
  return CloseAppend(ci);
}


namespace {

// What a direct write may not do to `inode` (the checks of the kernel's
// write path that the daemon's own write would make).
Status DirectWritable(const FsImpl& fs, const InodeCache& cache, CachedInode* ci) {
  const format::Inode& inode = *ci->media;
  if (!S_ISREG(inode.mode)) return Error(S_ISDIR(inode.mode) ? EISDIR : EINVAL);
  if (cache.Opens(ci) == 0) return Error(EBADF);
  if (fs.read_only()) return Error(EROFS);
  if (Immutable(inode) || AppendOnly(inode)) return Error(EPERM);
  return Status::Ok();
}

}  // namespace

Result<Filesystem::DirectMapping> FsImpl::DirectAllocate(uint64_t ino, uint64_t offset,
                                                         uint64_t len, uint64_t reserve_end,
                                                         DirectRun* runs, size_t max_runs) {
  if (cache_->direct_table() == nullptr || max_runs == 0 || len == 0) return Error(EINVAL);
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  CachedInode* ci = ref->get();
  const uint64_t max_bytes = bmap_->max_size();
  if (offset >= max_bytes || len > max_bytes - offset) return Error(EFBIG);
  reserve_end = std::clamp(reserve_end, offset + len, max_bytes);
  const uint32_t shift = geometry_->block_shift();
  std::unique_lock lock(ci->lock);
  NVFS_TRY(DirectWritable(*this, *cache_, ci));
  NVFS_TRY(CloseAppend(ci));
  const format::Inode& inode = *ci->media;
  DirectSlot* slot = cache_->AssignSlot(ci);
  if (slot == nullptr) return Error(ENOSPC);
  // Nothing to allocate (a writer that asked for runs it did not know):
  // the file stays as it is, and so does its seq, which every direct
  // reader and writer of it holds runs for.
  bool holes = false;
  {
    const uint64_t end_index = (reserve_end + geometry_->block_size() - 1) >> shift;
    for (uint64_t index = offset >> shift; index < end_index && !holes;) {
      uint64_t run;
      const uint64_t phys = bmap_->Lookup(inode, index, end_index - index, &run);
      if (phys == Bmap::kCorrupt) return BadMap(ino);
      // Past the size only the write's own blocks must be there; the
      // reserve is kept when anything is allocated at all.
      if (phys == 0 && (index << shift) < offset + len) holes = true;
      index += run;
    }
  }
  if (holes) {
    const MappingChange change(ci);
    const uint64_t mask = geometry_->block_size() - 1;
    // The write's own blocks, then the reserve past them: only the first
    // must be had (a full filesystem refuses a write that fits with
    // ENOSPC otherwise); the reserve gets what there is.
    const uint64_t own_end = (offset + len + mask) >> shift;
    const uint64_t end_index = (reserve_end + mask) >> shift;
    uint64_t index = offset >> shift;
    for (const uint64_t part_end : {own_end, end_index}) {
      const bool must = part_end == own_end;
      std::optional<OrphanTx> tx;
      tx.emplace(*this, "direct allocate");
      bool short_of_space = false;
      while (index < part_end) {
        uint64_t run;
        const uint64_t phys = bmap_->Lookup(inode, index, part_end - index, &run);
        if (phys == Bmap::kCorrupt) return BadMap(ino);
        if (phys == 0) {
          // Inside the size a block's other bytes show: zeroed. Past it,
          // every byte is undefined until a commit's size exposes it (which
          // zeroes what the writer did not store), as for fallocate.
          const bool zero = (index << shift) < inode.size;
          Result<Extent> mapped = bmap_->MapForWrite(*tx, inode, index, run, zero);
          if (!mapped.ok()) {
            // What committed before stays; this transaction's part goes.
            if (must || mapped.code() != ENOSPC) return mapped.take_error();
            short_of_space = true;
            break;
          }
          run = mapped->count;
        }
        index += run;
        if (tx->room() < 8192 && index < part_end) {
          NVFS_TRY(tx->Commit());
          tx.emplace(*this, "direct allocate");
        }
      }
      if (short_of_space) break;  // the reserve's last transaction aborts
      NVFS_TRY(tx->Commit());
    }
  }
  DirectMapping m;
  m.slot = static_cast<uint32_t>(slot - cache_->direct_table());
  m.seq = slot->seq.load(std::memory_order_relaxed);
  m.size = inode.size;
  NoteWord(*media_, inode, &m);
  NVFS_TRY(FillRuns(*this, *bmap_, shift, ino, inode, offset, reserve_end, runs, max_runs, &m));
  return m;
}

Result<Filesystem::DirectMapping> FsImpl::DirectCommit(uint64_t ino, uint64_t start, uint64_t end,
                                                       uint64_t seq, uint64_t map_end,
                                                       DirectRun* runs, size_t max_runs) {
  if (cache_->direct_table() == nullptr || max_runs == 0 || start > end) return Error(EINVAL);
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  CachedInode* ci = ref->get();
  if (end > bmap_->max_size()) return Error(EFBIG);
  const uint32_t shift = geometry_->block_shift();
  std::unique_lock lock(ci->lock);
  // A word moved since the writer's runs were read folds here; its seq
  // then moves, and the writer (who stored at the word's end, or it would
  // not be here) stores again into fresh runs. First of all: the daemon's
  // pass for the times folds the word of a file no longer open too (its
  // writer killed after an append).
  const uint64_t size_before = ci->media->size;
  NVFS_TRY(CloseAppend(ci));
  const bool folded = ci->media->size > size_before;
  NVFS_TRY(DirectWritable(*this, *cache_, ci));
  const format::Inode& inode = *ci->media;
  DirectSlot* slot = cache_->AssignSlot(ci);
  if (slot == nullptr) return Error(ENOSPC);
  const timespec now = Now();
  bool open_word = false;
  if (start == end) {
    OrphanTx tx(*this, "direct write times");
    Touch(tx, inode, true, true, now);
    NVFS_TRY(tx.Commit());
  } else {
    // The writer's runs are the file's still, and hold every byte it stored.
    if (slot->seq.load(std::memory_order_relaxed) != seq) return Error(EAGAIN);
    for (uint64_t index = start >> shift; index < ((end - 1) >> shift) + 1;) {
      uint64_t run;
      const uint64_t phys = bmap_->Lookup(inode, index, ((end - 1) >> shift) + 1 - index, &run);
      if (phys == Bmap::kCorrupt) return BadMap(ino);
      if (phys == 0) return Error(EAGAIN);
      index += run;
    }
    // Not for a file mapped directly (a watcher on its slot): maps follow
    // the size by the seq, which an append by word does not move (a
    // mapper's registration closes the word: DirectMap, then the
    // daemon's Maps::Register, on the thread that commits).
    const bool words = append_words_.load(std::memory_order_acquire) && end > inode.size &&
                       end < format::kAppendEndMask &&
                       slot->watchers.load(std::memory_order_acquire) == 0 && AppendGraceOver();
    const MappingChange change(ci);
    OrphanTx tx(*this, "direct write");
    if (end > inode.size) {
      // The bytes between the old end and the write read as zeros, as a
      // write through the mount leaves them (Resize zeroes what it exposes);
      // the writer's own bytes are then exposed as they are.
      if (start > inode.size) NVFS_TRY(Resize(ino, start, &tx));
      tx.Set(inode.size, end);
      // Appends that follow into the blocks kept past the new end move the
      // size themselves (above): the file goes on the orphan list in this
      // transaction, before its word opens.
      const uint64_t next = end >> shift;
      uint64_t run;
      open_word = words && next < bmap_->max_blocks() && bmap_->Lookup(inode, next, 1, &run) != 0;
      if (open_word) OrphanAdd(tx, ino);
    }
    Touch(tx, inode, true, true, now);
    NVFS_TRY(tx.Commit());
  }
  DirectMapping m;
  m.append_folded = folded;
  if (open_word && (inode.flags & format::kInodeFlagOrphan)) {
    const uint64_t tag = append_tags_.fetch_add(1, std::memory_order_relaxed) % 0xffff + 1;
    const uint64_t at = static_cast<uint64_t>(
        reinterpret_cast<const std::byte*>(&inode.append_end) - media_->base());
    // Closed (CloseAppend above, under this lock): no writer's swap can
    // match 0, so a plain store opens it.
    media_->Store64(at, format::AppendWord(tag, inode.size));
    media_->Persist(at, sizeof inode.append_end);
    m.append_opened = true;
  }
  m.slot = static_cast<uint32_t>(slot - cache_->direct_table());
  m.seq = slot->seq.load(std::memory_order_relaxed);
  m.size = inode.size;
  NoteWord(*media_, inode, &m);
  // From the block holding the last byte written: the daemon tells the
  // kernel that byte (DirectlyGrown) from the reply's first run.
  NVFS_TRY(FillRuns(*this, *bmap_, shift, ino, inode, end == 0 ? 0 : end - 1,
                    std::max(map_end, end), runs, max_runs, &m));
  return m;
}

Status FsImpl::DirectTrim(uint64_t ino) {
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  CachedInode* ci = ref->get();
  std::unique_lock lock(ci->lock);
  const format::Inode& inode = *ci->media;
  if (!S_ISREG(inode.mode)) return Error(EINVAL);
  if (read_only()) return Error(EROFS);
  NVFS_TRY(CloseAppend(ci));
  const uint32_t shift = geometry_->block_shift();
  const uint64_t from = (inode.size + geometry_->block_size() - 1) >> shift;
  if (from >= bmap_->max_blocks() || bmap_->NextMapped(inode, from, bmap_->max_blocks()) >= bmap_->max_blocks()) {
    return Status::Ok();
  }
  const MappingChange change(ci);
  // Past the size: each transaction leaves a consistent file, so no orphan
  // entry is needed between them.
  for (;;) {
    OrphanTx tx(*this, "direct trim");
    Result<bool> done = bmap_->Truncate(tx, inode, from);
    if (!done.ok()) return done.take_error();
    NVFS_TRY(tx.Commit());
    if (*done) return Status::Ok();
  }
}

}  // namespace nvfs
