// fsck.nvfs against fresh, damaged, foreign and broken namespaces: the exit
// codes fsck(8) defines, -n never writing, repairs that leave a clean
// namespace behind, and refusals that are one clear line.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cinttypes>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fs_fixture.hpp"
#include "fs_image.hpp"
#include "helpers.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/media.hpp"
#include "nvfs/mkfs.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs {
namespace {

using test::DigestFile;
using test::FileDigest;
using test::FlipByte;
using test::Lines;
using test::MakeFile;
using test::ReadAt;
using test::ReadFile;
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

// Applies `edit` to the superblock at `offset` and makes its checksum right
// again, as a tool of another version would have written it.
template <typename Edit>
void EditStatic(const std::string& path, uint64_t offset, Edit edit) {
  format::SuperStatic sb = ReadStatic(path, offset);
  edit(sb);
  sb.checksum = SuperStaticChecksum(sb);
  WriteStatic(path, offset, sb);
}

// fsck.nvfs `mode` on an image it must leave as it is: exit `exit_code`,
// `says` in its output. Its result, for more checks.
RunResult RequireUnwritten(const std::string& path, const std::string& mode, int exit_code,
                           const std::string& says) {
  const FileDigest before = DigestFile(path);
  const RunResult r = Fsck({mode, path});
  INFO(r.out);
  CHECK(r.exit_code == exit_code);
  CHECK_THAT(r.out, Catch::Contains(says));
  CHECK(DigestFile(path) == before);
  return r;
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
  uint64_t calls = 0, last = 0;
  std::vector<std::string> lines;
  const FsckReport report = CheckNamespace(
      **media, RepairMode::kNone, [&](const std::string& l) { lines.push_back(l); },
      [&](uint64_t done, uint64_t total) {
        ++calls;
        CHECK(done > last);  // advances with every call
        last = done;
        CHECK(total == 2 * g.group_count());  // inode pass, then directory pass
      });
  CHECK(report.exit_code == kFsckClean);
  CHECK(lines.empty());
  CHECK(calls >= g.group_count());
  CHECK(last == 2 * g.group_count());
  CHECK(report.inodes_checked == 2);  // root and lost+found
  CHECK(report.directories == 2);
  CHECK(report.entries == 1);
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
    EditStatic(image.path(), g.BackupSuperOffset(),
               [](format::SuperStatic& sb) { sb.label[0] = 'X'; });
    RequireFoundThenRepaired(image.path(), "differs from the primary");
  }
}

