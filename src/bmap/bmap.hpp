// File block mapping ("bmap"): file block index -> physical block, over an
// inode's InodeFileMap (format.hpp): 11 direct pointers, then trees of depth
// 1..5. Lookups return physical runs so reads copy whole runs at once.
//
// Contracts shared by every function here:
//  - `inode` is a reference INTO THE MAPPING (ctx.InodeAt(ino)), so Tx::Set can
//    log its fields. The caller holds the inode's lock: shared for Lookup and
//    the Next* functions, exclusive for anything taking a Tx.
//  - Nothing here trusts the media: a pointer that names no data block
//    (Geometry::IsDataBlock: outside the filesystem, or a superblock, bitmap,
//    group descriptor, inode table or journal block) or a tree deeper than
//    the format allows is reported as corruption (kCorrupt / EUCLEAN), never
//    followed and never freed; a contiguous run never extends past its
//    group's data blocks. MapForWrite, Truncate and Punch report the damage
//    they meet to ctx.damage; Lookup and the Next* functions, which run
//    without a lock under a retry, leave that to their caller.
//  - Changes follow write-before-publish (doc/integrity.md): a missing branch
//    is allocated and initialised aside (fresh stores), then linked with one
//    logged 8-byte store; blocks are freed only through deferred-free records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ctx/context.hpp"
#include "journal/journal.hpp"
#include "nvfs/format.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

class Bmap {
 public:
  static constexpr uint64_t kCorrupt = ~uint64_t{0};

  explicit Bmap(const FsContext& ctx);

  // Number of file blocks the format can address with this block size
  // (11 + p + p^2 + ... + p^5, p = block_size / 8), saturated at 2^63 / block_size.
  uint64_t max_blocks() const { return max_blocks_; }
  // The largest size a file may have (FileMapLayout::max_size: the bytes of
  // max_blocks(), at most 2^63 - 1), the one limit on every size and offset
  // the core accepts: write, truncate, fallocate. fsck checks sizes against
  // the same function.
  uint64_t max_size() const { return max_size_; }

  // The physical block holding file block `index`, or 0 for a hole, or
  // kCorrupt. *run is set to the number of file blocks from `index` (1 ..
  // max_run) that are physically contiguous with it (for a hole: that are
  // holes too). REQUIRES: max_run >= 1, index < max_blocks().
  uint64_t Lookup(const format::Inode& inode, uint64_t index, uint64_t max_run,
                  uint64_t* run) const;

  // Makes file blocks [index, index + count) mapped, allocating what is
  // missing (data blocks zero-filled when `zero_new`; pointer blocks always
  // zeroed), preferring physically contiguous runs that continue the file's
  // previous block. Returns the physical run starting at `index`: first =
  // physical block, count = 1 .. count blocks mapped contiguously from there
  // (the caller loops for the rest). Updates inode.blocks. ENOSPC when no
  // block is free, EFBIG past max_blocks(), EUCLEAN on corruption.
  // One call maps at most one direct range or one pointer block's worth, and
  // fewer blocks when the journal slot runs low (it keeps kMapReserve bytes
  // for the caller); ENOSPC with the message "journal slot full" when not even
  // one block fits: the Tx is still good, commit it and go on in a new one.
  // A failed call leaves nothing behind (blocks it took are freed through the
  // Tx), so the caller may abort, or commit what earlier calls mapped.
  Result<Extent> MapForWrite(Tx& tx, const format::Inode& inode, uint64_t index, uint64_t count,
                             bool zero_new);

  // Unmaps and frees every block at file block >= `from` (and pointer blocks
  // left empty). Stops early, leaving a consistent state, when the journal
  // slot runs low; returns true when everything is done, false if the caller
  // must continue in a new transaction. Updates inode.blocks.
  // "Low" is kTruncateReserve bytes plus the cost of the next step, so a
  // fresh transaction always makes progress; on a nearly full one it may
  // return false having done nothing. On EUCLEAN the work logged so far is
  // still self-consistent, but the caller should abort.
  Result<bool> Truncate(Tx& tx, const format::Inode& inode, uint64_t from);

