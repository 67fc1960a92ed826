// Hashed directories (src/dir): insert, lookup, replace, remove, readdir and
// FreeTree on a formatted namespace; splits and their block economy, hash
// collisions (forced through the test hook), readdir cookies under change, crash recovery of a splitting
// insert, remount, and damaged trees (EUCLEAN, never a crash or a hang).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dir/dir.hpp"
#include "forced_name_hash.hpp"
#include "fs_fixture.hpp"
#include "nvfs/name_hash.hpp"

namespace nvfs::test {
namespace {

using format::DirEntry;
using format::DirLeafHeader;
using format::Inode;
using format::kDirNodeBlockMask;
using format::kDirNodeIndexBit;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// A directory inode made the way the core makes one: allocated in a Tx,
// written whole with fresh stores, root 0.
uint64_t MakeDirectory(FsFixture& fs) {
  Tx tx(fs.journal(), "mkdir");
  Result<uint64_t> ino = fs.alloc().AllocateInode(tx, format::kRootIno, true);
  REQUIRE(ino.ok());
  const uint64_t at = fs.geometry().InodeOffset(*ino);
  tx.FillFresh(at, 0, format::kInodeSize);
  Inode inode{};
  inode.mode = S_IFDIR | 0755;
  inode.nlink = 2;
  inode.parent = format::kRootIno;
  inode.map.dir.root = 0;
  tx.StoreFresh(at, &inode, sizeof inode);
  REQUIRE(tx.Commit().ok());
  return *ino;
}

const Inode& InodeOf(FsFixture& fs, uint64_t ino) { return fs.ctx().InodeAt(ino); }

// Each operation in its own transaction, committed on success and aborted on
// failure, as the core does. Returns 0 or the errno.
template <typename Op>
int InOwnTx(FsFixture& fs, const char* what, Op op) {
  Directory d(fs.ctx());
  Tx tx(fs.journal(), what);
  Status status = op(d, tx);
  if (!status.ok()) {
    tx.Abort();
    return status.code();
  }
  return tx.Commit().code();
}

int Insert(FsFixture& fs, uint64_t dir, std::string_view name, uint64_t ino,
           uint8_t type = DT_REG) {
  return InOwnTx(fs, "insert", [&](Directory& d, Tx& tx) {
    return d.Insert(tx, InodeOf(fs, dir), name, ino, type);
  });
}

int Remove(FsFixture& fs, uint64_t dir, std::string_view name) {
  return InOwnTx(fs, "remove",
                 [&](Directory& d, Tx& tx) { return d.Remove(tx, InodeOf(fs, dir), name); });
}

int Replace(FsFixture& fs, uint64_t dir, std::string_view name, uint64_t ino, uint8_t type) {
  return InOwnTx(fs, "replace", [&](Directory& d, Tx& tx) {
    return d.Replace(tx, InodeOf(fs, dir), name, ino, type);
  });
}

// Crashes with `tx` in flight: the media as it is now, the transaction
// uncommitted, is what the reopened fixture recovers from.
void CrashBeforeCommit(FsFixture& fs, Tx& tx) {
  const std::vector<std::byte> snapshot = fs.Snapshot();
  tx.Abort();
  fs.CrashTo(snapshot);
}

// The inode number `name` maps to, 0 if absent; fails the test on any other error.
uint64_t LookupIno(FsFixture& fs, uint64_t dir, std::string_view name) {
  Result<DirEntryRef> found = Directory(fs.ctx()).Lookup(InodeOf(fs, dir), name);
  if (!found.ok()) {
    REQUIRE(found.code() == ENOENT);
    return 0;
  }
  return found->ino;
}

struct Listed {
  uint64_t key;
  uint64_t ino;
  uint8_t type;
  std::string name;
};

// ReadDir from `from_key`, at most `limit` entries.
std::vector<Listed> List(FsFixture& fs, uint64_t dir, uint64_t from_key = 0,
                         size_t limit = SIZE_MAX) {
  std::vector<Listed> out;
  Status status =
      Directory(fs.ctx()).ReadDir(InodeOf(fs, dir), from_key, [&](const DirEntryRef& e) {
        out.push_back({e.key, e.ino, e.file_type, std::string(e.name)});
        return out.size() < limit;
      });
  REQUIRE(status.ok());
  return out;
}

// The whole directory, read in batches of `batch` entries resumed at the last
// key + 1, as a FUSE readdir does.
std::vector<Listed> ListInBatches(FsFixture& fs, uint64_t dir, size_t batch) {
  std::vector<Listed> all;
  uint64_t from = 0;
  for (;;) {
    std::vector<Listed> part = List(fs, dir, from, batch);
    all.insert(all.end(), part.begin(), part.end());
    if (part.size() < batch) return all;
    from = part.back().key + 1;
  }
}

bool StrictlyIncreasing(const std::vector<Listed>& entries) {
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].key <= entries[i - 1].key) return false;
  }
  return true;
}

uint64_t HashOfKeyForTest(uint64_t key) { return key >> format::kDirSeqBits; }

uint64_t Nodes(FsFixture& fs, uint64_t dir) {
  return InodeOf(fs, dir).size / fs.geometry().block_size();
}

// The shape of a directory's tree, walked independently of src/dir.
struct TreeStats {
  uint64_t index_nodes = 0;
  uint64_t leaves = 0;           // chain members included
  uint64_t overflow_leaves = 0;  // leaves reached through `next`
  uint64_t live = 0;             // entries
  int levels = 0;                // index levels above the deepest leaf
  bool all_in_use = true;        // every node's bitmap bit set
};

