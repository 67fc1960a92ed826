// Reads that race with writers by design, all in one place, so that a race
// detector checks everything else (tools/tsan.sh):
//  - a lock-free reader of file data (src/fs/read.cpp: ReadInto's fast
//    path, each lock-free attempt of ReadSlow; ExtentMap::Build's walk)
//    loads the inode's size and mode, the bmap's pointers and the file's
//    bytes from the mapping under the file's sequence counter
//    (CachedInode::data_seq), without the inode lock, while a writer may be
//    changing any of them. Sound because nothing loaded there is used
//    unless the counter, loaded again after an acquire fence, still holds
//    the even value loaded before: otherwise the sink is reset or the built
//    map destroyed unpublished (doc/integrity.md section 8); and a torn
//    pointer is never followed outside the namespace (Bmap::Lookup checks
//    each against the geometry; a fault in the mapping fails the
//    RunFaultGuarded around the read). The DRAM loads there, of the extent
//    map, are loads of an object immutable once published (by an acq_rel
//    compare-exchange, read by an acquire load) and freed through epochs:
//    ignored too, so that reclamation is checked where it is tested on its
//    own (test_epoch; test_fs's "extent maps: replaced while other threads
//    read through them");
//  - a direct client copies file bytes out of the namespace under its
//    slot's sequence counter the same way (src/direct: CopyRacing);
//  - the io_uring transport copies a map-path read reply out of the
//    mapping (src/fuse/uring.cpp: CopyRacing): a read racing a write of the
//    same bytes, as POSIX allows; the MapGuard keeps the blocks the file's
//    until the reply is sent;
//  - ReadSlow, deciding whether a file's extent map is worth building,
//    compares the bmap work it did with the inode's block count, loaded
//    without the lock (LoadRacing): a hint, where any value the count held
//    lately only moves the build a little sooner or later;
//  - tests/unit/direct/direct_helper.cpp's churn reads a descriptor on three threads
//    while the main thread closes and reuses its number (dup2, close,
//    open): the race of a program with itself that the preload must
//    survive, serving the file the number names at each moment. The
//    detector sees a descriptor's use as a load and its close as a store;
//    the library's stores in those reads stay checked;
//  - InodeCache::CloseOpen loads the link count under the cache's mutex
//    while an unlink stores it under the inode's lock (LoadRacing): a hint
//    to free an unlinked file's data at its last close, checked again
//    under the inode's lock by FsImpl::FreeUnlinkedData;
//  - the /dev/fuse transport's writev (src/fuse/transport.cpp) of a
//    map-path read reply, whose runs point into the mapping: the kernel
//    copies them racing any write to the same bytes (a read racing a write,
//    as POSIX allows); the MapGuard keeps the blocks the file's until the
//    writev returns, and a bad page fails it with EFAULT, not a SIGBUS;
//  - Touch (src/fs/inode_rules.hpp) copies an inode to store its times,
//    while OrphanRemove may be rewriting its orphan_next under orphan_mu_
//    alone; the copy's orphan_next is never stored back (StoreInodeDiff
//    cuts it out).
// Under ThreadSanitizer (GCC and clang define __SANITIZE_THREAD__) these
// are bracketed by its ignore-reads annotations: loads only. Every store
// inside (the reader's buffer, the map being built), the counter's loads
// (atomics are always checked), the writers' side and everything else stay
// checked. Built without it, RacingReads is nothing and CopyRacing memcpy.
#pragma once

#include <cstddef>
#include <cstring>

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace nvfs {

// One attempt of a lock-free read under a sequence counter (the cases
// above): its plain loads may race with writers and are not reported.
// REQUIRES: it does not enclose a RunFaultGuarded (include/nvfs/media.hpp).
// A media error's jump out of the SIGBUS handler skips the destructors of
// the scopes inside the recovery point; the detector clears a thread's
// ignores when it enters a signal handler and a jump out of it does not
// restore them, so after the jump the thread checks every read again,
// which is right only if no scope was open at the recovery point (one that
// was would later end a scope the detector no longer counts: its CHECK
// fails, the process dies). So a scope goes inside the guarded function
// (ExtentMap::Build), or the guard outside the read (RecoverMediaErrors).
class RacingReads {
 public:
#if defined(__SANITIZE_THREAD__)
  [[gnu::always_inline]] RacingReads() { AnnotateIgnoreReadsBegin(__FILE__, __LINE__); }
  [[gnu::always_inline]] ~RacingReads() { AnnotateIgnoreReadsEnd(__FILE__, __LINE__); }
#else
  RacingReads() = default;
#endif
  RacingReads(const RacingReads&) = delete;
  RacingReads& operator=(const RacingReads&) = delete;
};

// memcpy from memory a writer may be changing meanwhile: the caller checks
// the copy afterwards (a sequence counter), or never uses the racing part.
[[gnu::always_inline]] inline void CopyRacing(void* dst, const void* src, size_t n) {
  [[maybe_unused]] const RacingReads racing;
  std::memcpy(dst, src, n);
}

// A load of a value a writer may be changing, used only as a hint: a stale
// or torn value costs time, never correctness.
template <class T>
[[gnu::always_inline]] inline T LoadRacing(const T& value) {
  [[maybe_unused]] const RacingReads racing;
  return value;
}

}  // namespace nvfs
