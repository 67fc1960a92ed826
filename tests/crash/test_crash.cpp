// The crash suite: every metadata operation, the data writes, directory
// growth, long truncations and orphans, and seeded two-operation sequences,
// each crashed at every fence and operation end (crash_harness.hpp says how
// and how to replay one case). Prints crash-state counts per workload.
#include <catch2/catch.hpp>

#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <random>

#include "crash_concurrent.hpp"
#include "crash_ops.hpp"
#include "crash_workloads.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/mkfs.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs::test {
namespace {

using namespace ops;

// One check per workload: no failure, and at least one crash state checked.
void Report(const std::vector<WorkloadResult>& results) {
  for (const WorkloadResult& r : results) {
    INFO(r.name);
    for (size_t i = 0; i < r.failures.size() && i < 8; ++i) FAIL_CHECK(r.failures[i]);
    if (r.failures.size() > 8) FAIL_CHECK(std::to_string(r.failures.size() - 8) + " more failures");
    CHECK((r.failures.empty() && r.checked > 0));
  }
}

// --- Regression tests: each names the bug the crash suite caught. ----------

// Mounts the standard image on a recording media (returned through *media).
std::unique_ptr<Filesystem> MountStandard(RecordingMedia** media) {
  const BaseImage& image = StandardImage();
  auto owned = std::make_unique<RecordingMedia>(image.bytes.data(), image.bytes.size());
  *media = owned.get();
  auto fs = Filesystem::Mount(std::move(owned), {});
  REQUIRE(fs.ok());
  return std::move(fs.value());
}

// The images a crash at each fence of operation `op` would leave with every
// pending line written (all, the most advanced state at that fence).
struct Captured {
  std::vector<std::vector<std::byte>> images;
  void Attach(RecordingMedia& media, std::string op) {
    media.set_crash_hook([this, op](const RecordingMedia& m, const RecordingMedia::CrashPoint& p) {
      if (p.kind != RecordingMedia::PointKind::kFence || op != p.op) return;
      std::vector<size_t> all;
      for (const auto& [offset, line] : m.pending()) all.push_back(line.writes.size());
      images.push_back(m.CrashImage(all));
    });
  }
};

std::unique_ptr<Filesystem> MountImage(const std::vector<std::byte>& image) {
  RecordingOptions plain;
  plain.record = false;
  auto fs = Filesystem::Mount(std::make_unique<RecordingMedia>(image.data(), image.size(), plain), {});
  INFO((fs.ok() ? std::string() : fs.error().Describe()));
  REQUIRE(fs.ok());
  return std::move(fs.value());
}

TEST_CASE("regression: mount refused a crash image whose dynamic superblock an orphan-list "
          "update had left with a stale checksum", "[crash][regression]") {
  // The orphan list head and the dynamic superblock's checksum are two logged
  // stores of one transaction. Mount checked the checksum before journal
  // recovery, which would have put the old bytes back, and refused to mount.
  RecordingMedia* media;
  auto fs = MountStandard(&media);
  const uint64_t d2 = ResolvePath(*fs, "/d2").value();
  FileHandle file = fs->Open(ResolvePath(*fs, "/d2/g1").value(), O_RDWR).value();
  Captured captured;
  captured.Attach(*media, "unlink");
  REQUIRE(fs->Unlink(d2, "g1").ok());
  media->set_crash_hook(nullptr);
  size_t torn = 0;
  for (const auto& image : captured.images) {
    format::SuperDynamic dyn;
    std::memcpy(&dyn, image.data() + format::kSuperDynamicOffset, sizeof dyn);
    torn += !CheckSuperDynamic(dyn).ok();
    auto crashed = MountImage(image);
    Result<uint64_t> g1 = ResolvePath(*crashed, "/d2/g1");  // the unlink undone, or done
    if (g1.ok()) {
      CHECK(crashed->GetAttr(*g1)->nlink == 1);
    } else {
      CHECK(g1.code() == ENOENT);
    }
    REQUIRE(crashed->Unmount().ok());
  }
  CHECK(torn > 0);  // the case the bug was about occurred
  fs->Release(file);
}

TEST_CASE("regression: truncate up exposed bytes a crashed write had left in blocks "
          "preallocated past the end of the file", "[crash][regression]") {
  // A write past the end stores its data before the transaction that
  // publishes the new size. Resize zeroed only the tail of the old last
  // block, so the data of a write interrupted by a crash, left in blocks
  // fallocate had kept past the end, showed up when the file grew.
  RecordingMedia* media;
  auto fs = MountStandard(&media);
  const uint64_t ino = ResolvePath(*fs, "/d1/f2").value();
  FileHandle file = fs->Open(ino, O_RDWR).value();
  REQUIRE(fs->Fallocate(file, FALLOC_FL_KEEP_SIZE, 0, 16384).ok());
  Captured captured;
  captured.Attach(*media, "write");
  const std::string data(100, 'D');
  REQUIRE(fs->Write(file, 0, data.data(), data.size()).ok());
  media->set_crash_hook(nullptr);
  fs->Release(file);
  REQUIRE_FALSE(captured.images.empty());
  // The first fence: the data is durable, the size is not.
  auto crashed = MountImage(captured.images.front());
  REQUIRE(crashed->GetAttr(ino)->size == 0);
  SetAttrRequest grow;
  grow.valid = kSetSize;
  grow.size = 16384;
  REQUIRE(crashed->SetAttr(ino, grow).ok());
  FileHandle again = crashed->Open(ino, O_RDONLY).value();
  std::string bytes(16384, 'x');
  REQUIRE(crashed->Read(again, 0, bytes.data(), bytes.size()).value() == bytes.size());
  crashed->Release(again);
  CHECK(bytes == std::string(16384, '\0'));
}

TEST_CASE("regression: a long truncation of an unlinked open file took it off the orphan "
          "list, leaking it after a crash", "[crash][regression]") {
  // A truncation that needs several transactions puts the inode on the
  // orphan list and took it off at the end, even when it was there already
  // because it was unlinked while open: a crash before the last release then
  // left an inode no directory and no list names.
  const BaseImage& image = StandardImage(kSmallSlots);
  RecordingOptions plain;
  plain.record = false;
  RecordingMedia media(image.bytes.data(), image.bytes.size(), plain);
  auto fs = Filesystem::Mount(BorrowMedia(media), {}).value();
  Attr attr;
  FileHandle frag = fs->Create(1, "frag", 0644, O_RDWR, {}, &attr).value();
  FileHandle other = fs->Create(1, "other", 0644, O_RDWR, {}, &attr).value();
  const std::string block(4096, 'b');
  for (uint64_t i = 0; i < 160; ++i) {  // interleaved: one free record per block
    REQUIRE(fs->Write(frag, i * 4096, block.data(), block.size()).ok());
    REQUIRE(fs->Write(other, i * 4096, block.data(), block.size()).ok());
  }
  fs->Release(other);
  REQUIRE(fs->Unlink(1, "frag").ok());
  SetAttrRequest cut;
  cut.valid = kSetSize;
  cut.size = 4096;
  REQUIRE(fs->SetAttr(fs->HandleIno(frag), cut).ok());
  // The power fails with the file still open.
  const std::vector<std::byte> crashed(media.base(), media.base() + media.size());
  auto after = MountImage(crashed);
  REQUIRE(DeleteAll(*after).ok());
  const StatFs counts = after->GetStatFs().value();
  CHECK(counts.blocks_free == image.empty_free_blocks);
  CHECK(counts.inodes_free == image.empty_free_inodes);
  fs->Release(frag);
}

// mkfs over an existing nvfs (doc/integrity.md, section 4): at every crash
// point the namespace is either no filesystem at all, or the old one, or the
// new one, possibly needing fsck to restore the primary superblock from its
// backup -- never a mix.
TEST_CASE("crash: mkfs over an old filesystem never leaves a mix of the two", "[crash][mkfs]") {
  const BaseImage& old_image = StandardImage();
  RecordingOptions plain;
  plain.record = false;
  const auto tree_of = [&](const std::vector<std::byte>& bytes) {
    RecordingMedia media(bytes.data(), bytes.size(), plain);
    auto fs = Filesystem::Mount(BorrowMedia(media), {}).value();
    return SnapshotTree(*fs).value();
  };
  const Tree old_tree = tree_of(old_image.bytes);

  RecordingOptions recording;
  recording.keep_log = false;
  RecordingMedia media(old_image.bytes.data(), old_image.bytes.size(), recording);
  std::vector<std::vector<std::byte>> images;
  media.set_crash_hook([&](const RecordingMedia& m, const RecordingMedia::CrashPoint&) {
    std::vector<size_t> all, none;
    for (const auto& [offset, line] : m.pending()) {
      all.push_back(line.writes.size());
      none.push_back(0);
    }
    images.push_back(m.CrashImage(none));
    images.push_back(m.CrashImage(all));
    std::mt19937_64 rng(images.size());
    for (int r = 0; r < 6; ++r) {
      std::vector<size_t> some;
      for (size_t count : all) some.push_back(rng() & 1 ? 1 + rng() % count : 0);
      images.push_back(m.CrashImage(some));
    }
  });
  MkfsOptions options;
  options.dir_hash_key = std::array<uint8_t, 16>{77};
  Result<MkfsPlan> plan = PlanMkfs(media.size(), options);
  REQUIRE(plan.ok());
  REQUIRE(WriteMkfs(media, *plan).ok());
  media.set_crash_hook(nullptr);
  images.emplace_back(media.base(), media.base() + media.size());
  const Tree new_tree = tree_of(images.back());

  size_t invalid = 0, old_fs = 0, new_fs = 0, repaired = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    INFO("crash image " << i);
    std::vector<std::byte>& image = images[i];
    Result<FoundSuper> found = FindSuper(image.data(), image.size());
    if (!found.ok()) {
      ++invalid;
      continue;
    }
    RecordingMedia crashed(image.data(), image.size(), plain);
    std::string said;
    if (found->from_backup) {  // what fsck.nvfs -y does, then mount
      ++repaired;
      const FsckReport report = CheckNamespace(crashed, RepairMode::kYes,
                                               [&](const std::string& line) { said += line + "\n"; });
      INFO(said);
      REQUIRE(report.exit_code <= kFsckCorrected);
    }
    INFO("fsck said:\n" << said);
    auto fs = Filesystem::Mount(BorrowMedia(crashed), {});
    REQUIRE(fs.ok());
    const Tree tree = SnapshotTree(**fs).value();
    if (tree == old_tree) {
      ++old_fs;
    } else {
      std::string paths;
      for (const auto& [path, node] : tree) paths += path + " ";
      INFO(TreeDiff(new_tree, tree) << "\npaths: " << paths);
      CHECK(tree == new_tree);
      ++new_fs;
    }
  }
  std::cout << "crash: mkfs: " << images.size() << " crash images: " << invalid
            << " no filesystem, " << old_fs << " the old one, " << new_fs << " the new one ("
            << repaired << " after fsck restored the primary superblock)" << std::endl;
  CHECK(invalid > 0);
  CHECK(new_fs > 0);
}