TreeStats Walk(FsFixture& fs, uint64_t dir) {
  const Geometry& g = fs.geometry();
  const uint32_t bs = g.block_size();
  TreeStats stats;
  std::set<uint64_t> seen_leaves;
  auto visit_leaf = [&](uint64_t block) {
    if (!seen_leaves.insert(block).second) return;
    for (uint64_t b = block, n = 0; b != 0; ++n) {
      REQUIRE(n < 100000);
      const std::byte* leaf = fs.media().base() + g.BlockOffset(b);
      DirLeafHeader header;
      std::memcpy(&header, leaf, sizeof header);
      REQUIRE(header.magic == format::kDirLeafMagic);
      ++stats.leaves;
      if (n > 0) ++stats.overflow_leaves;
      stats.all_in_use &= fs.alloc().InUse(BitmapKind::kBlocks, b);
      for (const LeafRecord& r : ParseDirLeaf(leaf, bs)) stats.live += r.entry.ino != 0;
      b = header.next;
    }
  };
  std::function<void(uint64_t, int)> visit_index = [&](uint64_t block, int depth) {
    ++stats.index_nodes;
    stats.levels = std::max(stats.levels, depth + 1);
    stats.all_in_use &= fs.alloc().InUse(BitmapKind::kBlocks, block);
    const auto* slots = reinterpret_cast<const uint64_t*>(fs.media().base() + g.BlockOffset(block));
    for (uint32_t s = 0; s < bs / 8; ++s) {
      if (slots[s] == 0) continue;
      if (slots[s] & kDirNodeIndexBit) {
        visit_index(slots[s] & kDirNodeBlockMask, depth + 1);
      } else {
        visit_leaf(slots[s]);
      }
    }
  };
  const uint64_t root = InodeOf(fs, dir).map.dir.root;
  if (root & kDirNodeIndexBit) {
    visit_index(root & kDirNodeBlockMask, 0);
  } else if (root != 0) {
    visit_leaf(root);
  }
  return stats;
}

// Checks the bookkeeping of the inode against the tree.
void CheckCounts(FsFixture& fs, uint64_t dir) {
  const TreeStats stats = Walk(fs, dir);
  const Inode& inode = InodeOf(fs, dir);
  CHECK(stats.all_in_use);
  CHECK(inode.map.dir.entries == stats.live);
  CHECK(inode.blocks == stats.index_nodes + stats.leaves);
  CHECK(inode.size == inode.blocks * fs.geometry().block_size());
}

std::string NumberedName(const std::string& stem, int i) {
  char number[16];
  std::snprintf(number, sizeof number, "-%06d", i);
  return stem + number;
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

TEST_CASE("insert, lookup, replace and remove", "[dir]") {
  const uint32_t block_size = GENERATE(4096u, 65536u, 1u << 20);
  CAPTURE(block_size);
  FsFixture fs(256ull << 20, block_size);
  const uint64_t dir = MakeDirectory(fs);
  Directory d(fs.ctx());

  // Empty: root 0, nothing to find.
  CHECK(InodeOf(fs, dir).map.dir.root == 0);
  CHECK(Nodes(fs, dir) == 0);
  CHECK(LookupIno(fs, dir, "alpha") == 0);
  CHECK(Remove(fs, dir, "alpha") == ENOENT);
  CHECK(Replace(fs, dir, "alpha", 5, DT_REG) == ENOENT);
  CHECK(List(fs, dir).empty());

  // The first name makes a root leaf.
  REQUIRE(Insert(fs, dir, "alpha", 100, DT_REG) == 0);
  CHECK((InodeOf(fs, dir).map.dir.root & kDirNodeIndexBit) == 0);
  CHECK(Nodes(fs, dir) == 1);
  CHECK(InodeOf(fs, dir).blocks == 1);
  CHECK(InodeOf(fs, dir).map.dir.entries == 1);
  Result<DirEntryRef> alpha = d.Lookup(InodeOf(fs, dir), "alpha");
  REQUIRE(alpha.ok());
  CHECK(alpha->ino == 100);
  CHECK(alpha->file_type == DT_REG);
  CHECK(alpha->name == "alpha");
  const uint64_t hash = DirHash(NameHash(fs.ctx().hash_key, "alpha"));
  CHECK(alpha->key == DirKey(hash, 0));

  CHECK(Insert(fs, dir, "alpha", 101, DT_REG) == EEXIST);
  CHECK(InodeOf(fs, dir).map.dir.entries == 1);
  REQUIRE(Insert(fs, dir, "beta", 101, DT_DIR) == 0);
  CHECK(LookupIno(fs, dir, "beta") == 101);
  CHECK(LookupIno(fs, dir, "gamma") == 0);

  // Replace keeps the key and changes ino and type.
  REQUIRE(Replace(fs, dir, "alpha", 200, DT_LNK) == 0);
  Result<DirEntryRef> replaced = d.Lookup(InodeOf(fs, dir), "alpha");
  REQUIRE(replaced.ok());
  CHECK(replaced->ino == 200);
  CHECK(replaced->file_type == DT_LNK);
  CHECK(replaced->key == DirKey(hash, 0));

  // Names are bytes: length limits, case, any byte but '/' and NUL.
  const std::string longest(format::kNameMax, 'L');
  REQUIRE(Insert(fs, dir, longest, 300) == 0);
  CHECK(LookupIno(fs, dir, longest) == 300);
  CHECK(Insert(fs, dir, std::string(format::kNameMax + 1, 'L'), 301) == ENAMETOOLONG);
  CHECK(Insert(fs, dir, "", 302) == EINVAL);
  REQUIRE(Insert(fs, dir, "ALPHA", 303) == 0);
  REQUIRE(Insert(fs, dir, "\xff\x01 x", 304) == 0);
  CHECK(LookupIno(fs, dir, "\xff\x01 x") == 304);
  CHECK(LookupIno(fs, dir, "alph") == 0);
  CHECK(LookupIno(fs, dir, "alphaa") == 0);

  std::vector<Listed> all = List(fs, dir);
  REQUIRE(all.size() == 5);
  CHECK(StrictlyIncreasing(all));
  std::set<std::string> names;
  for (const Listed& e : all) names.insert(e.name);
  CHECK(names == std::set<std::string>{"alpha", "beta", longest, "ALPHA", "\xff\x01 x"});

  REQUIRE(Remove(fs, dir, "beta") == 0);
  CHECK(Remove(fs, dir, "beta") == ENOENT);
  CHECK(LookupIno(fs, dir, "beta") == 0);
  CHECK(InodeOf(fs, dir).map.dir.entries == 4);
  REQUIRE(Insert(fs, dir, "beta", 102, DT_REG) == 0);
  CHECK(LookupIno(fs, dir, "beta") == 102);

  for (const char* name : {"alpha", "beta", "ALPHA", "\xff\x01 x"})
    REQUIRE(Remove(fs, dir, name) == 0);
  REQUIRE(Remove(fs, dir, longest) == 0);
  CHECK(InodeOf(fs, dir).map.dir.entries == 0);
  CHECK(List(fs, dir).empty());
  CHECK(Nodes(fs, dir) == 1);  // the root leaf is kept
  CheckCounts(fs, dir);

  // Everything survives a remount.
  REQUIRE(Insert(fs, dir, "kept", 7, DT_FIFO) == 0);
  fs.Reopen();
  Result<DirEntryRef> kept = Directory(fs.ctx()).Lookup(InodeOf(fs, dir), "kept");
  REQUIRE(kept.ok());
  CHECK(kept->ino == 7);
  CHECK(kept->file_type == DT_FIFO);
  CheckCounts(fs, dir);
}

TEST_CASE("the root directory made by mkfs is read and extended", "[dir]") {
  FsFixture fs;
  const uint64_t root = format::kRootIno;
  Result<DirEntryRef> lost_found = Directory(fs.ctx()).Lookup(InodeOf(fs, root), "lost+found");
  REQUIRE(lost_found.ok());
  CHECK(lost_found->ino == 2);
  CHECK(lost_found->file_type == DT_DIR);
  std::vector<Listed> listed = List(fs, root);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].name == "lost+found");
  CHECK(List(fs, 2).empty());
  CheckCounts(fs, root);
  CheckCounts(fs, 2);

  REQUIRE(Insert(fs, root, "home", 12, DT_DIR) == 0);
  CHECK(LookupIno(fs, root, "home") == 12);
  CHECK(InodeOf(fs, root).map.dir.entries == 2);
  // lost+found's leaf takes an entry without allocating.
  const uint64_t free_blocks = fs.alloc().free_blocks();
  REQUIRE(Insert(fs, 2, "#12345", 13) == 0);
  CHECK(fs.alloc().free_blocks() == free_blocks);
  CHECK(LookupIno(fs, 2, "#12345") == 13);
  CheckCounts(fs, root);
  CheckCounts(fs, 2);
}

