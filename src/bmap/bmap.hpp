// File block mapping ("bmap"): file block index -> physical block, over an
// inode's InodeFileMap (format.hpp): 11 direct pointers, then trees of depth
// 1..5. Lookups return physical runs so reads copy whole runs at once.
//
// Contracts shared by every function here:
//  - `inode` is a reference INTO THE MAPPING (ctx.InodeAt(ino)), so Tx::Set can
//    log its fields. The caller holds the inode's lock: shared for Lookup and
//    the Next* functions, exclusive for anything taking a Tx.
//  - Nothing here trusts the media: a pointer outside the filesystem (0 <
//    block_no < block_count fails) or a tree deeper than the format allows is
//    reported as corruption (kCorrupt / EUCLEAN), never followed.
//  - Changes follow write-before-publish (doc/integrity.md): a missing branch
//    is allocated and initialised aside (fresh stores), then linked with one
//    logged 8-byte store; blocks are freed only through deferred-free records.
#pragma once

#include <cstdint>

#include "fs/context.hpp"
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
  Result<Extent> MapForWrite(Tx& tx, const format::Inode& inode, uint64_t index, uint64_t count,
                             bool zero_new);

  // Unmaps and frees every block at file block >= `from` (and pointer blocks
  // left empty). Stops early, leaving a consistent state, when the journal
  // slot runs low; returns true when everything is done, false if the caller
  // must continue in a new transaction. Updates inode.blocks.
  Result<bool> Truncate(Tx& tx, const format::Inode& inode, uint64_t from);

  // Unmaps and frees file blocks [first, first + count), as Truncate does
  // (same early-stop contract).
  Result<bool> Punch(Tx& tx, const format::Inode& inode, uint64_t first, uint64_t count);

  // First mapped file block >= index and < limit, or `limit` (SEEK_DATA).
  uint64_t NextMapped(const format::Inode& inode, uint64_t index, uint64_t limit) const;
  // First hole file block >= index and < limit, or `limit` (SEEK_HOLE).
  uint64_t NextHole(const format::Inode& inode, uint64_t index, uint64_t limit) const;

 private:
  const FsContext& ctx_;
  uint64_t max_blocks_ = 0;
};

}  // namespace nvfs
