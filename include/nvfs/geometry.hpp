// Geometry: where every region of an nvfs namespace lies, derived from the
// static superblock (or, for mkfs, from the namespace size and options).
// DRAM only; the on-media fields are in format.hpp.
#pragma once

#include <cstdint>

#include "nvfs/format.hpp"
#include "nvfs/media.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

// What mkfs asks for. Zero means "choose the default".
struct GeometryRequest {
  uint64_t namespace_size = 0;     // bytes available
  uint32_t block_size = 4096;
  uint64_t inode_count = 0;        // -N: total inodes wanted (rounded up)
  uint64_t bytes_per_inode = 0;    // -i: one inode per this many bytes (default 16 KiB)
  uint32_t journal_slots = 0;      // default kDefaultJournalSlots
  uint32_t journal_slot_size = 0;  // default kDefaultJournalSlotSize
  // Features to write: every known one unless a test asks for an image as an
  // older mkfs made it (0: the one-block xattrs of version 2.0).
  uint64_t feature_incompat = format::kIncompatKnown;
};

inline constexpr uint64_t kDefaultBytesPerInode = 16384;
inline constexpr uint32_t kDefaultJournalSlots = 16;
inline constexpr uint32_t kDefaultJournalSlotSize = 64 * 1024;
inline constexpr uint32_t kMaxJournalSlots = 1024;
inline constexpr uint32_t kMaxJournalSlotSize = 64u << 20;  // FromSuper refuses more
// Group 0 must hold, besides its metadata and the journal, the root directory,
// lost+found and some room to work: this many data blocks at least.
inline constexpr uint32_t kMinGroup0DataBlocks = 16;

// A geometry field a mounted grow changes while other threads read it
// (Geometry::Publish): an acquire load and a release store of one aligned
// word; copied by value like a plain field.
template <class T>
class GrowingField {
 public:
  GrowingField(T value = 0) : value_(value) {}  // NOLINT: a field's initialiser
  GrowingField(const GrowingField& other) : value_(other) {}
  GrowingField& operator=(const GrowingField& other) {
    __atomic_store_n(&value_, static_cast<T>(other), __ATOMIC_RELAXED);
    return *this;
  }
  GrowingField& operator=(T value) {
    __atomic_store_n(&value_, value, __ATOMIC_RELAXED);
    return *this;
  }
  operator T() const { return __atomic_load_n(&value_, __ATOMIC_ACQUIRE); }  // NOLINT
  void Publish(T value) { __atomic_store_n(&value_, value, __ATOMIC_RELEASE); }

 private:
  T value_;
};

class Geometry {
 public:
  // The layout mkfs would write. Fails with EINVAL for bad options and ENOSPC
  // (message names the minimum) when the namespace is too small.
  static Result<Geometry> Compute(const GeometryRequest& request);

  // The layout an existing static superblock describes, after checking that
  // every region it implies lies inside a namespace of `namespace_size` bytes
  // and that the fields agree with each other. Magic and checksum are checked
  // by the caller (superblock.hpp). Fails with EUCLEAN and a message.
  static Result<Geometry> FromSuper(const format::SuperStatic& sb, uint64_t namespace_size);

  // The geometry of this filesystem grown to fill a namespace of
  // `namespace_size` bytes (nvfs-resize, doc/format.md "Growing"): the same
  // block size, inodes per group, inode table and journal; block_count the
  // whole blocks of the namespace, less a last group too short for its own
  // metadata (as Compute leaves it out). EINVAL, with one line, when that
  // is fewer blocks than now (nvfs does not shrink); the same geometry when
  // it is no more; EFBIG past 2^32 groups.
  Result<Geometry> Grown(uint64_t namespace_size) const;

  // Makes this geometry `grown` (a mounted grow, after its transaction
  // committed), while others read it: block_count first, then group_count,
  // so a reader that sees the new group count sees the blocks of the new
  // groups (GroupBlocks never runs past block_count), and one that sees only
  // the new block count sees the old groups whole. REQUIRES: grown is
  // Grown() of this geometry; one publisher at a time.
  void Publish(const Geometry& grown) {
    block_count_.Publish(grown.block_count_);
    group_count_.Publish(grown.group_count_);
  }

  // Smallest namespace mkfs accepts for this block size with default options.
  static uint64_t MinNamespaceSize(uint32_t block_size);

  // Writes the geometry fields of `sb` (leaves identity fields alone).
  void FillSuper(format::SuperStatic* sb) const;

  uint32_t block_size() const { return block_size_; }
  uint32_t block_shift() const { return block_shift_; }
  uint64_t block_count() const { return block_count_; }
  uint64_t bytes() const { return block_count_ << block_shift_; }
  uint32_t blocks_per_group() const { return blocks_per_group_; }
  uint32_t inodes_per_group() const { return inodes_per_group_; }
  uint32_t group_count() const { return group_count_; }
  uint64_t inode_count() const { return uint64_t{group_count_} * inodes_per_group_; }
  uint32_t itable_blocks() const { return itable_blocks_; }
  uint32_t journal_slots() const { return journal_slots_; }
  uint32_t journal_slot_size() const { return journal_slot_size_; }
  uint64_t journal_block() const { return journal_block_; }
  uint32_t journal_blocks() const { return journal_blocks_; }
  uint32_t pointers_per_block() const { return block_size_ / 8; }
  // The superblock's incompatible features (all known ones: FromSuper
  // refuses others); Compute gives what mkfs writes, every known feature.
  uint64_t feature_incompat() const { return feature_incompat_; }
  // Extended attributes as a chain of blocks (format::kIncompatXattrChain).
  bool xattr_chain() const { return (feature_incompat_ & format::kIncompatXattrChain) != 0; }

