// Regression tests for what the corrupted-image suite found: each builds the
// damage by hand on a seed image and checks the property that failed, plus
// what a user sees after it.
#include <fcntl.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arena_media.hpp"
#include "containment.hpp"
#include "fuzz_target.hpp"
#include "mutator.hpp"
#include "nvfs/crc32c.hpp"
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
  explicit Damaged(const std::string& name)
      : seed_name(name), arena(CachedSeed(name).image.size()) {
    arena.Load(CachedSeed(name).image);
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
  // RunCase with the seed's census: the survival properties must hold, and
  // every untouched file keep its bytes. A containment failure fails the
  // test under NVFS_FUZZ_CONTAINMENT=strict (or local, for a mutation of no
  // global metadata) and is a warning otherwise (containment.hpp).
  void RequireContained() {
    CaseOptions options;
    options.census = &CachedCensus();
    const CaseResult r = RunCase(arena, options);
    for (const std::string& v : r.violations) FAIL_CHECK(v);
    const ContainmentMode mode = ContainmentModeFromEnv();
    const bool fails = mode == ContainmentMode::kStrict ||
                       (mode == ContainmentMode::kLocal && r.touch.global == 0);
    INFO(r.touch.Describe());
    for (const std::string& c : r.containment) {
      if (fails) {
        FAIL_CHECK("containment: " + c);
      } else if (mode != ContainmentMode::kOff) {
        WARN("containment (NVFS_FUZZ_CONTAINMENT=" << ModeName(mode) << ", not failing): " << c);
      }
    }
  }
  const Census& CachedCensus() {
    static std::map<std::string, std::unique_ptr<Census>> censuses;
    auto& census = censuses[seed_name];
    if (!census) {
      Arena intact(CachedSeed(seed_name).image.size());
      intact.Load(CachedSeed(seed_name).image);
      census = std::make_unique<Census>(intact);
    }
    return *census;
  }
  uint64_t DirectOf(uint64_t ino, uint32_t i) const { return InodeOf(ino).map.file.direct[i]; }
  void SetDirect(uint64_t ino, uint32_t i, uint64_t block_no) {
    PutField(ino, offsetof(Inode, map) + 8 * i, block_no);
  }

  std::string seed_name;
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

// Containment (issue 12, item 4): what the census found spreading on the
// code of 04d9254. Each fails under NVFS_FUZZ_CONTAINMENT=strict until
// branch `contain` fixes it; the fuzz case that first showed it is named.

TEST_CASE("containment: a write through a damaged pointer overwrites another file's block",
          "[fuzz][regression][containment]") {
  // full:281 (inode.direct@21888=674): a direct pointer of one file set to a
  // block of another; the read-write pass writes, punches and zeroes the
  // damaged file, and the other file's bytes change. Here: the first pointer
  // of /three-blocks (the existing file the pass overwrites) names /linked's
  // block; /linked reads 'n's after the pass.
  Damaged d("populated");
  const uint64_t damaged = d.InoOf("three-blocks"), owner = d.InoOf("linked");
  REQUIRE(d.geometry.InodeOffset(damaged) >> d.geometry.block_shift() !=
          d.geometry.InodeOffset(owner) >> d.geometry.block_shift());
  d.SetDirect(damaged, 0, d.DirectOf(owner, 0));
  d.RequireContained();
}

TEST_CASE("containment: fsck -y gives a shared block to the lower inode, the untouched owner "
          "loses it", "[fuzz][regression][containment]") {
  // full:67 (inode.direct@28080=820), full:1106 (pointer.slot), two-groups:225,
  // collisions:214, recovery:901: a damaged pointer names a block of a file
  // in another inode-table block; fsck claims blocks in inode order, keeps the
  // damaged file's pointer and clears the untouched owner's. Here /small (not
  // written by the pass) names /linked's block; /linked is intact until
  // fsck -y.
  Damaged d("populated");
  const uint64_t damaged = d.InoOf("small"), owner = d.InoOf("linked");
  REQUIRE(damaged < owner);
  REQUIRE(d.geometry.InodeOffset(damaged) >> d.geometry.block_shift() !=
          d.geometry.InodeOffset(owner) >> d.geometry.block_shift());
  d.SetDirect(damaged, 0, d.DirectOf(owner, 0));
  d.RequireContained();
}

TEST_CASE("containment: a block bitmap word cleared lets the allocator hand out blocks files use",
          "[fuzz][regression][containment]") {
  // populated:381, recovery:127 (bitmap.blocks@4136): 64 bits of the block
  // bitmap cleared over the block of /small and its neighbours; the files the
  // read-write pass creates get those blocks and overwrite them. (The
  // allocator trusts the bitmap; no pointer check can see this.)
  Damaged d("populated");
  const uint64_t used = d.DirectOf(d.InoOf("small"), 0);
  const uint64_t word_at = d.geometry.BlockOffset(d.geometry.BlockBitmapBlock(0)) + used / 64 * 8;
  d.arena.PokeValue(word_at, uint64_t{0});
  d.RequireContained();
}

TEST_CASE("containment: fsck -y trusts a damaged inode bitmap and drops live files",
          "[fuzz][regression][containment]") {
  // populated:355, populated:34 (bitmap.inodes@12296=0): inodes 64-127 marked
  // free; their inodes and entries are intact, yet fsck -y drops the entries
  // as naming "an inode not in use" and the files are gone.
  Damaged d("populated");
  d.arena.PokeValue(d.geometry.BlockOffset(d.geometry.InodeBitmapBlock(0)) + 8, uint64_t{0});
  d.RequireContained();
}

// Found again once the pointer checks were merged, with the repair rules of
// doc/integrity.md section 9.

TEST_CASE("containment: fsck -y keeps the key the root directory agrees with when the primary "
          "superblock's hash key changed", "[fuzz][regression][containment]") {
  // populated:309 and the other super.dir_hash_key+crc cases: the primary's
  // key replaced, its checksum recomputed. fsck -y trusted the primary,
  // dropped every entry as "not its name's hash" and rewrote the backup.
  Damaged d("populated");
  format::SuperStatic sb = d.arena.Peek<format::SuperStatic>(format::kSuperStaticOffset);
  sb.dir_hash_key[0] ^= 0x5a;
  sb.checksum = SuperStaticChecksum(sb);
  d.arena.PokeValue(format::kSuperStaticOffset, sb);
  const uint64_t small = [&] {
    Damaged intact("populated");
    return intact.InoOf("small");
  }();
  d.RequireContained();
  CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
  CHECK(d.InoOf("small") == small);  // the entries are still there
}

TEST_CASE("containment: fsck -y keeps the backup superblock when the primary's block count "
          "shrank", "[fuzz][regression][containment]") {
  // orphans:330, recovery:188 (super.block_count=2047+crc): fsck -y trusted
  // the primary and cleared every pointer past its end.
  Damaged d("populated");
  format::SuperStatic sb = d.arena.Peek<format::SuperStatic>(format::kSuperStaticOffset);
  const uint64_t blocks = sb.block_count;
  sb.block_count = blocks - 1;
  sb.checksum = SuperStaticChecksum(sb);
  d.arena.PokeValue(format::kSuperStaticOffset, sb);
  d.RequireContained();
  CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
  CHECK(d.arena.Peek<format::SuperStatic>(format::kSuperStaticOffset).block_count == blocks);
}

TEST_CASE("containment: the read-write mount refuses blocks the block bitmap shows free "
          "but files use", "[fuzz][regression][containment]") {
  // The mount's cross-check (src/fs/cross_check.cpp): a cleared block bitmap
  // word over /small's block: damage found
  // at mount, read-only; with errors=continue the units are still never
  // handed out.
  Damaged d("populated");
  const uint64_t ino = d.InoOf("small");
  const uint64_t used = d.DirectOf(ino, 0);
  const uint64_t word_at = d.geometry.BlockOffset(d.geometry.BlockBitmapBlock(0)) + used / 64 * 8;
  d.arena.PokeValue(word_at, uint64_t{0});
  {
    auto fs = Filesystem::Mount(std::make_unique<ArenaMedia>(d.arena, false), MountOptions{});
    REQUIRE(fs.ok());
    CHECK((*fs)->read_only());
    REQUIRE((*fs)->Unmount().ok());
  }
  CHECK(d.Dynamic().errors == 1);
  CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
  CHECK(d.MountOnce() == "");
  CHECK(d.Dynamic().errors == 0);
}

TEST_CASE("containment: recovery refuses an undo record whose length, checksum fixed, runs "
          "past its block", "[fuzz][regression][containment]") {
  // recovery:1585 (journal.record.length=32769+crc+backup): the active
  // slot's undo record made longer, its checksum recomputed over the longer
  // payload; recovery wrote the bytes past its target over /a/b/in-b's data.
  Damaged d("recovery");
  const Geometry& g = d.geometry;
  bool damaged = false;
  uint64_t victim = 0;  // the block after the record's target
  for (uint32_t slot = 0; slot < g.journal_slots() && !damaged; ++slot) {
    const uint64_t at = g.JournalSlotOffset(slot);
    const auto header = d.arena.Peek<format::JournalSlotHeader>(at);
    if (header.state != static_cast<uint32_t>(format::JournalState::kActive)) continue;
    for (uint64_t pos = at + sizeof header; pos + sizeof(format::JournalRecord) <= at + g.journal_slot_size();) {
      auto r = d.arena.Peek<format::JournalRecord>(pos);
      if (r.tx_seq != header.tx_seq) break;
      const bool undo = r.type == static_cast<uint16_t>(format::JournalRecordType::kUndo);
      const uint64_t room = at + g.journal_slot_size() - pos - sizeof r;
      const uint64_t longer = g.block_size() - r.target % g.block_size() + 64;
      const uint64_t next = r.target / g.block_size() + 1;
      const bool in_journal =
          next >= g.journal_block() && next < g.journal_block() + g.journal_blocks();
      if (undo && longer <= room && !in_journal && next < g.BackupBlock()) {
        victim = next;
        r.length = static_cast<uint32_t>(longer);
        r.checksum = 0;
        uint32_t crc = Crc32c(0, &r, sizeof r);
        r.checksum = Crc32c(crc, d.arena.data() + pos + sizeof r, longer);
        d.arena.PokeValue(pos, r);
        damaged = true;
        break;
      }
      pos += sizeof r + (undo ? (uint64_t{r.length} + 7) / 8 * 8 : 0);
    }
  }
  REQUIRE(damaged);
  std::vector<std::byte> before(d.arena.data() + g.BlockOffset(victim),
                                d.arena.data() + g.BlockOffset(victim + 1));
  d.RequireContained();  // (leaves the arena as it was)
  CHECK(d.MountOnce() == "");  // recovery: the log ends before the damaged record
  CHECK(std::memcmp(before.data(), d.arena.data() + g.BlockOffset(victim), before.size()) == 0);
}

// Issue 12.4, class 4 for directories and the root (doc/integrity.md,
// section 9): populated:355, orphans:1070, two-groups:130 and the other
// inode-bitmap words over the root and the first directories.

TEST_CASE("containment: fsck -y keeps the root and directories whose inode bits were cleared",
          "[fuzz][regression][containment]") {
  // Inode bitmap word 0 (inodes 0-63: the root, lost+found, /a to /a/b/c/d,
  // the files of the root) cleared: fsck -y made a new, empty root and
  // dropped the entries naming the directories, losing the files under them
  // whose bits were cleared too (only an entry in a kept directory revived a
  // file).
  Damaged d("populated");
  const uint64_t a = d.InoOf("a");
  const uint64_t big = d.InoOf("big");
  REQUIRE(a < 64);
  d.arena.PokeValue(d.geometry.BlockOffset(d.geometry.InodeBitmapBlock(0)), uint64_t{0});
  d.RequireContained();
  CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
  CHECK(d.InoOf("a") == a);
  CHECK(d.InoOf("big") == big);
  CHECK(d.InoOf("small") != 0);
}

TEST_CASE("containment: the read-write mount never hands out an inode an entry names whose "
          "bit was cleared", "[fuzz][regression][containment]") {
  // The cross-check reads the entries of the leaves it walks: /small's bit
  // cleared is damage (read-only), and even with errors=continue a new file
  // is not given /small's number (which would overwrite /small's inode).
  Damaged d("populated");
  const uint64_t small = d.InoOf("small");
  const uint64_t at = d.geometry.BlockOffset(d.geometry.InodeBitmapBlock(0)) + small / 8;
  d.arena.PokeValue(at, static_cast<uint8_t>(d.arena.Peek<uint8_t>(at) & ~(1u << (small % 8))));
  {
    auto fs = Filesystem::Mount(std::make_unique<ArenaMedia>(d.arena, false), MountOptions{});
    REQUIRE(fs.ok());
    CHECK((*fs)->read_only());
    REQUIRE((*fs)->Unmount().ok());
  }
  CHECK(d.Dynamic().errors == 1);
  {
    MountOptions options;
    options.errors = ErrorBehavior::kContinue;
    auto fs = Filesystem::Mount(std::make_unique<ArenaMedia>(d.arena, false), options);
    REQUIRE(fs.ok());
    for (int i = 0; i < 70; ++i) {  // past the first bitmap word
      Attr attr;
      auto f = (*fs)->Create(1, "new-" + std::to_string(i), 0644, O_RDWR, Cred{0, 0}, &attr);
      REQUIRE(f.ok());
      CHECK(attr.ino != small);
      (*fs)->Release(*f);
      (*fs)->Forget(attr.ino, 1);
    }
    REQUIRE((*fs)->Unmount().ok());
  }
  CHECK(d.Fsck(RepairMode::kYes) == kFsckCorrected);
  CHECK(d.Fsck(RepairMode::kNone) == kFsckClean);
  CHECK(d.InoOf("small") == small);
  CHECK(d.InodeOf(small).size == 13);  // "hello, world\n"
}

}  // namespace
}  // namespace nvfs::fuzz