TEST_CASE("regression: a torn write of mkfs's new backup superblock brought the old one "
          "back over the new metadata", "[crash][regression]") {
  // mkfs cleared only the magic of the old superblock copies. The new backup
  // goes where the old one was, with the same magic in its first line: a
  // crash that kept that line alone revived the old copy, checksum and all,
  // and fsck then restored the old superblock (old hash seed, uuid) as the
  // primary of the new filesystem.
  const BaseImage& old_image = StandardImage();
  RecordingOptions recording;
  recording.keep_log = false;
  RecordingMedia media(old_image.bytes.data(), old_image.bytes.size(), recording);
  MkfsOptions options;
  options.dir_hash_key = std::array<uint8_t, 16>{77};
  Result<MkfsPlan> plan = PlanMkfs(media.size(), options);
  REQUIRE(plan.ok());
  const uint64_t backup = plan->geometry.BackupSuperOffset();
  std::vector<std::vector<std::byte>> images;
  media.set_crash_hook([&](const RecordingMedia& m, const RecordingMedia::CrashPoint&) {
    if (!m.pending().count(backup)) return;
    std::vector<size_t> prefixes;  // the backup's first line, nothing else
    for (const auto& [offset, line] : m.pending()) {
      prefixes.push_back(offset == backup ? line.writes.size() : 0);
    }
    images.push_back(m.CrashImage(prefixes));
  });
  REQUIRE(WriteMkfs(media, *plan).ok());
  REQUIRE_FALSE(images.empty());
  for (const auto& image : images) {
    // Before anything new is written the old primary may still stand; once
    // it is wiped, a copy found must be the new one.
    Result<FoundSuper> found = FindSuper(image.data(), image.size());
    if (found.ok() && found->from_backup) CHECK(found->sb.dir_hash_key[0] == 77);
  }
}

