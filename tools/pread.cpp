// nvfs-pread: the pread microbenchmark.
//
//   nvfs-pread engine [OPTIONS] NAMESPACE   the core's read paths, in process
//   nvfs-pread file   [OPTIONS] PATH        pread/preadv on any file
//   nvfs-pread file --direct [OPTIONS] PATH the same through libnvfs-direct
//
// Every measurement is repeated R times, the paths interleaved within each
// repetition so drift hits them alike; reported as mean and standard
// deviation of ns per operation, ops/s and GB/s — but for engine's `map`
// path, which copies no byte (it returns pointers into the mapping), the
// last column is the time per request in microseconds ("us" after it): a
// throughput of bytes never moved would read 96,000 GB/s at 1 MiB.
#include <fcntl.h>
#include <sched.h>
#include <getopt.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "nvfs/cli.hpp"
#include "nvfs/direct.h"
#include "nvfs/fs.hpp"

namespace {

constexpr const char* kUsage =
    "Usage: nvfs-pread engine [OPTIONS] NAMESPACE\n"
    "       nvfs-pread file [OPTIONS] PATH\n"
    "\n"
    "engine: mounts NAMESPACE in process (no FUSE; it must not be mounted) and\n"
    "  measures the core's read paths: read, read_iter (one segment), read_iter_4k\n"
    "  (4 KiB segments), map (no copy), and memcpy from the mapping (the floor).\n"
    "  With no options: the seed benchmark (N reads of the same 4 KiB at offset 0)\n"
    "  and sequential and random reads of 512 B, 4 KiB, 64 KiB and 1 MiB over a\n"
    "  file it creates in the namespace (/nvfs-pread.dat).\n"
    "file: pread and preadv (4 KiB iovecs) loops on PATH (any filesystem); with\n"
    "  --direct, through libnvfs-direct (nvfs_direct_pread and _preadv on a handle\n"
    "  attached to each thread's descriptor; reported as mode \"direct\").\n"
    "\n"
    "Options:\n"
    "  -n N            operations in the seed loop (default 2^24; engine)\n"
    "  -N N            operations per matrix run (default: 256 MiB worth, at most 2^20)\n"
    "  -r R            repetitions (default 3)\n"
    "  -b SIZES        block sizes, comma-separated (default 512,4k,64k,1m)\n"
    "  -P PATTERNS     same,seq,rand (default: all)\n"
    "  -p PATHS        engine: read,read_iter,read_iter_4k,map,memcpy;\n"
    "                  file: pread,preadv, and the round-trip floors: getxattr (a\n"
    "                  missing xattr) and eofread (a pread at the end of the file)\n"
    "  -s SIZE         engine: size of the data file (default 256m)\n"
    "  -t THREADS      threads (file mode; default 1)\n"
    "  -D SECONDS      file mode: run each measurement for this long instead of N ops\n"
    "  -d              O_DIRECT (file mode)\n"
    "  --direct        file mode: read through libnvfs-direct (a file it cannot\n"
    "                  read directly says why on stderr and is read through the kernel)\n"
    "  -C              file mode: pin thread i to CPU i (mod the CPU count)\n"
    "  -w              engine: a second thread overwrites the file in place meanwhile\n"
    "  -A OFFSET       engine: the destination buffer starts OFFSET bytes into a\n"
    "                  page (default 0; 16 is where a large malloc puts it)\n"
    "  -X              engine: extent maps off, every read walks the block map\n"
    "  -T TARGET       a name for the target in the output (default: the path)\n"
    "  -j, --json      one JSON object per line instead of a table\n"
    "  -h, --help      this help;  -V, --version  the version\n";

struct Options {
  uint64_t seed_ops = uint64_t{1} << 24;
  uint64_t matrix_ops = 0;
  int reps = 3;
  std::vector<uint64_t> sizes = {512, 4096, 65536, 1 << 20};
  std::vector<std::string> patterns = {"same", "seq", "rand"};
  std::vector<std::string> paths;
  uint64_t file_size = 256ull << 20;
  int threads = 1;
  double duration = 0;  // seconds per run (file mode); 0: a fixed operation count
  bool o_direct = false;      // -d: open with O_DIRECT
  bool nvfs_direct = false;   // --direct: read through libnvfs-direct
  bool pin = false;  // -C: thread i on CPU i (file mode)
  bool json = false;
  bool writer = false;         // engine: a thread overwrites the file in place meanwhile
  uint64_t buffer_offset = 0;  // engine: where in a page the destination starts
  bool no_extent_maps = false;  // engine: every read walks the bmap
  std::string target;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

struct Stats {
  double mean = 0;
  double stddev = 0;
  double median = 0;
};

Stats Summarize(const std::vector<double>& v) {
  Stats s;
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / static_cast<double>(v.size() - 1)) : 0;
  return s;
}

void Report(const Options& o, const char* mode, const std::string& path, const std::string& pattern,
            uint64_t bs, int threads, uint64_t ops, const std::vector<double>& ns_per_op) {
  const Stats s = Summarize(ns_per_op);
  const double ops_per_s = 1e9 / s.mean * threads;
  const double gbps = ops_per_s * static_cast<double>(bs) / 1e9;
  // engine's map moves no byte: its figure is the time per request.
  const bool copies = !(std::strcmp(mode, "engine") == 0 && path == "map");
  const double us_per_request = s.mean / 1e3;
  if (o.json) {
    char last[64];
    if (copies) {
      std::snprintf(last, sizeof last, "\"gbps\":%.4f", gbps);
    } else {
      std::snprintf(last, sizeof last, "\"gbps\":null,\"us_per_request\":%.4f", us_per_request);
    }
    std::printf("{\"mode\":\"%s\",\"target\":\"%s\",\"path\":\"%s\",\"pattern\":\"%s\",\"bs\":%" PRIu64
                ",\"threads\":%d,\"ops\":%" PRIu64 ",\"reps\":%zu,\"ns_per_op\":%.2f,\"ns_stddev\":%.2f,"
                "\"ns_median\":%.2f,\"ops_per_s\":%.0f,%s}\n",
                mode, o.target.c_str(), path.c_str(), pattern.c_str(), bs, threads, ops,
                ns_per_op.size(), s.mean, s.stddev, s.median, ops_per_s, last);
  } else {
    char last[32];
    if (copies) {
      std::snprintf(last, sizeof last, "%8.3f", gbps);
    } else {
      std::snprintf(last, sizeof last, "%6.3fus", us_per_request);
    }
    std::printf("%-7s %-13s %-5s %8" PRIu64 " %3d %10" PRIu64 " %11.1f %9.1f %9.1f %12.0f %s\n",
                mode, path.c_str(), pattern.c_str(), bs, threads, ops, s.mean, s.stddev, s.median,
                ops_per_s, last);
  }
  std::fflush(stdout);
}

void Header(const Options& o) {
  if (o.json) return;
  std::printf("%-7s %-13s %-5s %8s %3s %10s %11s %9s %9s %12s %8s\n", "mode", "path", "pat", "bs",
              "thr", "ops", "ns/op", "stddev", "median", "ops/s", "GB/s");
}

// Offsets for `ops` operations of `bs` bytes over a file of `size` bytes.
std::vector<uint64_t> Offsets(const std::string& pattern, uint64_t bs, uint64_t size,
                              uint64_t ops, uint64_t seed) {
  const uint64_t slots = std::max<uint64_t>(size / bs, 1);
  const uint64_t n = std::min<uint64_t>(ops, 1 << 20);
  std::vector<uint64_t> offsets(n);
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < n; ++i) {
    if (pattern == "same") offsets[i] = 0;
    else if (pattern == "seq") offsets[i] = (i % slots) * bs;
    else offsets[i] = (rng() % slots) * bs;
  }
  return offsets;
}

