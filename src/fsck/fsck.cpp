// The fsck driver: the order of the passes, the superblock, group descriptors
// and counters, and the report. The passes themselves are in fsck_*.cpp
// (checker.hpp lists them).
#include "nvfs/fsck.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstring>
#include <new>
#include <optional>
#include <thread>
#include <vector>

#include "fsck/checker.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/superblock.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

using format::GroupDesc;
using format::SuperDynamic;
using format::SuperStatic;

namespace {

// How many of the root directory's first entries have keys that are their
// names' hashes under `key` (at most kAgreementEntries entries, in at most
// kAgreementBlocks blocks, every pointer checked before it is followed). Used
// to tell which of two valid superblock copies holds the directory hash key
// the namespace was written with.
constexpr uint64_t kAgreementEntries = 256;
constexpr uint64_t kAgreementBlocks = 64;

uint64_t RootKeyAgreement(const std::byte* base, const Geometry& g, const NameHashKey& key) {
  const auto& root =
      *reinterpret_cast<const format::Inode*>(base + g.InodeOffset(format::kRootIno));
  std::vector<uint64_t> todo;
  if (root.map.dir.root != 0) todo.push_back(root.map.dir.root);
  uint64_t agree = 0, seen = 0, blocks = 0;
  while (!todo.empty() && seen < kAgreementEntries && blocks < kAgreementBlocks) {
    const uint64_t ptr = todo.back();
    todo.pop_back();
    if (CheckDirNodePointer(ptr, g) != DirNodeFault::kNone) continue;
    const uint64_t block_no = ptr & format::kDirNodeBlockMask;
    ++blocks;
    const std::byte* block = base + g.BlockOffset(block_no);
    if (ptr & format::kDirNodeIndexBit) {
      const auto* slots = reinterpret_cast<const uint64_t*>(block);
      for (uint64_t i = g.block_size() / 8; i-- > 0;) {
        if (slots[i] != 0 && (todo.empty() || todo.back() != slots[i])) todo.push_back(slots[i]);
      }
      continue;
    }
    format::DirLeafHeader header;
    std::memcpy(&header, block, sizeof header);
    if (header.magic != format::kDirLeafMagic) continue;
    WalkDirLeaf({block, g.block_size()}, [&](uint32_t, const format::DirEntry& record) {
      if (record.ino == 0 || !DirNameLengthValid(record)) return true;
      agree += (record.key >> format::kDirSeqBits) == DirHash(NameHash(key, DirRecordName(record)));
      return ++seen < kAgreementEntries;
    });
    if (header.next != 0) todo.push_back(header.next);
  }
  return agree;
}

// A message of Say, Problem or Unrepairable: at most 511 bytes.
std::string FormatV(const char* fmt, va_list ap) {
  char buf[512];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  return buf;
}

}  // namespace

Checker::Checker(Media& media, RepairMode mode,
                 const std::function<void(const std::string&)>& say,
                 const std::function<void(uint64_t, uint64_t)>& progress, unsigned threads)
    : media_(media), mode_(mode), say_(say), progress_(progress) {
  if (threads == 0) threads = std::min(std::max(std::thread::hardware_concurrency(), 1u), 8u);
  threads_ = threads;
}

Checker::~Checker() = default;

// Metadata blocks count as claimed from the start, so a pointer to them is
// caught like a pointer to a block in use.
void Checker::StartPass1() {
  claimed_.assign((geometry_.block_count() + 63) / 64, 0);
  for (uint32_t group = 0; group < geometry_.group_count(); ++group) {
    const uint64_t first = geometry_.GroupFirstBlock(group);
    for (uint64_t b = 0; b < geometry_.GroupMetaBlocks(group); ++b) Claim(first + b);
  }
  Claim(geometry_.BackupBlock());
  state_.assign(geometry_.inode_count(), kFree);
  links_.assign(geometry_.inode_count(), 0);
}

void Checker::Say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const std::string line = FormatV(fmt, ap);
  va_end(ap);
  if (say_) say_(line);
}

