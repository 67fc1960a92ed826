// mapbench: what a shared mapping of a file costs, one mode at a time, for
// tools/bench_maps.py (tools/bench.sh --maps), which runs it on every target
// side by side, under LD_PRELOAD=libnvfs-direct.so on the direct one.
//
//   nvfs-mapbench MODE FILE [--write] [--persist none|msync|clflush]
//                 [--iterations N] [--seconds S] [--seed N] [--batch K]
//
// MODE: first-touch  per iteration: mmap a 2 MiB window of FILE at a random
//                    2 MiB-aligned offset (MAP_SHARED; PROT_READ, or
//                    PROT_READ|PROT_WRITE with --write), load (--write:
//                    store) 8 bytes at a random 4 KiB page inside it,
//                    munmap; ns per iteration, the mmap call included
//       warm-read    FILE mapped whole once and every page touched first;
//                    then random 4 KiB memcpy out of the mapping
//       warm-write   as warm-read, memcpy into the mapping, each 4 KiB then
//                    persisted as --persist says: none; msync (MS_SYNC of
//                    the page); clflush (clwb, else clflushopt, else
//                    clflush, over its lines, then sfence: what a pmem
//                    program does to its own mapping of the namespace)
//       pmem2        FILE (O_RDWR) mapped by libpmem2 (pmem2_map_new, store
//                    granularity PAGE required at least, so non-DAX files
//                    map too), every page written first; then random 4 KiB
//                    memcpy + pmem2_get_persist_fn()(addr, 4096): what an
//                    unmodified libpmem2 program gets
// FILE exists already, at least 2 MiB (first-touch) and a multiple of 4 KiB.
// Each iteration is timed on its own (clock_gettime(CLOCK_MONOTONIC)); the
// run stops after N iterations or S seconds, whichever comes first. Offsets
// come from a fixed seed, so every target sees the same sequence. With
// --batch K (warm and pmem2 modes) a sample is K iterations in a row, their
// offsets drawn before the clock starts, and counts as its mean: where the
// clock moves in steps near an iteration's cost (10-20 ns steps on the VM
// this was written on, against 50 ns for a 4 KiB copy in cache), one
// iteration's time is mostly the step.
//
// Prints one JSON line: mode, iterations, seconds, median_ns, p10_ns,
// p90_ns (over samples, per iteration), mean_ns (the run's time over its
// iterations, the clock's reads included), batch, clock_step_ns (the
// smallest step seen between two reads of the clock), persist, granularity
// (pmem2, else ""), and backing: which file the
// mapping's pages come from, read from /proc/self/maps — "kernel" when it is
// FILE itself, "direct (backed by PATH)" when another file (the namespace's
// image, as libnvfs-direct's direct maps do), "anonymous", or "mixed (...)"
// when the range spans several; backing_path names the other file.
//
// Built by meson (_FILE_OFFSET_BITS=64), this program's own maps call
// mmap64; libpmem2's call mmap (MAP_SHARED_VALIDATE | MAP_SYNC first, then
// MAP_SHARED, both MAP_FIXED over a reservation): a preload that serves
// maps sees both.
#include <fcntl.h>
#include <libpmem2.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kWindow = uint64_t{2} << 20;
constexpr uint64_t kLine = 64;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "nvfs-mapbench: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

[[noreturn]] void DiePmem2(const std::string& what) {
  std::fprintf(stderr, "nvfs-mapbench: %s: %s\n", what.c_str(), pmem2_errormsg());
  std::exit(1);
}

struct Options {
  std::string mode;
  std::string path;
  bool write = false;
  std::string persist = "none";
  uint64_t iterations = 10'000'000;
  double seconds = 1.0;
  uint64_t seed = 1;
  uint64_t batch = 1;
};

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// --- where a mapping's pages come from -------------------------------------

// The file behind one line of /proc/self/maps.
struct MapsLine {
  uint64_t start = 0, end = 0;
  unsigned dev_major = 0, dev_minor = 0;
  uint64_t ino = 0;
  std::string path;
};

