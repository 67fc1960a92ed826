#include "mutator.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <set>
#include <stdexcept>

#include "nvfs/bitmap.hpp"
#include "nvfs/crc32c.hpp"
#include "nvfs/format.hpp"
#include "nvfs/superblock.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fuzz {

namespace {

using format::DirEntry;
using format::DirLeafHeader;
using format::Inode;
using format::JournalRecord;
using format::JournalSlotHeader;
using format::SuperDynamic;
using format::SuperStatic;

// Target groups, so the few superblock fields are not drowned by the many
// inode fields.
enum Group : uint8_t { kStatic, kDynamic, kGroups, kJournal, kTree, kGroupCount };
constexpr int kGroupWeight[kGroupCount] = {8, 10, 8, 10, 64};

uint8_t GroupOf(const char* what) {
  if (std::strncmp(what, "super.", 6) == 0 || std::strncmp(what, "backup.", 7) == 0) {
    return kStatic;
  }
  if (std::strncmp(what, "dynamic.", 8) == 0) return kDynamic;
  if (std::strncmp(what, "group.", 6) == 0 || std::strncmp(what, "bitmap.", 7) == 0) {
    return kGroups;
  }
  if (std::strncmp(what, "journal.", 8) == 0) return kJournal;
  return kTree;
}

uint64_t Mask(uint8_t width) { return width == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * width)) - 1; }

uint64_t ReadField(const Arena& arena, uint64_t offset, uint8_t width) {
  uint64_t v = 0;
  std::memcpy(&v, arena.data() + offset, width);
  return v;
}

uint32_t RecordChecksum(const Arena& arena, uint64_t at, uint64_t limit) {
  JournalRecord header = arena.Peek<JournalRecord>(at);
  uint64_t payload = header.type == static_cast<uint16_t>(format::JournalRecordType::kUndo)
                         ? header.length
                         : 0;
  payload = std::min<uint64_t>(payload, limit - std::min(limit, at + sizeof header));
  header.checksum = 0;
  const uint32_t crc = Crc32c(0, &header, sizeof header);
  return Crc32c(crc, arena.data() + at + sizeof header, payload);
}

// Calls fn(pos, record, payload) for each record of the transaction in the
// journal slot at `at` (a slot in use), in order: from the header on, while
// the records carry the header's tx_seq and fit before the slot's end. A
// payload reaching past the end ends the walk (the next record would start
// beyond it). The catalog and FixAll both walk the journal this way.
template <typename Fn>
void ForEachRecord(const Arena& arena, const Geometry& g, uint64_t at, Fn&& fn) {
  const JournalSlotHeader header = arena.Peek<JournalSlotHeader>(at);
  const uint64_t end = at + g.journal_slot_size();
  uint64_t pos = at + sizeof header;
  while (pos + sizeof(JournalRecord) <= end) {
    const JournalRecord r = arena.Peek<JournalRecord>(pos);
    if (r.tx_seq != header.tx_seq) break;
    const uint64_t payload =
        r.type == static_cast<uint16_t>(format::JournalRecordType::kUndo) ? r.length : 0;
    fn(pos, r, payload);
    pos += sizeof r + ((payload + 7) & ~uint64_t{7});
  }
}

}  // namespace

void Catalog::Add(uint64_t offset, uint8_t width, FieldKind kind, const char* what, Fixup fixup,
                  uint64_t aux) {
  targets_.push_back({offset, width, kind, fixup, aux, what});
}

