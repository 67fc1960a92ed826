// The SIGBUS side of the libpmem2 backend (sigbus.hpp): the table of
// mappings the handler knows, the handler itself, and what it counts.
#include "media/sigbus.hpp"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "nvfs/media.hpp"

namespace nvfs {

namespace media_detail {
constinit thread_local FaultPoint* fault_point = nullptr;
std::atomic<uint64_t> pages_lost{0};
}  // namespace media_detail

namespace {

// The mappings the SIGBUS handler recognises: a fixed table, written under
// mappings_mu (open and close), read by the handler without a lock.
constexpr int kMaxMappings = 64;
// Replaced units remembered per mapping (LostIn); past that many, every
// byte of the mapping counts as lost.
constexpr uint32_t kMaxLostUnits = 64;
struct MappingSlot {
  std::atomic<uintptr_t> base{0};
  std::atomic<uint64_t> size{0};
  std::atomic<uint64_t> lost{0};  // pages replaced by SubstituteLostPage
  // Each replaced unit: its offset in the mapping, | 1 for 4 KiB, | 2 for
  // 2 MiB; 0 while its entry is being written. `units` counts the entries
  // claimed (it may pass kMaxLostUnits).
  std::atomic<uint64_t> lost_at[kMaxLostUnits] = {};
  std::atomic<uint32_t> units{0};
};
MappingSlot mappings[kMaxMappings];
std::mutex mappings_mu;
std::atomic<uint64_t> media_errors{0};
std::atomic<uint64_t> last_error_offset{UINT64_MAX};

// A fault outside every recovery point (metadata: a directory block, an
// inode table page, a bitmap, a pointer block, the journal, met by code that
// holds locks and a transaction and so cannot be jumped out of). The page
// (or, where the mapping cannot be split there, the 2 MiB around it) is
// replaced by private anonymous memory filled with all ones, and the
// faulting instruction runs again on it: a load reads ones, which every
// on-media object rejects (no data block is numbered ~0, no checksum or
// magic matches, an all-ones bitmap word is "in use"), so the operation
// fails as on damage; a store lands in the substitute and is lost. The
// loss is counted on the mapping (Media::LostPages), which stops every
// later commit and makes the namespace not Intact. Async-signal-safe: mmap
// and plain stores. False if the kernel refused (the process then dies).
bool SubstituteLostPage(MappingSlot& m, uintptr_t base, uintptr_t addr) {
  const uint64_t size = m.size.load(std::memory_order_relaxed);
  for (uintptr_t unit : {uintptr_t{4096}, uintptr_t{2} << 20}) {
    const uintptr_t page = addr & ~(unit - 1);
    if (page < base || page + unit > base + size) continue;
    // Told before the page changes (MediaLost): a read that copies the
    // substitute and then asks sees it. An attempt the kernel refuses
    // leaves its entry, which only makes LostIn cautious.
    const uint32_t entry = m.units.fetch_add(1, std::memory_order_relaxed);
    if (entry < kMaxLostUnits) {
      m.lost_at[entry].store((page - base) | (unit == 4096 ? 1 : 2), std::memory_order_relaxed);
    }
    media_detail::pages_lost.fetch_add(unit / 4096, std::memory_order_seq_cst);
    void* p = mmap(reinterpret_cast<void*>(page), unit, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) continue;
    auto* words = static_cast<uint64_t*>(p);
    for (size_t i = 0; i < unit / sizeof(uint64_t); ++i) {
      __atomic_store_n(&words[i], ~uint64_t{0}, __ATOMIC_RELAXED);
    }
    m.lost.fetch_add(unit / 4096, std::memory_order_release);
    return true;
  }
  return false;
}

// Async-signal-safe: atomics, siglongjmp, mmap, sigaction.
void OnSigbus(int sig, siginfo_t* info, void*) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  FaultPoint* point = media_detail::fault_point;
  for (MappingSlot& m : mappings) {
    const uintptr_t base = m.base.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr - base >= m.size.load(std::memory_order_relaxed)) continue;
    media_errors.fetch_add(1, std::memory_order_relaxed);
    last_error_offset.store(addr - base, std::memory_order_relaxed);
    if (point == nullptr) {
      if (SubstituteLostPage(m, base, addr)) return;
      break;
    }
    media_detail::fault_point = point->prev;
    siglongjmp(point->env, 1);
  }
  // Not ours, or a page that could not be replaced: die of it as before.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
}

}  // namespace

namespace media_detail {

bool LostIn(const std::byte* addr, size_t len) {
  const auto at = reinterpret_cast<uintptr_t>(addr);
  for (const MappingSlot& m : mappings) {
    const uintptr_t base = m.base.load(std::memory_order_acquire);
    if (base == 0 || at < base || at - base >= m.size.load(std::memory_order_relaxed)) continue;
    const uint32_t units = m.units.load(std::memory_order_acquire);
    if (units > kMaxLostUnits) return true;
    const uint64_t first = at - base;
    const uint64_t end = first + len;
    for (uint32_t i = 0; i < units; ++i) {
      const uint64_t entry = m.lost_at[i].load(std::memory_order_acquire);
      if (entry == 0) return true;  // being written: cautious
      const uint64_t unit = (entry & 2) ? uint64_t{2} << 20 : 4096;
      const uint64_t start = entry & ~uint64_t{3};
      if (first < start + unit && start < end) return true;
    }
    return false;
  }
  return false;
}

}  // namespace media_detail

// The pages lost in the mapping at `base`.
uint64_t LostPagesOf(const std::byte* base) {
  for (const MappingSlot& m : mappings) {
    if (m.base.load(std::memory_order_acquire) == reinterpret_cast<uintptr_t>(base)) {
      return m.lost.load(std::memory_order_acquire);
    }
  }
  return 0;
}

void RegisterMapping(const std::byte* base, uint64_t size) {
  std::lock_guard lock(mappings_mu);
  static bool installed = false;
  if (!installed) {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, nullptr);
    installed = true;
  }
  for (MappingSlot& m : mappings) {
    if (m.base.load(std::memory_order_relaxed) != 0) continue;
    m.size.store(size, std::memory_order_relaxed);
    m.lost.store(0, std::memory_order_relaxed);
    m.units.store(0, std::memory_order_relaxed);
    for (std::atomic<uint64_t>& entry : m.lost_at) entry.store(0, std::memory_order_relaxed);
    m.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return;
  }
}

// The mapping at `base` grew (Media::Grow): faults in its new part are ours.
void ResizeMapping(const std::byte* base, uint64_t size) {
  std::lock_guard lock(mappings_mu);
  for (MappingSlot& m : mappings) {
    if (m.base.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(base)) {
      m.size.store(size, std::memory_order_release);
    }
  }
}

void UnregisterMapping(const std::byte* base) {
  std::lock_guard lock(mappings_mu);
  for (MappingSlot& m : mappings) {
    if (m.base.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(base)) {
      m.base.store(0, std::memory_order_release);
    }
  }
}

uint64_t MediaErrorCount() { return media_errors.load(std::memory_order_relaxed); }
uint64_t LastMediaErrorOffset() { return last_error_offset.load(std::memory_order_relaxed); }

}  // namespace nvfs
