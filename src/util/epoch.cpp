// Epoch-based reclamation (epoch.hpp).
//
// Why freeing is safe. Retire takes epoch e = global_epoch++ after the
// object was unpublished. A reader announces a = global_epoch as read on
// entering its guard, then loads published pointers. If a > e, it read the
// epoch after the increment, which follows the unpublishing, so (acquire)
// it cannot load the old pointer. Reclaim first runs a full barrier on every
// thread of the process (membarrier), then reads every announcement: a
// reader whose announcement it does not see had not yet made it visible at
// that barrier, so its later pointer loads see the object unpublished. Hence
// an object retired at e may be freed when every announcement seen is 0 or
// greater than e.
#include "nvfs/epoch.hpp"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace nvfs::epoch {

namespace detail {
std::atomic<uint64_t> global_epoch{1};
bool readers_fence = true;
constinit thread_local ThreadRecord* this_thread = nullptr;
}  // namespace detail

namespace {

struct Retired {
  void* object;
  void (*destroy)(void*);
  uint64_t epoch;
};

// Lock order: retire_mu before registry_mu.
std::mutex retire_mu;
std::vector<Retired> retired;  // protected by retire_mu

std::mutex registry_mu;
ThreadRecord* registry = nullptr;  // protected by registry_mu

std::once_flag setup_once;
bool have_membarrier = false;  // set once, in Setup

// Retired objects are freed in batches: each reclaim costs a membarrier
// (inter-processor interrupts to the CPUs running this process's threads).
constexpr size_t kBatch = 16;

void Setup() {
  std::call_once(setup_once, [] {
    const long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    have_membarrier = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    detail::readers_fence = !have_membarrier;
  });
}

void HeavyBarrier() {
  if (!have_membarrier) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // readers fence too
    return;
  }
  // Registered at Setup, the expedited command cannot fail; the global one
  // (every CPU, slower) is its documented equivalent.
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 ||
      syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0) {
    return;
  }
  // Freeing now could free what a reader is reading.
  std::fprintf(stderr, "nvfs: membarrier failed: %s\n", std::strerror(errno));
  std::abort();
}

// The smallest epoch announced by a reader inside a guard; UINT64_MAX if none.
uint64_t OldestReader() {
  std::lock_guard lock(registry_mu);
  uint64_t oldest = UINT64_MAX;
  for (ThreadRecord* r = registry; r != nullptr; r = r->next) {
    const uint64_t a = r->active.load(std::memory_order_acquire);
    if (a != 0) oldest = std::min(oldest, a);
  }
  return oldest;
}

// Frees what no reader can reach any more. REQUIRES: retire_mu held.
void ReclaimLocked() {
  HeavyBarrier();
  const uint64_t oldest = OldestReader();
  const auto reachable = std::partition(retired.begin(), retired.end(),
                                        [&](const Retired& r) { return r.epoch >= oldest; });
  for (auto it = reachable; it != retired.end(); ++it) it->destroy(it->object);
  retired.erase(reachable, retired.end());
}

// Gives the thread's record back when the thread exits.
struct Releaser {
  ~Releaser() {
    if (detail::this_thread == nullptr) return;
    std::lock_guard lock(registry_mu);
    detail::this_thread->in_use = false;
    detail::this_thread = nullptr;
  }
};
thread_local Releaser releaser;

}  // namespace

ThreadRecord* detail::RegisterThread() {
  Setup();
  std::lock_guard lock(registry_mu);
  ThreadRecord* r = registry;
  while (r != nullptr && r->in_use) r = r->next;
  if (r == nullptr) {
    r = new ThreadRecord;
    r->next = registry;
    registry = r;
  }
  r->in_use = true;
  this_thread = r;
  (void)&releaser;  // constructs it, so its destructor runs at thread exit
  return r;
}

void Retire(void* object, void (*destroy)(void*)) {
  Setup();
  std::lock_guard lock(retire_mu);
  retired.push_back({object, destroy, detail::global_epoch.fetch_add(1, std::memory_order_acq_rel)});
  if (retired.size() >= kBatch) ReclaimLocked();
}

uint64_t StartGrace() {
  Setup();
  return detail::global_epoch.fetch_add(1, std::memory_order_acq_rel);
}

uint64_t CompletedGrace() {
  Setup();
  // Tickets below `now` were taken before the barrier: a guard the scan
  // does not see began after it and cannot reach what they cover (the
  // argument at the top of this file). Every guard the scan sees announced
  // `oldest` or later, so tickets below `oldest` are over too.
  const uint64_t now = detail::global_epoch.load(std::memory_order_acquire);
  HeavyBarrier();
  return std::min(now, OldestReader()) - 1;
}

bool GraceOver(uint64_t ticket) { return ticket <= CompletedGrace(); }

void WaitForGrace(uint64_t ticket) {
  if (InGuard()) {
    std::fprintf(stderr, "nvfs: WaitForGrace inside a guard\n");
    std::abort();
  }
  while (!GraceOver(ticket)) sched_yield();
}

void Barrier() {
  Setup();
  const uint64_t before = detail::global_epoch.load(std::memory_order_acquire);
  for (;;) {
    {
      std::lock_guard lock(retire_mu);
      ReclaimLocked();
      if (std::none_of(retired.begin(), retired.end(),
                       [&](const Retired& r) { return r.epoch < before; })) {
        return;
      }
    }
    sched_yield();
  }
}

}  // namespace nvfs::epoch
