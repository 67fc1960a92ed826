// mkfs: the library (PlanMkfs, WriteMkfs, DetectSignatures) formats a
// namespace that reads back and checks clean at every block size, and the
// mkfs.nvfs program refuses every bad input and every foreign filesystem
// without changing a byte of the namespace.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "helpers.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/media.hpp"
#include "nvfs/mkfs.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs {
namespace {

using test::DigestFile;
using test::FileDigest;
using test::FileSize;
using test::Lines;
using test::MakeFile;
using test::PathExists;
using test::Run;
using test::RunResult;
using test::TempPath;
using test::WriteAt;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kLostFoundIno = 2;

RunResult Mkfs(const std::vector<std::string>& args) { return Run("NVFS_MKFS", args); }
RunResult Fsck(const std::vector<std::string>& args) { return Run("NVFS_FSCK", args); }

std::unique_ptr<Media> OpenReadOnly(const std::string& path) {
  MediaOptions options;
  options.read_only = true;
  auto media = OpenMedia(path, options);
  INFO((media.ok() ? std::string() : media.error().message));
  REQUIRE(media.ok());
  return std::move(media).value();
}

// Formats `path` (created or grown to `size`) through the library.
MkfsPlan Format(const std::string& path, uint64_t size, const MkfsOptions& options) {
  Result<MkfsPlan> plan = PlanMkfs(size, options);
  INFO((plan.ok() ? std::string() : plan.error().message));
  REQUIRE(plan.ok());
  MediaOptions media_options;
  media_options.grow_to = size;
  media_options.min_size = plan->geometry.bytes();
  auto media = OpenMedia(path, media_options);
  INFO((media.ok() ? std::string() : media.error().message));
  REQUIRE(media.ok());
  uint64_t calls = 0, last_done = 0, last_total = 0;
  Status written = WriteMkfs(**media, *plan, [&](uint64_t done, uint64_t total) {
    ++calls;
    CHECK(done == last_done + 1);
    last_done = done;
    last_total = total;
  });
  INFO((written.ok() ? std::string() : written.error().message));
  REQUIRE(written.ok());
  CHECK(calls == plan->geometry.group_count());
  CHECK(last_done == last_total);
  CHECK((*media)->bytes_stored() > 0);
  return plan.value();
}

struct CheckResult {
  FsckReport report;
  std::vector<std::string> lines;
};

CheckResult CheckReadOnly(Media& media) {
  CheckResult r;
  r.report = CheckNamespace(media, RepairMode::kNone,
                            [&](const std::string& line) { r.lines.push_back(line); });
  return r;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

format::Inode ReadInode(const Media& media, const Geometry& g, uint64_t ino) {
  format::Inode inode;
  std::memcpy(&inode, media.base() + g.InodeOffset(ino), sizeof inode);
  return inode;
}

// Everything a fresh namespace must hold, read back through a read-only media.
void RequireFreshNamespace(const std::string& path, const MkfsPlan& plan) {
  auto media = OpenReadOnly(path);
  Result<FoundSuper> found = FindSuper(media->base(), media->size());
  INFO((found.ok() ? std::string() : found.error().message));
  REQUIRE(found.ok());
  CHECK_FALSE(found->from_backup);
  CHECK(std::memcmp(&found->sb, &plan.super, sizeof plan.super) == 0);
  const Geometry& g = found->geometry;
  CHECK(g.block_size() == plan.geometry.block_size());
  CHECK(g.block_count() == plan.geometry.block_count());
  CHECK(g.group_count() == plan.geometry.group_count());
  CHECK(g.inode_count() == plan.geometry.inode_count());
  // The backup copy is identical to the primary.
  CHECK(std::memcmp(media->base() + g.BackupSuperOffset(), &plan.super, sizeof plan.super) == 0);

  // The dynamic half: clean, with the plan's free counts.
  format::SuperDynamic dyn;
  std::memcpy(&dyn, media->base() + format::kSuperDynamicOffset, sizeof dyn);
  REQUIRE(CheckSuperDynamic(dyn).ok());
  CHECK(dyn.state == static_cast<uint32_t>(format::FsState::kClean));
  CHECK(dyn.errors == 0);
  CHECK(dyn.free_blocks == plan.free_blocks);
  CHECK(dyn.free_inodes == plan.free_inodes);
  CHECK(dyn.orphan_head == 0);
  CHECK(plan.free_inodes == g.inode_count() - 3);  // inode 0, root, lost+found

  // Root: a directory (its own parent) whose one leaf holds only lost+found.
  const format::Inode root = ReadInode(*media, g, format::kRootIno);
  CHECK(S_ISDIR(root.mode));
  CHECK((root.mode & 07777) == 0755);
  CHECK(root.nlink == 3);
  CHECK(root.parent == format::kRootIno);
  CHECK(root.uid == plan.root_uid);
  CHECK(root.gid == plan.root_gid);
  CHECK(root.size == g.block_size());
  CHECK(root.blocks == 1);
  CHECK(root.mtime_sec == plan.super.mkfs_time);
  CHECK(root.map.dir.entries == 1);
  const uint64_t root_leaf = root.map.dir.root;
  REQUIRE((root_leaf & format::kDirNodeIndexBit) == 0);  // a leaf, not an index node
  REQUIRE(root_leaf >= g.FirstDataBlock(0));
  REQUIRE(root_leaf < g.GroupBlocks(0));
  const std::byte* leaf = media->base() + g.BlockOffset(root_leaf);
  format::DirLeafHeader header;
  std::memcpy(&header, leaf, sizeof header);
  CHECK(header.magic == format::kDirLeafMagic);
  CHECK(header.prefix_bits == 0);
  CHECK(header.next == 0);
  const std::vector<test::LeafRecord> records = test::ParseDirLeaf(leaf, g.block_size());
  std::vector<test::LeafRecord> live;
  for (const auto& r : records) {
    if (r.entry.ino != 0) live.push_back(r);
  }
  REQUIRE(live.size() == 1);
  CHECK(live[0].name == "lost+found");
  CHECK(live[0].entry.ino == kLostFoundIno);
  CHECK(live[0].entry.file_type == DT_DIR);
  CHECK(live[0].entry.key ==
        DirKey(DirHash(NameHash(NameHashKey::FromSuper(plan.super), "lost+found")), 0));

  // lost+found: an empty directory under the root.
  const format::Inode lost_found = ReadInode(*media, g, kLostFoundIno);
  CHECK(S_ISDIR(lost_found.mode));
  CHECK(lost_found.nlink == 2);
  CHECK(lost_found.parent == format::kRootIno);
  CHECK(lost_found.map.dir.entries == 0);
  CHECK(lost_found.generation != root.generation);
  const uint64_t lf_leaf = lost_found.map.dir.root;
  REQUIRE((lf_leaf & format::kDirNodeIndexBit) == 0);
  REQUIRE(lf_leaf != root_leaf);
  REQUIRE(lf_leaf >= g.FirstDataBlock(0));
  REQUIRE(lf_leaf < g.GroupBlocks(0));
  const std::byte* lf = media->base() + g.BlockOffset(lf_leaf);
  std::memcpy(&header, lf, sizeof header);
  CHECK(header.magic == format::kDirLeafMagic);
  for (const auto& r : test::ParseDirLeaf(lf, g.block_size())) CHECK(r.entry.ino == 0);

  // Bitmaps of group 0: metadata and both leaves in use, the next block free;
  // inodes 0..2 in use, inode 3 free.
  const std::byte* block_bitmap = media->base() + g.BlockOffset(g.BlockBitmapBlock(0));
  for (uint64_t b = 0; b < g.GroupMetaBlocks(0); ++b) REQUIRE(TestBit(block_bitmap, b));
  CHECK(TestBit(block_bitmap, root_leaf));
  CHECK(TestBit(block_bitmap, lf_leaf));
  CHECK_FALSE(TestBit(block_bitmap, std::max(root_leaf, lf_leaf) + 1));
  const std::byte* inode_bitmap = media->base() + g.BlockOffset(g.InodeBitmapBlock(0));
  CHECK(TestBit(inode_bitmap, 0));
  CHECK(TestBit(inode_bitmap, format::kRootIno));
  CHECK(TestBit(inode_bitmap, kLostFoundIno));
  CHECK_FALSE(TestBit(inode_bitmap, 3));
  // The backup block is in use in the last group.
  const uint32_t last = g.group_count() - 1;
  const std::byte* last_bitmap = media->base() + g.BlockOffset(g.BlockBitmapBlock(last));
  CHECK(TestBit(last_bitmap, g.BackupBlock() - g.GroupFirstBlock(last)));
  if (last > 0) {
    CHECK_FALSE(TestBit(media->base() + g.BlockOffset(g.InodeBitmapBlock(last)), 0));
  }

  // Every group descriptor is valid and counts its group.
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    format::GroupDesc desc;
    std::memcpy(&desc, media->base() + g.BlockOffset(g.GroupDescBlock(group)), sizeof desc);
    INFO("group " << group);
    CHECK(desc.magic == format::kGroupDescMagic);
    CHECK(desc.group == group);
    CHECK(desc.checksum == GroupDescChecksum(desc));
    CHECK(desc.used_dirs == (group == 0 ? 2u : 0u));
  }

  // Every journal slot is idle.
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    format::JournalSlotHeader jh;
    std::memcpy(&jh, media->base() + g.JournalSlotOffset(slot), sizeof jh);
    REQUIRE(std::memcmp(jh.magic, format::kJournalMagic, sizeof jh.magic) == 0);
    REQUIRE(jh.slot == slot);
    REQUIRE(jh.state == static_cast<uint32_t>(format::JournalState::kIdle));
  }

