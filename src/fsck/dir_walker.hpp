// Pass 2's walk of one directory, Checker::DirWalker: its tree — node
// pointers, index slots, leaf headers, overflow chains — in
// fsck_dir_tree.cpp, and its records and entries in fsck_dir_entries.cpp.
// fsck_dirs.cpp runs it over every directory. Only those three files include
// this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fsck/checker.hpp"
#include "nvfs/format.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

// One directory's walk. Every pointer is checked before it is followed, and
// every block claimed before it is read as a node, so a loop in the tree is a
// block met twice.
class Checker::DirWalker {
 public:
  // `entries` is scratch space, reused from one directory to the next. With
  // `targets` (a pass on threads), the inodes entries name are logged there,
  // to be counted once the threads are joined, instead of counted at once.
  DirWalker(Checker& checker, DirInfo& dir, std::vector<ChainEntry>& entries,
            std::vector<uint32_t>* targets)
      : c_(checker),
        dir_(dir),
        inode_(checker.InodeAt(dir.ino)),
        shape_(checker.block_shift_),
        live_(!checker.DeadDir(dir)),
        hash_key_(NameHashKey::FromSuper(checker.super_)),
        entries_(entries),
        targets_(targets) {}

  // Returns the entries found.
  uint64_t Run();

 private:
  // The tree (fsck_dir_tree.cpp).
  uint32_t End(int depth) const { return shape_.End(depth); }
  uint32_t Width(int depth) const { return shape_.Width(depth); }
  const format::DirLeafHeader& Leaf(uint64_t block) const {
    return *reinterpret_cast<const format::DirLeafHeader*>(c_.Block(block));
  }

  // The pointer's own check, then the block's against what the check has
  // met so far (a block claimed: metadata, or reached before).
  const char* PointerFault(uint64_t ptr, uint64_t* block) const;
  // The header of a leaf reached through a slot of a depth-`depth` index node
  // whose hashes begin with `path_bits` (End(depth) bits).
  // An overflow link above the last level is no fault here: VisitChain
  // cuts it and keeps the leaf.
  const char* LeafHeaderFault(uint64_t block, int depth, uint64_t path_bits) const;
  // Reports a bad node pointer and, if repaired, clears the `count` slots
  // from media offset `at` that hold it.
  void ClearSlots(uint64_t at, uint64_t count, uint64_t ptr, const char* why);
  // The checked and claimed index node `block` at `depth`, whose hashes
  // begin with `high_bits` (Start(depth) bits): its slots and what they name.
  void VisitIndex(uint64_t block, int depth, uint64_t high_bits);
  // The leaf chain headed by the checked and claimed leaf `head`.
  void VisitChain(uint64_t head);

  // Records and entries (fsck_dir_entries.cpp).
  // The records of one leaf: the rec_len chain must end exactly at the end of
  // the block; a broken chain loses the rest of the leaf.
  void ScanLeaf(uint64_t block, uint32_t prefix_bits, uint64_t prefix);
  void CheckRecord(uint64_t at, const std::byte* in_leaf, const format::DirEntry& record,
                   uint32_t prefix_bits, uint64_t prefix);
  // Reports an entry and, if repaired, frees its record (at media offset `at`).
  void Drop(uint64_t at, const char* name, size_t len, uint64_t ino, const char* why);
  // The chain's entries, each key once and each name once; then their targets.
  // Entries are taken in key order; one repeating the key or the name of an
  // earlier entry still kept is dropped. Names are compared within a run of
  // one hash only (a set of them when the run is long: a chain may hold any
  // number of names of one hash).
  void CheckChainEntries();
  // An entry that passed every check of its own: its target.
  void Target(ChainEntry& e);

  Checker& c_;
  DirInfo& dir_;
  const format::Inode& inode_;
  const DirTreeShape shape_;
  const bool live_;  // not an unlinked directory being freed
  const NameHashKey hash_key_;
  std::vector<ChainEntry>& entries_;  // of the leaf chain being checked
  std::vector<uint32_t>* const targets_;
  uint64_t nodes_ = 0;
  uint64_t entries_found_ = 0;
  uint32_t subdirs_found_ = 0;
};

}  // namespace nvfs::fsck
