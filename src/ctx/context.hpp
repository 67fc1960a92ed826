// What the filesystem's modules share: the media, the geometry, the
// allocator, the journal and the directory hash key. Owned by Filesystem
// (and, for its reconnection to lost+found, by fsck).
//
// Its own layer, src/ctx: above the journal and the allocator (it holds
// both) and below what uses them through it (src/bmap, src/dir, src/fs), so
// every include points down. Not src/format, the bottom layer, which knows
// only the media and the geometry and must not reach up to the allocator.
#pragma once

#include <cstdint>

#include "alloc/allocator.hpp"
#include "journal/journal.hpp"
#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

// Told of damage the modules find on the media: a pointer that names no
// data block, a free of a block that is not in use or is freed twice, a
// damaged directory node or xattr block (doc/integrity.md, "Damage and
// faults"). The filesystem records it in the superblock's errors flag and,
// unless mounted with errors=continue, turns read-only. Safe from any
// thread, under any lock, inside an epoch guard and inside a Tx: it only
// notes the damage; the flag is written by a transaction of its own.
class DamageSink {
 public:
  virtual ~DamageSink() = default;
  virtual void Damaged(const Error& error) = 0;
};

struct FsContext {
  Media& media;
  const Geometry& geometry;
  Allocator& alloc;
  Journal& journal;
  NameHashKey hash_key;  // a secret (name_hash.hpp)
  DamageSink* damage = nullptr;  // none in module tests

  const std::byte* base() const { return media.base(); }
  // Block `block_no` in the mapping. REQUIRES: block_no < block_count.
  const std::byte* Block(uint64_t block_no) const {
    return media.base() + geometry.BlockOffset(block_no);
  }
  // True if `block_no`, read from the media, may be followed or freed: a
  // data block of some group (Geometry::IsDataBlock), so never 0, never
  // outside the filesystem, never group metadata or the journal.
  bool ValidBlock(uint64_t block_no) const { return geometry.IsDataBlock(block_no); }
  // Reports damage (if anyone listens) and hands the error back, for
  // `return ctx.Damaged(error);`. Only errors of damaged media go here, never
  // ENOSPC or a full journal slot.
  Error Damaged(Error error) const {
    if (damage != nullptr) damage->Damaged(error);
    return error;
  }
  // The same for a Status or Result that failed with EUCLEAN (what the
  // modules return for damage): the boundary of a module's public function.
  template <class R>
  R Checked(R result) const {
    if (!result.ok() && result.error().code == EUCLEAN && damage != nullptr) {
      damage->Damaged(result.error());
    }
    return result;
  }
  const format::Inode& InodeAt(uint64_t ino) const {
    return *reinterpret_cast<const format::Inode*>(media.base() + geometry.InodeOffset(ino));
  }
};

}  // namespace nvfs