Catalog::Catalog(const Arena& arena) {
  Result<FoundSuper> found = FindSuper(arena.data(), arena.size());
  if (!found.ok()) throw std::runtime_error("catalog: " + found.error().message);
  geometry_ = found->geometry;
  const Geometry& g = geometry_;

  const auto super = [&](size_t offset, uint8_t width, const char* what,
                         FieldKind kind = FieldKind::kPlain) {
    Add(offset, width, kind, what, Fixup::kSuperStatic);
  };
  super(offsetof(SuperStatic, magic), 8, "super.magic");
  super(offsetof(SuperStatic, version_major), 4, "super.version_major");
  super(offsetof(SuperStatic, feature_compat), 8, "super.feature_compat");
  super(offsetof(SuperStatic, feature_incompat), 8, "super.feature_incompat");
  super(offsetof(SuperStatic, feature_ro_compat), 8, "super.feature_ro_compat");
  super(offsetof(SuperStatic, block_size), 4, "super.block_size");
  super(offsetof(SuperStatic, block_shift), 4, "super.block_shift");
  super(offsetof(SuperStatic, block_count), 8, "super.block_count", FieldKind::kBlock);
  super(offsetof(SuperStatic, blocks_per_group), 4, "super.blocks_per_group");
  super(offsetof(SuperStatic, inodes_per_group), 4, "super.inodes_per_group");
  super(offsetof(SuperStatic, group_count), 4, "super.group_count");
  super(offsetof(SuperStatic, inode_size), 4, "super.inode_size");
  super(offsetof(SuperStatic, inode_count), 8, "super.inode_count", FieldKind::kIno);
  super(offsetof(SuperStatic, itable_blocks), 4, "super.itable_blocks");
  super(offsetof(SuperStatic, journal_slots), 4, "super.journal_slots");
  super(offsetof(SuperStatic, journal_block), 8, "super.journal_block", FieldKind::kBlock);
  super(offsetof(SuperStatic, journal_slot_size), 4, "super.journal_slot_size");
  super(offsetof(SuperStatic, journal_blocks), 4, "super.journal_blocks");
  super(offsetof(SuperStatic, root_ino), 8, "super.root_ino", FieldKind::kIno);
  super(offsetof(SuperStatic, reserved0), 8, "super.reserved0");
  super(offsetof(SuperStatic, dir_hash_key), 8, "super.dir_hash_key");
  super(offsetof(SuperStatic, reserved) + 100, 1, "super.reserved");
  Add(offsetof(SuperStatic, checksum), 4, FieldKind::kPlain, "super.checksum");
  const uint64_t backup = g.BackupSuperOffset();
  Add(backup + offsetof(SuperStatic, magic), 8, FieldKind::kPlain, "backup.magic");
  Add(backup + offsetof(SuperStatic, block_count), 8, FieldKind::kBlock, "backup.block_count");
  Add(backup + offsetof(SuperStatic, checksum), 4, FieldKind::kPlain, "backup.checksum");

  const uint64_t dyn = format::kSuperDynamicOffset;
  const auto dynamic = [&](size_t offset, uint8_t width, const char* what,
                           FieldKind kind = FieldKind::kPlain) {
    Add(dyn + offset, width, kind, what, Fixup::kSuperDynamic);
  };
  dynamic(offsetof(SuperDynamic, magic), 8, "dynamic.magic");
  dynamic(offsetof(SuperDynamic, state), 4, "dynamic.state");
  dynamic(offsetof(SuperDynamic, errors), 4, "dynamic.errors");
  dynamic(offsetof(SuperDynamic, mount_count), 8, "dynamic.mount_count");
  dynamic(offsetof(SuperDynamic, free_blocks), 8, "dynamic.free_blocks");
  dynamic(offsetof(SuperDynamic, free_inodes), 8, "dynamic.free_inodes");
  dynamic(offsetof(SuperDynamic, orphan_head), 8, "dynamic.orphan_head", FieldKind::kIno);
  dynamic(offsetof(SuperDynamic, next_generation), 8, "dynamic.next_generation");
  Add(dyn + offsetof(SuperDynamic, checksum), 4, FieldKind::kPlain, "dynamic.checksum");
  AddRegion(0, 4096);

  for (uint32_t group = 0; group < g.group_count(); ++group) {
    const uint64_t desc = g.BlockOffset(g.GroupDescBlock(group));
    Add(desc + offsetof(format::GroupDesc, magic), 4, FieldKind::kPlain, "group.magic",
        Fixup::kGroupDesc, desc);
    Add(desc + offsetof(format::GroupDesc, group), 4, FieldKind::kPlain, "group.group",
        Fixup::kGroupDesc, desc);
    Add(desc + offsetof(format::GroupDesc, free_blocks), 4, FieldKind::kPlain,
        "group.free_blocks", Fixup::kGroupDesc, desc);
    Add(desc + offsetof(format::GroupDesc, free_inodes), 4, FieldKind::kPlain,
        "group.free_inodes", Fixup::kGroupDesc, desc);
    Add(desc + offsetof(format::GroupDesc, flags), 4, FieldKind::kPlain, "group.flags",
        Fixup::kGroupDesc, desc);
    Add(desc + offsetof(format::GroupDesc, checksum), 4, FieldKind::kPlain, "group.checksum");
    const uint64_t bitmap = g.BlockOffset(g.BlockBitmapBlock(group));
    const uint64_t ibitmap = g.BlockOffset(g.InodeBitmapBlock(group));
    for (uint64_t word = 0; word < 8; ++word) {
      Add(bitmap + 8 * word, 8, FieldKind::kPlain, "bitmap.blocks");
    }
    Add(bitmap + (g.GroupMetaBlocks(group) / 64) * 8, 8, FieldKind::kPlain, "bitmap.blocks");
    Add(ibitmap, 8, FieldKind::kPlain, "bitmap.inodes");
    Add(ibitmap + 8, 8, FieldKind::kPlain, "bitmap.inodes");
    AddRegion(bitmap, 256);
    AddRegion(desc, 64);
    AddRegion(ibitmap, 64);
  }

  ParseJournal(arena);

  for (uint32_t group = 0; group < g.group_count(); ++group) {
    const std::byte* ibitmap = arena.data() + g.BlockOffset(g.InodeBitmapBlock(group));
    for (uint32_t i = 0; i < g.inodes_per_group(); ++i) {
      const uint64_t ino = uint64_t{group} * g.inodes_per_group() + i;
      if (ino != 0 && TestBit(ibitmap, i)) ParseInode(arena, ino);
    }
  }
}

