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
#include "bmap/bmap.hpp"

#include <algorithm>
#include <cinttypes>

namespace nvfs {

namespace {

using format::Inode;
using format::kDirectPointers;
using format::kIndirectPointers;

constexpr uint64_t kSaturated = ~uint64_t{0};

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > kSaturated - b ? kSaturated : a + b; }
uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  return b != 0 && a > kSaturated / b ? kSaturated : a * b;
}

// Journal cost of records: a 32-byte header plus the payload, 8-aligned
// (format.hpp, JournalRecord).
constexpr size_t kRecord = sizeof(format::JournalRecord);
// Pointers stored by one logged store: a 512-byte undo payload, which
// Tx::AppendRecord builds on its stack.
constexpr uint64_t kPointersPerStore = 64;
constexpr size_t kPointerStoreCost = kRecord + 8 * kPointersPerStore;
constexpr uint64_t kZeroPointers[kPointersPerStore] = {};
// An extent's length travels as a u32 in the journal record.
constexpr uint64_t kMaxFreeExtent = uint64_t{1} << 31;
// How far back MapForWrite looks in a pointer block for a neighbour to
// allocate next to.
constexpr uint64_t kGoalScan = 256;

// Stores the pointers first, first + 1, ... into n slots from `at`: logged
// (the slots are reachable) or fresh (their block is not linked yet).
void StorePointers(Tx& tx, uint64_t at, uint64_t first, uint64_t n, bool logged) {
  uint64_t chunk[kPointersPerStore];
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min(kPointersPerStore, n - done);
    for (uint64_t j = 0; j < k; ++j) chunk[j] = first + done + j;
    if (logged) {
      tx.Store(at + 8 * done, chunk, 8 * k);
    } else {
      tx.StoreFresh(at + 8 * done, chunk, 8 * k);
    }
    done += k;
  }
}

Error SlotFull() { return MakeError(ENOSPC, "journal slot full"); }

}  // namespace

// Where a file block's pointer lies.
struct Bmap::Span {
  enum Kind {
    kSlots,  // slots[0] is the block's pointer; avail slots to the array's end
    kNull,   // a null pointer above the data covers it: avail file blocks
             // from the position to the end of that null subtree
    kBad,    // a pointer >= block_count above the data: likewise
  };
  Kind kind;
  const uint64_t* slots;
  uint64_t avail;
};

// The path to a file block, with the media offset of every pointer on it.
struct Bmap::Branch {
  uint32_t depth = 0;                           // 0: direct
  uint32_t off[kIndirectPointers] = {};         // offset in the block at each level
  uint64_t slot_at[kIndirectPointers + 1] = {};  // pointer at each level; [depth]: data
  uint64_t ptr[kIndirectPointers + 1] = {};     // their values
  uint32_t missing = 0;                         // first null level; depth + 1: mapped
  uint64_t leaf_avail = 0;  // slots from the data pointer to the end of its array
};

// One Punch call. Every cleared pointer and the free of what it pointed to
// are logged in the same call, so stopping between steps is always
// consistent.
struct Bmap::Punching {
  Tx& tx;
  uint64_t first;          // file blocks [first, end) are unmapped
  uint64_t end;
  Extent pending{};        // blocks to free, not yet logged (coalescing)
  uint64_t freed = 0;      // blocks freed: taken off inode.blocks at the end
  bool stopped = false;    // the journal slot ran low
};

