// Truncate and punch (bmap.cpp has the model of positions and the rules
// every change follows).
#include <algorithm>
#include <cinttypes>

#include "bmap/internal.hpp"

namespace nvfs {

using namespace bmap_detail;
using format::Inode;
using format::kDirectPointers;
using format::kIndirectPointers;

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
    if (!geometry_.IsDataBlock(child)) {
      return MakeError(EUCLEAN, "block %" PRIu64 " points to block %" PRIu64
                       ", which is no data block; run fsck.nvfs", block_no, child);
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
    if (!geometry_.IsDataBlock(ptr)) {
      status = MakeError(EUCLEAN, "block pointer %" PRIu64 " to file block %" PRIu64
                         " names no data block; run fsck.nvfs", ptr, slot_base);
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
  return ctx_.Checked(PunchRange(tx, inode, first, count));
}

Result<bool> Bmap::PunchRange(Tx& tx, const Inode& inode, uint64_t first, uint64_t count) {
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