uint64_t OpsFor(const Options& o, const std::string& pattern, uint64_t bs) {
  if (pattern == "same" && bs == 4096 && o.matrix_ops == 0) return o.seed_ops;
  if (o.matrix_ops != 0) return o.matrix_ops;
  return std::clamp<uint64_t>((256ull << 20) / bs, 1024, 1 << 20);
}

template <class Fn>
double TimeNs(uint64_t ops, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(ops);
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "nvfs-pread: %s\n", message.c_str());
  std::exit(1);
}

// --- engine mode ------------------------------------------------------------

int Engine(Options& o, const std::string& namespace_path) {
  nvfs::MountOptions mount_options;
  if (o.no_extent_maps) mount_options.extent_map_runs = 0;
  auto mounted = nvfs::Filesystem::Mount(namespace_path, mount_options);
  if (!mounted.ok()) Die(mounted.error().Describe());
  nvfs::Filesystem& fs = **mounted;
  if (o.target.empty()) o.target = namespace_path;
  if (o.paths.empty()) o.paths = {"read", "read_iter", "read_iter_4k", "map", "memcpy"};

  // The data file: created once, filled with a pattern, reused by later runs.
  const std::string name = "nvfs-pread.dat";
  uint64_t ino;
  auto found = fs.Lookup(1, name);
  if (found.ok() && found->size >= o.file_size) {
    ino = found->ino;
  } else {
    if (found.ok()) {
      (void)fs.Unlink(1, name);
      fs.Forget(found->ino, 1);
    }
    nvfs::Attr attr;
    auto created = fs.Create(1, name, 0644, O_RDWR, {0, 0}, &attr);
    if (!created.ok()) Die("cannot create the data file: " + created.error().Describe());
    std::vector<char> chunk(1 << 20);
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 131 + 7);
    for (uint64_t off = 0; off < o.file_size; off += chunk.size()) {
      auto w = fs.Write(*created, off, chunk.data(), chunk.size());
      if (!w.ok()) Die("cannot write the data file: " + w.error().Describe());
    }
    fs.Release(*created);
    ino = attr.ino;
  }
  auto handle = fs.Open(ino, O_RDONLY);
  if (!handle.ok()) Die(handle.error().Describe());
  nvfs::FileHandle h = *handle;

  // -w: a second thread overwrites the file in place, 4 KiB at a time, for as
  // long as the reads run: what readers pay for a concurrent writer.
  std::atomic<bool> stop_writer{false};
  std::thread writer;
  if (o.writer) {
    auto wh = fs.Open(ino, O_RDWR);
    if (!wh.ok()) Die(wh.error().Describe());
    writer = std::thread([&fs, &stop_writer, &o, w = *wh] {
      std::vector<char> block(4096, 'w');
      for (uint64_t off = 0; !stop_writer.load(std::memory_order_relaxed);
           off = (off + 4096) % o.file_size) {
        if (!fs.Write(w, off, block.data(), block.size()).ok()) Die("the writer thread failed");
      }
      fs.Release(w);
    });
  }

  const uint64_t max_bs = *std::max_element(o.sizes.begin(), o.sizes.end());
  // Page-aligned by default (-A moves it): a destination a few bytes into a
  // page (a large malloc starts 16 bytes in) makes every path, memcpy
  // included, pay for 4 KiB aliasing of its loads with its stores, which
  // hides the paths' own cost.
  struct FreeAligned {
    void operator()(char* p) const { std::free(p); }
  };
  const std::unique_ptr<char, FreeAligned> buffer_memory(
      static_cast<char*>(std::aligned_alloc(4096, (max_bs + 8192 + 4095) & ~uint64_t{4095})));
  if (!buffer_memory) Die("out of memory");
  std::span<char> buffer(buffer_memory.get() + o.buffer_offset, max_bs + 4096);
  std::vector<nvfs::ReadRun> runs(max_bs / 4096 + 64);
  Header(o);
  for (const std::string& pattern : o.patterns) {
    for (uint64_t bs : o.sizes) {
      if (pattern == "same" && bs != 4096) continue;  // the seed's loop is 4 KiB
      const uint64_t ops = OpsFor(o, pattern, bs);
      const std::vector<uint64_t> offsets = Offsets(pattern, bs, o.file_size, ops, bs);
      const size_t mask = offsets.size() - 1;
      const bool pow2 = (offsets.size() & mask) == 0;
      std::vector<iovec> segments;
      for (uint64_t off = 0; off < bs; off += 4096) {
        segments.push_back({buffer.data() + off, std::min<uint64_t>(4096, bs - off)});
      }
      std::vector<std::vector<double>> results(o.paths.size());
      std::vector<nvfs::ReadRun> floor_runs;
      std::vector<size_t> floor_first;
      uint64_t sink = 0;
      for (int rep = 0; rep < o.reps; ++rep) {
        for (size_t p = 0; p < o.paths.size(); ++p) {
          const std::string& path = o.paths[p];
          auto offset_of = [&](uint64_t i) {
            return offsets[pow2 ? (i & mask) : (i % offsets.size())];
          };
          double ns = 0;
          if (path == "read") {
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) sink += *fs.Read(h, offset_of(i), buffer.data(), bs);
            });
          } else if (path == "read_iter") {
            iovec one{buffer.data(), bs};
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) sink += *fs.ReadIter(h, offset_of(i), &one, 1);
            });
          } else if (path == "read_iter_4k") {
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) {
                sink += *fs.ReadIter(h, offset_of(i), segments.data(),
                                     static_cast<int>(segments.size()));
              }
            });
          } else if (path == "map") {
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) {
                size_t count;
                const nvfs::MapGuard held;  // as the FUSE adapter holds it
                sink += *fs.Map(h, offset_of(i), bs, runs.data(), runs.size(), &count, held);
              }
            });
          } else if (path == "memcpy") {
            // The floor: the same bytes copied straight out of the mapping,
            // from the physical runs looked up before the clock starts.
            if (floor_runs.empty()) {
              floor_first.resize(offsets.size() + 1);
              for (size_t i = 0; i < offsets.size(); ++i) {
                floor_first[i] = floor_runs.size();
                size_t count = 0;
                const nvfs::MapGuard held;
                if (!fs.Map(h, offsets[i], bs, runs.data(), runs.size(), &count, held).ok()) {
                  Die("cannot map the data file");
                }
                floor_runs.insert(floor_runs.end(), runs.begin(), runs.begin() + count);
              }
              floor_first[offsets.size()] = floor_runs.size();
            }
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) {
                const size_t k = pow2 ? (i & mask) : (i % offsets.size());
                char* out = buffer.data();
                for (size_t r = floor_first[k]; r < floor_first[k + 1]; ++r) {
                  std::memcpy(out, floor_runs[r].data, floor_runs[r].len);
                  out += floor_runs[r].len;
                }
                asm volatile("" ::: "memory");
              }
            });
          } else {
            Die("unknown path " + path);
          }
          results[p].push_back(ns);
        }
      }
      for (size_t p = 0; p < o.paths.size(); ++p) {
        Report(o, "engine", o.paths[p], pattern, bs, 1, ops, results[p]);
      }
      if (sink == 42) std::printf(" ");  // keeps the loops from being optimised away
    }
  }
  if (writer.joinable()) {
    stop_writer = true;
    writer.join();
  }
  fs.Release(h);
  return 0;
}