Bmap::Bmap(const FsContext& ctx)
    : ctx_(ctx),
      base_(ctx.media.base()),
      block_count_(ctx.geometry.block_count()),
      block_shift_(ctx.geometry.block_shift()),
      pshift_(ctx.geometry.block_shift() - 3),
      ptrs_(uint64_t{1} << (ctx.geometry.block_shift() - 3)) {
  uint64_t total = kDirectPointers;
  uint64_t range = 1;
  for (uint32_t depth = 1; depth <= kIndirectPointers; ++depth) {
    range = SaturatingMul(range, ptrs_);
    start_[depth] = total;
    total = SaturatingAdd(total, range);
  }
  start_[kIndirectPointers + 1] = total;
  // Files end at 2^63 - 1 bytes: the last block starts below 2^63.
  max_blocks_ = std::min(total, (uint64_t{1} << 63) >> block_shift_);
  // Only depths with a block below max_blocks_ are ever walked; for them
  // p^depth < 2^60, so every shift below stays under 64.
  for (uint32_t depth = 1; depth <= kIndirectPointers && start_[depth] < max_blocks_; ++depth) {
    max_depth_ = depth;
  }
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
                   " lies outside the filesystem (%" PRIu64 " blocks); run fsck.nvfs",
                   InoOf(inode), block_no, index, block_count_);
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
    if (ptr == 0 || ptr >= block_count_) {
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
        if (phys >= block_count_) {
          *run = 1;
          return kCorrupt;
        }
      }
      if (phys == 0) {
        while (got < limit && slots[got] == 0) ++got;
      } else {
        // Contiguous pointers stay inside the filesystem once capped here.
        const uint64_t next = phys + n;
        limit = std::min(limit, block_count_ - next);
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

uint64_t Bmap::NextMapped(const Inode& inode, uint64_t index, uint64_t limit) const {
  const uint64_t end = std::min(limit, max_blocks_);
  uint64_t at = index;
  while (at < end) {
    const Span span = Resolve(inode, at);
    if (span.kind == Span::kBad) return at;
    const uint64_t n = std::min(span.avail, end - at);
    if (span.kind == Span::kSlots) {
      for (uint64_t i = 0; i < n; ++i) {
        if (span.slots[i] != 0) return at + i;
      }
    }
    at += n;
  }
  return limit;
}

uint64_t Bmap::NextHole(const Inode& inode, uint64_t index, uint64_t limit) const {
  const uint64_t end = std::min(limit, max_blocks_);
  uint64_t at = index;
  while (at < end) {
    const Span span = Resolve(inode, at);
    if (span.kind == Span::kNull) return at;
    const uint64_t n = std::min(span.avail, end - at);
    if (span.kind == Span::kSlots) {
      for (uint64_t i = 0; i < n; ++i) {
        if (span.slots[i] == 0) return at + i;
      }
    }
    at += n;
  }
  // Past max_blocks_ nothing can be mapped: that is a hole too.
  return std::min(limit, std::max(at, index));
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
    b->ptr[level] = ptr;
    if (ptr == 0) {
      b->missing = level;
      return Status::Ok();
    }
    if (ptr >= block_count_) return Corrupt(inode, index, ptr);
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
// still fits); else next to the deepest pointer block on the path; else the
// start of the inode's group.
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
      if (ptr != 0 && ptr < block_count_) return ptr + back;
    }
  }
  if (b.missing > 0 && b.depth > 0) return b.ptr[b.missing - 1] + 1;
  const Geometry& g = ctx_.geometry;
  const uint64_t group = (OffsetOf(&inode) >> block_shift_) / g.blocks_per_group();
  return g.FirstDataBlock(static_cast<uint32_t>(group));
}

