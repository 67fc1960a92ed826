#include "direct/epoch.hpp"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <new>

namespace nvfs::direct {

constinit thread_local ThreadState tls __attribute__((tls_model("initial-exec"))) = {nullptr, 0, 0};

namespace epoch_detail {
// Starts at 1: a record's 0 means "not in a section".
std::atomic<uint64_t> global_epoch{1};
std::atomic<bool> asymmetric{false};
std::atomic<long (*)(int cmd)> reclaim_membarrier{nullptr};
}  // namespace epoch_detail

namespace {

using epoch_detail::asymmetric;
using epoch_detail::global_epoch;

constexpr size_t kCollectAt = 8;    // retired objects before a collection
constexpr size_t kMaxGarbage = 64;  // ... before a retirer waits for readers
constexpr int kMaxYields = 100000;  // ... before it gives up and leaks (see Retire)

std::atomic<uint64_t> leaked{0};  // objects never freed: a reader's section never closed

// Every record ever made, newest first; records are reused, never freed.
std::atomic<ReaderRecord*> records{nullptr};

pthread_key_t record_key;
pthread_once_t record_key_once = PTHREAD_ONCE_INIT;

struct Retired {
  void* object;
  void (*free_fn)(void*);
  uint64_t epoch;  // the epoch Retire() moved to
};

// A fixed queue, so that retiring never allocates.
struct RetiredQueue {
  Retired items[kMaxGarbage];
  size_t count = 0;  // epochs ascending
};

std::mutex retired_mu;
RetiredQueue retired;  // protected by retired_mu

long Membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

// A thread that ends gives its record back (a pthread key destructor: runs
// at pthread_exit and return from the thread function, not at exit()).
void ReleaseRecord(void* p) {
  auto* r = static_cast<ReaderRecord*>(p);
  r->epoch.store(0, std::memory_order_release);
  r->in_use.store(false, std::memory_order_release);
  if (tls.record == r) tls.record = nullptr;
}

void MakeKey() { pthread_key_create(&record_key, ReleaseRecord); }

// Makes every reader's mark that precedes its load of a replaced pointer
// visible to the scan that follows; false when it could not, and then
// nothing may be freed on the strength of the scan. Readers that fence
// (no membarrier registered) need only this thread's fence. Readers that
// rely on membarrier have only a compiler barrier: if the call fails
// (it should not once registered, but a seccomp filter or a kernel may
// refuse it), no fence here makes up for theirs, and the scan is not
// trusted.
bool Barrier() {
  if (asymmetric.load(std::memory_order_relaxed)) {
    long (*call)(int) = epoch_detail::reclaim_membarrier.load(std::memory_order_relaxed);
    const long r = call != nullptr ? call(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
                                   : Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    return r == 0;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return true;
}

// The oldest epoch a reader is in, or UINT64_MAX when none is.
uint64_t OldestActive() {
  uint64_t oldest = UINT64_MAX;
  for (ReaderRecord* r = records.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    const uint64_t e = r->epoch.load(std::memory_order_acquire);
    if (e != 0) oldest = std::min(oldest, e);
  }
  return oldest;
}

// Moves the prefix of `retired` that no reader can hold to `out`. False,
// moving nothing, when the barrier is not to be trusted (Barrier): the
// objects wait for a later collection whose barrier is.
// REQUIRES: retired_mu held.
bool TakeReclaimable(RetiredQueue& out) {
  if (!Barrier()) return false;
  const uint64_t oldest = OldestActive();
  size_t n = 0;
  while (n < retired.count && retired.items[n].epoch <= oldest) ++n;
  for (size_t i = 0; i < n; ++i) out.items[out.count++] = retired.items[i];
  std::copy(retired.items + n, retired.items + retired.count, retired.items);
  retired.count -= n;
  return true;
}

}  // namespace

namespace epoch_detail {

ReaderRecord* AcquireRecord() {
  pthread_once(&record_key_once, MakeKey);
  ReaderRecord* r = nullptr;
  for (ReaderRecord* c = records.load(std::memory_order_acquire); c != nullptr; c = c->next) {
    bool expected = false;
    if (!c->in_use.load(std::memory_order_relaxed) &&
        c->in_use.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      r = c;
      break;
    }
  }
  if (r == nullptr) {
    r = new (std::nothrow) ReaderRecord;
    if (r == nullptr) return nullptr;
    r->in_use.store(true, std::memory_order_relaxed);
    ReaderRecord* head = records.load(std::memory_order_relaxed);
    do {
      r->next = head;
    } while (!records.compare_exchange_weak(head, r, std::memory_order_release,
                                            std::memory_order_relaxed));
  }
  if (pthread_setspecific(record_key, r) != 0) {
    r->in_use.store(false, std::memory_order_release);
    return nullptr;
  }
  tls.record = r;
  return r;
}

}  // namespace epoch_detail

void EpochInit() {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] {
    // Test-only: the readers' fence instead (tests/unit/direct/meson.build runs the
    // race test both ways).
    if (secure_getenv("NVFS_DIRECT_NO_MEMBARRIER") != nullptr) return;
    const long supported = Membarrier(MEMBARRIER_CMD_QUERY);
    if (supported > 0 && (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
        Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0) {
      asymmetric.store(true, std::memory_order_seq_cst);
    }
  });
}

void Retire(void* object, void (*free_fn)(void*)) {
  RetiredQueue ready;
  {
    std::lock_guard lock(retired_mu);
    // Readers finish their section without waiting for anything, so the
    // wait ends; a thread is never here inside its own section. Unless a
    // signal handler jumped out of a read (siglongjmp) and left its
    // thread's section open for good: then nothing retired after it can
    // ever be freed, and the object is leaked rather than waited for. The
    // same, at once, when the barrier fails: waiting would not make it
    // trusted, and freeing without it might free under a reader.
    bool room = true;
    for (int yields = 0; retired.count == kMaxGarbage; ++yields) {
      const bool trusted = TakeReclaimable(ready);
      if (retired.count < kMaxGarbage) break;
      if (!trusted || yields == kMaxYields) {
        leaked.fetch_add(1, std::memory_order_relaxed);
        room = false;
        break;
      }
      sched_yield();
    }
    if (room) {
      // The replacement was published before: a reader that sees the new
      // epoch sees it too (it loads the epoch with acquire).
      const uint64_t e = global_epoch.fetch_add(1, std::memory_order_seq_cst) + 1;
      retired.items[retired.count++] = {object, free_fn, e};
      if (ready.count == 0 && retired.count >= kCollectAt) TakeReclaimable(ready);
    }
  }
  for (size_t i = 0; i < ready.count; ++i) ready.items[i].free_fn(ready.items[i].object);
}

void EpochPrepareFork() { retired_mu.lock(); }

void EpochParentAfterFork() { retired_mu.unlock(); }

void EpochChildAfterFork() {
  retired_mu.unlock();
  for (ReaderRecord* r = records.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    if (r == tls.record) continue;
    r->epoch.store(0, std::memory_order_relaxed);
    r->in_use.store(false, std::memory_order_relaxed);
  }
  // The registration is the process's: a child registers its own (a
  // second registration is harmless).
  if (asymmetric.load(std::memory_order_relaxed) &&
      Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) {
    asymmetric.store(false, std::memory_order_relaxed);
  }
}

}  // namespace nvfs::direct