void Catalog::ParseJournal(const Arena& arena) {
  const Geometry& g = geometry_;
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    const uint64_t at = g.JournalSlotOffset(slot);
    const JournalSlotHeader header = arena.Peek<JournalSlotHeader>(at);
    if (slot < 3 || header.state != 0) {
      Add(at + offsetof(JournalSlotHeader, magic), 8, FieldKind::kPlain, "journal.magic");
      Add(at + offsetof(JournalSlotHeader, state), 4, FieldKind::kPlain, "journal.state");
      Add(at + offsetof(JournalSlotHeader, slot), 4, FieldKind::kPlain, "journal.slot");
      Add(at + offsetof(JournalSlotHeader, tx_seq), 8, FieldKind::kPlain, "journal.tx_seq");
      AddRegion(at, 64);
    }
    if (header.state == 0) continue;
    const uint64_t end = at + g.journal_slot_size();
    ForEachRecord(arena, g, at, [&](uint64_t pos, const JournalRecord& r, uint64_t payload) {
      const auto rec = [&](size_t offset, uint8_t width, const char* what,
                           FieldKind kind = FieldKind::kPlain) {
        Add(pos + offset, width, kind, what, Fixup::kJournalRecord, pos);
      };
      rec(offsetof(JournalRecord, tx_seq), 8, "journal.record.tx_seq");
      rec(offsetof(JournalRecord, target), 8, "journal.record.target");
      rec(offsetof(JournalRecord, length), 4, "journal.record.length");
      rec(offsetof(JournalRecord, type), 2, "journal.record.type");
      Add(pos + offsetof(JournalRecord, checksum), 4, FieldKind::kPlain, "journal.record.checksum");
      if (payload >= 8) rec(sizeof r, 8, "journal.record.payload");
      AddRegion(pos, std::min<uint64_t>(sizeof r + payload, end - pos));
    });
  }
}

