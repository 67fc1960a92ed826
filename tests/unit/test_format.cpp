// Runtime facts of the on-media format: checksums, the name hash, geometry
// (what mkfs computes and what a superblock may claim), the command-line
// parsers and directory leaves. Sizes and offsets are pinned by static_assert
// in format.hpp; everything here needs running code.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "helpers.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/crc32c.hpp"
#include "nvfs/dir_block.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fresh_inode.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs {
namespace {

using format::SuperStatic;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;
constexpr uint64_t kTiB = 1024 * kGiB;

// ---------------------------------------------------------------------------
// CRC32C
// ---------------------------------------------------------------------------

TEST_CASE("Crc32c matches the published check values", "[crc32c]") {
  CHECK(Crc32c(0, "123456789", 9) == 0xE3069283u);
  // RFC 3720 (iSCSI), appendix B.4.
  std::array<uint8_t, 32> bytes{};
  CHECK(Crc32c(0, bytes.data(), bytes.size()) == 0x8A9136AAu);
  bytes.fill(0xFF);
  CHECK(Crc32c(0, bytes.data(), bytes.size()) == 0x62A8AB43u);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  CHECK(Crc32c(0, bytes.data(), bytes.size()) == 0x46DD794Eu);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(31 - i);
  CHECK(Crc32c(0, bytes.data(), bytes.size()) == 0x113FDB5Cu);
  CHECK(Crc32c(0, nullptr, 0) == 0u);
  CHECK(Crc32c(0x12345678u, nullptr, 0) == 0x12345678u);
}

TEST_CASE("Crc32c extended piece by piece equals one pass", "[crc32c]") {
  std::vector<uint8_t> data(1000);
  uint32_t x = 1;
  for (auto& b : data) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 16);
  }
  const uint32_t whole = Crc32c(0, data.data(), data.size());
  // Every split point, so both the 8-byte loop and the byte tail are crossed
  // at every alignment.
  for (size_t split = 0; split <= data.size(); ++split) {
    const uint32_t first = Crc32c(0, data.data(), split);
    REQUIRE(Crc32c(first, data.data() + split, data.size() - split) == whole);
  }
  // Three pieces, starting at odd (unaligned) addresses.
  const uint32_t a = Crc32c(0, data.data(), 3);
  const uint32_t b = Crc32c(a, data.data() + 3, 501);
  CHECK(Crc32c(b, data.data() + 504, data.size() - 504) == whole);
  // And the checksum sees every byte.
  data[777] ^= 1;
  CHECK(Crc32c(0, data.data(), data.size()) != whole);
}

// ---------------------------------------------------------------------------
// Name hash and directory keys
// ---------------------------------------------------------------------------

// The algorithm as name_hash.cpp documents it, written independently: pins
// the hash, which is part of the on-media format.
// The reference test vectors of SipHash-2-4 (the paper's appendix and the
// authors' vectors.h, "vectors_sip64"): key 00 01 .. 0f, message i = the i
// bytes 00 01 .. (i-1), the 8 output bytes read as a little-endian u64.
constexpr uint64_t kSipHashVectors[64] = {
    0x726fdb47dd0e0e31ull, 0x74f839c593dc67fdull, 0x0d6c8009d9a94f5aull, 0x85676696d7fb7e2dull,
    0xcf2794e0277187b7ull, 0x18765564cd99a68dull, 0xcbc9466e58fee3ceull, 0xab0200f58b01d137ull,
    0x93f5f5799a932462ull, 0x9e0082df0ba9e4b0ull, 0x7a5dbbc594ddb9f3ull, 0xf4b32f46226bada7ull,
    0x751e8fbc860ee5fbull, 0x14ea5627c0843d90ull, 0xf723ca908e7af2eeull, 0xa129ca6149be45e5ull,
    0x3f2acc7f57c29bdbull, 0x699ae9f52cbe4794ull, 0x4bc1b3f0968dd39cull, 0xbb6dc91da77961bdull,
    0xbed65cf21aa2ee98ull, 0xd0f2cbb02e3b67c7ull, 0x93536795e3a33e88ull, 0xa80c038ccd5ccec8ull,
    0xb8ad50c6f649af94ull, 0xbce192de8a85b8eaull, 0x17d835b85bbb15f3ull, 0x2f2e6163076bcfadull,
    0xde4daaaca71dc9a5ull, 0xa6a2506687956571ull, 0xad87a3535c49ef28ull, 0x32d892fad841c342ull,
    0x7127512f72f27cceull, 0xa7f32346f95978e3ull, 0x12e0b01abb051238ull, 0x15e034d40fa197aeull,
    0x314dffbe0815a3b4ull, 0x027990f029623981ull, 0xcadcd4e59ef40c4dull, 0x9abfd8766a33735cull,
    0x0e3ea96b5304a7d0ull, 0xad0c42d6fc585992ull, 0x187306c89bc215a9ull, 0xd4a60abcf3792b95ull,
    0xf935451de4f21df2ull, 0xa9538f0419755787ull, 0xdb9acddff56ca510ull, 0xd06c98cd5c0975ebull,
    0xe612a3cb9ecba951ull, 0xc766e62cfcadaf96ull, 0xee64435a9752fe72ull, 0xa192d576b245165aull,
    0x0a8787bf8ecb74b2ull, 0x81b3e73d20b49b6full, 0x7fa8220ba3b2eceaull, 0x245731c13ca42499ull,
    0xb78dbfaf3a8d83bdull, 0xea1ad565322a1a0bull, 0x60e61c23a3795013ull, 0x6606d7e446282b93ull,
    0x6ca4ecb15c5f91e1ull, 0x9f626da15c9625f3ull, 0xe51b38608ef25f57ull, 0x958a324ceb064572ull,
};

