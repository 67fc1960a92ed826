// nvfs-stress: many threads racing namespace and data operations on a few
// names of a mounted filesystem, so that the kernel's LOOKUP/FORGET/OPEN/
// RELEASE traffic interleaves with creates, unlinks, renames and reads of
// the same inodes. No model: each operation may fail with the errno a race
// explains (ENOENT, EEXIST, ENOTEMPTY, ...); any other errno, or a crash of
// the daemon (ENOTCONN), is a failure. tools/stress.sh mounts a fresh image,
// runs this while dropping the kernel's dentry and inode caches (FORGETs),
// then checks the daemon's exit status and fsck.
//
//   nvfs-stress [-t THREADS] [-D SECONDS] [-n NAMES] [-s SEED] DIR
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr const char* kUsage =
    "Usage: nvfs-stress [-t THREADS] [-D SECONDS] [-n NAMES] [-s SEED] DIR\n"
    "Races create, open/write/read/close, truncate, unlink, rename, link, symlink,\n"
    "mkdir/rmdir, stat and readdir on NAMES names (default 16) in DIR and two\n"
    "subdirectories, from THREADS threads (default 8) for SECONDS (default 10).\n"
    "Exits 1 on an errno no race explains, 0 otherwise.\n";

enum Op { kCreate, kWriteRead, kTruncate, kUnlink, kRename, kLink, kSymlink, kMkdir, kRmdir,
          kStat, kReaddir, kOpCount };
const char* const kOpNames[kOpCount] = {"create", "write+read", "truncate", "unlink", "rename",
                                        "link", "symlink", "mkdir", "rmdir", "stat", "readdir"};

// Errnos a race between these operations explains.
bool Expected(int err) {
  switch (err) {
    case ENOENT: case EEXIST: case ENOTEMPTY: case EISDIR: case ENOTDIR: case EINVAL:
    case EMLINK: case ENOSPC: case EPERM: case EBUSY: case ELOOP:
      return true;
    default:
      return false;
  }
}

struct Tally {
  std::mutex mu;
  std::map<std::pair<int, int>, uint64_t> counts;  // (op, errno or 0) -> times
  std::atomic<uint64_t> unexpected{0};
  void Add(Op op, int err) {
    std::lock_guard lock(mu);
    ++counts[{op, err}];
  }
};

class Worker {
 public:
  Worker(const std::string& dir, uint32_t names, uint64_t seed, Tally& tally)
      : dir_(dir), names_(names), rng_(seed), tally_(tally), buf_(65536, 'x') {}

  void Step() {
    const Op op = static_cast<Op>(rng_() % kOpCount);
    const std::string a = Name(), b = Name();
    int rc = 0;
    switch (op) {
      case kCreate: {
        const int fd = open(a.c_str(), O_CREAT | O_WRONLY | (rng_() % 2 ? O_EXCL : O_TRUNC), 0644);
        rc = fd < 0 ? -1 : close(fd);
        break;
      }
      case kWriteRead: rc = WriteRead(a); break;
      case kTruncate: rc = truncate(a.c_str(), static_cast<off_t>(rng_() % (1 << 20))); break;
      case kUnlink: rc = unlink(a.c_str()); break;
      case kRename: rc = rename(a.c_str(), b.c_str()); break;
      case kLink: rc = link(a.c_str(), b.c_str()); break;
      case kSymlink: rc = symlink(a.c_str(), b.c_str()); break;
      case kMkdir: rc = mkdir(a.c_str(), 0755); break;
      case kRmdir: rc = rmdir(a.c_str()); break;
      case kStat: {
        struct stat st;
        rc = lstat(a.c_str(), &st);
        break;
      }
      case kReaddir: rc = Readdir(); break;
      case kOpCount: break;
    }
    const int err = rc < 0 ? errno : 0;
    tally_.Add(op, err);
    if (err != 0 && !Expected(err)) {
      tally_.unexpected.fetch_add(1);
      std::fprintf(stderr, "nvfs-stress: %s %s: %s\n", kOpNames[op], a.c_str(), std::strerror(err));
    }
  }

 private:
  // One of the names, in DIR or one of its two subdirectories.
  std::string Name() {
    static const char* const kSub[] = {"", "d0/", "d1/"};
    return dir_ + "/" + kSub[rng_() % 3] + "n" + std::to_string(rng_() % names_);
  }

  int WriteRead(const std::string& path) {
    const int fd = open(path.c_str(), O_RDWR);
    if (fd < 0) return -1;
    const size_t len = 1 + rng_() % buf_.size();
    const off_t at = static_cast<off_t>(rng_() % (1 << 20));
    int rc = 0;
    if (pwrite(fd, buf_.data(), len, at) < 0 || pread(fd, buf_.data(), len, at) < 0) rc = -1;
    const int saved = errno;
    close(fd);
    errno = saved;
    return rc;
  }

  int Readdir() {
    DIR* d = opendir((dir_ + (rng_() % 2 ? "/d0" : "")).c_str());
    if (d == nullptr) return -1;
    errno = 0;
    while (readdir(d) != nullptr) {
    }
    const int saved = errno;
    closedir(d);
    errno = saved;
    return saved != 0 ? -1 : 0;
  }

  const std::string dir_;
  const uint32_t names_;
  std::mt19937_64 rng_;
  Tally& tally_;
  std::string buf_;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 8;
  double seconds = 10;
  uint32_t names = 16;
  uint64_t seed = 1;
  int opt;
  static const option kLong[] = {{"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {nullptr, 0, nullptr, 0}};
  while ((opt = getopt_long(argc, argv, "t:D:n:s:hV", kLong, nullptr)) != -1) {
    switch (opt) {
      case 't': threads = std::atoi(optarg); break;
      case 'D': seconds = std::atof(optarg); break;
      case 'n': names = static_cast<uint32_t>(std::strtoul(optarg, nullptr, 10)); break;
      case 's': seed = std::strtoull(optarg, nullptr, 10); break;
      case 'h': std::fputs(kUsage, stdout); return 0;
      case 'V': std::printf("nvfs-stress %s\n", NVFS_VERSION); return 0;
      default: std::fputs(kUsage, stderr); return 2;
    }
  }
  if (optind + 1 != argc || threads < 1 || threads > 256 || names < 1 || seconds <= 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string dir = argv[optind];
  for (const char* sub : {"/d0", "/d1"}) {
    if (mkdir((dir + sub).c_str(), 0755) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "nvfs-stress: %s%s: %s\n", dir.c_str(), sub, std::strerror(errno));
      return 2;
    }
  }

  Tally tally;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ops{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Worker w(dir, names, seed * 1000003 + static_cast<uint64_t>(t), tally);
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        w.Step();
        ++n;
      }
      ops += n;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : pool) th.join();

  std::printf("nvfs-stress: %" PRIu64 " operations on %d threads in %.1f s\n", ops.load(), threads,
              seconds);
  for (int op = 0; op < kOpCount; ++op) {
    std::string line;
    for (const auto& [key, count] : tally.counts) {
      if (key.first != op) continue;
      line += "  " + std::string(key.second == 0 ? "ok" : std::strerror(key.second)) + " " +
              std::to_string(count);
    }
    std::printf("  %-10s%s\n", kOpNames[op], line.c_str());
  }
  if (tally.unexpected != 0) {
    std::printf("nvfs-stress: %" PRIu64 " unexpected errors\n", tally.unexpected.load());
    return 1;
  }
  return 0;
}
