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
// Containment (with a census, containment.hpp): every file the mutation did
// not touch, and the changes of step 3 did not change on purpose, reads its
// recorded bytes on the read-only mount, on the read-write mount after the
// changes, after fsck -y of the changed image (which fsck -n must then find
// clean) and on the mount after step 4's repair. Each must also still be
// readable, except on a mount of an image whose global metadata (bitmaps,
// superblock, ...) the mutation changed, before fsck -y: see `hidden`. These findings go to
// `containment`, apart from `violations`: the suite decides whether they
// fail it (test_fuzz.cpp, NVFS_FUZZ_CONTAINMENT).
//
// Crashes, sanitizer reports and hangs are caught around this (the suite's
// watchdog, libFuzzer); everything else is a violation in the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arena_media.hpp"
#include "containment.hpp"

namespace nvfs::fuzz {

struct CaseOptions {
  uint64_t max_entries = 2048;       // directory entries walked, in all
  uint64_t max_read = 64 << 10;      // bytes read per window of a file
  bool repair = true;                // step 4
  bool verbose = false;              // print what fsck says (replaying one case)
  const Census* census = nullptr;    // the seed's census: check containment
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
  Touch touch;                          // what the mutation changed (with a census)
  uint64_t changed_on_purpose = 0;      // the existing file step 3 overwrote, or 0
  // Containment failures, each "<where>: <what>" (with a census).
  std::vector<std::string> containment;
  // Untouched files a mount could not read after a mutation of global
  // metadata, their bytes not known to be lost (not failures; counted).
  std::vector<std::string> hidden;
};

// Runs the case on the arena's current content, then undoes what the case
// wrote (Arena::UndoStores), so the arena holds the mutated image again.
CaseResult RunCase(Arena& arena, const CaseOptions& options);

}  // namespace nvfs::fuzz
