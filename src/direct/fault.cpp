#include "direct/fault.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "direct/epoch.hpp"
#include "direct/export.hpp"
#include "direct/libc.hpp"

namespace nvfs::direct {

namespace {

constexpr int kMaxMappings = 64;
FaultMapping mappings[kMaxMappings];

// The poisoned pages of every mapping: written by the handler (lock-free,
// entries claimed with a counter), read by FaultTouchesPoison.
constexpr uint32_t kMaxPoisoned = 256;
struct PoisonedUnit {
  std::atomic<const FaultMapping*> mapping{nullptr};  // null: not written yet
  std::atomic<uint64_t> offset{0};  // of the unit in the mapping
  std::atomic<uint64_t> len{0};     // 4 KiB, or 2 MiB where the mapping could not be split
};
PoisonedUnit poisoned[kMaxPoisoned];
std::atomic<uint32_t> poisoned_claimed{0};

// Protects the handler's installation and the action it chains to (written
// here and by the interposed sigaction; read by the handler without it).
std::mutex mu;
bool installed = false;  // protected by mu; once true, stays so

// The action to chain to: a ring of copies, the current one named by
// chain_current, so the handler never reads a copy being written (unless
// the program changes its SIGBUS action eight times during one signal).
constexpr uint32_t kChainCopies = 8;
struct sigaction chain[kChainCopies];  // protected by mu (writes)
std::atomic<uint32_t> chain_current{0};
// Mirrors `installed` for the lock-free paths. A bool read and written with
// the __atomic builtins (acquire, release), not a std::atomic: the
// interposed sigaction reads it uninstrumented (export.hpp), and GCC will
// not inline std::atomic's instrumented members there.
bool handler_live = false;

void SetChain(const struct sigaction& act) {
  const uint32_t next = (chain_current.load(std::memory_order_relaxed) + 1) % kChainCopies;
  chain[next] = act;
  chain_current.store(next, std::memory_order_release);
}

FaultMapping* MappingOf(uintptr_t addr) {
  for (FaultMapping& m : mappings) {
    const uintptr_t base = m.base.load(std::memory_order_acquire);
    if (base != 0 && addr >= base && addr - base < m.size.load(std::memory_order_relaxed)) return &m;
  }
  return nullptr;
}

// Records the unit, then maps zeros over it. Async-signal-safe: atomics and
// mmap. False if neither a page nor its 2 MiB could be replaced.
bool ReplacePoisoned(FaultMapping& m, uintptr_t addr) {
  const uintptr_t base = m.base.load(std::memory_order_relaxed);
  const uint64_t size = m.size.load(std::memory_order_relaxed);
  for (uintptr_t unit : {uintptr_t{4096}, uintptr_t{2} << 20}) {
    const uintptr_t page = addr & ~(unit - 1);
    if (page < base || page + unit > base + size) continue;
    const uint32_t i = poisoned_claimed.fetch_add(1, std::memory_order_relaxed);
    if (i < kMaxPoisoned) {
      poisoned[i].offset.store(page - base, std::memory_order_relaxed);
      poisoned[i].len.store(unit, std::memory_order_relaxed);
      poisoned[i].mapping.store(&m, std::memory_order_release);
    } else {
      m.overflow.store(true, std::memory_order_release);
    }
    m.poisoned.fetch_add(1, std::memory_order_seq_cst);
    void* p = libc::Mmap(reinterpret_cast<void*>(page), unit, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) return true;
  }
  return false;
}

// Hands a SIGBUS that is not the library's to the program's action.
void Chain(int sig, siginfo_t* info, void* context) {
  const struct sigaction act = chain[chain_current.load(std::memory_order_acquire)];
  const bool from_kernel = info != nullptr && info->si_code > 0;
  if (act.sa_handler == SIG_IGN && !from_kernel) return;  // kill(2)ed, ignored
  if (act.sa_handler == SIG_DFL || act.sa_handler == SIG_IGN) {
    // The default action (the kernel's for an ignored fault too): die of
    // the signal. A fault comes back when the handler returns; a sent
    // signal is raised again (blocked until then).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    libc::real.sigaction(sig, &dfl, nullptr);
    if (!from_kernel) raise(sig);
    return;
  }
  if ((act.sa_flags & SA_RESETHAND) != 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    SetChain(dfl);  // without the lock: a handler cannot take it
  }
  // Run it under the mask it asked for: its sa_mask, and SIGBUS itself
  // unless SA_NODEFER (the library's own action blocks SIGBUS).
  sigset_t mask, old;
  pthread_sigmask(SIG_BLOCK, &act.sa_mask, &old);
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  if ((act.sa_flags & SA_NODEFER) != 0) sigdelset(&mask, sig);
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  if ((act.sa_flags & SA_SIGINFO) != 0) {
    act.sa_sigaction(sig, info, context);
  } else {
    act.sa_handler(sig);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

// Async-signal-safe: atomics, mmap, sigaction, pthread_sigmask, raise.
void OnSigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (tls.in_copy != 0 && info != nullptr && info->si_code > 0) {
    FaultMapping* m = MappingOf(reinterpret_cast<uintptr_t>(info->si_addr));
    if (m != nullptr && ReplacePoisoned(*m, reinterpret_cast<uintptr_t>(info->si_addr))) {
      errno = saved_errno;
      return;
    }
  }
  Chain(sig, info, context);
  errno = saved_errno;
}

// REQUIRES: mu held.
bool InstallLocked() {
  if (installed) return true;
  libc::Resolve();
  struct sigaction ours {};
  ours.sa_sigaction = OnSigbus;
  // SA_ONSTACK: a program that runs its handlers on an alternate stack
  // (a stack overflow is a SIGSEGV, but runtimes set it for every signal)
  // gets the same when the library chains to it.
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  struct sigaction previous {};
  if (libc::real.sigaction(SIGBUS, &ours, &previous) != 0) return false;
  SetChain(previous);
  installed = true;
  __atomic_store_n(&handler_live, true, __ATOMIC_RELEASE);
  return true;
}

}  // namespace

FaultMapping* FaultRegisterMapping(const std::byte* base, uint64_t size) {
  std::lock_guard lock(mu);
  if (!InstallLocked()) return nullptr;
  for (FaultMapping& m : mappings) {
    if (m.base.load(std::memory_order_relaxed) != 0) continue;
    m.size.store(size, std::memory_order_relaxed);
    m.poisoned.store(0, std::memory_order_relaxed);
    m.overflow.store(false, std::memory_order_relaxed);
    m.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return &m;
  }
  return nullptr;
}

void FaultUnregisterMapping(FaultMapping* m) {
  std::lock_guard lock(mu);
  const uint32_t n = std::min(poisoned_claimed.load(std::memory_order_acquire), kMaxPoisoned);
  for (uint32_t i = 0; i < n; ++i) {
    if (poisoned[i].mapping.load(std::memory_order_acquire) == m) {
      // The entry stays claimed (the counter only grows) but names nothing.
      poisoned[i].mapping.store(reinterpret_cast<const FaultMapping*>(uintptr_t{1}),
                                std::memory_order_release);
    }
  }
  m->base.store(0, std::memory_order_release);
}

bool FaultTouchesPoison(const FaultMapping* m, uint64_t offset, uint64_t len) {
  if (m->overflow.load(std::memory_order_acquire)) return true;
  const uint32_t n = std::min(poisoned_claimed.load(std::memory_order_acquire), kMaxPoisoned);
  for (uint32_t i = 0; i < n; ++i) {
    if (poisoned[i].mapping.load(std::memory_order_acquire) != m) continue;
    const uint64_t unit_off = poisoned[i].offset.load(std::memory_order_relaxed);
    const uint64_t unit_len = poisoned[i].len.load(std::memory_order_relaxed);
    if (offset < unit_off + unit_len && unit_off < offset + len) return true;
  }
  return false;
}

void FaultPrepareFork() { mu.lock(); }
void FaultAfterFork() { mu.unlock(); }

}  // namespace nvfs::direct

using nvfs::direct::libc::real;

namespace {

int SigbusAction(const struct sigaction* act, struct sigaction* old) {
  using namespace nvfs::direct;
  std::lock_guard lock(mu);
  if (old != nullptr) *old = chain[chain_current.load(std::memory_order_relaxed)];
  if (act != nullptr) SetChain(*act);
  return 0;
}

}  // namespace

// The program's view of SIGBUS once the library's handler is in place: the
// action it installs is the one the library chains to (fault.hpp).
// Uninstrumented up to SigbusAction (export.hpp): ThreadSanitizer's start-up
// installs its handlers through here.
NVFS_DIRECT_EXPORT NVFS_DIRECT_UNINSTRUMENTED int sigaction(int sig, const struct sigaction* act,
                                                            struct sigaction* old) {
  using namespace nvfs::direct;
  if (sig != SIGBUS || !__atomic_load_n(&handler_live, __ATOMIC_ACQUIRE)) {
    return libc::Get(&libc::Table::sigaction)(sig, act, old);
  }
  return SigbusAction(act, old);
}

namespace {

using SignalFn = sighandler_t (*)(int, sighandler_t);

// signal() and its BSD and System V spellings, through sigaction above for
// SIGBUS (glibc's own call sigaction internally, past the interposition).
sighandler_t SignalAs(std::atomic<SignalFn>& real_fn, const char* name, int sig,
                      sighandler_t handler, int flags) {
  using namespace nvfs::direct;
  if (sig != SIGBUS || !__atomic_load_n(&handler_live, __ATOMIC_ACQUIRE)) {
    SignalFn fn = real_fn.load(std::memory_order_relaxed);
    if (fn == nullptr) {
      fn = reinterpret_cast<SignalFn>(dlsym(RTLD_NEXT, name));
      real_fn.store(fn, std::memory_order_relaxed);
    }
    if (fn == nullptr) {
      errno = ENOSYS;
      return SIG_ERR;
    }
    return fn(sig, handler);
  }
  struct sigaction act {}, old {};
  act.sa_handler = handler;
  act.sa_flags = flags;
  sigemptyset(&act.sa_mask);
  if ((flags & SA_NODEFER) == 0) sigaddset(&act.sa_mask, sig);
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  if ((old.sa_flags & SA_SIGINFO) != 0) {
    return reinterpret_cast<sighandler_t>(reinterpret_cast<void*>(old.sa_sigaction));
  }
  return old.sa_handler;
}

}  // namespace

NVFS_DIRECT_EXPORT sighandler_t signal(int sig, sighandler_t handler) {
  static std::atomic<SignalFn> real_fn{nullptr};
  return SignalAs(real_fn, "signal", sig, handler, SA_RESTART);
}
NVFS_DIRECT_EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler) {
  static std::atomic<SignalFn> real_fn{nullptr};
  return SignalAs(real_fn, "bsd_signal", sig, handler, SA_RESTART);
}
NVFS_DIRECT_EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler) {
  static std::atomic<SignalFn> real_fn{nullptr};
  return SignalAs(real_fn, "sysv_signal", sig, handler, SA_RESETHAND | SA_NODEFER);
}