  // And the checker finds nothing.
  const CheckResult check = CheckReadOnly(*media);
  INFO(Joined(check.lines));
  CHECK(check.report.exit_code == kFsckClean);
  CHECK(check.report.problems == 0);
  CHECK(check.report.clean_state);
  CHECK(check.report.block_count == g.block_count());
  CHECK(check.report.inode_count == g.inode_count());
  CHECK(check.report.inodes_used == 3);
  CHECK(check.report.blocks_used == g.block_count() - plan.free_blocks);
}

// ---------------------------------------------------------------------------
// The library
// ---------------------------------------------------------------------------

TEST_CASE("mkfs then reopen: clean at every block size and group shape", "[mkfs]") {
  struct Case {
    const char* what;
    uint32_t block_size;
    uint64_t size;
    uint32_t groups;
  };
  const Case cases[] = {
      {"4k blocks, one group", 4096, 64 * kMiB, 1},
      {"4k blocks, exactly two groups", 4096, 256 * kMiB, 2},
      {"4k blocks, partial last group", 4096, 300 * kMiB, 3},
      {"4k blocks, short last group dropped", 4096, 256 * kMiB + 7 * 4096, 2},
      {"4k blocks, smallest namespace", 4096, Geometry::MinNamespaceSize(4096), 1},
      {"8k blocks, partial second group", 8192, 600 * kMiB, 2},
      {"64k blocks", 65536, 64 * kMiB, 1},
      {"64k blocks, odd size", 65536, 100 * kMiB + 12345, 1},
      {"1M blocks, smallest namespace", 1u << 20, 22 * kMiB, 1},
      {"1M blocks", 1u << 20, 64 * kMiB, 1},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      TempPath image("mkfs");
      MkfsOptions options;
      options.block_size = c.block_size;
      options.root_uid = 1234;
      options.root_gid = 5678;
      const MkfsPlan plan = Format(image.path(), c.size, options);
      CHECK(plan.geometry.group_count() == c.groups);
      CHECK(plan.geometry.block_size() == c.block_size);
      CHECK(FileSize(image.path()) == c.size);
      RequireFreshNamespace(image.path(), plan);
    }
  }
}