// Two valid copies that differ in the directory hash key: the one the root's
// entries were hashed with is kept (RootKeyAgreement walks the root's
// leaves with WalkDirLeaf).
TEST_CASE("fsck: a primary superblock with a hash key the root's entries do not agree with is "
          "restored from the backup", "[fsck][super]") {
  TempPath image("key-differs");
  MakeNvfsImage(image.path());
  const Geometry g = GeometryOf(image.path());
  format::SuperStatic sb = ReadStatic(image.path(), 0);
  sb.dir_hash_key[0] ^= 1;
  sb.checksum = SuperStaticChecksum(sb);
  WriteStatic(image.path(), 0, sb);
  RequireFoundThenRepaired(image.path(), "holds a directory hash key the root directory's "
                           "entries do not agree with");
  CHECK(ReadAt(image.path(), 0, format::kSuperHalfSize) ==
        ReadAt(image.path(), g.BackupSuperOffset(), format::kSuperHalfSize));
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

TEST_CASE("fsck: damaged fixed metadata is repaired", "[fsck]") {
  TempPath image("fixed-meta");
  MakeNvfsImage(image.path());
  const Geometry g = GeometryOf(image.path());
  SECTION("a reserved block-bitmap bit cleared: -p sets it again") {
    FlipByte(image.path(), g.BlockOffset(g.BlockBitmapBlock(0)), 0x01);  // the superblock's bit
    RequireFoundThenRepaired(image.path(), "group 0: block bitmap: 0 blocks in use but not "
                             "referenced (leaked), 1 referenced but free: +0", "-p");
  }
  SECTION("a journal slot header: -p stops, -y rewrites it idle") {
    FlipByte(image.path(), g.JournalSlotOffset(3));
    RequireUnwritten(image.path(), "-p", kFsckUncorrected,
                     "journal slot 3: header damaged: not fixed (needs a decision; run "
                     "fsck.nvfs -y)");
    RequireFoundThenRepaired(image.path(), "journal slot 3: header damaged");
  }
}

TEST_CASE("fsck refuses unknown incompatible features without using the backup",
          "[fsck][super]") {
  TempPath image("incompat");
  MakeNvfsImage(image.path());
  // The backup still says "no features".
  EditStatic(image.path(), 0,
             [](format::SuperStatic& sb) { sb.feature_incompat |= uint64_t{1} << 17; });
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
  EditStatic(image.path(), 0, [](format::SuperStatic& sb) {
    sb.version_major = format::kVersionMajor + 1;
    sb.version_minor = 0;
  });
  RequireUnwritten(image.path(), "-y", kFsckOperational,
                   "unsupported nvfs format version " +
                       std::to_string(format::kVersionMajor + 1) + ".0");
}

TEST_CASE("fsck and mount refuse a version 1 image (the steerable hash) in one line",
          "[fsck][super]") {
  TempPath image("version1");
  MakeNvfsImage(image.path());
  EditStatic(image.path(), 0, [](format::SuperStatic& sb) {
    sb.version_major = 1;
    sb.version_minor = 0;
  });
  RequireUnwritten(image.path(), "-y", kFsckOperational, "nvfs format 1.0 is no longer supported");
  Result<std::unique_ptr<Filesystem>> fs = Filesystem::Mount(image.path(), MountOptions{});
  REQUIRE_FALSE(fs.ok());
  CHECK(fs.error().code == EPROTONOSUPPORT);
  CHECK_THAT(fs.error().message, Catch::Contains("re-create the filesystem"));
  CHECK(fs.error().message.find('\n') == std::string::npos);
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
        {"-Z", image.path()}, {"-j", "0", image.path()}, {"-j", "two", image.path()}}) {
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


// ---------------------------------------------------------------------------
// The tree check: damage made by hand in a populated namespace, each kind
// found by -n (exit 4, nothing written), repaired by -p or -y (exit 1), then
// clean (exit 0), and the repaired namespace mounts and reads.
// ---------------------------------------------------------------------------

const Cred kCred{1000, 1000};

// A namespace with a bit of everything, unmounted cleanly.
struct Populated {
  test::FsImage image{64 << 20};
  Geometry g;
  uint64_t small = 0;    // 3 data blocks
  uint64_t medium = 0;   // 20 blocks: direct and a depth-1 tree
  uint64_t sparse = 0;   // one block deep in the depth-2 tree
  uint64_t dir = 0;      // /d, holding f1..f3 and sub/
  uint64_t sub = 0;      // /d/sub, holding leaf
  uint64_t f1 = 0;       // /d/f1, also linked as /d/f1-link
  uint64_t f2 = 0;
  uint64_t leaf = 0;     // /d/sub/leaf
  uint64_t with_xattr = 0;
  uint64_t short_link = 0, long_link = 0;

  Populated() {
    Filesystem& fs = image.fs();
    const std::string block(4096, 'x');
    small = Create(1, "small", std::string(3 * 4096, 's'));
    medium = Create(1, "medium", std::string(20 * 4096, 'm'));
    sparse = Create(1, "sparse", "");
    WriteAt(sparse, (11 + 512 + 700) * 4096ull, block);
    dir = Mkdir(1, "d");
    f1 = Create(dir, "f1", "one");
    f2 = Create(dir, "f2", "two");
    Create(dir, "f3", "three");
    REQUIRE(fs.Link(f1, dir, "f1-link").ok());
    fs.Forget(f1, 1);
    sub = Mkdir(dir, "sub");
    leaf = Create(sub, "leaf", "leaf");
    with_xattr = Create(1, "xattr", "x");
    REQUIRE(fs.SetXattr(with_xattr, "user.color", "blue", 4, 0).ok());
    auto s1 = fs.Symlink(1, "short-link", "small", kCred);
    REQUIRE(s1.ok());
    short_link = s1->ino;
    fs.Forget(short_link, 1);
    auto s2 = fs.Symlink(1, "long-link", std::string(300, 'L'), kCred);
    REQUIRE(s2.ok());
    long_link = s2->ino;
    fs.Forget(long_link, 1);
    image.Unmount();
    g = GeometryOf(path());
  }

  const std::string& path() const { return image.path(); }

  uint64_t Create(uint64_t parent, const std::string& name, const std::string& content) {
    Filesystem& fs = image.fs();
    Attr attr;
    auto f = fs.Create(parent, name, 0644, O_RDWR, kCred, &attr);
    REQUIRE(f.ok());
    if (!content.empty()) REQUIRE(fs.Write(*f, 0, content.data(), content.size()).ok());
    fs.Release(*f);
    fs.Forget(attr.ino, 1);
    return attr.ino;
  }
  void WriteAt(uint64_t ino, uint64_t offset, const std::string& content) {
    Filesystem& fs = image.fs();
    auto f = fs.Open(ino, O_RDWR);
    REQUIRE(f.ok());
    REQUIRE(fs.Write(*f, offset, content.data(), content.size()).ok());
    fs.Release(*f);
  }
  uint64_t Mkdir(uint64_t parent, const std::string& name) {
    auto a = image.fs().Mkdir(parent, name, 0755, kCred);
    REQUIRE(a.ok());
    image.fs().Forget(a->ino, 1);
    return a->ino;
  }

  // Raw access to the image.
  format::Inode Inode(uint64_t ino) const {
    format::Inode inode;
    std::memcpy(&inode, ReadAt(path(), g.InodeOffset(ino), sizeof inode).data(), sizeof inode);
    return inode;
  }
  void PutInode(uint64_t ino, const format::Inode& inode) const {
    test::WriteAt(path(), g.InodeOffset(ino), &inode, sizeof inode);
  }
  template <class T>
  void Put(uint64_t offset, const T& value) const {
    test::WriteAt(path(), offset, &value, sizeof value);
  }
  template <class T>
  T Get(uint64_t offset) const {
    T value;
    std::memcpy(&value, ReadAt(path(), offset, sizeof value).data(), sizeof value);
    return value;
  }
  // Media offset of the record naming `name` in `dir`, whose tree is one leaf.
  uint64_t Record(uint64_t dir_ino, const std::string& name) const {
    const format::Inode d = Inode(dir_ino);
    REQUIRE(d.map.dir.root != 0);
    REQUIRE((d.map.dir.root & format::kDirNodeIndexBit) == 0);
    const uint64_t leaf_at = g.BlockOffset(d.map.dir.root);
    const std::vector<char> bytes = ReadAt(path(), leaf_at, g.block_size());
    for (const test::LeafRecord& r :
         test::ParseDirLeaf(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size())) {
      if (r.entry.ino != 0 && r.name == name) return leaf_at + r.offset;
    }
    FAIL("no entry " << name);
    return 0;
  }
  uint64_t DirLeaf(uint64_t dir_ino) const { return Inode(dir_ino).map.dir.root; }
  void SetBlockBit(uint64_t block_no, bool value) const {
    const uint32_t group = static_cast<uint32_t>(block_no / g.blocks_per_group());
    const uint64_t bit = block_no % g.blocks_per_group();
    const uint64_t at = g.BlockOffset(g.BlockBitmapBlock(group)) + bit / 8;
    uint8_t byte = Get<uint8_t>(at);
    byte = value ? (byte | (1u << (bit % 8))) : (byte & ~(1u << (bit % 8)));
    Put(at, byte);
  }
  // The first block past everything in use in group 0.
  uint64_t FreeBlock() const {
    const std::vector<char> bitmap =
        ReadAt(path(), g.BlockOffset(g.BlockBitmapBlock(0)), g.block_size());
    for (uint64_t b = g.FirstDataBlock(0); b < g.GroupBlocks(0); ++b) {
      if (!(bitmap[b / 8] & (1 << (b % 8)))) return b + 10;
    }
    FAIL("group 0 full");
    return 0;
  }
};

// Mounts the image, walks every directory from the root and reads every
// file: what fsck leaves must be usable.
void RequireUsable(const std::string& path, std::vector<std::string>* names = nullptr) {
  auto mounted = Filesystem::Mount(path, MountOptions{});
  REQUIRE(mounted.ok());
  Filesystem& fs = **mounted;
  std::vector<std::pair<uint64_t, std::string>> todo{{1, ""}};
  while (!todo.empty()) {
    const auto [dir, prefix] = todo.back();
    todo.pop_back();
    std::vector<Filesystem::DirEntry> entries;
    std::vector<std::string> storage;
    Status st = fs.ReadDir(dir, 0, [&](const Filesystem::DirEntry& e, uint64_t) {
      storage.emplace_back(e.name);
      entries.push_back({{}, e.ino, e.type});
      return true;
    });
    REQUIRE(st.ok());
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string& name = storage[i];
      if (name == "." || name == "..") continue;
      if (names) names->push_back(prefix + "/" + name);
      auto attr = fs.Lookup(dir, name);
      REQUIRE(attr.ok());
      if (S_ISDIR(attr->mode)) {
        todo.push_back({attr->ino, prefix + "/" + name});
      } else if (S_ISREG(attr->mode)) {
        auto f = fs.Open(attr->ino, O_RDONLY);
        REQUIRE(f.ok());
        std::string data(attr->size, '\0');
        auto n = fs.Read(*f, 0, data.data(), data.size());
        fs.Release(*f);
        REQUIRE(n.ok());
      } else if (S_ISLNK(attr->mode)) {
        REQUIRE(fs.Readlink(attr->ino).ok());
      }
      fs.Forget(attr->ino, 1);
    }
  }
  REQUIRE(fs.Unmount().ok());
}

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST_CASE("fsck on a populated namespace: clean, and nothing written", "[fsck][tree]") {
  Populated p;
  RequireClean(p.path());
  const FileDigest before = DigestFile(p.path());
  for (const char* mode : {"-p", "-y"}) {
    const RunResult r = Fsck({mode, "-v", p.path()});
    INFO(r.out);
    CHECK(r.exit_code == kFsckClean);
    CHECK_THAT(r.out, Catch::Contains("0 problems found"));
    CHECK_THAT(r.out, Catch::Contains("inodes/s"));
  }
  CHECK(DigestFile(p.path()) == before);
}

