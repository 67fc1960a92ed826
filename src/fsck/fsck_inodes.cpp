// Pass 1: every allocated inode, group by group in one pass over the inode
// tables — its mode, flags and size, its file map (every pointer inside the
// filesystem, not into metadata, not a block already claimed by another
// inode or by itself), its extended-attribute block, its symlink target, and
// inode.blocks against what was counted. Then the orphan list.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cinttypes>
#include <cstring>
#include <ctime>
#include <functional>

#include "fsck/checker.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

using format::Inode;

namespace {

constexpr uint64_t kMapOffset = offsetof(Inode, map);
// A pointer block with more invalid pointers than this is not a pointer block
// (a stray pointer to data, or garbage): the pointer to it is cleared rather
// than the "pointers" in it, which may be someone's data.
constexpr uint32_t kMaxBadPointers = 8;

uint8_t KindOfMode(uint32_t mode) {
  switch (InodeTypeOf(mode)) {
    case InodeType::kRegular: return kRegular;
    case InodeType::kDirectory: return kDirectory;
    case InodeType::kSymlink: return kSymlink;
    case InodeType::kSpecial: return kSpecial;
    case InodeType::kInvalid: break;
  }
  return kFree;
}

bool IsAclName(std::string_view name) {
  return name == format::kAclAccessName || name == format::kAclDefaultName;
}

// Whether a valid xattr block holds a POSIX ACL value that fails the
// check the core makes where it reads one (a version before ACLs stored
// any value under these names). The one-block format's (a chain's are
// checked record by record in CheckXattrBlock).
bool HoldsBadAcl(std::span<const std::byte> block) {
  bool bad = false;
  DecodeXattrBlock(block, false, [&](const XattrRecord& record) {
    if (IsAclName(record.name) && DecodeAcl(record.value, nullptr) != AclFault::kNone) bad = true;
  });
  return bad;
}

const char* XattrFaultName(XattrFault fault) {
  switch (fault) {
    case XattrFault::kNone: break;
    case XattrFault::kNoMagic: return "without its magic";
    case XattrFault::kOverfull: return "overfull";
    case XattrFault::kShortEntries: return "holding fewer entries than it counts";
    case XattrFault::kBadEntry: return "holding a damaged entry";
    case XattrFault::kNoNamespace: return "holding an attribute of no known namespace";
    case XattrFault::kTrailingBytes: return "holding bytes past its last entry";
    case XattrFault::kReserved: return "holding reserved bits";
    case XattrFault::kBadRuns: return "holding a value of damaged runs";
  }
  return nullptr;
}

}  // namespace

void Checker::CheckInodes() {
  const Geometry& g = geometry_;
  // The root first: every other inode is judged by what reaches it.
  const std::byte* bitmap0 = Block(g.InodeBitmapBlock(0));
  const bool root_allocated = TestBit(bitmap0, format::kRootIno);
  // A root whose bit is clear but that is a well-formed directory is kept:
  // the format itself names inode 1 (as an entry names any other inode), and
  // mkfs always writes it (doc/integrity.md, section 9).
  const bool root_revived = !root_allocated && WellFormedUnmarked(InodeAt(format::kRootIno), true);
  const uint8_t root_kind =
      root_allocated || root_revived ? KindOfMode(InodeAt(format::kRootIno).mode) : uint8_t{kFree};
  if (root_revived && Problem(Repair::kSafe, "root inode is free in the inode bitmap but a "
                              "well-formed directory; keeping it")) {
    Fixed();  // the bit is set by pass 5
  }
  if (root_kind != kDirectory) {
    const bool fix =
        !root_allocated
            ? Problem(Repair::kDecision, "root inode is not allocated; making a new, empty root")
            : Problem(Repair::kDecision,
                      "root inode is not a directory (mode 0%o); making a new, empty root",
                      InodeAt(format::kRootIno).mode);
    if (fix) {
      const timespec now = [] {
        timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return ts;
      }();
      Inode root{};
      root.mode = S_IFDIR | 0755;
      root.nlink = 2;
      root.atime_sec = root.mtime_sec = root.ctime_sec = root.btime_sec = now.tv_sec;
      root.generation = static_cast<uint32_t>(RandomU64());
      root.parent = format::kRootIno;
      Write(InodeOffset(format::kRootIno), &root, sizeof root);
      Fixed();
    }
    if (halted_) return;
    // From here on (also for -n) the root is an empty directory; pass 1 skips it.
    root_made_ = true;
    state_[format::kRootIno] = kDirectory;
  }

  const uint32_t groups = g.group_count();
  const unsigned workers = std::min<unsigned>(threads_, groups);
  bool done = false;
  if (workers > 1) {
    parallel_ = true;
    const uint64_t checked = RunWorkers(workers, groups, 0, groups, [this](uint64_t group, unsigned) {
      return CheckInodeGroup(static_cast<uint32_t>(group));
    });
    parallel_ = false;
    if (!trouble_.load()) {
      report_.inodes_checked += checked;
      done = true;
    } else {
      // Start again on one thread, which reports and repairs in order.
      trouble_.store(false);
      std::fill(claimed_.begin(), claimed_.end(), 0);
      for (uint32_t group = 0; group < groups; ++group) {
        const uint64_t first = g.GroupFirstBlock(group);
        for (uint64_t b = 0; b < g.GroupMetaBlocks(group); ++b) Claim(first + b);
      }
      Claim(g.BackupBlock());
      std::fill(state_.begin(), state_.end(), kFree);
      std::fill(links_.begin(), links_.end(), 0);
      if (root_made_) state_[format::kRootIno] = kDirectory;
    }
  }
  for (uint32_t group = 0; group < groups && !done && !halted_; ++group) {
    report_.inodes_checked += CheckInodeGroup(group);
    Progress(group + 1);
  }
  if (root_revived && !halted_) {  // its bit is clear: no group pass met it
    ++report_.inodes_checked;
    CheckInode(format::kRootIno, InodeAt(format::kRootIno));
  }
  if (!halted_) BuildDirList();
}