bool Checker::Problem(Repair repair, const char* fmt, ...) {
  if (parallel_) {
    // A pass on several threads neither reports nor repairs: it is run again
    // on one thread (checker.hpp, "Threads").
    trouble_.store(true, std::memory_order_relaxed);
    return false;
  }
  va_list ap;
  va_start(ap, fmt);
  const std::string line = FormatV(fmt, ap);
  va_end(ap);
  ++report_.problems;
  const char* outcome = ": fixing";
  bool fix = true;
  if (mode_ == RepairMode::kNone) {
    outcome = ": not fixed (-n)";
    fix = false;
  } else if (mode_ == RepairMode::kPreen && repair == Repair::kDecision) {
    outcome = ": not fixed (needs a decision; run fsck.nvfs -y)";
    fix = false;
    halted_ = true;
  }
  if (say_) say_(line + outcome);
  if (fix) MoveMountCount();
  return fix;
}

// Before the first repair that may store into a block a file used: a
// direct reader (doc/integrity.md section 10) left attached by a daemon
// killed since checks mount_count after every copy, and stops trusting its
// runs when it moves. The repairs made before the dynamic half is read
// (the static copies, journal recovery) store only into metadata that was
// metadata before. A rebuilt half gets a count drawn at random instead
// (CheckDynamic).
void Checker::MoveMountCount() {
  if (mount_count_moved_ || !dynamic_ok_ || !CanWrite()) return;
  mount_count_moved_ = true;
  dynamic_.mount_count += 1;
  dynamic_.checksum = SuperDynamicChecksum(dynamic_);
  media_.Store(format::kSuperDynamicOffset, &dynamic_, sizeof dynamic_);
  media_.Persist(format::kSuperDynamicOffset, sizeof dynamic_);
}

void Checker::Unrepairable(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const std::string line = FormatV(fmt, ap);
  va_end(ap);
  ++report_.problems;
  if (say_) say_(line + ": not fixed (cannot be repaired)");
}

void Checker::Write(uint64_t offset, const void* src, size_t len) {
  media_.Store(offset, src, len);
  media_.Persist(offset, len);
}

void Checker::Write64(uint64_t offset, uint64_t value) {
  media_.Store64(offset, value);
  media_.Persist(offset, 8);
}

const char* Checker::FaultName(BlockFault fault) {
  switch (fault) {
    case BlockFault::kNone: return "valid";
    case BlockFault::kOutOfRange: return "outside the filesystem";
    case BlockFault::kMetadata: return "into metadata";
    case BlockFault::kShared: return "to a block already in use";
  }
  return "?";
}

// The same check the filesystem makes before it follows or frees a pointer
// (Geometry::IsDataBlock). REQUIRES: block_no < block_count.
bool Checker::IsMetadata(uint64_t block_no) const { return !geometry_.IsDataBlock(block_no); }

Checker::BlockFault Checker::CheckBlock(uint64_t block_no) const {
  if (block_no == 0 || block_no >= geometry_.block_count()) return BlockFault::kOutOfRange;
  if (Claimed(block_no)) {
    return IsMetadata(block_no) ? BlockFault::kMetadata : BlockFault::kShared;
  }
  return BlockFault::kNone;
}

DirInfo* Checker::FindDir(uint64_t ino) {
  auto it = std::lower_bound(dirs_.begin(), dirs_.end(), ino,
                             [](const DirInfo& d, uint64_t n) { return d.ino < n; });
  if (it != dirs_.end() && it->ino == ino) return &*it;
  for (DirInfo& dir : revived_dirs_) {  // few: only with a damaged inode bitmap
    if (dir.ino == ino) return &dir;
  }
  return nullptr;
}