TEST_CASE("SipHash24 matches the 64 reference vectors of the SipHash paper", "[name_hash]") {
  const uint64_t k0 = 0x0706050403020100ull;  // key bytes 00..07, little-endian
  const uint64_t k1 = 0x0f0e0d0c0b0a0908ull;  // key bytes 08..0f
  uint8_t message[64];
  for (int i = 0; i < 64; ++i) message[i] = static_cast<uint8_t>(i);
  for (size_t len = 0; len < 64; ++len) {
    INFO("message length " << len);
    CHECK(SipHash24(k0, k1, message, len) == kSipHashVectors[len]);
  }
  // The paper's worked example (appendix A): the 15-byte message.
  CHECK(SipHash24(k0, k1, message, 15) == 0xa129ca6149be45e5ull);
}

TEST_CASE("NameHash is SipHash24 of the name under the superblock's key", "[name_hash]") {
  SuperStatic sb{};
  for (int i = 0; i < 16; ++i) sb.dir_hash_key[i] = static_cast<uint8_t>(i);
  const NameHashKey key = NameHashKey::FromSuper(sb);
  CHECK(key.k0 == 0x0706050403020100ull);
  CHECK(key.k1 == 0x0f0e0d0c0b0a0908ull);
  const std::string name("\x00\x01\x02\x03\x04\x05\x06\x07", 8);
  CHECK(NameHash(key, name) == kSipHashVectors[8]);
  for (const std::string& n : {std::string("lost+found"), std::string(255, 'x')}) {
    CHECK(NameHash(key, n) == SipHash24(key.k0, key.k1, n.data(), n.size()));
  }
}

TEST_CASE("NameHash depends on every bit of the key, the length and every byte", "[name_hash]") {
  const NameHashKey key{0x0123456789abcdefull, 0xfedcba9876543210ull};
  const uint64_t base = NameHash(key, "file");
  for (int bit = 0; bit < 128; ++bit) {
    NameHashKey flipped = key;
    (bit < 64 ? flipped.k0 : flipped.k1) ^= uint64_t{1} << (bit % 64);
    CHECK(NameHash(flipped, "file") != base);
  }
  // The length is part of the last word: "a" and "a\0" differ.
  CHECK(NameHash(key, "a") != NameHash(key, std::string_view("a\0", 2)));
  CHECK(NameHash(key, "") != NameHash(key, std::string_view("\0", 1)));
  CHECK(NameHash(key, "12345678") != NameHash(key, std::string_view("12345678\0", 9)));
  CHECK(NameHash(key, "abcdefgh1") != NameHash(key, "abcdefgh2"));
  std::string long_a(255, 'q'), long_b(255, 'q');
  long_b[254] = 'r';
  CHECK(NameHash(key, long_a) != NameHash(key, long_b));
}

TEST_CASE("directory keys: 40 hash bits and 22 sequence bits", "[name_hash]") {
  const NameHashKey key{42, 43};
  std::set<uint64_t> hashes;
  const uint32_t seq_max = (1u << format::kDirSeqBits) - 1;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t hash = DirHash(NameHash(key, "name-" + std::to_string(i)));
    REQUIRE(hash < (uint64_t{1} << format::kDirHashBits));
    hashes.insert(hash);
    for (uint32_t seq : {0u, 1u, 63u, 64u, seq_max}) {
      const uint64_t dir_key = DirKey(hash, seq);
      REQUIRE(dir_key <= format::kDirKeyMax);
      REQUIRE(dir_key >> format::kDirSeqBits == hash);
      REQUIRE((dir_key & seq_max) == seq);
    }
  }
  // 20000 names in 2^40 values: a collision has odds of about 1 in 5000.
  CHECK(hashes.size() >= 19999);
  // The top bits of the hash are the ones kept.
  CHECK(DirHash(~uint64_t{0}) == (uint64_t{1} << 40) - 1);
  CHECK(DirHash(uint64_t{1} << 24) == 1);
  CHECK(DirHash((uint64_t{1} << 24) - 1) == 0);
  CHECK(DirKey((uint64_t{1} << 40) - 1, seq_max) == format::kDirKeyMax);
  CHECK(format::kDirKeyMax == (uint64_t{1} << 62) - 1);
  // Readdir cookies (key + 3) stay positive as an off_t, and clear of the
  // index bit of a node pointer.
  CHECK(format::kDirKeyMax + 3 < (uint64_t{1} << 63));
  CHECK((format::kDirKeyMax & format::kDirNodeIndexBit) == 0);
}

// ---------------------------------------------------------------------------
// Geometry
// ---------------------------------------------------------------------------

GeometryRequest Request(uint64_t size, uint32_t block_size) {
  GeometryRequest r;
  r.namespace_size = size;
  r.block_size = block_size;
  return r;
}

Geometry ComputeOk(const GeometryRequest& request) {
  Result<Geometry> g = Geometry::Compute(request);
  INFO("size " << request.namespace_size << " block size " << request.block_size);
  REQUIRE(g.ok());
  return g.value();
}

// A valid static superblock for `g` (identity fields filled, checksum set).
SuperStatic SuperFor(const Geometry& g) {
  SuperStatic sb{};
  std::memcpy(sb.magic, format::kSuperStaticMagic, sizeof sb.magic);
  sb.version_major = format::kVersionMajor;
  sb.version_minor = format::kVersionMinor;
  g.FillSuper(&sb);
  sb.dir_hash_key[0] = 99;
  sb.checksum = SuperStaticChecksum(sb);
  return sb;
}

void RequireSameGeometry(const Geometry& a, const Geometry& b) {
  REQUIRE(a.block_size() == b.block_size());
  REQUIRE(a.block_shift() == b.block_shift());
  REQUIRE(a.block_count() == b.block_count());
  REQUIRE(a.blocks_per_group() == b.blocks_per_group());
  REQUIRE(a.inodes_per_group() == b.inodes_per_group());
  REQUIRE(a.group_count() == b.group_count());
  REQUIRE(a.inode_count() == b.inode_count());
  REQUIRE(a.itable_blocks() == b.itable_blocks());
  REQUIRE(a.journal_slots() == b.journal_slots());
  REQUIRE(a.journal_slot_size() == b.journal_slot_size());
  REQUIRE(a.journal_block() == b.journal_block());
  REQUIRE(a.journal_blocks() == b.journal_blocks());
  REQUIRE(a.BackupBlock() == b.BackupBlock());
}

