// Regression tests for what the corrupted-image suite found: each builds the
// damage by hand on a seed image and checks the property that failed, plus
// what a user sees after it.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <memory>

#include "arena_media.hpp"
#include "fuzz_target.hpp"
#include "mutator.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/superblock.hpp"
#include "seeds.hpp"

namespace nvfs::fuzz {
namespace {

using format::Inode;
using format::SuperDynamic;

const Seed& CachedSeed(const std::string& name) {
  static std::map<std::string, Seed> seeds;
  auto it = seeds.find(name);
  if (it == seeds.end()) it = seeds.emplace(name, BuildSeed(name)).first;
  return it->second;
}

struct Damaged {
  explicit Damaged(const std::string& seed_name)
      : arena(CachedSeed(seed_name).image.size()) {
    arena.Load(CachedSeed(seed_name).image);
    geometry = FindSuper(arena.data(), arena.size())->geometry;
  }
  SuperDynamic Dynamic() const { return arena.Peek<SuperDynamic>(format::kSuperDynamicOffset); }
  void PutDynamic(SuperDynamic d) {
    d.checksum = SuperDynamicChecksum(d);
    arena.PokeValue(format::kSuperDynamicOffset, d);
  }
  Inode InodeOf(uint64_t ino) const { return arena.Peek<Inode>(geometry.InodeOffset(ino)); }
  template <class T>
  void PutField(uint64_t ino, size_t field_offset, const T& value) {
    arena.PokeValue(geometry.InodeOffset(ino) + field_offset, value);
  }
  // Mounts read-write, and unmounts at once; returns the mount's error, or "".
  std::string MountOnce() {
    auto fs = Filesystem::Mount(std::make_unique<ArenaMedia>(arena, false), MountOptions{});
    if (!fs.ok()) return fs.error().Describe();
    REQUIRE((*fs)->Unmount().ok());
    return "";
  }
  // The inode `name` names in the root (a read-only mount).
  uint64_t InoOf(const std::string& name) {
    auto fs = Filesystem::Mount(std::make_unique<ArenaMedia>(arena, true),
                                MountOptions{.read_only = true});
    REQUIRE(fs.ok());
    auto attr = (*fs)->Lookup(1, name);
    REQUIRE(attr.ok());
    return attr->ino;
  }
  int Fsck(RepairMode mode) {
    ArenaMedia media(arena, mode == RepairMode::kNone);
    return CheckNamespace(media, mode, {}).exit_code;
  }
  void RequireAllPropertiesHold() {
    const CaseResult r = RunCase(arena, CaseOptions{});
    for (const std::string& v : r.violations) FAIL_CHECK(v);
  }