// An inode whose bit is clear that may be kept on evidence other than its
// bytes (an entry, or for the root the format): a file type (a directory if
// `directory`, else any other), links, the must-be-zero fields zero, known
// flags and no orphan flag.
bool Checker::WellFormedUnmarked(const Inode& inode, bool directory) {
  const uint8_t kind = KindOfMode(inode.mode);
  return kind != kFree && (kind == kDirectory) == directory && inode.nlink != 0 &&
         inode.reserved0 == 0 && inode.reserved1 == 0 &&
         (inode.flags & ~format::kInodeFlagsKnown) == 0 &&
         (inode.flags & format::kInodeFlagOrphan) == 0;
}

// An entry names `ino`, which pass 1 did not check: its bit is clear in the
// inode bitmap (doc/integrity.md, section 9). A free inode's bytes mean
// nothing (mkfs does not clear the tables), so only an entry is evidence
// that it lives, and only a well-formed inode is kept (WellFormedUnmarked).
// It is then checked like any inode; pass 5 sets its bit. A directory joins
// revived_dirs_, walked by pass 2 after the others. Returns true if kept.
bool Checker::ReviveInode(uint64_t ino) {
  if (ino == 0 || ino == format::kRootIno) return false;  // the root: pass 1
  const uint32_t ipg = geometry_.inodes_per_group();
  const std::byte* bitmap = Block(geometry_.InodeBitmapBlock(static_cast<uint32_t>(ino / ipg)));
  const uint64_t index = ino % ipg;
  if ((std::to_integer<unsigned>(bitmap[index / 8]) >> (index % 8)) & 1) return false;
  const Inode& inode = InodeAt(ino);
  const bool directory = KindOfMode(inode.mode) == kDirectory;
  if (!WellFormedUnmarked(inode, directory)) return false;
  if (parallel_) {
    trouble_.store(true, std::memory_order_relaxed);  // decided on one thread
    return false;
  }
  if (Problem(Repair::kSafe, "inode %" PRIu64 " is free in the inode bitmap but well-formed and "
              "named by an entry; keeping it", ino)) {
    Fixed();  // the bit is set by pass 5
  }
  ++report_.inodes_checked;
  CheckInode(ino, inode);
  const uint8_t state = State(ino);
  if ((state & kKindMask) == kDirectory) {
    DirInfo info;
    info.ino = ino;
    info.xattr = links_[ino];
    info.nlink = inode.nlink;
    revived_dirs_.push_back(info);
  }
  return (state & kKindMask) != kFree;
}

// The allocated inodes of one group, in one pass over its inode table.
uint64_t Checker::CheckInodeGroup(uint32_t group) {
  const Geometry& g = geometry_;
  const uint32_t ipg = g.inodes_per_group();
  const std::byte* bitmap = Block(g.InodeBitmapBlock(group));
  const uint64_t first = uint64_t{group} * ipg;
  // The table is contiguous in the mapping unless the recovery overlay
  // patched some of it.
  const std::byte* table = overlay_.empty() ? Block(g.InodeTableBlock(group)) : nullptr;
  uint64_t checked = 0;
  for (uint32_t word = 0; word * 64 < ipg && !halted_; ++word) {
    uint64_t bits;
    std::memcpy(&bits, bitmap + word * 8, 8);
    if (ipg - word * 64 < 64) bits &= (uint64_t{1} << (ipg - word * 64)) - 1;
    while (bits != 0) {
      const uint32_t bit = static_cast<uint32_t>(std::countr_zero(bits));
      bits &= bits - 1;
      const uint32_t index = word * 64 + bit;
      const uint64_t ino = first + index;
      if (ino == 0) continue;  // reserved, always set
      if (ino == format::kRootIno && root_made_) continue;
      ++checked;
      CheckInode(ino, table != nullptr
                          ? *reinterpret_cast<const Inode*>(table + uint64_t{index} * format::kInodeSize)
                          : InodeAt(ino));
      if (halted_) break;
    }
  }
  return checked;
}