Result<Extent> Bmap::MapForWrite(Tx& tx, const Inode& inode, uint64_t index, uint64_t count,
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
//  1. allocate the pointer blocks and then the data run, from the goal (one
//     run when the allocator can);
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
  Extent taken[kIndirectPointers + 1];
  uint32_t taken_count = 0;
  uint32_t have = 0;
  Extent data;
  while (data.count == 0) {
    Result<Extent> run = ctx_.alloc.AllocateBlocks(tx, goal, (fresh - have) + count);
    if (!run.ok()) {
      for (uint32_t i = 0; i < taken_count; ++i) {
        (void)ctx_.alloc.FreeBlocks(tx, taken[i].first, taken[i].count);
      }
      return run;
    }
    taken[taken_count++] = *run;
    const uint64_t for_pointers = std::min<uint64_t>(run->count, fresh - have);
    for (uint64_t i = 0; i < for_pointers; ++i) new_ptr[have++] = run->first + i;
    if (run->count > for_pointers) data = {run->first + for_pointers, run->count - for_pointers};
    goal = run->first + run->count;
  }

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

// ---------------------------------------------------------------------------
// Truncate and punch
// ---------------------------------------------------------------------------
//
// The tree is walked forward over [first, end). In each pointer array the
// pointers to clear are gathered into spans of up to 64 slots, each cleared by
// one logged store; the blocks they pointed to are freed through
// deferred-free records, coalescing physically contiguous blocks into one
// record. A pointer block wholly inside the range is cut off by clearing its
// parent pointer alone, and its whole subtree freed without touching its inner
// pointers (nothing reaches them any more) — when the frees fit the slot;
// else it is emptied piecewise like a partly covered one. A pointer block
// left empty is freed and its parent pointer cleared.
//
// Journal room is checked before each step, so the call stops with a
// step's worth of room plus kTruncateReserve left. Since each step logs the
// clearing of a pointer together with the frees of everything below it, the
// state is consistent whenever the call returns: the file maps what it still
// points to, and every block no longer pointed to is freed at commit.

namespace {
// What the end of a call may still log: the last pointer span, the last
// coalesced free, inode.blocks.
constexpr size_t kFinishCost = kPointerStoreCost + kRecord + (kRecord + 8);
// The most one step logs before its own frees: a full pointer span, one free.
constexpr size_t kStepCost = kPointerStoreCost + kRecord;
}  // namespace

Status Bmap::Free(Punching& punch, Extent extent) {
  punch.freed += extent.count;
  Extent& pending = punch.pending;
  if (pending.count != 0 && extent.first == pending.first + pending.count &&
      pending.count + extent.count <= kMaxFreeExtent) {
    pending.count += extent.count;
    return Status::Ok();
  }
  if (pending.count != 0) NVFS_TRY(ctx_.alloc.FreeBlocks(punch.tx, pending.first, pending.count));
  pending = extent;
  return Status::Ok();
}

bool Bmap::AllZero(uint64_t block_no) const {
  const uint64_t* slots = BlockAt(block_no);
  uint64_t any = 0;
  for (uint64_t i = 0; i < ptrs_; ++i) any |= slots[i];
  return any == 0;
}

// The blocks of the subtree under pointer block `block_no` (its own included),
// as coalesced extents; false once there are more than `limit`.
Result<bool> Bmap::CollectSubtree(uint64_t block_no, uint32_t height, size_t limit,
                                  std::vector<Extent>* extents) const {
  const auto add = [extents](uint64_t block) {
    if (!extents->empty()) {
      Extent& last = extents->back();
      if (block == last.first + last.count && last.count < kMaxFreeExtent) {
        ++last.count;
        return;
      }
    }
    extents->push_back({block, 1});
  };
  add(block_no);
  const uint64_t* slots = BlockAt(block_no);
  for (uint64_t i = 0; i < ptrs_; ++i) {
    const uint64_t child = slots[i];
    if (child == 0) continue;
    if (child >= block_count_) {
      return MakeError(EUCLEAN, "block %" PRIu64 " points to block %" PRIu64
                       ", outside the filesystem; run fsck.nvfs", block_no, child);
    }
    if (height == 1) {
      add(child);
    } else {
      Result<bool> fits = CollectSubtree(child, height - 1, limit, extents);
      if (!fits.ok() || !*fits) return fits;
    }
    if (extents->size() > limit) return false;
  }
  return extents->size() <= limit;
}

// Frees pointer block `block_no` of `height` and everything under it, if the
// frees fit the journal slot; false (nothing logged) if they do not.
Result<bool> Bmap::FreeSubtree(Punching& punch, uint64_t block_no, uint32_t height) {
  const size_t keep = kTruncateReserve + kFinishCost + kStepCost;
  if (punch.tx.room() < keep + kRecord) return false;
  const size_t limit = (punch.tx.room() - keep) / kRecord;
  std::vector<Extent> extents;
  Result<bool> fits = CollectSubtree(block_no, height, limit, &extents);
  if (!fits.ok() || !*fits) return fits;
  for (const Extent& extent : extents) NVFS_TRY(Free(punch, extent));
  return true;
}

// Unmaps [punch.first, punch.end) within one array of `slots` pointers of
// `height` at media offset `array_at`, whose first slot maps file block `base`.
Status Bmap::PunchArray(Punching& punch, uint64_t array_at, uint64_t slots, uint32_t height,
                        uint64_t base) {
  Tx& tx = punch.tx;
  const uint64_t* array = WordAt(array_at);
  const uint32_t shift = pshift_ * height;
  const uint64_t covered = uint64_t{1} << shift;  // file blocks under one slot
  uint64_t i = punch.first > base ? (punch.first - base) >> shift : 0;
  const uint64_t stop = std::min(slots, ((punch.end - base - 1) >> shift) + 1);
  // Slots [clear_first, clear_end) are to be zeroed by one logged store; any
  // slot inside that is not marked was already zero.
  uint64_t clear_first = 0, clear_end = 0;
  const auto flush_clear = [&] {
    if (clear_end > clear_first) {
      tx.Store(array_at + 8 * clear_first, kZeroPointers, 8 * (clear_end - clear_first));
    }
    clear_first = clear_end = 0;
  };
  const auto mark = [&](uint64_t slot) {
    if (clear_end == clear_first || slot >= clear_first + kPointersPerStore) {
      flush_clear();
      clear_first = slot;
    }
    clear_end = slot + 1;
  };
  const size_t step_room = kTruncateReserve + kFinishCost + kStepCost;

  Status status;
  for (; i < stop; ++i) {
    const uint64_t ptr = array[i];
    if (ptr == 0) continue;
    const uint64_t slot_base = base + (i << shift);
    if (ptr >= block_count_) {
      status = MakeError(EUCLEAN, "block pointer %" PRIu64 " to file block %" PRIu64
                         " lies outside the filesystem; run fsck.nvfs", ptr, slot_base);
      break;
    }
    if (tx.room() < step_room) {
      punch.stopped = true;
      break;
    }
    if (height == 0) {
      status = Free(punch, {ptr, 1});
      if (!status.ok()) break;
      mark(i);
      continue;
    }
    if (punch.first <= slot_base && covered <= punch.end - slot_base) {
      Result<bool> freed = FreeSubtree(punch, ptr, height);
      if (!freed.ok()) {
        status = freed.take_error();
        break;
      }
      if (*freed) {
        mark(i);
        continue;
      }
    }
    // Partly covered, or too large to free at once: empty it piecewise.
    flush_clear();
    status = PunchArray(punch, ptr << block_shift_, ptrs_, height - 1, slot_base);
    if (!status.ok() || punch.stopped) break;
    if (AllZero(ptr)) {
      if (tx.room() < step_room) {
        punch.stopped = true;  // an empty pointer block stays linked: still valid
        break;
      }
      status = Free(punch, {ptr, 1});
      if (!status.ok()) break;
      mark(i);
    }
  }
  flush_clear();
  return status;
}

Result<bool> Bmap::Punch(Tx& tx, const Inode& inode, uint64_t first, uint64_t count) {
  const uint64_t end = std::min(SaturatingAdd(first, count), max_blocks_);
  if (first >= end) return true;
  Punching punch{tx, first, end};
  const format::InodeFileMap& map = inode.map.file;
  Status status;
  if (first < kDirectPointers) {
    status = PunchArray(punch, OffsetOf(&map.direct[0]), kDirectPointers, 0, 0);
  }
  for (uint32_t depth = 1; depth <= max_depth_ && status.ok() && !punch.stopped; ++depth) {
    if (end <= start_[depth] || first >= start_[depth + 1]) continue;
    status = PunchArray(punch, OffsetOf(&map.indirect[depth - 1]), 1, depth, start_[depth]);
  }
  // Even after an error, log what was gathered: every pointer cleared so far
  // is paired with the free of its blocks and with inode.blocks.
  if (punch.pending.count != 0) {
    Status freed = ctx_.alloc.FreeBlocks(tx, punch.pending.first, punch.pending.count);
    if (status.ok() && !freed.ok()) status = std::move(freed);
  }
  if (punch.freed != 0) {
    tx.Set(inode.blocks, inode.blocks - std::min(inode.blocks, punch.freed));
  }
  if (!status.ok()) return status.take_error();
  if (!tx.ok()) return SlotFull();
  return !punch.stopped;
}

Result<bool> Bmap::Truncate(Tx& tx, const Inode& inode, uint64_t from) {
  if (from >= max_blocks_) return true;
  return Punch(tx, inode, from, max_blocks_ - from);
}

}  // namespace nvfs