uint64_t Checker::RunWorkers(unsigned workers, uint64_t count, uint64_t progress_base,
                             uint64_t progress_span,
                             const std::function<uint64_t(uint64_t, unsigned)>& fn) {
  // Items go out in runs of neighbours (a run of directories mostly names a
  // run of inodes: their state and link counters stay on one thread's cache
  // lines), small enough to keep the threads busy to the end.
  const uint64_t chunk = std::max<uint64_t>(1, count / (uint64_t{workers} * 16));
  std::atomic<uint64_t> next{0}, finished{0}, sum{0};
  const auto work = [&](unsigned worker) {
    uint64_t mine = 0;
    for (;;) {
      const uint64_t first = next.fetch_add(chunk, std::memory_order_relaxed);
      if (first >= count) break;
      const uint64_t end = std::min(count, first + chunk);
      for (uint64_t item = first; item < end; ++item) mine += fn(item, worker);
      const uint64_t done = finished.fetch_add(end - first, std::memory_order_relaxed) + end - first;
      Progress(progress_base + done * progress_span / count);
    }
    sum.fetch_add(mine, std::memory_order_relaxed);
  };
  std::vector<std::thread> threads;
  for (unsigned worker = 1; worker < workers; ++worker) threads.emplace_back(work, worker);
  work(0);
  for (std::thread& thread : threads) thread.join();
  return sum.load();
}

void Checker::Progress(uint64_t done) {
  if (!progress_) return;
  std::lock_guard lock(progress_mu_);
  if (done > progress_done_ && done <= progress_total_) {
    progress_done_ = done;
    progress_(done, progress_total_);
  }
}

FsckReport Checker::Run() {
  start_time_ = std::chrono::steady_clock::now();
  Result<FoundSuper> found = FindSuper(media_.base(), media_.size());
  if (!found.ok()) {
    Say("%s: %s", media_.path().c_str(), found.error().message.c_str());
    report_.exit_code = found.error().code == EUCLEAN ? kFsckUncorrected : kFsckOperational;
    return report_;
  }
  // An interrupted grow: the primary is the one recovery restores, and the
  // grown geometry's copy past its end is the grow's, removed by recovery,
  // not a larger copy of the filesystem to restore the primary from.
  if (found->grow_undone) {
    Say("a grow was interrupted; checking the filesystem as it was before it (recovery "
        "undoes it; run nvfs-resize again)");
  } else if (!found->from_backup) {
    ChooseStaticCopy(&found.value());
  }
  geometry_ = found->geometry;
  super_ = found->sb;
  base_ = media_.base();
  block_shift_ = geometry_.block_shift();
  block_size_ = geometry_.block_size();
  report_.inode_count = geometry_.inode_count();
  report_.block_count = geometry_.block_count();
  if (UnknownRoCompat(found->sb) != 0 && CanWrite()) {
    Say("%s: unknown read-only-compatible features 0x%" PRIx64 "; refusing to repair",
        media_.path().c_str(), UnknownRoCompat(found->sb));
    report_.exit_code = kFsckOperational;
    return report_;
  }
  // The file-map ranges, the layout Bmap uses (format.md, "Inodes").
  const FileMapLayout layout(block_shift_);
  for (uint32_t depth = 1; depth <= format::kIndirectPointers + 1; ++depth) {
    start_[depth] = layout.start(depth);
  }
  max_file_blocks_ = layout.max_blocks();
  max_file_size_ = layout.max_size();
  progress_total_ = 2 * uint64_t{geometry_.group_count()};

  // The passes, in order; in -p mode the first problem that needs a decision
  // stops the check after its pass.
  CheckStaticCopies(found.value());
  const bool busy_journal = CheckJournalHeaders();
  if (!halted_ && busy_journal) {
    if (CanWrite()) {
      RecoverJournal();
    } else {
      BuildOverlay();
    }
  }
  if (!halted_) {
    CheckDynamic();
    StartPass1();
  }
  const std::pair<const char*, void (Checker::*)()> passes[] = {
      {"inodes", &Checker::CheckInodes},
      {"orphan list", &Checker::CheckOrphans},
      {"directories", &Checker::CheckDirectories},
      {"shared blocks", &Checker::CloneShared},
      {"ACL values", &Checker::DropBadAcls},
      {"connectivity", &Checker::CheckConnectivity},
      {"link counts", &Checker::CheckLinkCounts},
      {"bitmaps", &Checker::CheckBitmaps},
      {"lost+found", &Checker::Reconnect},
      {"counters", &Checker::CheckCounters},
      {"superblock", &Checker::WriteDynamic},
  };
  auto lap = std::chrono::steady_clock::now();
  for (const auto& [name, pass] : passes) {
    if (halted_) break;
    (this->*pass)();
    const auto now = std::chrono::steady_clock::now();
    report_.pass_seconds.emplace_back(name, std::chrono::duration<double>(now - lap).count());
    lap = now;
  }

  if (halted_) {
    report_.halted = true;
    Say("UNEXPECTED INCONSISTENCY: stopped; run fsck.nvfs -y");
  }
  if (report_.problems > report_.corrected) {
    report_.exit_code = kFsckUncorrected;
  } else if (report_.corrected > 0) {
    report_.exit_code = kFsckCorrected;
  }
  report_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count();
  return report_;
}

