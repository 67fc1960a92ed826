// The one entry point of the corrupted-image suite and of the libFuzzer
// target: given an image in an Arena (a seed with mutations applied), run
// everything a user could run on it and check what must hold whatever the
// image holds:
//
//  1. fsck -n (the library) terminates and writes nothing;
//  2. a read-only mount writes nothing; what mounts is walked with every
//     read-only operation: readdir, lookup (also "." and ".."), getattr,
//     readlink, the three read paths (which must return the same bytes),
//     lseek SEEK_DATA/SEEK_HOLE, listxattr and getxattr;
//  3. a read-write mount that fails has written nothing; one that succeeds
//     is walked the same way, then changed (create, write with a hole,
//     punch, zero range, setxattr, truncate, link, rename, mkdir, symlink,
//     unlink, rmdir; an existing file overwritten and truncated: any error
//     allowed, no crash) and unmounted;
//  4. (with repair) on the mutated image again, fsck -y, then fsck -n finds
//     nothing unless -y said it could not repair everything; the repaired
//     image mounts, walks without an I/O error, and is still clean after.
//
// Crashes, sanitizer reports and hangs are caught around this (the suite's
// watchdog, libFuzzer); everything else is a violation in the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arena_media.hpp"

namespace nvfs::fuzz {

struct CaseOptions {
  uint64_t max_entries = 2048;       // directory entries walked, in all
  uint64_t max_read = 64 << 10;      // bytes read per window of a file
  bool repair = true;                // step 4
  bool verbose = false;              // print what fsck says (replaying one case)
};

struct CaseResult {
  int fsck_exit = -1;        // fsck -n on the mutated image
  bool mounted_ro = false;
  bool mounted_rw = false;
  std::string mount_error;   // why the read-write mount failed
  int repair_exit = -1;      // fsck -y
  int after_repair_exit = -1;
  uint64_t entries = 0;      // entries walked (all walks)
  uint64_t io_errors = 0;    // EIO/EUCLEAN met while walking the mutated image
  uint64_t changes = 0;      // changes that succeeded on the mutated image, read-write
  std::vector<std::string> violations;  // empty: every property held
};

// Runs the case on the arena's current content, then undoes what the case
// wrote (Arena::UndoStores), so the arena holds the mutated image again.
CaseResult RunCase(Arena& arena, const CaseOptions& options);

}  // namespace nvfs::fuzz
