// Seeded mutations of an nvfs image, aimed at its structures: the catalog of
// a seed lists every field worth damaging (superblock halves, group
// descriptors, bitmaps, journal headers and records, every live inode's
// fields, file-map pointers at every depth, directory node pointers, leaf
// headers, records, xattr blocks) and the metadata regions for unaimed byte
// flips. A mutation sets a field to 0, all ones, +1, -1, a flipped bit, a
// random value, or — by the field's kind — a pointer out of range, to its own
// block, into metadata, to another structure's block (sharing, cycles), an
// inode number out of range or of another inode; with or without the
// checksum that covers it recomputed, so it gets past the checksum.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "arena_media.hpp"
#include "nvfs/geometry.hpp"

namespace nvfs::fuzz {

enum class FieldKind : uint8_t {
  kPlain,     // any value
  kBlock,     // a block number (file map, xattr block, overflow leaf)
  kDirNode,   // a directory node pointer (index bit, 56-bit block)
  kIno,       // an inode number
  kRecLen,    // a directory record's length
};

enum class Fixup : uint8_t {
  kNone,
  kSuperStatic,   // the static superblock checksum (and, sometimes, the backup copy)
  kSuperDynamic,  // the dynamic superblock checksum
  kGroupDesc,     // the descriptor's checksum (aux: descriptor offset)
  kJournalRecord, // the record's checksum (aux: record offset)
};

struct Target {
  uint64_t offset = 0;
  uint8_t width = 0;  // 1, 2, 4 or 8 bytes
  FieldKind kind = FieldKind::kPlain;
  Fixup fixup = Fixup::kNone;
  uint64_t aux = 0;
  const char* what = "";  // for messages: "inode.size", "leaf.next", ...
};

class Catalog {
 public:
  // Parses the image in `arena` (a valid namespace).
  explicit Catalog(const Arena& arena);

  const Geometry& geometry() const { return geometry_; }
  const std::vector<Target>& targets() const { return targets_; }
  const std::vector<Range>& regions() const { return regions_; }

  // Applies one seeded mutation (or a few) to the arena; returns what it did.
  std::string Mutate(Arena& arena, std::mt19937_64& rng) const;

  // Recomputes the checksums a target's fixup names (used by Mutate and by
  // the libFuzzer input decoder, which fixes them all).
  static void Fix(Arena& arena, const Geometry& g, Fixup fixup, uint64_t aux, bool backup);
  // Recomputes every checksum of the image: static (primary), dynamic, every
  // group descriptor, every record of every slot that is not idle.
  static void FixAll(Arena& arena, const Geometry& g);

 private:
  void Add(uint64_t offset, uint8_t width, FieldKind kind, const char* what,
           Fixup fixup = Fixup::kNone, uint64_t aux = 0);
  void AddRegion(uint64_t offset, uint64_t len) { regions_.push_back({offset, len}); }
  void ParseInode(const Arena& arena, uint64_t ino);
  void ParseFileTree(const Arena& arena, uint64_t block, uint32_t height, int budget);
  void ParseDirNode(const Arena& arena, uint64_t ptr, int depth);
  void ParseLeaf(const Arena& arena, uint64_t block);
  void ParseJournal(const Arena& arena);
  std::string MutateOne(Arena& arena, std::mt19937_64& rng) const;
  uint64_t Value(const Target& t, uint64_t old, std::mt19937_64& rng) const;

  Geometry geometry_;
  std::vector<Target> targets_;
  std::vector<Range> regions_;
  std::vector<uint64_t> blocks_;   // block numbers met (for sharing and cycles)
  std::vector<uint64_t> nodes_;    // directory node pointers met
  std::vector<uint64_t> inodes_;   // live inodes
};

}  // namespace nvfs::fuzz
