// The corrupted-image suite (meson suite "fuzz", built with AddressSanitizer
// and UndefinedBehaviorSanitizer by tools/check.sh): every seed image, then
// thousands of seeded mutations of each, through fuzz_target.hpp's RunCase.
// Deterministic: case N of a seed always applies the same mutation.
//
// Environment:
//   NVFS_FUZZ_CASES=N   mutations per seed (default: per seed, at most about
//                       20 s of cases each under the sanitizers; 13,200 in all)
//   NVFS_FUZZ_SCALE=K   K times the default mutations per seed (long runs)
//   NVFS_FUZZ_SEED=S    master seed (default 20261130)
//   NVFS_FUZZ_ONLY=seed:case   run that one case and print what it did
//   NVFS_FUZZ_CONTAINMENT=MODE  what a containment failure (containment.hpp)
//                       does: "strict" fails the suite; "local" fails it only
//                       for mutations that changed no global metadata
//                       (superblock, group descriptors, bitmaps, journal);
//                       "report" prints every one loudly and passes; "off"
//                       skips the check. Default: kContainmentDefault
//                       (containment.hpp).
//
// A crash, a sanitizer report or a case running past the watchdog prints the
// case ("fuzz case populated:123: ...") so NVFS_FUZZ_ONLY replays it alone.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "arena_media.hpp"
#include "containment.hpp"
#include "fuzz_target.hpp"
#include "mutator.hpp"
#include "seeds.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define NVFS_FUZZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/common_interface_defs.h>
#define NVFS_FUZZ_ASAN 1
#endif
#endif

