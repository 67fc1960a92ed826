// Reads that race with writers by design, all in one place, so that a race
// detector checks everything else (tools/tsan.sh):
//  - a lock-free reader copies file bytes out of the mapping under the
//    file's sequence counter (CachedInode::data_seq, or a direct client's
//    slot) and throws the copy away when the counter moved, so bytes a
//    racing writer was changing are never returned (doc/integrity.md
//    sections 8 and 10);
//  - FsOps::Touch copies an inode to store its times, while OrphanRemove
//    may be rewriting its orphan_next under orphan_mu_ alone; the copy's
//    orphan_next is never stored back (StoreInodeDiff cuts it out).
// Under ThreadSanitizer (GCC and clang define __SANITIZE_THREAD__) these
// copies are bracketed by its ignore annotations; the counter's loads, the
// writers' stores and every other access stay checked. Elsewhere they are a
// plain memcpy.
#pragma once

#include <cstddef>
#include <cstring>

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace nvfs {

// memcpy from memory a writer may be changing meanwhile: the caller checks
// the copy afterwards (a sequence counter), or never uses the racing part.
[[gnu::always_inline]] inline void CopyRacing(void* dst, const void* src, size_t n) {
#if defined(__SANITIZE_THREAD__)
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  std::memcpy(dst, src, n);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace nvfs