void Catalog::ParseInode(const Arena& arena, uint64_t ino) {
  const Geometry& g = geometry_;
  const uint64_t at = g.InodeOffset(ino);
  const Inode inode = arena.Peek<Inode>(at);
  inodes_.push_back(ino);
  AddRegion(at, sizeof inode);
  Add(at + offsetof(Inode, mode), 2, FieldKind::kPlain, "inode.mode");
  Add(at + offsetof(Inode, nlink), 4, FieldKind::kPlain, "inode.nlink");
  Add(at + offsetof(Inode, size), 8, FieldKind::kPlain, "inode.size");
  Add(at + offsetof(Inode, blocks), 8, FieldKind::kPlain, "inode.blocks");
  Add(at + offsetof(Inode, flags), 4, FieldKind::kPlain, "inode.flags");
  Add(at + offsetof(Inode, parent), 8, FieldKind::kIno, "inode.parent");
  Add(at + offsetof(Inode, rdev), 8, FieldKind::kPlain, "inode.rdev");
  Add(at + offsetof(Inode, xattr_block), 8, FieldKind::kBlock, "inode.xattr_block");
  Add(at + offsetof(Inode, orphan_next), 8, FieldKind::kIno, "inode.orphan_next");
  const uint64_t map = at + offsetof(Inode, map);
  if (S_ISDIR(inode.mode)) {
    Add(map + offsetof(format::InodeDirMap, root), 8, FieldKind::kDirNode, "dir.root");
    Add(map + offsetof(format::InodeDirMap, entries), 8, FieldKind::kPlain, "dir.entries");
    std::set<uint64_t> seen;
    if (inode.map.dir.root != 0) ParseDirNode(arena, inode.map.dir.root, -1);
  } else if (S_ISREG(inode.mode) ||
             (S_ISLNK(inode.mode) && inode.size > format::kInlineSymlinkMax)) {
    for (uint32_t i = 0; i < format::kDirectPointers; ++i) {
      const uint64_t ptr = inode.map.file.direct[i];
      if (ptr != 0 || i < 2) Add(map + 8 * i, 8, FieldKind::kBlock, "inode.direct");
      if (ptr != 0) blocks_.push_back(ptr);
    }
    for (uint32_t d = 1; d <= format::kIndirectPointers; ++d) {
      const uint64_t ptr = inode.map.file.indirect[d - 1];
      Add(map + 8 * (format::kDirectPointers + d - 1), 8, FieldKind::kBlock, "inode.indirect");
      if (ptr != 0) {
        blocks_.push_back(ptr);
        ParseFileTree(arena, ptr, d, 64);
      }
    }
  } else if (S_ISLNK(inode.mode)) {
    Add(map, 1, FieldKind::kPlain, "symlink.byte");
  }
  // The xattr chain: each block's header (its `next` a block pointer), its
  // first record, and the runs of values kept out of line.
  uint64_t xattr = inode.xattr_block;
  for (int chain = 0; xattr != 0 && xattr < g.block_count() && chain < 8; ++chain) {
    const uint64_t x = g.BlockOffset(xattr);
    blocks_.push_back(xattr);
    Add(x + offsetof(format::XattrHeader, magic), 4, FieldKind::kPlain, "xattr.magic");
    Add(x + offsetof(format::XattrHeader, count), 4, FieldKind::kPlain, "xattr.count");
    Add(x + offsetof(format::XattrHeader, used), 4, FieldKind::kPlain, "xattr.used");
    const uint64_t entry =
        x + (g.xattr_chain() ? sizeof(format::XattrBlockHeader) : sizeof(format::XattrHeader));
    Add(entry + offsetof(format::XattrEntry, name_len), 1, FieldKind::kPlain, "xattr.name_len");
    Add(entry + offsetof(format::XattrEntry, flags), 1, FieldKind::kPlain, "xattr.flags");
    Add(entry + offsetof(format::XattrEntry, value_len), 4, FieldKind::kPlain, "xattr.value_len");
    Add(entry + sizeof(format::XattrEntry), 1, FieldKind::kPlain, "xattr.name");
    AddRegion(x, 256);
    XattrBlockView view;
    DecodeXattrBlock({arena.data() + x, g.block_size()}, g.xattr_chain(),
                     [&](const XattrRecord& record) {
                       for (uint32_t r = 0; r < record.runs; ++r) {
                         const uint64_t run_offset = x + static_cast<uint64_t>(
                             record.run_at - (arena.data() + x)) + r * sizeof(format::XattrValueRun);
                         Add(run_offset, 8, FieldKind::kBlock, "xattr.run.first");
                         Add(run_offset + 8, 8, FieldKind::kPlain, "xattr.run.count");
                       }
                     },
                     &view);
    if (g.xattr_chain()) {
      Add(x + offsetof(format::XattrBlockHeader, next), 8, FieldKind::kBlock, "xattr.next");
    }
    xattr = view.next;
  }
}

