// Formatting a namespace (the library behind mkfs.nvfs, also used by tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nvfs/cli.hpp"
#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

struct MkfsOptions {
  uint32_t block_size = 4096;
  uint64_t inode_count = 0;      // -N
  uint64_t bytes_per_inode = 0;  // -i
  std::string label;             // -L, at most 63 bytes
  std::optional<Uuid> uuid;      // -U; random when absent
  uint32_t journal_slots = 0;
  uint32_t journal_slot_size = 0;
  // Incompatible features (tests: 0 makes a namespace as mkfs 2.0 did, with
  // one-block xattrs).
  uint64_t feature_incompat = format::kIncompatKnown;
  int64_t now = 0;               // timestamps; 0: the current time
  // The directory hash key (tests: a fixed one); absent: 16 bytes of getrandom(2).
  std::optional<std::array<uint8_t, 16>> dir_hash_key;
  uint32_t root_uid = 0;         // owner of the root directory
  uint32_t root_gid = 0;
  // -P: have the host back the whole namespace at format time (a sparse
  // image file then never runs out of host space under the mount).
  bool preallocate = false;
};

// Everything mkfs will write, decided before anything is written.
struct MkfsPlan {
  Geometry geometry;
  format::SuperStatic super{};
  uint64_t free_blocks = 0;
  uint64_t free_inodes = 0;
  uint32_t first_generation = 0;
  uint32_t root_uid = 0;
  uint32_t root_gid = 0;
  bool preallocate = false;  // MkfsOptions::preallocate
};

// Checks the options against a namespace of `namespace_size` bytes. EINVAL or
// ENOSPC with a one-line message; nothing is touched.
Result<MkfsPlan> PlanMkfs(uint64_t namespace_size, const MkfsOptions& options);

// A filesystem signature found on the namespace (ours or a foreign one).
struct Signature {
  std::string name;      // "nvfs", "ext2/ext3/ext4", "xfs", "btrfs", ...
  uint64_t offset = 0;   // where its magic lies
  uint32_t length = 0;   // bytes of the magic
};
std::vector<Signature> DetectSignatures(const std::byte* base, uint64_t size);

// Writes the plan to `media`, and reports progress per group.
// Before anything is written, the host backs what is written (or, with
// plan.preallocate, the whole namespace); ENOSPC if it cannot.
// Store order (so a crash in the middle never leaves a namespace that looks
// like a valid nvfs): (1) wipe every known signature, nvfs static superblocks
// whole (and the places the new copies go), persisted; (2) group metadata,
// journal, root and lost+found, persisted; (3) the dynamic superblock and the
// backup static copy, persisted; (4) the primary static superblock, persisted.
Status WriteMkfs(Media& media, const MkfsPlan& plan,
                 const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace nvfs
