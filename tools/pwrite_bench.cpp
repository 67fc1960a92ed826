// pwrite_bench: the cost of a durable write, one workload at a time, for
// tools/bench_writes.py (tools/bench.sh --writes), which runs it on every
// target side by side.
//
//   pwrite_bench MODE WORKLOAD FILE SECONDS [SIZE]
//
// MODE: kernel  pwrite(2) on FILE opened O_RDWR | O_DSYNC (durable on
//               return, as every nvfs write is; appends add fdatasync)
//       direct  nvfs_direct_pwrite on FILE (libnvfs-direct's C API)
//       inproc  memcpy into FILE mapped MAP_SHARED in this process: the
//               floor (FILE on tmpfs: a store is all persistence costs)
// WORKLOAD: rand-4k    4 KiB overwrites at random aligned offsets of SIZE bytes
//           append-4k  4 KiB appends to a file made empty first (fdatasync
//                      after each for MODE kernel)
//           seq-1m     1 MiB overwrites in order, wrapping at SIZE
//           rand-4k-2t rand-4k on two threads, FILE and FILE.2
// Prints one JSON line: {"ops": N, "seconds": S, "ns_per_op": X, "gbps": Y}.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nvfs/direct.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "pwrite_bench: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// One file as MODE writes it.
class Writer {
 public:
  Writer(const std::string& mode, const std::string& path, uint64_t size, bool truncate)
      : mode_(mode) {
    const int flags = O_RDWR | O_CREAT | (mode == "kernel" ? O_DSYNC : 0);
    fd_ = open(path.c_str(), flags, 0644);
    if (fd_ < 0) Die("open " + path);
    if (truncate && ftruncate(fd_, 0) != 0) Die("ftruncate");
    if (!truncate) {
      // The file exists whole before the clock starts: an overwrite
      // workload allocates nothing.
      struct stat st {};
      fstat(fd_, &st);
      if (static_cast<uint64_t>(st.st_size) < size) {
        std::vector<char> chunk(1 << 20, 'p');
        for (uint64_t at = 0; at < size; at += chunk.size()) {
          if (pwrite(fd_, chunk.data(), chunk.size(), static_cast<off_t>(at)) < 0) Die("fill");
        }
        fsync(fd_);
      }
    }
    if (mode == "direct") {
      d_ = nvfs_direct_attach(fd_);
      if (d_ == nullptr) Die("nvfs_direct_attach");
    } else if (mode == "inproc") {
      map_size_ = size;
      if (ftruncate(fd_, static_cast<off_t>(size)) != 0) Die("ftruncate");
      void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) Die("mmap");
      map_ = static_cast<char*>(p);
    }
  }
  ~Writer() {
    if (d_ != nullptr) nvfs_direct_detach(d_);
    if (map_ != nullptr) munmap(map_, map_size_);
    close(fd_);
  }
  // Checked after the run: a direct target that fell back to the kernel
  // would measure the kernel.
  int why() const { return d_ == nullptr ? 0 : nvfs_direct_write_why(d_); }

  void Write(const char* buf, size_t len, uint64_t at, bool sync) {
    if (mode_ == "inproc") {
      std::memcpy(map_ + at, buf, len);
      return;
    }
    const ssize_t n = d_ != nullptr ? nvfs_direct_pwrite(d_, buf, len, static_cast<off_t>(at))
                                    : pwrite(fd_, buf, len, static_cast<off_t>(at));
    if (n != static_cast<ssize_t>(len)) Die("pwrite");
    if (sync && d_ == nullptr && fdatasync(fd_) != 0) Die("fdatasync");
  }

 private:
  std::string mode_;
  int fd_ = -1;
  nvfs_direct* d_ = nullptr;
  char* map_ = nullptr;
  uint64_t map_size_ = 0;
};

struct Result {
  uint64_t ops = 0;
  uint64_t bytes = 0;
};

Result Run(Writer& w, const std::string& workload, uint64_t size, double seconds, unsigned seed) {
  const bool append = workload == "append-4k";
  const size_t len = workload == "seq-1m" ? (1u << 20) : 4096;
  std::vector<char> buf(len, static_cast<char>('a' + seed % 26));
  std::mt19937_64 rng(seed);
  const uint64_t blocks = size / len;
  Result r;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  uint64_t next = 0;
  // The clock is read every 16 writes.
  while (true) {
    for (int i = 0; i < 16; ++i) {
      uint64_t at;
      if (append) {
        at = next * len;
        if (at + len > size) return r;  // the file's room is used up
      } else if (workload == "seq-1m") {
        at = (next % blocks) * len;
      } else {
        at = (rng() % blocks) * len;
      }
      ++next;
      w.Write(buf.data(), len, at, append);
      ++r.ops;
      r.bytes += len;
    }
    if (Clock::now() >= end) return r;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: pwrite_bench kernel|direct|inproc WORKLOAD FILE SECONDS [SIZE]\n");
    return 2;
  }
  const std::string mode = argv[1], workload = argv[2], path = argv[3];
  const double seconds = std::atof(argv[4]);
  const uint64_t size = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : uint64_t{64} << 20;
  const bool append = workload == "append-4k";
  const int threads = workload == "rand-4k-2t" ? 2 : 1;
  std::vector<std::unique_ptr<Writer>> writers;
  for (int t = 0; t < threads; ++t) {
    writers.push_back(std::make_unique<Writer>(mode, t == 0 ? path : path + ".2", size, append));
  }
  // A first write outside the clock: the session is proven, runs known.
  {
    std::vector<char> warm(4096, 'w');
    for (auto& w : writers) w->Write(warm.data(), warm.size(), 0, false);
    if (append) {
      writers.clear();
      writers.push_back(std::make_unique<Writer>(mode, path, size, true));
    }
  }
  std::vector<Result> results(threads);
  const auto start = Clock::now();
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      results[t] = Run(*writers[t], workload == "rand-4k-2t" ? "rand-4k" : workload, size, seconds,
                       static_cast<unsigned>(t + 1));
    });
  }
  for (auto& t : running) t.join();
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  Result total;
  for (const Result& r : results) {
    total.ops += r.ops;
    total.bytes += r.bytes;
  }
  for (auto& w : writers) {
    if (w->why() != 0) {
      std::fprintf(stderr, "pwrite_bench: not written directly: %s\n", nvfs_direct_strwhy(w->why()));
      return 1;
    }
  }
  std::printf("{\"ops\": %llu, \"seconds\": %.4f, \"ns_per_op\": %.1f, \"gbps\": %.4f}\n",
              static_cast<unsigned long long>(total.ops), took,
              took * 1e9 / static_cast<double>(total.ops) * threads,
              static_cast<double>(total.bytes) / took / 1e9);
  return 0;
}
