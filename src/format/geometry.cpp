#include "nvfs/geometry.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cinttypes>

namespace nvfs {

namespace {

using format::kInodeSize;

constexpr uint64_t DivRoundUp(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

bool ValidBlockSize(uint64_t block_size) {
  return std::has_single_bit(block_size) && block_size >= format::kMinBlockSize &&
         block_size <= format::kMaxBlockSize;
}

uint32_t JournalBlocks(uint32_t slots, uint32_t slot_size, uint32_t block_size) {
  return static_cast<uint32_t>(DivRoundUp(uint64_t{slots} * slot_size, block_size));
}

// Metadata blocks of the last group plus the backup superblock block.
uint64_t LastGroupMinimum(uint64_t meta_blocks) { return meta_blocks + 1; }

}  // namespace

uint64_t Geometry::GroupBlocks(uint32_t group) const {
  const uint64_t first = GroupFirstBlock(group);
  return std::min<uint64_t>(blocks_per_group_, block_count_ - first);
}

uint64_t Geometry::GroupMetaBlocks(uint32_t group) const {
  uint64_t blocks = 3 + uint64_t{itable_blocks_};
  if (group == 0) blocks += 1 + journal_blocks_;
  return blocks;
}

void Geometry::DeriveShortcuts() {
  group_shift_ = static_cast<uint32_t>(std::countr_zero(blocks_per_group_));
  group0_meta_blocks_ = GroupMetaBlocks(0);
  meta_blocks_ = GroupMetaBlocks(1);
}

uint64_t Geometry::MinNamespaceSize(uint32_t block_size) {
  const uint64_t bs = std::max<uint32_t>(block_size, format::kMinBlockSize);
  const uint64_t per_block = bs / kInodeSize;
  const uint64_t fixed = 1 + 3 +
                         JournalBlocks(kDefaultJournalSlots, kDefaultJournalSlotSize,
                                       static_cast<uint32_t>(bs)) +
                         kMinGroup0DataBlocks;
  // The inode table grows with the namespace (one inode per
  // kDefaultBytesPerInode), so the minimum is the smallest size whose own
  // inode table fits: iterate from one table block up to the fixed point.
  uint64_t itable_blocks = 1;
  for (;;) {
    const uint64_t size = (fixed + itable_blocks) * bs;
    const uint64_t inodes = std::max<uint64_t>(size / kDefaultBytesPerInode, 16);
    const uint64_t need = DivRoundUp(inodes, per_block);
    if (need <= itable_blocks) return size;
    itable_blocks = need;
  }
}

Result<Geometry> Geometry::Compute(const GeometryRequest& request) {
  Geometry g;
  const uint64_t bs = request.block_size;
  if (!ValidBlockSize(bs)) {
    return MakeError(EINVAL, "invalid block size %" PRIu64 ": must be a power of two from %u to %u",
                     bs, format::kMinBlockSize, format::kMaxBlockSize);
  }
  const long page = sysconf(_SC_PAGESIZE);
  if (page > 0 && bs < static_cast<uint64_t>(page)) {
    return MakeError(EINVAL, "invalid block size %" PRIu64 ": smaller than the page size %ld",
                     bs, page);
  }
  g.block_size_ = static_cast<uint32_t>(bs);
  g.feature_incompat_ = request.feature_incompat & format::kIncompatKnown;
  g.block_shift_ = static_cast<uint32_t>(std::countr_zero(bs));
  g.blocks_per_group_ = g.block_size_ * 8;
  g.journal_slots_ = request.journal_slots ? request.journal_slots : kDefaultJournalSlots;
  g.journal_slot_size_ =
      request.journal_slot_size ? request.journal_slot_size : kDefaultJournalSlotSize;
  if (g.journal_slots_ > kMaxJournalSlots || g.journal_slot_size_ % 64 != 0 ||
      g.journal_slot_size_ < 4096 || g.journal_slot_size_ > kMaxJournalSlotSize) {
    return MakeError(EINVAL, "invalid journal geometry: %u slots of %u bytes",
                     g.journal_slots_, g.journal_slot_size_);
  }
  g.journal_blocks_ = JournalBlocks(g.journal_slots_, g.journal_slot_size_, g.block_size_);

  const uint64_t minimum = MinNamespaceSize(g.block_size_) +
                           (uint64_t{g.journal_blocks_} -
                            JournalBlocks(kDefaultJournalSlots, kDefaultJournalSlotSize,
                                          g.block_size_)) * bs;
  if (request.namespace_size < minimum) {
    return MakeError(ENOSPC,
                     "namespace too small: %" PRIu64 " bytes; with %" PRIu64
                     "-byte blocks nvfs needs at least %" PRIu64 " bytes",
                     request.namespace_size, bs, minimum);
  }
  g.block_count_ = std::min(request.namespace_size / bs, format::kMaxBlockCount);
  uint64_t groups = DivRoundUp(g.block_count_, g.blocks_per_group_);
  if (groups > UINT32_MAX) {
    return MakeError(EFBIG, "namespace too large for %" PRIu64 "-byte blocks", bs);
  }

  // Inodes: spread evenly over the groups, a whole number of inode-table blocks
  // per group, at most one inode-bitmap block's worth.
  const uint64_t per_block = bs / kInodeSize;
  uint64_t wanted = request.inode_count;
  if (wanted == 0) {
    const uint64_t ratio = request.bytes_per_inode ? request.bytes_per_inode
                                                   : kDefaultBytesPerInode;
    if (ratio < kInodeSize) {
      return MakeError(EINVAL, "bytes per inode %" PRIu64 " is below the inode size %u", ratio,
                       kInodeSize);
    }
    wanted = std::max<uint64_t>(request.namespace_size / ratio, 16);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    uint64_t ipg = DivRoundUp(DivRoundUp(wanted, groups), per_block) * per_block;
    if (ipg > g.blocks_per_group_) {
      if (request.inode_count != 0) {
        return MakeError(EINVAL, "%" PRIu64 " inodes do not fit: at most %" PRIu64
                         " with this size and block size", wanted,
                         groups * g.blocks_per_group_);
      }
      ipg = g.blocks_per_group_;
    }
    g.inodes_per_group_ = static_cast<uint32_t>(ipg);
    g.itable_blocks_ = static_cast<uint32_t>(ipg / per_block);
    g.journal_block_ = g.InodeTableBlock(0) + g.itable_blocks_;
    g.group_count_ = static_cast<uint32_t>(groups);
    // A last group too short for its own metadata (and the backup block) is
    // left out of the filesystem.
    const uint32_t last = g.group_count_ - 1;
    if (last > 0 && g.GroupBlocks(last) < LastGroupMinimum(g.GroupMetaBlocks(last))) {
      g.block_count_ = uint64_t{last} * g.blocks_per_group_;
      groups = last;
      continue;
    }
    break;
  }
  g.DeriveShortcuts();
  NVFS_TRY(g.Check());
  return g;
}

Result<Geometry> Geometry::Grown(uint64_t namespace_size) const {
  Geometry g = *this;
  g.block_count_ = std::min(namespace_size >> block_shift_, format::kMaxBlockCount - 1);
  if (g.block_count_ < block_count_) {
    return MakeError(EINVAL, "%" PRIu64 " bytes hold %" PRIu64 " blocks of %u bytes, fewer than "
                     "the filesystem's %" PRIu64 ": nvfs cannot shrink",
                     namespace_size, uint64_t{g.block_count_}, block_size_, uint64_t{block_count_});
  }
  uint64_t groups = DivRoundUp(g.block_count_, blocks_per_group_);
  if (groups > UINT32_MAX) {
    return MakeError(EFBIG, "%" PRIu64 " bytes need more than 2^32 groups of %u-byte blocks",
                     namespace_size, block_size_);
  }
  g.group_count_ = static_cast<uint32_t>(groups);
  // A last new group too short for its metadata and the backup block is left
  // out; the groups there already always fit (Check held for them).
  const uint32_t last = g.group_count_ - 1;
  if (last >= group_count_ &&
      g.GroupBlocks(last) < LastGroupMinimum(g.GroupMetaBlocks(last))) {
    g.block_count_ = uint64_t{last} * blocks_per_group_;
    g.group_count_ = last;
  }
  if (g.block_count_ <= block_count_) return *this;
  g.DeriveShortcuts();
  NVFS_TRY(g.Check());
  return g;
}

Status Geometry::Check() const {
  if (group_count_ == 0 || inodes_per_group_ == 0) {
    return MakeError(EUCLEAN, "empty geometry");
  }
  // Group 0 holds superblock, metadata, journal, and the first directories.
  const uint64_t g0_need = GroupMetaBlocks(0) + kMinGroup0DataBlocks;
  if (GroupBlocks(0) < g0_need) {
    return MakeError(ENOSPC, "group 0 has %" PRIu64 " blocks, needs %" PRIu64,
                     GroupBlocks(0), g0_need);
  }
  const uint32_t last = group_count_ - 1;
  if (GroupBlocks(last) < LastGroupMinimum(GroupMetaBlocks(last))) {
    return MakeError(EUCLEAN, "last group has %" PRIu64 " blocks, fewer than its metadata",
                     GroupBlocks(last));
  }
  return Status::Ok();
}

Result<Geometry> Geometry::FromSuper(const format::SuperStatic& sb, uint64_t namespace_size) {
  auto bad = [](const char* what) {
    return MakeError(EUCLEAN, "superblock geometry is inconsistent: %s", what);
  };
  Geometry g;
  if (!ValidBlockSize(sb.block_size)) return bad("block size");
  if (sb.block_shift != static_cast<uint32_t>(std::countr_zero(sb.block_size))) {
    return bad("block shift");
  }
  g.block_size_ = sb.block_size;
  g.block_shift_ = sb.block_shift;
  if (sb.block_count == 0 || sb.block_count >= format::kMaxBlockCount) return bad("block count");
  if (sb.block_count > namespace_size / sb.block_size) {
    return MakeError(EUCLEAN, "superblock says %" PRIu64 " blocks of %u bytes, but the namespace "
                     "holds only %" PRIu64 " bytes (truncated image?)",
                     sb.block_count, sb.block_size, namespace_size);
  }
  g.block_count_ = sb.block_count;
  if (sb.blocks_per_group != sb.block_size * 8) return bad("blocks per group");
  g.blocks_per_group_ = sb.blocks_per_group;
  if (sb.group_count != DivRoundUp(sb.block_count, sb.blocks_per_group)) return bad("group count");
  g.group_count_ = sb.group_count;
  if (sb.inode_size != kInodeSize) return bad("inode size");
  const uint32_t per_block = sb.block_size / kInodeSize;
  if (sb.inodes_per_group == 0 || sb.inodes_per_group % per_block != 0 ||
      sb.inodes_per_group > sb.blocks_per_group) {
    return bad("inodes per group");
  }
  g.inodes_per_group_ = sb.inodes_per_group;
  if (sb.inode_count != uint64_t{sb.group_count} * sb.inodes_per_group) return bad("inode count");
  if (sb.itable_blocks != sb.inodes_per_group / per_block) return bad("inode table size");
  g.itable_blocks_ = sb.itable_blocks;
  if (sb.journal_slots == 0 || sb.journal_slots > kMaxJournalSlots ||
      sb.journal_slot_size % 64 != 0 || sb.journal_slot_size < 4096 ||
      sb.journal_slot_size > kMaxJournalSlotSize) {
    return bad("journal slots");
  }
  g.journal_slots_ = sb.journal_slots;
  g.journal_slot_size_ = sb.journal_slot_size;
  if (sb.journal_blocks != JournalBlocks(sb.journal_slots, sb.journal_slot_size, sb.block_size)) {
    return bad("journal size");
  }
  g.journal_blocks_ = sb.journal_blocks;
  g.journal_block_ = g.InodeTableBlock(0) + g.itable_blocks_;
  if (sb.journal_block != g.journal_block_) return bad("journal location");
  if (sb.root_ino != format::kRootIno) return bad("root inode");
  g.feature_incompat_ = sb.feature_incompat;
  g.DeriveShortcuts();
  Status st = g.Check();
  if (!st.ok()) return bad(st.error().message.c_str());
  return g;
}

void Geometry::FillSuper(format::SuperStatic* sb) const {
  sb->feature_incompat = feature_incompat_;
  sb->block_size = block_size_;
  sb->block_shift = block_shift_;
  sb->block_count = block_count_;
  sb->blocks_per_group = blocks_per_group_;
  sb->inodes_per_group = inodes_per_group_;
  sb->group_count = group_count_;
  sb->inode_size = kInodeSize;
  sb->inode_count = inode_count();
  sb->itable_blocks = itable_blocks_;
  sb->journal_slots = journal_slots_;
  sb->journal_block = InodeTableBlock(0) + itable_blocks_;
  sb->journal_slot_size = journal_slot_size_;
  sb->journal_blocks = journal_blocks_;
  sb->root_ino = format::kRootIno;
}

Status BackMetadata(Media& media, const Geometry& g) {
  NVFS_TRY(media.Back(0, g.block_size()));
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    // Block bitmap, descriptor, inode bitmap: three blocks in a row.
    NVFS_TRY(media.Back(g.BlockOffset(g.BlockBitmapBlock(group)), 3 * uint64_t{g.block_size()}));
  }
  NVFS_TRY(media.Back(g.BlockOffset(g.journal_block()),
                      uint64_t{g.journal_blocks()} * g.block_size()));
  return media.Back(g.BlockOffset(g.BackupBlock()), g.block_size());
}

}  // namespace nvfs
