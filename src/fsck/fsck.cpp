#include "nvfs/fsck.hpp"

#include <sys/stat.h>

#include <cinttypes>
#include <cstdarg>
#include <cstring>
#include <vector>

#include "nvfs/bitmap.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs {

namespace {

using format::GroupDesc;
using format::SuperDynamic;
using format::SuperStatic;

class Checker {
 public:
  Checker(Media& media, RepairMode mode, const std::function<void(const std::string&)>& say,
          const std::function<void(uint64_t, uint64_t)>& progress)
      : media_(media), mode_(mode), say_(say), progress_(progress) {}

  FsckReport Run();

 private:
  void Say(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  // Records a problem; returns true if the caller should repair it.
  bool Problem(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  // Records a problem this version cannot repair in any mode.
  void Unrepairable(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  void Fixed() { ++report_.corrected; }
  bool CanWrite() const { return mode_ != RepairMode::kNone; }

  void CheckStaticCopies(const FoundSuper& found);
  void CheckDynamic();
  void CheckGroup(uint32_t group);
  void CheckJournal();
  void CheckRoot();

  Media& media_;
  RepairMode mode_;
  const std::function<void(const std::string&)>& say_;
  const std::function<void(uint64_t, uint64_t)>& progress_;
  FsckReport report_;
  Geometry geometry_;
  SuperDynamic dynamic_{};
  bool dynamic_ok_ = false;
  bool rebuild_dynamic_ = false;
  uint64_t free_blocks_ = 0;
  uint64_t free_inodes_ = 0;
};

void Checker::Say(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (say_) say_(buf);
}

bool Checker::Problem(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ++report_.problems;
  if (say_) say_(std::string(buf) + (CanWrite() ? ": fixing" : ": not fixed (-n)"));
  return CanWrite();
}

void Checker::Unrepairable(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ++report_.problems;
  if (say_) say_(std::string(buf) + ": not fixed (needs the full check)");
}

FsckReport Checker::Run() {
  Result<FoundSuper> found = FindSuper(media_.base(), media_.size());
  if (!found.ok()) {
    Say("%s: %s", media_.path().c_str(), found.error().message.c_str());
    report_.exit_code = found.error().code == EUCLEAN ? kFsckUncorrected : kFsckOperational;
    return report_;
  }
  geometry_ = found->geometry;
  report_.inode_count = geometry_.inode_count();
  report_.block_count = geometry_.block_count();
  if (UnknownRoCompat(found->sb) != 0 && CanWrite()) {
    Say("%s: unknown read-only-compatible features 0x%" PRIx64 "; refusing to repair",
        media_.path().c_str(), UnknownRoCompat(found->sb));
    report_.exit_code = kFsckOperational;
    return report_;
  }
  CheckStaticCopies(found.value());
  CheckDynamic();
  for (uint32_t group = 0; group < geometry_.group_count(); ++group) {
    CheckGroup(group);
    if (progress_) progress_(group + 1, geometry_.group_count());
  }
  CheckJournal();
  CheckRoot();
  if (rebuild_dynamic_) {
    // Marked not clean, so the next mount runs recovery and recounts.
    SuperDynamic fresh{};
    std::memcpy(fresh.magic, format::kSuperDynamicMagic, sizeof fresh.magic);
    fresh.state = static_cast<uint32_t>(format::FsState::kMounted);
    fresh.free_blocks = free_blocks_;
    fresh.free_inodes = free_inodes_;
    fresh.next_generation = RandomU64() >> 32;
    fresh.checksum = SuperDynamicChecksum(fresh);
    media_.Store(format::kSuperDynamicOffset, &fresh, sizeof fresh);
    media_.Persist(format::kSuperDynamicOffset, sizeof fresh);
    Fixed();
  } else if (dynamic_ok_ && report_.clean_state &&
      (dynamic_.free_blocks != free_blocks_ || dynamic_.free_inodes != free_inodes_)) {
    if (Problem("superblock free counts %" PRIu64 " blocks, %" PRIu64 " inodes; bitmaps say %"
                PRIu64 ", %" PRIu64, dynamic_.free_blocks, dynamic_.free_inodes, free_blocks_,
                free_inodes_)) {
      dynamic_.free_blocks = free_blocks_;
      dynamic_.free_inodes = free_inodes_;
      dynamic_.checksum = SuperDynamicChecksum(dynamic_);
      media_.Store(format::kSuperDynamicOffset, &dynamic_, sizeof dynamic_);
      media_.Persist(format::kSuperDynamicOffset, sizeof dynamic_);
      Fixed();
    }
  }
  report_.inodes_used = geometry_.inode_count() - free_inodes_;
  report_.blocks_used = geometry_.block_count() - free_blocks_;
  if (report_.problems > report_.corrected) {
    report_.exit_code = kFsckUncorrected;
  } else if (report_.corrected > 0) {
    report_.exit_code = kFsckCorrected;
  }
  return report_;
}

// The primary and the backup static halves must both be valid and identical.
void Checker::CheckStaticCopies(const FoundSuper& found) {
  const uint64_t backup = geometry_.BackupSuperOffset();
  if (found.from_backup) {
    Say("primary superblock is damaged (%s); using the backup copy at byte %" PRIu64,
        found.primary_error.c_str(), backup);
    if (Problem("primary superblock damaged")) {
      media_.Store(format::kSuperStaticOffset, &found.sb, sizeof found.sb);
      media_.Persist(format::kSuperStaticOffset, sizeof found.sb);
      Fixed();
    }
    return;
  }
  SuperStatic copy;
  std::memcpy(&copy, media_.base() + backup, sizeof copy);
  if (std::memcmp(&copy, &found.sb, sizeof copy) != 0) {
    Result<Geometry> valid = CheckSuperStatic(copy, media_.size());
    if (Problem("backup superblock at byte %" PRIu64 " %s", backup,
                valid.ok() ? "differs from the primary" : "is damaged")) {
      media_.Store(backup, &found.sb, sizeof found.sb);
      media_.Persist(backup, sizeof found.sb);
      Fixed();
    }
  }
}

void Checker::CheckDynamic() {
  std::memcpy(&dynamic_, media_.base() + format::kSuperDynamicOffset, sizeof dynamic_);
  Status st = CheckSuperDynamic(dynamic_);
  if (st.ok()) {
    dynamic_ok_ = true;
    report_.clean_state = dynamic_.state == static_cast<uint32_t>(format::FsState::kClean);
    if (!report_.clean_state) {
      Say("filesystem was not cleanly unmounted; the next mount recovers it");
    }
    if (dynamic_.errors != 0) Unrepairable("superblock records earlier errors");
    return;
  }
  // Rebuilt by Run() once the groups are counted.
  if (Problem("%s", st.error().message.c_str())) rebuild_dynamic_ = true;
}

void Checker::CheckGroup(uint32_t group) {
  const Geometry& g = geometry_;
  const uint64_t desc_offset = g.BlockOffset(g.GroupDescBlock(group));
  GroupDesc desc;
  std::memcpy(&desc, media_.base() + desc_offset, sizeof desc);
  const std::byte* block_bitmap = media_.base() + g.BlockOffset(g.BlockBitmapBlock(group));
  const std::byte* inode_bitmap = media_.base() + g.BlockOffset(g.InodeBitmapBlock(group));

  // Bits that must always be set: metadata, past the end, the backup block,
  // inode 0, inodes past inodes_per_group.
  uint64_t missing = 0;
  for (uint64_t b = 0; b < g.GroupMetaBlocks(group); ++b) missing += !TestBit(block_bitmap, b);
  for (uint64_t b = g.GroupBlocks(group); b < g.blocks_per_group(); ++b) {
    missing += !TestBit(block_bitmap, b);
  }
  if (group == g.group_count() - 1) {
    missing += !TestBit(block_bitmap, g.BackupBlock() - g.GroupFirstBlock(group));
  }
  for (uint64_t i = g.inodes_per_group(); i < g.blocks_per_group(); ++i) {
    missing += !TestBit(inode_bitmap, i);
  }
  if (group == 0) missing += !TestBit(inode_bitmap, 0);
  if (missing != 0) {
    Unrepairable("group %u: %" PRIu64 " reserved bitmap bits are clear", group, missing);
    // Setting them needs the reachability check of the full fsck (a block
    // marked free may have been handed out); left for it.
  }

  const uint64_t used_blocks = CountSetBits(block_bitmap, g.GroupBlocks(group));
  const uint64_t used_inodes = CountSetBits(inode_bitmap, g.inodes_per_group());
  const uint32_t free_blocks = static_cast<uint32_t>(g.GroupBlocks(group) - used_blocks);
  const uint32_t free_inodes = static_cast<uint32_t>(g.inodes_per_group() - used_inodes);
  free_blocks_ += free_blocks;
  free_inodes_ += free_inodes;

  const bool desc_valid = desc.magic == format::kGroupDescMagic && desc.group == group &&
                          desc.checksum == GroupDescChecksum(desc);
  const bool counts_right = desc.free_blocks == free_blocks && desc.free_inodes == free_inodes;
  if (desc_valid && (counts_right || !report_.clean_state)) return;
  const bool fix = desc_valid
      ? Problem("group %u: descriptor counts %u free blocks, %u free inodes; bitmaps say %u, %u",
                group, desc.free_blocks, desc.free_inodes, free_blocks, free_inodes)
      : Problem("group %u: descriptor damaged", group);
  if (!fix) return;
  GroupDesc fresh{};
  fresh.magic = format::kGroupDescMagic;
  fresh.group = group;
  fresh.free_blocks = free_blocks;
  fresh.free_inodes = free_inodes;
  fresh.used_dirs = desc_valid ? desc.used_dirs : 0;
  fresh.checksum = GroupDescChecksum(fresh);
  media_.Store(desc_offset, &fresh, sizeof fresh);
  media_.Persist(desc_offset, sizeof fresh);
  Fixed();
}

void Checker::CheckJournal() {
  const Geometry& g = geometry_;
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    format::JournalSlotHeader header;
    std::memcpy(&header, media_.base() + g.JournalSlotOffset(slot), sizeof header);
    if (std::memcmp(header.magic, format::kJournalMagic, sizeof header.magic) != 0 ||
        header.slot != slot || header.state > 2) {
      Unrepairable("journal slot %u: header damaged", slot);
      continue;
    }
    if (header.state != static_cast<uint32_t>(format::JournalState::kIdle)) {
      if (report_.clean_state) {
        Unrepairable("journal slot %u holds an unfinished operation on a cleanly unmounted "
                     "filesystem", slot);
      } else {
        Say("journal slot %u holds an unfinished operation; the next mount recovers it", slot);
      }
    }
  }
}

void Checker::CheckRoot() {
  const Geometry& g = geometry_;
  const std::byte* inode_bitmap = media_.base() + g.BlockOffset(g.InodeBitmapBlock(0));
  if (!TestBit(inode_bitmap, format::kRootIno)) {
    Unrepairable("root inode is not allocated");
    return;
  }
  format::Inode root;
  std::memcpy(&root, media_.base() + g.InodeOffset(format::kRootIno), sizeof root);
  if (!S_ISDIR(root.mode)) Unrepairable("root inode is not a directory (mode 0%o)", root.mode);
}

}  // namespace

FsckReport CheckNamespace(Media& media, RepairMode mode,
                          const std::function<void(const std::string&)>& say,
                          const std::function<void(uint64_t, uint64_t)>& progress) {
  Checker checker(media, mode, say, progress);
  return checker.Run();
}

}  // namespace nvfs
