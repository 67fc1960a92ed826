// A lock-free reader in the middle of its read, for the tests of what waits
// for readers (the allocator's grace periods, extent-map reclamation): an
// epoch guard (include/nvfs/epoch.hpp) held by a thread of its own.
#pragma once

#include <future>
#include <thread>

#include "nvfs/epoch.hpp"

namespace nvfs::test {

// The guard begins before the constructor returns and ends at End() or
// destruction; anything retired or freed in between waits for it.
class ReaderGuard {
 public:
  ReaderGuard() {
    std::future<void> entered = entered_.get_future();
    thread_ = std::thread([this, release = release_.get_future()] {
      const epoch::Guard guard;
      entered_.set_value();
      release.wait();
    });
    entered.wait();
  }
  ~ReaderGuard() { End(); }
  ReaderGuard(const ReaderGuard&) = delete;
  ReaderGuard& operator=(const ReaderGuard&) = delete;
  void End() {
    if (!thread_.joinable()) return;
    release_.set_value();
    thread_.join();
  }

 private:
  std::promise<void> entered_;
  std::promise<void> release_;
  std::thread thread_;
};

}  // namespace nvfs::test
