// Hashed directories (format.hpp and doc/format.md, "Directories"): a radix
// tree over the 40-bit name hash, cut to the levels needed; leaves hold the
// entries; the key (hash << 22 | seq, a 40-bit hash and a 22-bit sequence
// number) is also the readdir cookie (plus 3).
//
// Contracts shared by every function here:
//  - `dir` is a reference INTO THE MAPPING (ctx.InodeAt(ino)) of a directory
//    inode; the caller holds its lock: shared for Lookup/ReadDir, exclusive for
//    anything taking a Tx.
//  - Nothing here trusts the media: node pointers that name no data block
//    (FsContext::ValidBlock: outside the filesystem, or group metadata), bad
//    magic, bad rec_len or name_len, trees deeper than the hash bits allow and
//    overflow chains with cycles or longer than the directory's node count
//    are corruption (EUCLEAN), never followed out of the mapping, never looped
//    on forever; nodes are freed only through Allocator::FreeBlocks, which
//    refuses a block not in use or freed twice. Every public function
//    reports the damage it meets to ctx.damage.
//  - Changes follow write-before-publish (doc/integrity.md): a new entry is
//    written into a free record by logged stores (the record may have been
//    freed earlier in the same Tx, so its old bytes must come back on abort)
//    and made live by the logged store of its ino; new or rewritten nodes are
//    built in fresh blocks and published by logged stores of the parent
//    pointer(s); replaced blocks are freed through deferred-free records.
//  - Each change keeps dir.map.dir.entries (live entries), dir.size
//    (block_size * nodes) and dir.blocks (nodes) right, through the Tx.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "ctx/context.hpp"
#include "journal/journal.hpp"
#include "nvfs/format.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

struct DirEntryRef {
  uint64_t ino = 0;
  uint8_t file_type = 0;   // DT_*
  uint64_t key = 0;        // readdir cookie of this entry
  std::string_view name;   // points into the mapping; valid while the lock is held
};

class Directory {
 public:
  explicit Directory(const FsContext& ctx);

  // ENOENT if absent.
  Result<DirEntryRef> Lookup(const format::Inode& dir, std::string_view name) const;

  // Adds name -> ino. EEXIST if present; ENOSPC when no block is free or
  // when the journal slot is full. (Also when 2^22 names of the directory
  // share the name's 40-bit hash, every sequence number then being taken:
  // with the keyed hash no one can make that happen.) Names of one hash past
  // a leaf's capacity go to overflow leaves: slower, never refused. On
  // failure the caller aborts the Tx (nothing is published before the last
  // allocation).
  // REQUIRES: 1 <= name.size() <= kNameMax (else EINVAL / ENAMETOOLONG), name
  // has no '/' or NUL.
  Status Insert(Tx& tx, const format::Inode& dir, std::string_view name, uint64_t ino,
                uint8_t file_type);

  // Removes name. ENOENT if absent. A leaf left empty is unlinked and freed,
  // except the root leaf (kept, like lost+found's, to take names without
  // allocating).
  Status Remove(Tx& tx, const format::Inode& dir, std::string_view name);

  // Points an existing name at another inode (rename over an existing name):
  // one logged change of the record. ENOENT if absent.
  Status Replace(Tx& tx, const format::Inode& dir, std::string_view name, uint64_t ino,
                 uint8_t file_type);

  // Calls fn for every entry whose key >= from_key, in increasing key order,
  // until fn returns false. An entry that exists during the whole listing is
  // reported exactly once however the directory changes between calls that
  // resume at (last key + 1).
  Status ReadDir(const format::Inode& dir, uint64_t from_key,
                 const std::function<bool(const DirEntryRef&)>& fn) const;

  // Frees every node of the directory's tree (the directory must be empty or
  // being deleted), takes them off size and blocks, and sets root and entries
  // to 0. Same early-stop contract as Bmap::Truncate: true when done; false
  // when the journal slot ran low (about 1 KiB is left for the caller), the
  // tree then being smaller and still walkable, so the caller commits and
  // calls again in a new Tx.
  Result<bool> FreeTree(Tx& tx, const format::Inode& dir);

 private:
  // The bodies of the functions above, which report the damage they return.
  Result<DirEntryRef> LookupBody(const format::Inode& dir, std::string_view name) const;
  Status InsertBody(Tx& tx, const format::Inode& dir, std::string_view name, uint64_t ino,
                    uint8_t file_type);
  Status RemoveBody(Tx& tx, const format::Inode& dir, std::string_view name);
  Status ReplaceBody(Tx& tx, const format::Inode& dir, std::string_view name, uint64_t ino,
                     uint8_t file_type);
  Status ReadDirBody(const format::Inode& dir, uint64_t from_key,
                     const std::function<bool(const DirEntryRef&)>& fn) const;
  Result<bool> FreeTreeBody(Tx& tx, const format::Inode& dir);

  const FsContext& ctx_;
};

}  // namespace nvfs
