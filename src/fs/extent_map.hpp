// A DRAM picture of a regular file's block mapping, for the lock-free read
// paths (read.cpp): the file as a sorted list of runs, each either a hole or
// contiguous bytes in the mapping, plus a coarse index into that list. A
// read finds the run holding any byte in a bounded number of steps and
// copies it in one piece, instead of walking the bmap and comparing one
// pointer per block (the on-media format has no extents, doc/format.md).
//
// An ExtentMap is immutable and describes the file as of one value of its
// inode's data_seq (CachedInode): any change of the mapping or the size
// bumps that counter, which makes the map stale; readers compare, and
// readers that found the map stale rebuild it (read.cpp says when). Nothing
// else ever changes it, so it needs no lock; a replaced map is freed through
// epoch-based reclamation (include/nvfs/epoch.hpp) because readers hold no lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bmap/bmap.hpp"
#include "ctx/context.hpp"
#include "nvfs/format.hpp"

namespace nvfs {

class ExtentMap {
 public:
  struct Run {
    const std::byte* addr;  // the byte asked for, in the mapping; nullptr: a hole
    uint64_t len;           // bytes from there to the end of the run
  };

  // Reads the mapping of the regular file `inode` from the bmap, expected to
  // be as of data_seq `seq`, in at most `max_runs` runs (>= 1): covered()
  // stops there, and the rest is left to the bmap. Safe to run while a
  // writer changes the file (it never follows a pointer outside the
  // filesystem), but the caller must then discard the result: it is right
  // only if data_seq still equals `seq` afterwards. nullptr if out of memory.
  static ExtentMap* Build(const FsContext& ctx, const Bmap& bmap, const format::Inode& inode,
                          uint64_t seq, uint32_t max_runs);
  static void Destroy(ExtentMap* map);
  static void DestroyErased(void* map) { Destroy(static_cast<ExtentMap*>(map)); }

  uint64_t seq() const { return seq_; }
  // The file's size as of seq().
  uint64_t size() const { return size_; }
  // Bytes [0, covered()) are described; covered() >= size() unless the file
  // has more than max_runs runs or a corrupt block pointer (reads there use
  // the bmap, which reports it).
  uint64_t covered() const { return covered_; }

  // The run holding byte `pos`. REQUIRES: pos < covered().
  Run At(uint64_t pos) const {
    const uint64_t chunk = pos >> chunk_shift_;
    // The run holding `pos` lies between those holding the first byte of its
    // chunk and of the next chunk: usually the first.
    const Entry* e = entries_ + index_[chunk];
    if (e[1].start <= pos) [[unlikely]] {
      const Entry* last = entries_ + index_[chunk + 1];
      ++e;
      while (e != last) {
        const Entry* mid = e + (last - e + 1) / 2;
        if (mid->start <= pos) {
          e = mid;
        } else {
          last = mid - 1;
        }
      }
    }
    return {e->addr != nullptr ? e->addr + (pos - e->start) : nullptr, e[1].start - pos};
  }

 private:
  struct Entry {
    uint64_t start;         // file byte offset of the run
    const std::byte* addr;  // its first byte in the mapping; nullptr: a hole
  };

  ExtentMap() = default;

  uint64_t seq_ = 0;
  uint64_t size_ = 0;
  uint64_t covered_ = 0;
  uint32_t count_ = 0;        // runs; entries_[count_].start == covered_
  uint32_t chunk_shift_ = 0;  // index granularity: 2^chunk_shift_ bytes
  const Entry* entries_ = nullptr;
  // Per chunk, the run holding its first byte; then the last run.
  const uint32_t* index_ = nullptr;
};

}  // namespace nvfs
