// The reaper (reaper.hpp).
#include "daemon/reaper.hpp"

#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace nvfs::daemon {

struct Reaper::Shared {
  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<std::pair<int, uid_t>> queue;  // protected by mu
  std::map<uid_t, unsigned> pending;         // protected by mu; queued or being closed
  bool stopping = false;                     // protected by mu

  // The thread's loop; it holds its own reference to the state.
  static void Run(std::shared_ptr<Shared> self);
};

void Reaper::Shared::Run(std::shared_ptr<Shared> self) {
  std::unique_lock lock(self->mu);
  for (;;) {
    self->wake.wait(lock, [&] { return !self->queue.empty() || self->stopping; });
    if (self->queue.empty()) return;  // stopping, and nothing left
    const auto [fd, owner] = self->queue.front();
    self->queue.pop_front();
    lock.unlock();
    close(fd);  // may wait for as long as whoever passed it wants
    lock.lock();
    auto it = self->pending.find(owner);
    if (it != self->pending.end() && --it->second == 0) self->pending.erase(it);
  }
}

std::unique_ptr<Reaper> Reaper::Create(std::string* why) {
  try {
    return std::unique_ptr<Reaper>(new Reaper(std::make_shared<Shared>()));
  } catch (const std::bad_alloc&) {
    *why = "cannot set up the closing of passed descriptors: out of memory";
  }
  return nullptr;
}

bool Reaper::Run(std::string* why) {
  if (running_) return true;
  try {
    std::thread(Shared::Run, shared_).detach();
  } catch (const std::system_error& e) {
    *why = std::string("cannot start the thread that closes passed descriptors: ") + e.what();
    return false;
  } catch (const std::bad_alloc&) {
    *why = "cannot start the thread that closes passed descriptors: out of memory";
    return false;
  }
  running_ = true;
  return true;
}

Reaper::Reaper(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

Reaper::~Reaper() {
  std::lock_guard lock(shared_->mu);
  shared_->stopping = true;
  shared_->wake.notify_one();
}

void Reaper::Release(int fd, uid_t owner) noexcept {
  if (fd < 0) return;
  std::lock_guard lock(shared_->mu);
  try {
    shared_->queue.emplace_back(fd, owner);
    ++shared_->pending[owner];
  } catch (const std::bad_alloc&) {
    // Leaked: open for good is better than a close that may wait here.
    return;
  }
  shared_->wake.notify_one();
}

unsigned Reaper::Pending(uid_t owner) const noexcept {
  std::lock_guard lock(shared_->mu);
  const auto it = shared_->pending.find(owner);
  return it == shared_->pending.end() ? 0 : it->second;
}

}  // namespace nvfs::daemon