// Every invariant format.hpp states about groups, for one geometry.
void RequireValidLayout(const Geometry& g, uint64_t namespace_size) {
  INFO("namespace " << namespace_size << " block size " << g.block_size() << " blocks "
                    << g.block_count() << " groups " << g.group_count());
  const uint64_t bs = g.block_size();
  REQUIRE(std::has_single_bit(bs));
  REQUIRE(uint64_t{1} << g.block_shift() == bs);
  REQUIRE(g.bytes() <= namespace_size);
  REQUIRE(g.blocks_per_group() == bs * 8);
  REQUIRE(g.group_count() ==
          (g.block_count() + g.blocks_per_group() - 1) / g.blocks_per_group());
  REQUIRE(g.inodes_per_group() > 0);
  REQUIRE(g.inodes_per_group() % (bs / format::kInodeSize) == 0);
  REQUIRE(g.inodes_per_group() <= g.blocks_per_group());
  REQUIRE(g.itable_blocks() * bs == uint64_t{g.inodes_per_group()} * format::kInodeSize);
  REQUIRE(uint64_t{g.journal_blocks()} * bs >=
          uint64_t{g.journal_slots()} * g.journal_slot_size());
  REQUIRE((uint64_t{g.journal_blocks()} - 1) * bs <
          uint64_t{g.journal_slots()} * g.journal_slot_size());

  // Regions [first, end) of every group's metadata, checked for overlap below.
  std::vector<std::pair<uint64_t, uint64_t>> regions;
  regions.push_back({0, 1});  // the superblock
  uint64_t blocks_seen = 0;
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    const uint64_t first = g.GroupFirstBlock(group);
    const uint64_t end = first + g.GroupBlocks(group);
    REQUIRE(first == blocks_seen);
    blocks_seen = end;
    REQUIRE(g.GroupBlocks(group) <= g.blocks_per_group());
    if (group + 1 < g.group_count()) REQUIRE(g.GroupBlocks(group) == g.blocks_per_group());
    REQUIRE(g.BlockBitmapBlock(group) == first + (group == 0 ? 1 : 0));
    for (uint64_t b : {g.BlockBitmapBlock(group), g.GroupDescBlock(group),
                       g.InodeBitmapBlock(group), g.InodeTableBlock(group)}) {
      REQUIRE(b >= first);
      REQUIRE(b < end);
      if (b != g.InodeTableBlock(group)) regions.push_back({b, b + 1});
    }
    const uint64_t itable_end = g.InodeTableBlock(group) + g.itable_blocks();
    REQUIRE(itable_end <= end);
    regions.push_back({g.InodeTableBlock(group), itable_end});
    uint64_t meta_end = itable_end;
    if (group == 0) {
      REQUIRE(g.journal_block() == itable_end);
      REQUIRE(g.journal_block() + g.journal_blocks() <= end);
      regions.push_back({g.journal_block(), g.journal_block() + g.journal_blocks()});
      meta_end = g.journal_block() + g.journal_blocks();
      REQUIRE(g.JournalSlotOffset(g.journal_slots() - 1) + g.journal_slot_size() <=
              g.BlockOffset(meta_end));
      // Room for the root directory, lost+found and some work.
      REQUIRE(end - meta_end >= kMinGroup0DataBlocks);
    }
    REQUIRE(g.FirstDataBlock(group) == meta_end);
    REQUIRE(first + g.GroupMetaBlocks(group) == meta_end);
    // The last group holds at least its metadata and the backup block.
    REQUIRE(meta_end < end);
  }
  REQUIRE(blocks_seen == g.block_count());

  std::sort(regions.begin(), regions.end());
  for (size_t i = 1; i < regions.size(); ++i) {
    INFO("region " << regions[i].first << ".." << regions[i].second << " after "
                   << regions[i - 1].first << ".." << regions[i - 1].second);
    REQUIRE(regions[i].first >= regions[i - 1].second);
  }

  // The backup superblock: the end of the last block, outside all metadata.
  REQUIRE(g.BackupBlock() == g.block_count() - 1);
  REQUIRE(g.BackupSuperOffset() == g.bytes() - format::kSuperHalfSize);
  REQUIRE(g.BackupSuperOffset() >= g.BlockOffset(g.BackupBlock()));
  REQUIRE(g.BackupBlock() >= g.FirstDataBlock(g.group_count() - 1));

  // Inodes land in their group's table.
  const uint64_t ipg = g.inodes_per_group();
  for (uint64_t ino : {uint64_t{0}, format::kRootIno, uint64_t{2}, ipg - 1, ipg, ipg + 1,
                       g.inode_count() - 1}) {
    if (ino >= g.inode_count()) continue;
    const uint32_t group = g.InodeGroup(ino);
    REQUIRE(group < g.group_count());
    REQUIRE(g.InodeOffset(ino) >= g.BlockOffset(g.InodeTableBlock(group)));
    REQUIRE(g.InodeOffset(ino) + format::kInodeSize <=
            g.BlockOffset(g.InodeTableBlock(group) + g.itable_blocks()));
  }

  // What a superblock written from this geometry reads back as.
  const SuperStatic sb = SuperFor(g);
  Result<Geometry> back = Geometry::FromSuper(sb, namespace_size);
  INFO((back.ok() ? std::string() : back.error().message));
  REQUIRE(back.ok());
  RequireSameGeometry(g, back.value());
  Result<Geometry> checked = CheckSuperStatic(sb, namespace_size);
  REQUIRE(checked.ok());
  RequireSameGeometry(g, checked.value());
}