TEST_CASE("mkfs stores label, UUID, hash key and time as given", "[mkfs]") {
  TempPath image("identity");
  MkfsOptions options;
  options.label = std::string(63, 'L');  // the longest label
  options.uuid = ParseUuid("01234567-89ab-cdef-0123-456789abcdef");
  REQUIRE(options.uuid.has_value());
  options.dir_hash_key = std::array<uint8_t, 16>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  options.now = 1700000000;
  const MkfsPlan plan = Format(image.path(), 64 * kMiB, options);
  RequireFreshNamespace(image.path(), plan);
  auto media = OpenReadOnly(image.path());
  format::SuperStatic sb;
  std::memcpy(&sb, media->base(), sizeof sb);
  CHECK(std::string(sb.label, 63) == options.label);
  CHECK(sb.label[63] == '\0');
  CHECK(std::memcmp(sb.uuid, options.uuid->data(), 16) == 0);
  CHECK(std::memcmp(sb.dir_hash_key, options.dir_hash_key->data(), 16) == 0);
  CHECK(sb.reserved0 == 0);
  CHECK(sb.mkfs_time == 1700000000);
  // Reserved bytes are zero.
  for (uint8_t b : sb.reserved) REQUIRE(b == 0);
}

TEST_CASE("mkfs without a UUID or hash key picks random ones", "[mkfs]") {
  const MkfsOptions options;
  Result<MkfsPlan> a = PlanMkfs(64 * kMiB, options);
  Result<MkfsPlan> b = PlanMkfs(64 * kMiB, options);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(std::memcmp(a->super.uuid, b->super.uuid, 16) != 0);
  CHECK(std::memcmp(a->super.dir_hash_key, b->super.dir_hash_key, 16) != 0);
  const NameHashKey key = NameHashKey::FromSuper(a->super);
  CHECK((key.k0 != 0 || key.k1 != 0));
  CHECK(a->super.reserved0 == 0);
  CHECK(a->super.mkfs_time > 1600000000);
}

