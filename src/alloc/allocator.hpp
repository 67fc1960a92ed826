// Block and inode allocation over the group bitmaps.
//
// DRAM keeps, per group, a copy of each bitmap that also marks units reserved
// by transactions still in flight and units being freed but not yet
// releasable; the media bitmaps are changed only through a Tx (set after a
// logged "allocated" record, cleared after commit). The DRAM copies and free
// counts are rebuilt from the media at mount (Load), in time proportional to
// the number of groups, not to file sizes.
//
// Blocks a committed transaction freed are not handed out again at once:
// lock-free readers may still be reading them (a `map` read's runs, which
// the kernel copies from after Map returned). They wait, cleared on the
// media but reserved in DRAM, for a grace period (nvfs/epoch.hpp): until
// every epoch guard that began before the free has ended. The wait is
// bounded in memory (kDeferredMax entries; past that the freeing thread
// waits for the readers) and never turns into ENOSPC: an allocation that
// finds no free block waits for the deferred ones (doc/integrity.md, 8).
//
// Lock order: deferred_mu_, then a group's mutex, then the media's backing
// lock (Media::Back, which may fallocate under the group's mutex); nothing
// else is taken while they are held; callers may hold inode locks.
// grow_mu_ is a leaf (nothing is taken under it).
//
// Every unit handed out is backed by the host first (BackRun), so no store
// of the filesystem ever lands in a page a sparse image file cannot supply:
// a full host is ENOSPC for the allocation, never a SIGBUS.
// Waiting for a grace period is safe under inode locks because no reader
// blocks on an inode lock inside a guard (epoch::Suspend).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "journal/journal.hpp"
#include "nvfs/epoch.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

class Allocator final : public AllocationSink {
 public:
  // `geometry` is the filesystem's own, read live: a mounted grow publishes
  // a larger one into it (Geometry::Publish). Room is made for
  // `group_capacity` groups (at least the geometry's), the most a grow of
  // this mount can reach.
  Allocator(Media& media, const Geometry& geometry, uint32_t group_capacity = 0);

  // Copies the media bitmaps into DRAM and counts free units.
  void Load();

  // A mounted grow (Filesystem::Grow), before its transaction commits:
  // until EndGrow, a release of blocks that are data blocks only in `grown`
  // (the grow's own free of the old backup block and the old last group's
  // tail, released after the commit) is accepted. EINVAL past the capacity.
  // REQUIRES: one grow at a time.
  Status BeginGrow(const Geometry& grown);
  // After the commit, before `grown` is published into the geometry: loads
  // the DRAM state of the groups it adds (the bitmaps the transaction wrote)
  // and counts their free units. Nothing is handed out of them until the
  // geometry says they exist (every search stops at its group count).
  void AddGroups(const Geometry& grown);
  // After `grown` is published (or the grow failed).
  void EndGrow();

  // Allocates one run of 1..want contiguous blocks, searching from `goal`
  // (a block number; 0 lets the allocator choose) forward, then other groups.
  // A request of 2 MiB or more that cannot continue at the goal starts on a
  // 2 MiB boundary when an aligned free 2 MiB run exists.
  // Logs the run in `tx` and sets its bits on the media. ENOSPC when no block
  // is free (or the journal slot is full).
  Result<Extent> AllocateBlocks(Tx& tx, uint64_t goal, uint64_t want);
  // Allocates one block for the bmap's pointer blocks: the highest free block
  // of `near`'s group, else of the next groups. Data is allocated upwards from
  // its goal, so pointer blocks stay out of its way, and a file written in
  // order stays one contiguous run across the ends of its pointer blocks.
  Result<uint64_t> AllocatePointerBlock(Tx& tx, uint64_t near);
  // Allocates one inode, near `near_ino`'s group for files; directories are
  // spread over groups with more than the average free inodes.
  Result<uint64_t> AllocateInode(Tx& tx, uint64_t near_ino, bool directory);

