// File block mapping: lookups and their runs, mapping at every depth,
// truncate and punch (with early stops), crash recovery, corruption.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstddef>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "bmap/bmap.hpp"
#include "fs_fixture.hpp"

namespace nvfs::test {
namespace {

using format::Inode;

// Depth boundaries with 4 KiB blocks (p = 512).
constexpr uint64_t kDepth1 = 11;
constexpr uint64_t kDepth2 = 11 + 512;
constexpr uint64_t kDepth3 = 11 + 512 + 262144;
constexpr uint64_t kDepth4 = kDepth3 + (uint64_t{1} << 27);
constexpr uint64_t kDepth5 = kDepth4 + (uint64_t{1} << 36);

const Inode& InodeOf(FsFixture& fs, uint64_t ino) { return fs.ctx().InodeAt(ino); }

uint64_t Phys(const Bmap& bmap, const Inode& inode, uint64_t index) {
  uint64_t run = 0;
  return bmap.Lookup(inode, index, 1, &run);
}

// The physical block of each of the first `count` file blocks, 0 for a hole.
std::vector<uint64_t> PhysAll(const Bmap& bmap, const Inode& inode, uint64_t count) {
  std::vector<uint64_t> phys(count);
  for (uint64_t i = 0; i < count; ++i) phys[i] = Phys(bmap, inode, i);
  return phys;
}

// Maps [index, index + count) of `ino`, committing whenever the slot runs low.
void MapRange(FsFixture& fs, Bmap& bmap, uint64_t ino, uint64_t index, uint64_t count,
              bool zero_new = true) {
  std::optional<Tx> tx;
  tx.emplace(fs.journal(), "map");
  while (count > 0) {
    if (tx->room() < 8192) {
      REQUIRE(tx->Commit().ok());
      tx.emplace(fs.journal(), "map");
    }
    auto run = bmap.MapForWrite(*tx, InodeOf(fs, ino), index, count, zero_new);
    REQUIRE(run.ok());
    REQUIRE(run->count >= 1);
    REQUIRE(run->count <= count);
    index += run->count;
    count -= run->count;
  }
  REQUIRE(tx->Commit().ok());
}

// Truncates (or punches) to completion, one transaction per call; returns the
// number of transactions it took.
int TruncateAll(FsFixture& fs, Bmap& bmap, uint64_t ino, uint64_t from) {
  for (int calls = 1;; ++calls) {
    Tx tx(fs.journal(), "truncate");
    auto done = bmap.Truncate(tx, InodeOf(fs, ino), from);
    REQUIRE(done.ok());
    REQUIRE(tx.Commit().ok());
    if (*done) return calls;
    REQUIRE(calls < 10000);
  }
}

void PunchAll(FsFixture& fs, Bmap& bmap, uint64_t ino, uint64_t first, uint64_t count) {
  for (int calls = 1;; ++calls) {
    Tx tx(fs.journal(), "punch");
    auto done = bmap.Punch(tx, InodeOf(fs, ino), first, count);
    REQUIRE(done.ok());
    REQUIRE(tx.Commit().ok());
    if (*done) return;
    REQUIRE(calls < 10000);
  }
}

bool MapIsEmpty(const Inode& inode) {
  for (uint64_t ptr : inode.map.file.direct) {
    if (ptr != 0) return false;
  }
  for (uint64_t ptr : inode.map.file.indirect) {
    if (ptr != 0) return false;
  }
  return true;
}

// Checks Lookup's runs against block-by-block lookups of [0, blocks), from
// every start in `starts` and with several max_run values.
void CheckRuns(const Bmap& bmap, const Inode& inode, uint64_t blocks,
               const std::vector<uint64_t>& starts) {
  const std::vector<uint64_t> phys = PhysAll(bmap, inode, blocks);
  for (uint64_t start : starts) {
    for (uint64_t max_run : {uint64_t{1}, uint64_t{7}, uint64_t{600}, blocks - start}) {
      if (max_run == 0 || start + max_run > blocks) continue;
      uint64_t run = 0;
      const uint64_t got = bmap.Lookup(inode, start, max_run, &run);
      INFO("start " << start << " max_run " << max_run);
      REQUIRE(got == phys[start]);
      uint64_t expect = 1;
      while (expect < max_run &&
             phys[start + expect] == (phys[start] == 0 ? 0 : phys[start] + expect)) {
        ++expect;
      }
      CHECK(run == expect);
    }
  }
}

TEST_CASE("max_blocks is the format's reach, capped at 2^63 bytes", "[bmap]") {
  {
    FsFixture fs(64ull << 20);
    Bmap bmap(fs.ctx());
    const uint64_t p = 512;
    CHECK(bmap.max_blocks() == 11 + p + p * p + p * p * p + p * p * p * p + p * p * p * p * p);
  }
  {
    FsFixture fs(256ull << 20, 65536);
    Bmap bmap(fs.ctx());
    CHECK(bmap.max_blocks() == (uint64_t{1} << 63) >> 16);
  }
  {
    FsFixture fs(64ull << 20, 1u << 20);  // p^5 overflows 64 bits here
    Bmap bmap(fs.ctx());
    CHECK(bmap.max_blocks() == (uint64_t{1} << 63) >> 20);
  }
}

TEST_CASE("direct blocks map contiguously, zeroed, counted in inode.blocks", "[bmap]") {
  FsFixture fs(256ull << 20);
  const uint64_t ino = CreateFile(fs);
  Bmap bmap(fs.ctx());
  const uint64_t free_before = fs.alloc().free_blocks();
  // Dirty a block the allocator will hand out, to see zero_new work.
  const uint64_t goal = fs.geometry().FirstDataBlock(0);
  {
    Tx tx(fs.journal(), "map");
    auto run = bmap.MapForWrite(tx, InodeOf(fs, ino), 0, 11, true);
    REQUIRE(run.ok());
    CHECK(run->count == 11);
    CHECK(run->first >= goal);
    for (uint64_t i = 0; i < 11; ++i) {
      const std::byte* data = fs.ctx().Block(run->first + i);
      CHECK(std::all_of(data, data + 4096, [](std::byte b) { return b == std::byte{0}; }));
    }
    // Mapping again finds the same blocks, allocating nothing.
    auto again = bmap.MapForWrite(tx, InodeOf(fs, ino), 3, 100, true);
    REQUIRE(again.ok());
    CHECK(again->first == run->first + 3);
    CHECK(again->count == 8);
    REQUIRE(tx.Commit().ok());
  }
  CHECK(fs.alloc().free_blocks() == free_before - 11);
  CHECK(InodeOf(fs, ino).blocks == 11);
  fs.Reopen();
  Bmap reopened(fs.ctx());
  uint64_t run = 0;
  const uint64_t first = reopened.Lookup(InodeOf(fs, ino), 0, 100, &run);
  CHECK(first != 0);
  CHECK(run == 11);
  CHECK(fs.alloc().free_blocks() == free_before - 11);
}

TEST_CASE("each depth costs its pointer blocks and no more", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  struct Case {
    uint64_t index;
    uint64_t pointer_blocks;
    bool last_in_leaf;
  };
  for (const Case c :
       {Case{kDepth1, 1, false}, Case{kDepth1 + 511, 1, true}, Case{kDepth2, 2, false},
        Case{kDepth2 + 262143, 2, true}, Case{kDepth3, 3, false},
        Case{kDepth3 + 12345678, 3, false}, Case{kDepth4, 4, false}, Case{kDepth5, 5, false},
        Case{bmap.max_blocks() - 1, 5, true}}) {
    INFO("index " << c.index);
    const uint64_t ino = CreateFile(fs);
    const uint64_t free_before = fs.alloc().free_blocks();
    MapRange(fs, bmap, ino, c.index, 1);
    const Inode& inode = InodeOf(fs, ino);
    CHECK(fs.alloc().free_blocks() == free_before - c.pointer_blocks - 1);
    CHECK(inode.blocks == c.pointer_blocks + 1);
    const uint64_t phys = Phys(bmap, inode, c.index);
    CHECK(phys != 0);
    CHECK(phys != Bmap::kCorrupt);
    CHECK(fs.alloc().InUse(BitmapKind::kBlocks, phys));
    CHECK(Phys(bmap, inode, c.index - 1) == 0);
    if (c.index + 1 < bmap.max_blocks()) CHECK(Phys(bmap, inode, c.index + 1) == 0);
    CHECK(bmap.NextMapped(inode, 0, bmap.max_blocks()) == c.index);
    // A second block in the same leaf costs only itself.
    if (!c.last_in_leaf) {
      MapRange(fs, bmap, ino, c.index + 1, 1);
      CHECK(inode.blocks == c.pointer_blocks + 2);
      CHECK(Phys(bmap, inode, c.index + 1) == phys + 1);
    }
    TruncateAll(fs, bmap, ino, 0);
    CHECK(fs.alloc().free_blocks() == free_before);
    CHECK(inode.blocks == 0);
    CHECK(MapIsEmpty(inode));
  }
}

TEST_CASE("a sparse block at 1 TiB costs only its branch", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  const uint64_t index = (uint64_t{1} << 40) / 4096;  // in the depth-4 tree
  REQUIRE(index >= kDepth4);
  const uint64_t free_before = fs.alloc().free_blocks();
  MapRange(fs, bmap, ino, index, 3);
  const Inode& inode = InodeOf(fs, ino);
  CHECK(fs.alloc().free_blocks() == free_before - 4 - 3);
  CHECK(inode.blocks == 7);
  uint64_t run = 0;
  const uint64_t phys = bmap.Lookup(inode, index, 10, &run);
  CHECK(phys != 0);
  CHECK(run == 3);
  // Everything before it is one hole, found without reading 2^28 slots.
  CHECK(bmap.Lookup(inode, 0, index + 10, &run) == 0);
  CHECK(run == index);
  CHECK(bmap.NextMapped(inode, 0, ~uint64_t{0}) == index);
  CHECK(bmap.NextHole(inode, index, ~uint64_t{0}) == index + 3);
}

TEST_CASE("MapForWrite refuses past max_blocks with EFBIG", "[bmap]") {
  FsFixture fs(64ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  Tx tx(fs.journal(), "efbig");
  CHECK(bmap.MapForWrite(tx, InodeOf(fs, ino), bmap.max_blocks(), 1, true).code() == EFBIG);
  CHECK(bmap.MapForWrite(tx, InodeOf(fs, ino), bmap.max_blocks() - 1, 2, true).code() == EFBIG);
  CHECK(InodeOf(fs, ino).blocks == 0);
  tx.Abort();
}

TEST_CASE("a sequential file maps in few runs, each run exact", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  const uint64_t free_before = fs.alloc().free_blocks();
  // As writes would: 32 blocks at a time.
  for (uint64_t i = 0; i < 1000; i += 32) MapRange(fs, bmap, ino, i, std::min<uint64_t>(32, 1000 - i));
  const Inode& inode = InodeOf(fs, ino);
  CHECK(inode.blocks == 1000 + 3);  // the depth-1 leaf, the depth-2 root and leaf
  CHECK(fs.alloc().free_blocks() == free_before - inode.blocks);

  int runs = 0;
  std::set<uint64_t> seen;
  for (uint64_t i = 0; i < 1000;) {
    uint64_t run = 0;
    const uint64_t phys = bmap.Lookup(inode, i, 1000 - i, &run);
    REQUIRE(phys != 0);
    REQUIRE(phys != Bmap::kCorrupt);
    REQUIRE(run >= 1);
    for (uint64_t j = 0; j < run; ++j) CHECK(seen.insert(phys + j).second);
    i += run;
    ++runs;
  }
  CHECK(runs <= 3);  // pointer blocks sit between the data at 11 and 523
  CheckRuns(bmap, inode, 1000, {0, 1, 5, 10, 11, 12, 500, 522, 523, 524, 990, 999});
}

TEST_CASE("Lookup runs continue across array and range boundaries", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  const Geometry& g = fs.geometry();
  const uint64_t inode_at = g.InodeOffset(ino);
  // Lay out file blocks 0..1100 by hand on one contiguous physical run, with
  // the pointer blocks elsewhere: direct, the depth-1 leaf, and two leaves of
  // the depth-2 tree (523..1034 and 1035..1100).
  Extent data, pointers;
  {
    Tx tx(fs.journal(), "craft");
    auto d = fs.alloc().AllocateBlocks(tx, 0, 1101);
    auto p = fs.alloc().AllocateBlocks(tx, 0, 4);
    REQUIRE(d.ok());
    REQUIRE(p.ok());
    REQUIRE(d->count == 1101);
    REQUIRE(p->count == 4);
    data = *d;
    pointers = *p;
    const uint64_t leaf1 = pointers.first, root2 = pointers.first + 1;
    const uint64_t leaves2[2] = {pointers.first + 2, pointers.first + 3};
    for (uint64_t b = pointers.first; b < pointers.first + 4; ++b) {
      tx.FillFresh(g.BlockOffset(b), 0, 4096);
    }
    for (uint64_t i = 0; i < 11; ++i) {
      tx.Store64(inode_at + offsetof(Inode, map) + 8 * i, data.first + i);
    }
    for (uint64_t i = 0; i < 512; ++i) {
      const uint64_t ptr = data.first + 11 + i;
      tx.StoreFresh(g.BlockOffset(leaf1) + 8 * i, &ptr, 8);
    }
    tx.StoreFresh(g.BlockOffset(root2), leaves2, sizeof leaves2);
    for (uint64_t i = 0; i < 1101 - 523; ++i) {
      const uint64_t ptr = data.first + 523 + i;
      tx.StoreFresh(g.BlockOffset(leaves2[i / 512]) + 8 * (i % 512), &ptr, 8);
    }
    tx.Store64(inode_at + offsetof(Inode, map) + 8 * 11, leaf1);
    tx.Store64(inode_at + offsetof(Inode, map) + 8 * 12, root2);
    REQUIRE(tx.Commit().ok());
  }
  const Inode& inode = InodeOf(fs, ino);
  uint64_t run = 0;
  CHECK(bmap.Lookup(inode, 0, 5000, &run) == data.first);
  CHECK(run == 1101);  // direct -> depth 1 -> depth 2, one run
  CHECK(bmap.Lookup(inode, 9, 5, &run) == data.first + 9);
  CHECK(run == 5);
  CHECK(bmap.Lookup(inode, 520, 100, &run) == data.first + 520);
  CHECK(run == 100);
  CHECK(bmap.Lookup(inode, 1100, 100, &run) == data.first + 1100);
  CHECK(run == 1);
  // Holes: the rest of the depth-2 leaf, then its null siblings, then the
  // null depth-3 root and beyond.
  CHECK(bmap.Lookup(inode, 1101, 100000, &run) == 0);
  CHECK(run == 100000);
  CHECK(bmap.Lookup(inode, 1101, ~uint64_t{0}, &run) == 0);
  CHECK(run == bmap.max_blocks() - 1101);
  CheckRuns(bmap, inode, 1200, {0, 10, 11, 522, 523, 1034, 1035, 1099, 1100, 1101});
}

TEST_CASE("holes report their run lengths", "[bmap]") {
  FsFixture fs(64ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  const Inode& inode = InodeOf(fs, ino);
  uint64_t run = 0;
  CHECK(bmap.Lookup(inode, 0, ~uint64_t{0}, &run) == 0);
  CHECK(run == bmap.max_blocks());
  CHECK(bmap.Lookup(inode, 7, 3, &run) == 0);
  CHECK(run == 3);
  MapRange(fs, bmap, ino, 0, 1);
  MapRange(fs, bmap, ino, 600, 1);
  MapRange(fs, bmap, ino, 2000, 1);
  CHECK(bmap.Lookup(inode, 1, 10000, &run) == 0);
  CHECK(run == 599);
  CHECK(bmap.Lookup(inode, 601, 10000, &run) == 0);
  CHECK(run == 1399);
  CHECK(bmap.Lookup(inode, 2001, 10, &run) == 0);
  CHECK(run == 10);
  CheckRuns(bmap, inode, 2100, {0, 1, 10, 11, 12, 522, 523, 599, 600, 601, 1999, 2000, 2001});
}

TEST_CASE("Truncate to 0 frees every block, pointer blocks included", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  const uint64_t free_before = fs.alloc().free_blocks();
  MapRange(fs, bmap, ino, 0, 3000);
  MapRange(fs, bmap, ino, kDepth3 + 777, 5);
  MapRange(fs, bmap, ino, kDepth4 + 123456789, 2);
  const Inode& inode = InodeOf(fs, ino);
  CHECK(fs.alloc().free_blocks() == free_before - inode.blocks);
  CHECK(TruncateAll(fs, bmap, ino, 0) == 1);
  CHECK(inode.blocks == 0);
  CHECK(MapIsEmpty(inode));
  CHECK(fs.alloc().free_blocks() == free_before);
  fs.Reopen();
  CHECK(fs.alloc().free_blocks() == free_before);
}

TEST_CASE("Truncate in the middle keeps the blocks before it", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  MapRange(fs, bmap, ino, 0, 3000);
  const Inode& inode = InodeOf(fs, ino);
  const std::vector<uint64_t> before = PhysAll(bmap, inode, 3000);
  const uint64_t blocks_before = inode.blocks;
  const uint64_t free_before = fs.alloc().free_blocks();
  TruncateAll(fs, bmap, ino, 1500);
  for (uint64_t i = 0; i < 1500; ++i) REQUIRE(Phys(bmap, inode, i) == before[i]);
  for (uint64_t i = 1500; i < 3000; ++i) REQUIRE(Phys(bmap, inode, i) == 0);
  // 1500 data blocks and the depth-2 leaves wholly past 1500: those for
  // 1547..2058, 2059..2570 and 2571..3082.
  CHECK(blocks_before - inode.blocks == 1500 + 3);
  CHECK(fs.alloc().free_blocks() - free_before == 1500 + 3);
  // Freed, they wait for a grace period before the allocator hands them out.
  for (uint64_t i = 1500; i < 3000; ++i) CHECK(fs.alloc().InUse(BitmapKind::kBlocks, before[i]));
  fs.alloc().ReleaseDeferred(/*wait=*/true);
  for (uint64_t i = 1500; i < 3000; ++i) CHECK_FALSE(fs.alloc().InUse(BitmapKind::kBlocks, before[i]));
  // Truncating inside the first leaf of the depth-2 tree frees the tree's root.
  TruncateAll(fs, bmap, ino, 600);
  CHECK(inode.map.file.indirect[1] != 0);
  TruncateAll(fs, bmap, ino, kDepth2);
  CHECK(inode.map.file.indirect[1] == 0);
  CHECK(inode.blocks == kDepth2 + 1);
}

TEST_CASE("Punch frees a range and leaves the rest intact", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  MapRange(fs, bmap, ino, 0, 2000);
  const Inode& inode = InodeOf(fs, ino);
  const std::vector<uint64_t> before = PhysAll(bmap, inode, 2000);
  const uint64_t free_before = fs.alloc().free_blocks();
  const uint64_t blocks_before = inode.blocks;
  CHECK(blocks_before == 2000 + 5);  // leaf 1; root 2 and its leaves for 523..2058

  SECTION("inside leaves") {
    PunchAll(fs, bmap, ino, 100, 700);
    for (uint64_t i = 0; i < 2000; ++i) {
      REQUIRE(Phys(bmap, inode, i) == (i >= 100 && i < 800 ? 0 : before[i]));
    }
    CHECK(fs.alloc().free_blocks() - free_before == 700);  // no leaf became empty
    CHECK(bmap.NextHole(inode, 0, 2000) == 100);
    CHECK(bmap.NextMapped(inode, 100, 2000) == 800);
  }
  SECTION("a whole tree and the direct blocks") {
    PunchAll(fs, bmap, ino, 0, kDepth2);
    CHECK(inode.map.file.indirect[0] == 0);
    for (uint64_t ptr : inode.map.file.direct) CHECK(ptr == 0);
    CHECK(fs.alloc().free_blocks() - free_before == kDepth2 + 1);
    for (uint64_t i = kDepth2; i < 2000; ++i) REQUIRE(Phys(bmap, inode, i) == before[i]);
  }
  SECTION("a range that empties one leaf frees it") {
    PunchAll(fs, bmap, ino, kDepth2 + 512, 512);  // the second depth-2 leaf exactly
    CHECK(fs.alloc().free_blocks() - free_before == 513);
    PunchAll(fs, bmap, ino, kDepth2 + 1024 - 1, 3);  // across into the third
    CHECK(fs.alloc().free_blocks() - free_before == 513 + 2);
  }
  SECTION("piecewise punches that empty a leaf free it too") {
    PunchAll(fs, bmap, ino, kDepth1, 200);
    PunchAll(fs, bmap, ino, kDepth1 + 300, 212);
    CHECK(inode.map.file.indirect[0] != 0);
    PunchAll(fs, bmap, ino, kDepth1 + 150, 200);
    CHECK(inode.map.file.indirect[0] == 0);
    CHECK(fs.alloc().free_blocks() - free_before == 513);
  }
  CHECK(fs.alloc().free_blocks() - free_before == blocks_before - inode.blocks);
}

TEST_CASE("Truncate of a fragmented file stops early and resumes", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t a = CreateFile(fs);
  const uint64_t b = CreateFile(fs);
  const uint64_t baseline = fs.alloc().free_blocks();
  // Interleave the two files block by block, so no two blocks of either are
  // physically adjacent and no free coalesces.
  const uint64_t blocks = 6000;
  {
    std::optional<Tx> tx;
    tx.emplace(fs.journal(), "interleave");
    for (uint64_t i = 0; i < blocks; ++i) {
      for (uint64_t ino : {a, b}) {
        if (tx->room() < 4096) {
          REQUIRE(tx->Commit().ok());
          tx.emplace(fs.journal(), "interleave");
        }
        auto run = bmap.MapForWrite(*tx, InodeOf(fs, ino), i, 1, false);
        REQUIRE(run.ok());
      }
    }
    REQUIRE(tx->Commit().ok());
  }
  const Inode& ia = InodeOf(fs, a);
  const Inode& ib = InodeOf(fs, b);
  uint64_t adjacent = 0;
  for (uint64_t i = 1; i < blocks; ++i) adjacent += Phys(bmap, ia, i) == Phys(bmap, ia, i - 1) + 1;
  CHECK(adjacent < blocks / 100);
  const std::vector<uint64_t> b_blocks = PhysAll(bmap, ib, blocks);
  REQUIRE(baseline - fs.alloc().free_blocks() == ia.blocks + ib.blocks);

  int calls = 0;
  for (bool done = false; !done; ++calls) {
    Tx tx(fs.journal(), "truncate");
    auto result = bmap.Truncate(tx, ia, 0);
    REQUIRE(result.ok());
    done = *result;
    // Stopped with room to spare, and not absurdly early.
    CHECK(tx.room() >= Bmap::kTruncateReserve);
    if (!done) CHECK(tx.room() < 8192);
    REQUIRE(tx.Commit().ok());
    // Every step is consistent on its own: what a still maps is in use, the
    // rest is free.
    CHECK(baseline - fs.alloc().free_blocks() == ia.blocks + ib.blocks);
    REQUIRE(calls < 100);
  }
  CHECK(calls > 2);
  CHECK(ia.blocks == 0);
  CHECK(MapIsEmpty(ia));
  for (uint64_t i = 0; i < blocks; ++i) REQUIRE(Phys(bmap, ib, i) == b_blocks[i]);
  fs.Reopen();
  CHECK(baseline - fs.alloc().free_blocks() == InodeOf(fs, b).blocks);
}

TEST_CASE("a crash in the middle of mapping recovers the state before it", "[bmap]") {
  FsFixture fs(256ull << 20);
  const uint64_t ino = CreateFile(fs);
  const uint64_t index = kDepth3 + 4321;
  std::vector<uint64_t> existing(20);
  {
    Bmap bmap(fs.ctx());
    MapRange(fs, bmap, ino, 0, 20);
    for (uint64_t i = 0; i < 20; ++i) existing[i] = Phys(bmap, InodeOf(fs, ino), i);
  }
  REQUIRE(InodeOf(fs, ino).blocks == 20 + 1);
  const uint64_t free_before = fs.alloc().free_blocks();
  std::vector<std::byte> mid_map, mid_truncate;
  {
    Bmap bmap(fs.ctx());
    Tx tx(fs.journal(), "map");
    auto run = bmap.MapForWrite(tx, InodeOf(fs, ino), 20, 40, true);
    REQUIRE(run.ok());
    auto deep = bmap.MapForWrite(tx, InodeOf(fs, ino), index, 8, true);
    REQUIRE(deep.ok());
    CHECK(Phys(bmap, InodeOf(fs, ino), index) == deep->first);
    mid_map = fs.Snapshot();
    auto done = bmap.Truncate(tx, InodeOf(fs, ino), 5);
    REQUIRE(done.ok());
    CHECK(*done);
    mid_truncate = fs.Snapshot();
    tx.Abort();
  }
  for (const auto* snapshot : {&mid_map, &mid_truncate}) {
    fs.CrashTo(*snapshot);
    CHECK(fs.last_recovery().undone == 1);
    Bmap bmap(fs.ctx());
    const Inode& inode = InodeOf(fs, ino);
    CHECK(fs.alloc().free_blocks() == free_before);
    CHECK(inode.blocks == 20 + 1);
    CHECK(Phys(bmap, inode, index) == 0);
    CHECK(inode.map.file.indirect[2] == 0);
    CHECK(bmap.NextMapped(inode, 20, bmap.max_blocks()) == bmap.max_blocks());
    for (uint64_t i = 0; i < 20; ++i) CHECK(Phys(bmap, inode, i) == existing[i]);
  }
}

TEST_CASE("a pointer outside the filesystem is reported, never followed", "[bmap]") {
  FsFixture fs(64ull << 20);
  const uint64_t ino = CreateFile(fs);
  Bmap bmap(fs.ctx());
  MapRange(fs, bmap, ino, 0, 3);
  MapRange(fs, bmap, ino, kDepth2 + 5, 1);
  const Geometry& g = fs.geometry();
  const uint64_t map_at = g.InodeOffset(ino) + offsetof(Inode, map);
  const Inode& inode = InodeOf(fs, ino);
  uint64_t run = 0;

  SECTION("a direct data pointer") {
    fs.media().Store64(map_at + 8 * 1, g.block_count() + 5);
    CHECK(bmap.Lookup(inode, 1, 10, &run) == Bmap::kCorrupt);
    // The run before it stops short of it.
    CHECK(bmap.Lookup(inode, 0, 10, &run) != Bmap::kCorrupt);
    CHECK(run == 1);
    CHECK(bmap.NextMapped(inode, 1, 100) == 1);
    CHECK(bmap.NextHole(inode, 0, 100) == 3);
    Tx tx(fs.journal(), "corrupt");
    CHECK(bmap.MapForWrite(tx, inode, 1, 1, true).code() == EUCLEAN);
    CHECK(bmap.Truncate(tx, inode, 0).code() == EUCLEAN);
    CHECK(bmap.Punch(tx, inode, 1, 1).code() == EUCLEAN);
    tx.Abort();
  }
  SECTION("a tree root") {
    fs.media().Store64(map_at + 8 * 12, g.block_count());
    CHECK(bmap.Lookup(inode, kDepth2 + 5, 1, &run) == Bmap::kCorrupt);
    CHECK(bmap.Lookup(inode, kDepth2 + 200000, 1, &run) == Bmap::kCorrupt);
    // Data and holes elsewhere still work.
    CHECK(bmap.Lookup(inode, 0, 10, &run) != 0);
    CHECK(bmap.Lookup(inode, kDepth1, 10, &run) == 0);
    CHECK(bmap.NextMapped(inode, 3, ~uint64_t{0}) == kDepth2);
    CHECK(bmap.NextHole(inode, kDepth2, ~uint64_t{0}) == kDepth3);
    Tx tx(fs.journal(), "corrupt");
    CHECK(bmap.MapForWrite(tx, inode, kDepth2 + 7, 1, true).code() == EUCLEAN);
    CHECK(bmap.Truncate(tx, inode, 0).code() == EUCLEAN);
    CHECK(bmap.MapForWrite(tx, inode, 5, 1, true).ok());  // the direct range is sound
    tx.Abort();
  }
  SECTION("an inner pointer") {
    const uint64_t root = inode.map.file.indirect[1];
    fs.media().Store64(g.BlockOffset(root), ~uint64_t{0} - 1);
    CHECK(bmap.Lookup(inode, kDepth2 + 5, 1, &run) == Bmap::kCorrupt);
    Tx tx(fs.journal(), "corrupt");
    CHECK(bmap.MapForWrite(tx, inode, kDepth2 + 6, 1, true).code() == EUCLEAN);
    CHECK(bmap.Truncate(tx, inode, kDepth2).code() == EUCLEAN);
    tx.Abort();
  }
}

TEST_CASE("NextMapped and NextHole on a sparse file", "[bmap]") {
  FsFixture fs(64ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  MapRange(fs, bmap, ino, 5, 1);
  MapRange(fs, bmap, ino, 100, 10);
  MapRange(fs, bmap, ino, kDepth3 + 40000, 1);
  const Inode& inode = InodeOf(fs, ino);
  const uint64_t end = kDepth3 + 50000;
  CHECK(bmap.NextMapped(inode, 0, end) == 5);
  CHECK(bmap.NextMapped(inode, 5, end) == 5);
  CHECK(bmap.NextMapped(inode, 6, end) == 100);
  CHECK(bmap.NextMapped(inode, 105, end) == 105);
  CHECK(bmap.NextMapped(inode, 110, end) == kDepth3 + 40000);
  CHECK(bmap.NextMapped(inode, kDepth3 + 40001, end) == end);
  CHECK(bmap.NextMapped(inode, 6, 50) == 50);
  CHECK(bmap.NextMapped(inode, 60, 60) == 60);
  CHECK(bmap.NextHole(inode, 0, end) == 0);
  CHECK(bmap.NextHole(inode, 5, end) == 6);
  CHECK(bmap.NextHole(inode, 100, end) == 110);
  CHECK(bmap.NextHole(inode, 103, 107) == 107);
  CHECK(bmap.NextHole(inode, kDepth3 + 40000, end) == kDepth3 + 40001);
  CHECK(bmap.NextHole(inode, bmap.max_blocks() + 5, ~uint64_t{0}) == bmap.max_blocks() + 5);
}

TEST_CASE("64 KiB blocks: trees of depth 1 and 2", "[bmap]") {
  FsFixture fs(256ull << 20, 65536);
  Bmap bmap(fs.ctx());
  const uint64_t p = 65536 / 8;
  const uint64_t depth2 = 11 + p;
  const uint64_t ino = CreateFile(fs);
  const uint64_t free_before = fs.alloc().free_blocks();
  MapRange(fs, bmap, ino, 0, 40);
  MapRange(fs, bmap, ino, depth2 - 10, 30);  // across into the depth-2 tree
  MapRange(fs, bmap, ino, depth2 + 3 * p + 7, 2);
  const Inode& inode = InodeOf(fs, ino);
  CHECK(inode.blocks == 40 + 30 + 2 + 1 + 3);  // leaf 1; root 2 and two leaves
  CHECK(fs.alloc().free_blocks() == free_before - inode.blocks);
  uint64_t run = 0;
  CHECK(bmap.Lookup(inode, 40, depth2, &run) == 0);
  CHECK(run == depth2 - 10 - 40);
  CHECK(bmap.Lookup(inode, depth2 + 3 * p + 7, 5, &run) != 0);
  CHECK(run == 2);
  CheckRuns(bmap, inode, depth2 + 100, {0, 10, 11, 39, 40, depth2 - 10, depth2 - 1, depth2});
  CHECK(bmap.NextMapped(inode, depth2 + 20, ~uint64_t{0}) == depth2 + 3 * p + 7);
  PunchAll(fs, bmap, ino, depth2 + 3 * p, p);
  CHECK(inode.blocks == 40 + 30 + 1 + 2);
  CHECK(TruncateAll(fs, bmap, ino, 0) == 1);
  CHECK(inode.blocks == 0);
  CHECK(MapIsEmpty(inode));
  CHECK(fs.alloc().free_blocks() == free_before);
}

TEST_CASE("ENOSPC midway leaves nothing behind", "[bmap]") {
  FsFixture fs(16ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t filler = CreateFile(fs);
  const uint64_t ino = CreateFile(fs);
  const uint64_t baseline = fs.alloc().free_blocks();
  {
    std::optional<Tx> tx;
    tx.emplace(fs.journal(), "fill");
    for (uint64_t i = 0;; ++i) {
      if (tx->room() < 4096) {
        REQUIRE(tx->Commit().ok());
        tx.emplace(fs.journal(), "fill");
      }
      auto run = bmap.MapForWrite(*tx, InodeOf(fs, filler), i, 1, false);
      if (!run.ok()) {
        CHECK(run.code() == ENOSPC);
        CHECK(run.error().message != "journal slot full");
        break;
      }
    }
    REQUIRE(tx->Commit().ok());  // what earlier calls mapped stays
  }
  CHECK(baseline - fs.alloc().free_blocks() == InodeOf(fs, filler).blocks);
  REQUIRE(fs.alloc().free_blocks() <= 2);
  for (uint64_t i = 0; fs.alloc().free_blocks() < 2; ++i) PunchAll(fs, bmap, filler, i, 1);
  REQUIRE(fs.alloc().free_blocks() == 2);
  {
    // Needs three pointer blocks and a data block: gets two, then fails.
    Tx tx(fs.journal(), "deep");
    CHECK(bmap.MapForWrite(tx, InodeOf(fs, ino), kDepth3, 1, true).code() == ENOSPC);
    REQUIRE(tx.Commit().ok());
  }
  CHECK(fs.alloc().free_blocks() == 2);
  CHECK(InodeOf(fs, ino).blocks == 0);
  CHECK(MapIsEmpty(InodeOf(fs, ino)));
  fs.Reopen();
  CHECK(fs.alloc().free_blocks() == 2);
}

TEST_CASE("MapForWrite cuts its run short when the journal slot runs low", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  MapRange(fs, bmap, ino, kDepth1, 1);  // the leaf exists; the rest are holes
  Tx tx(fs.journal(), "fill");
  // Eat the slot down to a little over the reserve.
  const uint64_t scratch = fs.geometry().BlockOffset(fs.geometry().FirstDataBlock(0) + 2000);
  std::vector<char> junk(4000);
  while (tx.room() > Bmap::kMapReserve + 1000 + 4100) tx.Store(scratch, junk.data(), junk.size());
  while (tx.room() > Bmap::kMapReserve + 1000) tx.Store64(scratch, 1);
  auto run = bmap.MapForWrite(tx, InodeOf(fs, ino), kDepth1 + 1, 500, true);
  REQUIRE(run.ok());
  CHECK(run->count < 500);
  CHECK(tx.room() >= Bmap::kMapReserve);
  while (tx.room() > Bmap::kMapReserve) tx.Store64(scratch, 1);
  CHECK(bmap.MapForWrite(tx, InodeOf(fs, ino), kDepth1 + 300, 1, true).code() == ENOSPC);
  CHECK(tx.ok());
  tx.Abort();
}

TEST_CASE("random maps, punches and truncates agree with a model", "[bmap]") {
  FsFixture fs(256ull << 20);
  Bmap bmap(fs.ctx());
  const uint64_t ino = CreateFile(fs);
  const Inode& inode = InodeOf(fs, ino);
  const uint64_t baseline = fs.alloc().free_blocks();
  const uint64_t span = 3000;
  std::map<uint64_t, uint64_t> model;  // file block -> physical block
  std::mt19937_64 rng(42);
  for (int step = 0; step < 150; ++step) {
    const uint64_t index = rng() % span;
    const uint64_t count = 1 + rng() % 300;
    const int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      const uint64_t n = std::min(count, span - index);
      MapRange(fs, bmap, ino, index, n, false);
      for (uint64_t i = index; i < index + n; ++i) {
        const uint64_t phys = Phys(bmap, inode, i);
        auto [it, inserted] = model.emplace(i, phys);
        REQUIRE(it->second == phys);  // existing blocks never move
      }
    } else if (op < 9) {
      PunchAll(fs, bmap, ino, index, count);
      model.erase(model.lower_bound(index), model.lower_bound(index + count));
    } else {
      TruncateAll(fs, bmap, ino, index);
      model.erase(model.lower_bound(index), model.end());
    }
    std::set<uint64_t> used;
    for (uint64_t i = 0; i < span; ++i) {
      const auto it = model.find(i);
      REQUIRE(Phys(bmap, inode, i) == (it == model.end() ? 0 : it->second));
      if (it != model.end()) REQUIRE(used.insert(it->second).second);
    }
    // Data blocks plus the pointer blocks still linked are all that is in use.
    REQUIRE(baseline - fs.alloc().free_blocks() == inode.blocks);
    REQUIRE(inode.blocks >= model.size());
    REQUIRE(inode.blocks <= model.size() + 2 + (span / 512) + 1);
  }
  CheckRuns(bmap, inode, span, {0, 1, 10, 11, 100, 522, 523, 1000, 2999});
  TruncateAll(fs, bmap, ino, 0);
  CHECK(fs.alloc().free_blocks() == baseline);
}

}  // namespace
}  // namespace nvfs::test