  Arena arena;
  Geometry geometry;
};

TEST_CASE("regression: a mount failed, having written, at a damaged orphan past a reclaimed one",
          "[fuzz][regression]") {
  // orphans:107 — the second orphan's map points outside the filesystem; the
  // mount reclaimed the first orphan (committed), then failed on the second.
  Damaged d("orphans");
  const uint64_t head = d.Dynamic().orphan_head;
  const uint64_t second = d.InodeOf(head).orphan_next;
  REQUIRE(second != 0);
  d.PutField(second, offsetof(Inode, map) + 8 * 1, uint64_t{~0ull});
  d.RequireAllPropertiesHold();
  // Now: the mount goes on, the damaged orphan left for fsck, the error flag set.
  CHECK(d.MountOnce() == "");
  CHECK(d.Dynamic().errors == 1);
  CHECK(d.Dynamic().orphan_head == second);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckUncorrected);
  CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
  CHECK(d.MountOnce() == "");
  CHECK(d.Dynamic().orphan_head == 0);
}

TEST_CASE("regression: a mount failed, having written, at a damaged orphan link",
          "[fuzz][regression]") {
  // orphans:377 — the list's second link names an inode that is no orphan.
  Damaged d("orphans");
  const uint64_t head = d.Dynamic().orphan_head;
  d.PutField(head, offsetof(Inode, orphan_next), uint64_t{1});
  d.RequireAllPropertiesHold();
  // Nothing of the list is processed: checked whole before the first orphan.
  CHECK(d.MountOnce() == "");
  CHECK(d.Dynamic().errors == 1);
  CHECK(d.Dynamic().orphan_head == head);
  CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
}

TEST_CASE("regression: an orphan list in a loop made the mount free an inode, then fail",
          "[fuzz][regression]") {
  Damaged d("orphans");
  const uint64_t head = d.Dynamic().orphan_head;
  const uint64_t second = d.InodeOf(head).orphan_next;
  d.PutField(second, offsetof(Inode, orphan_next), head);
  d.RequireAllPropertiesHold();
  CHECK(d.MountOnce() == "");
  CHECK(d.Dynamic().errors == 1);
  // Both orphans are still there for fsck: no inode was freed.
  CHECK(d.InodeOf(head).mode != 0);
  CHECK(d.InodeOf(second).mode != 0);
  CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
}

TEST_CASE("regression: journal recovery, then a damaged orphan list, failed the mount having "
          "written", "[fuzz][regression]") {
  // recovery:495 — orphan_head names a free inode (checksum recomputed).
  Damaged d("recovery");
  SuperDynamic dyn = d.Dynamic();
  dyn.orphan_head = 653;
  d.PutDynamic(dyn);
  d.RequireAllPropertiesHold();
  CHECK(d.MountOnce() == "");
  CHECK(d.Dynamic().errors == 1);
}

TEST_CASE("regression: an orphan directory still linked would have been truncated as a file",
          "[fuzz][regression]") {
  // Mount's orphan pass truncates orphans with links (a cut-short truncate);
  // a directory on the list with links is damage, not a file to truncate.
  Damaged d("orphans");
  const uint64_t head = d.Dynamic().orphan_head;
  Inode inode = d.InodeOf(head);
  inode.mode = S_IFDIR | 0755;
  inode.nlink = 2;
  d.arena.PokeValue(d.geometry.InodeOffset(head), inode);
  d.RequireAllPropertiesHold();
  CHECK(d.MountOnce() == "");
  CHECK(d.Dynamic().errors == 1);
}

TEST_CASE("regression: fsck put a linked inode that is no regular file on the orphan list",
          "[fuzz][regression]") {
  // recovery:409 and recovery:1736 (master seed 7): flags set to all ones on
  // a symlink, on a device. fsck -y kept the orphan flag and put the inode on
  // the orphan list; mount's orphan pass (rightly) takes a linked orphan for a
  // cut-short truncation, which only regular files have, and found the list
  // damaged.
  for (const char* name : {"short-link", "long-link", "chardev", "fifo", "a"}) {
    SECTION(name) {
      Damaged d("populated");
      const uint64_t ino = d.InoOf(name);
      d.PutField(ino, offsetof(Inode, flags), uint32_t{0xFFFFFFFF});
      d.RequireAllPropertiesHold();
      CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
      CHECK((d.InodeOf(ino).flags & format::kInodeFlagOrphan) == 0);
      CHECK(d.Dynamic().orphan_head == 0);
      CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
      CHECK(d.MountOnce() == "");
      CHECK(d.Dynamic().errors == 0);
    }
  }
}

TEST_CASE("regression: an orphan named by an entry gets its link back and leaves the list",
          "[fuzz][regression]") {
  // The same rule from the other side: an unlinked symlink on the orphan list
  // that an entry still names gets its link count back (pass 4), and then may
  // not stay an orphan.
  Damaged d("populated");
  const uint64_t ino = d.InoOf("short-link");
  Inode inode = d.InodeOf(ino);
  inode.nlink = 0;
  inode.flags |= format::kInodeFlagOrphan;
  d.arena.PokeValue(d.geometry.InodeOffset(ino), inode);
  SuperDynamic dyn = d.Dynamic();
  dyn.orphan_head = ino;
  d.PutDynamic(dyn);
  d.RequireAllPropertiesHold();
  CHECK(d.Fsck(RepairMode::kPreen) == kFsckCorrected);
  CHECK(d.InodeOf(ino).nlink == 1);
  CHECK((d.InodeOf(ino).flags & format::kInodeFlagOrphan) == 0);
  CHECK(d.Dynamic().orphan_head == 0);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
  CHECK(d.MountOnce() == "");
  CHECK(d.InoOf("short-link") == ino);  // not reclaimed by the mount
}

}  // namespace
}  // namespace nvfs::fuzz