TEST_CASE("100,000 names: found, listed once in key order, blocks not wasted", "[dir][big]") {
  FsFixture fs(256ull << 20);
  const uint64_t dir = MakeDirectory(fs);
  constexpr int kNames = 100000;
  uint64_t record_bytes = 0;
  for (int i = 0; i < kNames; ++i) {
    const std::string name = NumberedName("file", i);
    REQUIRE(Insert(fs, dir, name, 1000 + i) == 0);
    record_bytes += format::DirRecordLength(static_cast<uint32_t>(name.size()));
  }
  CHECK(InodeOf(fs, dir).map.dir.entries == kNames);
  for (int i = 0; i < kNames; ++i) {
    REQUIRE(LookupIno(fs, dir, NumberedName("file", i)) == uint64_t(1000 + i));
  }
  CHECK(LookupIno(fs, dir, "file-100000") == 0);

  std::vector<Listed> all = List(fs, dir);
  REQUIRE(all.size() == kNames);
  CHECK(StrictlyIncreasing(all));
  std::set<std::string> names;
  for (const Listed& e : all) names.insert(e.name);
  CHECK(names.size() == kNames);

  // Resuming at last key + 1 gives the same sequence.
  std::vector<Listed> batched = ListInBatches(fs, dir, 977);
  REQUIRE(batched.size() == all.size());
  CHECK(std::equal(all.begin(), all.end(), batched.begin(),
                   [](const Listed& a, const Listed& b) { return a.key == b.key; }));

  const TreeStats stats = Walk(fs, dir);
  CheckCounts(fs, dir);
  const uint64_t data_blocks = record_bytes / fs.geometry().block_size() + 1;
  const uint64_t nodes = Nodes(fs, dir);
  INFO("nodes " << nodes << ": " << stats.index_nodes << " index, " << stats.leaves
                << " leaves; entries' records fill " << data_blocks << " blocks; levels "
                << stats.levels);
  CHECK(nodes <= 3 * data_blocks + 4);
  CHECK(stats.leaves <= 2 * data_blocks);  // leaves at least half full on average
  // A constant number of hops: the root index and one level below it.
  CHECK(stats.levels <= 2);
  CHECK(stats.overflow_leaves == 0);
  if (std::getenv("NVFS_TEST_VERBOSE") != nullptr) {
    std::printf("%d names: %" PRIu64 " nodes (%" PRIu64 " index, %" PRIu64
                " leaves); their records fill %" PRIu64 " blocks; %d index levels\n",
                kNames, nodes, stats.index_nodes, stats.leaves, data_blocks, stats.levels);
  }
}

TEST_CASE("colliding hashes are told apart by sequence numbers, past 64 of them", "[dir]") {
  ForcedNameHash forced;
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  std::mt19937_64 rng(42);
  const uint64_t target = 0x0123456789ABCDEFull;
  const uint64_t hash = DirHash(target);

  // Ordinary neighbours first, so the colliding names share a tree.
  for (int i = 0; i < 500; ++i) REQUIRE(Insert(fs, dir, NumberedName("n", i), 10 + i) == 0);

  // 201 long names of one 64-bit hash: sequence numbers 0..200, in an
  // overflow chain of leaves (version 1 refused the 65th with ENOSPC).
  constexpr int kNames = 201;
  std::vector<std::string> names;
  for (int i = 0; i < kNames; ++i) names.push_back(forced.MakeName(target, 200 + i % 56, rng));
  for (int i = 0; i < kNames - 1; ++i) {
    REQUIRE(Insert(fs, dir, names[i], 5000 + i) == 0);
    Result<DirEntryRef> e = Directory(fs.ctx()).Lookup(InodeOf(fs, dir), names[i]);
    REQUIRE(e.ok());
    CHECK(e->key == DirKey(hash, i));
  }
  CHECK(Insert(fs, dir, names[3], 6000) == EEXIST);
  for (int i = 0; i < kNames - 1; ++i) CHECK(LookupIno(fs, dir, names[i]) == uint64_t(5000 + i));
  CHECK(LookupIno(fs, dir, names[kNames - 1]) == 0);
  TreeStats stats = Walk(fs, dir);
  CHECK(stats.overflow_leaves >= 10);  // 200 records of 224..280 bytes
  CheckCounts(fs, dir);

  // Listed in key order, i.e. by sequence number for one hash.
  std::vector<Listed> listed;
  for (const Listed& e : List(fs, dir)) {
    if (HashOfKeyForTest(e.key) == hash) listed.push_back(e);
  }
  REQUIRE(listed.size() == kNames - 1);
  for (int i = 0; i < kNames - 1; ++i) CHECK(listed[i].name == names[i]);
  // A cookie inside the run of colliding keys resumes inside it.
  std::vector<Listed> tail = List(fs, dir, DirKey(hash, 140), 5);
  REQUIRE(tail.size() == 5);
  CHECK(tail[0].name == names[140]);

  // A freed sequence number is the lowest free one and is reused.
  REQUIRE(Remove(fs, dir, names[5]) == 0);
  REQUIRE(Remove(fs, dir, names[9]) == 0);
  REQUIRE(Insert(fs, dir, names[kNames - 1], 6000) == 0);
  Result<DirEntryRef> reused =
      Directory(fs.ctx()).Lookup(InodeOf(fs, dir), names[kNames - 1]);
  REQUIRE(reused.ok());
  CHECK(reused->key == DirKey(hash, 5));
  CheckCounts(fs, dir);

  fs.Reopen();
  for (int i = 0; i < kNames; ++i) {
    const uint64_t want = i == 5 || i == 9 ? 0 : i == kNames - 1 ? 6000 : 5000 + uint64_t(i);
    CHECK(LookupIno(fs, dir, names[i]) == want);
  }
  for (int i = 0; i < 500; ++i) CHECK(LookupIno(fs, dir, NumberedName("n", i)) == uint64_t(10 + i));

  // Emptying the chain frees its overflow leaves.
  for (int i = 0; i < kNames; ++i) {
    if (i != 5 && i != 9) REQUIRE(Remove(fs, dir, names[i]) == 0);
  }
  stats = Walk(fs, dir);
  CHECK(stats.overflow_leaves == 0);
  CheckCounts(fs, dir);
  for (int i = 0; i < 500; ++i) CHECK(LookupIno(fs, dir, NumberedName("n", i)) == uint64_t(10 + i));
}

