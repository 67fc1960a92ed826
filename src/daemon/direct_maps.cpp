// Direct maps' grace period, the daemon's side (direct_maps.hpp).
//
// Why a late look is enough: a ticket is taken after the change that freed
// its blocks moved the file's slot seq. When Completed() first looks at a
// ticket, a mapper whose files are all at the seqs it acknowledged has
// mapped each of them again since any such change (an acknowledgement of
// seq s comes after the client replaced its pages with runs given at s),
// so no page of it points at those blocks; any other mapper holds the
// ticket back until it is.
#include "daemon/direct_maps.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>

namespace nvfs::direct {

void Maps::SetWriters(Writers* writers) {
  std::lock_guard lock(mu_);
  writers->SkipTo(ticket_);
  writers_ = writers;
}

uint64_t Maps::Start() {
  std::lock_guard lock(mu_);
  ticket_ = writers_ != nullptr ? writers_->Start() : ticket_ + 1;
  return ticket_;
}

uint64_t Maps::Completed() {
  std::lock_guard lock(mu_);
  uint64_t done = writers_ != nullptr ? writers_->Completed() : ticket_;
  if (scanned_ < ticket_) {
    bool tell = false;
    for (auto& [id, m] : mappers_) {
      if (m.owe != 0) continue;
      if (m.orphan) {
        m.owe = scanned_ + 1;
      } else if (Stale(m)) {
        m.owe = scanned_ + 1;
        m.tell = true;
        tell = true;
      }
    }
    scanned_ = ticket_;
    if (tell) Wake();
  }
  for (const auto& [id, m] : mappers_) {
    if (m.owe != 0) done = std::min(done, m.owe - 1);
  }
  return done;
}

bool Maps::Stale(const Mapper& m) const {
  for (const auto& [ino, f] : m.files) {
    if (table_[f.slot].seq.load(std::memory_order_acquire) != f.validated) return true;
  }
  return false;
}

void Maps::BeginRegister(uint64_t id) {
  std::lock_guard lock(mu_);
  Mapper& m = mappers_[id];
  ++m.registering;
  // Tickets up to scanned_ were looked at before these runs are read: the
  // blocks they free left their files before, so the runs cannot name
  // them. Every later ticket waits.
  if (m.owe == 0) {
    m.owe = scanned_ + 1;
    m.owe_for_register = true;
  }
}

void Maps::EndRegister(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = mappers_.find(id);
  if (it == mappers_.end()) return;
  Mapper& m = it->second;
  if (--m.registering > 0 || !m.owe_for_register) return;
  m.owe_for_register = false;
  // Still at the seqs its runs were given at: nothing of what was freed
  // meanwhile is in them. Else the mapper is told, and holds until Done.
  if (!m.orphan && !Stale(m)) {
    m.owe = 0;
  } else if (!m.orphan && !m.told) {
    m.tell = true;
    Wake();
  }
}

bool Maps::Register(uint64_t id, uint64_t ino, uint32_t slot, uint64_t seq) {
  if (slot == 0 || slot >= slot_count_) return false;
  std::lock_guard lock(mu_);
  Mapper& m = mappers_[id];
  auto [it, fresh] = m.files.try_emplace(ino, File{slot, seq});
  if (!fresh && it->second.slot != slot) {
    // The inode was given another slot (it left the cache and came back):
    // its maps were made at the old one's seqs, which never come back.
    table_[it->second.slot].watchers.fetch_sub(1, std::memory_order_relaxed);
    it->second.slot = slot;
    fresh = true;
  }
  if (fresh) table_[slot].watchers.fetch_add(1, std::memory_order_relaxed);
  // Paired with MappingChange's (src/fs/inode_cache.hpp): a change this
  // does not see below calls the watch.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!m.told && Stale(m)) {
    m.tell = true;
    Wake();
  }
  return true;
}

bool Maps::Holds(uint64_t id, uint64_t ino) const {
  std::lock_guard lock(mu_);
  auto it = mappers_.find(id);
  return it != mappers_.end() && it->second.files.count(ino) != 0;
}

void Maps::Unregister(uint64_t id, uint64_t ino) {
  std::lock_guard lock(mu_);
  auto it = mappers_.find(id);
  if (it == mappers_.end()) return;
  Mapper& m = it->second;
  auto f = m.files.find(ino);
  if (f == m.files.end()) return;
  table_[f->second.slot].watchers.fetch_sub(1, std::memory_order_relaxed);
  m.files.erase(f);
  // The client unmapped before it said so: with nothing mapped it holds
  // nothing back.
  if (m.files.empty()) m.owe = 0;
}

void Maps::Acknowledged(uint64_t id, uint64_t ino, uint64_t seq) {
  std::lock_guard lock(mu_);
  auto it = mappers_.find(id);
  if (it == mappers_.end()) return;
  auto f = it->second.files.find(ino);
  if (f != it->second.files.end()) f->second.validated = seq;
}

void Maps::Done(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = mappers_.find(id);
  if (it == mappers_.end()) return;
  Mapper& m = it->second;
  m.told = false;
  if (Stale(m)) {
    m.tell = true;  // changed again since: told again, and still held
    Wake();
  } else {
    m.owe = 0;
  }
}

void Maps::Orphan(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = mappers_.find(id);
  if (it == mappers_.end()) return;
  it->second.orphan = true;
  it->second.tell = it->second.told = false;
}

void Maps::Drop(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = mappers_.find(id);
  if (it == mappers_.end()) return;
  for (const auto& [ino, f] : it->second.files) {
    table_[f.slot].watchers.fetch_sub(1, std::memory_order_relaxed);
  }
  mappers_.erase(it);
}

std::vector<uint64_t> Maps::TakeNotifications() {
  std::vector<uint64_t> out;
  std::lock_guard lock(mu_);
  for (auto& [id, m] : mappers_) {
    if (m.orphan || m.told || !(m.tell || Stale(m))) continue;
    m.tell = false;
    m.told = true;
    out.push_back(id);
  }
  return out;
}

void Maps::Wake() const {
  const uint64_t one = 1;
  // An eventfd's counter does not overflow in practice; a failed write
  // only delays the next look (the server also looks on each round).
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

void Maps::Changed(void* ctx, uint32_t /*slot*/) { static_cast<Maps*>(ctx)->Wake(); }

}  // namespace nvfs::direct
