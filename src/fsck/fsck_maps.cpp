// Pass 1, file maps: every pointer of a regular file's or long symlink's map
// is checked before it is followed (inside the filesystem, not into
// metadata, not a block already claimed by another inode or by itself), and
// each block it holds claimed. After pass 2, blocks two maps named are
// resolved by giving the later claimant a copy (CloneShared).
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <functional>

#include "fsck/checker.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

using format::Inode;

namespace {

constexpr uint64_t kMapOffset = offsetof(Inode, map);
// A pointer block with more invalid pointers than this is not a pointer block
// (a stray pointer to data, or garbage): the pointer to it is cleared rather
// than the "pointers" in it, which may be someone's data.
constexpr uint32_t kMaxBadPointers = 8;

}  // namespace

// Walks the file map: returns the blocks it holds (data and pointer blocks),
// and sets *mapped_end past the last mapped file block.
uint64_t Checker::CheckFileMap(uint64_t ino, const Inode& inode, uint64_t* mapped_end) {
  const format::InodeFileMap& map = inode.map.file;
  const uint64_t map_at = InodeOffset(ino) + kMapOffset;
  uint64_t count = 0;
  for (uint32_t i = 0; i < format::kDirectPointers; ++i) {
    const uint64_t ptr = map.direct[i];
    if (ptr == 0) continue;
    if (CheckDataPointer(ino, map_at + 8 * i, ptr, i)) {
      ++count;
      *mapped_end = i + 1;
    }
    if (halted_) return count;
  }
  for (uint32_t depth = 1; depth <= format::kIndirectPointers; ++depth) {
    const uint64_t ptr = map.indirect[depth - 1];
    if (ptr == 0) continue;
    const uint64_t slot_at = map_at + 8 * (format::kDirectPointers + depth - 1);
    if (start_[depth] >= max_file_blocks_) {
      BadPointer(ino, slot_at, ptr, "past the largest file", start_[depth]);
    } else {
      count += CheckPointerBlock(ino, slot_at, ptr, depth, start_[depth], mapped_end);
    }
    if (halted_) return count;
  }
  return count;
}

// A pointer block of `height` (1: it holds data pointers) mapping file
// blocks from `base`, reached through the pointer at media offset slot_at.
uint64_t Checker::CheckPointerBlock(uint64_t ino, uint64_t slot_at, uint64_t block_no,
                                    uint32_t height, uint64_t base, uint64_t* mapped_end) {
  const BlockFault fault = CheckBlock(block_no);
  // A pointer block another inode claimed first (as data or as its own
  // pointer block) is copied at once, if a block is free for it, and the
  // copy walked as this inode's: its children are then shared, and copied
  // in turn (CloneShared). With no free block it is cleared, as before.
  const bool shared = fault == BlockFault::kShared && !parallel_;
  if (fault != BlockFault::kNone && !shared) {
    BadPointer(ino, slot_at, block_no, FaultName(fault), base);
    return 0;
  }
  const uint64_t ptrs = block_size_ / 8;
  const auto* slots = reinterpret_cast<const uint64_t*>(Block(block_no));
  uint64_t bad = 0, good = 0;
  for (uint64_t i = 0; i < ptrs && bad <= kMaxBadPointers; ++i) {
    const uint64_t ptr = slots[i];
    if (ptr == 0) continue;
    const bool invalid = ptr >= geometry_.block_count() || IsMetadata(ptr);
    bad += invalid;
    good += !invalid;
  }
  // Nor is one with invalid pointers and no valid one (a stray pointer to
  // a file's data, "dddd" and zeros): clearing its "pointers" would write
  // into another file's bytes.
  if (bad > kMaxBadPointers || (bad != 0 && good == 0)) {
    BadPointer(ino, slot_at, block_no, "to a block that holds no block pointers", base);
    return 0;
  }
  if (shared) {
    const uint64_t copy = FreeBlockForCopy(/*bitmap_free_only=*/true);
    // No room for a copy: a block that reads as a pointer block whose every
    // pointer names a block in use that no one has claimed yet is this
    // inode's pointer block, and another inode's data pointer to it the
    // damaged one (its pointer is cleared, this inode keeps the block).
    uint64_t owner = 0, first_slot = 0;
    if (copy == 0 && bad == 0 && good != 0) {
      bool children_free = true;
      for (uint64_t i = 0; i < ptrs && children_free; ++i) {
        const uint64_t ptr = slots[i];
        if (ptr == 0) continue;
        children_free = !Claimed(ptr) && BitmapMarks(ptr);
      }
      if (children_free) first_slot = FirstDataSlot(block_no, &owner);
    }
    if (copy == 0 && (first_slot == 0 || owner == ino)) {
      BadPointer(ino, slot_at, block_no, "to a block already in use, and no block is free for a "
                 "copy", base);
      return 0;
    }
    if (copy == 0) {
      if (Problem(Repair::kDecision, "inode %" PRIu64 ": block pointer %" PRIu64 " names the "
                  "pointer block of inode %" PRIu64 ", and no block is free for a copy; "
                  "clearing it", owner, block_no, ino)) {
        Write64(first_slot, 0);
        const Inode& other = InodeAt(owner);
        WriteField(owner, other.blocks, other.blocks - 1);
        Fixed();
      }
    } else {
      Claim(copy);  // -n: as if copied
    }
    if (copy != 0 && Problem(Repair::kDecision, "inode %" PRIu64 ": pointer block %" PRIu64 " for file block %"
                PRIu64 " is in use by another inode; giving it a copy in block %" PRIu64, ino,
                block_no, base, copy)) {
      Write(geometry_.BlockOffset(copy), Block(block_no), block_size_);
      Write64(slot_at, copy);
      Fixed();
      block_no = copy;
      slots = reinterpret_cast<const uint64_t*>(Block(block_no));
    }
  } else {
    Claim(block_no);
  }
  uint64_t count = 1;
  // No shift overflows: a tree of this height is walked only when its range
  // starts below max_file_blocks_ (<= 2^51), and for every block size the
  // format allows that keeps p^height below 2^57.
  const uint32_t child_shift = (block_shift_ - 3) * (height - 1);
  for (uint64_t i = 0; i < ptrs; ++i) {
    const uint64_t ptr = slots[i];
    if (ptr == 0) continue;
    const uint64_t child_base = base + (i << child_shift);
    const uint64_t child_at = (block_no << block_shift_) + 8 * i;
    if (child_base >= max_file_blocks_) {
      BadPointer(ino, child_at, ptr, "past the largest file", child_base);
    } else if (height == 1) {
      if (CheckDataPointer(ino, child_at, ptr, child_base)) {
        ++count;
        *mapped_end = std::max(*mapped_end, child_base + 1);
      }
    } else {
      count += CheckPointerBlock(ino, child_at, ptr, height - 1, child_base, mapped_end);
    }
    if (halted_) break;
  }
  return count;
}

