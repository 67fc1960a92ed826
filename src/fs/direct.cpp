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
  const uint64_t end = std::min((limit + (uint64_t{1} << shift) - 1) >> shift, bmap.max_blocks());
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

}  // namespace

Result<Filesystem::DirectMapping> FsImpl::DirectMap(uint64_t ino, uint64_t offset,
                                                    DirectRun* runs, size_t max_runs) {
  if (cache_->direct_table() == nullptr || max_runs == 0) return Error(EINVAL);
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  CachedInode* ci = ref->get();
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
  NVFS_TRY(FillRuns(*this, *bmap_, geometry_->block_shift(), ino, inode, offset, inode.size, runs,
                    max_runs, &m));
  return m;
}

void FsImpl::SetExternalGrace(epoch::ExternalGrace* grace) { alloc_->SetExternalGrace(grace); }

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
    std::optional<OrphanTx> tx;
    tx.emplace(*this, "direct allocate");
    uint64_t index = offset >> shift;
    const uint64_t end_index = (reserve_end + geometry_->block_size() - 1) >> shift;
    while (index < end_index) {
      uint64_t run;
      const uint64_t phys = bmap_->Lookup(inode, index, end_index - index, &run);
      if (phys == Bmap::kCorrupt) return BadMap(ino);
      if (phys == 0) {
        // Inside the size a block's other bytes show: zeroed. Past it,
        // every byte is undefined until a commit's size exposes it (which
        // zeroes what the writer did not store), as for fallocate.
        const bool zero = (index << shift) < inode.size;
        Result<Extent> mapped = bmap_->MapForWrite(*tx, inode, index, run, zero);
        if (!mapped.ok()) {
          // What committed before stays; this transaction's part goes.
          return mapped.take_error();
        }
        run = mapped->count;
      }
      index += run;
      if (tx->room() < 8192 && index < end_index) {
        NVFS_TRY(tx->Commit());
        tx.emplace(*this, "direct allocate");
      }
    }
    NVFS_TRY(tx->Commit());
  }
  DirectMapping m;
  m.slot = static_cast<uint32_t>(slot - cache_->direct_table());
  m.seq = slot->seq.load(std::memory_order_relaxed);
  m.size = inode.size;
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
  NVFS_TRY(DirectWritable(*this, *cache_, ci));
  const format::Inode& inode = *ci->media;
  DirectSlot* slot = cache_->AssignSlot(ci);
  if (slot == nullptr) return Error(ENOSPC);
  const timespec now = Now();
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
    const MappingChange change(ci);
    OrphanTx tx(*this, "direct write");
    if (end > inode.size) {
      // The bytes between the old end and the write read as zeros, as a
      // write through the mount leaves them (Resize zeroes what it exposes);
      // the writer's own bytes are then exposed as they are.
      if (start > inode.size) NVFS_TRY(Resize(ino, start, &tx));
      tx.Set(inode.size, end);
    }
    Touch(tx, inode, true, true, now);
    NVFS_TRY(tx.Commit());
  }
  DirectMapping m;
  m.slot = static_cast<uint32_t>(slot - cache_->direct_table());
  m.seq = slot->seq.load(std::memory_order_relaxed);
  m.size = inode.size;
  NVFS_TRY(FillRuns(*this, *bmap_, shift, ino, inode, end, std::max(map_end, end), runs, max_runs,
                    &m));
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
