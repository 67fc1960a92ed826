// The mount suite's shared helpers (mount_helpers.hpp).
#include "mount_helpers.hpp"

#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

namespace nvfs::test {

Fd::Fd(const std::string& path, int flags, mode_t mode)
    : fd_(open(path.c_str(), flags | O_CLOEXEC, mode)), errno_(fd_ < 0 ? errno : 0) {}

void Fd::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void WriteFile(const std::string& path, const std::string& data, mode_t mode) {
  Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  INFO(path << ": " << std::strerror(fd.error()));
  REQUIRE(fd.ok());
  REQUIRE(write(fd.get(), data.data(), data.size()) == static_cast<ssize_t>(data.size()));
}

size_t CountLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::string ReadAll(const std::string& path) {
  Fd fd(path, O_RDONLY);
  INFO(path << ": " << std::strerror(fd.error()));
  REQUIRE(fd.ok());
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd.get(), buf, sizeof buf);
    REQUIRE(n >= 0);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct stat Stat(const std::string& path) {
  struct stat st {};
  INFO(path);
  REQUIRE(lstat(path.c_str(), &st) == 0);
  return st;
}

struct statvfs StatFs(const std::string& path) {
  struct statvfs sv {};
  REQUIRE(statvfs(path.c_str(), &sv) == 0);
  return sv;
}

std::string Pattern(size_t size, uint64_t seed) {
  std::string s(size, '\0');
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&s[i], &v, std::min<size_t>(8, size - i));
  }
  return s;
}

std::set<std::string> ListDir(const std::string& path) {
  std::set<std::string> names;
  DIR* d = opendir(path.c_str());
  REQUIRE(d != nullptr);
  size_t count = 0;
  while (dirent* e = readdir(d)) {
    names.insert(e->d_name);
    ++count;
  }
  closedir(d);
  REQUIRE(count == names.size());  // no name listed twice
  return names;
}

int RenameAt2(const std::string& from, const std::string& to, unsigned flags) {
  return static_cast<int>(
      syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags));
}

timespec Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts;
}

void ThreadErrors::Add(const std::string& what) {
  std::lock_guard lock(mu_);
  if (errors_.size() < 20) errors_.push_back(what + ": " + std::strerror(errno));
}

void ThreadErrors::Check() {
  for (const std::string& e : errors_) INFO(e);
  INFO((errors_.empty() ? std::string() : errors_.front()));
  CHECK(errors_.empty());
}

}  // namespace nvfs::test
