// The undo journal: every metadata operation runs as one transaction in one
// journal slot (doc/integrity.md, section 3, gives the store order and the
// argument; this header gives the contracts).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

enum class BitmapKind { kBlocks, kInodes };

struct Extent {
  uint64_t first = 0;
  uint64_t count = 0;
};

// What a transaction asks of the allocators when it aborts or frees. The
// allocators implement it; the journal never touches a bitmap itself at run
// time (recovery, single-threaded, uses ClearMediaBits directly).
class AllocationSink {
 public:
  virtual ~AllocationSink() = default;
  // Clears the bits on the media and flushes them (no fence).
  virtual void ClearOnMedia(BitmapKind kind, uint64_t first, uint64_t count) = 0;
  // Makes the units allocatable again in DRAM. Called only once clearing them
  // on the media can no longer be undone or repeated by recovery. For units
  // an aborted transaction had allocated: nothing outside it saw them.
  virtual void Release(BitmapKind kind, uint64_t first, uint64_t count) = 0;
  // The same for units a committed transaction freed, which lock-free
  // readers may still be reading (a `map` read's runs): blocks become
  // allocatable only after a grace period (src/alloc/allocator.hpp).
  virtual void ReleaseFreed(BitmapKind kind, uint64_t first, uint64_t count) = 0;
};

// Clears bits [first, first + count) of the block or inode bitmaps on the
// media and flushes them; no locking (recovery, mkfs-time tools).
void ClearMediaBits(Media& media, const Geometry& geometry, BitmapKind kind, uint64_t first,
                    uint64_t count);

class Journal;

// One operation's transaction. Driven by one thread. Until Commit or Abort the
// caller holds the locks that protect every byte it stores through the Tx.
// Once it has committed or aborted it stores nothing more: its slot may be
// another transaction's already, and nothing would undo the store. Every
// store and record after the end is a bug that stops the process (abort)
// before it writes.
class Tx {
 public:
  Tx(Journal& journal, const char* op_name);  // waits for a free slot
  ~Tx();                                      // aborts if still open
  Tx(const Tx&) = delete;
  Tx& operator=(const Tx&) = delete;

  // Logged in-place stores: the old bytes are made durable in the journal
  // first. REQUIRES: the range is inside the filesystem.
  void Store(uint64_t offset, const void* src, size_t len);
  void Store64(uint64_t offset, uint64_t value);
  // A field of an on-media struct, by its address in the mapping.
  template <class T>
  void Set(const T& field, const T& value) {
    Store(OffsetOf(&field), &value, sizeof value);
  }
  uint64_t OffsetOf(const void* in_mapping) const;

  // Unlogged stores to bytes nothing reachable points to yet (write before
  // publish). Flushed at commit.
  void StoreFresh(uint64_t offset, const void* src, size_t len);
  void FillFresh(uint64_t offset, int byte, size_t len);

  // Logical records. LogAllocated must be called, and return true, before the
  // bits are set on the media; false means the slot is full (nothing logged).
  bool LogAllocated(BitmapKind kind, uint64_t first, uint64_t count);
  // Blocks or inodes to free once this transaction commits.
  bool LogDeferredFree(BitmapKind kind, uint64_t first, uint64_t count);
  // True if this transaction already frees any of [first, first + count).
  bool Frees(BitmapKind kind, uint64_t first, uint64_t count) const;

  // Bytes left in the slot for records.
  size_t room() const;
  // Lets this transaction's block allocations take the blocks every other
  // allocation leaves free (Allocator::reserve_blocks): what must not fail
  // for want of space, or must not have failed (the write-back of a store
  // the kernel already accepted, the blocks behind a page a mapping may
  // store into, an operation that frees space).
  void AllowReserve() { reserve_ = true; }
  bool reserve_allowed() const { return reserve_; }
  // True once committed or aborted.
  bool finished() const { return !open_; }
  // False once a record did not fit: later stores are skipped and Commit
  // aborts and fails.
  bool ok() const { return ok_; }

  // Makes everything durable (section 3, step 4). Fails (after aborting)
  // when the slot overflowed, and with EIO once a page of the namespace was
  // lost to a media error (Media::LostPages: a store of this or any
  // transaction may have gone to memory that keeps nothing), unless
  // CommitAfterMediaLoss was called. A no-op on a transaction already
  // finished.
  Status Commit();
  // For the one transaction that records the error: commits whatever
  // pages were lost (its own stores are to the superblock; if that page is
  // lost too, nothing is kept, and the mount is not marked clean anyway).
  void CommitAfterMediaLoss() { after_loss_ = true; }
  // Undoes everything stored through this Tx (section 3, step 5).
  void Abort();