std::vector<MapsLine> ReadMaps() {
  std::vector<MapsLine> lines;
  std::ifstream maps("/proc/self/maps");
  std::string text;
  while (std::getline(maps, text)) {
    // start-end perms offset major:minor inode [path]
    MapsLine l;
    std::istringstream in(text);
    std::string range, perms, offset, dev;
    in >> range >> perms >> offset >> dev >> l.ino;
    const size_t dash = range.find('-');
    const size_t colon = dev.find(':');
    if (dash == std::string::npos || colon == std::string::npos) continue;
    l.start = std::strtoull(range.substr(0, dash).c_str(), nullptr, 16);
    l.end = std::strtoull(range.substr(dash + 1).c_str(), nullptr, 16);
    l.dev_major = static_cast<unsigned>(std::strtoul(dev.substr(0, colon).c_str(), nullptr, 16));
    l.dev_minor = static_cast<unsigned>(std::strtoul(dev.substr(colon + 1).c_str(), nullptr, 16));
    std::getline(in >> std::ws, l.path);
    lines.push_back(l);
  }
  return lines;
}

struct Backing {
  std::string text;  // "kernel", "direct (backed by PATH)", "anonymous", "mixed (...)"
  std::string path;  // the other file, for a direct backing
};

// What backs [addr, addr + len): FILE itself (the same device and inode, or
// the same path) is the kernel's mapping of it; any other file is a direct one.
Backing BackingOf(const void* addr, uint64_t len, const std::string& file) {
  struct stat st {};
  if (stat(file.c_str(), &st) != 0) Die("stat " + file);
  char* real = realpath(file.c_str(), nullptr);
  const std::string real_path = real != nullptr ? real : file;
  std::free(real);
  const uint64_t lo = reinterpret_cast<uint64_t>(addr), hi = lo + len;
  std::set<std::string> kinds;
  std::string other;
  for (const MapsLine& l : ReadMaps()) {
    if (l.end <= lo || l.start >= hi) continue;
    const bool same_inode = l.ino == st.st_ino && l.dev_major == major(st.st_dev) &&
                            l.dev_minor == minor(st.st_dev);
    if (same_inode || l.path == real_path) {
      kinds.insert("kernel");
    } else if (l.path.empty() || l.ino == 0) {
      kinds.insert("anonymous");
    } else {
      kinds.insert("direct (backed by " + l.path + ")");
      other = l.path;
    }
  }
  if (kinds.empty()) return {"unmapped", ""};
  if (kinds.size() == 1) return {*kinds.begin(), other};
  std::string all;
  for (const std::string& k : kinds) all += (all.empty() ? "" : ", ") + k;
  return {"mixed (" + all + ")", other};
}

// --- persisting a store ----------------------------------------------------

#if defined(__x86_64__)
__attribute__((target("clwb"))) void FlushClwb(const char* p, uint64_t len) {
  for (uint64_t at = 0; at < len; at += kLine) _mm_clwb(const_cast<char*>(p + at));
  _mm_sfence();
}
__attribute__((target("clflushopt"))) void FlushClflushopt(const char* p, uint64_t len) {
  for (uint64_t at = 0; at < len; at += kLine) _mm_clflushopt(const_cast<char*>(p + at));
  _mm_sfence();
}
void FlushClflush(const char* p, uint64_t len) {
  // clflush is ordered by itself; the fence keeps the shape of the others.
  for (uint64_t at = 0; at < len; at += kLine) _mm_clflush(p + at);
  _mm_sfence();
}
#endif

// The best cache flush this CPU has, as /proc/cpuinfo's flags say ("" if none).
std::string CpuFlush() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream in(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string f; in >> f;) flags.insert(f);
    for (const char* f : {"clwb", "clflushopt", "clflush"}) {
      if (flags.count(f) != 0) return f;
    }
    return "";
  }
  return "";
}

