// The undo journal and the allocator: commit, abort, and recovery of an
// interrupted transaction from a snapshot of the media taken mid-operation.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "fs_fixture.hpp"

namespace nvfs::test {
namespace {

uint64_t DataOffset(FsFixture& fs, uint64_t nth_block) {
  const Geometry& g = fs.geometry();
  return g.BlockOffset(g.FirstDataBlock(0) + 16 + nth_block);
}

uint64_t Read64(FsFixture& fs, uint64_t offset) {
  uint64_t v;
  std::memcpy(&v, fs.media().base() + offset, 8);
  return v;
}

// One transaction named `what` that stores `value` at `at`, committed.
void Store64Committed(FsFixture& fs, const char* what, uint64_t at, uint64_t value) {
  Tx tx(fs.journal(), what);
  tx.Store64(at, value);
  REQUIRE(tx.Commit().ok());
}

TEST_CASE("committed stores survive a reopen", "[journal]") {
  FsFixture fs;
  const uint64_t at = DataOffset(fs, 0);
  Store64Committed(fs, "test", at, 0xABCDEF);
  fs.Reopen();
  CHECK(Read64(fs, at) == 0xABCDEF);
  CHECK(fs.last_recovery().undone == 0);
}

TEST_CASE("abort restores every logged store in reverse order", "[journal]") {
  FsFixture fs;
  const uint64_t at = DataOffset(fs, 0);
  Store64Committed(fs, "setup", at, 1);
  {
    Tx tx(fs.journal(), "aborted");
    tx.Store64(at, 2);
    tx.Store64(at, 3);
    const char text[] = "hello";
    tx.Store(at + 8, text, sizeof text);
    CHECK(Read64(fs, at) == 3);
    tx.Abort();
  }
  CHECK(Read64(fs, at) == 1);
  CHECK(Read64(fs, at + 8) == 0);
}

// A transaction stores nothing once it has committed or aborted: its slot
// is free, maybe another transaction's already, and nothing would undo the
// store. Such a store is a bug, and stops the process before it writes.
TEST_CASE("a finished transaction refuses every store: the process stops, nothing is written",
          "[journal]") {
  FsFixture fs;
  const uint64_t at = DataOffset(fs, 0);
  Store64Committed(fs, "setup", at, 5);
  const uint64_t eight = 8;
  const std::vector<std::pair<const char*, std::function<void(Tx&)>>> stores = {
      {"Store64", [&](Tx& tx) { tx.Store64(at, 6); }},
      {"Store", [&](Tx& tx) { tx.Store(at, &eight, sizeof eight); }},
      {"Set", [&](Tx& tx) {
         tx.Set(*reinterpret_cast<const uint64_t*>(fs.media().base() + at), uint64_t{7});
       }},
      {"StoreFresh", [&](Tx& tx) { tx.StoreFresh(at, &eight, sizeof eight); }},
      {"FillFresh", [&](Tx& tx) { tx.FillFresh(at, 0x11, 8); }},
      {"LogAllocated", [&](Tx& tx) { (void)tx.LogAllocated(BitmapKind::kBlocks, 100, 1); }},
      {"LogDeferredFree", [&](Tx& tx) { (void)tx.LogDeferredFree(BitmapKind::kBlocks, 100, 1); }},
  };
  for (const bool commit : {true, false}) {
    for (const auto& [what, store] : stores) {
      INFO(what << (commit ? " after Commit" : " after Abort"));
      const int code = RunInChild([&] {
        if (std::freopen("/dev/null", "w", stderr) == nullptr) return 253;
        Tx tx(fs.journal(), "finished");
        tx.Store64(at, 5);
        if (commit) {
          if (!tx.Commit().ok()) return 252;
        } else {
          tx.Abort();
        }
        store(tx);
        return 0;
      });
      CHECK(code == 1000 + SIGABRT);
      // The mapping is shared with the child: a store it made would show.
      CHECK(Read64(fs, at) == 5);
    }
  }
}

TEST_CASE("recovery undoes an operation interrupted by a crash", "[journal]") {
  FsFixture fs;
  const uint64_t at = DataOffset(fs, 0);
  const uint64_t free_before = fs.alloc().free_blocks();
  std::vector<std::byte> snapshot;
  Extent run;
  {
    Tx tx(fs.journal(), "interrupted");
    tx.Store64(at, 42);
    auto allocated = fs.alloc().AllocateBlocks(tx, 0, 8);
    REQUIRE(allocated.ok());
    run = *allocated;
    CHECK(fs.alloc().free_blocks() == free_before - run.count);
    snapshot = fs.Snapshot();
    tx.Abort();
  }
  fs.CrashTo(snapshot);
  CHECK(fs.last_recovery().undone == 1);
  CHECK(Read64(fs, at) == 0);
  CHECK(fs.alloc().free_blocks() == free_before);
  CHECK_FALSE(fs.alloc().InUse(BitmapKind::kBlocks, run.first));
  // Recovery is idempotent: a second pass finds nothing to do.
  fs.Reopen();
  CHECK(fs.last_recovery().undone == 0);
  CHECK(fs.alloc().free_blocks() == free_before);
}

TEST_CASE("allocation is contiguous from the goal and freed after commit", "[alloc]") {
  FsFixture fs;
  const uint64_t free_before = fs.alloc().free_blocks();
  Extent a, b;
  {
    Tx tx(fs.journal(), "alloc");
    auto first = fs.alloc().AllocateBlocks(tx, 0, 64);
    REQUIRE(first.ok());
    a = *first;
    auto second = fs.alloc().AllocateBlocks(tx, a.first + a.count, 64);
    REQUIRE(second.ok());
    b = *second;
    REQUIRE(tx.Commit().ok());
  }
  CHECK(a.count == 64);
  CHECK(b.first == a.first + a.count);
  fs.Reopen();
  CHECK(fs.alloc().free_blocks() == free_before - 128);
  CHECK(fs.alloc().InUse(BitmapKind::kBlocks, a.first));
  {
    Tx tx(fs.journal(), "free");
    REQUIRE(fs.alloc().FreeBlocks(tx, a.first, 128).ok());
    // Not reusable before the commit.
    CHECK(fs.alloc().InUse(BitmapKind::kBlocks, a.first));
    REQUIRE(tx.Commit().ok());
  }
  CHECK(fs.alloc().free_blocks() == free_before);
  fs.Reopen();
  CHECK(fs.alloc().free_blocks() == free_before);
}

TEST_CASE("inode allocation and ENOSPC leave counts exact", "[alloc]") {
  FsFixture fs(64ull << 20, 4096, 64);
  const uint64_t free_inodes = fs.alloc().free_inodes();
  REQUIRE(free_inodes > 0);
  std::vector<uint64_t> inos;
  {
    Tx tx(fs.journal(), "fill");
    for (;;) {
      auto ino = fs.alloc().AllocateInode(tx, 1, false);
      if (!ino.ok()) {
        CHECK(ino.error().code == ENOSPC);
        break;
      }
      inos.push_back(*ino);
    }
    REQUIRE(tx.Commit().ok());
  }
  CHECK(inos.size() == free_inodes);
  CHECK(fs.alloc().free_inodes() == 0);
  fs.Reopen();
  CHECK(fs.alloc().free_inodes() == 0);
}

TEST_CASE("an operation that overflows its slot aborts cleanly", "[journal]") {
  FsFixture fs;
  const uint64_t at = DataOffset(fs, 0);
  Tx tx(fs.journal(), "huge");
  std::vector<char> big(4096, 'x');
  for (int i = 0; i < 64; ++i) tx.Store(at + uint64_t(i) * 4096, big.data(), big.size());
  CHECK_FALSE(tx.ok());
  CHECK(tx.Commit().code() == ENOSPC);
  CHECK(Read64(fs, at) == 0);
}

}  // namespace
}  // namespace nvfs::test