void Catalog::ParseFileTree(const Arena& arena, uint64_t block, uint32_t height, int budget) {
  const Geometry& g = geometry_;
  if (block == 0 || block >= g.block_count() || budget <= 0) return;
  const uint64_t at = g.BlockOffset(block);
  const uint64_t ptrs = g.block_size() / 8;
  AddRegion(at, 256);
  int added = 0;
  for (uint64_t i = 0; i < ptrs; ++i) {
    const uint64_t ptr = arena.Peek<uint64_t>(at + 8 * i);
    if (ptr == 0 && i != 0 && i != ptrs - 1) continue;
    Add(at + 8 * i, 8, FieldKind::kBlock, "pointer.slot");
    if (ptr == 0) continue;
    blocks_.push_back(ptr);
    if (height > 1) ParseFileTree(arena, ptr, height - 1, budget - 1);
    if (++added >= 16) break;
  }
}

void Catalog::ParseDirNode(const Arena& arena, uint64_t ptr, int depth) {
  const Geometry& g = geometry_;
  const uint64_t block = ptr & format::kDirNodeBlockMask;
  if (block == 0 || block >= g.block_count() || depth > 8) return;
  if (std::find(nodes_.begin(), nodes_.end(), ptr) != nodes_.end()) return;
  nodes_.push_back(ptr);
  blocks_.push_back(block);
  if (!(ptr & format::kDirNodeIndexBit)) {
    ParseLeaf(arena, block);
    return;
  }
  const uint64_t at = g.BlockOffset(block);
  const uint64_t slots = g.block_size() / 8;
  AddRegion(at, 512);
  uint64_t prev = 0;
  for (uint64_t i = 0; i < slots; ++i) {
    const uint64_t child = arena.Peek<uint64_t>(at + 8 * i);
    if (child == 0 && i > 2) continue;
    if (child == prev && i % 16 != 0) continue;  // one of a leaf's many slots
    prev = child;
    Add(at + 8 * i, 8, FieldKind::kDirNode, "index.slot");
    if (child != 0) ParseDirNode(arena, child, depth + 1);
  }
}

void Catalog::ParseLeaf(const Arena& arena, uint64_t block) {
  const Geometry& g = geometry_;
  for (int chain = 0; chain < 64 && block != 0 && block < g.block_count(); ++chain) {
    const uint64_t at = g.BlockOffset(block);
    AddRegion(at, 1024);
    Add(at + offsetof(DirLeafHeader, magic), 4, FieldKind::kPlain, "leaf.magic");
    Add(at + offsetof(DirLeafHeader, prefix_bits), 2, FieldKind::kPlain, "leaf.prefix_bits");
    Add(at + offsetof(DirLeafHeader, prefix), 8, FieldKind::kPlain, "leaf.prefix");
    Add(at + offsetof(DirLeafHeader, next), 8, FieldKind::kBlock, "leaf.next");
    uint32_t offset = sizeof(DirLeafHeader);
    int records = 0;
    while (offset + sizeof(DirEntry) <= g.block_size()) {
      const DirEntry e = arena.Peek<DirEntry>(at + offset);
      if (e.rec_len < sizeof(DirEntry) || e.rec_len > g.block_size() - offset) break;
      if (records++ < 6 || offset + e.rec_len == g.block_size()) {
        Add(at + offset + offsetof(DirEntry, ino), 8, FieldKind::kIno, "record.ino");
        Add(at + offset + offsetof(DirEntry, key), 8, FieldKind::kPlain, "record.key");
        Add(at + offset + offsetof(DirEntry, rec_len), 4, FieldKind::kRecLen, "record.rec_len");
        Add(at + offset + offsetof(DirEntry, name_len), 1, FieldKind::kPlain, "record.name_len");
        Add(at + offset + offsetof(DirEntry, file_type), 1, FieldKind::kPlain,
            "record.file_type");
        if (e.ino != 0) Add(at + offset + sizeof(DirEntry), 1, FieldKind::kPlain, "record.name");
      }
      offset += e.rec_len;
    }
    block = arena.Peek<uint64_t>(at + offsetof(DirLeafHeader, next));
    if (block != 0) blocks_.push_back(block);
  }
}

