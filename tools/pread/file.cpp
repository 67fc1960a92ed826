// nvfs-pread file: pread and preadv loops on any file, on T threads, each
// with its own descriptor, for a count of operations or a time (main.cpp's
// usage); --direct reads go through direct.cpp's ThreadReader. pread,
// preadv and preadv-page are the kinds of destination the kernel's iov_iter
// meets (seed 002): pread fills one buffer (a UBUF iterator), preadv the
// same buffer in 4 KiB iovecs (IOVEC), and preadv-page points every iovec
// at the same page, so that the copy's destination stays in cache and what
// each segment costs shows.
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pread/direct.hpp"
#include "pread/pread.hpp"

namespace nvfs::pread {
namespace {

constexpr uint64_t kSegment = 4096;  // bytes per iovec of the preadv paths

// The iovecs of one preadv of `bs` bytes, one per page: the consecutive
// pages of `buf` (preadv), or with `replicated` its first page every time
// (preadv-page: a single page replicated across the read, as the seed's
// benchmark has it). `buf` holds at least `bs` bytes.
std::vector<iovec> PageIovecs(char* buf, uint64_t bs, bool replicated) {
  std::vector<iovec> iov;
  for (uint64_t off = 0; off < bs; off += kSegment) {
    iov.push_back({buf + (replicated ? 0 : off), std::min(kSegment, bs - off)});
  }
  return iov;
}

}  // namespace

int File(Options& o, const std::string& path) {
  if (o.target.empty()) o.target = path;
  if (o.paths.empty()) o.paths = {"pread", "preadv"};
  for (const std::string& p : o.paths) {
    // A misspelt path would otherwise be measured as pread.
    if (p != "pread" && p != "preadv" && p != "preadv-page" && p != "getxattr" && p != "eofread") {
      Die("unknown path " + p);
    }
  }
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
          const bool replicated = o.paths[p] == "preadv-page";
          const bool vectored = o.paths[p] == "preadv" || replicated;
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
            const ThreadReader reader(fd, o.nvfs_direct, path);
            if (!reader.ok()) {
              failed = true;
              return;
            }
            auto read_at = [&](void* dst, size_t len, uint64_t off) {
              return reader.Pread(dst, len, off);
            };
            void* raw = nullptr;
            if (posix_memalign(&raw, 4096, bs) != 0) {
              failed = true;
              return;
            }
            std::unique_ptr<char, decltype(&free)> buf(static_cast<char*>(raw), &free);
            const std::vector<iovec> iov = PageIovecs(buf.get(), bs, replicated);
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
              const ssize_t n = !vectored ? read_at(buf.get(), bs, off)
                                          : reader.Preadv(iov.data(), static_cast<int>(iov.size()), off);
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

}  // namespace nvfs::pread
