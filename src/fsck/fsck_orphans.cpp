// The orphan list, checked after pass 1: a chain from the dynamic superblock
// through inodes that carry the orphan flag; and taking an inode off it when
// pass 4 gives it links.
#include <cinttypes>

#include "fsck/checker.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

using format::Inode;

// The orphan list (inodes unlinked while open, or regular files whose
// truncation was cut short): a chain from the dynamic superblock through
// inodes that carry the orphan flag, each once — what mount's orphan pass
// accepts (src/fs/orphan.cpp). A bad link cuts the list there; flagged inodes
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