TEST_CASE("mkfs does not depend on zeroed media", "[mkfs]") {
  // Stale bytes everywhere, as on a reused namespace: inode tables are not
  // cleared, so only the bitmaps may decide what is live.
  TempPath image("dirty");
  MakeFile(image.path(), 64 * kMiB, '\xA5');
  const MkfsPlan plan = Format(image.path(), 64 * kMiB, MkfsOptions{});
  RequireFreshNamespace(image.path(), plan);
}

TEST_CASE("mkfs over an nvfs of another block size", "[mkfs]") {
  TempPath image("reformat");
  MkfsOptions small;
  small.block_size = 4096;
  Format(image.path(), 128 * kMiB, small);
  MkfsOptions large;
  large.block_size = 65536;
  const MkfsPlan plan = Format(image.path(), 128 * kMiB, large);
  RequireFreshNamespace(image.path(), plan);
}

TEST_CASE("PlanMkfs refuses bad options without touching anything", "[mkfs]") {
  MkfsOptions options;
  options.label = std::string(64, 'x');
  Result<MkfsPlan> plan = PlanMkfs(64 * kMiB, options);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().code == EINVAL);
  CHECK_THAT(plan.error().message, Catch::Contains("label"));

  options = MkfsOptions{};
  options.block_size = 3000;
  CHECK(PlanMkfs(64 * kMiB, options).code() == EINVAL);

  options = MkfsOptions{};
  plan = PlanMkfs(100 * kKiB, options);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().code == ENOSPC);
  CHECK_THAT(plan.error().message,
             Catch::Contains(std::to_string(Geometry::MinNamespaceSize(4096))));
}

TEST_CASE("WriteMkfs refuses a media smaller than the plan", "[mkfs]") {
  TempPath image("shrunk");
  MakeFile(image.path(), 32 * kMiB);
  Result<MkfsPlan> plan = PlanMkfs(64 * kMiB, MkfsOptions{});
  REQUIRE(plan.ok());
  {
    auto media = OpenMedia(image.path(), MediaOptions{});
    REQUIRE(media.ok());
    Status st = WriteMkfs(**media, *plan);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == ENOSPC);
    CHECK((*media)->bytes_stored() == 0);
  }
  const std::vector<char> bytes = test::ReadFile(image.path());
  CHECK(bytes.size() == 32 * kMiB);
  CHECK(std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == 0; }));
}

// Regression: every block size whose multiple the namespace size is named the
// same backup offset, so mkfs listed (and wiped) one backup up to nine times.
TEST_CASE("DetectSignatures reports each nvfs copy once", "[mkfs][signature]") {
  TempPath image("sig-once");
  Format(image.path(), 64 * kMiB, MkfsOptions{});
  auto media = OpenReadOnly(image.path());
  const std::vector<Signature> sigs = DetectSignatures(media->base(), media->size());
  REQUIRE(sigs.size() == 2);
  CHECK(sigs[0].name == "nvfs");
  CHECK(sigs[0].offset == 0);
  CHECK(sigs[1].name == "nvfs (backup)");
  CHECK(sigs[1].offset == 64 * kMiB - format::kSuperHalfSize);
}

TEST_CASE("DetectSignatures finds each known magic where it belongs", "[mkfs][signature]") {
  std::vector<std::byte> buf(128 * kKiB);
  CHECK(DetectSignatures(buf.data(), buf.size()).empty());

  auto put = [&](uint64_t offset, std::string_view bytes) {
    std::memcpy(buf.data() + offset, bytes.data(), bytes.size());
  };
  auto names = [&](uint64_t size) {
    std::vector<std::string> n;
    for (const Signature& s : DetectSignatures(buf.data(), size)) n.push_back(s.name);
    return n;
  };
  put(1080, "\x53\xEF");
  CHECK(names(buf.size()) == std::vector<std::string>{"ext2/ext3/ext4"});
  std::fill(buf.begin(), buf.end(), std::byte{0});
  put(0, "XFSB");
  CHECK(names(buf.size()) == std::vector<std::string>{"xfs"});
  std::fill(buf.begin(), buf.end(), std::byte{0});
  put(65600, "_BHRfS_M");
  const std::vector<Signature> btrfs = DetectSignatures(buf.data(), buf.size());
  REQUIRE(btrfs.size() == 1);
  CHECK(btrfs[0].name == "btrfs");
  CHECK(btrfs[0].offset == 65600);
  CHECK(btrfs[0].length == 8);
  // A magic cut off by the end of the namespace is not there, and nothing is
  // read past the end.
  CHECK(names(65604).empty());
  CHECK(names(65608) == std::vector<std::string>{"btrfs"});
  std::fill(buf.begin(), buf.end(), std::byte{0});
  put(0, std::string_view(format::kSuperStaticMagic, 8));
  const std::vector<std::string> nvfs = names(buf.size());
  REQUIRE_FALSE(nvfs.empty());
  CHECK(nvfs[0] == "nvfs");
}

