// Internals shared by the bmap code (bmap.cpp: reading and mapping for
// write; punch.cpp: truncate and punch): journal costs, pointer stores, and
// the structs behind Bmap's private declarations. Nothing outside src/bmap
// includes this.
#pragma once

#include <algorithm>

#include "bmap/bmap.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::bmap_detail {

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
inline void StorePointers(Tx& tx, uint64_t at, uint64_t first, uint64_t n, bool logged) {
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

inline Error SlotFull() { return MakeError(ENOSPC, "journal slot full"); }

}  // namespace nvfs::bmap_detail

namespace nvfs {

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
  uint32_t off[format::kIndirectPointers] = {};          // offset in the block at each level
  uint64_t slot_at[format::kIndirectPointers + 1] = {};  // pointer at each level; [depth]: data
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

}  // namespace nvfs
