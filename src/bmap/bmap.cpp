// File block mapping (doc/format.md, "Inodes"; the model is ext2's inode.c).
//
// Positions. File block i lies in the direct array (i < 11) or in the tree of
// depth d whose range [start_[d], start_[d + 1]) holds it. Its path is the
// list of offsets into the pointer blocks from the root down: the bits of
// i - start_[d] taken pshift_ at a time, most significant first
// (ext2_block_to_path). A pointer of *height* h covers p^h file blocks: a data
// pointer has height 0, a pointer to a block of data pointers height 1, and
// indirect[d - 1] height d.
//
// Reading (Resolve, Lookup, Next*) takes no lock of its own, allocates
// nothing and never follows a pointer >= block_count; it relies on the
// caller's inode lock for a stable tree.
//
// Changing follows doc/integrity.md: bytes nothing reachable points to are
// written fresh, reachable pointers and inode fields through logged stores,
// and freed blocks through deferred-free records, so a Tx abort (or recovery
// of an interrupted one) restores the tree exactly.
#include <algorithm>
#include <cinttypes>

#include "bmap/internal.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using namespace bmap_detail;
using format::Inode;
using format::kDirectPointers;
using format::kIndirectPointers;

Bmap::Bmap(const FsContext& ctx)
    : ctx_(ctx),
      geometry_(ctx.geometry),
      base_(ctx.media.base()),
      block_shift_(ctx.geometry.block_shift()),
      pshift_(ctx.geometry.block_shift() - 3),
      ptrs_(uint64_t{1} << (ctx.geometry.block_shift() - 3)) {
  // The ranges fsck checks maps by, copied into this object's own fields
  // (the lookups read them on every call).
  const FileMapLayout layout(block_shift_);
  for (uint32_t depth = 1; depth <= kIndirectPointers + 1; ++depth) {
    start_[depth] = layout.start(depth);
  }
  max_blocks_ = layout.max_blocks();
  max_size_ = layout.max_size();
  // Only depths with a block below max_blocks_ are ever walked; for them
  // p^depth < 2^60, so every shift below stays under 64.
  max_depth_ = layout.max_depth();
}

uint64_t Bmap::InoOf(const Inode& inode) const {
  const Geometry& g = ctx_.geometry;
  const uint64_t offset = OffsetOf(&inode);
  const uint64_t group = (offset >> block_shift_) / g.blocks_per_group();
  const uint64_t table = g.BlockOffset(g.InodeTableBlock(static_cast<uint32_t>(group)));
  return group * g.inodes_per_group() + (offset - table) / format::kInodeSize;
}