// A valid primary that its backup does not confirm (doc/integrity.md, section
// 9): when another valid copy exists, the one the namespace agrees with is
// used, and the primary restored from it if it is that one.
//  - a backup at the end of the namespace whose geometry differs from the
//    primary's: the backup, confirmed by where it lies (the primary's own
//    backup location does not hold it);
//  - the same geometry, another dir_hash_key: the copy under whose key more
//    of the root directory's entries are their names' hashes (a tie keeps
//    the primary).
// Anything else keeps the primary, and CheckStaticCopies rewrites the backup.
void Checker::ChooseStaticCopy(FoundSuper* found) {
  const uint64_t own_backup = found->geometry.BackupSuperOffset();
  SuperStatic copy;
  std::memcpy(&copy, media_.base() + own_backup, sizeof copy);
  const bool backed = std::memcmp(&copy, &found->sb, sizeof copy) == 0;
  std::optional<FoundSuper> other;
  const auto consider = [&](uint64_t offset) {
    if (other.has_value()) return;
    SuperStatic candidate;
    std::memcpy(&candidate, media_.base() + offset, sizeof candidate);
    if (std::memcmp(&candidate, &found->sb, sizeof candidate) == 0) return;
    Result<Geometry> geometry = CheckSuperStatic(candidate, media_.size());
    if (!geometry.ok() || geometry->BackupSuperOffset() != offset) return;
    if (UnknownRoCompat(candidate) != 0) return;
    // With the primary and its backup agreeing, only a larger copy of the
    // same filesystem outweighs them (below).
    if (backed && (std::memcmp(candidate.uuid, found->sb.uuid, sizeof candidate.uuid) != 0 ||
                   candidate.block_count <= found->sb.block_count)) {
      return;
    }
    other = FoundSuper{geometry.value(), candidate, false, ""};
  };
  if (!backed) consider(own_backup);
  ForEachBackupCandidate(media_.size(), [&](uint64_t offset, uint32_t) { consider(offset); });
  // A copy equal to the primary where another geometry of its block size
  // keeps its backup, and none where its own does: block_count was changed
  // in both copies (the backup written where the true geometry puts it), so
  // that place names the true size. The rest of the copy is kept.
  if (!other.has_value() && !backed) {
    ForEachBackupCandidate(media_.size(), [&](uint64_t offset, uint32_t bs) {
      if (other.has_value() || offset == own_backup || bs != found->geometry.block_size()) return;
      if (std::memcmp(media_.base() + offset, &found->sb, sizeof found->sb) != 0) return;
      if ((offset + format::kSuperHalfSize) % bs != 0) return;
      SuperStatic candidate = found->sb;
      candidate.block_count = (offset + format::kSuperHalfSize) / bs;
      candidate.checksum = SuperStaticChecksum(candidate);
      Result<Geometry> geometry = CheckSuperStatic(candidate, media_.size());
      if (!geometry.ok() || geometry->BackupSuperOffset() != offset) return;
      other = FoundSuper{geometry.value(), candidate, false, ""};
    });
  }
  if (!other.has_value()) return;
  const char* why = nullptr;
  if (backed) {
    // A namespace never shrinks (nvfs-resize only grows, and an interrupted
    // grow is found by FindSuper and not considered here; mkfs clears every
    // backup candidate), so two copies of one filesystem (one uuid) of which
    // the larger sits where its geometry puts its backup: the smaller pair
    // was damaged together (a fuzz case rewrote both), and trusting it would
    // clear every pointer past its end.
    why = "and its backup describe a smaller filesystem than the copy of the same filesystem "
          "found where that filesystem keeps its backup";
  } else if (other->geometry.BackupSuperOffset() != own_backup) {
    why = "describes another geometry than the backup found where that geometry puts it";
  } else if (std::memcmp(other->sb.dir_hash_key, found->sb.dir_hash_key,
                         sizeof found->sb.dir_hash_key) != 0) {
    const uint64_t primary_agrees = RootKeyAgreement(media_.base(), found->geometry,
                                                     NameHashKey::FromSuper(found->sb));
    const uint64_t backup_agrees = RootKeyAgreement(media_.base(), other->geometry,
                                                    NameHashKey::FromSuper(other->sb));
    if (backup_agrees > primary_agrees) {
      why = "holds a directory hash key the root directory's entries do not agree with";
    }
  }
  if (why == nullptr) return;
  if (Problem(Repair::kSafe, "primary superblock %s; restoring it from the backup at byte %" PRIu64,
              why, other->geometry.BackupSuperOffset())) {
    media_.Store(format::kSuperStaticOffset, &other->sb, sizeof other->sb);
    media_.Persist(format::kSuperStaticOffset, sizeof other->sb);
    Fixed();
  }
  // -n: the check goes on as if the primary had been restored.
  *found = *other;
}

