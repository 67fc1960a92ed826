// The validator of on-media objects (nvfs/validate.hpp) and the word bitmap
// operations (nvfs/bitmap.hpp): each fault it names, on objects built here.
// The core's and fsck's reactions to the same faults are tested in
// test_dir, test_fs, test_contain and test_fsck.
#include <dirent.h>
#include <sys/stat.h>

#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "nvfs/bitmap.hpp"
#include "nvfs/dir_block.hpp"
#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {
namespace {

using format::DirEntry;
using format::DirLeafHeader;

// ---------------------------------------------------------------------------
// Bit operations
// ---------------------------------------------------------------------------

TEST_CASE("word bitmaps: masks, set, clear, test and count agree with the byte order") {
  CHECK(BitRunMask(0, 64) == ~uint64_t{0});
  CHECK(BitRunMask(3, 2) == 0b11000);
  CHECK(BitRunMask(63, 1) == uint64_t{1} << 63);
  uint64_t words[3] = {};
  SetWordBits(words, 60, 10);  // across a word boundary
  CHECK(words[0] == BitRunMask(60, 4));
  CHECK(words[1] == BitRunMask(0, 6));
  CHECK(TestWordBit(words, 60));
  CHECK(TestWordBit(words, 69));
  CHECK_FALSE(TestWordBit(words, 70));
  CHECK(CountSetWordBits(words, 192) == 10);
  CHECK(CountSetWordBits(words, 66) == 6);  // a partial last word is masked
  // Word bit i is byte bit i % 8 of byte i / 8 (little-endian).
  std::byte bytes[24];
  std::memcpy(bytes, words, sizeof bytes);
  for (uint64_t bit = 0; bit < 192; ++bit) CHECK(TestBit(bytes, bit) == TestWordBit(words, bit));
  ClearWordBits(words, 62, 5);
  CHECK(CountSetWordBits(words, 192) == 5);
  ClearBitsInBuffer(bytes, 60, 10);
  CHECK(CountSetBits(bytes, 192) == 0);
}

// ---------------------------------------------------------------------------
// Inodes
// ---------------------------------------------------------------------------

TEST_CASE("inode types, symlink sizes and the orphan rule") {
  CHECK(InodeTypeOf(S_IFREG | 0644) == InodeType::kRegular);
  CHECK(InodeTypeOf(S_IFDIR | 0755) == InodeType::kDirectory);
  CHECK(InodeTypeOf(S_IFLNK | 0777) == InodeType::kSymlink);
  for (uint32_t type : {S_IFCHR, S_IFBLK, S_IFIFO, S_IFSOCK}) {
    CHECK(InodeTypeOf(type | 0600) == InodeType::kSpecial);
  }
  CHECK(InodeTypeOf(0) == InodeType::kInvalid);
  CHECK(InodeTypeOf(0170000) == InodeType::kInvalid);
  CHECK_FALSE(SymlinkSizeValid(0));
  CHECK(SymlinkSizeValid(1));
  CHECK(SymlinkSizeValid(format::kSymlinkMax));
  CHECK_FALSE(SymlinkSizeValid(format::kSymlinkMax + 1));
  format::Inode inode{};
  inode.mode = S_IFDIR | 0755;
  inode.nlink = 0;
  CHECK(OrphanMayBe(inode));  // unlinked: anything
  inode.nlink = 2;
  CHECK_FALSE(OrphanMayBe(inode));
  inode.mode = S_IFREG | 0644;
  inode.nlink = 1;
  CHECK(OrphanMayBe(inode));  // a cut-short truncation
}

// ---------------------------------------------------------------------------
// File maps
// ---------------------------------------------------------------------------

TEST_CASE("file-map layout: the tree ranges, saturated, and the largest file") {
  SECTION("4 KiB blocks: every depth below 2^63 bytes") {
    const FileMapLayout layout(12);
    const uint64_t p = 512;
    CHECK(layout.start(1) == 11);
    CHECK(layout.start(2) == 11 + p);
    CHECK(layout.start(3) == 11 + p + p * p);
    CHECK(layout.start(6) == 11 + p + p * p + p * p * p + p * p * p * p + p * p * p * p * p);
    CHECK(layout.max_blocks() == layout.start(6));
    CHECK(layout.max_depth() == 5);
    CHECK(layout.max_size() == layout.max_blocks() << 12);
  }
  SECTION("1 MiB blocks: the ranges saturate, files end below 2^63 bytes") {
    const FileMapLayout layout(20);
    CHECK(layout.start(5) == kSaturated);
    CHECK(layout.start(6) == kSaturated);
    CHECK(layout.max_blocks() == (uint64_t{1} << 63) >> 20);
    CHECK(layout.max_depth() == 3);
    CHECK(layout.max_size() == (uint64_t{1} << 63) - 1);
  }
  CHECK(SaturatingAdd(kSaturated - 1, 2) == kSaturated);
  CHECK(SaturatingMul(uint64_t{1} << 40, uint64_t{1} << 30) == kSaturated);
  CHECK(SaturatingMul(0, kSaturated) == 0);
}

// ---------------------------------------------------------------------------
// Extended-attribute blocks
// ---------------------------------------------------------------------------

class XattrBlock {
 public:
  XattrBlock() : bytes_(4096) {
    header_.magic = format::kXattrMagic;
    Sync();
  }
  void Add(const std::string& name, const std::string& value) {
    format::XattrEntry entry{};
    entry.name_len = static_cast<uint8_t>(name.size());
    entry.value_len = static_cast<uint32_t>(value.size());
    const uint64_t at = sizeof header_ + header_.used;
    std::memcpy(bytes_.data() + at, &entry, sizeof entry);
    std::memcpy(bytes_.data() + at + sizeof entry, name.data(), name.size());
    std::memcpy(bytes_.data() + at + sizeof entry + name.size(), value.data(), value.size());
    header_.used += static_cast<uint32_t>(format::XattrEntryLength(name.size(), value.size()));
    ++header_.count;
    Sync();
  }
  format::XattrHeader& header() { return header_; }
  void Sync() { std::memcpy(bytes_.data(), &header_, sizeof header_); }
  std::span<const std::byte> span() const { return bytes_; }
  std::vector<std::pair<std::string, std::string>> decoded;
  XattrFault Decode() {
    decoded.clear();
    return DecodeXattrBlock(span(), false, [&](const XattrRecord& record) {
      decoded.emplace_back(std::string(record.name), std::string(record.value));
    });
  }