bool Checker::CheckDataPointer(uint64_t ino, uint64_t slot_at, uint64_t block_no,
                               uint64_t index) {
  const BlockFault fault = CheckBlock(block_no);
  if (fault == BlockFault::kShared && !parallel_) {
    // Which claim is the damaged one is not known here (the first claimant
    // may be the inode whose pointer was damaged): the block stays with the
    // first, and this inode gets a copy of it after pass 2 (CloneShared), so
    // neither loses the bytes.
    shared_.push_back({ino, slot_at, block_no, index});
    return true;
  }
  if (fault != BlockFault::kNone) {
    BadPointer(ino, slot_at, block_no, FaultName(fault), index);
    return false;
  }
  Claim(block_no);
  return true;
}

void Checker::BadPointer(uint64_t ino, uint64_t slot_at, uint64_t block_no, const char* what,
                         uint64_t index) {
  if (Problem(Repair::kDecision, "inode %" PRIu64 ": block pointer %" PRIu64 " for file block %"
              PRIu64 " points %s; clearing it", ino, block_no, index, what)) {
    Write64(slot_at, 0);
    Fixed();
  }
}

void Checker::CloneShared() {
  for (const SharedPointer& s : shared_) {
    if (halted_) return;
    const uint64_t copy = FreeBlockForCopy();
    if (copy == 0) {
      // No room for a copy: one claimant keeps the block. The first claimant
      // came first only by inode order; the claim that continues a run of
      // its file's blocks is the one the filesystem wrote.
      uint64_t owner = 0;
      const uint64_t first_slot = FirstDataSlot(s.block_no, &owner);
      const bool later_wins = first_slot != 0 && first_slot != s.slot_at && owner != s.ino &&
                              ContinuesRun(s.slot_at, s.block_no) &&
                              !ContinuesRun(first_slot, s.block_no);
      const uint64_t loser = later_wins ? owner : s.ino;
      const uint64_t loser_slot = later_wins ? first_slot : s.slot_at;
      if (Problem(Repair::kDecision, "inode %" PRIu64 ": block pointer %" PRIu64 " names a "
                  "block inode %" PRIu64 " also uses, and no block is free for a copy; "
                  "clearing it", loser, s.block_no, later_wins ? s.ino : owner)) {
        Write64(loser_slot, 0);
        const Inode& inode = InodeAt(loser);
        WriteField(loser, inode.blocks, inode.blocks - 1);
        Fixed();
      }
      continue;
    }
    // -n: as if copied, so the free counts agree with what -y would leave.
    Claim(copy);
    if (Problem(Repair::kDecision, "inode %" PRIu64 ": block pointer %" PRIu64 " for file block %"
                PRIu64 " names a block in use by another inode; giving it a copy in block %"
                PRIu64, s.ino, s.block_no, s.index, copy)) {
      Write(geometry_.BlockOffset(copy), Block(s.block_no), block_size_);
      Write64(s.slot_at, copy);
      Fixed();
    }
  }
  shared_.clear();
}