  // Unmaps and frees file blocks [first, first + count), as Truncate does
  // (same early-stop contract).
  Result<bool> Punch(Tx& tx, const format::Inode& inode, uint64_t first, uint64_t count);

  // First mapped file block >= index and < limit, or `limit` (SEEK_DATA).
  uint64_t NextMapped(const format::Inode& inode, uint64_t index, uint64_t limit) const;
  // First hole file block >= index and < limit, or `limit` (SEEK_HOLE).
  // Both treat a corrupt pointer as data (never as a hole), so a copy that
  // skips holes still reads it and sees EUCLEAN.
  uint64_t NextHole(const format::Inode& inode, uint64_t index, uint64_t limit) const;

  // Journal bytes MapForWrite leaves for the caller's own stores.
  static constexpr size_t kMapReserve = 512;
  // Journal bytes Truncate and Punch leave when they stop early.
  static constexpr size_t kTruncateReserve = 1024;

 private:
  struct Span;      // where a file block's pointer lies, for reading (bmap.cpp)
  struct Branch;    // the path to a file block, for changing it
  struct Punching;  // the state of one Punch or Truncate call

  // The bodies of MapForWrite and Punch, which report what they return.
  Result<Extent> MapRange(Tx& tx, const format::Inode& inode, uint64_t index, uint64_t count,
                          bool zero_new);
  Result<bool> PunchRange(Tx& tx, const format::Inode& inode, uint64_t first, uint64_t count);
  Span Resolve(const format::Inode& inode, uint64_t index) const;
  uint64_t NextOf(const format::Inode& inode, uint64_t index, uint64_t limit, bool mapped) const;
  Status Walk(const format::Inode& inode, uint64_t index, Branch* branch) const;
  uint64_t FindGoal(const format::Inode& inode, uint64_t index, const Branch& branch) const;
  Result<Extent> FillHoles(Tx& tx, const format::Inode& inode, const Branch& branch,
                           uint64_t holes, uint64_t goal, bool zero_new);
  Result<Extent> AddBranch(Tx& tx, const format::Inode& inode, const Branch& branch,
                           uint64_t count, uint64_t goal, bool zero_new);
  Status PunchArray(Punching& punch, uint64_t array_at, uint64_t slots, uint32_t height,
                    uint64_t base);
  Result<bool> FreeSubtree(Punching& punch, uint64_t block_no, uint32_t height);
  Result<bool> CollectSubtree(uint64_t block_no, uint32_t height, size_t limit,
                              std::vector<Extent>* extents) const;
  Status Free(Punching& punch, Extent extent);
  bool AllZero(uint64_t block_no) const;

  const uint64_t* BlockAt(uint64_t block_no) const {
    return reinterpret_cast<const uint64_t*>(base_ + (block_no << block_shift_));
  }
  const uint64_t* WordAt(uint64_t offset) const {
    return reinterpret_cast<const uint64_t*>(base_ + offset);
  }
  uint64_t OffsetOf(const void* in_mapping) const {
    return static_cast<uint64_t>(static_cast<const std::byte*>(in_mapping) - base_);
  }
  uint64_t InoOf(const format::Inode& inode) const;  // for messages
  Error Corrupt(const format::Inode& inode, uint64_t index, uint64_t block_no) const;

  const FsContext& ctx_;
  const Geometry& geometry_;  // IsDataBlock: what every pointer followed must name
  const std::byte* base_;     // the mapping (ctx_.media.base(); it never moves)
  uint32_t block_shift_;
  uint32_t pshift_;           // log2(pointers per block) = block_shift - 3
  uint64_t ptrs_;             // pointers per block, p
  uint32_t max_depth_ = 0;    // deepest tree that holds a block below max_blocks_
  // start_[d]: first file block of the depth-d tree (d = 1..5); start_[6] is
  // the end of the depth-5 range. Saturated at 2^64 - 1.
  uint64_t start_[format::kIndirectPointers + 2] = {};
  uint64_t max_blocks_ = 0;
  uint64_t max_size_ = 0;
};

}  // namespace nvfs