uint64_t Catalog::Value(const Target& t, uint64_t old, std::mt19937_64& rng) const {
  const Geometry& g = geometry_;
  const uint64_t mask = Mask(t.width);
  const uint64_t bc = g.block_count();
  const auto pick = [&](const std::vector<uint64_t>& from, uint64_t fallback) {
    return from.empty() ? fallback : from[rng() % from.size()];
  };
  const uint64_t self_block = t.offset >> g.block_shift();
  // Kind-specific values first, half the time.
  if (t.kind != FieldKind::kPlain && rng() % 2 == 0) {
    switch (t.kind) {
      case FieldKind::kBlock:
        switch (rng() % 10) {
          case 0: return bc;
          case 1: return bc - 1;  // the backup superblock's block
          case 2: return bc + 1 + rng() % 1000;
          case 3: return rng() % bc;
          case 4: return g.InodeTableBlock(0) + rng() % g.itable_blocks();
          case 5: return g.BlockBitmapBlock(0);
          case 6: return self_block;
          case 7: return pick(blocks_, self_block);
          case 8: return uint64_t{1} << 56;
          default: return g.journal_block() + 1;
        }
      case FieldKind::kDirNode:
        switch (rng() % 10) {
          case 0: return old ^ format::kDirNodeIndexBit;
          case 1: return self_block | format::kDirNodeIndexBit;  // a loop
          case 2: return self_block;
          case 3: return pick(nodes_, old);
          case 4: return pick(nodes_, old) ^ format::kDirNodeIndexBit;
          case 5: return bc | format::kDirNodeIndexBit;
          case 6: return old | (uint64_t{1} << 60);
          case 7: return pick(blocks_, old);
          case 8: return g.InodeTableBlock(0);
          default: return rng() % bc;
        }
      case FieldKind::kIno:
        switch (rng() % 8) {
          case 0: return 0;
          case 1: return 1;
          case 2: return 2;
          case 3: return g.inode_count();
          case 4: return g.inode_count() - 1;
          case 5: return pick(inodes_, 1);
          case 6: return rng() % g.inode_count();
          default: return uint64_t{1} << 40;
        }
      case FieldKind::kRecLen: {
        const uint64_t in_block = t.offset & (g.block_size() - 1);
        switch (rng() % 9) {
          case 0: return 0;
          case 1: return 8;
          case 2: return 16;
          case 3: return 24;
          case 4: return g.block_size() + 1;
          case 5: return g.block_size() - in_block + 8;
          case 6: return old + 8;
          case 7: return old - 8;
          default: return old + 4;
        }
      }
      case FieldKind::kPlain: break;
    }
  }
  switch (rng() % 8) {
    case 0: return 0;
    case 1: return mask;
    case 2: return (old + 1) & mask;
    case 3: return (old - 1) & mask;
    case 4: return old ^ (uint64_t{1} << (rng() % (8 * t.width)));
    case 5: return rng() & mask;
    case 6: return old ^ (uint64_t{1} << (8 * t.width - 1));
    default: return (old + 1 + rng() % 16) & mask;
  }
}