// Persists the 4 KiB at `p` (page-aligned) as --persist says; the name of
// what it does is `name`.
class Persister {
 public:
  explicit Persister(const std::string& how) {
    if (how == "none" || how == "msync") {
      name_ = how;
      return;
    }
    if (how != "clflush") {
      std::fprintf(stderr, "nvfs-mapbench: --persist none|msync|clflush, not %s\n", how.c_str());
      std::exit(2);
    }
#if defined(__x86_64__)
    name_ = CpuFlush();
    if (name_.empty()) {
      std::fprintf(stderr, "nvfs-mapbench: this CPU has no clflush\n");
      std::exit(1);
    }
#else
    std::fprintf(stderr, "nvfs-mapbench: --persist clflush is x86-64 only\n");
    std::exit(1);
#endif
  }
  const std::string& name() const { return name_; }

  void Persist(char* p) const {
    if (name_ == "none") return;
    if (name_ == "msync") {
      if (msync(p, kPage, MS_SYNC) != 0) Die("msync");
      return;
    }
#if defined(__x86_64__)
    if (name_ == "clwb") {
      FlushClwb(p, kPage);
    } else if (name_ == "clflushopt") {
      FlushClflushopt(p, kPage);
    } else {
      FlushClflush(p, kPage);
    }
#endif
  }

 private:
  std::string name_;
};

// --- the timed loops -------------------------------------------------------

// The smallest nonzero step between two reads of the clock, in ns.
uint64_t ClockStep() {
  uint64_t step = UINT64_MAX;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t a = NowNs(), b = NowNs();
    if (b > a) step = std::min(step, b - a);
  }
  return step == UINT64_MAX ? 0 : step;
}

// Per-iteration times (a sample per iteration, or per batch of them), and
// when to stop.
class Samples {
 public:
  explicit Samples(const Options& o) : limit_(o.iterations), seconds_(o.seconds) {
    ns_.reserve(std::min<uint64_t>(o.iterations, 1u << 24));
  }
  // Starts the run's clock.
  void Start() { start_ = last_ = NowNs(); }
  // Records `n` iterations that began at `began`; false once the run is over.
  bool Add(uint64_t began, uint64_t n = 1) {
    last_ = NowNs();
    ns_.push_back(static_cast<double>(last_ - began) / static_cast<double>(n));
    iterations_ += n;
    return iterations_ < limit_ && static_cast<double>(last_ - start_) < seconds_ * 1e9;
  }
  uint64_t iterations() const { return iterations_; }
  double seconds() const { return static_cast<double>(last_ - start_) / 1e9; }
  // The `q`-quantile of the samples, 0 <= q <= 1 (reorders them).
  double Quantile(double q) {
    if (ns_.empty()) return 0;
    const auto at = static_cast<size_t>(q * static_cast<double>(ns_.size()));
    const size_t k = std::min(ns_.size() - 1, at);
    std::nth_element(ns_.begin(), ns_.begin() + static_cast<ptrdiff_t>(k), ns_.end());
    return ns_[k];
  }

 private:
  std::vector<double> ns_;
  uint64_t iterations_ = 0;
  uint64_t limit_;
  double seconds_;
  uint64_t start_ = 0, last_ = 0;
};