TEST_CASE("short colliding names share a leaf with distinct keys", "[dir]") {
  ForcedNameHash forced;
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  std::mt19937_64 rng(7);
  const uint64_t target = 0xFEDCBA9876543210ull;
  std::vector<std::string> names;
  for (size_t length : {9, 12, 16, 23}) names.push_back(forced.MakeName(target, length, rng));
  for (size_t i = 0; i < names.size(); ++i) REQUIRE(Insert(fs, dir, names[i], 40 + i) == 0);
  std::vector<Listed> listed = List(fs, dir);
  REQUIRE(listed.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    CHECK(listed[i].key == DirKey(DirHash(target), static_cast<uint32_t>(i)));
    CHECK(listed[i].name == names[i]);
    CHECK(LookupIno(fs, dir, names[i]) == 40 + i);
  }
  CHECK(Nodes(fs, dir) == 1);
  REQUIRE(Replace(fs, dir, names[2], 99, DT_SOCK) == 0);
  CHECK(LookupIno(fs, dir, names[2]) == 99);
  CHECK(LookupIno(fs, dir, names[1]) == 41);
}

TEST_CASE("readdir resumed at a cookie sees each lasting name once", "[dir]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  constexpr int kNames = 6000;
  for (int i = 0; i < kNames; ++i) REQUIRE(Insert(fs, dir, NumberedName("old", i), 1 + i) == 0);

  std::vector<Listed> first = List(fs, dir, 0, kNames / 2);
  REQUIRE(first.size() == kNames / 2);
  const uint64_t resume = first.back().key + 1;

  // Between the calls: many new names (splits everywhere) and removals on
  // both sides of the cookie.
  std::set<std::string> removed;
  for (int i = 0; i < kNames; i += 3) {
    const std::string name = NumberedName("old", i);
    REQUIRE(Remove(fs, dir, name) == 0);
    removed.insert(name);
  }
  for (int i = 0; i < 8000; ++i) REQUIRE(Insert(fs, dir, NumberedName("new", i), 50000 + i) == 0);

  // The rest of the listing, resumed at the cookie in small batches.
  std::vector<Listed> second;
  for (uint64_t from = resume;;) {
    std::vector<Listed> part = List(fs, dir, from, 250);
    second.insert(second.end(), part.begin(), part.end());
    if (part.size() < 250) break;
    from = part.back().key + 1;
  }
  CHECK(StrictlyIncreasing(second));
  CHECK((second.empty() || second.front().key >= resume));

  std::map<std::string, int> seen;
  for (const Listed& e : first) ++seen[e.name];
  for (const Listed& e : second) ++seen[e.name];
  for (int i = 0; i < kNames; ++i) {
    const std::string name = NumberedName("old", i);
    if (removed.count(name) == 0) {
      CHECK(seen[name] == 1);
    }
  }
  for (const auto& [name, count] : seen) CHECK(count == 1);
}

// Inserts names until an insert changes the node count, and crashes in the
// middle of that insert: after its stores, before its commit.
void CrashDuringSplittingInsert(FsFixture& fs, uint64_t dir, const char* stem, int skip_splits) {
  std::vector<std::string> names;
  int splits_seen = 0;
  for (int i = 0;; ++i) {
    REQUIRE(i < 200000);
    const std::string name = NumberedName(stem, i);
    const uint64_t nodes_before = Nodes(fs, dir);
    const uint64_t free_before = fs.alloc().free_blocks();
    const uint64_t root_before = InodeOf(fs, dir).map.dir.root;
    const uint64_t entries_before = InodeOf(fs, dir).map.dir.entries;
    Tx tx(fs.journal(), "insert");
    REQUIRE(Directory(fs.ctx()).Insert(tx, InodeOf(fs, dir), name, 7000 + i, DT_REG).ok());
    if (Nodes(fs, dir) == nodes_before || splits_seen++ < skip_splits) {
      REQUIRE(tx.Commit().ok());
      names.push_back(name);
      continue;
    }
    CrashBeforeCommit(fs, tx);
    CHECK(fs.last_recovery().undone == 1);
    CHECK(Nodes(fs, dir) == nodes_before);
    CHECK(InodeOf(fs, dir).map.dir.root == root_before);
    CHECK(InodeOf(fs, dir).map.dir.entries == entries_before);
    CHECK(fs.alloc().free_blocks() == free_before);
    CHECK(LookupIno(fs, dir, name) == 0);
    for (size_t n = 0; n < names.size(); ++n) {
      REQUIRE(LookupIno(fs, dir, names[n]) == 7000 + n);
    }
    CHECK(List(fs, dir).size() == entries_before);
    CheckCounts(fs, dir);
    // And the insert can be done again.
    REQUIRE(Insert(fs, dir, name, 7000 + i) == 0);
    CHECK(LookupIno(fs, dir, name) == uint64_t(7000 + i));
    CheckCounts(fs, dir);
    return;
  }
}