TEST_CASE("fsck: a leaked block is freed by -p", "[fsck][tree]") {
  Populated p;
  const uint64_t block = p.FreeBlock();
  p.SetBlockBit(block, true);
  RequireFoundThenRepaired(p.path(), "1 blocks in use but not referenced (leaked), 0 referenced "
                           "but free: -" + std::to_string(block), "-p");
  RequireUsable(p.path());
}

TEST_CASE("fsck: a block owned twice stays with its first owner (-y)", "[fsck][tree]") {
  // The later claimant of a data block gets a copy of it (doc/integrity.md,
  // section 9): both keep the bytes.
  Populated p;
  format::Inode medium = p.Inode(p.medium);
  const uint64_t stolen = p.Inode(p.small).map.file.direct[1];
  SECTION("two files") {
    medium.map.file.direct[4] = stolen;
    p.PutInode(p.medium, medium);
    RequireFoundThenRepaired(p.path(), "inode " + std::to_string(p.medium) +
                             ": block pointer " + std::to_string(stolen) +
                             " for file block 4 names a block in use by another inode; giving "
                             "it a copy");
    CHECK(p.Inode(p.small).map.file.direct[1] == stolen);
    CHECK(p.Inode(p.medium).map.file.direct[4] != stolen);
    CHECK(p.Inode(p.medium).map.file.direct[4] != 0);
  }
  SECTION("twice in one file") {
    medium.map.file.direct[4] = medium.map.file.direct[3];
    p.PutInode(p.medium, medium);
    RequireFoundThenRepaired(p.path(), "for file block 4 names a block in use by another inode; "
                             "giving it a copy");
  }
  SECTION("a directory leaf used as a file's block") {
    // Files are checked before directories: the file keeps the block, the
    // directory's entries go to /lost+found.
    format::Inode file = p.Inode(p.small);
    const uint64_t leaf = p.DirLeaf(p.sub);
    file.map.file.direct[2] = leaf;
    p.PutInode(p.small, file);
    char pointer[32];
    std::snprintf(pointer, sizeof pointer, "%#" PRIx64, leaf);
    RequireFoundThenRepaired(p.path(), "directory " + std::to_string(p.sub) + ": node pointer " +
                             pointer + " to a block already in use; clearing it");
  }
  // Inodes count their blocks again; the first owner's data is intact.
  CHECK(p.Inode(p.medium).blocks == p.Inode(p.medium).blocks);
  RequireUsable(p.path());
}