TEST_CASE("Geometry::Compute lays out groups correctly", "[geometry]") {
  struct Case {
    uint32_t block_size;
    std::vector<uint64_t> sizes;
  };
  const std::vector<Case> cases = {
      {4096, {Geometry::MinNamespaceSize(4096), 2 * kMiB, 64 * kMiB, 128 * kMiB,
              128 * kMiB + 4096, 300 * kMiB, 256 * kMiB + 7 * 4096, kGiB, kGiB + 12345,
              100 * kGiB, kTiB}},
      {8192, {Geometry::MinNamespaceSize(8192), 64 * kMiB, 513 * kMiB, 3 * kGiB}},
      {16384, {Geometry::MinNamespaceSize(16384), 64 * kMiB, 5 * kGiB}},
      {65536, {Geometry::MinNamespaceSize(65536), 3 * kMiB, 64 * kMiB, kGiB,
               32 * kGiB + 64 * kMiB, 80 * kGiB, 16 * kTiB}},
      {1u << 20, {Geometry::MinNamespaceSize(1u << 20), 22 * kMiB, 64 * kMiB, kGiB,
                  8 * kTiB + 100 * kMiB, 20 * kTiB}},
  };
  for (const Case& c : cases) {
    for (uint64_t size : c.sizes) {
      const Geometry g = ComputeOk(Request(size, c.block_size));
      CHECK(g.block_size() == c.block_size);
      RequireValidLayout(g, size);
    }
  }
}

TEST_CASE("Geometry::Compute: a partial last group is kept, a too-short one dropped",
          "[geometry]") {
  // 300 MiB of 4 KiB blocks: two whole groups of 128 MiB and one of 44 MiB.
  const Geometry partial = ComputeOk(Request(300 * kMiB, 4096));
  CHECK(partial.group_count() == 3);
  CHECK(partial.block_count() == 300 * kMiB / 4096);
  CHECK(partial.GroupBlocks(2) == 44 * kMiB / 4096);

  // Two whole groups and 7 blocks: too few for the third group's metadata.
  const Geometry dropped = ComputeOk(Request(256 * kMiB + 7 * 4096, 4096));
  CHECK(dropped.group_count() == 2);
  CHECK(dropped.block_count() == 2 * dropped.blocks_per_group());
  CHECK(dropped.BackupBlock() == 2 * uint64_t{dropped.blocks_per_group()} - 1);

  // Around the threshold both outcomes occur, and each is a valid layout.
  bool saw_dropped = false, saw_kept = false;
  for (uint64_t extra = 0; extra < 700; extra += 3) {
    const uint64_t size = 256 * kMiB + extra * 4096;
    const Geometry g = ComputeOk(Request(size, 4096));
    if (g.group_count() == 3) {
      saw_kept = true;
      REQUIRE(g.block_count() == 2 * uint64_t{g.blocks_per_group()} + extra);
    } else {
      saw_dropped = true;
      REQUIRE(g.block_count() == 2 * uint64_t{g.blocks_per_group()});
    }
    RequireValidLayout(g, size);
  }
  CHECK(saw_dropped);
  CHECK(saw_kept);
}

TEST_CASE("Geometry::Compute honours inode and journal options", "[geometry]") {
  GeometryRequest r = Request(kGiB, 4096);
  r.inode_count = 100000;
  Geometry g = ComputeOk(r);
  CHECK(g.inode_count() >= 100000);
  CHECK(g.inode_count() < 100000 + uint64_t{g.group_count()} * 16);
  RequireValidLayout(g, kGiB);

  r = Request(kGiB, 4096);
  r.bytes_per_inode = 4096;
  g = ComputeOk(r);
  CHECK(g.inode_count() >= kGiB / 4096);
  RequireValidLayout(g, kGiB);

  r = Request(kGiB, 4096);
  r.journal_slots = 3;
  r.journal_slot_size = 8192 + 64;
  g = ComputeOk(r);
  CHECK(g.journal_slots() == 3);
  CHECK(g.journal_slot_size() == 8192 + 64);
  CHECK(g.journal_blocks() == 7);  // ceil(3 * 8256 / 4096)
  RequireValidLayout(g, kGiB);

}

// Regression: Compute accepted journal slots larger than the 64 MiB that
// FromSuper allows, so mkfs could write a namespace its own reader refused.
TEST_CASE("Geometry::Compute output is always accepted by FromSuper", "[geometry]") {
  struct JournalCase {
    uint32_t slots;
    uint32_t slot_size;
    bool valid;
  };
  for (JournalCase jc : {JournalCase{1, 4096, true}, JournalCase{kMaxJournalSlots, 4096, true},
                         JournalCase{1, 4096 + 64, true},
                         JournalCase{2, kMaxJournalSlotSize, true},
                         JournalCase{2, kMaxJournalSlotSize + 64, false},
                         JournalCase{2, 128u << 20, false}}) {
    GeometryRequest r = Request(2 * kGiB, 65536);
    r.journal_slots = jc.slots;
    r.journal_slot_size = jc.slot_size;
    Result<Geometry> g = Geometry::Compute(r);
    INFO(jc.slots << " slots of " << jc.slot_size);
    if (jc.valid) {
      REQUIRE(g.ok());
      RequireValidLayout(g.value(), 2 * kGiB);
    } else {
      REQUIRE_FALSE(g.ok());
      CHECK(g.error().code == EINVAL);
    }
  }
}

TEST_CASE("Geometry::Compute rejects bad block sizes with EINVAL", "[geometry]") {
  for (uint32_t bs : {0u, 1u, 512u, 2048u, 3000u, 4095u, 4097u, 12288u, 1000000u, 2u << 20,
                      1u << 31}) {
    Result<Geometry> g = Geometry::Compute(Request(kGiB, bs));
    INFO("block size " << bs);
    REQUIRE_FALSE(g.ok());
    CHECK(g.error().code == EINVAL);
    CHECK_THAT(g.error().message, Catch::Contains("block size"));
    CHECK_THAT(g.error().message, Catch::Contains(std::to_string(bs)));
  }
}