Error Bmap::Corrupt(const Inode& inode, uint64_t index, uint64_t block_no) const {
  return MakeError(EUCLEAN,
                   "inode %" PRIu64 ": block pointer %" PRIu64 " on the path to file block %" PRIu64
                   " names no data block (%" PRIu64 " blocks); run fsck.nvfs",
                   InoOf(inode), block_no, index, geometry_.block_count());
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

// REQUIRES: index < max_blocks_.
inline Bmap::Span Bmap::Resolve(const Inode& inode, uint64_t index) const {
  const format::InodeFileMap& map = inode.map.file;
  if (index < kDirectPointers) {
    return {Span::kSlots, &map.direct[index], kDirectPointers - index};
  }
  uint32_t depth = 1;
  while (index >= start_[depth + 1]) ++depth;
  const uint64_t rel = index - start_[depth];
  uint64_t ptr = map.indirect[depth - 1];
  uint32_t shift = pshift_ * depth;  // bits of rel below the current pointer
  for (;;) {
    if (ptr == 0 || !geometry_.IsDataBlock(ptr)) {
      const uint64_t covered = uint64_t{1} << shift;
      return {ptr == 0 ? Span::kNull : Span::kBad, nullptr, covered - (rel & (covered - 1))};
    }
    shift -= pshift_;
    const uint64_t* block = BlockAt(ptr);
    const uint64_t off = (rel >> shift) & (ptrs_ - 1);
    if (shift == 0) return {Span::kSlots, block + off, ptrs_ - off};
    ptr = block[off];
  }
}

uint64_t Bmap::Lookup(const Inode& inode, uint64_t index, uint64_t max_run,
                      uint64_t* run) const {
  if (index >= max_blocks_) {  // nothing is mapped there
    *run = max_run;
    return 0;
  }
  max_run = std::min(max_run, max_blocks_ - index);
  uint64_t phys = 0;  // of file block `index`
  uint64_t n = 0;     // blocks of the run found so far
  for (;;) {
    const Span span = Resolve(inode, index + n);
    const uint64_t want = max_run - n;
    uint64_t got = 0;
    if (span.kind == Span::kBad) {
      if (n == 0) {
        *run = 1;
        return kCorrupt;
      }
      break;  // the run ends here; a lookup of this block reports it
    }
    if (span.kind == Span::kNull) {
      if (n != 0 && phys != 0) break;
      got = std::min(span.avail, want);
    } else {
      const uint64_t* slots = span.slots;
      uint64_t limit = std::min(span.avail, want);
      if (n == 0) {
        phys = slots[0];
        if (phys != 0 && !geometry_.IsDataBlock(phys)) {
          *run = 1;
          return kCorrupt;
        }
      }
      if (phys == 0) {
        while (got < limit && slots[got] == 0) ++got;
      } else {
        // Contiguous pointers stay data blocks once capped here: a run of
        // them never reaches the next group's metadata (nor the backup block).
        const uint64_t next = phys + n;
        limit = std::min(limit, geometry_.DataRunEnd(phys) - next);
        while (got < limit && slots[got] == next + got) ++got;
      }
      if (got == 0) break;
    }
    n += got;
    // Go on into the next array or subtree only if this one matched to its end.
    if (n == max_run || got < span.avail) break;
  }
  *run = n;
  return phys;
}

// The walk behind NextMapped and NextHole: the first file block >= index
// and < min(limit, max_blocks_) that is mapped (`mapped`; a corrupt pointer
// counts as mapped) or a hole (a corrupt pointer does not), else where the
// walk ended: index, or min(limit, max_blocks_) if that is further.
uint64_t Bmap::NextOf(const Inode& inode, uint64_t index, uint64_t limit, bool mapped) const {
  const uint64_t end = std::min(limit, max_blocks_);
  uint64_t at = index;
  while (at < end) {
    const Span span = Resolve(inode, at);
    if (span.kind == (mapped ? Span::kBad : Span::kNull)) return at;
    const uint64_t n = std::min(span.avail, end - at);
    if (span.kind == Span::kSlots) {
      for (uint64_t i = 0; i < n; ++i) {
        if ((span.slots[i] != 0) == mapped) return at + i;
      }
    }
    at += n;
  }
  return at;
}

uint64_t Bmap::NextMapped(const Inode& inode, uint64_t index, uint64_t limit) const {
  const uint64_t at = NextOf(inode, index, limit, /*mapped=*/true);
  return at < std::min(limit, max_blocks_) ? at : limit;
}

uint64_t Bmap::NextHole(const Inode& inode, uint64_t index, uint64_t limit) const {
  // Past max_blocks_ nothing can be mapped: that is a hole too.
  return std::min(limit, NextOf(inode, index, limit, /*mapped=*/false));
}

// ---------------------------------------------------------------------------
// Mapping for write
// ---------------------------------------------------------------------------

// ext2_get_branch: follows the path to `index` until a null pointer.
// REQUIRES: index < max_blocks_.
Status Bmap::Walk(const Inode& inode, uint64_t index, Branch* b) const {
  const format::InodeFileMap& map = inode.map.file;
  if (index < kDirectPointers) {
    b->depth = 0;
    b->slot_at[0] = OffsetOf(&map.direct[index]);
    b->leaf_avail = kDirectPointers - index;
  } else {
    uint32_t depth = 1;
    while (index >= start_[depth + 1]) ++depth;
    const uint64_t rel = index - start_[depth];
    b->depth = depth;
    for (uint32_t level = 0; level < depth; ++level) {
      b->off[level] = static_cast<uint32_t>((rel >> (pshift_ * (depth - 1 - level))) & (ptrs_ - 1));
    }
    b->slot_at[0] = OffsetOf(&map.indirect[depth - 1]);
    b->leaf_avail = ptrs_ - b->off[depth - 1];
  }
  for (uint32_t level = 0; level <= b->depth; ++level) {
    const uint64_t ptr = *WordAt(b->slot_at[level]);
    if (ptr == 0) {
      b->missing = level;
      return Status::Ok();
    }
    if (!geometry_.IsDataBlock(ptr)) return Corrupt(inode, index, ptr);
    if (level < b->depth) {
      b->slot_at[level + 1] = (ptr << block_shift_) + 8 * uint64_t{b->off[level]};
    }
  }
  b->missing = b->depth + 1;
  return Status::Ok();
}

// ext2_find_goal: where new blocks for `index` should go. The block after
// the previous file block's keeps a file contiguous; else a mapped neighbour
// earlier in the same array, at the same distance (so a hole filled later
// still fits); else the start of the inode's group. (Not next to the pointer
// blocks, as ext2: those sit at the top of the group, AddBranch.)
uint64_t Bmap::FindGoal(const Inode& inode, uint64_t index, const Branch& b) const {
  if (index > 0) {
    uint64_t run;
    const uint64_t prev = Lookup(inode, index - 1, 1, &run);
    if (prev != 0 && prev != kCorrupt) return prev + 1;
  }
  if (b.missing == b.depth) {
    const uint64_t* slot = WordAt(b.slot_at[b.depth]);
    const uint64_t before = b.depth == 0 ? index : b.off[b.depth - 1];
    for (uint64_t back = 2; back <= std::min(before, kGoalScan); ++back) {
      const uint64_t ptr = *(slot - back);
      if (ptr != 0 && ptr < geometry_.block_count()) return ptr + back;
    }
  }
  const Geometry& g = ctx_.geometry;
  const uint64_t group = (OffsetOf(&inode) >> block_shift_) / g.blocks_per_group();
  return g.FirstDataBlock(static_cast<uint32_t>(group));
}

Result<Extent> Bmap::MapForWrite(Tx& tx, const Inode& inode, uint64_t index, uint64_t count,
                                 bool zero_new) {
  return ctx_.Checked(MapRange(tx, inode, index, count, zero_new));
}

Result<Extent> Bmap::MapRange(Tx& tx, const Inode& inode, uint64_t index, uint64_t count,
                              bool zero_new) {
  if (count == 0) return MakeError(EINVAL, "MapForWrite of no blocks");
  if (index >= max_blocks_ || count > max_blocks_ - index) return Error(EFBIG);
  uint64_t run = 0;
  const uint64_t phys = Lookup(inode, index, count, &run);
  if (phys != 0 && phys != kCorrupt) return Extent{phys, run};
  Branch b;
  NVFS_TRY(Walk(inode, index, &b));  // fails on the pointer Lookup found bad
  if (phys == kCorrupt || b.missing > b.depth) {
    return MakeError(EIO, "bmap: inode %" PRIu64 " changed under its lock", InoOf(inode));
  }
  const uint64_t goal = FindGoal(inode, index, b);
  if (b.missing == b.depth) {
    return FillHoles(tx, inode, b, std::min(run, b.leaf_avail), goal, zero_new);
  }
  return AddBranch(tx, inode, b, std::min(count, b.leaf_avail), goal, zero_new);
}

// The pointer array exists and holds `holes` null pointers from the branch's
// slot. Order: allocate the data run, zero it (fresh: nothing points at it),
// then publish it with logged stores of the pointers, and count it in
// inode.blocks. Journal: one allocation record, 8.5 bytes per pointer, one
// inode field.
Result<Extent> Bmap::FillHoles(Tx& tx, const Inode& inode, const Branch& b, uint64_t holes,
                               uint64_t goal, bool zero_new) {
  const size_t fixed = kMapReserve + kRecord /* allocation */ + (kRecord + 8) /* blocks */ +
                       kRecord /* a partial pointer store */;
  if (tx.room() < fixed + 8) return SlotFull();
  const uint64_t fits = (tx.room() - fixed) * kPointersPerStore / kPointerStoreCost;
  if (fits == 0) return SlotFull();
  Result<Extent> data = ctx_.alloc.AllocateBlocks(tx, goal, std::min(holes, fits));
  if (!data.ok()) return data;
  if (zero_new) tx.FillFresh(data->first << block_shift_, 0, data->count << block_shift_);
  StorePointers(tx, b.slot_at[b.depth], data->first, data->count, /*logged=*/true);
  tx.Set(inode.blocks, inode.blocks + data->count);
  if (!tx.ok()) return SlotFull();
  return data;
}

// Pointer levels b.missing .. depth - 1 are missing (ext2_alloc_branch and
// ext2_splice_branch). Order:
//  1. allocate the pointer blocks, each the highest free block of the goal's
//     group (Allocator::AllocatePointerBlock: out of the way of data, so a
//     file written in order stays one run across its pointer-block
//     boundaries, where ext2 puts each before its data), then the data run
//     from the goal;
//  2. zero each new pointer block and write its one child pointer, or in the
//     new leaf the data pointers, with fresh stores: nothing reaches these
//     blocks yet;
//  3. zero the data when asked (fresh);
//  4. set the last missing link: ONE logged 8-byte store of the pointer at
//     level b.missing publishes the whole branch;
//  5. count the new blocks in inode.blocks (logged).
// An undo of the Tx (abort or recovery) restores the null pointer and clears
// the bitmap bits, which is exactly the old state; a failed allocation frees
// what this call took, so nothing is left half done.
Result<Extent> Bmap::AddBranch(Tx& tx, const Inode& inode, const Branch& b, uint64_t count,
                               uint64_t goal, bool zero_new) {
  const uint32_t fresh = b.depth - b.missing;  // pointer blocks to create
  const size_t cost = kMapReserve + (fresh + 1) * kRecord /* allocations */ +
                      (kRecord + 8) /* link */ + (kRecord + 8) /* blocks */;
  if (tx.room() < cost) return SlotFull();

  uint64_t new_ptr[kIndirectPointers] = {};
  const auto give_back = [&](uint32_t pointers) {
    for (uint32_t i = 0; i < pointers; ++i) (void)ctx_.alloc.FreeBlocks(tx, new_ptr[i], 1);
  };
  for (uint32_t j = 0; j < fresh; ++j) {
    Result<uint64_t> block = ctx_.alloc.AllocatePointerBlock(tx, goal);
    if (!block.ok()) {
      give_back(j);
      return block.take_error();
    }
    new_ptr[j] = *block;
  }
  Result<Extent> run = ctx_.alloc.AllocateBlocks(tx, goal, count);
  if (!run.ok()) {
    give_back(fresh);
    return run;
  }
  const Extent data = *run;

  for (uint32_t j = 0; j < fresh; ++j) {
    const uint32_t level = b.missing + j;  // new_ptr[j] is the pointer at this level
    const uint64_t block_at = new_ptr[j] << block_shift_;
    tx.FillFresh(block_at, 0, size_t{1} << block_shift_);
    const uint64_t slot_at = block_at + 8 * uint64_t{b.off[level]};
    if (j + 1 < fresh) {
      tx.StoreFresh(slot_at, &new_ptr[j + 1], 8);
    } else {
      StorePointers(tx, slot_at, data.first, data.count, /*logged=*/false);
    }
  }
  if (zero_new) tx.FillFresh(data.first << block_shift_, 0, data.count << block_shift_);
  tx.Store64(b.slot_at[b.missing], new_ptr[0]);
  tx.Set(inode.blocks, inode.blocks + fresh + data.count);
  if (!tx.ok()) return SlotFull();
  return data;
}

}  // namespace nvfs