TEST_CASE("fsck: bad block pointers are cleared by -y", "[fsck][tree]") {
  Populated p;
  format::Inode medium = p.Inode(p.medium);
  SECTION("outside the filesystem") {
    medium.map.file.direct[1] = p.g.block_count() + 5;
    p.PutInode(p.medium, medium);
    RequireFoundThenRepaired(p.path(), "for file block 1 points outside the filesystem");
  }
  SECTION("into an inode table") {
    medium.map.file.direct[1] = p.g.InodeTableBlock(0) + 1;
    p.PutInode(p.medium, medium);
    RequireFoundThenRepaired(p.path(), "for file block 1 points into metadata");
  }
  SECTION("in a pointer block") {
    const uint64_t tree = medium.map.file.indirect[0];
    REQUIRE(tree != 0);
    p.Put(p.g.BlockOffset(tree) + 8 * 3, uint64_t{0xFFFFFFFFFFFFull});
    RequireFoundThenRepaired(p.path(), "for file block 14 points outside the filesystem");
  }
  SECTION("an indirect pointer to a data block of another file") {
    // The "pointers" there are someone's data: the pointer to the block is
    // cleared, not the data.
    const std::vector<char> data_before =
        ReadAt(p.path(), p.g.BlockOffset(p.Inode(p.small).map.file.direct[0]), 4096);
    format::Inode sparse = p.Inode(p.sparse);
    sparse.map.file.indirect[0] = p.Inode(p.small).map.file.direct[0];
    p.PutInode(p.sparse, sparse);
    RequireFoundThenRepaired(p.path(), "for file block 11 points to a block that holds no block "
                             "pointers");
    CHECK(ReadAt(p.path(), p.g.BlockOffset(p.Inode(p.small).map.file.direct[0]), 4096) ==
          data_before);
  }
  SECTION("a depth-2 tree's pointer past everything") {
    const uint64_t tree = p.Inode(p.sparse).map.file.indirect[1];
    REQUIRE(tree != 0);
    // Beside the tree's one valid pointer (slot 1): a block holding only
    // invalid pointers is no pointer block (doc/integrity.md, section 9).
    p.Put(p.g.BlockOffset(tree) + 8 * 2, uint64_t{p.g.block_count()});
    RequireFoundThenRepaired(p.path(), "for file block 1547 points outside the filesystem");
  }
  RequireUsable(p.path());
}

TEST_CASE("fsck: a bad directory entry is dropped by -y, its inode kept in /lost+found",
          "[fsck][tree]") {
  Populated p;
  const uint64_t record = p.Record(p.dir, "f2");
  SECTION("a name that does not hash to its key") {
    p.Put(record + sizeof(format::DirEntry), 'X');  // "f2" -> "X2"
    RequireFoundThenRepaired(p.path(), "entry 'X2' (inode " + std::to_string(p.f2) +
                             ") has a key that is not its name's hash; dropping it");
  }
  SECTION("an entry naming a free inode") {
    p.Put(record, uint64_t{p.g.inodes_per_group() - 3});
    RequireFoundThenRepaired(p.path(), "entry 'f2' (inode " +
                             std::to_string(p.g.inodes_per_group() - 3) +
                             ") names an inode not in use; dropping it");
  }
  SECTION("a name_len past its record") {
    p.Put(record + offsetof(format::DirEntry, name_len), uint8_t{200});
    RequireFoundThenRepaired(p.path(), "has a bad name length; dropping it");
  }
  std::vector<std::string> names;
  RequireUsable(p.path(), &names);
  CHECK(Contains(names, "/lost+found/#" + std::to_string(p.f2)));
}