TEST_CASE("Geometry::Compute rejects bad inode and journal options with EINVAL",
          "[geometry]") {
  GeometryRequest r = Request(64 * kMiB, 4096);
  r.bytes_per_inode = 255;
  CHECK(Geometry::Compute(r).code() == EINVAL);

  r = Request(64 * kMiB, 4096);
  r.inode_count = 64 * kMiB;  // one per 1 byte: more than one bitmap block per group
  Result<Geometry> g = Geometry::Compute(r);
  CHECK(g.code() == EINVAL);
  if (!g.ok()) CHECK_THAT(g.error().message, Catch::Contains("inodes"));

  r = Request(64 * kMiB, 4096);
  r.journal_slots = kMaxJournalSlots + 1;
  CHECK(Geometry::Compute(r).code() == EINVAL);
  r = Request(64 * kMiB, 4096);
  r.journal_slot_size = 4096 + 1;
  CHECK(Geometry::Compute(r).code() == EINVAL);
  r = Request(64 * kMiB, 4096);
  r.journal_slot_size = 2048;
  CHECK(Geometry::Compute(r).code() == EINVAL);
}

// Regression: MinNamespaceSize left out the inode table, so at small block
// sizes Compute refused the very size it named as the minimum.
TEST_CASE("Geometry::Compute accepts MinNamespaceSize and refuses one block less",
          "[geometry]") {
  for (uint32_t bs = format::kMinBlockSize; bs <= format::kMaxBlockSize; bs <<= 1) {
    const uint64_t min = Geometry::MinNamespaceSize(bs);
    INFO("block size " << bs << " minimum " << min);
    CHECK(min % bs == 0);
    Result<Geometry> at = Geometry::Compute(Request(min, bs));
    INFO((at.ok() ? std::string() : at.error().message));
    CHECK(at.ok());
    for (uint64_t size : {min - 1, min - bs, uint64_t{0}, uint64_t{bs}}) {
      Result<Geometry> below = Geometry::Compute(Request(size, bs));
      INFO("size " << size);
      REQUIRE_FALSE(below.ok());
      CHECK(below.error().code == ENOSPC);
      CHECK_THAT(below.error().message, Catch::Contains(std::to_string(min)));
    }
  }
  // 1 MiB blocks need 22 MiB: superblock, 3 metadata blocks, one inode-table
  // block, a 1 MiB journal and 16 data blocks.
  CHECK(Geometry::MinNamespaceSize(1u << 20) == 22 * kMiB);
}

// A superblock with one field changed by `mutate` (checksum recomputed).
struct Corruption {
  const char* what;
  std::function<void(SuperStatic&)> mutate;
};

TEST_CASE("Geometry::FromSuper rejects each inconsistent field with EUCLEAN", "[geometry]") {
  const uint64_t size = 300 * kMiB;  // 3 groups, the last partial
  const Geometry g = ComputeOk(Request(size, 4096));
  const SuperStatic good = SuperFor(g);
  REQUIRE(Geometry::FromSuper(good, size).ok());

  const std::vector<Corruption> corruptions = {
      {"block size not a power of two", [](SuperStatic& s) { s.block_size = 3000; }},
      {"block size too small", [](SuperStatic& s) { s.block_size = 2048; s.block_shift = 11; }},
      {"block size too large", [](SuperStatic& s) { s.block_size = 2u << 20; s.block_shift = 21; }},
      {"block size doubled", [](SuperStatic& s) { s.block_size = 8192; }},
      {"block shift", [](SuperStatic& s) { s.block_shift += 1; }},
      {"block count zero", [](SuperStatic& s) { s.block_count = 0; }},
      {"block count past the namespace", [](SuperStatic& s) { s.block_count += 1; }},
      {"block count huge", [](SuperStatic& s) { s.block_count = format::kMaxBlockCount; }},
      {"blocks per group", [](SuperStatic& s) { s.blocks_per_group -= 8; }},
      {"group count high", [](SuperStatic& s) { s.group_count += 1; }},
      {"group count low", [](SuperStatic& s) { s.group_count -= 1; }},
      {"inode size", [](SuperStatic& s) { s.inode_size = 128; }},
      {"inodes per group not a multiple", [](SuperStatic& s) { s.inodes_per_group += 1; }},
      {"inodes per group zero", [](SuperStatic& s) { s.inodes_per_group = 0; }},
      {"inodes per group above blocks per group",
       [](SuperStatic& s) { s.inodes_per_group = s.blocks_per_group + 16; }},
      {"inode count", [](SuperStatic& s) { s.inode_count += 1; }},
      {"inode table size", [](SuperStatic& s) { s.itable_blocks += 1; }},
      {"journal slots zero", [](SuperStatic& s) { s.journal_slots = 0; }},
      {"journal slots too many", [](SuperStatic& s) { s.journal_slots = kMaxJournalSlots + 1; }},
      {"journal slot size not a multiple of 64", [](SuperStatic& s) { s.journal_slot_size += 8; }},
      {"journal slot size too small", [](SuperStatic& s) { s.journal_slot_size = 1024; }},
      {"journal blocks", [](SuperStatic& s) { s.journal_blocks += 1; }},
      {"journal moved", [](SuperStatic& s) { s.journal_block += 1; }},
      {"journal moved back", [](SuperStatic& s) { s.journal_block -= 1; }},
      {"root inode", [](SuperStatic& s) { s.root_ino = 2; }},
      {"group 0 too small",
       [](SuperStatic& s) {
         s.block_count = 200;
         s.group_count = 1;
         s.inode_count = s.inodes_per_group;
       }},
      {"last group shorter than its metadata",
       [](SuperStatic& s) {
         s.block_count = 2 * uint64_t{s.blocks_per_group} + 5;
         s.group_count = 3;
         s.inode_count = 3 * uint64_t{s.inodes_per_group};
       }},
  };
  for (const Corruption& c : corruptions) {
    SuperStatic bad = good;
    c.mutate(bad);
    bad.checksum = SuperStaticChecksum(bad);
    Result<Geometry> r = Geometry::FromSuper(bad, size);
    INFO(c.what);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == EUCLEAN);
    CHECK_FALSE(r.error().message.empty());
    // CheckSuperStatic passes the geometry error through.
    CHECK(CheckSuperStatic(bad, size).code() == EUCLEAN);
  }

  // The same superblock on a namespace that shrank under it.
  Result<Geometry> truncated = Geometry::FromSuper(good, size - 4096);
  REQUIRE_FALSE(truncated.ok());
  CHECK(truncated.error().code == EUCLEAN);
  CHECK_THAT(truncated.error().message, Catch::Contains("truncated"));
  // A namespace that grew is fine: the filesystem uses its own block count.
  CHECK(Geometry::FromSuper(good, size + kGiB).ok());
}