TEST_CASE("a crash in the middle of a splitting insert recovers the state before it",
          "[dir][crash]") {
  SECTION("the root leaf is pushed down") {
    FsFixture fs;
    const uint64_t dir = MakeDirectory(fs);
    CrashDuringSplittingInsert(fs, dir, "a", 1);  // skip the root leaf's creation
  }
  SECTION("a leaf sharing slots is split") {
    FsFixture fs;
    const uint64_t dir = MakeDirectory(fs);
    CrashDuringSplittingInsert(fs, dir, "b", 6);
  }
  SECTION("64 KiB blocks: the index node is copied") {
    FsFixture fs(256ull << 20, 65536);
    const uint64_t dir = MakeDirectory(fs);
    CrashDuringSplittingInsert(fs, dir, "c", 3);
  }
  SECTION("the root directory") {
    FsFixture fs;
    CrashDuringSplittingInsert(fs, format::kRootIno, "d", 0);
  }
}

TEST_CASE("a crash in the middle of a remove that frees a leaf recovers the state before it",
          "[dir][crash]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  for (int i = 0; i < 3000; ++i) REQUIRE(Insert(fs, dir, NumberedName("m", i), 1 + i) == 0);
  for (int i = 0; i < 3000; ++i) {
    const std::string name = NumberedName("m", i);
    const uint64_t nodes_before = Nodes(fs, dir);
    const uint64_t free_before = fs.alloc().free_blocks();
    const uint64_t entries_before = InodeOf(fs, dir).map.dir.entries;
    Tx tx(fs.journal(), "remove");
    REQUIRE(Directory(fs.ctx()).Remove(tx, InodeOf(fs, dir), name).ok());
    if (Nodes(fs, dir) == nodes_before) {
      REQUIRE(tx.Commit().ok());
      continue;
    }
    CrashBeforeCommit(fs, tx);
    CHECK(fs.last_recovery().undone == 1);
    CHECK(Nodes(fs, dir) == nodes_before);
    CHECK(InodeOf(fs, dir).map.dir.entries == entries_before);
    CHECK(fs.alloc().free_blocks() == free_before);
    CHECK(LookupIno(fs, dir, name) == uint64_t(1 + i));
    CHECK(List(fs, dir).size() == entries_before);
    CheckCounts(fs, dir);
    REQUIRE(Remove(fs, dir, name) == 0);
    CHECK(Nodes(fs, dir) == nodes_before - 1);
    CHECK(fs.alloc().free_blocks() == free_before + 1);
    CheckCounts(fs, dir);
    return;
  }
  FAIL("no remove freed a leaf");
}

// A record freed earlier in the same transaction is not free space for the
// undo log: rename-like operations (remove, then insert into the hole) must
// still abort, or crash, back to the old name intact.
TEST_CASE("remove then insert into the hole in one transaction aborts cleanly", "[dir][crash]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  // "old-name" is the leaf's first record; its hole is the first fit.
  REQUIRE(Insert(fs, dir, "old-name", 11) == 0);
  for (int i = 0; i < 20; ++i) REQUIRE(Insert(fs, dir, NumberedName("x", i), 100 + i) == 0);
  const uint64_t free_blocks = fs.alloc().free_blocks();
  for (bool crash : {false, true}) {
    CAPTURE(crash);
    {
      Directory d(fs.ctx());
      Tx tx(fs.journal(), "rename");
      REQUIRE(d.Remove(tx, InodeOf(fs, dir), "old-name").ok());
      REQUIRE(d.Insert(tx, InodeOf(fs, dir), "new-name", 12, DT_REG).ok());
      REQUIRE(LookupIno(fs, dir, "new-name") == 12);
      if (crash) {
        CrashBeforeCommit(fs, tx);
      } else {
        tx.Abort();
      }
    }
    CHECK(LookupIno(fs, dir, "old-name") == 11);
    CHECK(LookupIno(fs, dir, "new-name") == 0);
    const std::vector<Listed> all = List(fs, dir);
    REQUIRE(all.size() == 21);
    CHECK(std::count_if(all.begin(), all.end(),
                        [](const Listed& e) { return e.name == "old-name"; }) == 1);
    CHECK(fs.alloc().free_blocks() == free_blocks);
    CheckCounts(fs, dir);
  }
}

TEST_CASE("a remount keeps every name", "[dir]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  for (int i = 0; i < 5000; ++i) REQUIRE(Insert(fs, dir, NumberedName("r", i), 1 + i) == 0);
  for (int i = 0; i < 5000; i += 2) REQUIRE(Remove(fs, dir, NumberedName("r", i)) == 0);
  const std::vector<Listed> before = List(fs, dir);
  const uint64_t size = InodeOf(fs, dir).size;
  const uint64_t free_blocks = fs.alloc().free_blocks();
  fs.Reopen();
  CHECK(fs.last_recovery().undone == 0);
  CHECK(InodeOf(fs, dir).size == size);
  CHECK(fs.alloc().free_blocks() == free_blocks);
  const std::vector<Listed> after = List(fs, dir);
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].key == before[i].key);
    CHECK(after[i].name == before[i].name);
    CHECK(after[i].ino == before[i].ino);
  }
  for (int i = 0; i < 5000; ++i) {
    CHECK(LookupIno(fs, dir, NumberedName("r", i)) == (i % 2 == 0 ? 0 : uint64_t(1 + i)));
  }
  REQUIRE(Insert(fs, dir, "after-remount", 9) == 0);
  CheckCounts(fs, dir);
}

