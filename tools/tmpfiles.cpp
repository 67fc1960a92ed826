// nvfs-tmpfiles DIR N [BYTES]: opens N O_TMPFILE files in DIR (each written
// with BYTES bytes, default 0), then closes them all in the order opened,
// as fstests' generic/531 (t_open_tmpfiles) does; prints the time of each
// phase. tools/tmpfiles_bench.sh times the unmount that follows.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "-V") == 0 || std::strcmp(argv[1], "--version") == 0)) {
    std::printf("nvfs-tmpfiles %s\n", NVFS_VERSION);
    return 0;
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DIR N [BYTES]\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  const long n = std::strtol(argv[2], nullptr, 10);
  const long bytes = argc > 3 ? std::strtol(argv[3], nullptr, 10) : 0;
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < static_cast<rlim_t>(n) + 16) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, static_cast<rlim_t>(n) + 16);
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < static_cast<rlim_t>(n) + 16) {
      std::fprintf(stderr, "cannot raise the open-files limit to %ld\n", n + 16);
      return 1;
    }
  }
  const std::string data(static_cast<size_t>(bytes), 'x');
  std::vector<int> fds;
  fds.reserve(static_cast<size_t>(n));
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (long i = 0; i < n; ++i) {
    const int fd = open(dir, O_TMPFILE | O_RDWR, 0644);
    if (fd < 0) {
      std::perror("open O_TMPFILE");
      return 1;
    }
    if (bytes > 0 && write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
      std::perror("write");
      return 1;
    }
    fds.push_back(fd);
  }
  const auto t1 = Clock::now();
  for (int fd : fds) close(fd);
  const auto t2 = Clock::now();
  const auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  std::printf("opened %ld in %.3f s, closed in %.3f s\n", n, secs(t1 - t0), secs(t2 - t1));
  return 0;
}
