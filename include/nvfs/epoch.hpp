// Epoch-based reclamation: freeing what lock-free readers may still be
// reading — DRAM objects (the file extent maps, src/fs/extent_map.hpp) and,
// through grace periods, blocks of the mapping (the allocator's deferred
// frees: a `map` read's runs are read by the kernel after Map returned).
//
// A reader brackets its use of such things with an epoch::Guard. A writer
// first unpublishes what it frees (no new reader can reach it), then either
// Retires an object, freed once every reader that might have reached it has
// left its guard, or takes a grace-period ticket (StartGrace) and reuses the
// thing once GraceOver says every such reader has left. Process-wide: one
// registry of reader threads, one list of retired objects.
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
  uint32_t depth = 0;            // guards entered and not left; this thread only
  ThreadRecord* next = nullptr;  // registry; set once, under the registry mutex
  bool in_use = false;           // protected by the registry mutex
};

namespace detail {
extern std::atomic<uint64_t> global_epoch;
extern bool readers_fence;  // set once, before any reader registers
extern constinit thread_local ThreadRecord* this_thread;
ThreadRecord* RegisterThread();
}  // namespace detail

namespace detail {
inline void Announce(ThreadRecord* r) {
  r->active.store(global_epoch.load(std::memory_order_acquire), std::memory_order_relaxed);
  if (readers_fence) [[unlikely]] {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
}
}  // namespace detail

// A reader's critical section. Nests: an inner guard changes nothing, the
// outermost one's announcement covers everything read until it ends.
// A thread inside a guard must not block on anything a writer may hold
// while it waits for a grace period (use Suspend around such a wait).
class Guard {
 public:
  Guard() {
    ThreadRecord* r = detail::this_thread;
    if (r == nullptr) [[unlikely]] r = detail::RegisterThread();
    record_ = r;
    if (r->depth++ == 0) detail::Announce(r);
  }
  ~Guard() {
    if (--record_->depth == 0) record_->active.store(0, std::memory_order_release);
  }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  ThreadRecord* record_;
};

// Leaves the thread's guard, if any, for its lifetime and re-enters it (at
// the epoch of then) when it ends: for a reader about to block on a lock.
// REQUIRES: nothing loaded under the guard before is used after.
class Suspend {
 public:
  Suspend() : record_(detail::this_thread) {
    if (record_ != nullptr && record_->depth != 0) {
      record_->active.store(0, std::memory_order_release);
    } else {
      record_ = nullptr;
    }
  }
  ~Suspend() {
    if (record_ != nullptr) detail::Announce(record_);
  }
  Suspend(const Suspend&) = delete;
  Suspend& operator=(const Suspend&) = delete;

 private:
  ThreadRecord* record_;
};

// True if the calling thread is inside a guard (it must then not wait for a
// grace period: it would wait for itself).
// For a caller that abandoned guards without running their destructors
// (a media error: RunFaultGuarded, nvfs/media.hpp): the depth to come back
// to, saved before, and the way back. REQUIRES: no Suspend was abandoned.
inline uint32_t GuardDepth() {
  return detail::this_thread != nullptr ? detail::this_thread->depth : 0;
}
inline void AbandonGuardsTo(uint32_t depth) {
  ThreadRecord* r = detail::this_thread;
  if (r == nullptr || r->depth == depth) return;
  r->depth = depth;
  if (depth == 0) r->active.store(0, std::memory_order_release);
}

inline bool InGuard() {
  return detail::this_thread != nullptr && detail::this_thread->depth != 0;
}

// Frees `object` with `destroy` once no guard that began before this call is
// still running. REQUIRES: `object` is unreachable for readers that begin
// after this call. Thread-safe; may free earlier retired objects.
void Retire(void* object, void (*destroy)(void*));

// Waits until every object retired before the call is freed. For teardown
// (so that nothing retired outlives the owner of what it pointed into).
void Barrier();

// Grace periods, for things that are not objects to destroy. After making
// something unreachable for readers that begin later, a writer takes a
// ticket; the thing may be reused once GraceOver(ticket) — every guard that
// began before StartGrace has ended. Thread-safe.
uint64_t StartGrace();
// Costs a membarrier (an interrupt to every CPU running this process) and
// a scan of the reader registry: callers batch their tickets.
bool GraceOver(uint64_t ticket);
// The newest ticket whose grace period is over, as GraceOver would say of
// it (so GraceOver(t) == (t <= CompletedGrace())); one barrier and one scan.
uint64_t CompletedGrace();
// Waits until GraceOver(ticket). REQUIRES: !InGuard().
void WaitForGrace(uint64_t ticket);

// Grace periods of stores made outside this process: direct writers
// (src/daemon/direct_writers.hpp), which store into a file's blocks from
// their own mapping of the namespace. A block a file gave up may go to
// another file only once every such store that might have begun before the
// file's change was published has ended. Unlike a guard in this process,
// such a store may be held up for as long as its process is stopped:
// nothing ever waits for one. The allocator keeps what it frees until
// Completed() passes its ticket, and counts it as in use meanwhile
// (doc/integrity.md, section 11).
class ExternalGrace {
 public:
  virtual ~ExternalGrace() = default;
  // A grace period beginning now: its ticket. Orders every store the caller
  // made before (the change that unpublished the blocks: a file's slot seq
  // moved) before the scan of the writers that follows (a full fence).
  // Never waits; allocates nothing but under its own lock.
  virtual uint64_t Start() = 0;
  // Every ticket up to the value returned is over. Never waits.
  virtual uint64_t Completed() = 0;
};

}  // namespace nvfs::epoch
