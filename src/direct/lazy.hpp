// Holes of writable shared direct maps, given their blocks at the first
// store into them, as on a DAX file system (doc/integrity.md section 13).
//
// Such a hole is mapped as anonymous zeros, registered with the process's
// userfaultfd for write-protection (UFFD_FEATURE_WP_UNPOPULATED): loads
// read the zero page and ask nothing; the first store into a page stops
// its thread in the kernel and sends the page's address to the library's
// resolver thread, which asks the daemon for the blocks of a bounded range
// around it, maps them over the zeros (or, when none can be had, a page
// past the end of a file: the store is retried and gets SIGBUS, as
// ext4-DAX gives at ENOSPC) and wakes the thread, whose store then lands
// in the block.
//
// The userfaultfd is made in full mode where the process may (the
// kernel's own accesses to the page, a read(2) into it, wait for the block
// too), else for faults from user mode only (the kernel's accesses to such
// a page fail with EFAULT until a store of the program's gave it a block).
// Without one (an older kernel, a seccomp filter) writable maps allocate
// their holes when they are made, as before (map.cpp).
#pragma once

#include <cstdint>

namespace nvfs::direct {

// Called on the resolver thread with the page a store stopped at; the
// callee maps something over it and calls LazyWake.
using LazyResolver = void (*)(uintptr_t page);

// Whether holes can be lazy in this process: the userfaultfd and its
// resolver thread, made at the first call.
bool LazyAvailable(LazyResolver resolver);
// Makes the anonymous pages just mapped at [at, at + len) stop the first
// store into each (LazyAvailable first). False if the kernel refused.
bool LazyProtect(uintptr_t at, uint64_t len);
// The threads stopped at stores into [at, at + len) go on: each store is
// made again, against what is mapped there now.
void LazyWake(uintptr_t at, uint64_t len);
// A child of fork: the parent's userfaultfd names the parent's memory and
// its resolver thread is not here; the child makes its own when it needs.
void LazyChildAfterFork();

}  // namespace nvfs::direct
