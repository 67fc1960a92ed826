// nvfs-fsbench: metadata cost of the core, in process. For each size N it
// creates N entries in one fresh directory (creates/s), then looks up N
// random existing names (lookups/s, capped at 1M lookups), then removes the
// directory's entries. The point: per-entry cost must not grow with N.
//
//   nvfs-fsbench [-n 1k,10k,100k,1m] [-r REPS] NAMESPACE
#include <fcntl.h>
#include <getopt.h>
#include <sys/stat.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nvfs/cli.hpp"
#include "nvfs/fs.hpp"

namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string Name(uint64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "entry-%010" PRIu64, static_cast<uint64_t>(i * 2654435761u % 10000000000ull));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes = {1000, 1000000};
  int opt;
  while ((opt = getopt(argc, argv, "n:hV")) != -1) {
    switch (opt) {
      case 'n': {
        sizes.clear();
        std::string list = optarg;
        size_t pos = 0;
        while (pos < list.size()) {
          size_t comma = list.find(',', pos);
          if (comma == std::string::npos) comma = list.size();
          auto v = nvfs::ParseSize(list.substr(pos, comma - pos));
          if (!v) {
            std::fprintf(stderr, "nvfs-fsbench: bad size list\n");
            return 2;
          }
          sizes.push_back(*v);
          pos = comma + 1;
        }
        break;
      }
      case 'V': std::printf("nvfs-fsbench %s\n", NVFS_VERSION); return 0;
      case 'h':
      default:
        std::fprintf(opt == 'h' ? stdout : stderr,
                     "Usage: nvfs-fsbench [-n SIZES] NAMESPACE\n"
                     "Creates SIZES entries (default 1k,1m; k/m suffixes are powers of 1024)\n"
                     "in one directory of NAMESPACE (not mounted), then looks them up.\n"
                     "The namespace needs that many free inodes (mkfs.nvfs -N).\n");
        return opt == 'h' ? 0 : 2;
    }
  }
  if (optind + 1 != argc) {
    std::fprintf(stderr, "Usage: nvfs-fsbench [-n SIZES] NAMESPACE\n");
    return 2;
  }
  auto mounted = nvfs::Filesystem::Mount(argv[optind], nvfs::MountOptions{});
  if (!mounted.ok()) {
    std::fprintf(stderr, "nvfs-fsbench: %s\n", mounted.error().Describe().c_str());
    return 1;
  }
  nvfs::Filesystem& fs = **mounted;
  std::printf("%10s %12s %12s %12s %12s\n", "entries", "creates/s", "us/create", "lookups/s",
              "us/lookup");
  for (uint64_t n : sizes) {
    const std::string dir_name = "fsbench-" + std::to_string(n);
    auto dir = fs.Mkdir(1, dir_name, 0755, {0, 0});
    if (!dir.ok()) {
      std::fprintf(stderr, "nvfs-fsbench: mkdir: %s\n", dir.error().Describe().c_str());
      return 1;
    }
    auto start = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < n; ++i) {
      auto a = fs.Mknod(dir->ino, Name(i), S_IFREG | 0644, 0, {0, 0});
      if (!a.ok()) {
        std::fprintf(stderr, "nvfs-fsbench: create %" PRIu64 ": %s\n", i,
                     a.error().Describe().c_str());
        return 1;
      }
      fs.Forget(a->ino, 1);
    }
    const double create_s = Seconds(start);
    const uint64_t lookups = std::min<uint64_t>(n, 1000000);
    std::mt19937_64 rng(n);
    std::vector<std::string> names;
    names.reserve(lookups);
    for (uint64_t i = 0; i < lookups; ++i) names.push_back(Name(rng() % n));
    start = std::chrono::steady_clock::now();
    for (const std::string& name : names) {
      auto a = fs.Lookup(dir->ino, name);
      if (!a.ok()) {
        std::fprintf(stderr, "nvfs-fsbench: lookup %s: %s\n", name.c_str(),
                     a.error().Describe().c_str());
        return 1;
      }
      fs.Forget(a->ino, 1);
    }
    const double lookup_s = Seconds(start);
    std::printf("%10" PRIu64 " %12.0f %12.2f %12.0f %12.2f\n", n, n / create_s,
                create_s * 1e6 / n, lookups / lookup_s, lookup_s * 1e6 / lookups);
    std::fflush(stdout);
    for (uint64_t i = 0; i < n; ++i) (void)fs.Unlink(dir->ino, Name(i));
    (void)fs.Rmdir(1, dir_name);
    fs.Forget(dir->ino, 1);
  }
  return 0;
}
