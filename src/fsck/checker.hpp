// The full check behind CheckNamespace (include/nvfs/fsck.hpp): one Checker
// per run. Its passes, split by concern over the files of src/fsck/:
//
//   fsck.cpp          the driver: superblock copies, the dynamic half, group
//                     descriptors, free counters, the report
//   fsck_journal.cpp  journal slot headers; recovery (-p, -y) or, for -n, a
//                     DRAM overlay showing the image as recovery would leave it
//   fsck_inodes.cpp   pass 1: every allocated inode (mode, flags, size,
//                     symlinks), and inodes revived by an entry
//   fsck_maps.cpp     pass 1: file maps; after pass 2, copies of shared blocks
//   fsck_xattrs.cpp   pass 1: xattr blocks and ACLs; after pass 2, bad ACLs
//                     dropped from one-block xattrs
//   fsck_orphans.cpp  the orphan list
//   fsck_dirs.cpp     pass 2 over every directory; pass 3: every directory
//                     reachable from the root exactly once
//   fsck_dir_tree.cpp, fsck_dir_entries.cpp
//                     pass 2 in one directory (dir_walker.hpp): its tree;
//                     its records and entries
//   fsck_links.cpp    pass 4: link counts and unattached inodes; pass 5:
//                     bitmaps against reachability; reconnection to lost+found
//
// The checks of single on-media objects (a file map's ranges, an xattr block,
// a directory node, leaf or record, a journal slot header, an inode's type)
// are nvfs/validate.hpp's, the same the core makes; the passes add what needs
// the whole namespace, the messages and the repairs.
//
// Memory: per inode one state byte and one 32-bit link counter; per block one
// bit; per directory a DirInfo. Nothing is allocated per inode.
//
// Threads. The two long passes (inodes by group, directories) run on several
// threads, optimistically: with repairs off (Problem() only notes that there
// was one). A pass that met no problem keeps its result — the same a single
// thread would have found; one that met any is thrown away and run again on
// one thread, which reports and repairs in a deterministic order. Shared DRAM
// state is touched through atomics in those passes: the block bitmap
// (claims) and a directory's parent entry; the inodes entries name are
// logged per thread and counted after the join.
//
// Repairs. Each is one small store (a pointer, a record, an inode field, a
// bitmap block), persisted before the check goes on, so a crash during a
// repair leaves damage that the next run finds again — never a state worse
// than the one found. Reconnecting to lost+found goes through the core's
// directory code in journal transactions (crash-atomic). In -n mode nothing is
// written and the check goes on as if each repair had been made, so one
// fault is reported once rather than cascading.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <mutex>
#include <vector>

#include "nvfs/format.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs::fsck {

// What a repair needs before -p may make it.
enum class Repair {
  kSafe,      // -p makes it: counters, leaks, link counts, lost+found, orphans
  kDecision,  // only -y: data may be lost (pointers cleared, entries dropped)
};

// Per-inode state (one byte per inode).
enum InodeState : uint8_t {
  kKindMask = 0x07,
  kFree = 0,      // not allocated, or found invalid (treated as free)
  kRegular = 1,
  kDirectory = 2,
  kSymlink = 3,
  kSpecial = 4,   // character or block device, FIFO, socket
  kOrphanFlag = 1u << 3,  // kInodeFlagOrphan is set on the media
  kOnOrphanList = 1u << 4,
  kReferenced = 1u << 5,  // some directory entry names it
  kHasXattr = 1u << 6,    // holds a valid xattr block (claimed)
};

// A directory found in pass 1, completed by passes 2 and 3.
struct DirInfo {
  uint64_t ino = 0;
  uint64_t parent_entry = 0;  // the directory whose entry names it (0: none yet)
  uint64_t entry_at = 0;      // media offset of that entry's record
  uint64_t entries = 0;       // live entries counted in pass 2
  uint32_t nlink = 0;         // on the media
  uint32_t subdirs = 0;       // entries naming directories
  uint32_t walk = 0;          // pass 3: the walk that last visited it
  bool connected = false;     // pass 3: reaches the root
  bool reconnect = false;     // to be linked into lost+found
  uint32_t xattr = 0;         // blocks its extended attributes hold (pass 1)
  bool empty_root = false;    // a root made anew (-n: as if made): no tree to walk
};

