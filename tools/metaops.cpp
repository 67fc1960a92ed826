// nvfs-metaops: per-operation metadata costs through any mounted file
// system, for tools/bench_meta.py (no interpreter in the timed loop).
//
//   nvfs-metaops create DIR N      open(O_CREAT|O_EXCL) + close of DIR/f<i>
//   nvfs-metaops stat DIR N        lstat of DIR/f<i>
//   nvfs-metaops unlink DIR N      unlink of DIR/f<i>
//   nvfs-metaops append FILE N     N appends of 4 KiB, each followed by fsync
//
// Prints one line: the operation, N, the total seconds and the time per
// operation in microseconds. Exit 1 if an operation fails (with its errno).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int Fail(const char* what, const std::string& path) {
  std::fprintf(stderr, "nvfs-metaops: %s %s: %s\n", what, path.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "-V") == 0 || std::strcmp(argv[1], "--version") == 0)) {
    std::printf("nvfs-metaops %s\n", NVFS_VERSION);
    return 0;
  }
  if (argc != 4) {
    std::fprintf(stderr, "usage: nvfs-metaops create|stat|unlink DIR N | append FILE N\n");
    return 2;
  }
  const std::string op = argv[1];
  const std::string where = argv[2];
  const long n = std::strtol(argv[3], nullptr, 10);
  if (n <= 0) {
    std::fprintf(stderr, "nvfs-metaops: N must be positive\n");
    return 2;
  }
  // Paths built before the clock starts.
  std::vector<std::string> paths;
  if (op != "append") {
    paths.reserve(static_cast<size_t>(n));
    for (long i = 0; i < n; ++i) paths.push_back(where + "/f" + std::to_string(i));
  }
  char block[4096];
  std::memset(block, 'a', sizeof block);
  int append_fd = -1;
  if (op == "append") {
    append_fd = open(where.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (append_fd < 0) return Fail("open", where);
  }
  const auto start = std::chrono::steady_clock::now();
  if (op == "create") {
    for (const std::string& p : paths) {
      const int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) return Fail("create", p);
      close(fd);
    }
  } else if (op == "stat") {
    struct stat st;
    for (const std::string& p : paths) {
      if (lstat(p.c_str(), &st) != 0) return Fail("lstat", p);
    }
  } else if (op == "unlink") {
    for (const std::string& p : paths) {
      if (unlink(p.c_str()) != 0) return Fail("unlink", p);
    }
  } else if (op == "append") {
    for (long i = 0; i < n; ++i) {
      if (write(append_fd, block, sizeof block) != static_cast<ssize_t>(sizeof block)) {
        return Fail("write", where);
      }
      if (fsync(append_fd) != 0) return Fail("fsync", where);
    }
  } else {
    std::fprintf(stderr, "nvfs-metaops: unknown operation %s\n", op.c_str());
    return 2;
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (append_fd >= 0) close(append_fd);
  std::printf("%s %ld %.6f %.3f\n", op.c_str(), n, s, s * 1e6 / static_cast<double>(n));
  return 0;
}