// Keeps the compiler from dropping a load or a copy whose result is unused.
inline void KeepMemory(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

struct Report {
  Backing backing;
  std::string persist = "none";
  std::string granularity;
};

int OpenFile(const Options& o, uint64_t* size) {
  const int fd = open(o.path.c_str(), O_RDWR);
  if (fd < 0) Die("open " + o.path);
  struct stat st {};
  if (fstat(fd, &st) != 0) Die("fstat " + o.path);
  *size = static_cast<uint64_t>(st.st_size) / kPage * kPage;
  if (*size < kPage) {
    std::fprintf(stderr, "nvfs-mapbench: %s: smaller than a page\n", o.path.c_str());
    std::exit(1);
  }
  return fd;
}

Report FirstTouch(const Options& o, Samples& s) {
  uint64_t size = 0;
  const int fd = OpenFile(o, &size);
  const uint64_t windows = size / kWindow;
  if (windows == 0) {
    std::fprintf(stderr, "nvfs-mapbench: %s: smaller than 2 MiB\n", o.path.c_str());
    std::exit(1);
  }
  const int prot = PROT_READ | (o.write ? PROT_WRITE : 0);
  std::mt19937_64 rng(o.seed);
  Report r;
  uint64_t sink = 0;
  // One iteration: map, touch, unmap; `check` reads the backing before the unmap.
  auto iteration = [&](bool check) {
    const uint64_t window = rng() % windows;
    const uint64_t page = rng() % (kWindow / kPage);
    void* p = mmap(nullptr, kWindow, prot, MAP_SHARED, fd, static_cast<off_t>(window * kWindow));
    if (p == MAP_FAILED) Die("mmap");
    auto* word = reinterpret_cast<volatile uint64_t*>(static_cast<char*>(p) + page * kPage);
    if (o.write) {
      *word = sink + 1;
    } else {
      sink += *word;
    }
    if (check) r.backing = BackingOf(p, kWindow, o.path);
    if (munmap(p, kWindow) != 0) Die("munmap");
  };
  iteration(true);  // outside the clock: the backing, and a session proven
  s.Start();
  for (bool more = true; more;) {
    const uint64_t began = NowNs();
    iteration(false);
    more = s.Add(began);
  }
  KeepMemory(&sink);
  close(fd);
  return r;
}

// Random 4 KiB copies out of or into `map` (`size` bytes), each store then
// persisted by `persist` (a function of the page's address).
template <typename PersistFn>
void CopyLoop(const Options& o, Samples& s, char* map, uint64_t size, bool write,
              PersistFn persist) {
  const uint64_t pages = size / kPage;
  alignas(64) static char buf[kPage];
  std::memset(buf, 'm', sizeof buf);
  std::mt19937_64 rng(o.seed);
  std::vector<char*> at(o.batch);
  s.Start();
  for (bool more = true; more;) {
    for (char*& p : at) p = map + (rng() % pages) * kPage;
    const uint64_t began = NowNs();
    for (char* p : at) {
      if (write) {
        std::memcpy(p, buf, kPage);
        persist(p);
      } else {
        std::memcpy(buf, p, kPage);
        KeepMemory(buf);
      }
    }
    more = s.Add(began, o.batch);
  }
}

Report Warm(const Options& o, Samples& s, bool write) {
  uint64_t size = 0;
  const int fd = OpenFile(o, &size);
  const int prot = PROT_READ | (write ? PROT_WRITE : 0);
  void* m = mmap(nullptr, size, prot, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) Die("mmap");
  char* map = static_cast<char*>(m);
  Report r;
  r.backing = BackingOf(map, size, o.path);
  const Persister persister(write ? o.persist : "none");
  r.persist = persister.name();
  // Every page faulted in (written, for the write mode: a store's first
  // fault is its own, on ext4 a page_mkwrite) before the clock starts.
  uint64_t sink = 0;
  for (uint64_t at = 0; at < size; at += kPage) {
    if (write) {
      map[at] = 'w';
    } else {
      sink += static_cast<unsigned char>(*reinterpret_cast<volatile char*>(map + at));
    }
  }
  KeepMemory(&sink);
  if (write && persister.name() == "msync" && msync(map, size, MS_SYNC) != 0) Die("msync");
  CopyLoop(o, s, map, size, write, [&](char* p) { persister.Persist(p); });
  munmap(map, size);
  close(fd);
  return r;
}

const char* GranularityName(pmem2_granularity g) {
  switch (g) {
    case PMEM2_GRANULARITY_BYTE: return "BYTE";
    case PMEM2_GRANULARITY_CACHE_LINE: return "CACHE_LINE";
    case PMEM2_GRANULARITY_PAGE: return "PAGE";
  }
  return "?";
}

Report Pmem2(const Options& o, Samples& s) {
  uint64_t size = 0;
  const int fd = OpenFile(o, &size);
  pmem2_config* cfg = nullptr;
  pmem2_source* src = nullptr;
  pmem2_map* map = nullptr;
  if (pmem2_config_new(&cfg) != 0) DiePmem2("pmem2_config_new");
  if (pmem2_config_set_required_store_granularity(cfg, PMEM2_GRANULARITY_PAGE) != 0) {
    DiePmem2("pmem2_config_set_required_store_granularity");
  }
  if (pmem2_source_from_fd(&src, fd) != 0) DiePmem2("pmem2_source_from_fd");
  if (pmem2_map_new(&map, cfg, src) != 0) DiePmem2("pmem2_map_new");
  char* addr = static_cast<char*>(pmem2_map_get_address(map));
  const uint64_t mapped = pmem2_map_get_size(map) / kPage * kPage;
  Report r;
  r.backing = BackingOf(addr, mapped, o.path);
  r.granularity = GranularityName(pmem2_map_get_store_granularity(map));
  r.persist = "pmem2";
  const pmem2_persist_fn persist = pmem2_get_persist_fn(map);
  for (uint64_t at = 0; at < mapped; at += kPage) addr[at] = 'w';
  persist(addr, mapped);
  CopyLoop(o, s, addr, mapped, true, [&](char* p) { persist(p, kPage); });
  pmem2_map_delete(&map);
  pmem2_source_delete(&src);
  pmem2_config_delete(&cfg);
  close(fd);
  return r;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: nvfs-mapbench first-touch|warm-read|warm-write|pmem2 FILE [--write]\n"
               "         [--persist none|msync|clflush] [--iterations N] [--seconds S] "
               "[--seed N] [--batch K]\n");
  std::exit(2);
}