// The directories found, in inode order, for passes 2 to 4.
void Checker::BuildDirList() {
  dirs_.clear();
  for (uint64_t ino = 1; ino < geometry_.inode_count(); ++ino) {
    const uint8_t state = state_[ino];
    if ((state & kKindMask) != kDirectory) continue;
    DirInfo info;
    info.ino = ino;
    info.xattr = links_[ino];
    if (ino == format::kRootIno && root_made_) {
      info.nlink = 2;
      info.empty_root = true;
    } else {
      info.nlink = InodeAt(ino).nlink;
    }
    dirs_.push_back(info);
  }
}

// Clears an inode found unusable: mode 0, so nothing takes it for live; its
// bitmap bit is cleared by pass 5, and its blocks, not claimed, are freed.
bool Checker::ClearInode(uint64_t ino, const char* why) {
  if (!Problem(Repair::kDecision, "inode %" PRIu64 ": %s; clearing it", ino, why)) return false;
  WriteField(ino, InodeAt(ino).mode, uint16_t{0});
  Fixed();
  return true;
}

void Checker::CheckInode(uint64_t ino, const Inode& inode) {
  const uint8_t kind = KindOfMode(inode.mode);
  if (kind == kFree) {
    char why[64];
    std::snprintf(why, sizeof why, "invalid mode 0%o", inode.mode);
    ClearInode(ino, why);
    return;
  }
  if ((inode.flags & ~format::kInodeFlagsKnown) != 0) {
    if (Problem(Repair::kSafe, "inode %" PRIu64 ": unknown flags 0x%x", ino, inode.flags)) {
      WriteField(ino, inode.flags, inode.flags & format::kInodeFlagsKnown);
      Fixed();
    }
  }
  const bool orphan = (inode.flags & format::kInodeFlagOrphan) != 0;
  if (!orphan && inode.orphan_next != 0) {
    if (Problem(Repair::kSafe, "inode %" PRIu64 ": orphan link %" PRIu64 " on an inode not on "
                "the orphan list", ino, inode.orphan_next)) {
      WriteField(ino, inode.orphan_next, uint64_t{0});
      Fixed();
    }
  }

  // A symlink is judged whole before anything of it is claimed, so clearing
  // it leaves nothing behind.
  if (kind == kSymlink) {
    const uint64_t size = inode.size;
    if (!SymlinkSizeValid(size)) {
      char why[64];
      std::snprintf(why, sizeof why, "symlink of %" PRIu64 " bytes", size);
      if (ClearInode(ino, why) || !CanWrite()) return;
      if (halted_) return;
    } else if (!ValidSymlink(ino, inode, size > format::kInlineSymlinkMax)) {
      if (ClearInode(ino, "symlink target damaged") || !CanWrite()) return;
      if (halted_) return;
    }
  }

  uint64_t blocks = CheckXattrBlock(ino, inode);
  if (halted_) return;
  uint64_t mapped_end = 0;
  switch (kind) {
    case kRegular: {
      blocks += CheckFileMap(ino, inode, &mapped_end);
      if (inode.size > max_file_size_ &&
          Problem(Repair::kSafe, "inode %" PRIu64 ": size %" PRIu64 " past the largest file",
                  ino, inode.size)) {
        WriteField(ino, inode.size, mapped_end << block_shift_);
        Fixed();
      }
      break;
    }
    case kSymlink:
      if (inode.size > format::kInlineSymlinkMax) {
        blocks += CheckFileMap(ino, inode, &mapped_end);
      }
      break;
    case kDirectory:
      break;
    case kSpecial:
      if (inode.size != 0 &&
          Problem(Repair::kSafe, "inode %" PRIu64 ": special file of size %" PRIu64, ino,
                  inode.size)) {
        WriteField(ino, inode.size, uint64_t{0});
        Fixed();
      }
      break;
  }
  if (halted_) return;
  // Directories count their nodes in pass 2.
  if (kind != kDirectory && inode.blocks != blocks) {
    if (Problem(Repair::kSafe, "inode %" PRIu64 ": i_blocks is %" PRIu64 ", counted %" PRIu64,
                ino, inode.blocks, blocks)) {
      WriteField(ino, inode.blocks, blocks);
      Fixed();
    }
  }
  state_[ino] = static_cast<uint8_t>(kind | (orphan ? kOrphanFlag : 0) |
                                     (kind == kDirectory && blocks != 0 ? kHasXattr : 0));
  // Directories: their xattr blocks, added to their nodes by pass 2.
  links_[ino] = kind != kDirectory ? inode.nlink : static_cast<uint32_t>(blocks);
}

// The target of a symlink: no NUL byte in it, and for a long one a block
// that may be read.
bool Checker::ValidSymlink(uint64_t ino, const Inode& inode, bool in_block) {
  (void)ino;
  const size_t size = static_cast<size_t>(inode.size);
  const char* target = inode.map.symlink;
  if (in_block) {
    const uint64_t block_no = inode.map.file.direct[0];
    if (CheckBlock(block_no) != BlockFault::kNone) return false;
    target = reinterpret_cast<const char*>(Block(block_no));
  }
  return std::memchr(target, 0, size) == nullptr;
}

