// Epoch-based reclamation: freeing DRAM objects that lock-free readers may
// still be reading (the file extent maps, src/fs/extent_map.hpp).
//
// A reader brackets its use of such objects with an epoch::Guard. A writer
// first unpublishes an object (no new reader can reach it), then Retires it;
// it is freed once every reader that might have reached it has left its
// guard. Process-wide: one registry of reader threads, one list of retired
// objects.
//
// Readers pay two plain stores to a cache line of their own. The ordering a
// reader would need between announcing itself and loading the published
// pointer (a full fence: x86 reorders a store after a later load) is
// provided from the reclaiming side instead, by membarrier(2)'s
// PRIVATE_EXPEDITED command, which runs a full barrier on every CPU running
// a thread of this process (the scheme of liburcu's "memb" flavour). Where
// membarrier is unavailable (old kernels, valgrind), readers fence.
#pragma once

#include <atomic>
#include <cstdint>

namespace nvfs::epoch {

// One per thread that has entered a guard; never freed (reused after the
// thread exits).
struct alignas(64) ThreadRecord {
  // 0 outside a guard; else the global epoch read on entering.
  std::atomic<uint64_t> active{0};
  ThreadRecord* next = nullptr;  // registry; set once, under the registry mutex
  bool in_use = false;           // protected by the registry mutex
};

namespace detail {
extern std::atomic<uint64_t> global_epoch;
extern bool readers_fence;  // set once, before any reader registers
extern constinit thread_local ThreadRecord* this_thread;
ThreadRecord* RegisterThread();
}  // namespace detail

// A reader's critical section. Not reentrant: one per thread at a time.
class Guard {
 public:
  Guard() {
    ThreadRecord* r = detail::this_thread;
    if (r == nullptr) [[unlikely]] r = detail::RegisterThread();
    record_ = r;
    r->active.store(detail::global_epoch.load(std::memory_order_acquire),
                    std::memory_order_relaxed);
    if (detail::readers_fence) [[unlikely]] {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    }
  }
  ~Guard() { record_->active.store(0, std::memory_order_release); }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  ThreadRecord* record_;
};

// Frees `object` with `destroy` once no guard that began before this call is
// still running. REQUIRES: `object` is unreachable for readers that begin
// after this call. Thread-safe; may free earlier retired objects.
void Retire(void* object, void (*destroy)(void*));

// Waits until every object retired before the call is freed. For teardown
// (so that nothing retired outlives the owner of what it pointed into).
void Barrier();

}  // namespace nvfs::epoch