TEST_CASE("regression: a punch hole with partial 64 KiB edge blocks failed with ENOSPC",
          "[crash][regression]") {
  // The bytes zeroed in the partial blocks at the edges of a punched range
  // were logged as one undo record each, as large as the range: past the
  // journal slot's 64 KiB, the punch failed. They are now zeroed like data.
  const ImageSpec big_blocks{16ull << 20, 0, 65536};
  const BaseImage& image = StandardImage(big_blocks);
  RecordingMedia* media;
  auto owned = std::make_unique<RecordingMedia>(image.bytes.data(), image.bytes.size());
  media = owned.get();
  auto fs = Filesystem::Mount(std::move(owned), {}).value();
  const uint64_t ino = ResolvePath(*fs, "/big").value();
  FileHandle file = fs->Open(ino, O_RDWR).value();
  std::string before(fs->GetAttr(ino)->size, '\0');
  const uint64_t blocks_before = fs->GetAttr(ino)->blocks;
  REQUIRE(fs->Read(file, 0, before.data(), before.size()).value() == before.size());
  const uint64_t offset = 1000, len = 150000;
  REQUIRE(fs->Fallocate(file, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, len).ok());
  std::string after(before.size(), 'x');
  REQUIRE(fs->Read(file, 0, after.data(), after.size()).value() == after.size());
  fs->Release(file);
  std::string expected = before;
  std::fill(expected.begin() + offset, expected.begin() + offset + len, '\0');
  CHECK(after == expected);
  CHECK(fs->GetAttr(ino)->blocks == blocks_before - 65536 / 512);  // the whole block in between
  for (const auto& v : media->violations()) FAIL_CHECK(v.Describe());  // and it all persisted
}