// --- file mode --------------------------------------------------------------

int File(Options& o, const std::string& path) {
  if (o.target.empty()) o.target = path;
  if (o.paths.empty()) o.paths = {"pread", "preadv"};
  const int main_fd = open(path.c_str(), O_RDONLY | (o.o_direct ? O_DIRECT : 0));
  if (main_fd < 0) Die(path + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(main_fd, &st) != 0) Die(path + ": " + std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) Die(path + ": empty file");
  Header(o);
  for (const std::string& pattern : o.patterns) {
    for (uint64_t bs : o.sizes) {
      if (pattern == "same" && bs != 4096) continue;
      if (bs > size) continue;
      const uint64_t ops = o.matrix_ops ? o.matrix_ops
                           : pattern == "same" ? std::min<uint64_t>(o.seed_ops, 1 << 18)
                                               : std::clamp<uint64_t>((256ull << 20) / bs, 256, 1 << 16);
      const std::vector<uint64_t> offsets =
          Offsets(pattern, bs, size, o.duration > 0 ? (1 << 20) : ops, bs);
      std::vector<std::vector<double>> results(o.paths.size());
      uint64_t last_ops = 0;
      for (int rep = 0; rep < o.reps; ++rep) {
        for (size_t p = 0; p < o.paths.size(); ++p) {
          const bool vectored = o.paths[p] == "preadv";
          const bool floor = o.paths[p] == "getxattr";
          const bool at_eof = o.paths[p] == "eofread";
          std::atomic<bool> failed{false};
          std::atomic<uint64_t> total_ops{0};
          auto worker = [&](int t) {
            if (o.pin) {
              // One caller per CPU, as FUSE over io_uring serves them (a
              // queue per CPU): without it the scheduler may stack the
              // callers on one CPU (uring.hpp).
              cpu_set_t cpus;
              CPU_ZERO(&cpus);
              CPU_SET(t % static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), &cpus);
              sched_setaffinity(0, sizeof cpus, &cpus);
            }
            // Each thread opens the file itself, as separate readers (and
            // fio's jobs) do.
            struct ThreadFd {
              int fd;
              bool own;
              ~ThreadFd() {
                if (own && fd >= 0) close(fd);
              }
            } const mine{t == 0 ? main_fd : open(path.c_str(), O_RDONLY | (o.o_direct ? O_DIRECT : 0)),
                         t != 0};
            const int fd = mine.fd;
            if (fd < 0) {
              failed = true;
              return;
            }
            // --direct: a handle on the thread's descriptor, detached
            // before the descriptor is closed.
            struct Handle {
              nvfs_direct* f;
              ~Handle() {
                if (f != nullptr) nvfs_direct_detach(f);
              }
            } const handle{o.nvfs_direct ? nvfs_direct_attach(fd) : nullptr};
            if (o.nvfs_direct) {
              if (handle.f == nullptr) {
                failed = true;
                return;
              }
              static std::atomic<bool> warned{false};
              const int why = nvfs_direct_why(handle.f);
              if (why != NVFS_DIRECT_ACTIVE && !warned.exchange(true)) {
                std::fprintf(stderr, "nvfs-pread: --direct: %s is read through the kernel: %s\n",
                             path.c_str(), nvfs_direct_strwhy(why));
              }
            }
            auto read_at = [&](void* dst, size_t len, uint64_t off) {
              return handle.f != nullptr
                         ? nvfs_direct_pread(handle.f, dst, len, static_cast<off_t>(off))
                         : pread(fd, dst, len, static_cast<off_t>(off));
            };
            void* raw = nullptr;
            if (posix_memalign(&raw, 4096, bs) != 0) {
              failed = true;
              return;
            }
            std::unique_ptr<char, decltype(&free)> buf(static_cast<char*>(raw), &free);
            std::vector<iovec> iov;
            for (uint64_t off = 0; off < bs; off += 4096) {
              iov.push_back({buf.get() + off, std::min<uint64_t>(4096, bs - off)});
            }
            const auto start = std::chrono::steady_clock::now();
            uint64_t i = 0;
            for (;; ++i) {
              if (o.duration > 0) {
                // Time-based, as fio's time_based: the clock is read every 64 ops.
                if ((i & 63) == 0 && std::chrono::duration<double>(
                                         std::chrono::steady_clock::now() - start).count() >= o.duration) {
                  break;
                }
              } else if (i >= ops) {
                break;
              }
              if (floor) {
                // The cheapest request that always reaches the filesystem: a
                // missing extended attribute (ENODATA).
                if (fgetxattr(fd, "user.nvfs-pread-floor", buf.get(), 1) >= 0 || errno != ENODATA) {
                  if (errno != ENOTSUP) failed = true;
                }
                continue;
              }
              if (at_eof) {
                // The cheapest read: one that reaches the filesystem (FUSE
                // direct I/O sends it) and returns no data.
                if (read_at(buf.get(), bs, size) != 0) failed = true;
                continue;
              }
              const uint64_t off = offsets[(i + static_cast<uint64_t>(t) * 7919) % offsets.size()];
              const ssize_t n =
                  !vectored ? read_at(buf.get(), bs, off)
                  : handle.f != nullptr
                      ? nvfs_direct_preadv(handle.f, iov.data(), static_cast<int>(iov.size()),
                                           static_cast<off_t>(off))
                      : preadv(fd, iov.data(), static_cast<int>(iov.size()), static_cast<off_t>(off));
              if (n < 0) {
                failed = true;
                return;
              }
            }
            total_ops += i;
          };
          const double elapsed = TimeNs(1, [&] {
            std::vector<std::thread> pool;
            for (int t = 1; t < o.threads; ++t) pool.emplace_back(worker, t);
            worker(0);
            for (auto& th : pool) th.join();
          });
          // Per-thread time per operation, as in the fixed-count case.
          const double ns = elapsed * o.threads / static_cast<double>(std::max<uint64_t>(total_ops, 1));
          last_ops = total_ops / static_cast<uint64_t>(o.threads);
          if (failed) Die(path + ": read failed: " + std::strerror(errno));
          results[p].push_back(ns);
        }
      }
      for (size_t p = 0; p < o.paths.size(); ++p) {
        Report(o, o.nvfs_direct ? "direct" : "file", o.paths[p], pattern, bs, o.threads,
               o.duration > 0 ? last_ops : ops, results[p]);
      }
    }
  }
  close(main_fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc >= 2 && (std::strcmp(argv[1], "-V") == 0 || std::strcmp(argv[1], "--version") == 0)) {
    std::printf("nvfs-pread %s\n", NVFS_VERSION);
    return 0;
  }
  if (argc < 2 || (std::strcmp(argv[1], "engine") != 0 && std::strcmp(argv[1], "file") != 0)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string mode = argv[1];
  Options o;
  static const option kLong[] = {{"json", no_argument, nullptr, 'j'},
                                 {"direct", no_argument, nullptr, 'R'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  optind = 2;
  int opt;
  auto size_arg = [](const char* text) {
    auto v = nvfs::ParseSize(text);
    if (!v || *v == 0) Die(std::string("invalid size: ") + text);
    return *v;
  };
  while ((opt = getopt_long(argc, argv, "n:N:r:b:P:p:s:t:D:dCwA:XT:jh", kLong, nullptr)) != -1) {
    switch (opt) {
      case 'n': o.seed_ops = size_arg(optarg); break;
      case 'N': o.matrix_ops = size_arg(optarg); break;
      case 'r': o.reps = static_cast<int>(size_arg(optarg)); break;
      case 'b':
        o.sizes.clear();
        for (const auto& s : Split(optarg)) o.sizes.push_back(size_arg(s.c_str()));
        break;
      case 'P': o.patterns = Split(optarg); break;
      case 'p': o.paths = Split(optarg); break;
      case 's': o.file_size = size_arg(optarg); break;
      case 't': o.threads = static_cast<int>(size_arg(optarg)); break;
      case 'd': o.o_direct = true; break;
      case 'R': o.nvfs_direct = true; break;
      case 'C': o.pin = true; break;
      case 'w': o.writer = true; break;
      case 'X': o.no_extent_maps = true; break;
      case 'A':
        o.buffer_offset = std::strtoull(optarg, nullptr, 0);
        if (o.buffer_offset >= 4096) Die("-A: the offset must be below 4096");
        break;
      case 'D': o.duration = std::atof(optarg); break;
      case 'T': o.target = optarg; break;
      case 'j': o.json = true; break;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: std::fputs(kUsage, stderr); return 2;
    }
  }
  if (optind + 1 != argc) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (o.nvfs_direct && mode != "file") Die("--direct is for file mode");
  for (const auto& p : o.patterns) {
    if (p != "same" && p != "seq" && p != "rand") Die("unknown pattern " + p);
  }
  return mode == "engine" ? Engine(o, argv[optind]) : File(o, argv[optind]);
}
