// Safe reclamation for libnvfs-direct: what a read dereferences without a
// lock (a handle's snapshot of runs, a preloaded descriptor's handle) is
// replaced under the readers' feet and freed only once no reader can still
// hold it.
//
// Why not the core's epoch (include/nvfs/epoch.hpp, src/util/epoch.cpp):
// the idea is the same, the constraints are not, and they would leave the
// core's version no simpler if it took them. This one runs inside other
// programs (LD_PRELOAD) and under a SIGBUS handler: retiring never
// allocates (a fixed queue, the core's grows a std::vector), a record is
// reached through an initial-exec thread_local that also carries the
// library's entry depth and copy state for fault.cpp (the core's is a
// plain thread_local pointer), a section that a siglongjmp never closes
// must not stop reclamation for good (garbage is bounded: a retirer waits,
// then leaks; the core's list just grows), and fork() is handled (the
// preload lives on in a child; the daemon never forks with readers). The
// core's nests guards and has grace periods for blocks of the mapping,
// which the library has no use for.
// Sharing one source would put all of that in both.
//
// The scheme is epoch based. A reader marks its thread's record with the
// global epoch before it loads the pointer and clears the mark after its
// last use (a read section); Retire() bumps the epoch and queues the object
// with the new value; an object is freed once every record is clear or
// marked with an epoch at least the object's. A reader marked with that
// epoch loaded the pointer after it was replaced (the bump is made after
// the replacement is published, and read with acquire), so it cannot hold
// the old one.
//
// The reader's mark is a plain store that has to be visible before its
// loads of the pointer: a store-load order, which costs a full fence per
// read. When the kernel offers membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
// the fence moves to the reclaimer instead (a compiler barrier on the read
// side; the reclaimer's membarrier makes every running thread of the
// process execute a full barrier before it scans the records), the
// "asymmetric fence" of liburcu's memb flavour and folly. Retirements are
// rare (a refresh of runs, a close), reads are not.
//
// Garbage is bounded: Retire collects when kCollectAt objects wait, and
// waits for the readers (yielding) when kMaxGarbage do. Nothing is freed
// on a scan whose barrier failed (membarrier refused with readers relying
// on it): the objects wait for a collection whose barrier succeeds, and
// with the queue full a retired object is leaked instead. Read sections are
// short (one bounded copy, never a system call) and never nest: a thread
// never retires or waits inside its own section. The one way a section
// stays open for good is a signal handler that siglongjmps out of a read;
// reclamation then stops, and what is retired after is leaked (after a
// bounded wait) rather than freed or waited for. That thread's later reads
// go to the kernel (its depth count stays up, file.hpp).
#pragma once

#include <atomic>
#include <cstdint>

namespace nvfs::direct {

struct alignas(64) ReaderRecord {
  std::atomic<uint64_t> epoch{0};  // 0: not in a read section
  std::atomic<bool> in_use{false};
  ReaderRecord* next = nullptr;  // the list of all records; set before publication
};

// Per thread; initial-exec, so the hot path and the SIGBUS handler reach it
// with one %fs-relative load and without __tls_get_addr.
struct ThreadState {
  ReaderRecord* record;  // this thread's, or null before its first read
  uint32_t depth;        // > 0 while the thread runs the library from an entry point
  uint32_t in_copy;      // > 0 while it copies out of a namespace mapping (fault.cpp)
};
extern constinit thread_local ThreadState tls __attribute__((tls_model("initial-exec")));

namespace epoch_detail {
extern std::atomic<uint64_t> global_epoch;
extern std::atomic<bool> asymmetric;  // membarrier is registered: readers need no fence
// Tests only: the call Retire's collection makes instead of
// membarrier(cmd) (null: the system call).
extern std::atomic<long (*)(int cmd)> reclaim_membarrier;
ReaderRecord* AcquireRecord();
}  // namespace epoch_detail

// Makes membarrier the reclaimer's fence where the kernel offers it. Called
// before the first object readers can reach is published (the first
// session); harmless to call again.
void EpochInit();

// One read section on the calling thread. Enter() is false when no record
// could be had (no memory): the caller then reads through the kernel.
// REQUIRES: not already inside a section on this thread.
class ReadSection {
 public:
  ReadSection() = default;
  ReadSection(const ReadSection&) = delete;
  ReadSection& operator=(const ReadSection&) = delete;
  ~ReadSection() { Exit(); }

  [[gnu::always_inline]] bool Enter() {
    ReaderRecord* r = tls.record;
    if (r == nullptr) [[unlikely]] {
      r = epoch_detail::AcquireRecord();
      if (r == nullptr) return false;
    }
    r->epoch.store(epoch_detail::global_epoch.load(std::memory_order_acquire),
                   std::memory_order_relaxed);
    if (epoch_detail::asymmetric.load(std::memory_order_relaxed)) [[likely]] {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    record_ = r;
    return true;
  }
  [[gnu::always_inline]] void Exit() {
    if (record_ != nullptr) {
      record_->epoch.store(0, std::memory_order_release);
      record_ = nullptr;
    }
  }

 private:
  ReaderRecord* record_ = nullptr;
};

// Queues `object` to be freed by `free_fn(object)` once no read section
// that may have loaded it is still open. The caller has already unlinked it
// (no new reader can find it). `free_fn` runs on some thread that retires
// later, with no library lock held; it may retire again.
// REQUIRES: the calling thread is not inside a read section.
void Retire(void* object, void (*free_fn)(void*));

// fork(): the library's pthread_atfork handlers call these (client.cpp).
void EpochPrepareFork();
void EpochParentAfterFork();
// Only the calling thread lives on in the child: every other thread's
// record is released (a read it was in when the parent forked did not come
// along).
void EpochChildAfterFork();

}  // namespace nvfs::direct
