// Pass 1: every allocated inode, group by group in one pass over the inode
// tables — its mode, flags and size, then (in the files beside this one) its
// file map (fsck_maps.cpp), its extended-attribute blocks (fsck_xattrs.cpp),
// its symlink target, and inode.blocks against what was counted. Inodes whose
// bit is clear are revived on an entry's evidence. The orphan list is
// fsck_orphans.cpp's.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cinttypes>
#include <cstring>
#include <ctime>

#include "fsck/checker.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/fresh_inode.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

using format::Inode;

namespace {

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
      // Whole seconds, as fsck has always written them.
      const Inode root = FreshInode(S_IFDIR | 0755, 0, 0, format::kRootIno,
                                    timespec{.tv_sec = now.tv_sec, .tv_nsec = 0},
                                    static_cast<uint32_t>(RandomU64()));
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
      StartPass1();
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
         (ValidateInode(inode, /*max_file_size=*/~uint64_t{0}) &
          (kInodeFaultReserved | kInodeFaultFlags)) == 0 &&
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
  if (TestBit(bitmap, index)) return false;
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
  // The inode's own fields, as the core checks them (ValidateInode); the
  // repairs below go by its faults.
  const InodeFaults faults = ValidateInode(inode, max_file_size_);
  if (kind == kFree) {
    char why[64];
    std::snprintf(why, sizeof why, "invalid mode 0%o", inode.mode);
    ClearInode(ino, why);
    return;
  }
  if (faults & kInodeFaultFlags) {
    if (Problem(Repair::kSafe, "inode %" PRIu64 ": unknown flags 0x%x", ino, inode.flags)) {
      WriteField(ino, inode.flags, inode.flags & format::kInodeFlagsKnown);
      Fixed();
    }
  }
  if (faults & kInodeFaultReserved) {
    if (Problem(Repair::kSafe, "inode %" PRIu64 ": reserved field not zero or append word 0x%" PRIx64
                " not valid", ino, inode.append_end)) {
      WriteField(ino, inode.reserved0, uint16_t{0});
      WriteField(ino, inode.append_end, uint64_t{0});
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
    if (faults & kInodeFaultSize) {
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
      if ((faults & kInodeFaultSize) &&
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
      if ((faults & kInodeFaultSize) &&
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

}  // namespace nvfs::fsck
