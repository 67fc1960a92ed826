// Reclaim: freeing an unlinked inode and everything it holds once no one
// uses it (Reclaim, ReclaimIdle), and the unpin that may start it where
// nothing may throw (UnpinNoThrow).
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <new>

#include "fs/fs_impl.hpp"

namespace nvfs {

using format::Inode;

Status FsImpl::Reclaim(uint64_t ino) {
  // Turned read-only by damage: the inode stays on the orphan list.
  if (read_only()) return Error(EROFS);
  const Inode& inode = ctx_->InodeAt(ino);
  // Free the contents in as many transactions as needed; the inode stays on
  // the orphan list until the last one, which frees the inode itself.
  for (;;) {
    OrphanTx tx(*this, "reclaim");
    Result<bool> done = true;
    if (S_ISDIR(inode.mode)) {
      done = dir_->FreeTree(tx, inode);
    } else if (S_ISREG(inode.mode) ||
               (S_ISLNK(inode.mode) && inode.size > format::kInlineSymlinkMax)) {
      done = bmap_->Truncate(tx, inode, 0);
    }
    if (!done.ok()) return done.take_error();
    // Then the extended attributes, as many transactions as they take. A
    // damaged block or run is not followed, and the inode is not freed
    // either: it stays on the orphan list for fsck.nvfs.
    if (*done && inode.xattr_block != 0) done = FreeXattrs(tx, inode);
    if (!done.ok()) return done.take_error();
    if (!*done) {
      NVFS_TRY(tx.Commit());
      continue;
    }
    NVFS_TRY(OrphanRemove(tx, ino));
    tx.Set(inode.mode, uint16_t{0});
    NVFS_TRY(alloc_->FreeInode(tx, ino));
    return tx.Commit();
  }
}

void FsImpl::ReclaimIdle(CachedInode* inode) {
  // The entry goes on every path, a throw from Reclaim (an allocation
  // failure) included: until it goes, `reclaiming` stays set and every pin
  // of the number waits for it (InodeCache::Pin). Erased after the inode
  // lock is dropped, as the lock lives in the entry.
  struct EraseOnExit {
    InodeCache& cache;
    CachedInode* inode;
    ~EraseOnExit() { cache.Erase(inode); }
  } erase_on_exit{*cache_, inode};
  std::unique_lock lock(inode->lock);
  (void)CloseAppend(inode);  // its seq moves (below too); the word closes
  // No reader holds the inode any more, but a direct client may still
  // hold its runs (a descriptor closed without detaching): its slot moves
  // before the blocks are freed.
  const MappingChange change(inode);
  if (reclaim_fault_) reclaim_fault_(inode->ino);
  // A failure here, an error or a throw, leaves the inode on the orphan
  // list: the next mount finishes it.
  (void)Reclaim(inode->ino);
}

namespace {

// Runs `reclaim` of inode `ino`; a throw is said on stderr. False if it threw.
template <class Fn>
bool ReportThrow(uint64_t ino, Fn&& reclaim) noexcept {
  const char* what = nullptr;
  try {
    reclaim();
  } catch (const std::bad_alloc&) {
    what = "out of memory";
  } catch (...) {
    what = "unexpected exception";
  }
  if (what == nullptr) return true;
  std::fprintf(stderr,
               "nvfs: reclaim of unlinked inode %" PRIu64 " failed (%s); it stays on the orphan "
               "list until its next use or the next mount\n",
               ino, what);
  return false;
}

}  // namespace

void FsImpl::UnpinNoThrow(CachedInode* inode) noexcept {
  ReportThrow(inode->ino, [&] { Unpin(inode); });
}

bool FsImpl::ReclaimIdleNoThrow(CachedInode* inode) noexcept {
  return ReportThrow(inode->ino, [&] { ReclaimIdle(inode); });
}

}  // namespace nvfs
