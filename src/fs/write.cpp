// The write path: write and write_iter, and fsync.
//
// Writes: data goes straight to the media with non-temporal stores
// (Media::StoreFlush); blocks that were holes are allocated, and filled aside
// (write before publish) before the transaction that links them, the new size
// and the times commits. Overwrites in place are not atomic (as on every POSIX
// filesystem); everything is durable when Write returns.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <mutex>
#include <optional>

#include "fs/fs_impl.hpp"
#include "fs/iovec.hpp"
#include "util/races.hpp"

namespace nvfs {

using format::Inode;

// Where Write takes its bytes from.
struct FsImpl::WriteSource {
  const iovec* iov;
  const iovec* end;
  size_t used = 0;

  // Stores the next n bytes at `offset` on the media, flushed, not drained.
  void StoreTo(Media& media, uint64_t offset, size_t n) {
    while (n > 0 && iov != end) {
      const size_t k = std::min(n, iov->iov_len - used);
      media.StoreFlush(offset, static_cast<const std::byte*>(iov->iov_base) + used, k);
      offset += k;
      n -= k;
      used += k;
      if (used == iov->iov_len) {
        ++iov;
        used = 0;
      }
    }
  }
};

Result<size_t> FsImpl::WriteCore(FileHandle file, uint64_t offset, WriteSource& src, size_t len,
                                 unsigned io_flags) {
  if (read_only()) return Error(EROFS);
  if ((file->flags & O_ACCMODE) == O_RDONLY) return Error(EBADF);
  CachedInode* ci = file->inode;
  std::unique_lock lock(ci->lock);
  NVFS_TRY(CloseAppend(ci));
  // Lock-free readers (ReadInto) must retry only if this write changes the
  // file's mapping or size; an overwrite in place does neither, and a reader
  // racing with it may see some of its bytes, as on any filesystem. Begun at
  // the first such change, and declared before the Tx so that an abort's
  // undo happens under it too.
  std::optional<MappingChange> change;
  const auto changing = [&] {
    if (!change) change.emplace(ci);
  };
  const Inode& inode = *ci->media;
  if (S_ISDIR(inode.mode)) return Error(EISDIR);
  if (!S_ISREG(inode.mode)) return Error(EINVAL);
  if ((file->flags & O_APPEND) && !(io_flags & kAtOffset)) offset = inode.size;
  // chattr's attributes, also through handles opened before they were set.
  if (Immutable(inode)) return Error(EPERM);
  if (AppendOnly(inode) && offset != inode.size) return Error(EPERM);
  const Geometry& g = *geometry_;
  const uint32_t shift = g.block_shift();
  const uint64_t mask = g.block_size() - 1;
  // A byte may land at max_size() - 1 at most: the size stays a
  // non-negative off_t (2^63 - 1 bytes, not the 2^63 of max_blocks() blocks).
  const uint64_t max_bytes = bmap_->max_size();
  if (len == 0) return size_t{0};
  if (offset >= max_bytes) return Error(EFBIG);
  len = static_cast<size_t>(std::min<uint64_t>(len, max_bytes - offset));
  // Before any byte lands: an overwrite in place is visible at once.
  NVFS_TRY(KillPrivsFirst(ci->ino, inode, io_flags & kKillSuidgid));

  Media& media = *media_;
  Bmap& bmap = *bmap_;
  std::optional<OrphanTx> tx;
  // The write-back of a mapping's pages (kAtOffset) carries stores the
  // kernel has accepted already: it may take the reserve.
  const auto begin = [&] {
    tx.emplace(*this, "write");
    if (io_flags & kAtOffset) tx->AllowReserve();
  };
  begin();
  // The new size, once data up to `end` is on the media.
  const auto grow_to = [&](uint64_t end) {
    if (end <= inode.size) return;
    changing();
    tx->Set(inode.size, end);
  };
  const timespec now = Now();
  // Past the end: the bytes between the old end and the write, inside the old
  // last block, must read as zeros.
  if (offset > inode.size) changing();
  NVFS_TRY(Resize(ci->ino, std::max<uint64_t>(inode.size, offset), &*tx));

  size_t done = 0;
  Error failure;
  bool failed = false;
  while (done < len) {
    const uint64_t pos = offset + done;
    const uint64_t index = pos >> shift;
    const uint64_t in_block = pos & mask;
    const size_t remaining = len - done;
    const uint64_t blocks = (in_block + remaining + mask) >> shift;
    uint64_t run;
    uint64_t phys = bmap.Lookup(inode, index, blocks, &run);
    if (phys == Bmap::kCorrupt) {
      failure = BadMap(ci->ino);
      failed = true;
      break;
    }
    if (phys == 0) {
      // A hole: allocate. Blocks only partly written are zero-filled first.
      const uint64_t full = (in_block == 0) ? (remaining >> shift) : 0;
      const uint64_t want = full == 0 ? 1 : std::min(run, full);
      changing();
      Result<Extent> mapped = bmap.MapForWrite(*tx, inode, index, want, full == 0);
      if (!mapped.ok()) {
        failure = mapped.take_error();
        failed = true;
        break;
      }
      phys = mapped->first;
      run = mapped->count;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>((run << shift) - in_block, remaining));
    // A media error in the data blocks (SIGBUS on the store) fails this
    // run with EIO; the bytes before it are written as on any short write.
    // Safe to abandon: StoreTo takes no lock and owns nothing; the inode
    // lock and the Tx are ours, out here, and end through normal returns.
    if (!RunFaultGuarded([&] { src.StoreTo(media, g.BlockOffset(phys) + in_block, n); })) {
      ReportMediaError("write", ci->ino);
      failure = Error(EIO);
      failed = true;
      break;
    }
    done += n;
    if (tx->room() < 8192 && done < len) {
      // Long writes commit as they go: write() is not atomic, only durable.
      grow_to(offset + done);
      NVFS_TRY(tx->Commit());
      begin();
    }
  }
  if (done == 0 && failed) return failure;  // the Tx aborts: nothing happened
  grow_to(offset + done);
  Touch(*tx, inode, true, true, now);
  NVFS_TRY(tx->Commit());
  return done;
}

Result<size_t> FsImpl::Write(FileHandle file, uint64_t offset, const void* buf, size_t len,
                             unsigned io_flags) {
  iovec iov{const_cast<void*>(buf), len};
  WriteSource src{&iov, &iov + 1};
  return WriteCore(file, offset, src, len, io_flags);
}

Result<size_t> FsImpl::WriteIter(FileHandle file, uint64_t offset, const iovec* iov,
                                 int iovcnt, unsigned io_flags) {
  WriteSource src{iov, iov + iovcnt};
  return WriteCore(file, offset, src, IovecTotal(iov, iovcnt), io_flags);
}

Status FsImpl::Fsync(FileHandle file) {
  (void)file;  // every operation was durable when it returned
  return Status::Ok();
}

}  // namespace nvfs