// The inode's xattr blocks, following the chain (one block without
// kIncompatXattrChain): each block is checked (range, metadata, claimed
// before: a loop ends there) and decoded with the core's validator before
// it is claimed and its `next` followed; each value run's blocks are checked
// and claimed. A damaged block is dropped with the rest of the chain after
// it (the pointer naming it cleared); a damaged value run drops its
// attribute only (the record made free). Returns the blocks counted.
uint64_t Checker::CheckXattrBlock(uint64_t ino, const Inode& inode) {
  const bool chain = geometry_.xattr_chain();
  uint64_t blocks = 0;
  uint64_t link_at = InodeOffset(ino) + offsetof(Inode, xattr_block);
  uint64_t block_no = inode.xattr_block;
  while (block_no != 0) {
    const BlockFault fault = CheckBlock(block_no);
    const char* what = nullptr;
    XattrBlockView view;
    // Records whose runs are damaged: dropped below, after the decode.
    struct BadRecord {
      uint32_t offset, length;
      const char* acl_fault;  // null: its runs name blocks not its own
      std::string_view name;
      std::vector<format::XattrValueRun> runs;  // a malformed ACL's: claimed if it is kept
    };
    std::vector<BadRecord> bad;
    std::vector<format::XattrValueRun> good_runs;
    if (fault != BlockFault::kNone) {
      what = FaultName(fault);
    } else {
      what = XattrFaultName(DecodeXattrBlock(
          {Block(block_no), block_size_}, chain,
          [&](const XattrRecord& record) {
            bool ok = true;
            const size_t first_run = good_runs.size();
            for (uint32_t r = 0; r < record.runs && ok; ++r) {
              const format::XattrValueRun run = record.Run(r);
              if (!geometry_.IsDataRun(run.first, run.count)) {
                ok = false;
                break;
              }
              for (uint64_t b = run.first; b < run.first + run.count; ++b) {
                // A block of an earlier run of this same record counts too.
                bool mine = false;
                for (size_t i = first_run; i < good_runs.size(); ++i) {
                  mine |= b >= good_runs[i].first && b - good_runs[i].first < good_runs[i].count;
                }
                if (mine || CheckBlock(b) != BlockFault::kNone) ok = false;
              }
              if (ok) good_runs.push_back(run);
            }
            if (!ok) {
              good_runs.resize(first_run);
              bad.push_back({record.offset, record.length, nullptr, {}, {}});
              return;
            }
            // On a chain a malformed ACL is dropped in place, as a value of
            // bad runs (one free record header), inline or in runs (over
            // 1 KiB, some 125 entries: read from its blocks, now checked).
            if (chain && !record.free && IsAclName(record.name)) {
              std::string gathered;
              std::string_view value = record.value;
              if (record.runs != 0) {
                gathered.reserve(record.value_len);
                for (size_t i = first_run; i < good_runs.size(); ++i) {
                  const uint64_t n = std::min<uint64_t>(record.value_len - gathered.size(),
                                                        good_runs[i].count * block_size_);
                  gathered.append(reinterpret_cast<const char*>(Block(good_runs[i].first)), n);
                }
                value = gathered;
              }
              const AclFault acl = DecodeAcl(value, nullptr);
              if (acl != AclFault::kNone) {
                bad.push_back({record.offset, record.length, AclFaultName(acl), record.name,
                               {good_runs.begin() + static_cast<std::ptrdiff_t>(first_run),
                                good_runs.end()}});
                good_runs.resize(first_run);
              }
            }
          },
          &view));
    }
    if (what != nullptr) {
      if (Problem(Repair::kDecision, "inode %" PRIu64 ": extended attribute block %" PRIu64
                  " %s%s; dropping it%s", ino, block_no,
                  fault != BlockFault::kNone ? "points " : "is ", what,
                  chain ? " and the blocks after it" : "")) {
        Write64(link_at, 0);
        Fixed();
      }
      return blocks;
    }
    Claim(block_no);
    if (!chain && HoldsBadAcl({Block(block_no), block_size_})) {
      // Reported and dropped once every claim is known (DropBadAcls: the
      // block copied without them); a pass on several threads is run again
      // on one.
      if (parallel_) {
        trouble_.store(true, std::memory_order_relaxed);
      } else {
        bad_acls_.push_back({ino, block_no});
      }
    }
    ++blocks;
    for (const format::XattrValueRun& run : good_runs) {
      for (uint64_t b = run.first; b < run.first + run.count; ++b) Claim(b);
      blocks += run.count;
    }
    for (const BadRecord& record : bad) {
      const bool dropped =
          record.acl_fault != nullptr
              ? Problem(Repair::kDecision, "inode %" PRIu64 ": extended attribute %.*s is not a "
                        "valid POSIX ACL (%s); dropping it", ino,
                        static_cast<int>(record.name.size()), record.name.data(),
                        record.acl_fault)
              : Problem(Repair::kDecision, "inode %" PRIu64 ": extended attribute block %" PRIu64
                        ": the value at offset %u names blocks not its own; dropping that "
                        "attribute", ino, block_no, record.offset);
      if (dropped) {
        format::XattrEntry entry{};
        entry.value_len = record.length - static_cast<uint32_t>(sizeof entry);
        Write(OffsetIn(block_no, Block(block_no) + record.offset), &entry, sizeof entry);
        Fixed();
      } else {
        // Kept (-n, or the decision declined): its blocks are still its own.
        for (const format::XattrValueRun& run : record.runs) {
          for (uint64_t b = run.first; b < run.first + run.count; ++b) Claim(b);
          blocks += run.count;
        }
      }
    }
    link_at = OffsetIn(block_no, Block(block_no) + offsetof(format::XattrBlockHeader, next));
    block_no = view.next;
  }
  return blocks;
}

