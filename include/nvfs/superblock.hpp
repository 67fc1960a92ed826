// Reading and checking the superblock and group descriptors: shared by mount,
// mkfs and fsck. Pure functions over bytes; nothing here writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

uint32_t SuperStaticChecksum(const format::SuperStatic& sb);
uint32_t SuperDynamicChecksum(const format::SuperDynamic& sb);
uint32_t GroupDescChecksum(const format::GroupDesc& desc);

// Checks magic, version, checksum, incompatible features and geometry of a
// static superblock for a namespace of `namespace_size` bytes. Errors carry a
// one-line message: EUCLEAN (damaged), EPROTONOSUPPORT (version or features).
Result<Geometry> CheckSuperStatic(const format::SuperStatic& sb, uint64_t namespace_size);

// Checks magic, checksum and state of the dynamic half.
Status CheckSuperDynamic(const format::SuperDynamic& sb);

// Feature bits in ro_compat that this code does not know: the namespace may be
// opened read-only only.
inline uint64_t UnknownRoCompat(const format::SuperStatic& sb) {
  return sb.feature_ro_compat & ~format::kRoCompatKnown;
}

// A static superblock found on a namespace.
struct FoundSuper {
  Geometry geometry;
  format::SuperStatic sb;
  bool from_backup = false;   // the primary was unusable
  std::string primary_error;  // why, when from_backup
  // A grow was interrupted (its transaction is active in the journal): `sb`
  // is the primary as recovery will leave it, the geometry before the grow,
  // and copies of the grown geometry's static half may lie past its end
  // until recovery removes them (format.md, "Growing").
  bool grow_undone = false;
};

// Finds the static superblock of the namespace at [base, base + size): the
// primary in block 0 as journal recovery will leave it (an interrupted grow's
// undo records applied to a copy: UndoInterruptedGrow), else the backup copy
// at the end of the last block (tried for every block size). Reads nothing
// outside the range. Fails with the primary's error when neither is usable.
Result<FoundSuper> FindSuper(const std::byte* base, uint64_t size);

// Applies to `sb` (a copy of the primary static half) the undo records a grow
// logged for it, if a journal slot holds an active grow: the records at the
// head of an active slot whose targets lie inside the primary static half
// (only a grow writes such records, first in its transaction). The journal
// is found from the fields of `sb` a grow never changes (block size, inode
// table, journal geometry), each checked to lie inside [base, base + size)
// before it is read. True if a record was applied.
bool UndoInterruptedGrow(const std::byte* base, uint64_t size, format::SuperStatic* sb);

// Byte offsets of every place a backup static superblock could be, for each
// block size: the end of the last whole block, or, when mkfs left out a last
// group too short for its metadata, the end of the last whole group. mkfs
// clears them all when it re-formats.
template <class Fn>
void ForEachBackupCandidate(uint64_t size, Fn&& fn) {
  for (uint64_t bs = format::kMinBlockSize; bs <= format::kMaxBlockSize; bs <<= 1) {
    const uint64_t blocks = size / bs;
    if (blocks < 2) break;
    fn(blocks * bs - format::kSuperHalfSize, static_cast<uint32_t>(bs));
    const uint64_t whole_groups = blocks / (bs * 8) * (bs * 8);
    if (whole_groups != 0 && whole_groups != blocks) {
      fn(whole_groups * bs - format::kSuperHalfSize, static_cast<uint32_t>(bs));
    }
  }
}

}  // namespace nvfs