// The slot of the first claimant of `block_no` among the file maps: the
// inode-order walk pass 1 made (only valid pointers followed). 0 if none.
uint64_t Checker::FirstDataSlot(uint64_t block_no, uint64_t* owner) const {
  const Geometry& g = geometry_;
  uint64_t found = 0;
  const std::function<void(uint64_t, uint64_t, uint32_t)> walk = [&](uint64_t ino, uint64_t b,
                                                                    uint32_t height) {
    const auto* slots = reinterpret_cast<const uint64_t*>(Block(b));
    for (uint64_t i = 0; i < block_size_ / 8 && found == 0; ++i) {
      const uint64_t ptr = slots[i];
      if (ptr == 0 || ptr >= g.block_count() || !g.IsDataBlock(ptr)) continue;
      if (height == 1) {
        if (ptr == block_no) {
          found = (b << block_shift_) + 8 * i;
          *owner = ino;
        }
      } else {
        walk(ino, ptr, height - 1);
      }
    }
  };
  for (uint64_t ino = 1; ino < g.inode_count() && found == 0; ++ino) {
    const uint8_t kind = Kind(ino);
    if (kind != kRegular && kind != kSymlink) continue;
    const Inode& inode = InodeAt(ino);
    if (kind == kSymlink && inode.size <= format::kInlineSymlinkMax) continue;
    const format::InodeFileMap& map = inode.map.file;
    for (uint32_t i = 0; i < format::kDirectPointers && found == 0; ++i) {
      if (map.direct[i] == block_no) {
        found = InodeOffset(ino) + kMapOffset + 8 * i;
        *owner = ino;
      }
    }
    for (uint32_t depth = 1; depth <= format::kIndirectPointers && found == 0; ++depth) {
      const uint64_t ptr = map.indirect[depth - 1];
      if (ptr != 0 && ptr < g.block_count() && g.IsDataBlock(ptr)) walk(ino, ptr, depth);
    }
  }
  return found;
}

// True if the pointer at media offset slot_at (in an inode's direct array or
// a pointer block) continues a run with a neighbouring slot: files are
// allocated in runs, so a pointer written by the filesystem usually has a
// neighbour one block before or after it; a stray one rarely does.
bool Checker::ContinuesRun(uint64_t slot_at, uint64_t ptr) const {
  const uint64_t block_no = slot_at >> block_shift_;
  const auto* at = reinterpret_cast<const uint64_t*>(Block(block_no) + (slot_at & (block_size_ - 1)));
  const bool in_inode = !geometry_.IsDataBlock(block_no);
  uint64_t first = 0, last = block_size_ / 8;  // slots of the array around slot_at
  const uint64_t index = (slot_at & (block_size_ - 1)) / 8;
  if (in_inode) {
    // The direct array of the inode: kDirectPointers slots from the map.
    const uint64_t map = ((slot_at & (block_size_ - 1)) & ~uint64_t{format::kInodeSize - 1}) +
                         offsetof(Inode, map);
    first = map / 8;
    last = first + format::kDirectPointers;
  }
  const uint64_t before = index > first ? at[-1] : 0, after = index + 1 < last ? at[1] : 0;
  return (before != 0 && before + 1 == ptr) || (after != 0 && ptr + 1 == after);
}

bool Checker::BitmapMarks(uint64_t block_no) const {
  const uint32_t group = static_cast<uint32_t>(block_no / geometry_.blocks_per_group());
  return TestBit(Block(geometry_.BlockBitmapBlock(group)), block_no % geometry_.blocks_per_group());
}

// A free block for a copy: neither claimed nor set in the on-media bitmap
// (a block set there may belong to an inode pass 1 did not see), else one
// only unclaimed; 0 if there is none.
uint64_t Checker::FreeBlockForCopy(bool bitmap_free_only) {
  const Geometry& g = geometry_;
  for (int round = 0; round < (bitmap_free_only ? 1 : 2); ++round) {
    for (uint64_t n = 0; n < g.block_count(); ++n) {
      const uint64_t b = (copy_cursor_ + n) % g.block_count();
      if (b == 0 || Claimed(b) || !g.IsDataBlock(b)) continue;
      if (round == 0 && BitmapMarks(b)) continue;
      copy_cursor_ = b + 1;
      return b;
    }
  }
  return 0;
}

}  // namespace nvfs::fsck