void Checker::DropBadAcls() {
  for (const BadAcl& bad : bad_acls_) {
    if (halted_) return;
    const std::byte* block = Block(bad.block_no);
    format::XattrHeader header;
    std::memcpy(&header, block, sizeof header);
    // The block without the bad values: the other entries' bytes as they
    // are, one after the other.
    std::vector<std::byte> copy(block_size_);
    uint64_t pos = sizeof header;
    uint32_t count = 0;
    bool drop = false;
    DecodeXattrBlock({block, block_size_}, false, [&](const XattrRecord& record) {
      const std::string_view name = record.name;
      const std::string_view value = record.value;
      const AclFault fault = IsAclName(name) ? DecodeAcl(value, nullptr) : AclFault::kNone;
      if (fault != AclFault::kNone) {
        if (Problem(Repair::kDecision, "inode %" PRIu64 ": extended attribute %.*s is not a "
                    "valid POSIX ACL (%s); dropping it", bad.ino, static_cast<int>(name.size()),
                    name.data(), AclFaultName(fault))) {
          drop = true;
          return;
        }
      }
      const uint64_t len = format::XattrEntryLength(name.size(), value.size());
      std::memcpy(copy.data() + pos,
                  reinterpret_cast<const std::byte*>(name.data()) - sizeof(format::XattrEntry),
                  len);
      pos += len;
      ++count;
    });
    if (!drop) continue;
    header.count = count;
    header.used = static_cast<uint32_t>(pos - sizeof header);
    std::memcpy(copy.data(), &header, sizeof header);
    const uint64_t aside = FreeBlockForCopy();
    if (aside != 0) {
      Claim(aside);
      Write(geometry_.BlockOffset(aside), copy.data(), block_size_);
      WriteField(bad.ino, InodeAt(bad.ino).xattr_block, aside);
      claimed_[bad.block_no / 64] &= ~(uint64_t{1} << (bad.block_no % 64));
    } else {
      Write(geometry_.BlockOffset(bad.block_no), copy.data(), block_size_);
    }
    Fixed();
  }
  bad_acls_.clear();
}

void Checker::BadPointer(uint64_t ino, uint64_t slot_at, uint64_t block_no, const char* what,
                         uint64_t index) {
  if (Problem(Repair::kDecision, "inode %" PRIu64 ": block pointer %" PRIu64 " for file block %"
              PRIu64 " points %s; clearing it", ino, block_no, index, what)) {
    Write64(slot_at, 0);
    Fixed();
  }
}

bool Checker::CheckDataPointer(uint64_t ino, uint64_t slot_at, uint64_t block_no,
                               uint64_t index) {
  const BlockFault fault = CheckBlock(block_no);
  if (fault == BlockFault::kShared && !parallel_) {
    // Which claim is the damaged one is not known here (the first claimant
    // may be the inode whose pointer was damaged): the block stays with the
    // first, and this inode gets a copy of it after pass 2 (CloneShared), so
    // neither loses the bytes.
    shared_.push_back({ino, slot_at, block_no, index});
    return true;
  }
  if (fault != BlockFault::kNone) {
    BadPointer(ino, slot_at, block_no, FaultName(fault), index);
    return false;
  }
  Claim(block_no);
  return true;
}

// A free block for a copy: neither claimed nor set in the on-media bitmap
// (a block set there may belong to an inode pass 1 did not see), else one
// only unclaimed; 0 if there is none.
uint64_t Checker::FreeBlockForCopy(bool bitmap_free_only) {
  const Geometry& g = geometry_;
  for (int round = 0; round < (bitmap_free_only ? 1 : 2); ++round) {
    for (uint64_t n = 0; n < g.block_count(); ++n) {
      const uint64_t b = (copy_cursor_ + n) % g.block_count();
      if (b == 0 || Claimed(b) || !g.IsDataBlock(b)) continue;
      if (round == 0) {
        const uint32_t group = static_cast<uint32_t>(b / g.blocks_per_group());
        const uint64_t bit = b % g.blocks_per_group();
        const std::byte* bitmap = Block(g.BlockBitmapBlock(group));
        if ((std::to_integer<unsigned>(bitmap[bit / 8]) >> (bit % 8)) & 1) continue;
      }
      copy_cursor_ = b + 1;
      return b;
    }
  }
  return 0;
}

