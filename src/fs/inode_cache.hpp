// The DRAM side of inodes: one CachedInode per inode in use, holding its lock
// and reference counts beside a pointer into the mapping. The on-media fields
// are never copied into DRAM, so a transaction that aborts leaves nothing
// stale behind.
#pragma once

#include <boost/intrusive/set.hpp>

#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "nvfs/direct_abi.hpp"
#include "nvfs/format.hpp"

namespace nvfs {

class ExtentMap;

struct CachedInode : public boost::intrusive::set_base_hook<> {
  CachedInode(uint64_t number, const format::Inode* on_media) : ino(number), media(on_media) {}
  ~CachedInode();  // frees `extents`: no reader can hold an idle inode
  CachedInode(const CachedInode&) = delete;
  CachedInode& operator=(const CachedInode&) = delete;

  const uint64_t ino;
  const format::Inode* const media;  // in the mapping

  // Protects the on-media inode and everything reached through it (the file
  // mapping, the directory tree, the xattr block).
  std::shared_mutex lock;

  // Readers of file data do not take `lock`: they read `data_seq`, copy, and
  // retry if it changed (a sequence lock). Whoever changes the file's mapping
  // or size bumps it to odd before and back to even after, while holding
  // `lock` exclusively (MappingChange), so a reader never returns bytes of a
  // block that was freed and reused under it.
  std::atomic<uint64_t> data_seq{0};
  // The inode's slot in the direct readers' table (include/nvfs/direct_abi.hpp),
  // once a direct client asked for it: its seq moves with data_seq
  // (MappingChange). Set under `lock` held shared (InodeCache::AssignSlot),
  // so never while a MappingChange runs; cleared when the entry is deleted.
  std::atomic<DirectSlot*> direct{nullptr};

  // The file's extent map, valid while its seq() equals data_seq; built and
  // replaced by readers only (read.cpp, ReadInto), freed through
  // include/nvfs/epoch.hpp. Null until the reads have paid for a build.
  std::atomic<ExtentMap*> extents{nullptr};
  // Work readers did in the bmap (blocks compared, plus a constant per
  // lookup) since the map was last built. Relaxed and racy on purpose: a
  // lost update only delays a build.
  std::atomic<uint64_t> bmap_work{0};

  // Protected by the cache's mutex.
  uint64_t lookups = 0;  // FUSE references
  uint32_t opens = 0;    // open files
  uint32_t pins = 0;     // operations in progress
  bool reclaiming = false;  // being freed: no new references

  // Made by FsImpl::Tmpfile and not linked since: Link may give it its
  // first name (the kernel's I_LINKABLE). Protected by `lock`.
  bool linkable = false;

  bool Idle() const { return lookups == 0 && opens == 0 && pins == 0; }
};

// A watch on the direct table (Filesystem::SetDirectWatch): `changed` is
// called with the slot's index after each change of a file whose slot has
// watchers. It must not wait, nor take a lock a caller of MappingChange may
// hold.
struct DirectWatch {
  void (*changed)(void* ctx, uint32_t slot) = nullptr;
  void* ctx = nullptr;
};
// Calls the watch of the table `slot` belongs to, if one was set. Lock-free.
void NotifyDirectWatch(const DirectSlot* slot);

// Marks a change of a file's mapping or size for the data path's sequence
// lock. REQUIRES: the inode's lock held exclusively for its whole life.
class MappingChange {
 public:
  // The direct slot's seq moves with data_seq: made odd before anything
  // changes (the fence orders both before every store that follows, freed
  // blocks reused by another file included), and even after, with the new
  // size published first.
  explicit MappingChange(CachedInode* inode)
      : inode_(inode), slot_(inode->direct.load(std::memory_order_relaxed)) {
    inode_->data_seq.fetch_add(1, std::memory_order_relaxed);
    if (slot_ != nullptr) slot_->seq.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~MappingChange() {
    if (slot_ != nullptr) {
      slot_->size.store(inode_->media->size, std::memory_order_relaxed);
      slot_->seq.fetch_add(1, std::memory_order_release);
      // Paired with the daemon's fence between counting a watcher and
      // reading the seq (src/daemon/direct_maps.cpp): it sees this change,
      // or this sees its watcher.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (slot_->watchers.load(std::memory_order_relaxed) != 0) NotifyDirectWatch(slot_);
    }
    inode_->data_seq.fetch_add(1, std::memory_order_release);
  }
  MappingChange(const MappingChange&) = delete;
  MappingChange& operator=(const MappingChange&) = delete;

 private:
  CachedInode* inode_;
  DirectSlot* slot_;
};

struct CachedInodeKey {
  using type = uint64_t;
  uint64_t operator()(const CachedInode& inode) const { return inode.ino; }
};

// The set of cached inodes. Thread-safe; its mutex is a leaf lock.
class InodeCache {
 public:
  using Set = boost::intrusive::set<CachedInode, boost::intrusive::key_of_value<CachedInodeKey>>;