  // Frees after `tx` commits (a deferred-free record). EUCLEAN, with nothing
  // logged, unless every block is a data block (Geometry::IsDataBlock), in
  // use (DRAM and media bitmaps) and not yet freed by `tx`: a pointer read
  // from damaged media never frees group metadata, a free block, or a block
  // twice.
  Status FreeBlocks(Tx& tx, uint64_t first, uint64_t count);
  Status FreeInode(Tx& tx, uint64_t ino);

  // Free blocks, those waiting for a grace period included (they are free
  // on the media, and an allocation that needs them waits for them).
  uint64_t free_blocks() const {
    return free_blocks_.load(std::memory_order_relaxed) +
           deferred_blocks_.load(std::memory_order_relaxed);
  }
  // Blocks freed and waiting for a grace period.
  uint64_t deferred_blocks() const { return deferred_blocks_.load(std::memory_order_relaxed); }
  // Makes allocatable every deferred free whose grace period is over; with
  // `wait`, first waits until all of them are, this process's readers'
  // part (an external grace period is never waited for: its blocks stay
  // deferred, and an allocation that finds only them gets ENOSPC). With
  // `outside_too` the external part is not asked either: unmount releases
  // everything, so the counters it writes are exact (the next mount's
  // guard keeps writers of this one out: doc/integrity.md, section 11).
  // REQUIRES for `wait`: !epoch::InGuard().
  void ReleaseDeferred(bool wait, bool outside_too = false);
  // Stores made outside this process that freed blocks must also wait out
  // (nvfs/epoch.hpp). Set once, before such stores can begin; null: none.
  void SetExternalGrace(epoch::ExternalGrace* grace) {
    external_.store(grace, std::memory_order_release);
  }
  // Blocks only a transaction that allows it (Tx::AllowReserve) may take,
  // once KeepReserve was called (a mounted filesystem: FsImpl), else none:
  // every other allocation fails with ENOSPC once no more than these are
  // free. 5 % of the blocks, as ext4 keeps back for root, at most 32 MiB of
  // them (XFS keeps a pool of 8,192 blocks for what must not fail), of the
  // geometry as it is (a grow raises it). A bound checked before each
  // search, so allocations racing at the edge may take a few of them.
  void KeepReserve() { keep_reserve_.store(true, std::memory_order_relaxed); }
  uint64_t reserve_blocks() const {
    if (!keep_reserve_.load(std::memory_order_relaxed)) return 0;
    return std::min(geometry_.block_count() / 20, (uint64_t{32} << 20) >> geometry_.block_shift());
  }
  // Deferred blocks whose external grace period is not over: held back by
  // a direct writer inside a store (statfs counts them as in use).
  uint64_t held_blocks();
  uint64_t free_inodes() const { return free_inodes_.load(std::memory_order_relaxed); }
  // Per-group free counts (for the group descriptors at unmount).
  uint32_t group_free_blocks(uint32_t group) const;
  uint32_t group_free_inodes(uint32_t group) const;

  // True if the unit's bit is set in DRAM (in use, reserved, or freed and
  // waiting for a grace period): for checks.
  bool InUse(BitmapKind kind, uint64_t unit) const;
  // Marks a unit in use in DRAM only, never on the media: one the media
  // bitmap shows free but the mount's cross-check found in use (damage; the
  // bitmap is left for fsck.nvfs). It is never handed out, and never freed
  // (FreeBlocks also wants the media bit). Returns false if it was in use.
  bool Reserve(BitmapKind kind, uint64_t unit);

  // AllocationSink.
  void ClearOnMedia(BitmapKind kind, uint64_t first, uint64_t count) override;
  // Refuses (ignores) block runs that are not all data blocks.
  void Release(BitmapKind kind, uint64_t first, uint64_t count) override;
  // Inodes: released at once (no reader holds an inode number). Blocks:
  // deferred (above).
  void ReleaseFreed(BitmapKind kind, uint64_t first, uint64_t count) override;