TEST_CASE("fsck: wrong link counts are fixed by -p", "[fsck][tree]") {
  Populated p;
  SECTION("a file") {
    format::Inode f1 = p.Inode(p.f1);
    REQUIRE(f1.nlink == 2);
    f1.nlink = 5;
    p.PutInode(p.f1, f1);
    RequireFoundThenRepaired(p.path(), "inode " + std::to_string(p.f1) +
                             ": link count 5, should be 2", "-p");
    CHECK(p.Inode(p.f1).nlink == 2);
  }
  SECTION("a file with no links left") {
    format::Inode f2 = p.Inode(p.f2);
    f2.nlink = 0;
    p.PutInode(p.f2, f2);
    RequireFoundThenRepaired(p.path(), "link count 0, should be 1", "-p");
  }
  SECTION("a directory") {
    format::Inode d = p.Inode(p.dir);
    REQUIRE(d.nlink == 3);
    d.nlink = 2;
    p.PutInode(p.dir, d);
    RequireFoundThenRepaired(p.path(), "directory " + std::to_string(p.dir) +
                             ": link count 2, should be 3", "-p");
  }
  RequireUsable(p.path());
}

TEST_CASE("fsck: what no directory names goes to /lost+found with -p", "[fsck][tree]") {
  Populated p;
  std::string expect;
  SECTION("a file") {
    p.Put(p.Record(p.dir, "f2"), uint64_t{0});
    RequireFoundThenRepaired(p.path(), "inode " + std::to_string(p.f2) +
                             " (file) is in no directory; connecting it to /lost+found", "-p");
    expect = "/lost+found/#" + std::to_string(p.f2);
  }
  SECTION("a directory and what it holds") {
    p.Put(p.Record(p.dir, "sub"), uint64_t{0});
    RequireFoundThenRepaired(p.path(), "directory " + std::to_string(p.sub) +
                             " is in no directory; connecting it to /lost+found", "-p");
    expect = "/lost+found/#" + std::to_string(p.sub) + "/leaf";
  }
  SECTION("two directories naming each other, and nothing else naming them") {
    // /d/sub/leaf now names /d, and the root's entry for /d is gone: a loop.
    const uint64_t leaf_record = p.Record(p.sub, "leaf");
    p.Put(leaf_record, p.dir);
    p.Put(leaf_record + offsetof(format::DirEntry, file_type), uint8_t{DT_DIR});
    p.Put(p.Record(1, "d"), uint64_t{0});
    RequireFoundThenRepaired(p.path(), "is in a loop of directories unreachable from the root; "
                             "connecting it to /lost+found", "-p");
    expect = "/lost+found/#" + std::to_string(p.sub) + "/leaf/f1";  // the loop, cut
  }
  SECTION("with /lost+found itself gone") {
    p.Put(p.Record(1, "lost+found"), uint64_t{0});
    p.Put(p.Record(p.dir, "f1"), uint64_t{0});
    p.Put(p.Record(p.dir, "f1-link"), uint64_t{0});
    RequireFoundThenRepaired(p.path(), "/lost+found not found; creating it", "-p");
    expect = "/lost+found/#2";  // the old one, found in no directory
  }
  std::vector<std::string> names;
  RequireUsable(p.path(), &names);
  std::string all;
  for (const std::string& name : names) all += name + "\n";
  INFO(all);
  CHECK(Contains(names, expect));
}

TEST_CASE("fsck: wrong counters are fixed by -p", "[fsck][tree]") {
  Populated p;
  SECTION("superblock free counts") {
    auto dyn = p.Get<format::SuperDynamic>(format::kSuperDynamicOffset);
    dyn.free_blocks += 7;
    dyn.checksum = SuperDynamicChecksum(dyn);
    p.Put(format::kSuperDynamicOffset, dyn);
    RequireFoundThenRepaired(p.path(), "superblock free counts", "-p");
  }
  SECTION("a file's block count") {
    format::Inode medium = p.Inode(p.medium);
    const uint64_t right = medium.blocks;
    medium.blocks += 3;
    p.PutInode(p.medium, medium);
    RequireFoundThenRepaired(p.path(), "i_blocks is " + std::to_string(right + 3) +
                             ", counted " + std::to_string(right), "-p");
  }
  SECTION("a directory's entry count") {
    format::Inode d = p.Inode(p.dir);
    d.map.dir.entries = 99;
    p.PutInode(p.dir, d);
    RequireFoundThenRepaired(p.path(), "entry count 99, should be 5", "-p");
  }
  SECTION("a directory's parent") {
    format::Inode sub = p.Inode(p.sub);
    sub.parent = 1;
    p.PutInode(p.sub, sub);
    RequireFoundThenRepaired(p.path(), "parent is 1, should be " + std::to_string(p.dir), "-p");
  }
  SECTION("an entry's file type") {
    p.Put(p.Record(p.dir, "f3") + offsetof(format::DirEntry, file_type), uint8_t{DT_LNK});
    RequireFoundThenRepaired(p.path(), "has file type 10, its inode type 8", "-p");
  }
  RequireUsable(p.path());
}