// ---------------------------------------------------------------------------
// mkfs.nvfs
// ---------------------------------------------------------------------------

std::vector<Signature> SignaturesOf(const std::string& path) {
  auto media = OpenReadOnly(path);
  return DetectSignatures(media->base(), media->size());
}

void RequireOnlyNvfs(const std::string& path) {
  const std::vector<Signature> sigs = SignaturesOf(path);
  REQUIRE_FALSE(sigs.empty());
  CHECK(sigs[0].name == "nvfs");
  for (const Signature& s : sigs) {
    INFO(s.name << " at " << s.offset);
    CHECK(s.name.rfind("nvfs", 0) == 0);
  }
}

void RequireFsckClean(const std::string& path) {
  const RunResult fsck = Fsck({"-n", path});
  INFO(fsck.out);
  CHECK(fsck.exit_code == 0);
  CHECK_THAT(fsck.out, Catch::Contains("clean"));
}

// mkfs.nvfs without -f over `path`: refused in one line that holds
// `says`, and nothing written. That line, for more checks.
std::string RequireRefusedWithoutForce(const std::string& path, const std::string& says) {
  const FileDigest before = DigestFile(path);
  const RunResult refused = Mkfs({path});
  INFO(refused.out);
  CHECK(refused.exit_code != 0);
  CHECK(Lines(refused.out).size() == 1);
  CHECK_THAT(refused.out, Catch::Contains(says));
  CHECK(DigestFile(path) == before);
  return refused.out;
}

format::SuperStatic ReadSuper(const std::string& path) {
  format::SuperStatic sb;
  const std::vector<char> bytes = test::ReadAt(path, 0, sizeof sb);
  std::memcpy(&sb, bytes.data(), sizeof sb);
  return sb;
}

// A 64 MiB image freshly formatted by mkfs.nvfs.
void MakeNvfsImage(const std::string& path, const std::string& size = "64M") {
  const RunResult r = Mkfs({"-q", "-s", size, path});
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
}

TEST_CASE("mkfs.nvfs -s creates a clean image", "[mkfs][cli]") {
  for (const char* block_size : {"4k", "64k", "1M"}) {
    SECTION(std::string("block size ") + block_size) {
      TempPath image("cli-create");
      const RunResult r = Mkfs({"-b", block_size, "-s", "256M", image.path()});
      INFO(r.out);
      REQUIRE(r.exit_code == 0);
      CHECK_THAT(r.out, Catch::Contains(image.path()));
      CHECK_THAT(r.out, Catch::Contains("granularity"));
      CHECK(FileSize(image.path()) == 256 * kMiB);
      const format::SuperStatic sb = ReadSuper(image.path());
      CHECK(sb.block_size == ParseSize(block_size));
      CHECK(sb.block_count * sb.block_size == 256 * kMiB);
      RequireFsckClean(image.path());
    }
  }
}

TEST_CASE("mkfs.nvfs -q prints nothing, -L and -U are stored", "[mkfs][cli]") {
  TempPath image("cli-identity");
  const std::string uuid = "0badcafe-1234-4567-89ab-0123456789ab";
  const RunResult r = Mkfs({"-q", "-L", "my volume", "-U", uuid, "-s", "64M", image.path()});
  CHECK(r.exit_code == 0);
  CHECK(r.out.empty());
  const format::SuperStatic sb = ReadSuper(image.path());
  CHECK(std::string(sb.label) == "my volume");
  Uuid stored;
  std::memcpy(stored.data(), sb.uuid, 16);
  CHECK(FormatUuid(stored) == uuid);
  RequireFsckClean(image.path());
}

TEST_CASE("mkfs.nvfs -s extends an existing empty image", "[mkfs][cli]") {
  TempPath image("cli-empty");
  MakeFile(image.path(), 0);
  const RunResult r = Mkfs({"-q", "-s", "64M", image.path()});
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(FileSize(image.path()) == 64 * kMiB);
  RequireFsckClean(image.path());
}

