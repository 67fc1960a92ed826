// File extent maps (src/fs/extent_map.hpp) on their own, built from a file
// mapped through the bmap on a freshly formatted image (fs_fixture.hpp):
// runs of holes and of contiguous blocks, one run across pointer blocks;
// the coarse index; the run limit and a corrupt pointer, past which the map
// covers nothing; a map's data_seq tag and, through the filesystem's read
// path (src/fs/read.cpp), that a stale map is not used and is rebuilt; and
// reclamation: a retired map is freed only after the epoch guards older than
// it have ended (seen by a hook in operator delete below).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bmap/bmap.hpp"
#include "epoch_reader.hpp"
#include "fs/extent_map.hpp"
#include "fs_fixture.hpp"
#include "fs_image.hpp"
#include "nvfs/epoch.hpp"

// Frees are watched for one address at a time (reclamation cases): what
// ExtentMap::Destroy gives back goes through operator delete. New and
// delete are replaced together, from malloc, so a sanitizer's own never
// pairs with these.
namespace {
std::atomic<void*> watched_address{nullptr};
std::atomic<int> watched_frees{0};
void NoteFree(void* p) {
  if (p != nullptr && p == watched_address.load(std::memory_order_relaxed)) {
    watched_frees.fetch_add(1, std::memory_order_relaxed);
  }
}
}  // namespace

void* operator new(std::size_t size) {
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return std::malloc(size == 0 ? 1 : size);
}
// The pair matches (operator new above takes from malloc); GCC, inlining
// these, cannot tell and warns.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept {
  NoteFree(p);
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  NoteFree(p);
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  NoteFree(p);
  std::free(p);
}
#pragma GCC diagnostic pop

namespace nvfs::test {
namespace {

using format::Inode;

// A built map, destroyed with the module's own Destroy.
struct MapDeleter {
  void operator()(ExtentMap* map) const { ExtentMap::Destroy(map); }
};
using MapPtr = std::unique_ptr<ExtentMap, MapDeleter>;

// A regular file on the fixture's image, mapped through the bmap; data_seq
// is the test's own count of changes (the core keeps it in CachedInode).
class TestFile {
 public:
  explicit TestFile(FsFixture& fs) : fs_(fs), bmap_(fs.ctx()) {
    Tx tx(fs.journal(), "create");
    auto ino = fs.alloc().AllocateInode(tx, 1, false);
    REQUIRE(ino.ok());
    ino_ = *ino;
    const uint64_t at = fs.geometry().InodeOffset(ino_);
    tx.FillFresh(at, 0, sizeof(Inode));
    const uint16_t mode = S_IFREG | 0644;
    tx.StoreFresh(at + offsetof(Inode, mode), &mode, sizeof mode);
    REQUIRE(tx.Commit().ok());
  }

  const Inode& inode() const { return fs_.ctx().InodeAt(ino_); }
  const Bmap& bmap() const { return bmap_; }
  uint64_t seq() const { return seq_; }

  // Maps file blocks [index, index + count) and, if the file ends before
  // them, makes it end there.
  void Map(uint64_t index, uint64_t count) {
    Tx tx(fs_.journal(), "map");
    for (uint64_t done = 0; done < count;) {
      auto run = bmap_.MapForWrite(tx, inode(), index + done, count - done, /*zero_new=*/true);
      REQUIRE(run.ok());
      done += run->count;
    }
    const uint64_t end = (index + count) * fs_.geometry().block_size();
    if (inode().size < end) tx.Set(inode().size, end);
    REQUIRE(tx.Commit().ok());
    seq_ += 2;
  }
  void SetSize(uint64_t size) {
    Tx tx(fs_.journal(), "size");
    tx.Set(inode().size, size);
    REQUIRE(tx.Commit().ok());
    seq_ += 2;
  }
  // A pointer to a block past the end of the filesystem in direct slot `slot`.
  void Corrupt(int slot) {
    Tx tx(fs_.journal(), "corrupt");
    tx.Set(inode().map.file.direct[slot], fs_.geometry().block_count() + 100);
    REQUIRE(tx.Commit().ok());
    seq_ += 2;
  }

