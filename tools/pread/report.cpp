// nvfs-pread's report (pread.hpp): mean, standard deviation and median of
// each measurement's repetitions, as a table line or a JSON object
// (tools/bench.py parses both), and the helpers every mode uses.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "pread/pread.hpp"

namespace nvfs::pread {

namespace {

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

}  // namespace

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

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "nvfs-pread: %s\n", message.c_str());
  std::exit(1);
}

}  // namespace nvfs::pread
