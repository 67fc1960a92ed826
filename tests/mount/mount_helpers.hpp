// What the mount suite's files (tests/mount/test_mount_*.cpp, one executable,
// test_mount) share besides the mount itself (mount_fixture.hpp): sizes, an
// owned descriptor, whole-file reads and writes through the mount, stat and
// statfs that REQUIRE success, seeded data, polling, and errors collected
// from worker threads.
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

// Timestamps compare in the global namespace, where Catch's decomposition
// finds them by argument-dependent lookup.
inline bool operator<=(const timespec& a, const timespec& b) {
  return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec <= b.tv_nsec);
}
inline bool operator==(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

namespace nvfs::test {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;

// errno of a failed call, 0 if it succeeded.
inline int Err(long result) { return result < 0 ? errno : 0; }

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0644);
  ~Fd() { Close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  void Close();
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  int error() const { return errno_; }

 private:
  int fd_;
  int errno_;
};

// Creates or truncates `path` and writes `data` (REQUIRE).
void WriteFile(const std::string& path, const std::string& data, mode_t mode = 0644);
// Every byte of `path` (REQUIRE).
std::string ReadAll(const std::string& path);
// Times `needle` occurs in `text` (an strace log's calls).
size_t CountLines(const std::string& text, const std::string& needle);
// lstat(2) and statvfs(3), REQUIRE'd to succeed.
struct stat Stat(const std::string& path);
struct statvfs StatFs(const std::string& path);
// `size` bytes from a generator seeded with `seed`.
std::string Pattern(size_t size, uint64_t seed);
// The names readdir(3) lists, "." and ".." too; REQUIREs that none is listed twice.
std::set<std::string> ListDir(const std::string& path);
int RenameAt2(const std::string& from, const std::string& to, unsigned flags);
// CLOCK_REALTIME, the clock file times come from.
timespec Now();

// Polls `cond` for up to `seconds` (the kernel sends RELEASE and FORGET
// asynchronously after close and unlink).
template <class Cond>
bool Eventually(Cond&& cond, double seconds = 5) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Errors from worker threads (Catch2 assertions are not thread-safe).
class ThreadErrors {
 public:
  // Records `what` and strerror(errno); keeps the first 20.
  void Add(const std::string& what);
  // One CHECK that there were none (each one recorded as its message).
  void Check();

 private:
  std::mutex mu_;
  std::vector<std::string> errors_;
};

}  // namespace nvfs::test