TEST_CASE("CheckSuperStatic checks magic, checksum, version and features", "[superblock]") {
  const uint64_t size = 64 * kMiB;
  const SuperStatic good = SuperFor(ComputeOk(Request(size, 4096)));
  REQUIRE(CheckSuperStatic(good, size).ok());

  SuperStatic s = good;
  s.magic[0] = 'N';
  s.checksum = SuperStaticChecksum(s);
  CHECK(CheckSuperStatic(s, size).code() == EUCLEAN);

  s = good;
  s.reserved[100] = 1;  // checksum not updated
  Result<Geometry> r = CheckSuperStatic(s, size);
  CHECK(r.code() == EUCLEAN);
  if (!r.ok()) CHECK_THAT(r.error().message, Catch::Contains("checksum"));

  s = good;
  s.version_major = format::kVersionMajor + 1;
  s.checksum = SuperStaticChecksum(s);
  CHECK(CheckSuperStatic(s, size).code() == EPROTONOSUPPORT);

  // Version 1 (the unkeyed, steerable hash) is refused in one line that says
  // what to do.
  s = good;
  s.version_major = 1;
  s.version_minor = 0;
  s.checksum = SuperStaticChecksum(s);
  r = CheckSuperStatic(s, size);
  CHECK(r.code() == EPROTONOSUPPORT);
  if (!r.ok()) {
    CHECK_THAT(r.error().message, Catch::Contains("format 1.0 is no longer supported"));
    CHECK_THAT(r.error().message, Catch::Contains("re-create"));
    CHECK(r.error().message.find('\n') == std::string::npos);
  }

  s = good;
  s.version_minor = format::kVersionMinor + 7;  // informational only
  s.checksum = SuperStaticChecksum(s);
  CHECK(CheckSuperStatic(s, size).ok());

  s = good;
  s.feature_incompat = uint64_t{1} << 40;
  s.checksum = SuperStaticChecksum(s);
  r = CheckSuperStatic(s, size);
  CHECK(r.code() == EPROTONOSUPPORT);
  if (!r.ok()) CHECK_THAT(r.error().message, Catch::Contains("features"));

  // Unknown compat and ro_compat bits do not refuse a read.
  s = good;
  s.feature_compat = 1;
  s.feature_ro_compat = 4;
  s.checksum = SuperStaticChecksum(s);
  CHECK(CheckSuperStatic(s, size).ok());
  CHECK(UnknownRoCompat(s) == 4);
  CHECK(UnknownRoCompat(good) == 0);
}

TEST_CASE("CheckSuperDynamic checks magic, checksum and state", "[superblock]") {
  format::SuperDynamic d{};
  std::memcpy(d.magic, format::kSuperDynamicMagic, sizeof d.magic);
  d.state = static_cast<uint32_t>(format::FsState::kClean);
  d.checksum = SuperDynamicChecksum(d);
  CHECK(CheckSuperDynamic(d).ok());

  format::SuperDynamic bad = d;
  bad.free_blocks = 5;  // checksum stale
  CHECK(CheckSuperDynamic(bad).code() == EUCLEAN);
  bad = d;
  bad.state = 3;
  bad.checksum = SuperDynamicChecksum(bad);
  CHECK(CheckSuperDynamic(bad).code() == EUCLEAN);
  bad = d;
  bad.magic[7] = 'x';
  bad.checksum = SuperDynamicChecksum(bad);
  CHECK(CheckSuperDynamic(bad).code() == EUCLEAN);
  bad = d;
  bad.state = static_cast<uint32_t>(format::FsState::kMounted);
  bad.checksum = SuperDynamicChecksum(bad);
  CHECK(CheckSuperDynamic(bad).ok());
}

TEST_CASE("ForEachBackupCandidate names the end of the last block and group", "[superblock]") {
  // 256 MiB + 7 blocks: mkfs with 4 KiB blocks drops the short third group,
  // so the backup ends the second group.
  const uint64_t size = 256 * kMiB + 7 * 4096;
  const Geometry g = ComputeOk(Request(size, 4096));
  std::set<uint64_t> offsets;
  ForEachBackupCandidate(size, [&](uint64_t offset, uint32_t block_size) {
    CHECK(offset + format::kSuperHalfSize <= size);
    CHECK((offset + format::kSuperHalfSize) % block_size == 0);
    offsets.insert(offset);
  });
  CHECK(offsets.count(g.BackupSuperOffset()) == 1);
  CHECK(offsets.count(size - format::kSuperHalfSize) == 1);
  // And for every block size mkfs accepts on some size, its backup is a candidate.
  for (uint32_t bs = format::kMinBlockSize; bs <= format::kMaxBlockSize; bs <<= 1) {
    for (uint64_t s : {64 * kMiB + 3 * 4096, 300 * kMiB, kGiB - 1}) {
      const Geometry gb = ComputeOk(Request(s, bs));
      bool found = false;
      ForEachBackupCandidate(s, [&](uint64_t offset, uint32_t cand_bs) {
        found |= offset == gb.BackupSuperOffset() && cand_bs == bs;
      });
      INFO("size " << s << " block size " << bs);
      CHECK(found);
    }
  }
}