namespace nvfs::test {
namespace {

TEST_CASE("large allocations start on a 2 MiB boundary unless they continue a run", "[alloc]") {
  FsFixture fs(256ull << 20);
  Tx tx(fs.journal(), "align");
  auto small = fs.alloc().AllocateBlocks(tx, 0, 3);
  REQUIRE(small.ok());
  auto big = fs.alloc().AllocateBlocks(tx, 0, 512);
  REQUIRE(big.ok());
  CHECK(big->first % 512 == 0);
  CHECK(big->count == 512);
  // Continuing right after a run wins over alignment.
  auto next = fs.alloc().AllocateBlocks(tx, small->first + small->count, 600);
  REQUIRE(next.ok());
  CHECK(next->first == small->first + small->count);
  REQUIRE(tx.Commit().ok());
}

// Issue 12.6: once a page of the namespace is lost (a media error outside
// every recovery point, Media::LostPages), a store of any transaction may
// have gone to memory that keeps nothing: no commit goes through, but the
// one that records the error, and the journal says so once.
TEST_CASE("no transaction commits after a page was lost, but the error record",
          "[journal][fault]") {
  FsFixture fs;
  const uint64_t at = DataOffset(fs, 0);
  Store64Committed(fs, "before", at, 7);
  int told = 0;
  fs.journal().set_loss_listener([&](const Error& e) {
    ++told;
    CHECK(e.code == EIO);
  });
  // Cut the image under the mapping: the last page is gone, and a load of
  // it outside any recovery point loses it.
  const uint64_t last = fs.media().size() - 4096;
  REQUIRE(truncate(fs.path().c_str(), static_cast<off_t>(last)) == 0);
  CHECK(Read64(fs, last) == ~uint64_t{0});
  REQUIRE(fs.media().LostPages() == 1);
  {
    Tx tx(fs.journal(), "after");
    tx.Store64(at, 8);
    CHECK(tx.Commit().code() == EIO);
  }
  CHECK(Read64(fs, at) == 7);  // undone
  {
    Tx tx(fs.journal(), "again");
    tx.Store64(at, 9);
    CHECK(tx.Commit().code() == EIO);
  }
  CHECK(told == 1);
  {
    Tx tx(fs.journal(), "errors");
    tx.CommitAfterMediaLoss();
    tx.Store64(at, 10);
    CHECK(tx.Commit().ok());
  }
  CHECK(Read64(fs, at) == 10);
  fs.journal().set_loss_listener(nullptr);
  REQUIRE(truncate(fs.path().c_str(), static_cast<off_t>(fs.media().size())) == 0);
}

}  // namespace
}  // namespace nvfs::test