// Opens and unlinks files, then keeps the image as a crash at that instant
// leaves it: the files are on the orphan list.
std::string OrphanImage(Populated& p, int count, std::vector<uint64_t>* orphans) {
  p.image.Mount();
  Filesystem& fs = p.image.fs();
  std::vector<FileHandle> open;
  for (int i = 0; i < count; ++i) {
    const uint64_t ino = p.Create(1, "doomed" + std::to_string(i), "bye");
    auto f = fs.Open(ino, O_RDONLY);
    REQUIRE(f.ok());
    open.push_back(*f);
    REQUIRE(fs.Unlink(1, "doomed" + std::to_string(i)).ok());
    orphans->push_back(ino);
  }
  const std::vector<char> crashed = ReadFile(p.path());
  for (FileHandle f : open) fs.Release(f);
  p.image.Unmount();
  test::WriteAt(p.path(), 0, crashed.data(), crashed.size());
  return p.path();
}

TEST_CASE("fsck: orphans awaiting the next mount are no problem", "[fsck][tree][orphan]") {
  Populated p;
  std::vector<uint64_t> orphans;
  OrphanImage(p, 2, &orphans);
  REQUIRE(p.Get<format::SuperDynamic>(format::kSuperDynamicOffset).orphan_head == orphans[1]);
  const RunResult r = Fsck({"-n", p.path()});
  INFO(r.out);
  CHECK(r.exit_code == kFsckClean);
  CHECK_THAT(r.out, Catch::Contains("not cleanly unmounted"));
  RequireUsable(p.path());
  RequireClean(p.path());
}

TEST_CASE("fsck: a bad orphan list is cut and rebuilt by -p", "[fsck][tree][orphan]") {
  Populated p;
  std::vector<uint64_t> orphans;
  OrphanImage(p, 2, &orphans);
  SECTION("the head names an inode that is no orphan") {
    auto dyn = p.Get<format::SuperDynamic>(format::kSuperDynamicOffset);
    dyn.orphan_head = p.small;
    dyn.checksum = SuperDynamicChecksum(dyn);
    p.Put(format::kSuperDynamicOffset, dyn);
    RequireFoundThenRepaired(p.path(), "orphan list: inode " + std::to_string(p.small) +
                             " is not flagged as an orphan; cutting the list there", "-p");
  }
  SECTION("a loop") {
    format::Inode last = p.Inode(orphans[0]);  // the list's tail
    last.orphan_next = orphans[1];
    p.PutInode(orphans[0], last);
    RequireFoundThenRepaired(p.path(), "is on it twice (a loop); cutting the list there", "-p");
  }
  SECTION("a link out of range") {
    format::Inode head = p.Inode(orphans[1]);
    head.orphan_next = p.g.inode_count() + 1;
    p.PutInode(orphans[1], head);
    RequireFoundThenRepaired(p.path(), "is out of range; cutting the list there", "-p");
    // orphans[0], cut off, is put back on the list.
    CHECK(p.Get<format::SuperDynamic>(format::kSuperDynamicOffset).orphan_head == orphans[0]);
  }
  // The next mount frees both orphans.
  RequireUsable(p.path());
  RequireClean(p.path());
  CHECK(p.Get<format::SuperDynamic>(format::kSuperDynamicOffset).orphan_head == 0);
}

TEST_CASE("fsck -p stops at damage that needs a decision", "[fsck][tree]") {
  Populated p;
  format::Inode medium = p.Inode(p.medium);
  medium.map.file.direct[1] = p.g.block_count() + 5;
  p.PutInode(p.medium, medium);
  const RunResult r = RequireUnwritten(p.path(), "-p", kFsckUncorrected,
                                       "points outside the filesystem; clearing it: not fixed "
                                       "(needs a decision; run fsck.nvfs -y)");
  INFO(r.out);
  CHECK_THAT(r.out, Catch::Contains("UNEXPECTED INCONSISTENCY"));
  RequireFoundThenRepaired(p.path(), "points outside the filesystem");
}

TEST_CASE("fsck: damaged directory structure is repaired by -y", "[fsck][tree]") {
  Populated p;
  std::string expect;
  SECTION("a leaf without its magic") {
    p.Put(p.g.BlockOffset(p.DirLeaf(p.sub)), uint32_t{0x12345678});
    RequireFoundThenRepaired(p.path(), "directory " + std::to_string(p.sub) +
                             ": node pointer " , "-y");
    expect = "/lost+found/#" + std::to_string(p.leaf);
  }
  SECTION("a broken record chain") {
    p.Put(p.Record(p.dir, "f2") + offsetof(format::DirEntry, rec_len), uint32_t{4097});
    RequireFoundThenRepaired(p.path(), "has a bad length (4097); the rest of the leaf is lost");
  }
  SECTION("a node pointer with reserved bits") {
    format::Inode sub = p.Inode(p.sub);
    sub.map.dir.root |= uint64_t{1} << 60;
    p.PutInode(p.sub, sub);
    RequireFoundThenRepaired(p.path(), "has reserved bits set; clearing it");
    expect = "/lost+found/#" + std::to_string(p.leaf);
  }
  SECTION("a second name of a directory") {
    p.Put(p.Record(p.dir, "f3"), p.sub);
    p.Put(p.Record(p.dir, "f3") + offsetof(format::DirEntry, file_type), uint8_t{DT_DIR});
    RequireFoundThenRepaired(p.path(), "is a second name of a directory; dropping it");
  }
  SECTION("a directory node shared with a file") {
    format::Inode sub = p.Inode(p.sub);
    sub.map.dir.root = p.Inode(p.small).map.file.direct[0];
    p.PutInode(p.sub, sub);
    RequireFoundThenRepaired(p.path(), "to a block already in use; clearing it");
    expect = "/lost+found/#" + std::to_string(p.leaf);
  }
  std::vector<std::string> names;
  RequireUsable(p.path(), &names);
  if (!expect.empty()) CHECK(Contains(names, expect));
}