// True if the pointer at media offset slot_at (in an inode's direct array or
// a pointer block) continues a run with a neighbouring slot: files are
// allocated in runs, so a pointer written by the filesystem usually has a
// neighbour one block before or after it; a stray one rarely does.
bool Checker::ContinuesRun(uint64_t slot_at, uint64_t ptr) const {
  const uint64_t block_no = slot_at >> block_shift_;
  const auto* at = reinterpret_cast<const uint64_t*>(Block(block_no) + (slot_at & (block_size_ - 1)));
  const bool in_inode = !geometry_.IsDataBlock(block_no);
  uint64_t first = 0, last = block_size_ / 8;  // slots of the array around slot_at
  const uint64_t index = (slot_at & (block_size_ - 1)) / 8;
  if (in_inode) {
    // The direct array of the inode: kDirectPointers slots from the map.
    const uint64_t map = ((slot_at & (block_size_ - 1)) & ~uint64_t{format::kInodeSize - 1}) +
                         offsetof(Inode, map);
    first = map / 8;
    last = first + format::kDirectPointers;
  }
  const uint64_t before = index > first ? at[-1] : 0, after = index + 1 < last ? at[1] : 0;
  return (before != 0 && before + 1 == ptr) || (after != 0 && ptr + 1 == after);
}

// The slot of the first claimant of `block_no` among the file maps: the
// inode-order walk pass 1 made (only valid pointers followed). 0 if none.
uint64_t Checker::FirstDataSlot(uint64_t block_no, uint64_t* owner) const {
  const Geometry& g = geometry_;
  uint64_t found = 0;
  const std::function<void(uint64_t, uint64_t, uint32_t)> walk = [&](uint64_t ino, uint64_t b,
                                                                    uint32_t height) {
    const auto* slots = reinterpret_cast<const uint64_t*>(Block(b));
    for (uint64_t i = 0; i < block_size_ / 8 && found == 0; ++i) {
      const uint64_t ptr = slots[i];
      if (ptr == 0 || ptr >= g.block_count() || !g.IsDataBlock(ptr)) continue;
      if (height == 1) {
        if (ptr == block_no) {
          found = (b << block_shift_) + 8 * i;
          *owner = ino;
        }
      } else {
        walk(ino, ptr, height - 1);
      }
    }
  };
  for (uint64_t ino = 1; ino < g.inode_count() && found == 0; ++ino) {
    const uint8_t kind = Kind(ino);
    if (kind != kRegular && kind != kSymlink) continue;
    const Inode& inode = InodeAt(ino);
    if (kind == kSymlink && inode.size <= format::kInlineSymlinkMax) continue;
    const format::InodeFileMap& map = inode.map.file;
    for (uint32_t i = 0; i < format::kDirectPointers && found == 0; ++i) {
      if (map.direct[i] == block_no) {
        found = InodeOffset(ino) + kMapOffset + 8 * i;
        *owner = ino;
      }
    }
    for (uint32_t depth = 1; depth <= format::kIndirectPointers && found == 0; ++depth) {
      const uint64_t ptr = map.indirect[depth - 1];
      if (ptr != 0 && ptr < g.block_count() && g.IsDataBlock(ptr)) walk(ino, ptr, depth);
    }
  }
  return found;
}

void Checker::CloneShared() {
  for (const SharedPointer& s : shared_) {
    if (halted_) return;
    const uint64_t copy = FreeBlockForCopy();
    if (copy == 0) {
      // No room for a copy: one claimant keeps the block. The first claimant
      // came first only by inode order; the claim that continues a run of
      // its file's blocks is the one the filesystem wrote.
      uint64_t owner = 0;
      const uint64_t first_slot = FirstDataSlot(s.block_no, &owner);
      const bool later_wins = first_slot != 0 && first_slot != s.slot_at && owner != s.ino &&
                              ContinuesRun(s.slot_at, s.block_no) &&
                              !ContinuesRun(first_slot, s.block_no);
      const uint64_t loser = later_wins ? owner : s.ino;
      const uint64_t loser_slot = later_wins ? first_slot : s.slot_at;
      if (Problem(Repair::kDecision, "inode %" PRIu64 ": block pointer %" PRIu64 " names a "
                  "block inode %" PRIu64 " also uses, and no block is free for a copy; "
                  "clearing it", loser, s.block_no, later_wins ? s.ino : owner)) {
        Write64(loser_slot, 0);
        const Inode& inode = InodeAt(loser);
        WriteField(loser, inode.blocks, inode.blocks - 1);
        Fixed();
      }
      continue;
    }
    // -n: as if copied, so the free counts agree with what -y would leave.
    Claim(copy);
    if (Problem(Repair::kDecision, "inode %" PRIu64 ": block pointer %" PRIu64 " for file block %"
                PRIu64 " names a block in use by another inode; giving it a copy in block %"
                PRIu64, s.ino, s.block_no, s.index, copy)) {
      Write(geometry_.BlockOffset(copy), Block(s.block_no), block_size_);
      Write64(s.slot_at, copy);
      Fixed();
    }
  }
  shared_.clear();
}

