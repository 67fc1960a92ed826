// Growing a filesystem: the plan and the transaction (include/nvfs/resize.hpp;
// the order of stores and why each crash point is safe: doc/integrity.md,
// "Growing").
#include "nvfs/resize.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstddef>
#include <cstring>
#include <vector>

#include "journal/journal.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs {

namespace {

using format::GroupDesc;
using format::SuperDynamic;
using format::SuperStatic;

// The first and one-past-last byte of the primary's fields a grow changes
// (block_count, blocks_per_group, inodes_per_group, group_count, inode_size,
// inode_count: one range, two of them unchanged).
constexpr uint64_t kGeometryFirst = offsetof(SuperStatic, block_count);
constexpr uint64_t kGeometryEnd = offsetof(SuperStatic, inode_count) + sizeof(uint64_t);
static_assert(kGeometryFirst == 48 && kGeometryEnd == 80);

// Free data blocks of a group that a grow adds whole (never group 0).
uint64_t NewGroupFreeBlocks(const Geometry& g, uint32_t group) {
  const bool last = group == g.group_count() - 1;
  return g.GroupBlocks(group) - g.GroupMetaBlocks(group) - (last ? 1 : 0);
}

// The sink of an offline grow's one free: clears the bits on the media. There
// is no allocator to tell.
class MediaSink final : public AllocationSink {
 public:
  MediaSink(Media& media, const Geometry& g) : media_(media), g_(g) {}
  void ClearOnMedia(BitmapKind kind, uint64_t first, uint64_t count) override {
    ClearMediaBits(media_, g_, kind, first, count);
  }
  void Release(BitmapKind, uint64_t, uint64_t) override {}
  void ReleaseFreed(BitmapKind, uint64_t, uint64_t) override {}

 private:
  Media& media_;
  const Geometry& g_;
};

}  // namespace

Result<GrowPlan> PlanGrow(const SuperStatic& super, const Geometry& from,
                          uint64_t namespace_size) {
  GrowPlan plan;
  plan.from = from;
  Result<Geometry> to = from.Grown(namespace_size);
  if (!to.ok()) return to.take_error();
  plan.to = to.value();
  plan.super = super;
  if (!plan.grows()) return plan;
  const Geometry& f = plan.from;
  const Geometry& t = plan.to;
  t.FillSuper(&plan.super);
  plan.super.checksum = SuperStaticChecksum(plan.super);

  // The old last group: its backup block and the blocks past its old end
  // become data blocks, up to the group's end or the new backup block.
  const uint32_t last = f.group_count() - 1;
  const uint64_t group_end = f.GroupFirstBlock(last) + f.blocks_per_group();
  const uint64_t free_end = t.block_count() <= group_end ? t.BackupBlock() : group_end;
  plan.freed_first = f.BackupBlock();
  plan.freed_count = free_end - plan.freed_first;
  plan.added_free_blocks = plan.freed_count;
  for (uint32_t group = f.group_count(); group < t.group_count(); ++group) {
    plan.added_free_blocks += NewGroupFreeBlocks(t, group);
  }
  plan.added_free_inodes =
      uint64_t{t.group_count() - f.group_count()} * t.inodes_per_group();
  return plan;
}

Status BackGrow(Media& media, const GrowPlan& plan) {
  const Geometry& t = plan.to;
  if (t.bytes() > media.size()) {
    return MakeError(ENOSPC, "%s: the namespace holds %" PRIu64 " bytes, the grown filesystem "
                     "needs %" PRIu64, media.path().c_str(), media.size(), t.bytes());
  }
  for (uint32_t group = plan.from.group_count(); group < t.group_count(); ++group) {
    NVFS_TRY(media.Back(t.BlockOffset(t.BlockBitmapBlock(group)), 3 * uint64_t{t.block_size()}));
  }
  return media.Back(t.BlockOffset(t.BackupBlock()), t.block_size());
}

