// Truncation: changing a regular file's size (Resize), freeing its blocks
// past a point in as many transactions as it takes (FreeBlocksFrom), and
// freeing the data of an unlinked file with no open left (FreeUnlinkedData).
#include <sys/stat.h>

#include <algorithm>
#include <mutex>

#include "fs/fs_impl.hpp"
#include "util/races.hpp"

namespace nvfs {

using format::Inode;

Status FsImpl::FreeBlocksFrom(uint64_t ino, uint64_t from) {
  const Inode& inode = ctx_->InodeAt(ino);
  for (;;) {
    OrphanTx tx(*this, "truncate-more");
    Result<bool> done = bmap_->Truncate(tx, inode, from);
    if (!done.ok()) return done.take_error();
    if (*done) {
      // An unlinked inode (still open) was on the list before the truncation
      // and stays there until reclaim frees it: taking it off here would
      // leak it, and its blocks, if the machine crashed before the release.
      if (inode.nlink != 0) NVFS_TRY(OrphanRemove(tx, ino));
      return tx.Commit();
    }
    NVFS_TRY(tx.Commit());
  }
}

Status FsImpl::Resize(uint64_t ino, uint64_t new_size, OrphanTx* first_tx) {
  const Inode& inode = ctx_->InodeAt(ino);
  const Geometry& g = *geometry_;
  if (new_size > bmap_->max_size()) return Error(EFBIG);
  const uint64_t old_size = inode.size;
  OrphanTx& tx = *first_tx;
  if (new_size >= old_size) {
    // Every byte past the old end is undefined, in the old last block and in
    // any block fallocate kept past the end: a write that extended the file
    // stores its data there before the transaction publishing the new size,
    // so a crash leaves them holding bytes the file never got. Zero what the
    // new size exposes in every mapped block (fresh stores: unreachable until
    // the size is published). Holes read as zeros already.
    const uint32_t shift = g.block_shift();
    const uint64_t mask = g.block_size() - 1;
    uint64_t pos = old_size;
    while (pos < new_size) {
      const uint64_t index = pos >> shift;
      uint64_t run;
      const uint64_t phys =
          bmap_->Lookup(inode, index, ((new_size - 1) >> shift) - index + 1, &run);
      if (phys == Bmap::kCorrupt) return BadMap(ino);
      const uint64_t run_end = std::min(new_size, (index + run) << shift);
      // File data, under a recovery point (ZeroMapped says why).
      if (phys != 0 && !RunFaultGuarded([&] {
            tx.FillFresh(g.BlockOffset(phys) + (pos & mask), 0, run_end - pos);
          })) {
        ReportMediaError("zeroing", ino);
        return Error(EIO);
      }
      pos = run_end;
    }
    if (new_size != old_size) tx.Set(inode.size, new_size);
    return Status::Ok();
  }
  tx.Set(inode.size, new_size);
  const uint64_t from = (new_size + g.block_size() - 1) >> g.block_shift();
  // The new last block's bytes past the new end: zeros after the commit
  // (ZeroTail), as the kernel's filesystems leave them, so that a map's
  // last page shows zeros past the end as POSIX has it.
  uint64_t tail_phys = 0;
  if ((new_size & (g.block_size() - 1)) != 0) {
    uint64_t run;
    tail_phys = bmap_->Lookup(inode, new_size >> g.block_shift(), 1, &run);
    if (tail_phys == Bmap::kCorrupt) return BadMap(ino);
  }
  Result<bool> done = bmap_->Truncate(tx, inode, from);
  if (!done.ok()) return done.take_error();
  if (*done) {
    if (tail_phys == 0) return Status::Ok();
    NVFS_TRY(tx.Commit());
    return ZeroTail(ino, tail_phys, new_size);
  }
  // Too much for one transaction: the rest happens in further ones, and the
  // orphan list makes a crash in between finish the job at mount. The bytes
  // past the new size are invisible from this first commit on.
  OrphanAdd(tx, ino);
  NVFS_TRY(tx.Commit());  // and orphan_mu_ is released
  NVFS_TRY(FreeBlocksFrom(ino, from));
  return tail_phys != 0 ? ZeroTail(ino, tail_phys, new_size) : Status::Ok();
}

// Bytes past the end are nothing the file holds once the size is durable,
// so zeroing them needs no log: durable, not atomic, and a crash before it
// leaves them as they were, past the end, where every read gives zeros and
// the next size change that exposes them zeroes them first (above).
Status FsImpl::ZeroTail(uint64_t ino, uint64_t phys, uint64_t size) {
  const Geometry& g = *geometry_;
  const uint64_t in_block = size & (g.block_size() - 1);
  const uint64_t at = g.BlockOffset(phys) + in_block;
  const uint64_t n = g.block_size() - in_block;
  Media& media = ctx_->media;
  if (!RunFaultGuarded([&] {
        media.Fill(at, 0, n);
        media.Flush(at, n);
        media.Drain();
      })) {
    ReportMediaError("zeroing", ino);
    return Error(EIO);
  }
  return Status::Ok();
}

// Order: L `size` = 0 and the bmap truncate from block 0 (D every block),
// one transaction while the slot has room, then further ones for the rest
// (FreeBlocksFrom). The inode is on the orphan list from the commit that
// dropped its last link, before this, and stays there: a crash at any
// point leaves an unlinked orphan with fewer blocks, which mount reclaims.
// The size goes first so that no state shows a size past freed blocks; a
// file reopened afterwards (through /proc/self/fd of an O_PATH descriptor)
// reads as the empty file it now is.
Status FsImpl::FreeUnlinkedData(CachedInode* cached) {
  const Inode& inode = *cached->media;
  if (read_only() || !S_ISREG(inode.mode) || inode.nlink != 0 || cached->linkable ||
      !(inode.flags & format::kInodeFlagOrphan)) {
    return Status::Ok();
  }
  if (inode.size == 0 && inode.blocks == 0) return Status::Ok();
  // Under the inode lock held exclusively no open is added (Open), so a
  // count of 0 stays 0 until the lock is dropped.
  if (cache_->Opens(cached) != 0) return Status::Ok();
  const MappingChange change(cached);  // before the Tx: an abort's undo is under it
  {
    Tx tx(*journal_, "free-unlinked");
    if (inode.size != 0) tx.Set(inode.size, uint64_t{0});
    Result<bool> done = bmap_->Truncate(tx, inode, 0);
    if (!done.ok()) return done.take_error();
    NVFS_TRY(tx.Commit());
    if (*done) return Status::Ok();
  }
  return FreeBlocksFrom(cached->ino, 0);
}

}  // namespace nvfs