TEST_CASE("fsck: damaged inodes are cleared or mended by -y", "[fsck][tree]") {
  Populated p;
  SECTION("an invalid mode") {
    format::Inode f = p.Inode(p.f2);
    f.mode = 0170644;
    p.PutInode(p.f2, f);
    RequireFoundThenRepaired(p.path(), "inode " + std::to_string(p.f2) +
                             ": invalid mode 0170644; clearing it");
  }
  SECTION("a symlink of no length") {
    format::Inode s = p.Inode(p.short_link);
    s.size = 0;
    p.PutInode(p.short_link, s);
    RequireFoundThenRepaired(p.path(), "symlink of 0 bytes; clearing it");
  }
  SECTION("a long symlink without its block") {
    format::Inode s = p.Inode(p.long_link);
    s.map.file.direct[0] = p.g.block_count();
    p.PutInode(p.long_link, s);
    RequireFoundThenRepaired(p.path(), "symlink target damaged; clearing it");
  }
  SECTION("a damaged xattr block") {
    p.Put(p.g.BlockOffset(p.Inode(p.with_xattr).xattr_block) + 8, uint32_t{9000});
    RequireFoundThenRepaired(p.path(), "extended attribute block");
  }
  SECTION("unknown flags") {
    format::Inode f = p.Inode(p.f1);
    f.flags |= 0x80;
    p.PutInode(p.f1, f);
    RequireFoundThenRepaired(p.path(), "unknown flags 0x80", "-p");
  }
  RequireUsable(p.path());
}

// Issue 11, item 2: before system.* names were refused, any caller could
// store them. Such a name is well-formed on the media: fsck accepts it and
// mounts go on; the core hides it (not listed, EOPNOTSUPP) and keeps it when
// the block is rewritten (doc/format.md).
TEST_CASE("fsck: a system. xattr stored before they were refused is kept and hidden", "[fsck]") {
  Populated p;
  const std::string old_name = "system.col";  // as long as "user.color"
  const uint64_t name_at = p.g.BlockOffset(p.Inode(p.with_xattr).xattr_block) +
                           sizeof(format::XattrBlockHeader) + sizeof(format::XattrEntry);
  REQUIRE(std::string(ReadAt(p.path(), name_at, old_name.size()).data(), old_name.size()) ==
          "user.color");
  test::WriteAt(p.path(), name_at, old_name.data(), old_name.size());
  RequireClean(p.path());
  {
    auto mounted = Filesystem::Mount(p.path(), MountOptions{});
    REQUIRE(mounted.ok());
    Filesystem& fs = **mounted;
    char buf[64];
    CHECK(*fs.ListXattr(p.with_xattr, nullptr, 0, Cred{}) == 0);
    CHECK(fs.GetXattr(p.with_xattr, old_name, buf, sizeof buf).code() == EOPNOTSUPP);
    CHECK(fs.RemoveXattr(p.with_xattr, old_name).code() == EOPNOTSUPP);
    REQUIRE(fs.SetXattr(p.with_xattr, "user.new", "v", 1, 0).ok());
    REQUIRE(*fs.ListXattr(p.with_xattr, buf, sizeof buf, Cred{}) == sizeof "user.new");
    CHECK(std::string(buf) == "user.new");
    REQUIRE(fs.Unmount().ok());
  }
  RequireClean(p.path());
  const uint64_t block_at = p.g.BlockOffset(p.Inode(p.with_xattr).xattr_block);
  const std::vector<char> block = ReadAt(p.path(), block_at, p.g.block_size());
  CHECK(std::string(block.data(), block.size()).find(old_name + "blue") != std::string::npos);
}

TEST_CASE("fsck: a damaged root is made anew by -y, the rest kept in /lost+found",
          "[fsck][tree]") {
  Populated p;
  format::Inode root = p.Inode(1);
  root.mode = S_IFREG | 0644;
  p.PutInode(1, root);
  RequireFoundThenRepaired(p.path(), "root inode is not a directory (mode 0100644); making a "
                           "new, empty root");
  std::vector<std::string> names;
  RequireUsable(p.path(), &names);
  CHECK(Contains(names, "/lost+found/#2"));  // the old lost+found
  CHECK(Contains(names, "/lost+found/#" + std::to_string(p.dir) + "/sub/leaf"));
}