// Options may come before, between or after MODE and FILE.
Options Parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--write") {
      o.write = true;
    } else if (a == "--persist" && has_value) {
      o.persist = argv[++i];
    } else if (a == "--iterations" && has_value) {
      o.iterations = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seconds" && has_value) {
      o.seconds = std::atof(argv[++i]);
    } else if (a == "--seed" && has_value) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--batch" && has_value) {
      o.batch = std::strtoull(argv[++i], nullptr, 10);
    } else if (a.rfind("--", 0) == 0) {
      Usage();
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) Usage();
  o.mode = positional[0];
  o.path = positional[1];
  if (o.iterations == 0) o.iterations = 1;
  if (o.batch == 0) o.batch = 1;
  if (o.batch != 1 && o.mode == "first-touch") {
    std::fprintf(stderr, "nvfs-mapbench: first-touch times each iteration alone (no --batch)\n");
    std::exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  Samples s(o);
  Report r;
  std::string mode = o.mode;
  if (o.mode == "first-touch") {
    r = FirstTouch(o, s);
    mode += o.write ? "-write" : "-read";
  } else if (o.mode == "warm-read") {
    r = Warm(o, s, false);
  } else if (o.mode == "warm-write") {
    r = Warm(o, s, true);
  } else if (o.mode == "pmem2") {
    r = Pmem2(o, s);
  } else {
    Usage();
  }
  const uint64_t n = s.iterations();
  const double seconds = s.seconds();
  const double p10 = s.Quantile(0.1), p90 = s.Quantile(0.9), median = s.Quantile(0.5);
  std::printf("{\"mode\": %s, \"iterations\": %llu, \"seconds\": %.4f, \"median_ns\": %.1f, "
              "\"p10_ns\": %.1f, \"p90_ns\": %.1f, \"mean_ns\": %.1f, \"batch\": %llu, "
              "\"clock_step_ns\": %llu, \"persist\": %s, \"granularity\": %s, "
              "\"backing\": %s, \"backing_path\": %s}\n",
              JsonString(mode).c_str(), static_cast<unsigned long long>(n), seconds, median, p10,
              p90, n == 0 ? 0.0 : seconds * 1e9 / static_cast<double>(n),
              static_cast<unsigned long long>(o.batch),
              static_cast<unsigned long long>(ClockStep()), JsonString(r.persist).c_str(),
              JsonString(r.granularity).c_str(),
              JsonString(r.backing.text).c_str(), JsonString(r.backing.path).c_str());
  return 0;
}