TEST_CASE("mkfs.nvfs -n writes nothing", "[mkfs][cli]") {
  SECTION("on an existing nvfs") {
    TempPath image("cli-dry");
    MakeNvfsImage(image.path());
    const FileDigest before = DigestFile(image.path());
    const RunResult r = Mkfs({"-n", "-f", image.path()});
    INFO(r.out);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("(dry run)"));
    CHECK_THAT(r.out, Catch::Contains("would wipe the nvfs signature"));
    CHECK(DigestFile(image.path()) == before);
  }
  SECTION("on a missing file") {
    TempPath image("cli-dry-missing");
    const RunResult r = Mkfs({"-n", "-s", "64M", image.path()});
    INFO(r.out);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("(dry run)"));
    CHECK_FALSE(PathExists(image.path()));
  }
  SECTION("on a short file that -s would extend") {
    TempPath image("cli-dry-short");
    MakeFile(image.path(), 4096, 'q');
    const FileDigest before = DigestFile(image.path());
    const RunResult r = Mkfs({"-n", "-s", "64M", image.path()});
    INFO(r.out);
    CHECK(r.exit_code == 0);
    CHECK(DigestFile(image.path()) == before);
  }
}

TEST_CASE("mkfs.nvfs refuses an existing nvfs without -f", "[mkfs][cli]") {
  TempPath image("cli-again");
  MakeNvfsImage(image.path());
  const format::SuperStatic old_sb = ReadSuper(image.path());
  CHECK_THAT(RequireRefusedWithoutForce(image.path(), "already holds nvfs"),
             Catch::Contains("-f"));

  const RunResult forced = Mkfs({"-f", image.path()});
  INFO(forced.out);
  CHECK(forced.exit_code == 0);
  CHECK(std::memcmp(ReadSuper(image.path()).uuid, old_sb.uuid, 16) != 0);  // a new filesystem
  RequireFsckClean(image.path());
}

struct Foreign {
  const char* name;     // as DetectSignatures names it
  uint64_t offset;
  std::string magic;
};

TEST_CASE("mkfs.nvfs refuses a foreign filesystem, and -f wipes it", "[mkfs][cli]") {
  const Foreign foreigns[] = {
      {"ext2/ext3/ext4", 1080, "\x53\xEF"},
      {"xfs", 0, "XFSB"},
      {"btrfs", 65600, "_BHRfS_M"},
  };
  for (const Foreign& f : foreigns) {
    SECTION(f.name) {
      TempPath image("cli-foreign");
      MakeFile(image.path(), 64 * kMiB);
      WriteAt(image.path(), f.offset, f.magic.data(), f.magic.size());
      const std::vector<Signature> sigs = SignaturesOf(image.path());
      REQUIRE(sigs.size() == 1);
      REQUIRE(sigs[0].name == f.name);

      CHECK_THAT(RequireRefusedWithoutForce(image.path(), std::string("already holds ") + f.name),
                 Catch::Contains("byte " + std::to_string(f.offset)));

      const RunResult forced = Mkfs({"-f", image.path()});
      INFO(forced.out);
      CHECK(forced.exit_code == 0);
      CHECK_THAT(forced.out, Catch::Contains(std::string("wiping the ") + f.name));
      RequireOnlyNvfs(image.path());
      RequireFsckClean(image.path());
    }
  }
}

TEST_CASE("mkfs.nvfs refuses a real ext4 image", "[mkfs][cli]") {
  if (test::RunShell("command -v mkfs.ext4").exit_code != 0) {
    WARN("mkfs.ext4 is not installed; covered by the magic-only case");
    return;
  }
  TempPath image("cli-ext4");
  MakeFile(image.path(), 64 * kMiB);
  const RunResult made = test::RunShell("mkfs.ext4 -q -F '" + image.path() + "'");
  INFO(made.out);
  REQUIRE(made.exit_code == 0);
  RequireRefusedWithoutForce(image.path(), "ext2/ext3/ext4");

  const RunResult forced = Mkfs({"-f", image.path()});
  INFO(forced.out);
  CHECK(forced.exit_code == 0);
  RequireOnlyNvfs(image.path());
  RequireFsckClean(image.path());
}