// The primary and the backup static halves must both be valid and identical.
void Checker::CheckStaticCopies(const FoundSuper& found) {
  const uint64_t backup = geometry_.BackupSuperOffset();
  if (found.from_backup) {
    Say("primary superblock is damaged (%s); using the backup copy at byte %" PRIu64,
        found.primary_error.c_str(), backup);
    if (Problem(Repair::kSafe, "primary superblock damaged")) {
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
    if (Problem(Repair::kSafe, "backup superblock at byte %" PRIu64 " %s", backup,
                valid.ok() ? "differs from the primary" : "is damaged")) {
      media_.Store(backup, &found.sb, sizeof found.sb);
      media_.Persist(backup, sizeof found.sb);
      Fixed();
    }
  }
}

void Checker::CheckDynamic() {
  std::memcpy(&dynamic_, Block(0) + format::kSuperDynamicOffset, sizeof dynamic_);
  Status st = CheckSuperDynamic(dynamic_);
  if (st.ok()) {
    dynamic_ok_ = true;
    report_.clean_state = dynamic_.state == static_cast<uint32_t>(format::FsState::kClean);
    if (!report_.clean_state && !recovered_) {
      Say("filesystem was not cleanly unmounted; the next mount recovers it");
    }
    // Cleared at the end, once the whole check has repaired everything.
    if (dynamic_.errors != 0) clear_errors_ = Problem(Repair::kSafe, "superblock records earlier errors");
    return;
  }
  // Rebuilt by WriteDynamic() once the groups are counted; meanwhile the
  // orphan list is taken as empty (inodes flagged as orphans are put back on
  // it by CheckOrphans).
  if (Problem(Repair::kSafe, "%s", st.error().message.c_str())) rebuild_dynamic_ = true;
  std::memset(&dynamic_, 0, sizeof dynamic_);
  std::memcpy(dynamic_.magic, format::kSuperDynamicMagic, sizeof dynamic_.magic);
  dynamic_.state = static_cast<uint32_t>(format::FsState::kMounted);
  dynamic_.next_generation = RandomU64() >> 32;
  dynamic_.mount_count = RandomU64() >> 16;  // not a count a direct reader saw (MoveMountCount)
}

// Group descriptors and the free counts, against the bitmaps as pass 5 left
// them (on the media after -p/-y; computed, for -n). Counts are exact only
// when the superblock says the filesystem is clean, so only then compared.
void Checker::CheckCounters() {
  const Geometry& g = geometry_;
  uint64_t free_blocks = 0, free_inodes = 0;
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    const uint32_t group_free_blocks = group_free_blocks_[group];
    const uint32_t group_free_inodes = group_free_inodes_[group];
    free_blocks += group_free_blocks;
    free_inodes += group_free_inodes;
    const uint64_t desc_offset = g.BlockOffset(g.GroupDescBlock(group));
    GroupDesc desc;
    std::memcpy(&desc, Block(g.GroupDescBlock(group)), sizeof desc);
    const bool desc_valid = desc.magic == format::kGroupDescMagic && desc.group == group &&
                            desc.checksum == GroupDescChecksum(desc);
    const bool counts_right =
        desc.free_blocks == group_free_blocks && desc.free_inodes == group_free_inodes;
    if (desc_valid && (counts_right || !report_.clean_state)) continue;
    const bool fix =
        desc_valid
            ? Problem(Repair::kSafe,
                      "group %u: descriptor counts %u free blocks, %u free inodes; bitmaps say "
                      "%u, %u",
                      group, desc.free_blocks, desc.free_inodes, group_free_blocks,
                      group_free_inodes)
            : Problem(Repair::kSafe, "group %u: descriptor damaged", group);
    if (!fix) continue;
    GroupDesc fresh{};
    fresh.magic = format::kGroupDescMagic;
    fresh.group = group;
    fresh.free_blocks = group_free_blocks;
    fresh.free_inodes = group_free_inodes;
    fresh.used_dirs = desc_valid ? desc.used_dirs : 0;
    fresh.checksum = GroupDescChecksum(fresh);
    media_.Store(desc_offset, &fresh, sizeof fresh);
    media_.Persist(desc_offset, sizeof fresh);
    Fixed();
  }
  report_.inodes_used = g.inode_count() - free_inodes;
  report_.blocks_used = g.block_count() - free_blocks;
  if (rebuild_dynamic_) {
    dynamic_.free_blocks = free_blocks;
    dynamic_.free_inodes = free_inodes;
    return;
  }
  if (dynamic_ok_ && report_.clean_state &&
      (dynamic_.free_blocks != free_blocks || dynamic_.free_inodes != free_inodes)) {
    if (Problem(Repair::kSafe,
                "superblock free counts %" PRIu64 " blocks, %" PRIu64 " inodes; bitmaps say %"
                PRIu64 ", %" PRIu64,
                dynamic_.free_blocks, dynamic_.free_inodes, free_blocks, free_inodes)) {
      dynamic_.free_blocks = free_blocks;
      dynamic_.free_inodes = free_inodes;
      dynamic_dirty_ = true;
      Fixed();
    }
  }
}

