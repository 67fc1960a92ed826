#include "fs/inode_cache.hpp"

#include "fs/extent_map.hpp"
#include "util/races.hpp"

namespace nvfs {

CachedInode::~CachedInode() { ExtentMap::Destroy(extents.load(std::memory_order_relaxed)); }

namespace {

// The watches of every table in the process (a daemon has one; tests may
// make several filesystems). Set and cleared under watches_mu; read
// without a lock by NotifyDirectWatch.
struct WatchEntry {
  std::atomic<const DirectSlot*> begin{nullptr};
  const DirectSlot* end = nullptr;
  DirectWatch watch;
};
constexpr int kMaxWatches = 16;
WatchEntry watches[kMaxWatches];
std::mutex watches_mu;

}  // namespace

void NotifyDirectWatch(const DirectSlot* slot) {
  for (WatchEntry& e : watches) {
    const DirectSlot* begin = e.begin.load(std::memory_order_acquire);
    if (begin != nullptr && slot >= begin && slot < e.end) {
      e.watch.changed(e.watch.ctx, static_cast<uint32_t>(slot - begin));
      return;
    }
  }
}

void InodeCache::SetDirectWatch(const DirectWatch& watch) {
  std::lock_guard lock(watches_mu);
  for (int i = 0; i < kMaxWatches; ++i) {
    if (watches[i].begin.load(std::memory_order_relaxed) != nullptr) continue;
    watches[i].end = direct_table_ + direct_count_;
    watches[i].watch = watch;
    watches[i].begin.store(direct_table_, std::memory_order_release);
    watch_index_ = i;
    return;
  }
}

InodeCache::~InodeCache() {
  if (watch_index_ >= 0) {
    std::lock_guard lock(watches_mu);
    watches[watch_index_].begin.store(nullptr, std::memory_order_release);
  }
  while (!set_.empty()) Delete(&*set_.begin());
}

void InodeCache::Delete(CachedInode* inode) {
  set_.erase(set_.iterator_to(*inode));
  if (DirectSlot* slot = inode->direct.load(std::memory_order_relaxed)) {
    // A client's snapshot of this slot never matches again: the seq moves
    // on, and the next inode given the slot starts from there.
    slot->ino.store(0, std::memory_order_relaxed);
    slot->seq.fetch_add(2, std::memory_order_release);
    free_slots_.push_back(static_cast<uint32_t>(slot - direct_table_));
  }
  delete inode;
}

void InodeCache::SetDirectTable(DirectSlot* table, uint32_t count) {
  std::lock_guard lock(mu_);
  direct_table_ = table;
  direct_count_ = count;
  free_slots_.clear();
  for (uint32_t i = count; i-- > 1;) free_slots_.push_back(i);  // slot 1 first
}

DirectSlot* InodeCache::AssignSlot(CachedInode* inode) {
  std::lock_guard lock(mu_);
  if (DirectSlot* slot = inode->direct.load(std::memory_order_relaxed)) return slot;
  if (free_slots_.empty()) return nullptr;
  DirectSlot* slot = &direct_table_[free_slots_.back()];
  free_slots_.pop_back();
  slot->size.store(inode->media->size, std::memory_order_relaxed);
  slot->ino.store(inode->ino, std::memory_order_relaxed);
  inode->direct.store(slot, std::memory_order_release);
  return slot;
}

CachedInode* InodeCache::Pin(uint64_t ino, const format::Inode* on_media) {
  std::unique_lock lock(mu_);
  auto it = set_.find(ino);
  if (it != set_.end()) {
    if (it->reclaiming) {
      // Reclaim's last commit frees the inode number before the entry is
      // erased: a create that reuses the number lands here (it used to get
      // ESTALE for a file it had just made).
      erased_.wait(lock, [&] {
        auto now = set_.find(ino);
        return now == set_.end() || !now->reclaiming;
      });
      return nullptr;
    }
    ++it->pins;
    return &*it;
  }
  auto* inode = new CachedInode(ino, on_media);
  inode->pins = 1;
  set_.insert(*inode);
  return inode;
}

bool InodeCache::WaitReclaimed(uint64_t ino) {
  std::unique_lock lock(mu_);
  auto it = set_.find(ino);
  if (it == set_.end() || !it->reclaiming) return false;
  erased_.wait(lock, [&] {
    auto now = set_.find(ino);
    return now == set_.end() || !now->reclaiming;
  });
  return true;
}

CachedInode* InodeCache::Settle(CachedInode* inode) {
  if (!inode->Idle() || inode->reclaiming) return nullptr;
  if (reclaim_unlinked_ && inode->media->nlink == 0) {
    inode->reclaiming = true;
    inode->pins = 1;
    return inode;
  }
  Delete(inode);
  return nullptr;
}

CachedInode* InodeCache::Unpin(CachedInode* inode) {
  std::lock_guard lock(mu_);
  --inode->pins;
  return Settle(inode);
}

void InodeCache::AddLookups(CachedInode* inode, uint64_t n) {
  std::lock_guard lock(mu_);
  inode->lookups += n;
}

void InodeCache::AddOpen(CachedInode* inode) {
  std::lock_guard lock(mu_);
  ++inode->opens;
}

CachedInode* InodeCache::ForgetLookups(uint64_t ino, uint64_t n) {
  std::lock_guard lock(mu_);
  auto it = set_.find(ino);
  if (it == set_.end()) return nullptr;
  it->lookups = n >= it->lookups ? 0 : it->lookups - n;
  return Settle(&*it);
}

std::vector<CachedInode*> InodeCache::ForgetAllLookups() {
  std::lock_guard lock(mu_);
  std::vector<CachedInode*> reclaim;
  for (auto it = set_.begin(); it != set_.end();) {
    CachedInode* inode = &*it++;  // Settle may delete it
    if (inode->lookups == 0) continue;
    inode->lookups = 0;
    if (CachedInode* r = Settle(inode)) reclaim.push_back(r);
  }
  return reclaim;
}

CachedInode* InodeCache::CloseOpen(CachedInode* inode, bool* free_data) {
  std::lock_guard lock(mu_);
  --inode->opens;
  if (inode->Idle()) return Settle(inode);  // may delete it
  // The link count is read under mu_, after the decrement: an unlink that
  // drops the last link reads `opens` under mu_ after its commit
  // (FsImpl::FreeUnlinkedData), so one of the two sees the other, and the
  // data is freed by one of them or both (the second finds nothing). The
  // unlink stores it under the inode's lock, not mu_, so the load races
  // with that store (LoadRacing, util/races.hpp): a hint that
  // FreeUnlinkedData checks again under the inode's lock, which a 0 from an
  // unlink that then aborted does not pass.
  if (inode->opens == 0 && reclaim_unlinked_ && !inode->reclaiming &&
      LoadRacing(inode->media->nlink) == 0) {
    ++inode->pins;
    *free_data = true;
  }
  return nullptr;
}

uint32_t InodeCache::Opens(CachedInode* inode) const {
  std::lock_guard lock(mu_);
  return inode->opens;
}

void InodeCache::Erase(CachedInode* inode) {
  {
    std::lock_guard lock(mu_);
    Delete(inode);
  }
  erased_.notify_all();
}

void InodeCache::set_reclaim_unlinked(bool on) {
  std::lock_guard lock(mu_);
  reclaim_unlinked_ = on;
}

size_t InodeCache::size() const {
  std::lock_guard lock(mu_);
  return set_.size();
}

}  // namespace nvfs
