// The orphan list (doc/integrity.md): inodes unlinked while open and files
// whose truncation spans transactions, linked through Inode::orphan_next
// from the dynamic superblock's orphan_head; adding, removing, and finishing
// every orphan at mount.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "fs/fs_impl.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::Inode;
using format::SuperDynamic;

namespace {

// Set while the calling thread holds orphan_mu_ (through an OrphanTx).
thread_local bool holds_orphan_mu = false;

[[noreturn]] void OrphanLockBug(const char* what) {
  std::fprintf(stderr, "nvfs: BUG: %s\n", what);
  std::abort();
}

// The journal, for a transaction begun by a thread that does not hold
// orphan_mu_ (FsImpl's lock order: the slot first).
Journal& SlotFirst(FsImpl& fs) {
  if (holds_orphan_mu) {
    OrphanLockBug("a transaction begun under orphan_mu_ (the order is a journal slot, then "
                  "orphan_mu_)");
  }
  return fs.context().journal;
}

}  // namespace

OrphanTx::OrphanTx(FsImpl& fs, const char* op_name) : Tx(SlotFirst(fs), op_name), fs_(fs) {}

OrphanTx::~OrphanTx() {
  Abort();  // a no-op once finished; before the lock goes
  if (locked_) {
    holds_orphan_mu = false;
    fs_.orphan_mu_.unlock();
  }
}

void OrphanTx::LockOrphans() {
  if (locked_) return;
  if (finished()) OrphanLockBug("orphan_mu_ taken for a transaction already finished");
  fs_.orphan_mu_.lock();
  locked_ = true;
  holds_orphan_mu = true;
}

Status OrphanTx::Commit() {
  Status committed = Tx::Commit();
  if (locked_) {
    locked_ = false;
    holds_orphan_mu = false;
    fs_.orphan_mu_.unlock();
  }
  return committed;
}

void FsImpl::OrphanAdd(OrphanTx& tx, uint64_t ino) {
  tx.LockOrphans();
  const Inode& inode = ctx_->InodeAt(ino);
  if (inode.flags & format::kInodeFlagOrphan) return;
  const auto& dyn =
      *reinterpret_cast<const SuperDynamic*>(media_->base() + format::kSuperDynamicOffset);
  const uint64_t old_head = dyn.orphan_head;
  tx.Set(inode.orphan_next, old_head);
  tx.Set(inode.flags, inode.flags | format::kInodeFlagOrphan);
  UpdateDynamic(tx, [&](SuperDynamic& d) { d.orphan_head = ino; });
  // The index (DRAM only; checked before use, so an abort of `tx` leaving
  // it wrong costs a walk, never a wrong store).
  orphan_prev_[ino] = 0;
  if (old_head != 0) orphan_prev_[old_head] = ino;
}