  uint64_t BlockOffset(uint64_t block_no) const { return block_no << block_shift_; }
  uint64_t GroupFirstBlock(uint32_t group) const {
    return uint64_t{group} * blocks_per_group_;
  }
  // Blocks in `group` (the last group may be short).
  uint64_t GroupBlocks(uint32_t group) const;
  // Metadata blocks at the start of `group`, superblock and journal included.
  uint64_t GroupMetaBlocks(uint32_t group) const;
  uint64_t BlockBitmapBlock(uint32_t group) const { return MetaStart(group); }
  uint64_t GroupDescBlock(uint32_t group) const { return MetaStart(group) + 1; }
  uint64_t InodeBitmapBlock(uint32_t group) const { return MetaStart(group) + 2; }
  uint64_t InodeTableBlock(uint32_t group) const { return MetaStart(group) + 3; }
  uint64_t FirstDataBlock(uint32_t group) const {
    return GroupFirstBlock(group) + GroupMetaBlocks(group);
  }
  // True if `block_no` names a data block of some group: inside the
  // filesystem and not the superblock, a bitmap, a group descriptor, an inode
  // table, the journal or the backup superblock block. Arithmetic only (no
  // bitmap is read), so it is cheap enough for every pointer read from the
  // media before it is followed or freed: the one check of "what a pointer
  // points at" that the core and fsck share. Block 0 is never a data block.
  bool IsDataBlock(uint64_t block_no) const {
    if (block_no >= block_count_ - 1) return false;  // past the end, or the backup block
    const uint64_t group = block_no >> group_shift_;
    const uint64_t meta = group == 0 ? group0_meta_blocks_ : meta_blocks_;
    return (block_no & (uint64_t{blocks_per_group_} - 1)) >= meta;
  }
  // The end of the run of data blocks holding data block `block_no`: the
  // next group's first (metadata) block, or the backup block. A contiguous
  // run of pointers that starts at a data block is one of data blocks only
  // while it stays below this. REQUIRES: IsDataBlock(block_no).
  uint64_t DataRunEnd(uint64_t block_no) const {
    const uint64_t next_group = ((block_no >> group_shift_) + 1) << group_shift_;
    return next_group < block_count_ - 1 ? next_group : block_count_ - 1;
  }
  // True if [first, first + count) are all data blocks (one run: it cannot
  // span a group's metadata).
  bool IsDataRun(uint64_t first, uint64_t count) const {
    return count != 0 && IsDataBlock(first) && count <= DataRunEnd(first) - first;
  }
  // The last block of the namespace; its last 2048 bytes hold the static
  // superblock copy.
  uint64_t BackupBlock() const { return block_count_ - 1; }
  uint64_t BackupSuperOffset() const { return bytes() - format::kSuperHalfSize; }

  uint32_t InodeGroup(uint64_t ino) const {
    return static_cast<uint32_t>(ino / inodes_per_group_);
  }
  uint64_t InodeOffset(uint64_t ino) const {
    const uint32_t group = InodeGroup(ino);
    return BlockOffset(InodeTableBlock(group)) +
           (ino % inodes_per_group_) * uint64_t{format::kInodeSize};
  }
  uint64_t JournalSlotOffset(uint32_t slot) const {
    return BlockOffset(journal_block_) + uint64_t{slot} * journal_slot_size_;
  }

 private:
  uint64_t MetaStart(uint32_t group) const {
    return GroupFirstBlock(group) + (group == 0 ? 1 : 0);
  }
  Status Check() const;  // every region inside block_count, groups big enough
  void DeriveShortcuts();  // the fields below, from the ones above


  uint32_t block_size_ = 0;
  uint32_t block_shift_ = 0;
  GrowingField<uint64_t> block_count_ = 0;  // grows (Publish)
  uint32_t blocks_per_group_ = 0;
  uint32_t inodes_per_group_ = 0;
  GrowingField<uint32_t> group_count_ = 0;  // grows (Publish)
  uint32_t itable_blocks_ = 0;
  uint32_t journal_slots_ = 0;
  uint32_t journal_slot_size_ = 0;
  uint64_t journal_block_ = 0;
  uint32_t journal_blocks_ = 0;
  uint64_t feature_incompat_ = format::kIncompatKnown;
  // Derived, for IsDataBlock: log2(blocks_per_group) and GroupMetaBlocks of
  // group 0 and of the others.
  uint32_t group_shift_ = 0;
  uint64_t group0_meta_blocks_ = 0;
  uint64_t meta_blocks_ = 0;
};

// Makes the host back every region that is stored to outside allocation
// (Media::Back): the superblock block, each group's bitmaps and descriptor,
// the journal and the backup superblock block. mkfs calls it before it
// writes them and a read-write mount before recovery (an image that was
// copied sparse, or made by an older mkfs). Inode tables are left sparse:
// the allocator backs an inode's bytes when it hands the inode out, and data
// blocks when it hands them out. ENOSPC when the host is full.
Status BackMetadata(Media& media, const Geometry& g);

}  // namespace nvfs
