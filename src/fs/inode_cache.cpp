#include "fs/inode_cache.hpp"

namespace nvfs {

InodeCache::~InodeCache() {
  set_.clear_and_dispose([](CachedInode* inode) { delete inode; });
}

CachedInode* InodeCache::Pin(uint64_t ino, const format::Inode* on_media) {
  std::lock_guard lock(mu_);
  auto it = set_.find(ino);
  if (it != set_.end()) {
    if (it->reclaiming) return nullptr;
    ++it->pins;
    return &*it;
  }
  auto* inode = new CachedInode(ino, on_media);
  inode->pins = 1;
  set_.insert(*inode);
  return inode;
}

bool InodeCache::Unpin(CachedInode* inode) {
  std::lock_guard lock(mu_);
  --inode->pins;
  return inode->Idle() && !inode->reclaiming;
}

void InodeCache::AddLookups(CachedInode* inode, uint64_t n) {
  std::lock_guard lock(mu_);
  inode->lookups += n;
}

void InodeCache::AddOpen(CachedInode* inode) {
  std::lock_guard lock(mu_);
  ++inode->opens;
}

bool InodeCache::ForgetLookups(uint64_t ino, uint64_t n, CachedInode** out) {
  std::lock_guard lock(mu_);
  auto it = set_.find(ino);
  if (it == set_.end()) return false;
  it->lookups = n >= it->lookups ? 0 : it->lookups - n;
  *out = &*it;
  return it->Idle() && !it->reclaiming;
}

std::vector<CachedInode*> InodeCache::ForgetAllLookups() {
  std::lock_guard lock(mu_);
  std::vector<CachedInode*> idle;
  for (CachedInode& inode : set_) {
    if (inode.lookups == 0) continue;
    inode.lookups = 0;
    if (inode.Idle() && !inode.reclaiming) idle.push_back(&inode);
  }
  return idle;
}

bool InodeCache::CloseOpen(CachedInode* inode) {
  std::lock_guard lock(mu_);
  --inode->opens;
  return inode->Idle() && !inode->reclaiming;
}

bool InodeCache::Retire(CachedInode* inode, bool reclaim) {
  std::lock_guard lock(mu_);
  if (!inode->Idle() || inode->reclaiming) return false;
  if (reclaim) {
    inode->reclaiming = true;
    inode->pins = 1;
    return true;
  }
  set_.erase(set_.iterator_to(*inode));
  delete inode;
  return true;
}

void InodeCache::Erase(CachedInode* inode) {
  std::lock_guard lock(mu_);
  set_.erase(set_.iterator_to(*inode));
  delete inode;
}

size_t InodeCache::size() const {
  std::lock_guard lock(mu_);
  return set_.size();
}

}  // namespace nvfs
