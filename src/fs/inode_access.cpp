// The inode helpers every operation uses: the clock, checking an inode
// number and pinning its inode (CheckIno, Get), its attributes (MakeAttr),
// and the logged inode stores that keep orphan_next out of every diff
// (Touch, StoreInodeDiff).
#include <sys/stat.h>

#include <cinttypes>
#include <cstddef>
#include <ctime>

#include "fs/fs_impl.hpp"
#include "util/races.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::Inode;

timespec Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts;
}

Status FsImpl::CheckIno(uint64_t ino, bool wait_reclaim) const {
  const Geometry& g = *geometry_;
  if (ino == 0 || ino >= g.inode_count()) return Error(ESTALE);
  const uint32_t group = g.InodeGroup(ino);
  const std::byte* bitmap = media_->base() + g.BlockOffset(g.InodeBitmapBlock(group));
  if (!TestBitShared(bitmap, ino % g.inodes_per_group())) return Error(ESTALE);
  if (InodeTypeOf(LoadRacing(ctx_->InodeAt(ino).mode)) == InodeType::kInvalid) {
    // Reclaim stores mode 0 in the transaction whose commit then clears
    // the bitmap bit, with the entry marked reclaiming from before the
    // store until after the bit is clear: a number read in that window is
    // an inode going away, not damage. Get waits it out and looks again
    // (EAGAIN). (mode is read without the inode's lock: only its type bits
    // are used, which nothing but a reclaim and a new inode change.) The
    // other callers walk the orphan list under orphan_mu_, which a reclaim
    // holds from before that store to its commit, so they never see it.
    if (!wait_reclaim) {
      return ctx_->Damaged(MakeError(EUCLEAN, "inode %" PRIu64 " has an invalid mode", ino));
    }
    if (cache_->WaitReclaimed(ino) || !TestBitShared(bitmap, ino % g.inodes_per_group()) ||
        InodeTypeOf(LoadRacing(ctx_->InodeAt(ino).mode)) != InodeType::kInvalid) {
      return Error(EAGAIN);
    }
    return ctx_->Damaged(MakeError(EUCLEAN, "inode %" PRIu64 " has an invalid mode", ino));
  }
  // The rest of the inode's own fields (ValidateInode), on a copy: a writer
  // holding the inode's lock may be changing it, but every field checked is
  // stored whole. A type gone meanwhile is a reclaim's (above), not damage.
  Inode copy;
  CopyRacing(&copy, &ctx_->InodeAt(ino), sizeof copy);
  const InodeFaults faults = ValidateInode(copy, bmap_->max_size());
  if (faults != 0 && faults != kInodeFaultType) [[unlikely]] {
    return ctx_->Damaged(MakeError(EUCLEAN, "inode %" PRIu64 " is damaged (%s); run fsck.nvfs", ino,
                                   InodeFaultName(faults)));
  }
  return Status::Ok();
}

Result<InodeRef> FsImpl::Get(uint64_t ino) {
  for (;;) {
    // Checked again after waiting out a reclaim (InodeCache::Pin): the
    // number may now be free (an error here) or a new inode's.
    Status checked = CheckIno(ino, /*wait_reclaim=*/true);
    if (checked.code() == EAGAIN) continue;  // a reclaim went by
    NVFS_TRY(std::move(checked));
    if (CachedInode* inode = cache_->Pin(ino, &ctx_->InodeAt(ino))) return InodeRef(*this, inode);
  }
}

Attr FsImpl::MakeAttr(uint64_t ino, const Inode& inode) const {
  Attr a;
  a.ino = ino;
  a.mode = inode.mode;
  a.nlink = inode.nlink;
  a.uid = inode.uid;
  a.gid = inode.gid;
  a.rdev = inode.rdev;
  a.size = inode.size;
  // An open append word: the size is max(size, end) and may move (a peek;
  // the word is folded by the next change of the file).
  if (S_ISREG(inode.mode)) {
    if (const uint64_t word = AppendWordOf(inode); word != 0) {
      a.size = SizeWithWord(inode, word, bmap_->max_size());
      a.size_moving = true;
    }
  }
  a.blocks = inode.blocks << (geometry_->block_shift() - 9);
  a.blksize = geometry_->block_size();
  a.generation = inode.generation;
  a.atime = ToTimespec(inode.atime_sec, inode.atime_nsec);
  a.mtime = ToTimespec(inode.mtime_sec, inode.mtime_nsec);
  a.ctime = ToTimespec(inode.ctime_sec, inode.ctime_nsec);
  a.btime = ToTimespec(inode.btime_sec, inode.btime_nsec);
  return a;
}

// One logged store covering both times (they sit within 36 bytes), so a
// touch costs one journal record.
void Touch(Tx& tx, const Inode& inode, bool mtime, bool ctime, timespec now) {
  if (!mtime && !ctime) return;
  Inode updated;
  CopyRacing(&updated, &inode, sizeof updated);  // orphan_next may be moving: never stored
  if (mtime) {
    updated.mtime_sec = now.tv_sec;
    updated.mtime_nsec = static_cast<uint32_t>(now.tv_nsec);
  }
  if (ctime) {
    updated.ctime_sec = now.tv_sec;
    updated.ctime_nsec = static_cast<uint32_t>(now.tv_nsec);
  }
  StoreInodeDiff(tx, inode, updated);
}

// Inode::orphan_next is the one field of an inode written without the
// inode's lock: OrphanRemove rewrites the predecessor's under orphan_mu_
// alone. A diff is therefore cut around it and never stores it, whatever
// `updated` holds there: a copy taken before a concurrent removal would put
// the removed (and soon freed) inode back on the list.
void StoreInodeDiff(Tx& tx, const Inode& on_media, const Inode& updated) {
  const auto* old_bytes = reinterpret_cast<const std::byte*>(&on_media);
  const auto* new_bytes = reinterpret_cast<const std::byte*>(&updated);
  const auto store_range = [&](size_t first, size_t last) {
    while (first < last && old_bytes[first] == new_bytes[first]) ++first;
    while (last > first && old_bytes[last - 1] == new_bytes[last - 1]) --last;
    if (first < last) tx.Store(tx.OffsetOf(old_bytes + first), new_bytes + first, last - first);
  };
  // orphan_next and the append word after it: neither is ever stored here.
  constexpr size_t kListFirst = offsetof(Inode, orphan_next);
  static_assert(offsetof(Inode, append_end) == kListFirst + sizeof(Inode::orphan_next));
  constexpr size_t kListLast = offsetof(Inode, append_end) + sizeof(Inode::append_end);
  store_range(0, kListFirst);
  store_range(kListLast, sizeof(Inode));
}

}  // namespace nvfs