TEST_CASE("a fragmented leaf is compacted into a new block", "[dir]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  // 70 records of 56 bytes leave 144 free bytes in a 4 KiB leaf.
  for (int i = 0; i < 70; ++i) {
    REQUIRE(Insert(fs, dir, std::string(20, 'a') + NumberedName("", i), 1 + i) == 0);
  }
  REQUIRE(Nodes(fs, dir) == 1);
  for (int i = 0; i < 70; i += 2) {
    REQUIRE(Remove(fs, dir, std::string(20, 'a') + NumberedName("", i)) == 0);
  }
  const uint64_t leaf = InodeOf(fs, dir).map.dir.root;
  const uint64_t free_blocks = fs.alloc().free_blocks();
  // 224 bytes fit no hole, but the leaf has room once compacted.
  const std::string big(200, 'z');
  REQUIRE(Insert(fs, dir, big, 500) == 0);
  CHECK(Nodes(fs, dir) == 1);
  CHECK(InodeOf(fs, dir).map.dir.root != leaf);
  CHECK(fs.alloc().free_blocks() == free_blocks);  // one block taken, one freed
  CHECK(LookupIno(fs, dir, big) == 500);
  for (int i = 1; i < 70; i += 2) {
    CHECK(LookupIno(fs, dir, std::string(20, 'a') + NumberedName("", i)) == uint64_t(1 + i));
  }
  CheckCounts(fs, dir);
}

TEST_CASE("emptied leaves are freed and their slots reused", "[dir]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  for (int i = 0; i < 3000; ++i) REQUIRE(Insert(fs, dir, NumberedName("e", i), 1 + i) == 0);
  const uint64_t full = Nodes(fs, dir);
  for (int i = 0; i < 3000; ++i) REQUIRE(Remove(fs, dir, NumberedName("e", i)) == 0);
  const TreeStats empty = Walk(fs, dir);
  CHECK(empty.leaves == 0);
  CHECK(empty.live == 0);
  CHECK(Nodes(fs, dir) == empty.index_nodes);
  CheckCounts(fs, dir);
  for (int i = 0; i < 3000; ++i) REQUIRE(Insert(fs, dir, NumberedName("f", i), 1 + i) == 0);
  for (int i = 0; i < 3000; ++i)
    REQUIRE(LookupIno(fs, dir, NumberedName("f", i)) == uint64_t(1 + i));
  CHECK(List(fs, dir).size() == 3000);
  CHECK(Nodes(fs, dir) <= full + full / 2);
  CheckCounts(fs, dir);
}

TEST_CASE("64 KiB blocks: wide slot ranges are published by copying the index node", "[dir]") {
  FsFixture fs(256ull << 20, 65536);
  const uint64_t dir = MakeDirectory(fs);
  constexpr int kNames = 30000;
  for (int i = 0; i < kNames; ++i) REQUIRE(Insert(fs, dir, NumberedName("w", i), 1 + i) == 0);
  for (int i = 0; i < kNames; ++i)
    REQUIRE(LookupIno(fs, dir, NumberedName("w", i)) == uint64_t(1 + i));
  std::vector<Listed> all = ListInBatches(fs, dir, 1000);
  CHECK(all.size() == kNames);
  CHECK(StrictlyIncreasing(all));
  CheckCounts(fs, dir);
  fs.Reopen();
  CHECK(List(fs, dir).size() == kNames);
  for (int i = 0; i < kNames; i += 2) REQUIRE(Remove(fs, dir, NumberedName("w", i)) == 0);
  CHECK(List(fs, dir).size() == kNames / 2);
  CheckCounts(fs, dir);
}

TEST_CASE("with little journal room a split copies the index node", "[dir]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  Directory d(fs.ctx());
  for (int i = 0; i < 4000; ++i) {
    Tx tx(fs.journal(), "insert");
    const Inode& inode = InodeOf(fs, dir);
    while (tx.room() > 3000) tx.Set(inode.nlink, inode.nlink);
    REQUIRE(d.Insert(tx, inode, NumberedName("j", i), 1 + i, DT_REG).ok());
    REQUIRE(tx.Commit().ok());
  }
  for (int i = 0; i < 4000; ++i)
    REQUIRE(LookupIno(fs, dir, NumberedName("j", i)) == uint64_t(1 + i));
  CHECK(List(fs, dir).size() == 4000);
  CheckCounts(fs, dir);
}

// Runs FreeTree in transactions whose slots have only `leave_room` bytes
// left, until it reports done. Returns the number of transactions.
int FreeWholeTree(FsFixture& fs, uint64_t dir, size_t leave_room) {
  int transactions = 0;
  for (bool done = false; !done;) {
    REQUIRE(++transactions < 100000);
    Tx tx(fs.journal(), "rmdir");
    const Inode& inode = InodeOf(fs, dir);
    while (tx.room() > leave_room + 64) tx.Set(inode.nlink, inode.nlink);
    Result<bool> result = Directory(fs.ctx()).FreeTree(tx, inode);
    REQUIRE(result.ok());
    done = *result;
    REQUIRE(tx.Commit().ok());
  }
  return transactions;
}

TEST_CASE("1 MiB blocks: 17-bit index levels, copied on split", "[dir]") {
  FsFixture fs(256ull << 20, 1u << 20);
  const uint64_t dir = MakeDirectory(fs);
  const uint64_t free_blocks = fs.alloc().free_blocks();
  // 128-byte records: 8191 per leaf, so the root leaf is pushed down and its
  // halves (65536 slots each) are split again.
  const std::string stem(95, 'm');
  constexpr int kNames = 26000;
  for (int i = 0; i < kNames; ++i) REQUIRE(Insert(fs, dir, NumberedName(stem, i), 1 + i) == 0);
  for (int i = 0; i < kNames; i += 7) {
    REQUIRE(LookupIno(fs, dir, NumberedName(stem, i)) == uint64_t(1 + i));
  }
  const TreeStats stats = Walk(fs, dir);
  CHECK(stats.index_nodes == 1);
  CHECK(stats.leaves >= 4);
  std::vector<Listed> all = ListInBatches(fs, dir, 5000);
  CHECK(all.size() == kNames);
  CHECK(StrictlyIncreasing(all));
  CheckCounts(fs, dir);
  CHECK(FreeWholeTree(fs, dir, 60000) == 1);
  CHECK(fs.alloc().free_blocks() == free_blocks);
}