TEST_CASE("mkfs.nvfs leaves the namespace unchanged on every bad input", "[mkfs][cli]") {
  // A formatted image, and -f on every command, so that what is refused is
  // the bad input itself and not the filesystem already there.
  TempPath image("cli-bad");
  MakeNvfsImage(image.path());
  const FileDigest before = DigestFile(image.path());
  const std::string p = image.path();
  struct Bad {
    const char* what;
    std::vector<std::string> args;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {"block size not a power of two", {"-f", "-b", "3000", p}, "block size"},
      {"block size below 4k", {"-f", "-b", "2048", p}, "block size"},
      {"block size above 1M", {"-f", "-b", "2M", p}, "block size"},
      {"block size garbage", {"-f", "-b", "big", p}, "invalid block size"},
      {"-N and -i together", {"-f", "-N", "1000", "-i", "16k", p}, "mutually exclusive"},
      {"-N zero", {"-f", "-N", "0", p}, "inode count"},
      {"-N too many", {"-f", "-N", "1G", p}, "inodes"},
      {"-i below the inode size", {"-f", "-i", "100", p}, "bytes per inode"},
      {"bad UUID", {"-f", "-U", "not-a-uuid", p}, "invalid UUID"},
      {"UUID one digit short", {"-f", "-U", "01234567-89ab-cdef-0123-456789abcde", p},
       "invalid UUID"},
      {"label too long", {"-f", "-L", std::string(64, 'l'), p}, "label too long"},
      {"-s smaller than the image", {"-f", "-s", "32M", p}, "does not shrink"},
      {"-s zero", {"-f", "-s", "0", p}, "invalid size"},
      {"-s garbage", {"-f", "-s", "lots", p}, "invalid size"},
      {"two devices", {"-f", p, p}, "too many arguments"},
      {"unknown option", {"-f", "-Z", p}, "Usage"},
  };
  for (const Bad& b : bad) {
    const RunResult r = Mkfs(b.args);
    INFO(b.what << ":\n" << r.out);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.out, Catch::Contains(b.says));
    REQUIRE(DigestFile(p) == before);
  }
  // The image was fine all along.
  RequireFsckClean(p);
}

TEST_CASE("mkfs.nvfs refuses too small a namespace", "[mkfs][cli]") {
  SECTION("-s 100k on a missing file creates nothing") {
    TempPath image("cli-small-new");
    const RunResult r = Mkfs({"-s", "100k", image.path()});
    INFO(r.out);
    CHECK(r.exit_code != 0);
    CHECK(Lines(r.out).size() == 1);
    CHECK_THAT(r.out, Catch::Contains("too small"));
    CHECK_THAT(r.out, Catch::Contains(std::to_string(Geometry::MinNamespaceSize(4096))));
    CHECK_FALSE(PathExists(image.path()));
  }
  SECTION("an existing 100 KiB file is left alone") {
    TempPath image("cli-small-old");
    MakeFile(image.path(), 100 * kKiB, 's');
    const FileDigest before = DigestFile(image.path());
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{image.path()}, {"-f", image.path()},
          {"-f", "-s", "100k", image.path()}}) {
      const RunResult r = Mkfs(args);
      INFO(r.out);
      CHECK(r.exit_code != 0);
      CHECK_THAT(r.out, Catch::Contains("too small"));
      CHECK(DigestFile(image.path()) == before);
    }
  }
}

TEST_CASE("mkfs.nvfs refuses a missing device without -s, and a directory", "[mkfs][cli]") {
  TempPath missing("cli-missing");
  RunResult r = Mkfs({missing.path()});
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK(Lines(r.out).size() == 1);
  CHECK_THAT(r.out, Catch::Contains("-s"));
  CHECK_FALSE(PathExists(missing.path()));

  TempPath dir("cli-dir");
  REQUIRE(mkdir(dir.path().c_str(), 0755) == 0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{dir.path()}, {"-f", dir.path()},
        {"-f", "-s", "64M", dir.path()}}) {
    r = Mkfs(args);
    INFO(r.out);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.out, Catch::Contains("not a regular file"));
    struct stat st;
    REQUIRE(stat(dir.path().c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
  }
  DIR* d = opendir(dir.path().c_str());
  REQUIRE(d != nullptr);
  int entries = 0;
  while (readdir(d) != nullptr) ++entries;
  closedir(d);
  CHECK(entries == 2);  // "." and ".."

  r = Mkfs({});
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.out, Catch::Contains("no DEVICE"));
}

TEST_CASE("mkfs.nvfs --help and --version", "[mkfs][cli]") {
  for (const char* flag : {"--help", "-h"}) {
    const RunResult r = Mkfs({flag});
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::StartsWith("Usage: mkfs.nvfs"));
  }
  for (const char* flag : {"--version", "-V"}) {
    const RunResult r = Mkfs({flag});
    CHECK(r.exit_code == 0);
    CHECK(r.out == std::string("mkfs.nvfs ") + NVFS_VERSION + "\n");
  }
}

