// The workloads of the crash suite, by group (each a meson test of suite
// `crash`). They run on the standard namespace (crash_harness.hpp).
#pragma once

#include <cstddef>
#include <vector>

#include "crash_harness.hpp"

namespace nvfs::test {

// The standard namespace with 4 KiB journal slots: long operations take
// several transactions.
extern const ImageSpec kSmallSlots;

// Every metadata operation on its own, ENOSPC aborts.
std::vector<Workload> MetadataWorkloads();
// Appends, overwrites, holes, extending writes.
std::vector<Workload> DataWorkloads();
// Leaf splits, mkdir and rename into a split directory, rmdir of a grown one.
std::vector<Workload> DirectoryWorkloads();
// Truncations, unlinks and fallocates needing several transactions, mounts
// that recover orphans, a clean unmount.
std::vector<Workload> LongWorkloads();
// Direct writers' writes (src/direct/write.cpp): blocks allocated, the
// bytes stored from the client's mapping, then the commit; a hole filled;
// an append through a reserve; a reserve left unused and given back.
std::vector<Workload> DirectWriteWorkloads();
// Direct writers' appends by word (src/fs/direct.cpp): the word opened by a
// commit, moved by the client's stores alone, folded by the mount after a
// crash, closed by a truncation. A group of their own: the core stores the
// word directly in the mapping, past the media layer, and the recording
// media's write protection stops the process there (their setup's commit).
std::vector<Workload> AppendWordWorkloads();
// A few of the above on 64 KiB blocks.
std::vector<Workload> LargeBlockWorkloads();
// 48 seeded two-operation sequences.
std::vector<Workload> SequenceWorkloads();
// Offline grows of a full filesystem, and writes into what they added
// (crash_grow.cpp).
std::vector<Workload> GrowWorkloads();

// How many names /d1/sub takes before its first leaf splits (the hash seed is
// fixed, so this is the same on every run); 0 if it could not be measured.
size_t NamesBeforeSplit();

}  // namespace nvfs::test