TEST_CASE("FreeTree returns every block, also across transactions", "[dir]") {
  const uint32_t block_size = GENERATE(4096u, 65536u);
  const size_t leave_room = GENERATE(size_t{60000}, size_t{1300});
  CAPTURE(block_size, leave_room);
  FsFixture fs(256ull << 20, block_size);
  const uint64_t dir = MakeDirectory(fs);
  const uint64_t free_blocks = fs.alloc().free_blocks();
  for (int i = 0; i < 20000; ++i) REQUIRE(Insert(fs, dir, NumberedName("t", i), 1 + i) == 0);
  for (int i = 0; i < 20000; i += 2) REQUIRE(Remove(fs, dir, NumberedName("t", i)) == 0);
  REQUIRE(fs.alloc().free_blocks() < free_blocks);
  const int transactions = FreeWholeTree(fs, dir, leave_room);
  if (leave_room < 4096) {
    CHECK(transactions > 1);
  }
  const Inode& inode = InodeOf(fs, dir);
  CHECK(inode.map.dir.root == 0);
  CHECK(inode.map.dir.entries == 0);
  CHECK(inode.size == 0);
  CHECK(inode.blocks == 0);
  CHECK(fs.alloc().free_blocks() == free_blocks);
  fs.Reopen();
  CHECK(fs.alloc().free_blocks() == free_blocks);
  // The directory is usable again.
  REQUIRE(Insert(fs, dir, "again", 1) == 0);
  CHECK(LookupIno(fs, dir, "again") == 1);
}

TEST_CASE("FreeTree of a one-leaf directory and of an empty one", "[dir]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  const uint64_t free_blocks = fs.alloc().free_blocks();
  CHECK(FreeWholeTree(fs, dir, 60000) == 1);
  REQUIRE(Insert(fs, dir, "x", 1) == 0);
  CHECK(FreeWholeTree(fs, dir, 60000) == 1);
  CHECK(fs.alloc().free_blocks() == free_blocks);
  CHECK(InodeOf(fs, dir).size == 0);
}

TEST_CASE("ENOSPC leaves the directory as it was", "[dir]") {
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  for (int i = 0; i < 200; ++i) REQUIRE(Insert(fs, dir, NumberedName("s", i), 1 + i) == 0);
  {
    // Take every free block but three.
    Tx tx(fs.journal(), "fill");
    while (fs.alloc().free_blocks() > 3) {
      REQUIRE(fs.alloc().AllocateBlocks(tx, 0, fs.alloc().free_blocks() - 3).ok());
    }
    REQUIRE(tx.Commit().ok());
  }
  int inserted = 200;
  int error = 0;
  for (; inserted < 100000; ++inserted) {
    const uint64_t free_before = fs.alloc().free_blocks();
    const uint64_t nodes_before = Nodes(fs, dir);
    error = Insert(fs, dir, NumberedName("s", inserted), 1 + inserted);
    if (error != 0) {
      CHECK(fs.alloc().free_blocks() == free_before);
      CHECK(Nodes(fs, dir) == nodes_before);
      break;
    }
  }
  CHECK(error == ENOSPC);
  CHECK(InodeOf(fs, dir).map.dir.entries == uint64_t(inserted));
  CHECK(LookupIno(fs, dir, NumberedName("s", inserted)) == 0);
  for (int i = 0; i < inserted; ++i)
    REQUIRE(LookupIno(fs, dir, NumberedName("s", i)) == uint64_t(1 + i));
  CheckCounts(fs, dir);
}

// ---------------------------------------------------------------------------
// Damaged trees. Each operation runs in a child process with a timeout, so a
// crash or an endless loop fails the test instead of ending it.
// ---------------------------------------------------------------------------

void Damage(FsFixture& fs, uint64_t offset, const void* bytes, size_t len) {
  fs.media().Store(offset, bytes, len);
  fs.media().Persist(offset, len);
}

template <class T>
void DamageValue(FsFixture& fs, uint64_t offset, T value) {
  Damage(fs, offset, &value, sizeof value);
}

// Every operation on `probe` (inserting `colliding`, a new name of the same
// hash) must fail with EUCLEAN; FreeTree too when `structural` (it reads
// headers and pointers, not records). Returns a bit per operation that did not.
int ProbeAll(FsFixture& fs, uint64_t dir, const std::string& probe, const std::string& colliding,
             bool structural) {
  Directory d(fs.ctx());
  const Inode& inode = InodeOf(fs, dir);
  int failures = 0;
  if (d.Lookup(inode, probe).code() != EUCLEAN) failures |= 1;
  if (d.ReadDir(inode, 0, [](const DirEntryRef&) { return true; }).code() != EUCLEAN) {
    failures |= 2;
  }
  {
    Tx tx(fs.journal(), "insert");
    if (d.Insert(tx, inode, colliding, 5, DT_REG).code() != EUCLEAN) failures |= 4;
    tx.Abort();
  }
  {
    Tx tx(fs.journal(), "remove");
    if (d.Remove(tx, inode, probe).code() != EUCLEAN) failures |= 8;
    tx.Abort();
  }
  {
    Tx tx(fs.journal(), "replace");
    if (d.Replace(tx, inode, probe, 5, DT_REG).code() != EUCLEAN) failures |= 16;
    tx.Abort();
  }
  {
    Tx tx(fs.journal(), "rmdir");
    const int code = d.FreeTree(tx, inode).code();
    if (structural ? code != EUCLEAN : code != 0 && code != EUCLEAN) failures |= 32;
    tx.Abort();
  }
  return failures;
}

// A name of `dir` and the leaf holding it.
struct Located {
  uint64_t leaf = 0;
  uint64_t record_offset = 0;  // media offset of its record
};

Located Locate(FsFixture& fs, uint64_t dir, const std::string& name) {
  const Geometry& g = fs.geometry();
  const uint64_t hash = DirHash(NameHash(fs.ctx().hash_key, name));
  uint64_t ptr = InodeOf(fs, dir).map.dir.root;
  uint32_t consumed = 0;
  const uint32_t fanout_bits = g.block_shift() - 3;
  while (ptr & kDirNodeIndexBit) {
    const uint32_t bits = std::min(fanout_bits, format::kDirHashBits - consumed);
    consumed += bits;
    const uint64_t slot = (hash >> (format::kDirHashBits - consumed)) & ((1u << bits) - 1);
    std::memcpy(&ptr, fs.media().base() + g.BlockOffset(ptr & kDirNodeBlockMask) + slot * 8, 8);
  }
  for (uint64_t leaf = ptr; leaf != 0;) {
    const std::byte* base = fs.media().base() + g.BlockOffset(leaf);
    for (const LeafRecord& r : ParseDirLeaf(base, g.block_size())) {
      if (r.entry.ino != 0 && r.name == name) return {leaf, g.BlockOffset(leaf) + r.offset};
    }
    DirLeafHeader header;
    std::memcpy(&header, base, sizeof header);
    leaf = header.next;
  }
  FAIL("name not found: " << name);
  return {};
}