 private:
  format::XattrHeader header_{};
  std::vector<std::byte> bytes_;
};

TEST_CASE("xattr blocks: decoded in order, each fault named, entries before it passed on") {
  XattrBlock block;
  block.Add("user.a", "1");
  block.Add("system.posix_acl_access", "xyz");  // well-formed on the media
  REQUIRE(block.Decode() == XattrFault::kNone);
  REQUIRE(block.decoded.size() == 2);
  CHECK(block.decoded[0] == std::pair<std::string, std::string>("user.a", "1"));
  CHECK(block.decoded[1].first == "system.posix_acl_access");
  CHECK(CheckXattrBlock(block.span(), false) == XattrFault::kNone);
  // A one-block namespace's block is no chain block, and the other way round.
  CHECK(CheckXattrBlock(block.span(), true) == XattrFault::kNoMagic);

  SECTION("magic") {
    block.header().magic ^= 1;
    block.Sync();
    CHECK(block.Decode() == XattrFault::kNoMagic);
  }
  SECTION("used past the block") {
    block.header().used = 4096 - sizeof(format::XattrHeader) + 1;
    block.Sync();
    CHECK(block.Decode() == XattrFault::kOverfull);
  }
  SECTION("more entries counted than held") {
    block.header().count = 3;
    block.Sync();
    CHECK(block.Decode() == XattrFault::kShortEntries);
    CHECK(block.decoded.size() == 2);
  }
  SECTION("bytes past the last entry") {
    block.header().used += 8;
    block.Sync();
    CHECK(block.Decode() == XattrFault::kTrailingBytes);
  }
  SECTION("a name of no namespace, after a good entry") {
    XattrBlock other;
    other.Add("user.ok", "v");
    other.Add("nonamespace", "v");
    CHECK(other.Decode() == XattrFault::kNoNamespace);
    CHECK(other.decoded.size() == 1);
  }
  SECTION("an entry running past `used`") {
    XattrBlock other;
    other.Add("user.x", std::string(100, 'v'));
    other.header().used -= 8;
    other.Sync();
    CHECK(other.Decode() == XattrFault::kBadEntry);
    CHECK(other.decoded.empty());
  }
}

// A block of a chain (kIncompatXattrChain): free records, values in runs.
class XattrChainBlock {
 public:
  XattrChainBlock() : bytes_(4096) {
    header_.magic = format::kXattrChainMagic;
    Sync();
  }
  uint32_t end() const { return sizeof header_ + header_.used; }
  void Put(const void* record, size_t length) {
    std::memcpy(bytes_.data() + end(), record, length);
    header_.used += static_cast<uint32_t>(length);
    ++header_.count;
    Sync();
  }
  void AddFree(uint32_t length) {
    format::XattrEntry entry{};
    entry.value_len = length - 8;
    std::vector<std::byte> r(length);
    std::memcpy(r.data(), &entry, sizeof entry);
    Put(r.data(), r.size());
  }
  void AddRuns(const std::string& name, uint32_t value_len,
               const std::vector<format::XattrValueRun>& runs) {
    format::XattrEntry entry{};
    entry.name_len = static_cast<uint8_t>(name.size());
    entry.flags = format::kXattrValueInRuns;
    entry.runs = static_cast<uint16_t>(runs.size());
    entry.value_len = value_len;
    std::vector<std::byte> r(format::XattrRunEntryLength(name.size(), runs.size()));
    std::memcpy(r.data(), &entry, sizeof entry);
    std::memcpy(r.data() + sizeof entry, name.data(), name.size());
    std::memcpy(r.data() + sizeof entry + ((name.size() + 7) & ~size_t{7}), runs.data(),
                runs.size() * sizeof(format::XattrValueRun));
    Put(r.data(), r.size());
  }
  format::XattrBlockHeader& header() { return header_; }
  void Sync() { std::memcpy(bytes_.data(), &header_, sizeof header_); }
  std::span<const std::byte> span() const { return bytes_; }
  std::vector<XattrRecord> decoded;
  XattrFault Decode(XattrBlockView* view = nullptr) {
    decoded.clear();
    return DecodeXattrBlock(span(), true, [&](const XattrRecord& r) { decoded.push_back(r); },
                            view);
  }