TEST_CASE("fsck on a namespace that needs journal recovery", "[fsck][journal]") {
  test::FsFixture fixture;
  const Geometry& g = fixture.geometry();
  TempPath crashed("crashed");
  {
    // An operation in flight: the root's link count changed, logged, not committed.
    Tx tx(fixture.journal(), "test");
    const format::Inode& root = fixture.ctx().InodeAt(1);
    tx.Set(root.nlink, uint32_t{7});
    const std::vector<char> bytes = ReadFile(fixture.path());
    MakeFile(crashed.path(), bytes.size());
    WriteAt(crashed.path(), 0, bytes.data(), bytes.size());
    tx.Abort();
  }
  format::Inode root;
  std::memcpy(&root, ReadAt(crashed.path(), g.InodeOffset(1), sizeof root).data(), sizeof root);
  REQUIRE(root.nlink == 7);
  // -n checks what recovery will leave, so the half-done change is no problem.
  RequireUnwritten(crashed.path(), "-n", kFsckClean,
                   "checking the namespace as recovery will leave it");
  const RunResult fix = Fsck({"-p", crashed.path()});
  INFO(fix.out);
  CHECK(fix.exit_code == kFsckCorrected);
  CHECK_THAT(fix.out, Catch::Contains("journal: 1 operations undone"));
  std::memcpy(&root, ReadAt(crashed.path(), g.InodeOffset(1), sizeof root).data(), sizeof root);
  CHECK(root.nlink == 3);
  RequireClean(crashed.path());
}

// Everything CheckNamespace says, with `threads` threads.
std::vector<std::string> CheckLines(const std::string& path, RepairMode mode, unsigned threads,
                                    FsckReport* report) {
  MediaOptions options;
  options.read_only = mode == RepairMode::kNone;
  auto media = OpenMedia(path, options);
  REQUIRE(media.ok());
  std::vector<std::string> lines;
  *report = CheckNamespace(**media, mode, [&](const std::string& l) { lines.push_back(l); }, {},
                           threads);
  return lines;
}

TEST_CASE("fsck on several threads finds and repairs what one thread does", "[fsck][threads]") {
  // Three groups, 80 directories (the passes go parallel from 32 on).
  test::FsImage image(300 << 20, 4096, 4096);
  Filesystem& fs = image.fs();
  std::vector<uint64_t> dirs, files;
  for (int d = 0; d < 80; ++d) {
    auto dir = fs.Mkdir(1, "dir" + std::to_string(d), 0755, kCred);
    REQUIRE(dir.ok());
    dirs.push_back(dir->ino);
    for (int f = 0; f < 12; ++f) {
      Attr attr;
      auto file = fs.Create(dir->ino, "f" + std::to_string(f), 0644, O_RDWR, kCred, &attr);
      REQUIRE(file.ok());
      const std::string data(5000 + 100 * f, 'x');
      REQUIRE(fs.Write(*file, 0, data.data(), data.size()).ok());
      fs.Release(*file);
      fs.Forget(attr.ino, 1);
      files.push_back(attr.ino);
    }
    fs.Forget(dir->ino, 1);
  }
  image.Unmount();
  const Geometry g = GeometryOf(image.path());
  REQUIRE(g.group_count() == 3);

  FsckReport one, many;
  SECTION("clean") {
    CHECK(CheckLines(image.path(), RepairMode::kNone, 1, &one).empty());
    CHECK(CheckLines(image.path(), RepairMode::kNone, 4, &many).empty());
    CHECK(one.inodes_checked == many.inodes_checked);
    CHECK(one.entries == many.entries);
    CHECK(many.exit_code == kFsckClean);
    CHECK(many.inodes_checked == 2 + 80 + 80 * 12);
  }
  SECTION("damaged in every pass") {
    const auto put_inode = [&](uint64_t ino, const std::function<void(format::Inode&)>& change) {
      format::Inode inode;
      std::memcpy(&inode, ReadAt(image.path(), g.InodeOffset(ino), sizeof inode).data(),
                  sizeof inode);
      change(inode);
      WriteAt(image.path(), g.InodeOffset(ino), &inode, sizeof inode);
    };
    // A block shared by two files in different groups' inodes, a wrong link
    // count, a bad pointer, a directory named nowhere.
    format::Inode first;
    std::memcpy(&first, ReadAt(image.path(), g.InodeOffset(files[3]), sizeof first).data(),
                sizeof first);
    put_inode(files.back(), [&](format::Inode& i) { i.map.file.direct[1] = first.map.file.direct[0]; });
    put_inode(files[100], [](format::Inode& i) { i.nlink = 3; });
    put_inode(files[500], [&](format::Inode& i) { i.map.file.direct[0] = g.block_count() + 9; });
    put_inode(dirs[40], [](format::Inode& i) { i.parent = 77; });
    const std::vector<std::string> lines_one = CheckLines(image.path(), RepairMode::kNone, 1, &one);
    const std::vector<std::string> lines_many =
        CheckLines(image.path(), RepairMode::kNone, 4, &many);
    CHECK(lines_one == lines_many);
    CHECK(lines_many.size() >= 5);
    CHECK(many.exit_code == kFsckUncorrected);
    CHECK(CheckLines(image.path(), RepairMode::kYes, 4, &many).size() == lines_one.size());
    CHECK(many.exit_code == kFsckCorrected);
    CHECK(CheckLines(image.path(), RepairMode::kNone, 4, &many).empty());
    CHECK(many.exit_code == kFsckClean);
  }
}

}  // namespace
}  // namespace nvfs