// Walks the file map: returns the blocks it holds (data and pointer blocks),
// and sets *mapped_end past the last mapped file block.
uint64_t Checker::CheckFileMap(uint64_t ino, const Inode& inode, uint64_t* mapped_end) {
  const format::InodeFileMap& map = inode.map.file;
  const uint64_t map_at = InodeOffset(ino) + kMapOffset;
  uint64_t count = 0;
  for (uint32_t i = 0; i < format::kDirectPointers; ++i) {
    const uint64_t ptr = map.direct[i];
    if (ptr == 0) continue;
    if (CheckDataPointer(ino, map_at + 8 * i, ptr, i)) {
      ++count;
      *mapped_end = i + 1;
    }
    if (halted_) return count;
  }
  for (uint32_t depth = 1; depth <= format::kIndirectPointers; ++depth) {
    const uint64_t ptr = map.indirect[depth - 1];
    if (ptr == 0) continue;
    const uint64_t slot_at = map_at + 8 * (format::kDirectPointers + depth - 1);
    if (start_[depth] >= max_file_blocks_) {
      BadPointer(ino, slot_at, ptr, "past the largest file", start_[depth]);
    } else {
      count += CheckPointerBlock(ino, slot_at, ptr, depth, start_[depth], mapped_end);
    }
    if (halted_) return count;
  }
  return count;
}

// A pointer block of `height` (1: it holds data pointers) mapping file
// blocks from `base`, reached through the pointer at media offset slot_at.
uint64_t Checker::CheckPointerBlock(uint64_t ino, uint64_t slot_at, uint64_t block_no,
                                    uint32_t height, uint64_t base, uint64_t* mapped_end) {
  const BlockFault fault = CheckBlock(block_no);
  // A pointer block another inode claimed first (as data or as its own
  // pointer block) is copied at once, if a block is free for it, and the
  // copy walked as this inode's: its children are then shared, and copied
  // in turn (CloneShared). With no free block it is cleared, as before.
  const bool shared = fault == BlockFault::kShared && !parallel_;
  if (fault != BlockFault::kNone && !shared) {
    BadPointer(ino, slot_at, block_no, FaultName(fault), base);
    return 0;
  }
  const uint64_t ptrs = block_size_ / 8;
  const auto* slots = reinterpret_cast<const uint64_t*>(Block(block_no));
  uint64_t bad = 0, good = 0;
  for (uint64_t i = 0; i < ptrs && bad <= kMaxBadPointers; ++i) {
    const uint64_t ptr = slots[i];
    if (ptr == 0) continue;
    const bool invalid = ptr >= geometry_.block_count() || IsMetadata(ptr);
    bad += invalid;
    good += !invalid;
  }
  // Nor is one with invalid pointers and no valid one (a stray pointer to
  // a file's data, "dddd" and zeros): clearing its "pointers" would write
  // into another file's bytes.
  if (bad > kMaxBadPointers || (bad != 0 && good == 0)) {
    BadPointer(ino, slot_at, block_no, "to a block that holds no block pointers", base);
    return 0;
  }
  if (shared) {
    const uint64_t copy = FreeBlockForCopy(/*bitmap_free_only=*/true);
    // No room for a copy: a block that reads as a pointer block whose every
    // pointer names a block in use that no one has claimed yet is this
    // inode's pointer block, and another inode's data pointer to it the
    // damaged one (its pointer is cleared, this inode keeps the block).
    uint64_t owner = 0, first_slot = 0;
    if (copy == 0 && bad == 0 && good != 0) {
      bool children_free = true;
      for (uint64_t i = 0; i < ptrs && children_free; ++i) {
        const uint64_t ptr = slots[i];
        if (ptr == 0) continue;
        const uint32_t group = static_cast<uint32_t>(ptr / geometry_.blocks_per_group());
        const uint64_t bit = ptr % geometry_.blocks_per_group();
        const std::byte* bitmap = Block(geometry_.BlockBitmapBlock(group));
        children_free = !Claimed(ptr) &&
                        ((std::to_integer<unsigned>(bitmap[bit / 8]) >> (bit % 8)) & 1) != 0;
      }
      if (children_free) first_slot = FirstDataSlot(block_no, &owner);
    }
    if (copy == 0 && (first_slot == 0 || owner == ino)) {
      BadPointer(ino, slot_at, block_no, "to a block already in use, and no block is free for a "
                 "copy", base);
      return 0;
    }
    if (copy == 0) {
      if (Problem(Repair::kDecision, "inode %" PRIu64 ": block pointer %" PRIu64 " names the "
                  "pointer block of inode %" PRIu64 ", and no block is free for a copy; "
                  "clearing it", owner, block_no, ino)) {
        Write64(first_slot, 0);
        const Inode& other = InodeAt(owner);
        WriteField(owner, other.blocks, other.blocks - 1);
        Fixed();
      }
    } else {
      Claim(copy);  // -n: as if copied
    }
    if (copy != 0 && Problem(Repair::kDecision, "inode %" PRIu64 ": pointer block %" PRIu64 " for file block %"
                PRIu64 " is in use by another inode; giving it a copy in block %" PRIu64, ino,
                block_no, base, copy)) {
      Write(geometry_.BlockOffset(copy), Block(block_no), block_size_);
      Write64(slot_at, copy);
      Fixed();
      block_no = copy;
      slots = reinterpret_cast<const uint64_t*>(Block(block_no));
    }
  } else {
    Claim(block_no);
  }
  uint64_t count = 1;
  // No shift overflows: a tree of this height is walked only when its range
  // starts below max_file_blocks_ (<= 2^51), and for every block size the
  // format allows that keeps p^height below 2^57.
  const uint32_t child_shift = (block_shift_ - 3) * (height - 1);
  for (uint64_t i = 0; i < ptrs; ++i) {
    const uint64_t ptr = slots[i];
    if (ptr == 0) continue;
    const uint64_t child_base = base + (i << child_shift);
    const uint64_t child_at = (block_no << block_shift_) + 8 * i;
    if (child_base >= max_file_blocks_) {
      BadPointer(ino, child_at, ptr, "past the largest file", child_base);
    } else if (height == 1) {
      if (CheckDataPointer(ino, child_at, ptr, child_base)) {
        ++count;
        *mapped_end = std::max(*mapped_end, child_base + 1);
      }
    } else {
      count += CheckPointerBlock(ino, child_at, ptr, height - 1, child_base, mapped_end);
    }
    if (halted_) break;
  }
  return count;
}