// ---------------------------------------------------------------------------
// Command-line parsers
// ---------------------------------------------------------------------------

TEST_CASE("ParseSize accepts numbers with binary units", "[cli]") {
  const std::vector<std::pair<const char*, uint64_t>> good = {
      {"0", 0},
      {"4096", 4096},
      {"5b", 5},
      {"5B", 5},
      {"64k", 64 * kKiB},
      {"64K", 64 * kKiB},
      {"1KiB", kKiB},
      {"1kb", kKiB},
      {"1M", kMiB},
      {"1MB", kMiB},
      {"16G", 16 * kGiB},
      {"2T", 2 * kTiB},
      {"3p", 3 * 1024 * kTiB},
      {"1E", uint64_t{1} << 60},
      {"15E", uint64_t{15} << 60},
      {"18446744073709551615", UINT64_MAX},
  };
  for (const auto& [text, value] : good) {
    INFO(text);
    const std::optional<uint64_t> parsed = ParseSize(text);
    REQUIRE(parsed.has_value());
    CHECK(*parsed == value);
  }
}

TEST_CASE("ParseSize rejects garbage and overflow", "[cli]") {
  for (const char* text : {"", "k", "-1", "+1", " 1", "1 ", "1 G", "1.5G", "1x", "1kk",
                           "1kibb", "1ki", "0x10", "1z", "16E", "18446744073709551616",
                           "99999999999999999999", "17179869184G"}) {
    INFO("\"" << text << "\"");
    CHECK_FALSE(ParseSize(text).has_value());
  }
  CHECK_FALSE(ParseSize(std::string_view("1\0", 2)).has_value());
}

TEST_CASE("FormatSize prints one decimal in the largest binary unit", "[cli]") {
  CHECK(FormatSize(0) == "0 B");
  CHECK(FormatSize(1023) == "1023 B");
  CHECK(FormatSize(1024) == "1.0 KiB");
  CHECK(FormatSize(1536) == "1.5 KiB");
  CHECK(FormatSize(256 * kMiB) == "256.0 MiB");
  CHECK(FormatSize(kGiB + kGiB / 2) == "1.5 GiB");
  CHECK(FormatSize(2 * kTiB) == "2.0 TiB");
  CHECK(FormatSize(UINT64_MAX) == "16.0 EiB");
  // Whole units print back to what ParseSize reads, unit for unit.
  for (uint64_t v : {kKiB, 64 * kKiB, kMiB, 300 * kMiB, 16 * kGiB, 3 * kTiB}) {
    std::string text = FormatSize(v);
    INFO(text);
    REQUIRE(text.find(".0 ") != std::string::npos);
    text.erase(text.find(".0 "), 3);
    CHECK(ParseSize(text) == v);
  }
}

TEST_CASE("ParseUuid and FormatUuid round-trip", "[cli]") {
  const std::string text = "0123abcd-4567-89ef-fedc-ba9876543210";
  const std::optional<Uuid> parsed = ParseUuid(text);
  REQUIRE(parsed.has_value());
  CHECK((*parsed)[0] == 0x01);
  CHECK((*parsed)[3] == 0xcd);
  CHECK((*parsed)[15] == 0x10);
  CHECK(FormatUuid(*parsed) == text);
  // Upper case is read, lower case is written.
  CHECK(ParseUuid("0123ABCD-4567-89EF-FEDC-BA9876543210") == parsed);

  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const Uuid u = RandomUuid();
    CHECK((u[6] >> 4) == 4);        // version 4
    CHECK((u[8] & 0xC0) == 0x80);   // RFC 4122 variant
    const std::string s = FormatUuid(u);
    REQUIRE(s.size() == 36);
    CHECK(ParseUuid(s) == u);
    seen.insert(s);
  }
  CHECK(seen.size() == 200);
}

TEST_CASE("ParseUuid rejects malformed text", "[cli]") {
  for (const char* text : {"", "0123abcd-4567-89ef-fedc-ba987654321",     // 35
                           "0123abcd-4567-89ef-fedc-ba98765432100",     // 37
                           "0123abcd456789effedcba9876543210",          // no dashes
                           "0123abcd4-567-89ef-fedc-ba9876543210",      // dash moved
                           "0123abcd-4567-89ef-fedc-ba987654321g",      // not hex
                           "{0123abcd-4567-89ef-fedc-ba9876543210}",
                           "0123abcd-4567-89ef-fedc-ba98765432-1",
                           "------------------------------------",
                           "0123abcd-4567-89ef-fedc ba9876543210"}) {
    INFO("\"" << text << "\"");
    CHECK_FALSE(ParseUuid(text).has_value());
  }
}

// ---------------------------------------------------------------------------
// Directory leaves
// ---------------------------------------------------------------------------

using ParsedEntry = test::LeafRecord;

std::vector<ParsedEntry> WalkLeaf(const std::vector<std::byte>& block) {
  return test::ParseDirLeaf(block.data(), block.size());
}

TEST_CASE("DirRecordLength rounds header plus name up to 8 bytes", "[dir_block]") {
  CHECK(format::DirRecordLength(1) == 32);
  CHECK(format::DirRecordLength(8) == 32);
  CHECK(format::DirRecordLength(9) == 40);
  CHECK(format::DirRecordLength(255) == 280);
}

TEST_CASE("DirLeafBuilder starts with a header and one free record", "[dir_block]") {
  for (uint32_t bs : {4096u, 65536u}) {
    std::vector<std::byte> block(bs, std::byte{0xAA});
    DirLeafBuilder leaf(block, 12, 0xABC);
    format::DirLeafHeader header;
    std::memcpy(&header, block.data(), sizeof header);
    CHECK(header.magic == format::kDirLeafMagic);
    CHECK(header.prefix_bits == 12);
    CHECK(header.prefix == 0xABC);
    CHECK(header.next == 0);
    CHECK(header.reserved0 == 0);
    CHECK(header.reserved1 == 0);
    const std::vector<ParsedEntry> records = WalkLeaf(block);
    REQUIRE(records.size() == 1);
    CHECK(records[0].entry.ino == 0);
    CHECK(records[0].entry.rec_len == bs - sizeof(format::DirLeafHeader));
  }
}

