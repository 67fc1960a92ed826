// The seed images the corrupted-image suite mutates, built in memory through
// mkfs and the filesystem core (fixed hash seed, UUID and times, so the layout
// is the same on every run; inode generations are random, as always).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace nvfs::fuzz {

struct Seed {
  std::string name;
  std::vector<std::byte> image;
};

// "fresh": a new namespace. "populated": directories four deep, files with
//   data in the direct pointers and in trees of depth 1, 2 and 3, inline and
//   long symlinks, xattrs on a file and a directory, hard links, a FIFO and a
//   device, and a directory big enough for index nodes and split leaves.
// "orphans": the populated namespace as a crash leaves it while two unlinked
//   files are still open (on the orphan list, not cleanly unmounted).
// "recovery": the populated namespace as a crash leaves it in the middle of
//   an operation (a journal slot active, with its undo records).
// "full": a small namespace filled until no block is left.
// "big-blocks": the populated tree on 64 KiB blocks.
// "two-groups": two groups and 40 directories, where fsck runs its passes on
//   several threads.
// "collisions": a directory whose names share one hash (forced through the
//   test hook for the whole process): a chain of overflow leaves.
std::vector<Seed> BuildSeeds();

// One seed by name (built alone); empty image if the name is unknown.
Seed BuildSeed(const std::string& name);

}  // namespace nvfs::fuzz