namespace nvfs::fuzz {
namespace {

constexpr unsigned kCaseSeconds = 30;  // a case takes milliseconds; this is a hang

// Findings printed per class and seed (all are counted).
constexpr uint64_t kContainmentPrinted = 3;

char g_case[512] = "(none)";

void SayCase() {
  const char prefix[] = "\nfuzz case ";
  (void)!write(STDERR_FILENO, prefix, sizeof prefix - 1);
  (void)!write(STDERR_FILENO, g_case, strnlen(g_case, sizeof g_case));
  (void)!write(STDERR_FILENO, "\n", 1);
}

void OnFatalSignal(int sig) {
  if (sig == SIGALRM) {
    const char msg[] = "\nfuzz: watchdog: a case ran too long (a hang)";
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
  }
  SayCase();
  signal(sig == SIGALRM ? SIGABRT : sig, SIG_DFL);
  raise(sig == SIGALRM ? SIGABRT : sig);
}

void InstallWatchdog() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  signal(SIGALRM, OnFatalSignal);
#ifdef NVFS_FUZZ_ASAN
  __sanitizer_set_death_callback(SayCase);
#else
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) signal(sig, OnFatalSignal);
#endif
}

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t NameSeed(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// A class of containment failure: "local" or the global metadata changed,
// where the first finding was made ("read-write mount"), and what it was
// ("bytes changed", "unreadable", "fsck -n not clean").
std::string ContainmentClass(const CaseResult& r) {
  const std::string& first = r.containment.front();
  const size_t colon = first.find(": ");
  const std::string where = first.substr(0, colon);
  const std::string what = first.substr(colon + 2);
  const char* kind = "unreadable";
  if (what.find("fsck -n then exits") != std::string::npos) {
    kind = "fsck -y leaves it unclean";
  } else if (what.find("no longer mounts") != std::string::npos) {
    kind = "no longer mounts";
  } else if (what.find("): byte ") != std::string::npos || what.find("): size ") != std::string::npos ||
             what.find("): type ") != std::string::npos ||
             what.find("): symlink target") != std::string::npos) {
    kind = "bytes changed";
  }
  const std::string scope = r.touch.global != 0 ? "global " + GlobalNames(r.touch.global) : "local";
  return scope + " / " + where + " / " + kind;
}

struct Tally {
  uint64_t cases = 0, mounted = 0, mounted_ro = 0, repaired = 0, entries = 0, changes = 0;
  std::map<int, uint64_t> fsck_exits;
  std::map<std::string, uint64_t> mount_errors;  // first words of why mounts failed
  uint64_t contained = 0;                 // cases whose untouched files all held
  uint64_t hidden = 0;                    // cases with files hidden by global damage
  std::map<std::string, uint64_t> leaks;  // containment failures: cases by class
};

// Runs the seed unmutated, then mutations of it.
void FuzzSeed(const std::string& name, uint64_t default_cases) {
  InstallWatchdog();
  const uint64_t cases =
      EnvU64("NVFS_FUZZ_CASES", default_cases * EnvU64("NVFS_FUZZ_SCALE", 1));
  const uint64_t master = EnvU64("NVFS_FUZZ_SEED", 20261130);
  const char* only = std::getenv("NVFS_FUZZ_ONLY");
  int64_t only_case = -1;
  if (only && *only) {
    const std::string o = only;
    const size_t colon = o.find(':');
    if (o.substr(0, colon) != name) return;
    only_case = colon == std::string::npos ? 0 : std::stoll(o.substr(colon + 1));
  }

  const auto start = std::chrono::steady_clock::now();
  const Seed seed = BuildSeed(name);
  REQUIRE_FALSE(seed.image.empty());
  Arena arena(seed.image.size());
  arena.Load(seed.image);
  const Catalog catalog(arena);
  const ContainmentMode containment = ContainmentModeFromEnv();
  const Census census(arena);
  CaseOptions options;
  options.verbose = only_case >= 0;
  if (containment != ContainmentMode::kOff) options.census = &census;

  std::vector<std::string> failures;
  std::snprintf(g_case, sizeof g_case, "%s:unmutated", name.c_str());
  alarm(kCaseSeconds);
  const CaseResult pristine = RunCase(arena, options);
  alarm(0);
  arena.Restore();
  INFO("seed " << name);
  CHECK(pristine.violations.empty());
  for (const std::string& v : pristine.violations) FAIL_CHECK(v);
  CHECK(pristine.fsck_exit == 0);
  CHECK(pristine.mounted_rw);
  CHECK(pristine.io_errors == 0);
  CHECK(pristine.containment.empty());  // the check itself is sound: always strict here
  for (const std::string& c : pristine.containment) FAIL_CHECK(c);

  Tally tally;
  const uint64_t first = only_case >= 0 ? static_cast<uint64_t>(only_case) : 0;
  const uint64_t end = only_case >= 0 ? first + 1 : cases;
  for (uint64_t n = first; n < end; ++n) {
    std::mt19937_64 rng(Mix(master ^ NameSeed(name) ^ Mix(n + 1)));
    const std::string what = catalog.Mutate(arena, rng);
    std::snprintf(g_case, sizeof g_case, "%s:%" PRIu64 ": %s", name.c_str(), n, what.c_str());
    alarm(kCaseSeconds);
    const CaseResult r = RunCase(arena, options);
    alarm(0);
    arena.Restore();
    ++tally.cases;
    tally.mounted += r.mounted_rw;
    tally.mounted_ro += r.mounted_ro;
    tally.repaired += r.repair_exit == 1;
    tally.entries += r.entries;
    tally.changes += r.changes;
    ++tally.fsck_exits[r.fsck_exit];
    if (!r.mounted_rw) {
      const std::string why = r.mount_error.substr(r.mount_error.find(": ") + 2, 40);
      ++tally.mount_errors[why];
    }
    if (only_case >= 0) {
      std::printf("%s\n  fsck -n exit %d; mount ro %d rw %d (%s); fsck -y exit %d, then %d; "
                  "%" PRIu64 " entries, %" PRIu64 " I/O errors\n",
                  g_case, r.fsck_exit, r.mounted_ro, r.mounted_rw, r.mount_error.c_str(),
                  r.repair_exit, r.after_repair_exit, r.entries, r.io_errors);
    }
    for (const std::string& v : r.violations) {
      failures.push_back(std::string(g_case) + "\n    " + v);
      if (only_case >= 0) std::printf("  VIOLATION: %s\n", v.c_str());
    }
    if (only_case >= 0 && options.census != nullptr) {
      std::printf("  containment: %s; changed on purpose: inode %" PRIu64 "\n",
                  r.touch.Describe().c_str(), r.changed_on_purpose);
      for (const std::string& c : r.containment) std::printf("  CONTAINMENT: %s\n", c.c_str());
      for (const std::string& h : r.hidden) std::printf("  hidden: %s\n", h.c_str());
    }
    if (options.census == nullptr) continue;
    tally.hidden += !r.hidden.empty();
    if (r.containment.empty()) {
      ++tally.contained;
      continue;
    }
    const std::string cls = ContainmentClass(r);
    if (++tally.leaks[cls] <= kContainmentPrinted && only_case < 0) {
      std::printf("CONTAINMENT FAILURE [%s] fuzz case %s\n  %s\n", cls.c_str(), g_case,
                  r.touch.Describe().c_str());
      for (size_t i = 0; i < r.containment.size() && i < 4; ++i) {
        std::printf("  %s\n", r.containment[i].c_str());
      }
      if (r.containment.size() > 4) std::printf("  ... %zu in all\n", r.containment.size());
    }
    const bool fails = containment == ContainmentMode::kStrict ||
                       (containment == ContainmentMode::kLocal && r.touch.global == 0);
    if (fails) {
      failures.push_back(std::string(g_case) + "\n    containment: " + r.containment.front() +
                         " (" + r.touch.Describe() + ")");
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz seed %-10s %5" PRIu64 " mutations in %6.1f s: %" PRIu64
              " mounted (%" PRIu64 " read-only), %" PRIu64 " repaired by fsck -y, %" PRIu64
              " entries walked, %" PRIu64 " changes made read-write; fsck -n exits:",
              name.c_str(), tally.cases, seconds, tally.mounted, tally.mounted_ro,
              tally.repaired, tally.entries, tally.changes);
  for (const auto& [code, count] : tally.fsck_exits) std::printf(" %d:%" PRIu64, code, count);
  std::printf("; %zu violations\n", failures.size());
  if (options.census != nullptr) {
    uint64_t leaked = 0;
    for (const auto& [cls, count] : tally.leaks) leaked += count;
    std::printf("fuzz seed %-10s containment (%s; %zu files in the census, %zu inodes in flight): %" PRIu64
                " cases held, %" PRIu64 " let damage spread; %" PRIu64
                " hid an intact file until fsck (global damage, allowed)\n",
                name.c_str(), ModeName(containment), census.files(), census.in_flight(),
                tally.contained, leaked,
                tally.hidden);
    for (const auto& [cls, count] : tally.leaks) {
      std::printf("  %6" PRIu64 "  %s\n", count, cls.c_str());
    }
  }
  std::fflush(stdout);
  std::snprintf(g_case, sizeof g_case, "(none)");
  for (size_t i = 0; i < failures.size() && i < 25; ++i) FAIL_CHECK(failures[i]);
  CHECK(failures.empty());
}

TEST_CASE("corrupted images: fresh namespace", "[fuzz][fresh]") { FuzzSeed("fresh", 4000); }
TEST_CASE("corrupted images: populated namespace", "[fuzz][populated]") {
  FuzzSeed("populated", 2000);
}
TEST_CASE("corrupted images: orphans awaiting the next mount", "[fuzz][orphans]") {
  FuzzSeed("orphans", 2000);
}
TEST_CASE("corrupted images: journal needing recovery", "[fuzz][recovery]") {
  FuzzSeed("recovery", 2000);
}
TEST_CASE("corrupted images: full namespace", "[fuzz][full]") { FuzzSeed("full", 1600); }
TEST_CASE("corrupted images: 64 KiB blocks", "[fuzz][big-blocks]") { FuzzSeed("big-blocks", 600); }
TEST_CASE("corrupted images: a collision chain of overflow leaves", "[fuzz][collisions]") {
  FuzzSeed("collisions", 1500);
}
TEST_CASE("corrupted images: two groups, fsck on threads", "[fuzz][two-groups]") {
  FuzzSeed("two-groups", 1000);
}

}  // namespace
}  // namespace nvfs::fuzz