  MapPtr Build(uint32_t max_runs = 1u << 16) const {
    ExtentMap* map = ExtentMap::Build(fs_.ctx(), bmap_, inode(), seq_, max_runs);
    REQUIRE(map != nullptr);
    return MapPtr(map);
  }

 private:
  FsFixture& fs_;
  Bmap bmap_;
  uint64_t ino_ = 0;
  uint64_t seq_ = 0;
};

// The file as runs, from one lookup per block: what a map must say.
struct ModelRun {
  uint64_t first_block;
  uint64_t blocks;
  uint64_t phys;  // of first_block; 0: a hole
};
std::vector<ModelRun> ModelRuns(const TestFile& file, uint64_t blocks) {
  std::vector<ModelRun> runs;
  for (uint64_t i = 0; i < blocks; ++i) {
    uint64_t one = 0;
    const uint64_t phys = file.bmap().Lookup(file.inode(), i, 1, &one);
    REQUIRE(phys != Bmap::kCorrupt);
    if (!runs.empty()) {
      ModelRun& last = runs.back();
      const bool extends = phys == 0 ? last.phys == 0
                                     : last.phys != 0 && last.phys + last.blocks == phys;
      if (extends) {
        ++last.blocks;
        continue;
      }
    }
    runs.push_back({i, 1, phys});
  }
  return runs;
}

// Every run's first, middle and last byte, and a byte inside each block:
// the address and the bytes left in the run, against the model.
void CheckAgainstModel(FsFixture& fs, const ExtentMap& map, const std::vector<ModelRun>& runs) {
  const uint64_t bs = fs.geometry().block_size();
  for (const ModelRun& run : runs) {
    const uint64_t start = run.first_block * bs;
    const uint64_t end = (run.first_block + run.blocks) * bs;
    for (uint64_t b = 0; b < run.blocks; ++b) {
      for (uint64_t pos : {start + b * bs, start + b * bs + bs / 2 + 3, start + (b + 1) * bs - 1}) {
        CAPTURE(run.first_block, run.blocks, run.phys, pos);
        REQUIRE(pos < map.covered());
        const ExtentMap::Run got = map.At(pos);
        if (run.phys == 0) {
          REQUIRE(got.addr == nullptr);
        } else {
          REQUIRE(got.addr == fs.ctx().Block(run.phys) + (pos - start));
        }
        REQUIRE(got.len == end - pos);
      }
    }
  }
}

constexpr uint64_t kBs = 4096;

TEST_CASE("a map's runs: contiguous blocks as one run across pointer-block ends, holes as "
          "runs", "[extent_map]") {
  FsFixture fs;
  TestFile file(fs);
  file.Map(0, 30);   // direct blocks and on into the first indirect block
  file.Map(40, 5);   // after a hole of 10 blocks
  file.SetSize(45 * kBs - 100);
  const std::vector<ModelRun> runs = ModelRuns(file, 45);
  REQUIRE(runs.size() == 3);
  REQUIRE(runs[0].blocks == 30);  // one run, across the end of the direct blocks

  const MapPtr map = file.Build();
  CHECK(map->seq() == file.seq());
  CHECK(map->size() == 45 * kBs - 100);
  CHECK(map->covered() == 45 * kBs);  // whole blocks
  const ExtentMap::Run first = map->At(0);
  CHECK(first.addr == fs.ctx().Block(runs[0].phys));
  CHECK(first.len == 30 * kBs);
  const ExtentMap::Run hole = map->At(33 * kBs + 5);
  CHECK(hole.addr == nullptr);
  CHECK(hole.len == 7 * kBs - 5);
  CheckAgainstModel(fs, *map, runs);
}

TEST_CASE("a map of many short runs finds every byte's run through its index",
          "[extent_map]") {
  FsFixture fs;
  TestFile file(fs);
  std::mt19937_64 rng(23);
  // Runs of 1..8 mapped blocks and holes; another file's blocks in
  // between keep neighbouring mapped runs apart.
  TestFile other(fs);
  uint64_t index = 0;
  uint64_t other_index = 0;
  while (index < 600) {
    const uint64_t len = 1 + rng() % 8;
    if (rng() % 3 != 0) {
      file.Map(index, len);
      other.Map(other_index++, 1);
    }
    index += len;
  }
  file.SetSize(index * kBs);
  const std::vector<ModelRun> runs = ModelRuns(file, index);
  REQUIRE(runs.size() > 40);
  const MapPtr map = file.Build();
  CHECK(map->covered() == index * kBs);
  CheckAgainstModel(fs, *map, runs);
}

TEST_CASE("an empty file and a file of one hole", "[extent_map]") {
  FsFixture fs;
  TestFile file(fs);
  {
    const MapPtr map = file.Build();
    CHECK(map->size() == 0);
    CHECK(map->covered() == 0);
  }
  file.SetSize(100 * kBs + 1);
  const MapPtr map = file.Build();
  CHECK(map->size() == 100 * kBs + 1);
  CHECK(map->covered() == 101 * kBs);
  for (uint64_t pos : {uint64_t{0}, 50 * kBs + 7, 101 * kBs - 1}) {
    const ExtentMap::Run run = map->At(pos);
    CHECK(run.addr == nullptr);
    CHECK(run.len == 101 * kBs - pos);
  }
}

// Past max_runs the map stops: covered() ends where the first run it left
// out begins, and the reads there go through the bmap (read.cpp).
// Seen failing (issue 23) without Build's `if (runs.size() == max_runs) break;`.
TEST_CASE("past the run limit a map covers only its first runs", "[extent_map]") {
  FsFixture fs;
  TestFile file(fs);
  file.Map(0, 30);
  file.Map(40, 5);
  file.SetSize(45 * kBs - 100);
  const std::vector<ModelRun> runs = ModelRuns(file, 45);
  REQUIRE(runs.size() == 3);
  const uint64_t ends[] = {30 * kBs, 40 * kBs, 45 * kBs};
  for (uint32_t max_runs = 1; max_runs <= 4; ++max_runs) {
    CAPTURE(max_runs);
    const MapPtr map = file.Build(max_runs);
    CHECK(map->covered() == ends[std::min<uint32_t>(max_runs, 3) - 1]);
    CHECK(map->size() == 45 * kBs - 100);
    CheckAgainstModel(fs, *map, std::vector<ModelRun>(runs.begin(), runs.begin() +
                                                      std::min<uint32_t>(max_runs, 3)));
  }
}

TEST_CASE("a corrupt block pointer ends the map's coverage before it", "[extent_map]") {
  FsFixture fs;
  TestFile file(fs);
  file.Map(0, 10);
  file.Corrupt(6);
  const MapPtr map = file.Build();
  CHECK(map->size() == 10 * kBs);
  CHECK(map->covered() == 6 * kBs);
  CHECK(map->At(0).len == 6 * kBs);
}

// A map describes its file as of one data_seq and never changes: after the
// file changes it still says what the file was (readers compare seq() with
// the file's data_seq and do not use it), and a new build says what it is.
TEST_CASE("a map is tagged with its data_seq and keeps describing that version",
          "[extent_map][stale]") {
  FsFixture fs;
  TestFile file(fs);
  file.Map(0, 4);
  file.SetSize(12 * kBs);
  const MapPtr before = file.Build();
  const uint64_t seq_before = file.seq();
  CHECK(before->seq() == seq_before);
  CHECK(before->At(8 * kBs).addr == nullptr);

  file.Map(8, 2);  // into the hole
  CHECK(file.seq() != seq_before);
  CHECK(before->seq() == seq_before);
  CHECK(before->At(8 * kBs).addr == nullptr);  // unchanged
  CHECK(before->At(4 * kBs).len == 8 * kBs);

  const MapPtr after = file.Build();
  CHECK(after->seq() == file.seq());
  uint64_t run = 0;
  const uint64_t phys = file.bmap().Lookup(file.inode(), 8, 2, &run);
  REQUIRE(phys != 0);
  CHECK(after->At(8 * kBs).addr == fs.ctx().Block(phys));
  CHECK(after->At(4 * kBs).len == 4 * kBs);
}

// Through the filesystem: reads build a map once they have paid for it; a
// write into a hole changes data_seq, after which the old map must not
// serve a read (it would read the hole), and later reads rebuild it.
// Seen failing (issue 23) without ReadSlow's `map->seq() == seq` (read.cpp).
TEST_CASE("a stale map is not read through and the reads rebuild it", "[extent_map][stale]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const Cred cred{1000, 1000};
  Attr attr;
  auto f = fs.Create(1, "f", 0644, O_RDWR, cred, &attr);
  REQUIRE(f.ok());
  std::string model(9 * kBs, '\0');
  const auto write = [&](uint64_t offset, uint64_t len, char c) {
    const std::string data(len, c);
    REQUIRE(*fs.Write(*f, offset, data.data(), len) == len);
    model.replace(offset, len, data);
  };
  const auto read_all = [&] {
    std::string got(model.size() + 10, '?');
    auto n = fs.Read(*f, 0, got.data(), got.size());
    REQUIRE(n.ok());
    got.resize(*n);
    return got;
  };
  // Reads until one more map was built (a bounded number).
  const auto read_until_built = [&](uint64_t built) {
    for (int i = 0; i < 200 && fs.extent_maps_built() == built; ++i) REQUIRE(read_all() == model);
    REQUIRE(fs.extent_maps_built() == built + 1);
  };
  write(0, 4 * kBs, 'a');
  write(8 * kBs, kBs, 'b');  // blocks 4..7 a hole
  const uint64_t built = fs.extent_maps_built();
  read_until_built(built);
  CHECK(read_all() == model);  // through the map

  write(5 * kBs, kBs, 'c');  // into the hole: a new mapping
  CHECK(read_all() == model);
  read_until_built(built + 1);
  CHECK(read_all() == model);
  fs.Release(*f);
}

// Retires a trivial object, enough of them to make the epoch run a reclaim
// pass (it frees in batches).
void RetireFiller(int count) {
  for (int i = 0; i < count; ++i) {
    epoch::Retire(new int(i), [](void* p) { delete static_cast<int*>(p); });
  }
}

// A map of `file` whose free operator delete counts in watched_frees.
ExtentMap* BuildWatched(const TestFile& file) {
  ExtentMap* map = file.Build().release();
  watched_frees.store(0);
  watched_address.store(map);
  return map;
}

// A replaced map is retired the way read.cpp retires it (epoch::Retire with
// ExtentMap::DestroyErased): freed once, and only after every guard that
// began before the retire has ended; a guard that began after does not
// hold it. Seen failing (issue 23) without Destroy's operator delete (never
// freed), and with the epoch's reclaim freeing whatever is retired
// (src/util/epoch.cpp's partition keeping nothing: freed under the guard).
TEST_CASE("a retired map is freed only after the older guards end", "[extent_map][reclaim]") {
  FsFixture fs;
  TestFile file(fs);
  file.Map(0, 8);
  ExtentMap* map = BuildWatched(file);

  std::optional<ReaderGuard> older(std::in_place);
  epoch::Retire(map, ExtentMap::DestroyErased);
  {
    const ReaderGuard newer;
    RetireFiller(40);  // reclaim passes run, with the older guard in
    CHECK(watched_frees.load() == 0);
  }
  RetireFiller(40);
  CHECK(watched_frees.load() == 0);

  older.reset();
  {
    const ReaderGuard newer;  // began after the retire: does not hold it
    epoch::Barrier();
    CHECK(watched_frees.load() == 1);
  }
  epoch::Barrier();
  CHECK(watched_frees.load() == 1);
  watched_address.store(nullptr);
}

TEST_CASE("Destroy frees the map's one allocation; nullptr is nothing", "[extent_map][reclaim]") {
  FsFixture fs;
  TestFile file(fs);
  file.Map(0, 3);
  ExtentMap* map = BuildWatched(file);
  ExtentMap::Destroy(nullptr);
  CHECK(watched_frees.load() == 0);
  ExtentMap::DestroyErased(map);
  CHECK(watched_frees.load() == 1);
  watched_address.store(nullptr);
}

}  // namespace
}  // namespace nvfs::test
