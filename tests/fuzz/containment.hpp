// Containment (issue 12, item 4): damage to one file's structures must stay
// in that file. Before a seed is mutated, a Census records, from the intact
// image, every live regular file's and symlink's bytes and which blocks each
// inode owns; after a mutation the census says which inodes it touched, and
// every other file must still read its recorded bytes, looked up by inode
// number (a file whose name was damaged may lose its name, never its bytes).
//
// "Touched", exactly:
//  - the mutation is the set of bytes whose value it changed (a poke that
//    writes the bytes already there, as a checksum recomputed over an
//    unchanged field, changes nothing);
//  - a changed byte in a block an inode owns touches that inode. An inode
//    owns the inode-table block its inode lies in (so a change anywhere in
//    that block touches all the inodes of the block), its xattr block, and
//    for a regular file or a long symlink every pointer and data block of its
//    map, for a directory every index node and leaf (overflow leaves
//    included). Ownership is the union over the seed as stored and as its
//    first read-write mount leaves it (journal recovery, orphans reclaimed);
//  - a changed byte in the superblock block, the backup superblock block, a
//    group descriptor, a block or inode bitmap, or the journal is global: it
//    touches no inode by itself, but is named (Global*) so a violation after
//    it is told apart from one after a mutation of a file's own structures.
//    The same demand holds there: an untouched file keeps its bytes, or the
//    mount refuses the image (then there is nothing to check);
//    One exception: a changed byte in the journal also touches the inodes of
//    the operation in flight in the seed (the inodes whose bytes, bitmap
//    bits or blocks the records of an active slot name), since recovery
//    cannot be asked to roll back an operation whose log was damaged;
//  - a changed byte in a free block touches nothing.
// Files the read-write pass changes on purpose (the existing file it
// overwrites and truncates) are excluded by the caller, by inode number.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "arena_media.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/geometry.hpp"

namespace nvfs::fuzz {

// What a containment failure does to the suite (test_fuzz.cpp, and the
// regression cases of test_regressions.cpp): kStrict fails it; kLocal fails
// it only after a mutation that changed no global metadata; kReport prints
// it loudly and passes; kOff skips the check.
enum class ContainmentMode { kOff, kReport, kLocal, kStrict };
// The one constant (issue 12, item 4): kStrict since the repair rules of
// doc/integrity.md section 9 (the mount's cross-check of the bitmaps
// against the files and the entries, fsck's copies of shared blocks,
// bit-clear inodes, directories and the root kept when an entry or the
// format names them, the superblock copy the namespace agrees with, undo
// records inside one block).
inline constexpr ContainmentMode kContainmentDefault = ContainmentMode::kStrict;
// NVFS_FUZZ_CONTAINMENT=off|report|local|strict, else kContainmentDefault.
ContainmentMode ContainmentModeFromEnv();
const char* ModeName(ContainmentMode mode);

// Kinds of global metadata a mutation changed (bit set).
enum GlobalKind : uint32_t {
  kGlobalSuper = 1u << 0,    // block 0 (static and dynamic superblock) or the backup block
  kGlobalGroup = 1u << 1,    // a group descriptor
  kGlobalBitmap = 1u << 2,   // a block or inode bitmap
  kGlobalJournal = 1u << 3,  // the journal
};
std::string GlobalNames(uint32_t global);  // "bitmap+journal", or "" for none

// What one file held in the intact image, as the filesystem reads it.
struct FileContent {
  uint32_t type = 0;  // S_IFREG or S_IFLNK
  uint64_t size = 0;
  struct Extent {
    uint64_t offset = 0;
    std::vector<std::byte> bytes;
  };
  std::vector<Extent> data;  // regular file: its data (SEEK_DATA .. SEEK_HOLE), holes are zeros
  std::string target;        // symlink
};

// What a mutation changed, by the census.
struct Touch {
  std::vector<uint64_t> inodes;  // sorted
  uint32_t global = 0;           // GlobalKind bits
  uint64_t bytes = 0;            // bytes changed
  bool Touches(uint64_t ino) const;
  std::string Describe() const;  // "inodes 12,13 (2 blocks); global bitmap"
};

class Census {
 public:
  // From the arena's pristine image (the seed). Throws on an image that does
  // not mount (a seed always does).
  explicit Census(const Arena& arena);

  // The bytes the mutation now in `arena` changed (its pokes against the
  // pristine image), by owner.
  Touch TouchedBy(const Arena& arena) const;

  // Every recorded file not touched and not in `excluded` must read its
  // recorded bytes through `fs`; one message per file that does not
  // ("inode 14 (/depth1): byte 4096 was 0x31, now 0x6e"), in *violations.
  // A file that cannot be read at all (lookup by number, open, seek or read
  // fails) is a violation when `demand_readable`, else goes to *hidden: a
  // mount that trusts a damaged inode bitmap may hide a file whose bytes are
  // still intact (fsck -y must then bring it back). `fs` references are
  // dropped again.
  void Check(Filesystem& fs, const Touch& touch, const std::vector<uint64_t>& excluded,
             bool demand_readable, std::vector<std::string>* violations,
             std::vector<std::string>* hidden) const;

  size_t files() const { return files_.size(); }
  size_t in_flight() const { return in_flight_.size(); }
  const std::unordered_map<uint64_t, FileContent>& contents() const { return files_; }
  const std::string& PathOf(uint64_t ino) const;

 private:
  void AddOwners(const std::byte* image);
  void AddInFlight(const std::byte* image);
  // The inodes whose inode lies in [offset, offset + len) if that is in an
  // inode table, else the owners of the blocks it covers.
  void OwnersOf(uint64_t offset, uint64_t len, std::vector<uint64_t>* inodes) const;
  void Own(uint64_t block_no, uint64_t ino);
  void OwnTree(const std::byte* image, uint64_t block_no, uint32_t height, uint64_t ino);
  void OwnDirNode(const std::byte* image, uint64_t ptr, int depth, uint64_t ino);
  // The xattr chain and its value runs (decoded by the core's validator).
  void OwnXattrs(const std::byte* image, uint64_t block_no, uint64_t ino);

  Geometry geometry_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> owners_;  // block -> inodes
  std::vector<uint32_t> global_;  // block -> GlobalKind (0: none); one per block
  std::vector<uint64_t> in_flight_;  // inodes of the seed's operation in flight
  std::unordered_map<uint64_t, FileContent> files_;
  std::unordered_map<uint64_t, std::string> paths_;
};

// Reads a file's content through `fs` (by inode number: LookupInode, then
// dropped). On failure returns false and says why in *error ("open: errno
// 117"). Reads at most `max_bytes` of data.
bool ReadContent(Filesystem& fs, uint64_t ino, uint64_t max_bytes, FileContent* content,
                 std::string* error);

// Empty if `got` holds the same bytes as `want` (holes read as zeros),
// else where and how they first differ.
std::string CompareContent(const FileContent& want, const FileContent& got);

}  // namespace nvfs::fuzz
