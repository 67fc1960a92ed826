// Growing a filesystem (nvfs-resize; doc/format.md "Growing", doc/integrity.md
// "Growing"): whole groups are added at the end of the namespace, the backup
// static superblock moves to the new last block, and the counters grow, in one
// journal transaction, so a crash leaves the old geometry or the new one.
#pragma once

#include <cstdint>
#include <functional>

#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

class Tx;

// Everything a grow writes, decided before anything is written.
struct GrowPlan {
  Geometry from;               // the geometry now
  Geometry to;                 // the grown one (Geometry::Grown)
  format::SuperStatic super{};  // the static half of `to`: `from`'s with its
                                // block, group and inode counts and checksum
  // Blocks of `from`'s last group that become free: its old backup block and
  // the blocks past its old end, up to the group's end or `to`'s backup block.
  uint64_t freed_first = 0;
  uint64_t freed_count = 0;
  uint64_t added_free_blocks = 0;  // freed_count + the new groups' data blocks
  uint64_t added_free_inodes = 0;  // the new groups' inodes
  bool grows() const { return to.block_count() > from.block_count(); }
};

// The plan for the filesystem whose static superblock is `super` (geometry
// `from`) to fill `namespace_size` bytes. EINVAL (one line) when that is
// smaller than the filesystem; a plan that does not grow() when it adds no
// whole usable block (a last group too short for its metadata is left out).
Result<GrowPlan> PlanGrow(const format::SuperStatic& super, const Geometry& from,
                          uint64_t namespace_size);

// Before a grow's transaction: makes the host back every block it stores to
// (the new groups' bitmaps and descriptors, the new backup block). ENOSPC
// when it cannot; nothing on the namespace has changed then.
Status BackGrow(Media& media, const GrowPlan& plan);

// The grow's stores, inside `tx` (a transaction of the journal of
// `plan.from`, whose allocation sink clears bits of the grown geometry). In
// this order, which recovery and FindSuper rely on (integrity.md, "Growing"):
//   1. logged: the primary static half's block_count..inode_count, then its
//      checksum (these must be the slot's first records: FindSuper applies
//      them to its copy of the primary before it knows any geometry);
//   2. logged: the static half at `to`'s backup place (past `from`'s end);
//   3. fresh: the new groups' block bitmaps, descriptors and inode bitmaps
//      (past `from`'s end, so no geometry that can be found sees them
//      before the commit);
//   4. logged: `from`'s last group descriptor (free count) and the dynamic
//      half (free counts, checksum), under the caller's lock of it;
//   5. a deferred free of `freed_first`..: last, since it is a valid record
//      only in the grown geometry (recovery of an uncommitted grow stops its
//      log there; that of a committed one reads every record before it).
// `progress` is called per new group. The caller commits.
void StoreGrow(Tx& tx, const GrowPlan& plan,
               const std::function<void(uint64_t done, uint64_t total)>& progress = {});

// The plan for growing the filesystem on `media`, not mounted and cleanly
// unmounted, to `namespace_size` bytes; nothing is written. Fails with one
// line: EUCLEAN when the superblock is damaged, the filesystem was not
// cleanly unmounted, has recorded errors or an unfinished journal (each
// says to run fsck.nvfs first), EROFS for unknown read-only features,
// EINVAL for a smaller size.
Result<GrowPlan> CheckGrowOffline(const Media& media, uint64_t namespace_size);

// Grows it (CheckGrowOffline, then BackGrow and one transaction of
// StoreGrow). REQUIRES: `media` maps at least `namespace_size` bytes (the
// caller extends an image first). The plan grown to is returned
// (plan.grows() false: nothing to do, nothing written).
Result<GrowPlan> GrowOffline(Media& media, uint64_t namespace_size,
                             const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace nvfs