TEST_CASE("mkfs.nvfs refuses a namespace in use", "[mkfs][cli][lock]") {
  TempPath image("cli-locked");
  MakeNvfsImage(image.path());
  const FileDigest before = DigestFile(image.path());
  for (bool read_only : {false, true}) {
    INFO((read_only ? "held read-only" : "held writable"));
    MediaOptions options;
    options.read_only = read_only;
    auto held = OpenMedia(image.path(), options);
    REQUIRE(held.ok());
    const RunResult r = Mkfs({"-f", image.path()});
    INFO(r.out);
    CHECK(r.exit_code != 0);
    // Held writable, even the read-only look is refused; held read-only, the
    // look succeeds (and prints the plan) and the writable open is refused.
    if (!read_only) CHECK(Lines(r.out).size() == 1);
    CHECK_THAT(r.out, Catch::Contains("mkfs.nvfs: " + image.path() + ": in use"));
    CHECK(DigestFile(image.path()) == before);
  }
  // Released: now it works.
  const RunResult r = Mkfs({"-q", "-f", image.path()});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(DigestFile(image.path()) == before);
}

// ---------------------------------------------------------------------------
// The namespace is the boundary (doc/integrity.md): images are the owner's,
// and every program says so once when every user can read or write one.
// ---------------------------------------------------------------------------

mode_t ModeOf(const std::string& path) {
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// The lines of `out` that carry a warning.
std::vector<std::string> Warnings(const std::string& out) {
  std::vector<std::string> found;
  for (const std::string& line : Lines(out)) {
    if (line.find("warning") != std::string::npos) found.push_back(line);
  }
  return found;
}

std::string ReadWarning(const std::string& program, const std::string& path) {
  return program + ": warning: " + path + " can be read by every user, who can then read every "
         "file in it whatever its permissions; chmod o-rw " + path;
}

TEST_CASE("mkfs.nvfs -s creates the image 0600, even under umask 0", "[mkfs][cli][namespace]") {
  TempPath image("cli-mode");
  const char* mkfs = std::getenv("NVFS_MKFS");
  REQUIRE(mkfs != nullptr);
  const RunResult r =
      test::RunShell(std::string("umask 0 && '") + mkfs + "' -q -s 64M '" + image.path() + "'");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.empty());
  CHECK(ModeOf(image.path()) == 0600);
  RequireFsckClean(image.path());
}

TEST_CASE("mkfs.nvfs keeps an existing image's mode, and warns once when every user can read it",
          "[mkfs][cli][namespace]") {
  TempPath image("cli-keep-mode");
  MakeFile(image.path(), 0);
  REQUIRE(chmod(image.path().c_str(), 0640) == 0);  // a group: the administrator's choice
  const RunResult quiet = Mkfs({"-q", "-s", "64M", image.path()});
  INFO(quiet.out);
  REQUIRE(quiet.exit_code == 0);
  CHECK(quiet.out.empty());
  CHECK(ModeOf(image.path()) == 0640);

  REQUIRE(chmod(image.path().c_str(), 0644) == 0);
  for (const char* flag : {"-n", "-q"}) {  // a dry run too, and even when quiet
    const RunResult r = Mkfs({flag, "-f", image.path()});
    INFO(flag << ": " << r.out);
    CHECK(r.exit_code == 0);
    const std::vector<std::string> warnings = Warnings(r.out);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0] == ReadWarning("mkfs.nvfs", image.path()));
  }
  CHECK(ModeOf(image.path()) == 0644);
  RequireFsckClean(image.path());
}

TEST_CASE("fsck.nvfs and nvfs-dump warn in one line about a namespace every user can read or "
          "write, and not about a group", "[mkfs][cli][namespace]") {
  TempPath image("cli-exposed");
  MakeNvfsImage(image.path());
  const std::string& p = image.path();
  const auto dump = [](const std::string& path) { return Run("NVFS_DUMP", {path}); };
  const auto fsck = [](const std::string& path) { return Fsck({"-n", path}); };
  const std::string fix = " every file in it whatever its permissions; chmod o-rw " + p;
  struct Case {
    mode_t mode;
    std::string warning;  // after "PROGRAM: warning: "; empty: none
  };
  const Case cases[] = {
      {0604, p + " can be read by every user, who can then read" + fix},
      {0602, p + " can be written by every user, who can then change" + fix},
      {0640, ""},
      {0660, ""},
      {0600, ""},
  };
  for (const Case& c : cases) {
    REQUIRE(chmod(p.c_str(), c.mode) == 0);
    for (const bool is_dump : {false, true}) {
      const char* program = is_dump ? "nvfs-dump" : "fsck.nvfs";
      const RunResult r = is_dump ? dump(p) : fsck(p);
      INFO(program << " on mode 0" << std::oct << c.mode << ": " << r.out);
      CHECK(r.exit_code == 0);
      const std::vector<std::string> warnings = Warnings(r.out);
      if (c.warning.empty()) {
        CHECK(warnings.empty());
      } else {
        REQUIRE(warnings.size() == 1);
        CHECK(warnings[0] == std::string(program) + ": warning: " + c.warning);
      }
    }
  }
}

}  // namespace
}  // namespace nvfs
