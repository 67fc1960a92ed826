// A mounted grow (FsImpl::Grow; doc/integrity.md section 12).
#include <cinttypes>
#include <cstring>

#include "fs/damage.hpp"
#include "fs/fs_impl.hpp"
#include "nvfs/resize.hpp"

namespace nvfs {

// Order: the media grows (the image extended, the new part mapped after the
// mapping, which does not move); the host backs what the grow stores; the
// allocator is told the grow's own free is of real data blocks; the grow's
// transaction (StoreGrow, an OrphanTx: orphan_mu_ guards the dynamic half)
// commits; only then does the allocator load the new groups and the
// geometry publish the new block and group counts, so no block or inode of
// the new space is handed out, and no pointer to one stored, before the grow
// is durable. A crash before the commit's fence recovers the old geometry
// (the bytes past its end are unused), after it the new one.
Result<Filesystem::GrowResult> FsImpl::Grow(uint64_t namespace_size) {
  if (read_only_) return MakeError(EROFS, "the filesystem is mounted read-only");
  std::lock_guard grow_lock(grow_mu_);
  GrowResult result;
  result.block_size = geometry_->block_size();
  result.old_blocks = result.new_blocks = geometry_->block_count();
  // Only a grow writes the static half, and grow_mu_ is held.
  format::SuperStatic super;
  std::memcpy(&super, media_->base() + format::kSuperStaticOffset, sizeof super);
  const Geometry now = *geometry_;
  Result<GrowPlan> plan = PlanGrow(super, now, namespace_size);
  if (!plan.ok()) return plan.take_error();
  if (!plan->grows()) return result;
  NVFS_TRY(media_->Grow(namespace_size));
  if (media_->size() < plan->to.bytes()) {
    return MakeError(ENOSPC, "the namespace maps %" PRIu64 " bytes, the grown filesystem needs %"
                     PRIu64, media_->size(), plan->to.bytes());
  }
  NVFS_TRY(BackGrow(*media_, *plan));
  NVFS_TRY(alloc_->BeginGrow(plan->to));
  Status committed;
  {
    OrphanTx tx(*this, "grow");
    tx.LockOrphans();  // the dynamic half
    StoreGrow(tx, *plan);
    committed = tx.Commit();
  }
  if (!committed.ok()) {
    alloc_->EndGrow();
    return committed.take_error();
  }
  alloc_->AddGroups(plan->to);
  geometry_->Publish(plan->to);
  alloc_->EndGrow();
  result.new_blocks = plan->to.block_count();
  result.added_free_blocks = plan->added_free_blocks;
  result.added_free_inodes = plan->added_free_inodes;
  return result;
}

}  // namespace nvfs