TEST_CASE("DirLeafBuilder fills a block, refuses when full, and parses back", "[dir_block]") {
  for (uint32_t bs : {4096u, 65536u}) {
    INFO("block size " << bs);
    std::vector<std::byte> block(bs);
    DirLeafBuilder leaf(block, 0, 0);
    std::vector<std::pair<uint64_t, std::string>> added;
    uint32_t refused_len = 0;  // record length of the name that did not fit
    // Names of many lengths in 1..255 in turn, until one does not fit.
    for (uint32_t i = 0;; ++i) {
      const uint32_t len = 1 + (i * 37) % format::kNameMax;
      std::string name(len, static_cast<char>('a' + i % 26));
      name[0] = static_cast<char>('0' + i % 10);
      const uint64_t ino = 1000 + i;
      const std::vector<std::byte> before = block;
      if (!leaf.Add(ino, DirKey(DirHash(NameHash(NameHashKey{5, 6}, name)), i % 64), DT_REG, name)) {
        CHECK(block == before);  // a refused Add changes nothing
        refused_len = format::DirRecordLength(len);
        break;
      }
      added.push_back({ino, name});
      REQUIRE(added.size() < bs);
    }
    REQUIRE(added.size() > 3);
    const std::vector<ParsedEntry> records = WalkLeaf(block);
    size_t live = 0;
    for (const ParsedEntry& p : records) {
      if (p.entry.ino == 0) {
        // Only the tail is free, and it really was too short.
        CHECK(&p == &records.back());
        CHECK(p.entry.rec_len < refused_len);
        continue;
      }
      REQUIRE(live < added.size());
      CHECK(p.entry.ino == added[live].first);
      CHECK(p.name == added[live].second);
      CHECK(p.entry.key == DirKey(DirHash(NameHash(NameHashKey{5, 6}, p.name)), live % 64));
      CHECK(p.entry.file_type == DT_REG);
      ++live;
    }
    CHECK(live == added.size());
  }
}

TEST_CASE("DirLeafBuilder gives a remainder too short for a record to the last entry",
          "[dir_block]") {
  std::vector<std::byte> block(4096);
  DirLeafBuilder leaf(block, 0, 0);
  // 4064 bytes after the header: 14 records of 280 bytes leave 144.
  for (int i = 0; i < 14; ++i) {
    REQUIRE(leaf.Add(10 + i, i, DT_REG, std::string(255, static_cast<char>('A' + i))));
  }
  // A 104-byte name needs 128 bytes; the 16 left over cannot hold a record.
  REQUIRE(leaf.Add(99, 99, DT_DIR, std::string(104, 'z')));
  const std::vector<ParsedEntry> records = WalkLeaf(block);
  REQUIRE(records.size() == 15);
  CHECK(records.back().entry.ino == 99);
  CHECK(records.back().entry.rec_len == 144);
  CHECK(records.back().entry.file_type == DT_DIR);
  CHECK(records.back().name == std::string(104, 'z'));
  const std::vector<std::byte> before = block;
  CHECK_FALSE(leaf.Add(100, 100, DT_REG, "a"));
  CHECK(block == before);
}

TEST_CASE("DirLeafBuilder fills a block exactly", "[dir_block]") {
  std::vector<std::byte> block(4096);
  DirLeafBuilder leaf(block, 0, 0);
  // 4064 = 14 * 280 + 144, and a 120-byte name takes exactly 144.
  for (int i = 0; i < 14; ++i) REQUIRE(leaf.Add(10 + i, i, DT_REG, std::string(255, 'q')));
  REQUIRE(leaf.Add(50, 50, DT_LNK, std::string(120, 'e')));
  const std::vector<ParsedEntry> records = WalkLeaf(block);
  REQUIRE(records.size() == 15);
  CHECK(records.back().entry.rec_len == 144);
  CHECK_FALSE(leaf.Add(51, 51, DT_REG, "b"));
}

// ---------------------------------------------------------------------------
// Fresh inodes (the core's create, mkfs, fsck's new root and lost+found)
// ---------------------------------------------------------------------------

TEST_CASE("FreshInode: a directory has two links and its parent, a file one and none",
          "[inode]") {
  const timespec now{.tv_sec = 1700000000, .tv_nsec = 123456789};
  const format::Inode dir = FreshInode(S_IFDIR | 0750, 1000, 100, 42, now, 77);
  CHECK(dir.nlink == 2);
  CHECK(dir.parent == 42);
  // Every byte: what the maker chose, the rest zero.
  format::Inode expected{};
  expected.mode = S_IFDIR | 0750;
  expected.nlink = 2;
  expected.uid = 1000;
  expected.gid = 100;
  expected.parent = 42;
  expected.generation = 77;
  expected.atime_sec = expected.mtime_sec = expected.ctime_sec = expected.btime_sec = now.tv_sec;
  expected.atime_nsec = expected.mtime_nsec = expected.ctime_nsec = expected.btime_nsec =
      static_cast<uint32_t>(now.tv_nsec);
  CHECK(std::memcmp(&dir, &expected, sizeof dir) == 0);

  for (uint32_t type : {uint32_t{S_IFREG}, uint32_t{S_IFLNK}, uint32_t{S_IFCHR}, uint32_t{S_IFIFO},
                        uint32_t{S_IFSOCK}}) {
    const format::Inode other = FreshInode(type | 0644, 1, 2, 42, now, 5);
    CHECK(other.mode == (type | 0644));
    CHECK(other.nlink == 1);
    CHECK(other.parent == 0);
    CHECK(other.rdev == 0);
    CHECK(other.size == 0);
    CHECK(other.blocks == 0);
  }
}

}  // namespace
}  // namespace nvfs