TEST_CASE("a damaged tree is reported as EUCLEAN, never followed", "[dir][corrupt]") {
  ForcedNameHash forced;
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  const Geometry& g = fs.geometry();
  for (int i = 0; i < 2000; ++i) REQUIRE(Insert(fs, dir, NumberedName("c", i), 1 + i) == 0);
  const std::string probe = NumberedName("c", 1234);
  const uint64_t root = InodeOf(fs, dir).map.dir.root;
  REQUIRE((root & kDirNodeIndexBit) != 0);
  const uint64_t root_offset = g.InodeOffset(dir) + offsetof(Inode, map);
  const Located located = Locate(fs, dir, probe);
  const uint64_t leaf_offset = g.BlockOffset(located.leaf);
  // The root index slot that leads to the probe's leaf.
  const uint64_t hash = DirHash(NameHash(fs.ctx().hash_key, probe));
  const uint64_t slot_offset =
      g.BlockOffset(root & kDirNodeBlockMask) + (hash >> (format::kDirHashBits - 9)) * 8;
  std::mt19937_64 rng(11);
  const std::string colliding = forced.MakeName(NameHash(fs.ctx().hash_key, probe), 20, rng);
  DirLeafHeader header;
  std::memcpy(&header, fs.media().base() + leaf_offset, sizeof header);
  bool structural = true;

  std::string what;
  SECTION("root pointer past the end") {
    what = "root pointer past the end";
    DamageValue<uint64_t>(fs, root_offset, g.block_count() + 7);
  }
  SECTION("root pointer with reserved bits") {
    what = "root pointer with reserved bits";
    DamageValue<uint64_t>(fs, root_offset, root | (1ull << 60));
  }
  SECTION("index slot past the end") {
    what = "index slot past the end";
    DamageValue<uint64_t>(fs, slot_offset, g.block_count());
  }
  SECTION("index slot to block 0") {
    what = "index slot to block 0";
    DamageValue<uint64_t>(fs, slot_offset, kDirNodeIndexBit);
  }
  SECTION("index nodes in a cycle") {
    what = "index nodes in a cycle";
    DamageValue<uint64_t>(fs, slot_offset, root);
  }
  SECTION("leaf with a bad magic") {
    what = "leaf with a bad magic";
    DamageValue<uint32_t>(fs, leaf_offset, 0x12345678);
  }
  SECTION("leaf with the wrong prefix") {
    what = "leaf with the wrong prefix";
    DamageValue<uint64_t>(fs, leaf_offset + offsetof(DirLeafHeader, prefix), header.prefix ^ 1);
  }
  SECTION("leaf with an impossible prefix length") {
    what = "leaf with an impossible prefix length";
    DamageValue<uint16_t>(fs, leaf_offset + offsetof(DirLeafHeader, prefix_bits),
                          format::kDirHashBits + 1);
  }
  SECTION("leaf with an overflow link above the last level") {
    what = "leaf with an overflow link above the last level";
    DamageValue<uint64_t>(fs, leaf_offset + offsetof(DirLeafHeader, next), located.leaf);
  }
  SECTION("record length 0") {
    what = "record length 0";
    structural = false;
    DamageValue<uint32_t>(fs, leaf_offset + sizeof(DirLeafHeader) + offsetof(DirEntry, rec_len), 0);
  }
  SECTION("record length past the block") {
    what = "record length past the block";
    structural = false;
    DamageValue<uint32_t>(fs, located.record_offset + offsetof(DirEntry, rec_len), 0xFFFFFFF8u);
  }
  SECTION("record length not a multiple of 8") {
    what = "record length not a multiple of 8";
    structural = false;
    DamageValue<uint32_t>(fs, leaf_offset + sizeof(DirLeafHeader) + offsetof(DirEntry, rec_len),
                          44);
  }
  SECTION("record leaving 8 bytes at the block's end") {
    what = "record leaving 8 bytes at the block's end";
    structural = false;
    // Make the first record swallow all but the last 8 bytes of the block.
    DamageValue<uint32_t>(fs, leaf_offset + sizeof(DirLeafHeader) + offsetof(DirEntry, rec_len),
                          g.block_size() - sizeof(DirLeafHeader) - 8);
  }
  SECTION("name longer than its record") {
    what = "name longer than its record";
    structural = false;
    DamageValue<uint8_t>(fs, located.record_offset + offsetof(DirEntry, name_len), 255);
  }
  SECTION("entry whose key is outside the leaf's prefix") {
    what = "entry whose key is outside the leaf's prefix";
    structural = false;
    DamageValue<uint64_t>(fs, located.record_offset + offsetof(DirEntry, key),
                          DirKey(hash ^ (uint64_t{1} << (format::kDirHashBits - 1)), 0));
  }
  INFO(what);
  const int status = RunInChild([&] { return ProbeAll(fs, dir, probe, colliding, structural); });
  CHECK(status == 0);
}

TEST_CASE("an overflow chain with a cycle is reported, not looped on", "[dir][corrupt]") {
  ForcedNameHash forced;
  FsFixture fs;
  const uint64_t dir = MakeDirectory(fs);
  std::mt19937_64 rng(3);
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) {
    names.push_back(forced.MakeName(0x5555AAAA5555AAAAull, 250, rng));
    REQUIRE(Insert(fs, dir, names.back(), 1 + i) == 0);
  }
  const Located head = Locate(fs, dir, names[0]);
  const Located last = Locate(fs, dir, names[39]);
  REQUIRE(head.leaf != last.leaf);
  const uint64_t last_offset = fs.geometry().BlockOffset(last.leaf);
  // An absent name of the same hash walks the whole chain.
  const std::string absent = forced.MakeName(0x5555AAAA5555AAAAull, 250, rng);
  SECTION("back to the head") {
    DamageValue<uint64_t>(fs, last_offset + offsetof(DirLeafHeader, next), head.leaf);
  }
  SECTION("onto itself") {
    DamageValue<uint64_t>(fs, last_offset + offsetof(DirLeafHeader, next), last.leaf);
  }
  SECTION("a directory counting fewer nodes than its chain") {
    DamageValue<uint64_t>(fs, fs.geometry().InodeOffset(dir) + offsetof(Inode, blocks), 2);
  }
  const int status = RunInChild([&] { return ProbeAll(fs, dir, absent, absent, true); });
  CHECK(status == 0);
}

}  // namespace
}  // namespace nvfs::test