// The store order is the header's (resize.hpp, StoreGrow); integrity.md,
// "Growing", says why each crash point leaves one geometry or the other.
void StoreGrow(Tx& tx, const GrowPlan& plan,
               const std::function<void(uint64_t, uint64_t)>& progress) {
  const Geometry& f = plan.from;
  const Geometry& t = plan.to;
  Media& media = tx.media();
  const std::byte* base = media.base();

  // 1. The primary: its geometry fields, then its checksum. Until the commit
  // these records make FindSuper and recovery restore the old ones.
  tx.Store(kGeometryFirst, reinterpret_cast<const std::byte*>(&plan.super) + kGeometryFirst,
           kGeometryEnd - kGeometryFirst);
  tx.Store(offsetof(SuperStatic, checksum), &plan.super.checksum, sizeof plan.super.checksum);

  // 2. The backup copy where the grown geometry keeps it.
  tx.Store(t.BackupSuperOffset(), &plan.super, sizeof plan.super);

  // 3. The new groups, fresh: nothing any geometry recovery can find points
  // into them before the commit.
  const uint64_t bs = t.block_size();
  std::vector<std::byte> block(bs);
  const uint64_t total = t.group_count() - f.group_count();
  for (uint32_t group = f.group_count(); group < t.group_count(); ++group) {
    std::fill(block.begin(), block.end(), std::byte{0});
    SetBitsInBuffer(block.data(), 0, t.GroupMetaBlocks(group));
    const uint64_t blocks = t.GroupBlocks(group);
    if (blocks < t.blocks_per_group()) {
      SetBitsInBuffer(block.data(), blocks, t.blocks_per_group() - blocks);
    }
    if (group == t.group_count() - 1) {
      SetBitsInBuffer(block.data(), t.BackupBlock() - t.GroupFirstBlock(group), 1);
    }
    tx.StoreFresh(t.BlockOffset(t.BlockBitmapBlock(group)), block.data(), bs);

    std::fill(block.begin(), block.end(), std::byte{0});
    SetBitsInBuffer(block.data(), t.inodes_per_group(),
                    t.blocks_per_group() - t.inodes_per_group());
    tx.StoreFresh(t.BlockOffset(t.InodeBitmapBlock(group)), block.data(), bs);

    std::fill(block.begin(), block.end(), std::byte{0});
    GroupDesc desc{};
    desc.magic = format::kGroupDescMagic;
    desc.group = group;
    desc.free_blocks = static_cast<uint32_t>(NewGroupFreeBlocks(t, group));
    desc.free_inodes = t.inodes_per_group();
    desc.checksum = GroupDescChecksum(desc);
    std::memcpy(block.data(), &desc, sizeof desc);
    tx.StoreFresh(t.BlockOffset(t.GroupDescBlock(group)), block.data(), bs);
    if (progress) progress(group - f.group_count() + 1, total);
  }

  // 4. The counters: the old last group's descriptor, the dynamic half.
  const uint32_t last = f.group_count() - 1;
  const uint64_t desc_offset = f.BlockOffset(f.GroupDescBlock(last));
  GroupDesc desc;
  std::memcpy(&desc, base + desc_offset, sizeof desc);
  desc.free_blocks += static_cast<uint32_t>(plan.freed_count);
  desc.checksum = GroupDescChecksum(desc);
  tx.Store(desc_offset, &desc, sizeof desc);

  SuperDynamic dyn;
  std::memcpy(&dyn, base + format::kSuperDynamicOffset, sizeof dyn);
  dyn.free_blocks += plan.added_free_blocks;
  dyn.free_inodes += plan.added_free_inodes;
  dyn.checksum = SuperDynamicChecksum(dyn);
  const auto* dyn_bytes = reinterpret_cast<const std::byte*>(&dyn);
  constexpr uint64_t kCountsFirst = offsetof(SuperDynamic, free_blocks);
  constexpr uint64_t kCountsEnd = offsetof(SuperDynamic, free_inodes) + sizeof(uint64_t);
  tx.Store(format::kSuperDynamicOffset + kCountsFirst, dyn_bytes + kCountsFirst,
           kCountsEnd - kCountsFirst);
  tx.Store(format::kSuperDynamicOffset + offsetof(SuperDynamic, checksum), &dyn.checksum,
           sizeof dyn.checksum);

  // 5. The old backup block and the blocks past the old end: freed once
  // committed, in the grown geometry.
  (void)tx.LogDeferredFree(BitmapKind::kBlocks, plan.freed_first, plan.freed_count);
}

Result<GrowPlan> CheckGrowOffline(const Media& media, uint64_t namespace_size) {
  Result<FoundSuper> found = FindSuper(media.base(), media.size());
  if (!found.ok()) return found.take_error();
  if (found->from_backup) {
    return MakeError(EUCLEAN, "the primary superblock is damaged (%s); run fsck.nvfs first",
                     found->primary_error.c_str());
  }
  if (UnknownRoCompat(found->sb) != 0) {
    return MakeError(EROFS, "unknown read-only-compatible features 0x%" PRIx64
                     ": this nvfs may not write the namespace", UnknownRoCompat(found->sb));
  }
  const Geometry& g = found->geometry;
  SuperDynamic dyn;
  std::memcpy(&dyn, media.base() + format::kSuperDynamicOffset, sizeof dyn);
  Status dyn_ok = CheckSuperDynamic(dyn);
  if (!dyn_ok.ok()) {
    return MakeError(EUCLEAN, "%s; run fsck.nvfs first", dyn_ok.error().message.c_str());
  }
  if (dyn.state != static_cast<uint32_t>(format::FsState::kClean) || found->grow_undone) {
    return MakeError(EUCLEAN, "the filesystem was not cleanly unmounted; run fsck.nvfs first");
  }
  if (dyn.errors != 0) {
    return MakeError(EUCLEAN, "the filesystem has recorded errors; run fsck.nvfs first");
  }
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    format::JournalSlotHeader header;
    std::memcpy(&header, media.base() + g.JournalSlotOffset(slot), sizeof header);
    if (header.state != static_cast<uint32_t>(format::JournalState::kIdle)) {
      return MakeError(EUCLEAN, "the journal holds unfinished operations; run fsck.nvfs first");
    }
  }
  return PlanGrow(found->sb, g, namespace_size);
}

Result<GrowPlan> GrowOffline(Media& media, uint64_t namespace_size,
                             const std::function<void(uint64_t, uint64_t)>& progress) {
  Result<GrowPlan> plan = CheckGrowOffline(media, namespace_size);
  if (!plan.ok() || !plan->grows()) return plan;
  NVFS_TRY(BackGrow(media, *plan));
  Journal journal(media, plan->from);
  // Every slot is idle: this only finds the next sequence number.
  Result<Journal::RecoveryStats> recovered = journal.Recover();
  if (!recovered.ok()) return recovered.take_error();
  MediaSink sink(media, plan->to);
  journal.set_sink(&sink);
  Tx tx(journal, "grow");
  StoreGrow(tx, *plan, progress);
  NVFS_TRY(tx.Commit());
  return plan;
}

}  // namespace nvfs