// The orphan list (inodes unlinked while open, or regular files whose
// truncation was cut short): a chain from the dynamic superblock through
// inodes that carry the orphan flag, each once — what mount's orphan pass
// accepts (src/fs/super.cpp). A bad link cuts the list there; flagged inodes
// left off it are put back on, so the next mount finishes them, or, when they
// cannot be orphans (linked, and not regular files), lose the flag.
void Checker::CheckOrphans() {
  uint64_t prev = 0;  // 0: the head is in the superblock
  uint64_t ino = dynamic_.orphan_head;
  while (ino != 0) {
    const char* why = nullptr;
    if (ino >= geometry_.inode_count()) {
      why = "is out of range";
    } else if (Kind(ino) == kFree) {
      why = "is not in use";
    } else if (!(state_[ino] & kOrphanFlag)) {
      why = "is not flagged as an orphan";
    } else if (state_[ino] & kOnOrphanList) {
      why = "is on it twice (a loop)";
    } else if (!OrphanMayBe(InodeAt(ino))) {
      why = "is linked and no regular file";
    }
    if (why != nullptr) {
      if (Problem(Repair::kSafe, "orphan list: inode %" PRIu64 " %s; cutting the list there",
                  ino, why)) {
        if (prev == 0) {
          dynamic_.orphan_head = 0;
          dynamic_dirty_ = true;
        } else {
          WriteField(prev, InodeAt(prev).orphan_next, uint64_t{0});
        }
        Fixed();
      }
      break;
    }
    state_[ino] |= kOnOrphanList;
    ++orphan_count_;
    prev = ino;
    ino = InodeAt(ino).orphan_next;
  }
  for (uint64_t n = 1; n < geometry_.inode_count(); ++n) {
    if ((state_[n] & (kOrphanFlag | kOnOrphanList)) != kOrphanFlag) continue;
    const Inode& inode = InodeAt(n);
    if (!OrphanMayBe(inode)) {
      if (Problem(Repair::kSafe, "inode %" PRIu64 ": orphan flag on a linked inode that is no "
                  "regular file; clearing it", n)) {
        WriteField(n, inode.flags, inode.flags & ~format::kInodeFlagOrphan);
        WriteField(n, inode.orphan_next, uint64_t{0});
        Fixed();
      }
      state_[n] &= static_cast<uint8_t>(~kOrphanFlag);
      continue;
    }
    if (Problem(Repair::kSafe, "inode %" PRIu64 " is flagged as an orphan but not on the orphan "
                "list; adding it", n)) {
      WriteField(n, inode.orphan_next, dynamic_.orphan_head);
      dynamic_.orphan_head = n;
      dynamic_dirty_ = true;
      Fixed();
    }
    state_[n] |= kOnOrphanList;
    ++orphan_count_;
  }
}

// Takes `ino` off the orphan list and clears its flag (part of a repair the
// caller counts): when a link count repair gives links to an orphan that
// mount may not truncate.
void Checker::LeaveOrphanList(uint64_t ino) {
  state_[ino] &= static_cast<uint8_t>(~(kOnOrphanList | kOrphanFlag));
  if (!CanWrite()) return;
  const Inode& inode = InodeAt(ino);
  const uint64_t next = inode.orphan_next;
  if (dynamic_.orphan_head == ino) {
    dynamic_.orphan_head = next;
    dynamic_dirty_ = true;
  } else {
    // The list was checked: it ends, and every link on it is in range.
    for (uint64_t prev = dynamic_.orphan_head; prev != 0; prev = InodeAt(prev).orphan_next) {
      if (InodeAt(prev).orphan_next == ino) {
        WriteField(prev, InodeAt(prev).orphan_next, next);
        break;
      }
    }
  }
  WriteField(ino, inode.flags, inode.flags & ~format::kInodeFlagOrphan);
  WriteField(ino, inode.orphan_next, uint64_t{0});
}

}  // namespace nvfs::fsck
