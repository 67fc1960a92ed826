// What the filesystem's modules share: the media, the geometry, the
// allocator, the journal and the directory hash key. Owned by Filesystem.
#pragma once

#include <cstdint>

#include "alloc/allocator.hpp"
#include "journal/journal.hpp"
#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "nvfs/name_hash.hpp"

namespace nvfs {

struct FsContext {
  Media& media;
  const Geometry& geometry;
  Allocator& alloc;
  Journal& journal;
  NameHashKey hash_key;  // a secret (name_hash.hpp)

  const std::byte* base() const { return media.base(); }
  // Block `block_no` in the mapping. REQUIRES: block_no < block_count.
  const std::byte* Block(uint64_t block_no) const {
    return media.base() + geometry.BlockOffset(block_no);
  }
  // True if `block_no` may be followed: inside the filesystem and not 0.
  bool ValidBlock(uint64_t block_no) const {
    return block_no != 0 && block_no < geometry.block_count();
  }
  const format::Inode& InodeAt(uint64_t ino) const {
    return *reinterpret_cast<const format::Inode*>(media.base() + geometry.InodeOffset(ino));
  }
};

}  // namespace nvfs