  InodeCache() = default;
  ~InodeCache();

  // The inode's entry, created if absent, with one more pin. If the entry
  // there is being reclaimed, waits until the reclaim has erased it and
  // returns nullptr: the inode number may have been freed, or freed and
  // given to a new inode, meanwhile, so the caller checks the inode on the
  // media again before pinning it anew (FsImpl::Get).
  CachedInode* Pin(uint64_t ino, const format::Inode* on_media);
  // If inode `ino` is being reclaimed, waits until the reclaim has erased
  // it and returns true; false at once otherwise.
  bool WaitReclaimed(uint64_t ino);
  void AddLookups(CachedInode* inode, uint64_t n);
  void AddOpen(CachedInode* inode);

  // Each drops references under the cache mutex. An inode left idle by that
  // (no pins, lookups or opens) is settled under the same hold, so that no
  // other thread can find it idle too and settle it again: one with links
  // left, or any while reclaim is off, is removed and deleted (nullptr is
  // returned); an unlinked one is marked reclaiming, pinned for the caller
  // and returned: the caller frees it on the media, then calls Erase.
  CachedInode* Unpin(CachedInode* inode);
  CachedInode* ForgetLookups(uint64_t ino, uint64_t n);
  // As the others; besides, when the last open file of an unlinked inode
  // that is not idle (the kernel still holds it) closes while reclaim is
  // on, pins it for the caller and sets *free_data: the caller frees its
  // data (FsImpl::FreeUnlinkedData), then unpins it.
  CachedInode* CloseOpen(CachedInode* inode, bool* free_data);
  // Open files of `inode` now. Opens are added under the inode's lock held
  // exclusively (FsImpl::Open), so a holder of that lock sees the count
  // only fall.
  uint32_t Opens(CachedInode* inode) const;
  // Sets every inode's lookups to 0; returns those to reclaim.
  std::vector<CachedInode*> ForgetAllLookups();
  // Removes and deletes an inode the caller reclaimed.
  void Erase(CachedInode* inode);

  // Whether idle unlinked inodes are handed back for reclaim: on while the
  // filesystem is mounted read-write; off, they are just dropped (the orphan
  // list keeps them for the next mount).
  void set_reclaim_unlinked(bool on);

  size_t size() const;

  // Direct readers' slots (include/nvfs/direct_abi.hpp): slots 1 .. count-1
  // of `table` are handed to inodes by AssignSlot and given back (their seq
  // moved by 2, ino 0) when the inode's entry is deleted. Called once,
  // before any AssignSlot; the table outlives the cache.
  void SetDirectTable(DirectSlot* table, uint32_t count);
  // The inode's slot, assigned now if it has none; nullptr when every slot
  // is taken (or no table was given). REQUIRES: inode pinned, its lock held
  // (shared is enough: no MappingChange runs meanwhile).
  DirectSlot* AssignSlot(CachedInode* inode);
  DirectSlot* direct_table() const { return direct_table_; }
  // After SetDirectTable: `watch` is called for changes of watched slots of
  // this table (NotifyDirectWatch) until the cache is destroyed.
  void SetDirectWatch(const DirectWatch& watch);

 private:
  // REQUIRES: mu_ held. See Unpin.
  CachedInode* Settle(CachedInode* inode);
  // Removes the entry, gives its direct slot back and deletes it.
  // REQUIRES: mu_ held.
  void Delete(CachedInode* inode);

  mutable std::mutex mu_;
  std::condition_variable erased_;  // a reclaimed entry left the set
  Set set_;                        // protected by mu_
  bool reclaim_unlinked_ = false;  // protected by mu_
  DirectSlot* direct_table_ = nullptr;     // set once, before use
  uint32_t direct_count_ = 0;
  int watch_index_ = -1;                   // its entry among the watches
  std::vector<uint32_t> free_slots_;       // protected by mu_
};

}  // namespace nvfs
