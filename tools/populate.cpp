// nvfs-populate: fills a namespace (not mounted) with a tree of files, in
// process through the filesystem core, for fsck and metadata benchmarks.
//
//   nvfs-populate [-n FILES] [-d DIRS] [-s BYTES] [-l] [-r] NAMESPACE
//
// Makes DIRS directories under the root (/d000000, ...) and FILES files in
// them, directory after directory as an unpacked archive makes them (with -r:
// round robin, so neighbouring inodes live in different directories), each
// holding BYTES bytes (default 0: made with mknod, no blocks). With -l every
// tenth file also gets a second name and a symlink beside it, so link counts
// and symlinks are exercised too. The namespace needs FILES + DIRS free inodes
// (mkfs.nvfs -N).
#include <fcntl.h>
#include <getopt.h>
#include <sys/stat.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "nvfs/cli.hpp"
#include "nvfs/fs.hpp"

namespace {

constexpr const char* kUsage =
    "Usage: nvfs-populate [-n FILES] [-d DIRS] [-s BYTES] [-l] [-r] NAMESPACE\n"
    "Creates DIRS directories (default 100) and FILES files (default 10k; k/m suffixes\n"
    "are powers of 1024) of BYTES bytes each (default 0) in NAMESPACE, which must\n"
    "not be mounted. -l: every tenth file also gets a hard link and a symlink.\n"
    "-r: spread the files over the directories round robin.\n";

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t files = 10240, dirs = 100, bytes = 0;
  bool links = false;
  bool round_robin = false;
  int opt;
  while ((opt = getopt(argc, argv, "n:d:s:lrhV")) != -1) {
    std::optional<uint64_t> value;
    switch (opt) {
      case 'n': case 'd': case 's':
        value = nvfs::ParseSize(optarg);
        if (!value) {
          std::fprintf(stderr, "nvfs-populate: bad number: %s\n%s", optarg, kUsage);
          return 2;
        }
        (opt == 'n' ? files : opt == 'd' ? dirs : bytes) = *value;
        break;
      case 'l': links = true; break;
      case 'r': round_robin = true; break;
      case 'V': std::printf("nvfs-populate %s\n", NVFS_VERSION); return 0;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: std::fputs(kUsage, stderr); return 2;
    }
  }
  if (optind + 1 != argc || dirs == 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  auto mounted = nvfs::Filesystem::Mount(argv[optind], nvfs::MountOptions{});
  if (!mounted.ok()) {
    std::fprintf(stderr, "nvfs-populate: %s\n", mounted.error().Describe().c_str());
    return 1;
  }
  nvfs::Filesystem& fs = **mounted;
  const nvfs::Cred cred{};
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint64_t> dir_inos;
  for (uint64_t d = 0; d < dirs; ++d) {
    char name[32];
    std::snprintf(name, sizeof name, "d%06" PRIu64, d);
    auto made = fs.Mkdir(1, name, 0755, cred);
    if (!made.ok()) {
      std::fprintf(stderr, "nvfs-populate: mkdir /%s: %s\n", name, made.error().Describe().c_str());
      return 1;
    }
    dir_inos.push_back(made->ino);
  }
  std::vector<char> data(bytes);
  for (uint64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>('a' + i % 26);
  nvfs::Progress progress("populating", files, false);
  for (uint64_t f = 0; f < files; ++f) {
    const uint64_t per_dir = (files + dirs - 1) / dirs;
    const uint64_t parent = dir_inos[round_robin ? f % dirs : f / per_dir];
    char name[32];
    std::snprintf(name, sizeof name, "f%08" PRIu64, f);
    uint64_t ino = 0;
    if (bytes == 0) {
      auto made = fs.Mknod(parent, name, S_IFREG | 0644, 0, cred);
      if (!made.ok()) {
        std::fprintf(stderr, "nvfs-populate: create %s: %s\n", name,
                     made.error().Describe().c_str());
        return 1;
      }
      ino = made->ino;
    } else {
      nvfs::Attr attr;
      auto file = fs.Create(parent, name, 0644, O_WRONLY, cred, &attr);
      if (!file.ok()) {
        std::fprintf(stderr, "nvfs-populate: create %s: %s\n", name,
                     file.error().Describe().c_str());
        return 1;
      }
      auto written = fs.Write(*file, 0, data.data(), data.size());
      fs.Release(*file);
      if (!written.ok()) {
        std::fprintf(stderr, "nvfs-populate: write %s: %s\n", name,
                     written.error().Describe().c_str());
        return 1;
      }
      ino = attr.ino;
    }
    fs.Forget(ino, 1);
    if (links && f % 10 == 0) {
      std::string other = std::string(name) + ".link";
      auto linked = fs.Link(ino, dir_inos[(f + 1) % dirs], other);
      if (linked.ok()) fs.Forget(ino, 1);
      std::string sym = std::string(name) + ".sym";
      auto symlink = fs.Symlink(parent, sym, name, cred);
      if (symlink.ok()) fs.Forget(symlink->ino, 1);
      if (!linked.ok() || !symlink.ok()) {
        std::fprintf(stderr, "nvfs-populate: link %s: failed\n", name);
        return 1;
      }
    }
    if (f % 4096 == 0) progress.Update(f);
  }
  progress.Update(files);
  for (uint64_t ino : dir_inos) fs.Forget(ino, 1);
  const double seconds = Seconds(start);
  nvfs::Status st = fs.Unmount();
  if (!st.ok()) {
    std::fprintf(stderr, "nvfs-populate: unmount: %s\n", st.error().Describe().c_str());
    return 1;
  }
  std::printf("%" PRIu64 " files in %" PRIu64 " directories in %.2f s (%.0f files/s)\n", files,
              dirs, seconds, seconds > 0 ? files / seconds : 0.0);
  return 0;
}
