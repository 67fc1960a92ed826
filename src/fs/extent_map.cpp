// Building extent maps (extent_map.hpp).
#include "fs/extent_map.hpp"

#include <algorithm>
#include <new>
#include <vector>

#include "util/races.hpp"

namespace nvfs {

ExtentMap* ExtentMap::Build(const FsContext& ctx, const Bmap& bmap, const format::Inode& inode,
                            uint64_t seq, uint32_t max_runs) {
  const uint32_t shift = ctx.geometry.block_shift();

  // The runs, merged where the bmap's lookups split one (Lookup stops at
  // most runs' ends, not all).
  std::vector<Entry> runs;
  try {
    runs.reserve(std::min<uint64_t>(max_runs, 64));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  uint64_t size = 0;
  uint64_t index = 0;
  // A media error in a pointer block (media.hpp) abandons the build: only
  // the loads of the walk are inside the recovery point; `runs` is outside
  // it and freed as usual. (push_back may allocate inside it, but a jump
  // never interrupts it: it touches no mapped byte.)
  bool faulted = false;
  if (!RunFaultGuarded([&] {
    // The inode and the bmap may be changing meanwhile: the caller discards
    // the map unless data_seq still equals seq (src/util/races.hpp).
    [[maybe_unused]] const RacingReads racing;
    size = inode.size;
    // Past max_blocks() nothing can be mapped (an inode's size may say
    // otherwise on a damaged image): the map stops there, so covered()
    // stays below 2^63.
    const uint64_t blocks = std::min(
        bmap.max_blocks(), (size >> shift) + ((size & ((uint64_t{1} << shift) - 1)) != 0));
    while (index < blocks) {
      uint64_t run;
      const uint64_t phys = bmap.Lookup(inode, index, blocks - index, &run);
      if (phys == Bmap::kCorrupt) break;
      const std::byte* addr = phys != 0 ? ctx.Block(phys) : nullptr;
      const bool extends =
          !runs.empty() && (phys == 0 ? runs.back().addr == nullptr
                                      : runs.back().addr != nullptr &&
                                            runs.back().addr + ((index << shift) - runs.back().start) == addr);
      if (!extends) {
        if (runs.size() == max_runs) break;
        try {
          runs.push_back({index << shift, addr});
        } catch (const std::bad_alloc&) {
          faulted = true;
          return;
        }
      }
      index += run;
    }
  })) {
    return nullptr;
  }
  if (faulted) return nullptr;
  const uint64_t covered = index << shift;
  const uint32_t count = static_cast<uint32_t>(runs.size());

  uint32_t chunk_shift = shift;
  uint64_t chunks = 0;
  if (count != 0) {
    // About one run per chunk at most, so the index is no larger than the runs.
    while (((covered - 1) >> chunk_shift) + 1 > count) ++chunk_shift;
    chunks = ((covered - 1) >> chunk_shift) + 1;
  }

  const size_t entries_bytes = sizeof(Entry) * (count + 1);
  const size_t bytes = sizeof(ExtentMap) + entries_bytes + sizeof(uint32_t) * (chunks + 1);
  void* memory = ::operator new(bytes, std::nothrow);
  if (memory == nullptr) return nullptr;
  auto* map = new (memory) ExtentMap();
  auto* entries = reinterpret_cast<Entry*>(static_cast<std::byte*>(memory) + sizeof(ExtentMap));
  auto* index_of = reinterpret_cast<uint32_t*>(reinterpret_cast<std::byte*>(entries) + entries_bytes);
  std::copy(runs.begin(), runs.end(), entries);
  entries[count] = {covered, nullptr};
  uint32_t e = 0;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t first_byte = c << chunk_shift;
    while (entries[e + 1].start <= first_byte) ++e;
    index_of[c] = e;
  }
  index_of[chunks] = count == 0 ? 0 : count - 1;

  map->seq_ = seq;
  map->size_ = size;
  map->covered_ = covered;
  map->count_ = count;
  map->chunk_shift_ = chunk_shift;
  map->entries_ = entries;
  map->index_ = index_of;
  return map;
}

void ExtentMap::Destroy(ExtentMap* map) {
  if (map == nullptr) return;
  map->~ExtentMap();
  ::operator delete(map);
}

}  // namespace nvfs
