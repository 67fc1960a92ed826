// A file's space: fallocate (allocate, punch a hole, zero a range) and
// lseek's SEEK_DATA and SEEK_HOLE.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include "fs/fs_impl.hpp"
#include "util/races.hpp"

namespace nvfs {

using format::Inode;

// Zeroes the bytes of [from, to) that lie in mapped blocks, in place, as a
// write of zeros would: flushed now, drained by the caller's commit; durable,
// not atomic. Holes already read as zeros. REQUIRES: inode lock held
// exclusively (and a MappingChange, so lock-free readers retry).
static Status ZeroMapped(FsContext& ctx, const Bmap& bmap, uint64_t ino, const Inode& inode,
                         uint64_t from, uint64_t to) {
  const Geometry& g = ctx.geometry;
  const uint32_t shift = g.block_shift();
  const uint64_t mask = g.block_size() - 1;
  Media& media = ctx.media;
  while (from < to) {
    const uint64_t in_block = from & mask;
    uint64_t run;
    const uint64_t phys =
        bmap.Lookup(inode, from >> shift, (in_block + (to - from) + mask) >> shift, &run);
    if (phys == Bmap::kCorrupt) {
      return ctx.Damaged(MakeError(EIO, "a block pointer names no data block; run fsck.nvfs"));
    }
    const uint64_t n = std::min((run << shift) - in_block, to - from);
    // File data: a media error fails the request (a recovery point, as a
    // write's copy), so a lost data page is never replaced by the handler
    // and keeps failing every read of it.
    if (phys != 0 && !RunFaultGuarded([&] {
          media.Fill(g.BlockOffset(phys) + in_block, 0, n);
          media.Flush(g.BlockOffset(phys) + in_block, n);
        })) {
      ReportMediaError("zeroing", ino);
      return Error(EIO);
    }
    from += n;
  }
  return Status::Ok();
}

Status FsImpl::Fallocate(FileHandle file, int mode, uint64_t offset, uint64_t len,
                         unsigned io_flags) {
  if (read_only_) return Error(EROFS);
  if ((file->flags & O_ACCMODE) == O_RDONLY) return Error(EBADF);
  if (len == 0) return Error(EINVAL);
  const bool punch = mode & FALLOC_FL_PUNCH_HOLE;
  const bool zero_range = mode & FALLOC_FL_ZERO_RANGE;
  if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
    return Error(EOPNOTSUPP);
  }
  if (punch && !(mode & FALLOC_FL_KEEP_SIZE)) return Error(EOPNOTSUPP);
  if (punch && zero_range) return Error(EOPNOTSUPP);  // as vfs_fallocate
  CachedInode* ci = file->inode;
  std::unique_lock lock(ci->lock);
  NVFS_TRY(CloseAppend(ci));
  const MappingChange change(ci);
  const Inode& inode = *ci->media;
  if (S_ISDIR(inode.mode)) return Error(EISDIR);
  if (!S_ISREG(inode.mode)) return Error(ENODEV);
  // chattr's attributes (vfs_fallocate): nothing on an immutable file; on
  // an append-only one only allocation that keeps the bytes.
  if (Immutable(inode)) return Error(EPERM);
  if (AppendOnly(inode) && (mode & ~FALLOC_FL_KEEP_SIZE)) return Error(EPERM);
  const Geometry& g = *geometry_;
  const uint32_t shift = g.block_shift();
  const uint64_t bs = g.block_size();
  const uint64_t max_bytes = bmap_->max_size();
  if (offset >= max_bytes || len > max_bytes - offset) return Error(EFBIG);
  const uint64_t end = offset + len;
  // Before anything changes (zero range stores zeros in place).
  NVFS_TRY(KillPrivsFirst(ci->ino, inode, io_flags & kKillSuidgid));
  const timespec now = Now();

  if (punch) {
    const uint64_t size = inode.size;
    const uint64_t zero_end = std::min(end, size);
    if (offset >= zero_end) return Status::Ok();
    const uint64_t first_full = (offset + bs - 1) >> shift;
    const uint64_t end_full = zero_end == size ? (zero_end + bs - 1) >> shift : zero_end >> shift;
    std::optional<Tx> tx;
    tx.emplace(*journal_, "punch");
    // Partial blocks at the edges: zeroed in place (ZeroMapped). Logging them
    // cost a record as large as the range, which with large blocks does not
    // fit a journal slot, so such a punch failed with ENOSPC.
    if (first_full >= end_full) {
      NVFS_TRY(ZeroMapped(*ctx_, *bmap_, ci->ino, inode, offset, zero_end));
    } else {
      NVFS_TRY(ZeroMapped(*ctx_, *bmap_, ci->ino, inode, offset, first_full << shift));
      if ((end_full << shift) < zero_end) {
        NVFS_TRY(ZeroMapped(*ctx_, *bmap_, ci->ino, inode, end_full << shift, zero_end));
      }
      for (;;) {
        Result<bool> done = bmap_->Punch(*tx, inode, first_full, end_full - first_full);
        if (!done.ok()) return done.take_error();
        if (*done) break;
        NVFS_TRY(tx->Commit());
        tx.emplace(*journal_, "punch");
      }
    }
    Touch(*tx, inode, true, true, now);
    return tx->Commit();
  }