TEST_CASE("crash: every metadata operation", "[crash][meta]") {
  Report(RunWorkloads("metadata", MetadataWorkloads()));
}

TEST_CASE("crash: data writes", "[crash][data]") {
  Report(RunWorkloads("data", DataWorkloads()));
}

TEST_CASE("crash: directory growth and shrinking", "[crash][dir]") {
  REQUIRE(NamesBeforeSplit() > 0);
  Report(RunWorkloads("directories", DirectoryWorkloads()));
}

TEST_CASE("crash: long truncations, orphans and small journal slots", "[crash][long]") {
  Report(RunWorkloads("long", LongWorkloads()));
}

TEST_CASE("crash: direct writers' writes", "[crash][dwrite]") {
  Report(RunWorkloads("direct writes", DirectWriteWorkloads()));
}

TEST_CASE("crash: direct writers' appends by word", "[crash][words]") {
  Report(RunWorkloads("appends by word", AppendWordWorkloads()));
}

TEST_CASE("crash: 64 KiB blocks", "[crash][data]") {
  Report(RunWorkloads("64 KiB blocks", LargeBlockWorkloads()));
}

TEST_CASE("crash: seeded two-operation sequences", "[crash][seq]") {
  Report(RunWorkloads("sequences", SequenceWorkloads()));
}

TEST_CASE("crash: offline grow", "[crash][grow]") {
  Report(RunWorkloads("grow", GrowWorkloads()));
}

}  // namespace
}  // namespace nvfs::test

namespace nvfs::test {
namespace {

TEST_CASE("crash: operations in flight on two and three threads", "[crash][threaded]") {
  const std::vector<ConcurrentResult> results = RunConcurrentWorkloads(ConcurrentWorkloads());
  for (const ConcurrentResult& r : results) {
    INFO(r.name);
    for (size_t i = 0; i < r.failures.size() && i < 8; ++i) FAIL_CHECK(r.failures[i]);
    if (r.failures.size() > 8) FAIL_CHECK(std::to_string(r.failures.size() - 8) + " more failures");
    CHECK((r.failures.empty() && r.checked > 0 && r.switches > 0));
  }
}

}  // namespace
}  // namespace nvfs::test
