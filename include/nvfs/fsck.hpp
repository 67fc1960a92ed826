// Checking (and, where safe, repairing) a namespace: the library behind
// fsck.nvfs. This version checks the superblock copies, checksums, feature
// bits, group descriptors and bitmaps' fixed bits, and the journal headers;
// the full tree check comes with the crash-safety work.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

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
};

// Checks `media` (writable unless mode == kNone). `say` receives one line per
// finding, without a newline. `progress` is called per group.
FsckReport CheckNamespace(Media& media, RepairMode mode,
                          const std::function<void(const std::string&)>& say,
                          const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace nvfs