  // Allocation: every hole in the range gets zeroed blocks. Blocks wholly
  // past the end that the size change below exposes are zeroed by Resize,
  // which zeroes every mapped byte it exposes; zeroing them here too would
  // write them twice.
  const bool extend = !(mode & FALLOC_FL_KEEP_SIZE) && end > inode.size;
  std::optional<OrphanTx> tx;
  tx.emplace(*this, zero_range ? "zero range" : "fallocate");
  // ZERO_RANGE: first the mapped bytes of the range inside the file are
  // zeroed in place (ZeroMapped; drained by the commit below); mapped bytes
  // past the end need nothing, as above.
  if (zero_range) {
    NVFS_TRY(ZeroMapped(*ctx_, *bmap_, ci->ino, inode, offset, std::min(end, inode.size)));
  }
  const uint64_t end_index = (end + bs - 1) >> shift;
  NVFS_TRY(MapHoles(tx, "fallocate", /*reserve=*/false, ci->ino, offset >> shift, end_index,
                    extend ? (inode.size + bs - 1) >> shift : end_index));
  if (extend) NVFS_TRY(Resize(ci->ino, end, &*tx));
  Touch(*tx, inode, false, true, now);
  return tx->Commit();
}

Status FsImpl::BackMappedRange(FileHandle file, uint64_t offset, uint64_t len) {
  if (read_only_) return Error(EROFS);
  if ((file->flags & O_ACCMODE) == O_RDONLY) return Error(EBADF);
  CachedInode* ci = file->inode;
  const uint32_t shift = geometry_->block_shift();
  const uint64_t mask = geometry_->block_size() - 1;
  // The blocks holding bytes of [offset, offset + len) below `size`.
  const auto blocks = [&](const Inode& inode, uint64_t* first, uint64_t* limit) {
    const uint64_t size = inode.size;
    if (!S_ISREG(inode.mode) || offset >= size || len == 0) return false;
    *first = offset >> shift;
    *limit = (offset + std::min(len, size - offset) + mask) >> shift;
    return true;
  };
  uint64_t index;
  uint64_t limit;
  {
    // The common case: no hole, nothing to change.
    std::shared_lock lock(ci->lock);
    if (!blocks(*ci->media, &index, &limit)) return Status::Ok();
    if (bmap_->NextHole(*ci->media, index, limit) >= limit) return Status::Ok();
  }
  std::unique_lock lock(ci->lock);
  NVFS_TRY(CloseAppend(ci));
  const MappingChange change(ci);
  const Inode& inode = *ci->media;
  if (!blocks(inode, &index, &limit)) return Status::Ok();
  // Zeroed blocks where the holes were: the bytes read as before, so no
  // time changes and no privilege is dropped.
  std::optional<OrphanTx> tx;
  tx.emplace(*this, "back mapped pages");
  tx->AllowReserve();
  NVFS_TRY(MapHoles(tx, "back mapped pages", /*reserve=*/true, ci->ino, index, limit, limit));
  return tx->Commit();
}

Status FsImpl::MapHoles(std::optional<OrphanTx>& tx, const char* name, bool reserve, uint64_t ino,
                        uint64_t index, uint64_t end, uint64_t zero_below) {
  const Inode& inode = ctx_->InodeAt(ino);
  while (index < end) {
    uint64_t run;
    const uint64_t phys = bmap_->Lookup(inode, index, end - index, &run);
    if (phys == Bmap::kCorrupt) return BadMap(ino);
    if (phys == 0) {
      Result<Extent> mapped = bmap_->MapForWrite(*tx, inode, index, run, index < zero_below);
      if (!mapped.ok()) return mapped.take_error();
      run = mapped->count;
    }
    index += run;
    if (tx->room() < 8192 && index < end) {
      NVFS_TRY(tx->Commit());
      tx.emplace(*this, name);
      if (reserve) tx->AllowReserve();
    }
  }
  return Status::Ok();
}

Result<uint64_t> FsImpl::Lseek(FileHandle file, uint64_t offset, int whence) {
  CachedInode* ci = file->inode;
  std::shared_lock lock(ci->lock);
  const Inode& inode = *ci->media;
  const uint64_t word = S_ISREG(inode.mode) ? AppendWordOf(inode) : 0;
  const uint64_t size = word != 0 ? SizeWithWord(inode, word, bmap_->max_size()) : inode.size;
  switch (whence) {
    case SEEK_SET: return offset;
    case SEEK_END: return size + offset;
    case SEEK_DATA:
    case SEEK_HOLE: break;
    default: return Error(EINVAL);
  }
  if (offset >= size) return Error(ENXIO);
  if (!S_ISREG(inode.mode)) return whence == SEEK_DATA ? offset : size;
  const uint32_t shift = geometry_->block_shift();
  const uint64_t limit = (size + geometry_->block_size() - 1) >> shift;
  const uint64_t index = offset >> shift;
  if (whence == SEEK_DATA) {
    const uint64_t found = bmap_->NextMapped(inode, index, limit);
    if (found >= limit) return Error(ENXIO);
    return std::max(offset, found << shift);
  }
  const uint64_t found = bmap_->NextHole(inode, index, limit);
  return std::max(offset, std::min(size, found << shift));
}

}  // namespace nvfs