  Media& media() const;

 private:
  bool AppendRecord(format::JournalRecordType type, uint64_t target, uint32_t length,
                    const void* payload);
  void NoteDirty(uint64_t offset, size_t len);
  void CheckRange(uint64_t offset, size_t len) const;  // aborts the process on a bug
  void CheckOpen(const char* what) const;              // the same
  void FlushDirty();
  void SetState(format::JournalState state);
  void Finish();

  Journal& journal_;
  uint32_t slot_ = 0;
  uint64_t slot_offset_ = 0;
  uint64_t seq_ = 0;
  uint32_t used_ = 0;  // bytes of records after the slot header
  bool ok_ = true;
  bool open_ = true;
  bool after_loss_ = false;
  bool reserve_ = false;
  std::vector<Extent> dirty_;  // byte ranges stored since begin
  struct Allocation {
    BitmapKind kind;
    Extent extent;
  };
  std::vector<Allocation> allocated_;  // undone by Abort
  std::vector<Allocation> frees_;      // done after Commit
  // The body of LogAllocated and LogDeferredFree: the records of `type`,
  // noted in *noted.
  bool LogRuns(format::JournalRecordType type, BitmapKind kind, uint64_t first, uint64_t count,
               std::vector<Allocation>* noted);
  // Clears the bits of `runs` on the media (Commit: the frees; Abort: the
  // allocations), unfenced.
  void ClearOnMedia(const std::vector<Allocation>& runs);
};

class Journal {
 public:
  Journal(Media& media, const Geometry& geometry);

  struct RecoveryStats {
    uint32_t undone = 0;     // active operations rolled back
    uint32_t completed = 0;  // committed operations whose frees were finished
    uint64_t records = 0;    // records applied
  };
  // Brings every slot to idle (section 3, "Recovery"). Single-threaded, at
  // mount, before anything else writes. Never reads or writes outside the
  // mapping whatever the slots hold; a damaged slot header fails with EUCLEAN
  // before anything is written.
  Result<RecoveryStats> Recover();

  // One action of recovery: kUndo restores `length` bytes of `payload` (in
  // the mapping) at byte offset `target`; kBitmapSet and kDeferredFree clear
  // block bits [target, target + length), kInodeSet and kInodeFree inode bits.
  struct RecoveryStep {
    format::JournalRecordType type;
    uint64_t target;
    uint32_t length;
    const std::byte* payload;
  };
  // What Recover would do, without doing it (fsck -n checks the namespace as
  // recovery would leave it): calls fn for each step of each slot that is not
  // idle, in the order Recover applies them. EUCLEAN on a damaged slot header
  // (before any call). Reads nothing outside the mapping.
  Status PlanRecovery(
      const std::function<void(uint32_t slot, const RecoveryStep& step)>& fn) const;
  // EUCLEAN naming the first slot whose header is damaged.
  Status CheckSlotHeaders() const;

  void set_sink(AllocationSink* sink) { sink_ = sink; }
  // Told once, by the first commit refused after a page was lost (Commit);
  // the filesystem records the error. Set before the journal is used.
  void set_loss_listener(std::function<void(const Error&)> listener) {
    loss_listener_ = std::move(listener);
  }
  Media& media() const { return media_; }
  const Geometry& geometry() const { return geometry_; }

 private:
  friend class Tx;
  uint32_t AcquireSlot();
  void ReleaseSlot(uint32_t slot);
  // The recovery steps of one slot, whose header is valid.
  void ForEachStep(uint32_t slot, const std::function<void(const RecoveryStep& step)>& fn) const;
  // Validity of a record's target, shared by recovery and its tests.
  bool ValidRecord(const format::JournalRecord& record) const;

  Media& media_;
  // The filesystem's own, read live: a mounted grow publishes a larger one
  // into it once its transaction has committed (Geometry::Publish).
  const Geometry& geometry_;
  AllocationSink* sink_ = nullptr;
  std::function<void(const Error&)> loss_listener_;
  std::atomic<bool> loss_told_{false};

  std::mutex mu_;
  std::condition_variable slot_freed_;
  std::vector<uint32_t> free_slots_;  // protected by mu_
  uint64_t next_seq_ = 1;             // protected by mu_
};

}  // namespace nvfs
