// Checking and repairing a namespace: the library behind fsck.nvfs.
//
// What is checked: the superblock copies, checksums and feature bits; the
// journal (slot headers; a filesystem that needs recovery is recovered by -p
// and -y, and checked by -n as recovery would leave it); group descriptors and
// free counters; every allocated inode (mode, flags, size, file maps: pointers
// in range, not into metadata, not shared; inode.blocks; xattr blocks;
// symlinks); every directory (node pointers, leaf headers and prefixes, the
// record chain, names and keys, entry counts, targets, parents); that every
// directory is reachable from the root exactly once; link counts; the orphan
// list; and the block and inode bitmaps against what is reachable.
//
// Modes, as fsck(8): -n changes nothing (the namespace may be opened
// read-only); -p makes the repairs that need no decision (counters, leaked
// blocks and inodes, link counts, unattached inodes to /lost+found, the orphan
// list, journal recovery) and stops at the first problem that does, with exit
// code 4; -y makes every repair (bad pointers cleared, bad entries dropped,
// invalid inodes cleared).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nvfs/media.hpp"

namespace nvfs {

// Exit codes, as fsck(8) defines them (they add up).
inline constexpr int kFsckClean = 0;
inline constexpr int kFsckCorrected = 1;
inline constexpr int kFsckUncorrected = 4;
inline constexpr int kFsckOperational = 8;
inline constexpr int kFsckUsage = 16;

enum class RepairMode {
  kNone,  // -n: open read-only, change nothing
  kPreen, // -p: make the repairs that need no decision
  kYes,   // -y: make every repair offered
};

struct FsckReport {
  int exit_code = kFsckClean;
  uint64_t problems = 0;   // found
  uint64_t corrected = 0;  // of those, repaired
  uint64_t inodes_used = 0;
  uint64_t inode_count = 0;
  uint64_t blocks_used = 0;
  uint64_t block_count = 0;
  bool clean_state = false;  // the superblock says the last unmount was clean
  bool halted = false;       // -p stopped at a problem that needs -y
  uint64_t inodes_checked = 0;   // allocated inodes examined
  uint64_t directories = 0;      // directory inodes examined
  uint64_t entries = 0;          // directory entries examined
  double seconds = 0;            // time the check took
  std::vector<std::pair<std::string, double>> pass_seconds;  // time per pass
};

// Checks `media` (writable unless mode == kNone). `say` receives one line per
// finding, without a newline. `progress(done, total)` is called as the check
// advances: once per group in each of the two long passes (inodes, then
// directories), so total is twice the group count.
// `threads`: how many threads the inode and directory passes may use (0: as
// many as the machine has, at most 8); the findings and repairs are the same
// whatever the number.
// Thread safety: the caller must have the namespace to itself (OpenMedia's
// lock); the callbacks are called from the calling thread.
FsckReport CheckNamespace(Media& media, RepairMode mode,
                          const std::function<void(const std::string&)>& say,
                          const std::function<void(uint64_t, uint64_t)>& progress = {},
                          unsigned threads = 0);

}  // namespace nvfs
