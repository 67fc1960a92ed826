// fsck.nvfs against fresh, damaged, foreign and broken namespaces: the exit
// codes fsck(8) defines, -n never writing, repairs that leave a clean
// namespace behind, and refusals that are one clear line.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "nvfs/fsck.hpp"
#include "nvfs/media.hpp"
#include "nvfs/mkfs.hpp"
#include "nvfs/superblock.hpp"
#include "test_util.hpp"

namespace nvfs {
namespace {

using test::DigestFile;
using test::FileDigest;
using test::FlipByte;
using test::Lines;
using test::MakeFile;
using test::ReadAt;
using test::Run;
using test::RunResult;
using test::TempPath;
using test::WriteAt;

constexpr uint64_t kMiB = 1024 * 1024;

RunResult Fsck(const std::vector<std::string>& args) { return Run("NVFS_FSCK", args); }

void MakeNvfsImage(const std::string& path, const std::string& size = "64M",
                   const std::string& block_size = "4k") {
  const RunResult r = Run("NVFS_MKFS", {"-q", "-b", block_size, "-s", size, path});
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
}

// The geometry of a healthy image, read through the library.
Geometry GeometryOf(const std::string& path) {
  MediaOptions options;
  options.read_only = true;
  auto media = OpenMedia(path, options);
  REQUIRE(media.ok());
  Result<FoundSuper> found = FindSuper((*media)->base(), (*media)->size());
  REQUIRE(found.ok());
  REQUIRE_FALSE(found->from_backup);
  return found->geometry;
}

format::SuperStatic ReadStatic(const std::string& path, uint64_t offset) {
  format::SuperStatic sb;
  const std::vector<char> bytes = ReadAt(path, offset, sizeof sb);
  std::memcpy(&sb, bytes.data(), sizeof sb);
  return sb;
}

void WriteStatic(const std::string& path, uint64_t offset, const format::SuperStatic& sb) {
  WriteAt(path, offset, &sb, sizeof sb);
}

// fsck -n: exit 0, says clean.
void RequireClean(const std::string& path) {
  const RunResult r = Fsck({"-n", path});
  INFO(r.out);
  CHECK(r.exit_code == kFsckClean);
  CHECK_THAT(r.out, Catch::Contains(path + ": clean"));
}

// The story every repairable damage follows: -n finds it (exit 4) and writes
// nothing; `repair` (-p or -y) fixes it (exit 1); then -n finds nothing.
void RequireFoundThenRepaired(const std::string& path, const std::string& finding,
                              const std::string& repair = "-y") {
  const FileDigest damaged = DigestFile(path);
  const RunResult check = Fsck({"-n", path});
  INFO("fsck -n:\n" << check.out);
  CHECK(check.exit_code == kFsckUncorrected);
  CHECK_THAT(check.out, Catch::Contains(finding));
  CHECK_THAT(check.out, Catch::Contains("not fixed (-n)"));
  CHECK_THAT(check.out, Catch::Contains("ERRORS LEFT UNCORRECTED"));
  REQUIRE(DigestFile(path) == damaged);

  const RunResult fix = Fsck({repair, path});
  INFO("fsck " << repair << ":\n" << fix.out);
  CHECK(fix.exit_code == kFsckCorrected);
  CHECK_THAT(fix.out, Catch::Contains(finding));
  CHECK_THAT(fix.out, Catch::Contains("errors corrected"));

  const RunResult after = Fsck({"-n", path});
  INFO("fsck -n after the repair:\n" << after.out);
  CHECK(after.exit_code == kFsckClean);
  CHECK_THAT(after.out, Catch::Contains(path + ": clean"));
}

TEST_CASE("fsck on a fresh namespace: clean, and -p/-y write nothing", "[fsck]") {
  for (const char* block_size : {"4k", "64k", "1M"}) {
    SECTION(std::string("block size ") + block_size) {
      TempPath image("fresh");
      MakeNvfsImage(image.path(), "64M", block_size);
      const FileDigest before = DigestFile(image.path());
      RequireClean(image.path());
      for (const char* mode : {"-p", "-a", "-y", "-f"}) {
        const RunResult r = Fsck({mode, image.path()});
        INFO(mode << ":\n" << r.out);
        CHECK(r.exit_code == kFsckClean);
      }
      const RunResult verbose = Fsck({"-n", "-v", image.path()});
      CHECK_THAT(verbose.out, Catch::Contains("0 problems found, 0 corrected"));
      CHECK(DigestFile(image.path()) == before);
    }
  }
}

TEST_CASE("CheckNamespace reports counts and progress per group", "[fsck]") {
  TempPath image("library");
  MakeNvfsImage(image.path(), "300M");
  const Geometry g = GeometryOf(image.path());
  MediaOptions options;
  options.read_only = true;
  auto media = OpenMedia(image.path(), options);
  REQUIRE(media.ok());
  uint64_t calls = 0;
  std::vector<std::string> lines;
  const FsckReport report = CheckNamespace(
      **media, RepairMode::kNone, [&](const std::string& l) { lines.push_back(l); },
      [&](uint64_t done, uint64_t total) {
        ++calls;
        CHECK(done == calls);
        CHECK(total == g.group_count());
      });
  CHECK(report.exit_code == kFsckClean);
  CHECK(lines.empty());
  CHECK(calls == 3);
  CHECK(report.inode_count == g.inode_count());
  CHECK(report.block_count == g.block_count());
  CHECK(report.inodes_used == 3);
  CHECK(report.clean_state);
}

TEST_CASE("fsck: a damaged primary superblock is read from the backup and restored",
          "[fsck][super]") {
  // Offsets in the static half: magic, block size, a reserved byte, checksum.
  for (uint64_t offset : {uint64_t{0}, uint64_t{40}, uint64_t{1000}, uint64_t{2044}}) {
    SECTION("byte " + std::to_string(offset)) {
      TempPath image("primary");
      MakeNvfsImage(image.path());
      const Geometry g = GeometryOf(image.path());
      const std::vector<char> good = ReadAt(image.path(), 0, format::kSuperHalfSize);
      FlipByte(image.path(), offset);

      const RunResult warn = Fsck({"-n", image.path()});
      INFO(warn.out);
      CHECK_THAT(warn.out, Catch::Contains("primary superblock is damaged"));
      CHECK_THAT(warn.out, Catch::Contains("using the backup copy at byte " +
                                           std::to_string(g.BackupSuperOffset())));
      RequireFoundThenRepaired(image.path(), "primary superblock damaged");
      CHECK(ReadAt(image.path(), 0, format::kSuperHalfSize) == good);
    }
  }
}

TEST_CASE("fsck: a zeroed block 0 is recovered from the backup", "[fsck][super]") {
  for (const char* block_size : {"4k", "64k"}) {
    SECTION(std::string("block size ") + block_size) {
      TempPath image("block0");
      MakeNvfsImage(image.path(), "64M", block_size);
      const Geometry g = GeometryOf(image.path());
      const std::vector<char> good = ReadAt(image.path(), 0, format::kSuperHalfSize);
      const std::vector<char> zeros(g.block_size(), 0);
      WriteAt(image.path(), 0, zeros.data(), zeros.size());
      // The static half comes back from the backup; the dynamic half, which
      // has no copy, is rebuilt (and marked not clean, so the next mount recounts).
      RequireFoundThenRepaired(image.path(), "primary superblock damaged");
      CHECK(ReadAt(image.path(), 0, format::kSuperHalfSize) == good);
      const RunResult after = Fsck({"-n", image.path()});
      CHECK_THAT(after.out, Catch::Contains("not cleanly unmounted"));
    }
  }
}

TEST_CASE("fsck: the backup is found where a short last group was dropped", "[fsck][super]") {
  TempPath image("dropped");
  // Two whole 128 MiB groups and 7 blocks, too few for a third group.
  MakeNvfsImage(image.path(), std::to_string(256 * kMiB + 7 * 4096));
  const Geometry g = GeometryOf(image.path());
  REQUIRE(g.group_count() == 2);
  REQUIRE(g.BackupSuperOffset() == 256 * kMiB - format::kSuperHalfSize);
  FlipByte(image.path(), 8);
  const RunResult warn = Fsck({"-n", image.path()});
  INFO(warn.out);
  CHECK_THAT(warn.out, Catch::Contains("using the backup copy at byte " +
                                       std::to_string(g.BackupSuperOffset())));
  RequireFoundThenRepaired(image.path(), "primary superblock damaged");
}

TEST_CASE("fsck: a damaged backup superblock is rewritten from the primary", "[fsck][super]") {
  for (const char* repair : {"-p", "-y"}) {
    SECTION(repair) {
      TempPath image("backup");
      MakeNvfsImage(image.path());
      const Geometry g = GeometryOf(image.path());
      FlipByte(image.path(), g.BackupSuperOffset() + 500);
      RequireFoundThenRepaired(image.path(), "is damaged", repair);
      CHECK(ReadAt(image.path(), g.BackupSuperOffset(), format::kSuperHalfSize) ==
            ReadAt(image.path(), 0, format::kSuperHalfSize));
    }
  }
  SECTION("valid but different") {
    TempPath image("backup-differs");
    MakeNvfsImage(image.path());
    const Geometry g = GeometryOf(image.path());
    format::SuperStatic sb = ReadStatic(image.path(), g.BackupSuperOffset());
    sb.label[0] = 'X';
    sb.checksum = SuperStaticChecksum(sb);
    WriteStatic(image.path(), g.BackupSuperOffset(), sb);
    RequireFoundThenRepaired(image.path(), "differs from the primary");
  }
}

TEST_CASE("fsck: a damaged dynamic superblock is rebuilt", "[fsck][super]") {
  TempPath image("dynamic");
  MakeNvfsImage(image.path());
  FlipByte(image.path(), format::kSuperDynamicOffset + 48);  // free_inodes
  RequireFoundThenRepaired(image.path(), "dynamic superblock: checksum mismatch");
}

TEST_CASE("fsck: a damaged group descriptor is detected and repaired", "[fsck][group]") {
  TempPath image("desc");
  MakeNvfsImage(image.path(), "300M");  // three groups
  const Geometry g = GeometryOf(image.path());
  SECTION("checksum of group 0") {
    FlipByte(image.path(), g.BlockOffset(g.GroupDescBlock(0)) + 60);
    RequireFoundThenRepaired(image.path(), "group 0: descriptor damaged");
  }
  SECTION("magic of the last group") {
    FlipByte(image.path(), g.BlockOffset(g.GroupDescBlock(2)));
    RequireFoundThenRepaired(image.path(), "group 2: descriptor damaged");
  }
  SECTION("a wrong free count with a valid checksum") {
    const uint64_t offset = g.BlockOffset(g.GroupDescBlock(1));
    format::GroupDesc desc;
    std::memcpy(&desc, ReadAt(image.path(), offset, sizeof desc).data(), sizeof desc);
    desc.free_blocks -= 5;
    desc.checksum = GroupDescChecksum(desc);
    WriteAt(image.path(), offset, &desc, sizeof desc);
    RequireFoundThenRepaired(image.path(), "group 1: descriptor counts");
  }
}

TEST_CASE("fsck: damage it cannot repair yet is reported, not claimed fixed", "[fsck]") {
  TempPath image("unfixable");
  MakeNvfsImage(image.path());
  const Geometry g = GeometryOf(image.path());
  SECTION("a reserved block-bitmap bit cleared") {
    FlipByte(image.path(), g.BlockOffset(g.BlockBitmapBlock(0)), 0x01);  // the superblock's bit
    const RunResult r = Fsck({"-y", image.path()});
    INFO(r.out);
    CHECK(r.exit_code == kFsckUncorrected);
    CHECK_THAT(r.out, Catch::Contains("group 0: 1 reserved bitmap bits are clear"));
    CHECK_THAT(r.out, !Catch::Contains("clear: fixing"));
  }
  SECTION("a journal slot header") {
    FlipByte(image.path(), g.JournalSlotOffset(3));
    const FileDigest before = DigestFile(image.path());
    const RunResult r = Fsck({"-y", image.path()});
    INFO(r.out);
    CHECK(r.exit_code == kFsckUncorrected);
    CHECK_THAT(r.out, Catch::Contains("journal slot 3: header damaged"));
    CHECK_THAT(r.out, !Catch::Contains("damaged: fixing"));
    CHECK(DigestFile(image.path()) == before);
  }
}

TEST_CASE("fsck refuses unknown incompatible features without using the backup",
          "[fsck][super]") {
  TempPath image("incompat");
  MakeNvfsImage(image.path());
  format::SuperStatic sb = ReadStatic(image.path(), 0);
  sb.feature_incompat |= uint64_t{1} << 17;
  sb.checksum = SuperStaticChecksum(sb);
  WriteStatic(image.path(), 0, sb);  // the backup still says "no features"
  const FileDigest before = DigestFile(image.path());
  for (const char* mode : {"-n", "-p", "-y"}) {
    const RunResult r = Fsck({mode, image.path()});
    INFO(mode << ":\n" << r.out);
    CHECK(r.exit_code == kFsckOperational);
    CHECK(Lines(r.out).size() == 1);
    CHECK_THAT(r.out, Catch::Contains("unknown incompatible features 0x20000"));
    CHECK_THAT(r.out, !Catch::Contains("backup"));
    CHECK(DigestFile(image.path()) == before);
  }
  // Through the library too: FindSuper refuses rather than fall back.
  MediaOptions options;
  options.read_only = true;
  auto media = OpenMedia(image.path(), options);
  REQUIRE(media.ok());
  Result<FoundSuper> found = FindSuper((*media)->base(), (*media)->size());
  REQUIRE_FALSE(found.ok());
  CHECK(found.error().code == EPROTONOSUPPORT);
}

TEST_CASE("fsck refuses another major version without using the backup", "[fsck][super]") {
  TempPath image("version");
  MakeNvfsImage(image.path());
  format::SuperStatic sb = ReadStatic(image.path(), 0);
  sb.version_major = format::kVersionMajor + 1;
  sb.checksum = SuperStaticChecksum(sb);
  WriteStatic(image.path(), 0, sb);
  const FileDigest before = DigestFile(image.path());
  const RunResult r = Fsck({"-y", image.path()});
  INFO(r.out);
  CHECK(r.exit_code == kFsckOperational);
  CHECK_THAT(r.out, Catch::Contains("unsupported nvfs format version 2.0"));
  CHECK(DigestFile(image.path()) == before);
}

TEST_CASE("fsck checks but will not repair unknown read-only features", "[fsck][super]") {
  TempPath image("rocompat");
  MakeNvfsImage(image.path());
  const Geometry g = GeometryOf(image.path());
  format::SuperStatic sb = ReadStatic(image.path(), 0);
  sb.feature_ro_compat |= 2;
  sb.checksum = SuperStaticChecksum(sb);
  WriteStatic(image.path(), 0, sb);
  WriteStatic(image.path(), g.BackupSuperOffset(), sb);
  const FileDigest before = DigestFile(image.path());
  RequireClean(image.path());
  const RunResult r = Fsck({"-y", image.path()});
  INFO(r.out);
  CHECK(r.exit_code == kFsckOperational);
  CHECK_THAT(r.out, Catch::Contains("read-only-compatible features 0x2"));
  CHECK(DigestFile(image.path()) == before);
}

TEST_CASE("fsck on what is not an nvfs: one clear line, no crash", "[fsck]") {
  TempPath image("garbage");
  SECTION("random bytes") {
    MakeFile(image.path(), 16 * kMiB);
    std::mt19937_64 rng(12345);
    std::vector<uint64_t> words(16 * kMiB / 8);
    for (auto& w : words) w = rng();
    WriteAt(image.path(), 0, words.data(), 16 * kMiB);
  }
  SECTION("all zero") { MakeFile(image.path(), 16 * kMiB); }
  SECTION("a foreign filesystem") {
    MakeFile(image.path(), 16 * kMiB);
    WriteAt(image.path(), 0, "XFSB", 4);
  }
  SECTION("smaller than a block") { MakeFile(image.path(), 3000, 'g'); }
  SECTION("empty") { MakeFile(image.path(), 0); }
  const FileDigest before = DigestFile(image.path());
  for (const char* mode : {"-n", "-y"}) {
    const RunResult r = Fsck({mode, image.path()});
    INFO(mode << ":\n" << r.out);
    CHECK((r.exit_code == kFsckUncorrected || r.exit_code == kFsckOperational));
    CHECK(Lines(r.out).size() == 1);
    CHECK_THAT(r.out, Catch::StartsWith("fsck.nvfs: ") || Catch::StartsWith(image.path()));
    CHECK(DigestFile(image.path()) == before);
  }
}

TEST_CASE("fsck on a truncated image: a clear message, no crash", "[fsck]") {
  TempPath image("truncated");
  MakeNvfsImage(image.path(), "256M");
  REQUIRE(truncate(image.path().c_str(), 128 * kMiB) == 0);
  const FileDigest before = DigestFile(image.path());
  for (const char* mode : {"-n", "-y"}) {
    const RunResult r = Fsck({mode, image.path()});
    INFO(mode << ":\n" << r.out);
    CHECK(r.exit_code == kFsckUncorrected);
    CHECK(Lines(r.out).size() == 1);
    CHECK_THAT(r.out, Catch::Contains("truncated image"));
    CHECK_THAT(r.out, Catch::Contains("65536 blocks"));
    CHECK(DigestFile(image.path()) == before);
  }
}

TEST_CASE("fsck usage errors exit 16, operational errors 8", "[fsck][cli]") {
  TempPath image("usage");
  MakeNvfsImage(image.path());
  const FileDigest before = DigestFile(image.path());
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"-n", "-y", image.path()}, {"-p", "-y", image.path()},
        {"-n", "-a", image.path()}, {}, {"-n"}, {image.path(), image.path()},
        {"-Z", image.path()}}) {
    const RunResult r = Fsck(args);
    INFO(r.out);
    CHECK(r.exit_code == kFsckUsage);
    CHECK_THAT(r.out, Catch::Contains("Usage: fsck.nvfs"));
  }
  CHECK(DigestFile(image.path()) == before);

  TempPath missing("usage-missing");
  RunResult r = Fsck({"-n", missing.path()});
  INFO(r.out);
  CHECK(r.exit_code == kFsckOperational);
  CHECK(Lines(r.out).size() == 1);
  CHECK_THAT(r.out, Catch::Contains(missing.path() + ": no such file"));
  CHECK_FALSE(test::PathExists(missing.path()));
  r = Fsck({"-y", missing.path()});
  CHECK(r.exit_code == kFsckOperational);
  CHECK_FALSE(test::PathExists(missing.path()));

  TempPath dir("usage-dir");
  REQUIRE(mkdir(dir.path().c_str(), 0755) == 0);
  r = Fsck({"-n", dir.path()});
  CHECK(r.exit_code == kFsckOperational);
  CHECK_THAT(r.out, Catch::Contains("not a regular file"));

  for (const char* flag : {"--help", "-h"}) {
    r = Fsck({flag});
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::StartsWith("Usage: fsck.nvfs"));
  }
  r = Fsck({"--version"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == std::string("fsck.nvfs ") + NVFS_VERSION + "\n");
}

TEST_CASE("fsck refuses a namespace in use", "[fsck][lock]") {
  TempPath image("busy");
  MakeNvfsImage(image.path());
  auto held = OpenMedia(image.path(), MediaOptions{});
  REQUIRE(held.ok());
  for (const char* mode : {"-n", "-y"}) {
    const RunResult r = Fsck({mode, image.path()});
    INFO(r.out);
    CHECK(r.exit_code == kFsckOperational);
    CHECK(Lines(r.out).size() == 1);
    CHECK_THAT(r.out, Catch::Contains("in use"));
  }
  held->reset();
  RequireClean(image.path());
}

}  // namespace
}  // namespace nvfs