 private:
  format::XattrBlockHeader header_{};
  std::vector<std::byte> bytes_;
};

TEST_CASE("xattr chain blocks: free records, values in runs, the next link, each fault") {
  XattrChainBlock block;
  block.header().next = 1234;
  block.Sync();
  block.AddFree(24);
  block.AddRuns("user.big", 65536, {{100, 10}, {200, 6}});  // 16 blocks of 4 KiB
  XattrBlockView view;
  REQUIRE(block.Decode(&view) == XattrFault::kNone);
  CHECK(view.next == 1234);
  CHECK(view.header_size == 32);
  REQUIRE(block.decoded.size() == 2);
  CHECK(block.decoded[0].free);
  CHECK(block.decoded[0].length == 24);
  CHECK(block.decoded[1].name == "user.big");
  CHECK(block.decoded[1].runs == 2);
  CHECK(block.decoded[1].Run(1).first == 200);
  CHECK(block.decoded[1].Run(1).count == 6);
  CHECK(block.decoded[1].value_len == 65536);

  SECTION("a reserved header field") {
    block.header().reserved1 = 1;
    block.Sync();
    CHECK(block.Decode() == XattrFault::kReserved);
  }
  SECTION("runs not adding up to the value's blocks") {
    XattrChainBlock other;
    other.AddRuns("user.big", 65536, {{100, 10}, {200, 5}});
    CHECK(other.Decode() == XattrFault::kBadRuns);
  }
  SECTION("a run of no blocks") {
    XattrChainBlock other;
    other.AddRuns("user.big", 4096, {{100, 0}});
    CHECK(other.Decode() == XattrFault::kBadRuns);
  }
  SECTION("more runs than the largest value needs") {
    XattrChainBlock other;
    std::vector<format::XattrValueRun> runs(17, {100, 1});
    other.AddRuns("user.big", 65536, runs);
    CHECK(other.Decode() == XattrFault::kBadRuns);
  }
  SECTION("a free record running past `used`") {
    XattrChainBlock other;
    other.AddFree(16);
    other.header().used -= 8;
    other.Sync();
    CHECK(other.Decode() == XattrFault::kBadEntry);
  }
}

// ---------------------------------------------------------------------------
// Directories
// ---------------------------------------------------------------------------

Geometry TestGeometry() {
  GeometryRequest request;
  request.namespace_size = 64u << 20;
  Result<Geometry> g = Geometry::Compute(request);
  REQUIRE(g.ok());
  return *g;
}

TEST_CASE("directory tree shape: levels of a 4 KiB and a 1 MiB tree") {
  const DirTreeShape small(12);
  CHECK(small.fanout_bits() == 9);
  CHECK(small.max_depth() == 4);  // 9 + 9 + 9 + 9 + 4 bits
  CHECK(small.Start(-1) == 0);
  CHECK(small.End(-1) == 0);
  CHECK(small.End(3) == 36);
  CHECK(small.Width(4) == 4);
  CHECK(small.Span(0, 0) == 512);
  CHECK(small.Span(0, 9) == 1);
  const DirTreeShape big(20);
  CHECK(big.max_depth() == 2);  // 17 + 17 + 6
  CHECK(big.Width(2) == 6);
}

TEST_CASE("directory node pointers, leaf headers, records and entries") {
  const Geometry g = TestGeometry();
  const DirTreeShape shape(g.block_shift());
  const uint64_t data = g.FirstDataBlock(0);

  SECTION("node pointers") {
    CHECK(CheckDirNodePointer(data, g) == DirNodeFault::kNone);
    CHECK(CheckDirNodePointer(data | format::kDirNodeIndexBit, g) == DirNodeFault::kNone);
    CHECK(CheckDirNodePointer(data | (uint64_t{1} << 60), g) == DirNodeFault::kReservedBits);
    CHECK(CheckDirNodePointer(0, g) == DirNodeFault::kNotData);
    CHECK(CheckDirNodePointer(g.InodeTableBlock(0), g) == DirNodeFault::kNotData);
    CHECK(CheckDirNodePointer(g.block_count(), g) == DirNodeFault::kNotData);
  }

  SECTION("leaf headers, by the slot that reaches them") {
    DirLeafHeader leaf{};
    leaf.magic = format::kDirLeafMagic;
    leaf.prefix_bits = 5;
    leaf.prefix = 0b10110;
    // In a depth-0 index node (9 bits), through slot 0b101101111.
    const uint64_t path = 0b101101111;
    CHECK(CheckDirLeaf(leaf, shape, 0, path) == DirLeafFault::kNone);
    CHECK(CheckDirLeaf(leaf, shape, 0, path ^ (1u << 8)) == DirLeafFault::kPrefix);
    CHECK(CheckDirLeaf(leaf, shape, 1, path) == DirLeafFault::kPrefixLength);  // bits 9..18
    CHECK(CheckDirLeaf(leaf, shape, -1, 0) == DirLeafFault::kPrefixLength);   // dir.root: 0
    leaf.next = data;
    CHECK(CheckDirLeaf(leaf, shape, 0, path) == DirLeafFault::kOverflowLink);
    leaf.magic = 0;
    CHECK(CheckDirLeaf(leaf, shape, 0, path) == DirLeafFault::kNoMagic);

    DirLeafHeader head{};
    head.magic = format::kDirLeafMagic;
    head.prefix_bits = format::kDirHashBits;
    head.prefix = 12345;
    head.next = data;
    DirLeafHeader overflow = head;
    CHECK(CheckDirOverflowLeaf(overflow, head) == DirLeafFault::kNone);
    overflow.prefix = 12346;
    CHECK(CheckDirOverflowLeaf(overflow, head) == DirLeafFault::kOtherPrefix);
    overflow.magic = 1;
    CHECK(CheckDirOverflowLeaf(overflow, head) == DirLeafFault::kNoMagic);
  }

  SECTION("record lengths") {
    CHECK(CheckDirRecordLength(24, 24) == DirRecordFault::kNone);
    CHECK(CheckDirRecordLength(0, 16) == DirRecordFault::kPastBlock);
    CHECK(CheckDirRecordLength(16, 100) == DirRecordFault::kBadLength);  // below the header
    CHECK(CheckDirRecordLength(28, 100) == DirRecordFault::kBadLength);  // not 8-aligned
    CHECK(CheckDirRecordLength(104, 100) == DirRecordFault::kBadLength);  // past the block
  }

  SECTION("entries: structural checks, and with the key the name and its hash") {
    const NameHashKey key{0x0123456789abcdef, 0xfedcba9876543210};
    const auto entry_for = [&](const std::string& name, uint32_t seq) {
      DirEntry e{};
      e.ino = 5;
      e.key = DirKey(DirHash(NameHash(key, name)), seq);
      e.rec_len = format::DirRecordLength(static_cast<uint32_t>(name.size()));
      e.name_len = static_cast<uint8_t>(name.size());
      return e;
    };
    const std::string name = "hello";
    DirEntry e = entry_for(name, 3);
    const uint64_t hash = e.key >> format::kDirSeqBits;
    const uint64_t prefix7 = hash >> (format::kDirHashBits - 7);
    CHECK(CheckDirEntry(e, name.data(), 0, 0, &key) == DirEntryFault::kNone);
    CHECK(CheckDirEntry(e, name.data(), 7, prefix7, &key) == DirEntryFault::kNone);
    CHECK(CheckDirEntry(e, name.data(), 7, prefix7 ^ 1) == DirEntryFault::kPrefix);
    CHECK(CheckDirEntry(e, name.data(), 7, prefix7 ^ 1, &key) == DirEntryFault::kPrefix);
    DirEntry bad = e;
    bad.name_len = 0;
    CHECK(CheckDirEntry(bad, name.data(), 0, 0) == DirEntryFault::kNameLength);
    bad = e;
    bad.name_len = static_cast<uint8_t>(bad.rec_len - sizeof(DirEntry) + 1);
    CHECK(CheckDirEntry(bad, name.data(), 0, 0) == DirEntryFault::kNameLength);
    bad = e;
    bad.key = format::kDirKeyMax + 1;
    CHECK(CheckDirEntry(bad, name.data(), 0, 0) == DirEntryFault::kKey);
    bad = e;
    bad.key ^= uint64_t{1} << format::kDirSeqBits;  // another hash
    CHECK(CheckDirEntry(bad, name.data(), 0, 0) == DirEntryFault::kNone);  // the core's view
    CHECK(CheckDirEntry(bad, name.data(), 0, 0, &key) == DirEntryFault::kKeyNotHash);
    for (const std::string& invalid : {std::string("a/b"), std::string("."), std::string(".."),
                                       std::string("a\0b", 3)}) {
      const DirEntry r = entry_for(invalid, 0);
      CHECK(CheckDirEntry(r, invalid.data(), 0, 0) == DirEntryFault::kNone);
      CHECK(CheckDirEntry(r, invalid.data(), 0, 0, &key) == DirEntryFault::kName);
    }
  }
}

// The walk the core (Tree::ScanLeaf), fsck (pass 2, the root-key agreement)
// and the mount's cross-check all make over a leaf's records.
TEST_CASE("directory leaf walk: every record in order, and the fault and offset that end it") {
  constexpr uint32_t kBlock = 4096;
  std::vector<std::byte> block(kBlock);
  DirLeafBuilder builder(block, 0, 0);
  const std::vector<std::string> names = {"a", "bb", "a-name-of-twenty-one"};
  for (size_t i = 0; i < names.size(); ++i) {
    REQUIRE(builder.Add(10 + i, DirKey(i, 0), DT_REG, names[i]));
  }
  const std::span<const std::byte> leaf(block);
  struct Seen {
    uint32_t offset;
    uint64_t ino;
    std::string name;
  };
  const auto walk = [&](size_t stop_after, uint32_t* stop) {
    std::vector<Seen> seen;
    const DirRecordFault fault = WalkDirLeaf(
        leaf,
        [&](uint32_t offset, const DirEntry& record) {
          CHECK(reinterpret_cast<const std::byte*>(&record) == block.data() + offset);
          seen.push_back({offset, record.ino,
                          record.ino != 0 && DirNameLengthValid(record)
                              ? std::string(DirRecordName(record))
                              : std::string()});
          return seen.size() < stop_after;
        },
        stop);
    return std::make_pair(fault, seen);
  };
  // The records of the leaf, each at its offset.
  std::vector<uint32_t> offsets;
  uint32_t at = sizeof(DirLeafHeader);
  for (const std::string& name : names) {
    offsets.push_back(at);
    at += format::DirRecordLength(static_cast<uint32_t>(name.size()));
  }
  const auto rec_len_at = [&](uint32_t offset) {
    return block.data() + offset + offsetof(DirEntry, rec_len);
  };

  SECTION("a whole leaf: each record once, ending exactly at the block's end") {
    uint32_t stop = 0;
    const auto [fault, seen] = walk(100, &stop);
    CHECK(fault == DirRecordFault::kNone);
    CHECK(stop == kBlock);
    REQUIRE(seen.size() == names.size() + 1);
    for (size_t i = 0; i < names.size(); ++i) {
      CHECK(seen[i].offset == offsets[i]);
      CHECK(seen[i].ino == 10 + i);
      CHECK(seen[i].name == names[i]);
    }
    CHECK(seen.back().offset == at);  // the free tail
    CHECK(seen.back().ino == 0);
  }

  SECTION("fn stops the walk at the record it returned false for") {
    uint32_t stop = 0;
    const auto [fault, seen] = walk(2, &stop);
    CHECK(fault == DirRecordFault::kNone);
    CHECK(seen.size() == 2);
    CHECK(stop == offsets[1]);
  }

  SECTION("a bad length ends the walk there, the records before it seen") {
    const uint32_t bad = 20;  // not a multiple of 8
    std::memcpy(rec_len_at(offsets[1]), &bad, sizeof bad);
    uint32_t stop = 0;
    const auto [fault, seen] = walk(100, &stop);
    CHECK(fault == DirRecordFault::kBadLength);
    CHECK(stop == offsets[1]);
    CHECK(seen.size() == 1);
  }

  SECTION("a remainder too short for a record ends the walk past the block") {
    const uint32_t shorter = kBlock - at - 8;  // the free tail, 8 bytes short
    std::memcpy(rec_len_at(at), &shorter, sizeof shorter);
    uint32_t stop = 0;
    const auto [fault, seen] = walk(100, &stop);
    CHECK(fault == DirRecordFault::kPastBlock);
    CHECK(stop == kBlock - 8);
    CHECK(seen.size() == names.size() + 1);
  }
}

// ---------------------------------------------------------------------------
// Journal slot headers
// ---------------------------------------------------------------------------

TEST_CASE("journal slot headers: an idle header is valid for its own slot only") {
  format::JournalSlotHeader header = IdleJournalSlotHeader(3);
  CHECK(header.state == static_cast<uint32_t>(format::JournalState::kIdle));
  CHECK(header.tx_seq == 0);
  CHECK(JournalSlotHeaderValid(header, 3));
  CHECK_FALSE(JournalSlotHeaderValid(header, 2));
  header.state = static_cast<uint32_t>(format::JournalState::kCommitted);
  CHECK(JournalSlotHeaderValid(header, 3));
  header.state = 3;
  CHECK_FALSE(JournalSlotHeaderValid(header, 3));
  header = IdleJournalSlotHeader(3);
  header.magic[7] ^= 1;
  CHECK_FALSE(JournalSlotHeaderValid(header, 3));
}

}  // namespace
}  // namespace nvfs