// One store of the whole dynamic half with its checksum. A rebuilt half is
// marked not clean, so the next mount recounts.
void Checker::WriteDynamic() {
  if (clear_errors_ && report_.problems == report_.corrected + 1) {
    dynamic_.errors = 0;
    dynamic_dirty_ = true;
    Fixed();
  }
  if (!CanWrite() || !(rebuild_dynamic_ || dynamic_dirty_)) return;
  dynamic_.checksum = SuperDynamicChecksum(dynamic_);
  media_.Store(format::kSuperDynamicOffset, &dynamic_, sizeof dynamic_);
  media_.Persist(format::kSuperDynamicOffset, sizeof dynamic_);
  if (rebuild_dynamic_) Fixed();
}

}  // namespace nvfs::fsck

namespace nvfs {

FsckReport CheckNamespace(Media& media, RepairMode mode,
                          const std::function<void(const std::string&)>& say,
                          const std::function<void(uint64_t, uint64_t)>& progress,
                          unsigned threads) {
  try {
    fsck::Checker checker(media, mode, say, progress, threads);
    return checker.Run();
  } catch (const std::bad_alloc&) {
    if (say) say(media.path() + ": out of memory");
    FsckReport report;
    report.exit_code = kFsckOperational;
    return report;
  }
}

}  // namespace nvfs