  // A poll for finished grace periods every this many deferred frees (each
  // poll is one membarrier); at most this many entries wait (24 bytes each).
  static constexpr size_t kDeferredBatch = 64;
  static constexpr size_t kDeferredMax = 4096;

 private:
  struct Group {
    mutable std::mutex mu;
    std::vector<uint64_t> blocks;  // protected by mu
    std::vector<uint64_t> inodes;  // protected by mu
    uint32_t free_blocks = 0;      // protected by mu
    uint32_t free_inodes = 0;      // protected by mu
  };

  // Adds `delta` (negative: taken) to the group's and the total free count
  // of `kind`. REQUIRES: group.mu held.
  void CountFree(Group& group, BitmapKind kind, int64_t delta);

  // Where a run is looked for in a group.
  enum class Search {
    kFromGoal,  // first fit at or after `from`, then from the group's start
    kSpread,    // the same, in a group with at least the average free count
    kTop,       // one unit: the highest free one
  };

  // Finds and reserves (DRAM) a run in `group` starting at or after `from`
  // (bit index), or the highest free unit (kTop). REQUIRES: group.mu held.
  Extent ReserveRun(Group& group, uint32_t index, BitmapKind kind, uint64_t from, uint64_t want,
                    Search search);
  Result<Extent> AllocateIn(Tx& tx, BitmapKind kind, uint32_t first_group, uint64_t from,
                            uint64_t want, Search search);
  void SetOnMedia(BitmapKind kind, uint64_t first, uint64_t count);
  // Makes the host back the bytes of a reserved run (Media::Back): ENOSPC
  // when it cannot. REQUIRES: the group's mutex (the fallocate runs under it).
  Status BackRun(BitmapKind kind, const Extent& run);
  // When the host cannot back more: a run of at most `want` free units
  // inside what it backs already (after the deferred frees are released),
  // logged and set like AllocateIn's. ENOSPC if there is none.
  Result<Extent> AllocateBacked(Tx& tx, BitmapKind kind, uint64_t want);
  uint64_t PerGroup(BitmapKind kind) const;

  struct DeferredFree {
    uint64_t ticket;    // epoch::StartGrace
    uint64_t external;  // ExternalGrace::Start, 0 without one
    Extent extent;
  };
  // Moves out the deferred frees, from the oldest, while their ticket is at
  // most `done` and their external ticket at most `external_done`.
  std::vector<DeferredFree> TakeDeferred(uint64_t done, uint64_t external_done);
  // What the external grace says is over (everything without one).
  uint64_t ExternalDone();
  void ReleaseAll(const std::vector<DeferredFree>& frees);

  // The group's DRAM state from the media bitmaps of `g`; its free counts.
  std::pair<uint64_t, uint64_t> LoadGroup(const Geometry& g, uint32_t index);

  Media& media_;
  const Geometry& geometry_;
  const uint32_t group_capacity_;
  std::atomic<bool> keep_reserve_{false};
  std::atomic<const Geometry*> growing_{nullptr};  // BeginGrow .. EndGrow
  std::mutex grow_mu_;              // guards grow_held_ and growing_'s clearing
  std::vector<Extent> grow_held_;   // a grow's frees, released at EndGrow
  std::mutex deferred_mu_;
  std::vector<DeferredFree> deferred_;  // protected by deferred_mu_; tickets ascending
  std::atomic<uint64_t> deferred_blocks_{0};
  std::atomic<epoch::ExternalGrace*> external_{nullptr};
  std::unique_ptr<Group[]> groups_;
  std::atomic<uint64_t> free_blocks_{0};
  std::atomic<uint64_t> free_inodes_{0};
  std::atomic<uint32_t> rotor_{0};  // next group for spreading directories
  const uint64_t align_blocks_;     // blocks per 2 MiB
};

}  // namespace nvfs