// A live entry of one leaf chain, gathered before its key is compared with
// the chain's others.
struct ChainEntry {
  uint64_t key;
  uint64_t ino;
  uint64_t at;  // media offset of the record
  const char* name;
  uint8_t name_len;
  uint8_t file_type;
};

class Checker {
 public:
  Checker(Media& media, RepairMode mode, const std::function<void(const std::string&)>& say,
          const std::function<void(uint64_t, uint64_t)>& progress, unsigned threads);
  ~Checker();

  FsckReport Run();

  // --- Reporting (fsck.cpp) ---------------------------------------------
  void Say(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  // Records a problem; returns true if the caller should repair it now. In
  // -p mode a kDecision problem stops the check (halted()).
  bool Problem(Repair repair, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  // Moves the dynamic half's mount_count, once, before the first repair
  // (fsck.cpp).
  void MoveMountCount();
  // Records a problem this version cannot repair in any mode.
  void Unrepairable(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  void Fixed() { ++report_.corrected; }
  bool CanWrite() const { return mode_ != RepairMode::kNone; }
  bool halted() const { return halted_; }

  // --- Reading: every read of the media goes through these, so the -n
  // recovery overlay sees them (fsck_journal.cpp).
  const std::byte* Block(uint64_t block_no) const {
    if (!overlay_.empty()) return OverlayBlock(block_no);
    return base_ + (block_no << block_shift_);
  }
  const format::Inode& InodeAt(uint64_t ino) const {
    const uint64_t offset = geometry_.InodeOffset(ino);
    return *reinterpret_cast<const format::Inode*>(Block(offset >> block_shift_) +
                                                   (offset & (block_size_ - 1)));
  }
  // Media offset of a byte read through Block() (for repairs).
  uint64_t OffsetIn(uint64_t block_no, const void* in_block) const {
    return (block_no << block_shift_) +
           static_cast<uint64_t>(static_cast<const std::byte*>(in_block) - Block(block_no));
  }
  uint64_t InodeOffset(uint64_t ino) const { return geometry_.InodeOffset(ino); }

  // --- Writing (repairs; never in -n mode) ---------------------------------
  void Write(uint64_t offset, const void* src, size_t len);
  void Write64(uint64_t offset, uint64_t value);
  template <class T>
  void WriteField(uint64_t ino, const T& field_in_inode, const T& value) {
    const auto* inode = reinterpret_cast<const std::byte*>(&InodeAt(ino));
    const uint64_t at = InodeOffset(ino) +
                        static_cast<uint64_t>(reinterpret_cast<const std::byte*>(&field_in_inode) -
                                              inode);
    Write(at, &value, sizeof value);
  }

  // --- Blocks ---------------------------------------------------------------
  // Why a block pointer may not be followed.
  enum class BlockFault { kNone, kOutOfRange, kMetadata, kShared };
  static const char* FaultName(BlockFault fault);
  bool IsMetadata(uint64_t block_no) const;
  BlockFault CheckBlock(uint64_t block_no) const;
  // Marks the block as referenced. REQUIRES: CheckBlock() == kNone. Another
  // thread claiming it meanwhile is a problem like any other (kShared).
  void Claim(uint64_t block_no) {
    const uint64_t bit = uint64_t{1} << (block_no % 64);
    if (!parallel_) {
      claimed_[block_no / 64] |= bit;
      return;
    }
    const uint64_t old = std::atomic_ref<uint64_t>(claimed_[block_no / 64])
                             .fetch_or(bit, std::memory_order_relaxed);
    if (old & bit) trouble_.store(true, std::memory_order_relaxed);
  }
  bool Claimed(uint64_t block_no) const {
    const uint64_t word = std::atomic_ref<uint64_t>(const_cast<uint64_t&>(claimed_[block_no / 64]))
                              .load(std::memory_order_relaxed);
    return (word >> (block_no % 64)) & 1;
  }
  // Whether the block's bit is set in the on-media block bitmap (fsck_maps.cpp).
  bool BitmapMarks(uint64_t block_no) const;

  // --- Inodes ---------------------------------------------------------------
  uint8_t State(uint64_t ino) const {
    return std::atomic_ref<uint8_t>(const_cast<uint8_t&>(state_[ino]))
        .load(std::memory_order_relaxed);
  }
  uint8_t Kind(uint64_t ino) const { return State(ino) & kKindMask; }
  // An entry names `ino`: marked referenced, one link counted.
  void CountReference(uint64_t ino) {
    state_[ino] |= kReferenced;
    if ((state_[ino] & kKindMask) != kDirectory) --links_[ino];
  }
  DirInfo* FindDir(uint64_t ino);
  // An unlinked directory being freed: on the orphan list with no links (no
  // entry names it; pass 2 drops any that does). It needs no parent.
  bool DeadDir(const DirInfo& dir) const {
    return (State(dir.ino) & kOnOrphanList) && dir.nlink == 0;
  }

 private:
  // Driver (fsck.cpp).
  void ChooseStaticCopy(FoundSuper* found);
  void CheckStaticCopies(const FoundSuper& found);
  void CheckDynamic();
  void CheckCounters();
  void WriteDynamic();
  void Progress(uint64_t done);
  // Pass 1's starting state: only the metadata blocks claimed, every inode
  // free, no link counted. REQUIRES: not in a pass on several threads.
  void StartPass1();

  // Journal (fsck_journal.cpp).
  bool CheckJournalHeaders();
  void RecoverJournal();
  void BuildOverlay();
  const std::byte* OverlayBlock(uint64_t block_no) const;
  std::byte* PatchBlock(uint64_t block_no);

  // Runs fn(item, worker) for items [0, count) on `workers` threads (the
  // calling one among them), reporting progress from the calling thread as
  // progress_base + the share done of `progress_span`. Returns the sum of
  // what fn returned.
  uint64_t RunWorkers(unsigned workers, uint64_t count, uint64_t progress_base,
                      uint64_t progress_span,
                      const std::function<uint64_t(uint64_t item, unsigned worker)>& fn);

  // Pass 1 (fsck_inodes.cpp).
  void CheckInodes();
  uint64_t CheckInodeGroup(uint32_t group);  // returns the inodes checked
  bool ReviveInode(uint64_t ino);            // pass 2: an entry names a bit-clear inode
  static bool WellFormedUnmarked(const format::Inode& inode, bool directory);
  void CheckInode(uint64_t ino, const format::Inode& inode);
  void BuildDirList();
  bool ClearInode(uint64_t ino, const char* why);
  bool ValidSymlink(uint64_t ino, const format::Inode& inode, bool in_block);

  // File maps (fsck_maps.cpp).
  uint64_t CheckFileMap(uint64_t ino, const format::Inode& inode, uint64_t* mapped_end);
  uint64_t CheckPointerBlock(uint64_t ino, uint64_t slot_at, uint64_t block_no, uint32_t height,
                             uint64_t base, uint64_t* mapped_end);
  bool CheckDataPointer(uint64_t ino, uint64_t slot_at, uint64_t block_no, uint64_t index);
  void BadPointer(uint64_t ino, uint64_t slot_at, uint64_t block_no, const char* what,
                  uint64_t index);
  // After pass 2: each data pointer that named a block another inode (or
  // the same one) had claimed gets a copy of the block (doc/integrity.md,
  // section 9), or, with no free block, is cleared.
  void CloneShared();
  // bitmap_free_only: during pass 1, when claims are not all known yet.
  uint64_t FreeBlockForCopy(bool bitmap_free_only = false);
  bool ContinuesRun(uint64_t slot_at, uint64_t ptr) const;
  uint64_t FirstDataSlot(uint64_t block_no, uint64_t* owner) const;

  // Extended attributes (fsck_xattrs.cpp).
  uint64_t CheckXattrBlock(uint64_t ino, const format::Inode& inode);
  // After pass 2: each xattr block holding a POSIX ACL value the core
  // would refuse to read (DecodeAcl; pass 1 notes the blocks) is copied
  // without it to a free block, published by one store of the inode's
  // pointer (the old block is then leaked, and freed by pass 5); with no
  // free block it is rewritten in place.
  void DropBadAcls();

  // The orphan list (fsck_orphans.cpp).
  void CheckOrphans();
  void LeaveOrphanList(uint64_t ino);

  // Passes 2 and 3 (fsck_dirs.cpp; one directory's walk: dir_walker.hpp).
  void CheckDirectories();
  void CheckConnectivity();

  // Passes 4 and 5, lost+found (fsck_links.cpp).
  void CheckLinkCounts();
  void CheckBitmaps();
  void Reconnect();

  class DirWalker;
  friend class DirWalker;

  Media& media_;
  const RepairMode mode_;
  const std::function<void(const std::string&)>& say_;
  const std::function<void(uint64_t, uint64_t)>& progress_;
  FsckReport report_;
  bool halted_ = false;  // -p met a problem that needs -y
  unsigned threads_ = 1;
  bool parallel_ = false;            // in a pass on several threads: no repairs
  std::atomic<bool> trouble_{false};  // such a pass met a problem
  bool root_made_ = false;           // the root was (or, -n, would be) made anew

  Geometry geometry_;
  format::SuperStatic super_{};
  const std::byte* base_ = nullptr;
  uint32_t block_shift_ = 0;
  uint32_t block_size_ = 0;
  uint64_t max_file_blocks_ = 0;
  uint64_t max_file_size_ = 0;
  // start_[d]: first file block of the depth-d tree; start_[6]: end of depth 5.
  uint64_t start_[format::kIndirectPointers + 2] = {};
  // Any worker reports progress as it finishes a run of items (a report
  // from worker 0 alone left a pass silent while the others took its runs).
  std::mutex progress_mu_;
  uint64_t progress_done_ = 0;   // protected by progress_mu_
  uint64_t progress_total_ = 0;  // set before the workers start

  format::SuperDynamic dynamic_{};
  bool dynamic_ok_ = false;
  bool rebuild_dynamic_ = false;
  bool dynamic_dirty_ = false;   // dynamic_ changed: written at the end
  bool mount_count_moved_ = false;  // MoveMountCount ran
  bool clear_errors_ = false;    // dynamic_.errors to be cleared at the end
  bool recovered_ = false;       // journal recovery ran (or, -n, was simulated)

  // Blocks of the recovery overlay (-n only): patched copies.
  std::unordered_map<uint64_t, std::unique_ptr<std::byte[]>> overlay_;

  // A data pointer found in pass 1 (on one thread) naming a block already
  // claimed: resolved by CloneShared() once every claim is known.
  struct SharedPointer {
    uint64_t ino;
    uint64_t slot_at;   // media offset of the pointer
    uint64_t block_no;  // the shared block
    uint64_t index;     // file block
  };
  std::vector<SharedPointer> shared_;
  // An xattr block found in pass 1 (on one thread) holding a malformed ACL
  // value: resolved by DropBadAcls().
  struct BadAcl {
    uint64_t ino;
    uint64_t block_no;
  };
  std::vector<BadAcl> bad_acls_;
  uint64_t copy_cursor_ = 0;       // FreeBlockForCopy: where the next search starts

  std::vector<uint64_t> claimed_;  // one bit per block: metadata or referenced
  std::vector<uint8_t> state_;     // InodeState per inode
  // Non-directories: nlink from the media minus the entries found; 0 when
  // they agree (wraps below zero). Directories: the blocks their extended
  // attributes hold, counted in pass 1 (pass 2 adds their nodes).
  std::vector<uint32_t> links_;
  std::vector<DirInfo> dirs_;      // in inode order
  // Directories pass 2 revived (an entry names them, their bit is clear):
  // walked after dirs_, in the order found (a deque: DirWalkers hold
  // references while more are added), then merged into dirs_.
  std::deque<DirInfo> revived_dirs_;
  std::vector<uint64_t> unattached_;  // non-directories to connect to lost+found
  // Free counts per group of the bitmaps as pass 5 leaves them.
  std::vector<uint32_t> group_free_blocks_;
  std::vector<uint32_t> group_free_inodes_;
  uint64_t lost_found_ = 0;        // inode of /lost+found, 0 if none
  uint64_t orphan_count_ = 0;
  std::chrono::steady_clock::time_point start_time_;
};

}  // namespace nvfs::fsck