// Every link is checked (an inode in use) before it is followed or stored:
// a damaged link is reported and fails the operation with EIO, the list left
// as it was for fsck.nvfs.
Status FsImpl::OrphanRemove(OrphanTx& tx, uint64_t ino) {
  tx.LockOrphans();
  const Inode& inode = ctx_->InodeAt(ino);
  if (!(inode.flags & format::kInodeFlagOrphan)) return Status::Ok();
  const auto& dyn =
      *reinterpret_cast<const SuperDynamic*>(media_->base() + format::kSuperDynamicOffset);
  const auto damaged = [&](uint64_t at) {
    return ctx_->Damaged(
        MakeError(EIO, "orphan list is damaged (a link to inode %" PRIu64 "); run fsck.nvfs", at));
  };
  if (inode.orphan_next != 0 && !CheckIno(inode.orphan_next).ok()) {
    return damaged(inode.orphan_next);
  }
  const uint64_t next = inode.orphan_next;
  uint64_t prev = 0;
  if (dyn.orphan_head == ino) {
    UpdateDynamic(tx, [&](SuperDynamic& d) { d.orphan_head = next; });
  } else {
    // A singly linked list: the predecessor from the index if the media
    // agrees (an inode in use whose link is `ino`: in a list without
    // cycles only the predecessor has it), else found by a walk from the
    // head. Without the index, n removals in the order of their adds
    // walked O(n^2) links (generic/531: 15,000 O_TMPFILE files took 17 s
    // to reclaim).
    const auto hint = orphan_prev_.find(ino);
    if (hint != orphan_prev_.end() && hint->second != 0 && CheckIno(hint->second).ok() &&
        ctx_->InodeAt(hint->second).orphan_next == ino) {
      prev = hint->second;
    } else {
      prev = dyn.orphan_head;
      uint64_t steps = 0;
      for (;;) {
        if (prev == 0) return damaged(ino);  // missing from the list
        if (!CheckIno(prev).ok() || ++steps > geometry_->inode_count()) {
          return damaged(prev);
        }
        if (ctx_->InodeAt(prev).orphan_next == ino) break;
        prev = ctx_->InodeAt(prev).orphan_next;
      }
    }
    tx.Set(ctx_->InodeAt(prev).orphan_next, next);
  }
  orphan_prev_.erase(ino);
  if (next != 0) orphan_prev_[next] = prev;
  tx.Set(inode.orphan_next, uint64_t{0});
  tx.Set(inode.flags, inode.flags & ~format::kInodeFlagOrphan);
  return Status::Ok();
}

Status FsImpl::ProcessOrphans() {
  const auto& dyn =
      *reinterpret_cast<const SuperDynamic*>(media_->base() + format::kSuperDynamicOffset);
  // The whole list is checked before the first orphan is touched: each inode
  // in use and valid (CheckIno: a damaged one is reported, EUCLEAN, and
  // nothing of the list is freed), flagged, listed once, and either unlinked
  // or a regular file whose truncation was cut short (nothing else is ever
  // truncated).
  {
    std::unordered_set<uint64_t> listed;
    for (uint64_t ino = dyn.orphan_head; ino != 0; ino = ctx_->InodeAt(ino).orphan_next) {
      if (!CheckIno(ino).ok() || !(ctx_->InodeAt(ino).flags & format::kInodeFlagOrphan) ||
          !listed.insert(ino).second || !OrphanMayBe(ctx_->InodeAt(ino))) {
        return MakeError(EUCLEAN, "orphan list is damaged (inode %" PRIu64 "); run fsck.nvfs",
                         ino);
      }
    }
  }
  uint64_t steps = 0;
  while (dyn.orphan_head != 0) {
    const uint64_t ino = dyn.orphan_head;
    if (!CheckIno(ino).ok() || !(ctx_->InodeAt(ino).flags & format::kInodeFlagOrphan) ||
        ++steps > geometry_->inode_count()) {
      return MakeError(EUCLEAN, "orphan list is damaged (inode %" PRIu64 "); run fsck.nvfs", ino);
    }
    const Inode& inode = ctx_->InodeAt(ino);
    if (inode.nlink == 0) {
      NVFS_TRY(Reclaim(ino));
    } else {
      // An append word first (direct.cpp): what it committed is the file's.
      // A writer of the daemon before may still move it (this mount waits
      // for those before it serves: direct_writers.hpp), hence the loop.
      NVFS_TRY(FoldAppend(ino, inode, /*leave_list=*/false));
      // The size is within the largest file's (CheckIno: ValidateInode), so
      // rounding it up to a block cannot wrap; written so that it cannot
      // wrap anyway.
      const uint32_t shift = geometry_->block_shift();
      const uint64_t from =
          (inode.size >> shift) + ((inode.size & (geometry_->block_size() - 1)) != 0 ? 1 : 0);
      NVFS_TRY(FreeBlocksFrom(ino, from));
    }
  }
  return Status::Ok();
}

}  // namespace nvfs
