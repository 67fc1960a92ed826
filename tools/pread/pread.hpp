// nvfs-pread (main.cpp has the whole story): what its parts share, the
// options, the offsets a run reads at, and the report of a measurement.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace nvfs::pread {

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

// The comma-separated items of `s`.
std::vector<std::string> Split(const std::string& s);

// Offsets for `ops` operations of `bs` bytes over a file of `size` bytes.
std::vector<uint64_t> Offsets(const std::string& pattern, uint64_t bs, uint64_t size,
                              uint64_t ops, uint64_t seed);

// Operations per run of `bs` bytes in `pattern` (engine mode).
uint64_t OpsFor(const Options& o, const std::string& pattern, uint64_t bs);

// Nanoseconds per operation of `fn`, which runs `ops` of them.
template <class Fn>
double TimeNs(uint64_t ops, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(ops);
}

// "nvfs-pread: MESSAGE" on stderr, exit status 1.
[[noreturn]] void Die(const std::string& message);

// The table's header line (nothing with --json).
void Header(const Options& o);
// One line (or JSON object) for a measurement: `ns_per_op` has one figure
// per repetition.
void Report(const Options& o, const char* mode, const std::string& path, const std::string& pattern,
            uint64_t bs, int threads, uint64_t ops, const std::vector<double>& ns_per_op);

// The two modes (main.cpp's usage): each fills in o.target and o.paths
// when not given, prints its table and returns the exit status.
int Engine(Options& o, const std::string& namespace_path);
int File(Options& o, const std::string& path);

}  // namespace nvfs::pread