std::string Catalog::MutateOne(Arena& arena, std::mt19937_64& rng) const {
  // A group by weight, then a target of it.
  int roll = static_cast<int>(rng() % 100);
  uint8_t group = kTree;
  for (uint8_t gi = 0; gi < kGroupCount; ++gi) {
    if (roll < kGroupWeight[gi]) {
      group = gi;
      break;
    }
    roll -= kGroupWeight[gi];
  }
  std::vector<const Target*> candidates;
  for (const Target& t : targets_) {
    if (GroupOf(t.what) == group) candidates.push_back(&t);
  }
  if (candidates.empty()) {
    for (const Target& t : targets_) candidates.push_back(&t);
  }
  const Target& t = *candidates[rng() % candidates.size()];
  const uint64_t old = ReadField(arena, t.offset, t.width);
  uint64_t value = Value(t, old, rng) & Mask(t.width);
  if (value == old) value = old ^ 1;
  arena.Poke(t.offset, &value, t.width);
  std::string what = std::string(t.what) + "@" + std::to_string(t.offset) + "=" +
                     std::to_string(value);
  if (t.fixup != Fixup::kNone && rng() % 10 < 6) {
    const bool backup = rng() % 3 == 0;
    Fix(arena, geometry_, t.fixup, t.aux, backup);
    what += backup ? "+crc+backup" : "+crc";
  }
  return what;
}

std::string Catalog::Mutate(Arena& arena, std::mt19937_64& rng) const {
  const uint64_t roll = rng() % 100;
  if (roll < 12 && !regions_.empty()) {
    // Unaimed: a few bytes flipped in metadata, checksums sometimes fixed.
    const uint64_t flips = 1 + rng() % 6;
    std::string what = "flips";
    for (uint64_t i = 0; i < flips; ++i) {
      const Range& r = regions_[rng() % regions_.size()];
      const uint64_t at = r.offset + rng() % r.len;
      const uint8_t byte = arena.Peek<uint8_t>(at) ^ static_cast<uint8_t>(1 + rng() % 255);
      arena.Poke(at, &byte, 1);
      what += " " + std::to_string(at);
    }
    if (rng() % 2 == 0) {
      FixAll(arena, geometry_);
      what += " +crc";
    }
    return what;
  }
  const int count = roll < 30 ? 2 + static_cast<int>(rng() % 3) : 1;
  std::string what;
  for (int i = 0; i < count; ++i) {
    if (i > 0) what += ", ";
    what += MutateOne(arena, rng);
  }
  return what;
}

void Catalog::Fix(Arena& arena, const Geometry& g, Fixup fixup, uint64_t aux, bool backup) {
  switch (fixup) {
    case Fixup::kNone: return;
    case Fixup::kSuperStatic: {
      SuperStatic sb = arena.Peek<SuperStatic>(0);
      sb.checksum = SuperStaticChecksum(sb);
      arena.PokeValue(offsetof(SuperStatic, checksum), sb.checksum);
      if (backup) arena.PokeValue(g.BackupSuperOffset(), sb);
      return;
    }
    case Fixup::kSuperDynamic: {
      SuperDynamic d = arena.Peek<SuperDynamic>(format::kSuperDynamicOffset);
      arena.PokeValue(format::kSuperDynamicOffset + offsetof(SuperDynamic, checksum),
                      SuperDynamicChecksum(d));
      return;
    }
    case Fixup::kGroupDesc: {
      format::GroupDesc desc = arena.Peek<format::GroupDesc>(aux);
      arena.PokeValue(aux + offsetof(format::GroupDesc, checksum), GroupDescChecksum(desc));
      return;
    }
    case Fixup::kJournalRecord: {
      const uint64_t journal = g.BlockOffset(g.journal_block());
      const uint64_t slot = (aux - journal) / g.journal_slot_size();
      const uint64_t limit = journal + (slot + 1) * g.journal_slot_size();
      arena.PokeValue(aux + offsetof(JournalRecord, checksum), RecordChecksum(arena, aux, limit));
      return;
    }
  }
}

void Catalog::FixAll(Arena& arena, const Geometry& g) {
  Fix(arena, g, Fixup::kSuperStatic, 0, false);
  Fix(arena, g, Fixup::kSuperDynamic, 0, false);
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    Fix(arena, g, Fixup::kGroupDesc, g.BlockOffset(g.GroupDescBlock(group)), false);
  }
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    const uint64_t at = g.JournalSlotOffset(slot);
    if (arena.Peek<JournalSlotHeader>(at).state == 0) continue;
    ForEachRecord(arena, g, at, [&](uint64_t pos, const JournalRecord&, uint64_t) {
      Fix(arena, g, Fixup::kJournalRecord, pos, false);
    });
  }
}

}  // namespace nvfs::fuzz
