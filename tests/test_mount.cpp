// The mount suite: the nvfs daemon on a real FUSE mount, driven through
// ordinary system calls, each test on its own freshly formatted image
// (tests/mount_fixture.hpp). Skipped, loudly, where /dev/fuse is absent.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/aio_abi.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mount_fixture.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "test_util.hpp"

// Timestamps compare in the global namespace, where Catch's decomposition
// finds them by argument-dependent lookup.
inline bool operator<=(const timespec& a, const timespec& b) {
  return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec <= b.tv_nsec);
}
inline bool operator==(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

namespace nvfs::test {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;

// errno of a failed call, 0 if it succeeded.
int Err(long result) { return result < 0 ? errno : 0; }

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0644)
      : fd_(open(path.c_str(), flags | O_CLOEXEC, mode)), errno_(fd_ < 0 ? errno : 0) {}
  ~Fd() { Close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  int error() const { return errno_; }

 private:
  int fd_;
  int errno_;
};

void WriteFile(const std::string& path, const std::string& data, mode_t mode = 0644) {
  Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  INFO(path << ": " << std::strerror(fd.error()));
  REQUIRE(fd.ok());
  REQUIRE(write(fd.get(), data.data(), data.size()) == static_cast<ssize_t>(data.size()));
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

using nvfs::test::BecomeNobody;

// Errors from worker threads (Catch2 assertions are not thread-safe).
class ThreadErrors {
 public:
  void Add(const std::string& what) {
    std::lock_guard lock(mu_);
    if (errors_.size() < 20) errors_.push_back(what + ": " + std::strerror(errno));
  }
  void Check() {
    for (const std::string& e : errors_) INFO(e);
    INFO((errors_.empty() ? std::string() : errors_.front()));
    CHECK(errors_.empty());
  }

 private:
  std::mutex mu_;
  std::vector<std::string> errors_;
};

// ---------------------------------------------------------------------------

TEST_CASE("mount: errno table for misuse", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  const std::string f = m.path("file"), d = m.path("dir"), missing = m.path("missing");
  WriteFile(f, "x");
  REQUIRE(mkdir(d.c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("dir/sub").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("empty").c_str(), 0755) == 0);
  WriteFile(m.path("dir/inner"), "y");

  // ENOENT
  CHECK(Err(open(missing.c_str(), O_RDONLY)) == ENOENT);
  CHECK(Err(access(missing.c_str(), F_OK)) == ENOENT);
  CHECK(Err(unlink(missing.c_str())) == ENOENT);
  CHECK(Err(rmdir(missing.c_str())) == ENOENT);
  CHECK(Err(rename(missing.c_str(), m.path("other").c_str())) == ENOENT);
  CHECK(Err(open(m.path("missing/x").c_str(), O_CREAT | O_WRONLY, 0644)) == ENOENT);
  CHECK(Err(link(missing.c_str(), m.path("l").c_str())) == ENOENT);
  char buf[64];
  CHECK(Err(readlink(missing.c_str(), buf, sizeof buf)) == ENOENT);
  // EEXIST
  CHECK(Err(mkdir(d.c_str(), 0755)) == EEXIST);
  CHECK(Err(mkdir(f.c_str(), 0755)) == EEXIST);
  CHECK(Err(open(f.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644)) == EEXIST);
  CHECK(Err(link(f.c_str(), m.path("dir/inner").c_str())) == EEXIST);
  CHECK(Err(symlink("t", f.c_str())) == EEXIST);
  CHECK(Err(mknod(f.c_str(), S_IFIFO | 0644, 0)) == EEXIST);
  // ENOTDIR
  CHECK(Err(open(m.path("file/x").c_str(), O_RDONLY)) == ENOTDIR);
  CHECK(Err(mkdir(m.path("file/x").c_str(), 0755)) == ENOTDIR);
  CHECK(Err(rmdir(f.c_str())) == ENOTDIR);
  CHECK(Err(open(f.c_str(), O_RDONLY | O_DIRECTORY)) == ENOTDIR);
  CHECK(Err(rename(m.path("empty").c_str(), f.c_str())) == ENOTDIR);
  // EISDIR
  CHECK(Err(open(d.c_str(), O_WRONLY)) == EISDIR);
  CHECK(Err(open(d.c_str(), O_RDWR)) == EISDIR);
  CHECK(Err(unlink(d.c_str())) == EISDIR);
  CHECK(Err(rename(f.c_str(), m.path("empty").c_str())) == EISDIR);
  // ENOTEMPTY
  CHECK(Err(rmdir(d.c_str())) == ENOTEMPTY);
  CHECK(Err(rename(m.path("empty").c_str(), d.c_str())) == ENOTEMPTY);
  // ENAMETOOLONG: 255 bytes is the limit.
  const std::string name255(255, 'n'), name256(256, 'n');
  WriteFile(m.path(name255), "ok");
  CHECK(ReadAll(m.path(name255)) == "ok");
  CHECK(Err(open(m.path(name256).c_str(), O_CREAT | O_WRONLY, 0644)) == ENAMETOOLONG);
  CHECK(Err(mkdir(m.path(name256).c_str(), 0755)) == ENAMETOOLONG);
  CHECK(Err(access(m.path(name256).c_str(), F_OK)) == ENAMETOOLONG);
  CHECK(Err(rename(f.c_str(), m.path(name256).c_str())) == ENAMETOOLONG);
  // EINVAL: a directory into its own subtree; readlink of a non-symlink.
  CHECK(Err(rename(d.c_str(), m.path("dir/sub/d").c_str())) == EINVAL);
  CHECK(Err(rename(d.c_str(), m.path("dir/d").c_str())) == EINVAL);
  CHECK(Err(readlink(f.c_str(), buf, sizeof buf)) == EINVAL);
  CHECK(Err(rmdir(m.path("dir/.").c_str())) == EINVAL);
  // EPERM: hard links to directories.
  CHECK(Err(link(d.c_str(), m.path("dlink").c_str())) == EPERM);
  // EXDEV: across filesystems (decided by the kernel, not the daemon).
  const std::string outside = "/dev/shm/nvfs-mt-xdev-" + std::to_string(getpid());
  CHECK(Err(rename(f.c_str(), outside.c_str())) == EXDEV);
  CHECK(Err(link(f.c_str(), outside.c_str())) == EXDEV);
  // ELOOP
  REQUIRE(symlink("loop2", m.path("loop1").c_str()) == 0);
  REQUIRE(symlink("loop1", m.path("loop2").c_str()) == 0);
  CHECK(Err(open(m.path("loop1").c_str(), O_RDONLY)) == ELOOP);
  REQUIRE(symlink("file", m.path("tofile").c_str()) == 0);
  CHECK(Err(open(m.path("tofile").c_str(), O_RDONLY | O_NOFOLLOW)) == ELOOP);
  // EBADF: the access mode of the descriptor.
  {
    Fd ro(f, O_RDONLY), wo(f, O_WRONLY);
    REQUIRE(ro.ok());
    REQUIRE(wo.ok());
    CHECK(Err(write(ro.get(), "z", 1)) == EBADF);
    CHECK(Err(read(wo.get(), buf, 1)) == EBADF);
    // ENXIO: SEEK_DATA and SEEK_HOLE at or past the end.
    CHECK(Err(lseek(ro.get(), 100, SEEK_DATA)) == ENXIO);
    CHECK(Err(lseek(ro.get(), 1, SEEK_HOLE)) == ENXIO);
    CHECK(Err(ftruncate(wo.get(), -1)) == EINVAL);
    // fallocate modes nvfs does not have; a read-only descriptor.
    CHECK(Err(fallocate(wo.get(), FALLOC_FL_COLLAPSE_RANGE, 0, 4096)) == EOPNOTSUPP);
    CHECK(Err(fallocate(wo.get(), FALLOC_FL_INSERT_RANGE, 0, 4096)) == EOPNOTSUPP);
    CHECK(Err(fallocate(ro.get(), 0, 0, 4096)) == EBADF);
  }
  // An unknown xattr namespace.
  CHECK(Err(setxattr(f.c_str(), "bogus.name", "v", 1, 0)) == EOPNOTSUPP);
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: permissions with default_permissions and a second uid", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "allow_other", "allow_other,cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  REQUIRE(chmod(m.dir().c_str(), 0755) == 0);
  WriteFile(m.path("public"), "public data", 0644);
  REQUIRE(chmod(m.path("public").c_str(), 0644) == 0);
  WriteFile(m.path("secret"), "secret", 0600);
  REQUIRE(chmod(m.path("secret").c_str(), 0600) == 0);
  REQUIRE(mkdir(m.path("rootdir").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("shared").c_str(), 01777) == 0);
  REQUIRE(chmod(m.path("shared").c_str(), 01777) == 0);
  WriteFile(m.path("shared/rootfile"), "r");
  WriteFile(m.path("given"), "");
  REQUIRE(chown(m.path("given").c_str(), 65534, 65534) == 0);
  WriteFile(m.path("setid"), "");
  REQUIRE(chown(m.path("setid").c_str(), 65534, 65534) == 0);
  REQUIRE(chmod(m.path("setid").c_str(), 06755) == 0);
  WriteFile(m.path("setid-chown"), "");
  REQUIRE(chmod(m.path("setid-chown").c_str(), 06755) == 0);
  REQUIRE(chown(m.path("setid-chown").c_str(), 1, 1) == 0);  // chown clears both bits
  CHECK((Stat(m.path("setid-chown")).st_mode & 07777) == 0755);

  const int failed_step = RunInChild([&]() -> int {
    if (!BecomeNobody()) {
      return 100;
    }
    int step = 0;
    auto expect = [&step](bool ok) {
      ++step;
      return ok;
    };
    char buf[64];
    // Can read a 0644 root file, cannot write it.
    int fd = open(m.path("public").c_str(), O_RDONLY);
    if (!expect(fd >= 0)) return step;
    const ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (!expect(n == 11 && std::memcmp(buf, "public data", 11) == 0)) return step;
    if (!expect(Err(open(m.path("public").c_str(), O_WRONLY)) == EACCES)) return step;
    if (!expect(Err(truncate(m.path("public").c_str(), 0)) == EACCES)) return step;
    if (!expect(Err(access(m.path("public").c_str(), W_OK)) == EACCES)) return step;
    if (!expect(access(m.path("public").c_str(), R_OK) == 0)) return step;
    if (!expect(Err(open(m.path("secret").c_str(), O_RDONLY)) == EACCES)) return step;
    // Cannot create in, or remove from, a 0755 root directory.
    if (!expect(Err(open(m.path("rootdir/new").c_str(), O_CREAT | O_WRONLY, 0644)) == EACCES)) {
      return step;
    }
    if (!expect(Err(mkdir(m.path("rootdir/d").c_str(), 0755)) == EACCES)) return step;
    if (!expect(Err(unlink(m.path("public").c_str())) == EACCES)) return step;
    if (!expect(Err(rename(m.path("public").c_str(), m.path("p2").c_str())) == EACCES)) {
      return step;
    }
    // Not the owner: no chmod, chown, explicit times or user xattrs.
    if (!expect(Err(chmod(m.path("public").c_str(), 0666)) == EPERM)) return step;
    if (!expect(Err(chown(m.path("public").c_str(), 65534, 65534)) == EPERM)) return step;
    const timespec times[2] = {{1, 0}, {2, 0}};
    if (!expect(Err(utimensat(AT_FDCWD, m.path("public").c_str(), times, 0)) == EPERM)) {
      return step;
    }
    if (!expect(Err(setxattr(m.path("public").c_str(), "user.x", "1", 1, 0)) == EACCES)) {
      return step;
    }
    // A sticky world-writable directory: may create, may not remove root's file.
    fd = open(m.path("shared/mine").c_str(), O_CREAT | O_WRONLY, 0644);
    if (!expect(fd >= 0)) return step;
    close(fd);
    struct stat st {};
    if (!expect(stat(m.path("shared/mine").c_str(), &st) == 0 && st.st_uid == 65534 &&
                st.st_gid == 65534)) {
      return step;
    }
    if (!expect(Err(unlink(m.path("shared/rootfile").c_str())) == EPERM)) return step;
    if (!expect(unlink(m.path("shared/mine").c_str()) == 0)) return step;
    // A file given to this uid: writable, and its mode is ours to change.
    fd = open(m.path("given").c_str(), O_WRONLY);
    if (!expect(fd >= 0)) return step;
    const bool wrote = write(fd, "mine", 4) == 4;
    close(fd);
    if (!expect(wrote)) return step;
    if (!expect(chmod(m.path("given").c_str(), 0600) == 0)) return step;
    // A write by an unprivileged owner clears set-user-ID and set-group-ID.
    fd = open(m.path("setid").c_str(), O_WRONLY);
    if (!expect(fd >= 0)) return step;
    const bool wrote_setid = write(fd, "x", 1) == 1;
    close(fd);
    if (!expect(wrote_setid)) return step;
    if (!expect(stat(m.path("setid").c_str(), &st) == 0 && (st.st_mode & 07777) == 0755)) {
      return step;
    }
    return 0;
  });
  INFO("first failed step in the child (100: could not change uid): " << failed_step);
  CHECK(failed_step == 0);
  CHECK(ReadAll(m.path("public")) == "public data");
  CHECK(ReadAll(m.path("given")) == "mine");
  CHECK(PathExists(m.path("shared/rootfile")));
  CHECK(m.Stop() == 0);
}

// The namespace is the boundary (doc/integrity.md): a user the mount refuses
// a file must not get its bytes from the image instead. mkfs.nvfs -s made
// images 0644, and uid 65534 read a 0600 file's secret out of the image.
TEST_CASE("mount: a 0600 file's bytes cannot be read by another user through the image "
          "mkfs.nvfs -s made", "[mount][namespace]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m(64 * kMiB);
  m.Start("allow_other");  // so the mount itself lets uid 65534 in, and only the modes refuse
  REQUIRE(chmod(m.dir().c_str(), 0755) == 0);
  const std::string secret = "nvfs-secret-" + std::to_string(getpid()) + "-" +
                             std::to_string(std::random_device{}());
  WriteFile(m.path("secret"), secret, 0600);
  REQUIRE(chmod(m.path("secret").c_str(), 0600) == 0);
  REQUIRE(ReadAll(m.path("secret")) == secret);

  // The child's answer: 0 both refused with EACCES; 1 the image opened and
  // held the secret; 2 the image opened, no secret in it; 3 the image
  // refused with another errno; 4 the file through the mount not refused
  // with EACCES; 100 could not become uid 65534.
  const int outcome = RunInChild([&]() -> int {
    if (!BecomeNobody()) return 100;
    const int fd = open(m.image().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      std::string bytes;
      char buf[1 << 16];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) bytes.append(buf, static_cast<size_t>(n));
      close(fd);
      return bytes.find(secret) != std::string::npos ? 1 : 2;
    }
    if (errno != EACCES) return 3;
    if (Err(open(m.path("secret").c_str(), O_RDONLY | O_CLOEXEC)) != EACCES) return 4;
    return 0;
  });
  INFO("uid 65534: 0 refused both; 1 read the secret out of the image; 2 opened the image; "
       "3 the image refused with an errno other than EACCES; 4 the file through the mount not "
       "refused; 100 could not change uid: got " << outcome);
  CHECK(outcome == 0);
  CHECK((Stat(m.image()).st_mode & 07777) == 0600);
  CHECK(m.Stop() == 0);
}

// The daemon says, in one line, what an image every user can read exposes
// and how to close it; a group is the administrator's choice and is not
// warned about.
TEST_CASE("mount: the daemon warns in one line about an image every user can read",
          "[mount][namespace]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m(64 * kMiB);
  REQUIRE(chmod(m.image().c_str(), 0644) == 0);
  m.Start();
  CHECK(m.Stop() == 0);
  const auto warnings = [&] {
    std::vector<std::string> found;
    for (const std::string& line : Lines(m.log())) {
      if (line.find("warning") != std::string::npos) found.push_back(line);
    }
    return found;
  };
  INFO("daemon log: " << m.log());
  const std::vector<std::string> first = warnings();
  REQUIRE(first.size() == 1);
  CHECK(first[0] == "nvfs: warning: " + m.image() +
                        " can be read by every user, who can then read every file in it "
                        "whatever its permissions; chmod o-rw " + m.image());

  REQUIRE(chmod(m.image().c_str(), 0640) == 0);
  m.Start();
  CHECK(m.Stop() == 0);
  CHECK(warnings().size() == 1);  // the log is appended to: still the first mount's one
}

// A valid security.capability value (VFS_CAP_REVISION_2, cap_net_raw
// permitted and effective): the kernel checks the format on setxattr.
std::string CapabilityValue() {
  const uint32_t words[5] = {0x02000001u, 1u << 13, 0, 0, 0};
  return std::string(reinterpret_cast<const char*>(words), sizeof words);
}

// Privileges are dropped by every change of a file's bytes by a caller
// without CAP_FSETID — write, truncate, O_TRUNC, fallocate, punch, zero
// range — in both cache modes, set-user-ID, group-executable set-group-ID
// and security.capability alike; root keeps the mode bits. On the old code
// a truncate or fallocate by uid 65534 kept the bits, and no direct write
// removed the capability.
TEST_CASE("mount: a change by an unprivileged caller drops set-user-ID, set-group-ID and "
          "capabilities", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "allow_other", "allow_other,cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  REQUIRE(chmod(m.dir().c_str(), 0755) == 0);
  const std::string cap = CapabilityValue();
  const auto prepare = [&](const std::string& name, uid_t owner) {
    WriteFile(m.path(name), std::string(8192, 'p'));
    REQUIRE(chown(m.path(name).c_str(), owner, owner) == 0);
    REQUIRE(chmod(m.path(name).c_str(), 06755) == 0);
    INFO(name << ": " << std::strerror(errno));
    REQUIRE(setxattr(m.path(name).c_str(), "security.capability", cap.data(), cap.size(), 0) == 0);
  };
  const auto has_cap = [&](const std::string& name) {
    char buf[64];
    return getxattr(m.path(name).c_str(), "security.capability", buf, sizeof buf) > 0;
  };
  // name -> what the caller does to it (0 on success).
  const std::vector<std::pair<std::string, std::function<int(const std::string&)>>> changes = {
      {"write", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY);
         const int rc = fd >= 0 && pwrite(fd, "w", 1, 100) == 1 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
      {"append", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY | O_APPEND);
         const int rc = fd >= 0 && write(fd, "a", 1) == 1 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
      {"truncate", [](const std::string& p) { return truncate(p.c_str(), 100) == 0 ? 0 : 1; }},
      {"otrunc", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY | O_TRUNC);
         if (fd >= 0) close(fd);
         return fd >= 0 ? 0 : 1;
       }},
      {"fallocate", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY);
         const int rc = fd >= 0 && fallocate(fd, 0, 0, 65536) == 0 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
      {"punch", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY);
         const int rc = fd >= 0 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                             4096) == 0 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
      {"zero", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY);
         const int rc = fd >= 0 && fallocate(fd, FALLOC_FL_ZERO_RANGE, 0, 4096) == 0 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
  };
  for (const auto& [name, change] : changes) {
    prepare("user-" + name, 65534);
    prepare("root-" + name, 0);
    REQUIRE(chmod(m.path("root-" + name).c_str(), 06757) == 0);  // others may write
  }
  const int failed = RunInChild([&]() -> int {
    if (!BecomeNobody()) {
      return 100;
    }
    int step = 0;
    for (const auto& [name, change] : changes) {
      ++step;
      if (change(m.path("user-" + name)) != 0) return step;
    }
    return 0;
  });
  INFO("first failed change in the child (100: could not change uid): " << failed);
  REQUIRE(failed == 0);
  for (const auto& [name, change] : changes) {
    INFO(name);
    CHECK((Stat(m.path("user-" + name)).st_mode & 07777) == 0755);
    CHECK_FALSE(has_cap("user-" + name));
    // Root (CAP_FSETID) keeps the bits; file capabilities go whoever
    // changes the file, as on every local filesystem.
    REQUIRE(change(m.path("root-" + name)) == 0);
    CHECK((Stat(m.path("root-" + name)).st_mode & 07777) == 06757);
    CHECK_FALSE(has_cap("root-" + name));
  }
  // Set-group-ID without group execution marks mandatory locking: it stays.
  prepare("lock", 65534);
  REQUIRE(chmod(m.path("lock").c_str(), 02745) == 0);
  const int lock_failed = RunInChild([&]() -> int {
    if (!BecomeNobody()) {
      return 100;
    }
    return changes[0].second(m.path("lock"));
  });
  REQUIRE(lock_failed == 0);
  CHECK((Stat(m.path("lock")).st_mode & 07777) == 02745);
  CHECK_FALSE(has_cap("lock"));
  // ... but not for a caller outside the file's group (the kernel's
  // setattr_should_drop_sgid; fstests generic/683-685): a write, truncate
  // or fallocate by nobody of a root:root file clears it.
  for (const size_t i : {size_t{0}, size_t{2}, size_t{4}}) {
    const std::string name = "outsider-" + changes[i].first;
    prepare(name, 0);
    REQUIRE(chmod(m.path(name).c_str(), 02646) == 0);  // others may write
    const int outsider_failed = RunInChild([&]() -> int {
      if (!BecomeNobody()) return 100;
      return changes[i].second(m.path(name));
    });
    INFO(name);
    REQUIRE(outsider_failed == 0);
    CHECK((Stat(m.path(name)).st_mode & 07777) == 0646);
  }
  CHECK(m.Stop() == 0);
  const FsckResult fsck = FsckImage(m.image());
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
}

TEST_CASE("mount: hard links and link counts", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  WriteFile(m.path("a"), "abc");
  const struct stat a0 = Stat(m.path("a"));
  CHECK(a0.st_nlink == 1);
  REQUIRE(link(m.path("a").c_str(), m.path("b").c_str()) == 0);
  REQUIRE(link(m.path("a").c_str(), m.path("d/c").c_str()) == 0);
  for (const char* name : {"a", "b", "d/c"}) {
    const struct stat st = Stat(m.path(name));
    CHECK(st.st_ino == a0.st_ino);
    CHECK(st.st_nlink == 3);
  }
  {
    Fd fd(m.path("d/c"), O_WRONLY | O_APPEND);
    REQUIRE(fd.ok());
    REQUIRE(write(fd.get(), "def", 3) == 3);
  }
  CHECK(ReadAll(m.path("a")) == "abcdef");
  REQUIRE(unlink(m.path("b").c_str()) == 0);
  CHECK(Stat(m.path("a")).st_nlink == 2);
  CHECK(Stat(m.path("d/c")).st_nlink == 2);
  REQUIRE(unlink(m.path("a").c_str()) == 0);
  CHECK(Stat(m.path("d/c")).st_nlink == 1);
  CHECK(ReadAll(m.path("d/c")) == "abcdef");
  // Many links to one inode.
  for (int i = 0; i < 100; ++i) {
    REQUIRE(link(m.path("d/c").c_str(), m.path("d/l" + std::to_string(i)).c_str()) == 0);
  }
  CHECK(Stat(m.path("d/c")).st_nlink == 101);
  for (int i = 0; i < 100; ++i) REQUIRE(unlink(m.path("d/l" + std::to_string(i)).c_str()) == 0);
  CHECK(Stat(m.path("d/c")).st_nlink == 1);

  // Directory link counts: 2 + subdirectories.
  REQUIRE(mkdir(m.path("p").c_str(), 0755) == 0);
  CHECK(Stat(m.path("p")).st_nlink == 2);
  const nlink_t root_links = Stat(m.dir()).st_nlink;
  REQUIRE(mkdir(m.path("p/s1").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("p/s2").c_str(), 0755) == 0);
  CHECK(Stat(m.path("p")).st_nlink == 4);
  REQUIRE(rmdir(m.path("p/s1").c_str()) == 0);
  CHECK(Stat(m.path("p")).st_nlink == 3);
  REQUIRE(mkdir(m.path("q").c_str(), 0755) == 0);
  CHECK(Stat(m.dir()).st_nlink == root_links + 1);
  REQUIRE(rmdir(m.path("q").c_str()) == 0);
  CHECK(Stat(m.dir()).st_nlink == root_links);
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: symlinks", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  char buf[5000];
  REQUIRE(symlink("target", m.path("s").c_str()) == 0);
  ssize_t n = readlink(m.path("s").c_str(), buf, sizeof buf);
  REQUIRE(n == 6);
  CHECK(std::string(buf, 6) == "target");
  struct stat st = Stat(m.path("s"));
  CHECK(S_ISLNK(st.st_mode));
  CHECK(st.st_size == 6);
  CHECK(Err(stat(m.path("s").c_str(), &st)) == ENOENT);  // dangling
  WriteFile(m.path("target"), "through the link");
  CHECK(ReadAll(m.path("s")) == "through the link");
  // Targets past the inline limit, up to the maximum.
  for (size_t len : {129, 1000, 4095}) {
    std::string target(len, 'x');
    for (size_t i = 0; i < len; i += 50) target[i] = '/';
    const std::string name = m.path("long" + std::to_string(len));
    REQUIRE(symlink(target.c_str(), name.c_str()) == 0);
    n = readlink(name.c_str(), buf, sizeof buf);
    REQUIRE(n == static_cast<ssize_t>(len));
    CHECK(std::string(buf, len) == target);
    CHECK(Stat(name).st_size == static_cast<off_t>(len));
  }
  CHECK(Err(symlink(std::string(4096, 'y').c_str(), m.path("toolong").c_str())) == ENAMETOOLONG);
  // Through a directory symlink, and to an absolute path outside.
  REQUIRE(mkdir(m.path("dir").c_str(), 0755) == 0);
  WriteFile(m.path("dir/f"), "inside");
  REQUIRE(symlink("dir", m.path("sd").c_str()) == 0);
  CHECK(ReadAll(m.path("sd/f")) == "inside");
  REQUIRE(symlink("/proc/self/exe", m.path("abs").c_str()) == 0);
  CHECK(Stat(m.path("abs")).st_size == 14);
  // Removing the link leaves the target.
  REQUIRE(unlink(m.path("s").c_str()) == 0);
  CHECK(ReadAll(m.path("target")) == "through the link");
  // lchown on the link itself.
  REQUIRE(lchown(m.path("sd").c_str(), 123, 456) == 0);
  CHECK(Stat(m.path("sd")).st_uid == 123);
  CHECK(Stat(m.path("dir")).st_uid == 0);
  CHECK(m.Stop() == 0);
  m.Start();
  n = readlink(m.path("long4095").c_str(), buf, sizeof buf);
  CHECK(n == 4095);
  CHECK(ReadAll(m.path("sd/f")) == "inside");
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: rename in every form", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  auto p = [&](const std::string& rel) { return m.path(rel); };

  // A new name in the same directory.
  WriteFile(p("a"), "A");
  const ino_t a_ino = Stat(p("a")).st_ino;
  REQUIRE(rename(p("a").c_str(), p("b").c_str()) == 0);
  CHECK_FALSE(PathExists(p("a")));
  CHECK(Stat(p("b")).st_ino == a_ino);
  CHECK(ReadAll(p("b")) == "A");

  // Over an existing file, which lives on while open.
  WriteFile(p("x"), "X");
  WriteFile(p("y"), "Y");
  {
    Fd old_y(p("y"), O_RDONLY);
    REQUIRE(old_y.ok());
    REQUIRE(rename(p("x").c_str(), p("y").c_str()) == 0);
    CHECK_FALSE(PathExists(p("x")));
    CHECK(ReadAll(p("y")) == "X");
    char c = 0;
    CHECK(pread(old_y.get(), &c, 1, 0) == 1);
    CHECK(c == 'Y');
    struct stat st {};
    REQUIRE(fstat(old_y.get(), &st) == 0);
    CHECK(st.st_nlink == 0);
  }

  // Over an empty directory.
  REQUIRE(mkdir(p("d1").c_str(), 0755) == 0);
  REQUIRE(mkdir(p("d2").c_str(), 0755) == 0);
  WriteFile(p("d1/f"), "in d1");
  const ino_t d1_ino = Stat(p("d1")).st_ino;
  const nlink_t root_links = Stat(m.dir()).st_nlink;
  REQUIRE(rename(p("d1").c_str(), p("d2").c_str()) == 0);
  CHECK(Stat(p("d2")).st_ino == d1_ino);
  CHECK_FALSE(PathExists(p("d1")));
  CHECK(ReadAll(p("d2/f")) == "in d1");
  CHECK(Stat(m.dir()).st_nlink == root_links - 1);

  // Across directories: a file and a directory (whose ".." follows).
  REQUIRE(mkdir(p("A").c_str(), 0755) == 0);
  REQUIRE(mkdir(p("B").c_str(), 0755) == 0);
  REQUIRE(mkdir(p("A/sub").c_str(), 0755) == 0);
  WriteFile(p("A/f"), "moved");
  REQUIRE(rename(p("A/f").c_str(), p("B/g").c_str()) == 0);
  CHECK(ReadAll(p("B/g")) == "moved");
  CHECK(Stat(p("A")).st_nlink == 3);
  REQUIRE(rename(p("A/sub").c_str(), p("B/sub2").c_str()) == 0);
  CHECK(Stat(p("A")).st_nlink == 2);
  CHECK(Stat(p("B")).st_nlink == 3);
  CHECK(Stat(p("B/sub2/..")).st_ino == Stat(p("B")).st_ino);
  CHECK(ListDir(p("A")) == std::set<std::string>{".", ".."});
  CHECK(ListDir(p("B")) == std::set<std::string>{".", "..", "g", "sub2"});

  // RENAME_NOREPLACE
  WriteFile(p("n1"), "1");
  WriteFile(p("n2"), "2");
  CHECK(Err(RenameAt2(p("n1"), p("n2"), RENAME_NOREPLACE)) == EEXIST);
  CHECK(ReadAll(p("n2")) == "2");
  REQUIRE(RenameAt2(p("n1"), p("n3"), RENAME_NOREPLACE) == 0);
  CHECK(ReadAll(p("n3")) == "1");

  // RENAME_EXCHANGE: a file and a directory, then two directories across
  // parents (each ".." follows, the parents' link counts stay).
  WriteFile(p("e1"), "one");
  REQUIRE(mkdir(p("e2").c_str(), 0755) == 0);
  WriteFile(p("e2/child"), "c");
  REQUIRE(RenameAt2(p("e1"), p("e2"), RENAME_EXCHANGE) == 0);
  CHECK(S_ISDIR(Stat(p("e1")).st_mode));
  CHECK(ReadAll(p("e1/child")) == "c");
  CHECK(ReadAll(p("e2")) == "one");
  CHECK(Err(RenameAt2(p("e2"), p("nothing"), RENAME_EXCHANGE)) == ENOENT);
  CHECK(Err(RenameAt2(p("e2"), p("e1"), RENAME_EXCHANGE | RENAME_NOREPLACE)) == EINVAL);
  REQUIRE(mkdir(p("A/x").c_str(), 0755) == 0);
  REQUIRE(mkdir(p("B/y").c_str(), 0755) == 0);
  const nlink_t a_links = Stat(p("A")).st_nlink, b_links = Stat(p("B")).st_nlink;
  REQUIRE(RenameAt2(p("A/x"), p("B/y"), RENAME_EXCHANGE) == 0);
  CHECK(Stat(p("A/x/..")).st_ino == Stat(p("A")).st_ino);
  CHECK(Stat(p("B/y/..")).st_ino == Stat(p("B")).st_ino);
  CHECK(Stat(p("A")).st_nlink == a_links);
  CHECK(Stat(p("B")).st_nlink == b_links);

  // Onto itself, and onto another name of the same inode: nothing happens.
  REQUIRE(rename(p("b").c_str(), p("b").c_str()) == 0);
  REQUIRE(link(p("b").c_str(), p("b2").c_str()) == 0);
  REQUIRE(rename(p("b").c_str(), p("b2").c_str()) == 0);
  CHECK(PathExists(p("b")));
  CHECK(PathExists(p("b2")));
  CHECK(Stat(p("b")).st_nlink == 2);

  // Refusals.
  WriteFile(p("file"), "f");
  REQUIRE(mkdir(p("full").c_str(), 0755) == 0);
  WriteFile(p("full/x"), "x");
  CHECK(Err(rename(p("A").c_str(), p("file").c_str())) == ENOTDIR);
  CHECK(Err(rename(p("file").c_str(), p("A").c_str())) == EISDIR);
  CHECK(Err(rename(p("A").c_str(), p("full").c_str())) == ENOTEMPTY);
  CHECK(Err(rename(p("B").c_str(), p("B/y/inside").c_str())) == EINVAL);

  CHECK(m.Stop() == 0);
  m.Start();
  CHECK(ReadAll(p("B/g")) == "moved");
  CHECK(ReadAll(p("e2")) == "one");
  CHECK(Stat(p("B/sub2/..")).st_ino == Stat(p("B")).st_ino);
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

TEST_CASE("mount: a file unlinked while open", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  const uint64_t free0 = StatFs(m.dir()).f_bfree;
  const std::string data = Pattern(8 * kMiB, 1);
  {
    Fd fd(m.path("f"), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    REQUIRE(write(fd.get(), data.data(), data.size()) == static_cast<ssize_t>(data.size()));
    REQUIRE(unlink(m.path("f").c_str()) == 0);
    CHECK_FALSE(PathExists(m.path("f")));
    CHECK(ListDir(m.dir()).count("f") == 0);
    struct stat st {};
    REQUIRE(fstat(fd.get(), &st) == 0);
    CHECK(st.st_nlink == 0);
    CHECK(st.st_size == static_cast<off_t>(data.size()));
    std::string back(data.size(), '\0');
    REQUIRE(pread(fd.get(), back.data(), back.size(), 0) == static_cast<ssize_t>(back.size()));
    CHECK(back == data);
    REQUIRE(pwrite(fd.get(), "tail", 4, static_cast<off_t>(data.size())) == 4);
    char tail[4];
    REQUIRE(pread(fd.get(), tail, 4, static_cast<off_t>(data.size())) == 4);
    CHECK(std::string(tail, 4) == "tail");
    // Still allocated while open.
    CHECK(StatFs(m.dir()).f_bfree + 2048 <= free0);
  }
  // The space returns once the kernel has released the file.
  CHECK(Eventually([&] { return StatFs(m.dir()).f_bfree + 4 >= free0; }));
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

TEST_CASE("mount: O_APPEND", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  const std::string f = m.path("log");
  {
    Fd a(f, O_WRONLY | O_CREAT | O_APPEND, 0644), b(f, O_WRONLY | O_APPEND);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(write(a.get(), "aaa", 3) == 3);
    REQUIRE(write(b.get(), "bb", 2) == 2);
    REQUIRE(write(a.get(), "c", 1) == 1);
    // Linux appends even through pwrite on an O_APPEND descriptor.
    REQUIRE(pwrite(b.get(), "Z", 1, 0) == 1);
  }
  CHECK(ReadAll(f) == "aaabbcZ");

  // Concurrent appenders: every record whole, none lost.
  constexpr int kThreads = 4, kRecords = 200, kLen = 100;
  REQUIRE(truncate(f.c_str(), 0) == 0);
  ThreadErrors errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int fd = open(f.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
      if (fd < 0) return errors.Add("open");
      const std::string record(kLen, static_cast<char>('A' + t));
      for (int i = 0; i < kRecords; ++i) {
        if (write(fd, record.data(), kLen) != kLen) errors.Add("append");
      }
      close(fd);
    });
  }
  for (auto& t : threads) t.join();
  errors.Check();
  const std::string all = ReadAll(f);
  REQUIRE(all.size() == static_cast<size_t>(kThreads * kRecords * kLen));
  std::map<char, int> records;
  for (size_t i = 0; i < all.size(); i += kLen) {
    CHECK(all.substr(i, kLen) == std::string(kLen, all[i]));
    ++records[all[i]];
  }
  for (int t = 0; t < kThreads; ++t) CHECK(records['A' + t] == kRecords);
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: sparse files, SEEK_DATA and SEEK_HOLE", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  Fd fd(m.path("sparse"), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd.ok());
  const std::string block = Pattern(4096, 2);
  REQUIRE(pwrite(fd.get(), block.data(), 4096, 0) == 4096);
  REQUIRE(pwrite(fd.get(), block.data(), 4096, 1 * kMiB) == 4096);
  REQUIRE(pwrite(fd.get(), "0123456789", 10, 3 * kMiB + 5) == 10);
  const off_t size = 3 * kMiB + 15;
  struct stat st {};
  REQUIRE(fstat(fd.get(), &st) == 0);
  CHECK(st.st_size == size);
  CHECK(st.st_blocks * 512 >= 3 * 4096);
  CHECK(st.st_blocks * 512 <= 64 * 1024);  // holes take no space

  CHECK(lseek(fd.get(), 0, SEEK_DATA) == 0);
  CHECK(lseek(fd.get(), 0, SEEK_HOLE) == 4096);
  CHECK(lseek(fd.get(), 4096, SEEK_DATA) == static_cast<off_t>(1 * kMiB));
  CHECK(lseek(fd.get(), 100, SEEK_DATA) == 100);
  CHECK(lseek(fd.get(), 1 * kMiB, SEEK_HOLE) == static_cast<off_t>(1 * kMiB + 4096));
  CHECK(lseek(fd.get(), 1 * kMiB + 4096, SEEK_DATA) == static_cast<off_t>(3 * kMiB));
  CHECK(lseek(fd.get(), 3 * kMiB, SEEK_HOLE) == size);
  CHECK(Err(lseek(fd.get(), size, SEEK_DATA)) == ENXIO);
  CHECK(Err(lseek(fd.get(), size, SEEK_HOLE)) == ENXIO);

  std::string hole(8192, 'x');
  REQUIRE(pread(fd.get(), hole.data(), hole.size(), 8192) == 8192);
  CHECK(hole == std::string(8192, '\0'));

  // Punching a hole: zeros, size kept, SEEK_DATA skips it.
  REQUIRE(fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 * kMiB, 4096) == 0);
  CHECK(lseek(fd.get(), 4096, SEEK_DATA) == static_cast<off_t>(3 * kMiB));
  REQUIRE(pread(fd.get(), hole.data(), 4096, 1 * kMiB) == 4096);
  CHECK(hole.substr(0, 4096) == std::string(4096, '\0'));
  REQUIRE(fstat(fd.get(), &st) == 0);
  CHECK(st.st_size == size);
  // A partial punch zeroes bytes but keeps the block.
  REQUIRE(fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 200) == 0);
  char bytes[400];
  REQUIRE(pread(fd.get(), bytes, sizeof bytes, 0) == sizeof bytes);
  CHECK(std::memcmp(bytes, block.data(), 100) == 0);
  CHECK(std::string(bytes + 100, 200) == std::string(200, '\0'));
  CHECK(std::memcmp(bytes + 300, block.data() + 300, 100) == 0);

  // fallocate: allocated zeros count as data; KEEP_SIZE keeps the size.
  REQUIRE(fallocate(fd.get(), FALLOC_FL_KEEP_SIZE, 2 * kMiB, 8192) == 0);
  REQUIRE(fstat(fd.get(), &st) == 0);
  CHECK(st.st_size == size);
  CHECK(lseek(fd.get(), 1 * kMiB + 4096, SEEK_DATA) == static_cast<off_t>(2 * kMiB));
  REQUIRE(fallocate(fd.get(), 0, size, 1 * kMiB) == 0);
  REQUIRE(fstat(fd.get(), &st) == 0);
  CHECK(st.st_size == size + static_cast<off_t>(1 * kMiB));
  // Truncating up leaves a hole; down frees the tail.
  REQUIRE(ftruncate(fd.get(), 16 * kMiB) == 0);
  CHECK(lseek(fd.get(), 8 * kMiB, SEEK_HOLE) == static_cast<off_t>(8 * kMiB));
  CHECK(Err(lseek(fd.get(), 8 * kMiB, SEEK_DATA)) == ENXIO);
  REQUIRE(ftruncate(fd.get(), 4096 + 10) == 0);
  REQUIRE(pread(fd.get(), hole.data(), 100, 4096) == 10);
  CHECK(hole.substr(0, 10) == std::string(10, '\0'));
  fd.Close();
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: a file past 4 GiB", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  {
    Fd fd(m.path("big"), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    const std::string across = Pattern(8192, 3);
    REQUIRE(pwrite(fd.get(), across.data(), across.size(), 4 * kGiB - 4096) == 8192);
    REQUIRE(pwrite(fd.get(), "hello", 5, 5 * kGiB) == 5);
    struct stat st {};
    REQUIRE(fstat(fd.get(), &st) == 0);
    CHECK(st.st_size == static_cast<off_t>(5 * kGiB + 5));
    CHECK(static_cast<uint64_t>(st.st_blocks) * 512 < 1 * kMiB);
    std::string back(8192, '\0');
    REQUIRE(pread(fd.get(), back.data(), back.size(), 4 * kGiB - 4096) == 8192);
    CHECK(back == across);
    REQUIRE(pread(fd.get(), back.data(), 5, 5 * kGiB) == 5);
    CHECK(back.substr(0, 5) == "hello");
    REQUIRE(pread(fd.get(), back.data(), 4096, 4 * kGiB + 1 * kMiB) == 4096);
    CHECK(back.substr(0, 4096) == std::string(4096, '\0'));
    CHECK(lseek(fd.get(), 4 * kGiB + 4096, SEEK_DATA) == static_cast<off_t>(5 * kGiB));
  }
  CHECK(m.Stop() == 0);
  m.Start();
  {
    Fd fd(m.path("big"), O_RDONLY);
    REQUIRE(fd.ok());
    char back[5];
    REQUIRE(pread(fd.get(), back, 5, 5 * kGiB) == 5);
    CHECK(std::string(back, 5) == "hello");
  }
  REQUIRE(truncate(m.path("big").c_str(), 1 * kGiB) == 0);
  CHECK(Stat(m.path("big")).st_size == static_cast<off_t>(1 * kGiB));
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

// Shared mappings in both cache modes. With cache=none every open is
// FOPEN_DIRECT_IO, and the kernel allows MAP_SHARED only because INIT agreed
// FUSE_DIRECT_IO_ALLOW_MMAP (before, ENODEV); it then keeps the mapping's
// pages coherent with direct I/O: a direct read writes dirty pages back
// first, a direct write drops the pages it overwrites.
TEST_CASE("mount: mmap reads and writes in both cache modes", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m;
  const std::string data = Pattern(256 * kKiB, 4);
  std::string expected = data;
  m.Start(options);
  WriteFile(m.path("f"), data);
  {
    Fd fd(m.path("f"), O_RDWR);
    REQUIRE(fd.ok());
    void* p = mmap(nullptr, data.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    INFO("mmap: " << std::strerror(errno));
    REQUIRE(p != MAP_FAILED);
    char* bytes = static_cast<char*>(p);
    CHECK(std::memcmp(bytes, data.data(), data.size()) == 0);
    // Stores through the mapping, msync: the daemon has them (pread).
    std::memcpy(bytes + 5000, "written through mmap", 20);
    std::memset(bytes + 200 * kKiB, 'M', 10000);
    REQUIRE(msync(p, data.size(), MS_SYNC) == 0);
    expected.replace(5000, 20, "written through mmap");
    expected.replace(200 * kKiB, 10000, std::string(10000, 'M'));
    char back[20];
    REQUIRE(pread(fd.get(), back, sizeof back, 5000) == 20);
    CHECK(std::memcmp(back, "written through mmap", 20) == 0);
    // A store not yet synced still reaches a read (cache=none: the direct
    // read writes the dirty page back first).
    std::memcpy(bytes + 70000, "unsynced", 8);
    expected.replace(70000, 8, "unsynced");
    REQUIRE(pread(fd.get(), back, 8, 70000) == 8);
    CHECK(std::memcmp(back, "unsynced", 8) == 0);
    // A write() shows through the mapping.
    REQUIRE(pwrite(fd.get(), "via write", 9, 100) == 9);
    expected.replace(100, 9, "via write");
    CHECK(std::memcmp(bytes + 100, "via write", 9) == 0);
    REQUIRE(munmap(p, data.size()) == 0);
    CHECK(ReadAll(m.path("f")) == expected);
  }
  {
    // Pages written back through an O_APPEND handle land where they were
    // mapped, not at the end of the file (FUSE_WRITE_CACHE, kAtOffset).
    Fd fd(m.path("f"), O_RDWR | O_APPEND);
    REQUIRE(fd.ok());
    void* p = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    REQUIRE(p != MAP_FAILED);
    std::memcpy(static_cast<char*>(p) + 10, "append-handle", 13);
    REQUIRE(msync(p, 8192, MS_SYNC) == 0);
    REQUIRE(munmap(p, 8192) == 0);
    expected.replace(10, 13, "append-handle");
    CHECK(Stat(m.path("f")).st_size == static_cast<off_t>(data.size()));
    CHECK(ReadAll(m.path("f")) == expected);
    // The handle still appends.
    REQUIRE(write(fd.get(), "tail", 4) == 4);
    expected += "tail";
    CHECK(ReadAll(m.path("f")) == expected);
  }
  {
    // No msync: munmap writes a shared writable mapping's dirty pages back
    // (fs/fuse/file.c, fuse_vma_close, without FUSE_WRITEBACK_CACHE).
    Fd fd(m.path("f"), O_RDWR);
    REQUIRE(fd.ok());
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 4096);
    REQUIRE(p != MAP_FAILED);
    std::memcpy(p, "no msync", 8);
    expected.replace(4096, 8, "no msync");
    REQUIRE(munmap(p, 4096) == 0);
  }
  CHECK(m.Stop() == 0);
  // The daemon got every byte: a fresh mount agrees, in the other mode too.
  m.Start(options.empty() ? "cache=page" : "");
  CHECK(ReadAll(m.path("f")) == expected);
  {
    // A private mapping sees the file and keeps its stores to itself.
    Fd fd(m.path("f"), O_RDONLY);
    REQUIRE(fd.ok());
    void* p = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
    REQUIRE(p != MAP_FAILED);
    CHECK(std::memcmp(static_cast<char*>(p) + 5000, "written through mmap", 20) == 0);
    std::memcpy(p, "private", 7);
    munmap(p, 8192);
  }
  CHECK(ReadAll(m.path("f")) == expected);
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

// The daemon answers the first FSYNC and FSYNCDIR with ENOSYS (every write
// is durable when answered), and the kernel stops sending them: fsync(2)
// must still return 0 and still write back what only the kernel holds, a
// shared mapping's dirty pages, before it returns. kill -9 right after
// proves they reached the daemon.
TEST_CASE("mount: fsync without FSYNC requests still writes a mapping's pages back",
          "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m;
  const std::string data = Pattern(64 * kKiB, 9);
  std::string expected = data;
  m.Start(options);
  WriteFile(m.path("f"), data);
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  {
    // The first fsync and fdatasync of a file and of a directory: the
    // kernel's FSYNC/FSYNCDIR are answered ENOSYS, the callers see 0.
    Fd first(m.path("f"), O_RDWR);
    REQUIRE(first.ok());
    CHECK(fsync(first.get()) == 0);
    CHECK(fdatasync(first.get()) == 0);
    Fd dir(m.path("d"), O_RDONLY | O_DIRECTORY);
    REQUIRE(dir.ok());
    CHECK(fsync(dir.get()) == 0);
    CHECK(fsync(dir.get()) == 0);
  }
  Fd fd(m.path("f"), O_RDWR);
  REQUIRE(fd.ok());
  void* p = mmap(nullptr, data.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  INFO("mmap: " << std::strerror(errno));
  REQUIRE(p != MAP_FAILED);
  std::memcpy(static_cast<char*>(p) + 12345, "stored, then fsync", 18);
  expected.replace(12345, 18, "stored, then fsync");
  REQUIRE(fsync(fd.get()) == 0);  // no msync
  const std::string more = "appended, then fdatasync";
  REQUIRE(pwrite(fd.get(), more.data(), more.size(), static_cast<off_t>(data.size())) ==
          static_cast<ssize_t>(more.size()));
  expected += more;
  REQUIRE(fdatasync(fd.get()) == 0);
  // The daemon dies with the mapping in place; the mapping and the file go
  // before the dead mount is unmounted (a lazy unmount under a live mapping
  // left the next mount's unmount EBUSY now and then).
  REQUIRE(kill(m.pid(), SIGKILL) == 0);
  munmap(p, data.size());
  fd.Close();
  CHECK(m.Signal(SIGKILL) == 128 + SIGKILL);
  m.Start(options);
  CHECK(ReadAll(m.path("f")) == expected);
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

// The mount's read-ahead, as the kernel sees it, or -1 if unreadable.
static int ReadAheadKb(const std::string& dir) {
  const struct stat st = Stat(dir);
  std::ifstream in("/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" +
                   std::to_string(minor(st.st_dev)) + "/read_ahead_kb");
  int kb = -1;
  in >> kb;
  return in ? kb : -1;
}

TEST_CASE("mount: read-ahead of a cache=page mount", "[mount]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) {
    NVFS_SKIP("setting read-ahead needs root");
  }
  MountedFs m;
  m.Start("cache=page");
  CHECK(ReadAheadKb(m.dir()) == 1024);  // the default: one request fills 1 MiB
  CHECK(m.Stop() == 0);
  m.Start("cache=page,read_ahead_kb=256");
  CHECK(ReadAheadKb(m.dir()) == 256);
  // Cold reads still return the file's bytes.
  const std::string data = Pattern(3 * 1024 * kKiB + 123, 9);
  WriteFile(m.path("f"), data);
  CHECK(m.Stop() == 0);
  m.Start("cache=page");
  CHECK(ReadAll(m.path("f")) == data);
  CHECK(m.Stop() == 0);
  // Without the page cache the option changes nothing.
  m.Start();
  CHECK(ReadAheadKb(m.dir()) != 1024);
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: extended attributes", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  const std::string f = m.path("f");
  WriteFile(f, "");
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  REQUIRE(setxattr(f.c_str(), "user.a", "1", 1, 0) == 0);
  REQUIRE(setxattr(f.c_str(), "user.b", "two", 3, 0) == 0);
  REQUIRE(setxattr(f.c_str(), "trusted.t", "", 0, 0) == 0);
  const std::string big = Pattern(3000, 5);
  REQUIRE(setxattr(f.c_str(), "user.big", big.data(), big.size(), 0) == 0);
  char buf[4096];
  CHECK(getxattr(f.c_str(), "user.b", nullptr, 0) == 3);  // size probe
  REQUIRE(getxattr(f.c_str(), "user.b", buf, sizeof buf) == 3);
  CHECK(std::string(buf, 3) == "two");
  CHECK(Err(getxattr(f.c_str(), "user.b", buf, 2)) == ERANGE);
  CHECK(getxattr(f.c_str(), "trusted.t", buf, sizeof buf) == 0);
  REQUIRE(getxattr(f.c_str(), "user.big", buf, sizeof buf) == 3000);
  CHECK(std::string(buf, 3000) == big);
  CHECK(Err(getxattr(f.c_str(), "user.none", buf, sizeof buf)) == ENODATA);
  const ssize_t list_size = listxattr(f.c_str(), nullptr, 0);
  REQUIRE(list_size == static_cast<ssize_t>(sizeof "user.a" + sizeof "user.b" +
                                            sizeof "trusted.t" + sizeof "user.big"));
  CHECK(Err(listxattr(f.c_str(), buf, 5)) == ERANGE);
  REQUIRE(listxattr(f.c_str(), buf, sizeof buf) == list_size);
  std::set<std::string> names;
  for (const char* n = buf; n < buf + list_size; n += std::strlen(n) + 1) names.insert(n);
  CHECK(names == std::set<std::string>{"user.a", "user.b", "trusted.t", "user.big"});
  // Create and replace semantics.
  CHECK(Err(setxattr(f.c_str(), "user.a", "x", 1, XATTR_CREATE)) == EEXIST);
  CHECK(Err(setxattr(f.c_str(), "user.new", "x", 1, XATTR_REPLACE)) == ENODATA);
  REQUIRE(setxattr(f.c_str(), "user.a", "replaced", 8, XATTR_REPLACE) == 0);
  REQUIRE(getxattr(f.c_str(), "user.a", buf, sizeof buf) == 8);
  // Remove.
  REQUIRE(removexattr(f.c_str(), "user.b") == 0);
  CHECK(Err(getxattr(f.c_str(), "user.b", buf, sizeof buf)) == ENODATA);
  CHECK(Err(removexattr(f.c_str(), "user.b")) == ENODATA);
  // On a directory; user.* on a symlink is refused by the kernel.
  REQUIRE(setxattr(m.path("d").c_str(), "user.dir", "yes", 3, 0) == 0);
  CHECK(getxattr(m.path("d").c_str(), "user.dir", buf, sizeof buf) == 3);
  REQUIRE(symlink("f", m.path("s").c_str()) == 0);
  CHECK(Err(lsetxattr(m.path("s").c_str(), "user.x", "1", 1, 0)) == EPERM);
  // POSIX ACLs are served (tests/mount_acl.sh has more): none yet here; a
  // value of another version is the kernel's EOPNOTSUPP, a malformed one
  // its EINVAL (posix_acl_from_xattr, posix_acl_valid).
  CHECK(Err(getxattr(f.c_str(), "system.posix_acl_access", buf, sizeof buf)) == ENODATA);
  CHECK(Err(getxattr(m.path("d").c_str(), "system.posix_acl_default", buf, sizeof buf)) ==
        ENODATA);
  CHECK(Err(setxattr(f.c_str(), "system.posix_acl_access", big.data(), 28, 0)) == EOPNOTSUPP);
  const std::string other_only("\x02\0\0\0\x20\0\x04\0\xff\xff\xff\xff", 12);
  CHECK(Err(setxattr(f.c_str(), "system.posix_acl_access", other_only.data(), other_only.size(),
                     0)) == EINVAL);
  CHECK(m.Stop() == 0);
  m.Start();
  REQUIRE(getxattr(f.c_str(), "user.a", buf, sizeof buf) == 8);
  CHECK(std::string(buf, 8) == "replaced");
  REQUIRE(getxattr(f.c_str(), "user.big", buf, sizeof buf) == 3000);
  CHECK(std::string(buf, 3000) == big);
  CHECK(m.Stop() == 0);
}

// Issue 11, item 2. Before, any caller who could reach a file (root, or any
// uid on a file it does not own) stored arbitrary system.* names, a block
// each, and listxattr showed trusted.* names to unprivileged callers. Now
// ext4's rules: system.* names nvfs does not implement (all but the POSIX
// ACL names) are EOPNOTSUPP for set, get and remove;
// trusted.* names are listed to root only. What the kernel checks itself
// (trusted.* get and set, user.* on symlinks) is checked here too.
TEST_CASE("mount: system. xattrs refused and trusted. xattrs listed only to root", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start("allow_other");
  REQUIRE(chmod(m.dir().c_str(), 0755) == 0);
  const std::string f = m.path("given");
  const std::string rootfile = m.path("rootfile");
  const std::string bare = m.path("bare");
  WriteFile(f, "");
  REQUIRE(chown(f.c_str(), 65534, 65534) == 0);
  WriteFile(rootfile, "");
  REQUIRE(chmod(rootfile.c_str(), 0666) == 0);
  WriteFile(bare, "");
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  REQUIRE(symlink("given", m.path("link").c_str()) == 0);
  const blkcnt_t dir_blocks = Stat(m.path("d")).st_blocks;
  char buf[256];
  // A valid minimal access ACL (u::rw-, g::r--, o::r--): the kernel parses
  // ACL values itself and answers a malformed one without asking nvfs.
  const std::string acl("\x02\0\0\0"
                        "\x01\0\x06\0\xff\xff\xff\xff"
                        "\x04\0\x04\0\xff\xff\xff\xff"
                        "\x20\0\x04\0\xff\xff\xff\xff", 28);
  // As root: no system.* name but the ACLs' is served, and a refused set
  // costs no block.
  const std::pair<std::string, const char*> cases[] = {
      {bare, "system.foo"},
      {m.path("d"), "system.foo"},
  };
  for (const auto& [path, name] : cases) {
    INFO(path << " " << name);
    CHECK(Err(setxattr(path.c_str(), name, acl.data(), acl.size(), 0)) == EOPNOTSUPP);
    CHECK(Err(setxattr(path.c_str(), name, acl.data(), acl.size(), XATTR_CREATE)) == EOPNOTSUPP);
    CHECK(Err(getxattr(path.c_str(), name, buf, sizeof buf)) == EOPNOTSUPP);
    CHECK(Err(getxattr(path.c_str(), name, nullptr, 0)) == EOPNOTSUPP);
    CHECK(Err(removexattr(path.c_str(), name)) == EOPNOTSUPP);
  }
  CHECK(Stat(bare).st_blocks == 0);
  CHECK(Stat(m.path("d")).st_blocks == dir_blocks);
  CHECK(listxattr(bare.c_str(), nullptr, 0) == 0);
  CHECK(listxattr(m.path("d").c_str(), nullptr, 0) == 0);
  // Root puts a trusted.* and a user.* name on a file owned by 65534.
  REQUIRE(setxattr(f.c_str(), "trusted.x", "t", 1, 0) == 0);
  REQUIRE(setxattr(f.c_str(), "user.u", "u", 1, 0) == 0);
  const ssize_t root_size = listxattr(f.c_str(), nullptr, 0);
  CHECK(root_size == static_cast<ssize_t>(sizeof "trusted.x" + sizeof "user.u"));
  REQUIRE(listxattr(f.c_str(), buf, sizeof buf) == root_size);
  std::set<std::string> names;
  for (const char* n = buf; n < buf + root_size; n += std::strlen(n) + 1) names.insert(n);
  CHECK(names == std::set<std::string>{"trusted.x", "user.u"});

  const int failed_step = RunInChild([&]() -> int {
    if (!BecomeNobody()) {
      return 100;
    }
    int step = 0;
    auto expect = [&step](bool ok, const char* what) {
      ++step;
      if (!ok) std::fprintf(stderr, "uid 65534, step %d failed: %s (errno %d)\n", step, what, errno);
      return ok;
    };
    char list[256];
    // system.*: refused on its own file and on root's alike.
    for (const std::string& path : {f, rootfile}) {
      if (!expect(Err(setxattr(path.c_str(), "system.foo", "1", 1, 0)) == EOPNOTSUPP,
                  "setxattr system.foo")) {
        return step;
      }
      if (!expect(Err(getxattr(path.c_str(), "system.foo", list, sizeof list)) == EOPNOTSUPP,
                  "getxattr system.foo")) {
        return step;
      }
      if (!expect(Err(removexattr(path.c_str(), "system.foo")) == EOPNOTSUPP,
                  "removexattr system.foo")) {
        return step;
      }
    }
    // An ACL: its owner may set it (one the mode says is the mode's, so
    // not listed), anyone else may not (the kernel's check).
    if (!expect(setxattr(f.c_str(), "system.posix_acl_access", acl.data(), acl.size(), 0) == 0,
                "setxattr system.posix_acl_access, owner")) {
      return step;
    }
    if (!expect(Err(setxattr(rootfile.c_str(), "system.posix_acl_access", acl.data(), acl.size(),
                             0)) == EPERM,
                "setxattr system.posix_acl_access, not the owner")) {
      return step;
    }
    // trusted.*: not listed; the size query agrees with the list.
    const ssize_t size = listxattr(f.c_str(), nullptr, 0);
    if (!expect(size == static_cast<ssize_t>(sizeof "user.u"), "listxattr size query")) return step;
    const ssize_t got = listxattr(f.c_str(), list, sizeof list);
    if (!expect(got == size && std::string(list, got) == std::string("user.u\0", 7),
                "listxattr without trusted.x")) {
      return step;
    }
    if (!expect(listxattr(f.c_str(), list, sizeof "user.u") == size, "listxattr, exact fit")) {
      return step;
    }
    if (!expect(Err(listxattr(f.c_str(), list, sizeof "user.u" - 1)) == ERANGE,
                "listxattr, one byte short")) {
      return step;
    }
    // What the kernel checks before asking the daemon.
    if (!expect(Err(getxattr(f.c_str(), "trusted.x", list, sizeof list)) == ENODATA,
                "getxattr trusted.x (the kernel)")) {
      return step;
    }
    if (!expect(Err(setxattr(f.c_str(), "trusted.y", "1", 1, 0)) == EPERM,
                "setxattr trusted.y (the kernel)")) {
      return step;
    }
    if (!expect(Err(removexattr(f.c_str(), "trusted.x")) == EPERM,
                "removexattr trusted.x (the kernel)")) {
      return step;
    }
    if (!expect(Err(lsetxattr(m.path("link").c_str(), "user.x", "1", 1, 0)) == EPERM,
                "lsetxattr user.x on a symlink (the kernel)")) {
      return step;
    }
    if (!expect(Err(lgetxattr(m.path("link").c_str(), "user.x", list, sizeof list)) == ENODATA,
                "lgetxattr user.x on a symlink (the kernel)")) {
      return step;
    }
    // user.*: as before.
    if (!expect(setxattr(f.c_str(), "user.mine", "12", 2, 0) == 0, "setxattr user.mine")) {
      return step;
    }
    if (!expect(getxattr(f.c_str(), "user.mine", list, sizeof list) == 2, "getxattr user.mine")) {
      return step;
    }
    if (!expect(removexattr(f.c_str(), "user.mine") == 0, "removexattr user.mine")) return step;
    if (!expect(getxattr(f.c_str(), "user.u", list, sizeof list) == 1, "getxattr user.u")) {
      return step;
    }
    return 0;
  });
  INFO("first failed step in the child (100: could not change uid): " << failed_step);
  CHECK(failed_step == 0);
  // Root still sees (and reads) trusted.x, and nothing new was stored.
  CHECK(listxattr(f.c_str(), nullptr, 0) == root_size);
  CHECK(getxattr(f.c_str(), "trusted.x", buf, sizeof buf) == 1);
  CHECK(listxattr(rootfile.c_str(), nullptr, 0) == 0);
  CHECK(Stat(rootfile).st_blocks == 0);
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: statfs numbers follow use", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m(256 * kMiB);
  m.Start();
  const struct statvfs s0 = StatFs(m.dir());
  CHECK(s0.f_bsize == 4096);
  CHECK(s0.f_frsize == 4096);
  CHECK(s0.f_blocks == 256 * kMiB / 4096);
  CHECK(s0.f_bfree <= s0.f_blocks);
  // Available: the free blocks less the pointer blocks mapping them takes
  // (1 in 512, and a few tree roots).
  CHECK(s0.f_bavail <= s0.f_bfree);
  CHECK(s0.f_bavail >= s0.f_bfree - s0.f_bfree / 500 - 8);
  CHECK(s0.f_namemax == 255);
  CHECK(s0.f_ffree < s0.f_files);
  WriteFile(m.path("big"), Pattern(16 * kMiB, 6));
  for (int i = 0; i < 100; ++i) WriteFile(m.path("f" + std::to_string(i)), "");
  const struct statvfs s1 = StatFs(m.dir());
  CHECK(s1.f_bfree + 16 * kMiB / 4096 <= s0.f_bfree);
  CHECK(s1.f_ffree + 101 <= s0.f_ffree);
  CHECK(s1.f_files == s0.f_files);
  CHECK(s1.f_blocks == s0.f_blocks);
  REQUIRE(unlink(m.path("big").c_str()) == 0);
  for (int i = 0; i < 100; ++i) REQUIRE(unlink(m.path("f" + std::to_string(i)).c_str()) == 0);
  CHECK(Eventually([&] {
    const struct statvfs s2 = StatFs(m.dir());
    return s2.f_bfree + 8 >= s0.f_bfree && s2.f_ffree == s0.f_ffree;
  }));
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: timestamps follow POSIX", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  const std::string f = m.path("f"), d = m.path("d");
  REQUIRE(mkdir(d.c_str(), 0755) == 0);
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(10)); };

  // Creation sets all three; the parent's mtime and ctime move.
  const timespec t0 = Now();
  pause();
  WriteFile(m.path("d/f"), "");
  const timespec t1 = Now();
  struct stat st = Stat(m.path("d/f"));
  CHECK((t0 <= st.st_mtim && st.st_mtim <= t1));
  CHECK(st.st_atim == st.st_mtim);
  CHECK(st.st_ctim == st.st_mtim);
  const struct stat dir1 = Stat(d);
  CHECK((t0 <= dir1.st_mtim && dir1.st_mtim <= t1));
  CHECK((t0 <= dir1.st_ctim && dir1.st_ctim <= t1));

  // write updates mtime and ctime.
  WriteFile(f, "0");
  const struct stat before = Stat(f);
  pause();
  const timespec t2 = Now();
  {
    Fd fd(f, O_WRONLY);
    REQUIRE(fd.ok());
    REQUIRE(write(fd.get(), "data", 4) == 4);
  }
  const timespec t3 = Now();
  st = Stat(f);
  CHECK((t2 <= st.st_mtim && st.st_mtim <= t3));
  CHECK((t2 <= st.st_ctim && st.st_ctim <= t3));
  CHECK(st.st_atim == before.st_atim);

  // utimensat: explicit times, UTIME_OMIT, UTIME_NOW, NULL.
  const timespec explicit_times[2] = {{1000, 5}, {2000, 7}};
  REQUIRE(utimensat(AT_FDCWD, f.c_str(), explicit_times, 0) == 0);
  st = Stat(f);
  CHECK(st.st_atim == explicit_times[0]);
  CHECK(st.st_mtim == explicit_times[1]);
  const timespec ctime_set = st.st_ctim;
  pause();
  const timespec t4 = Now();
  const timespec omit_now[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
  REQUIRE(utimensat(AT_FDCWD, f.c_str(), omit_now, 0) == 0);
  const timespec t5 = Now();
  st = Stat(f);
  CHECK(st.st_atim == explicit_times[0]);
  CHECK((t4 <= st.st_mtim && st.st_mtim <= t5));
  CHECK((t4 <= st.st_ctim && st.st_ctim <= t5));
  CHECK_FALSE(st.st_ctim == ctime_set);
  const timespec both_omit[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
  const struct stat unchanged = Stat(f);
  REQUIRE(utimensat(AT_FDCWD, f.c_str(), both_omit, 0) == 0);
  st = Stat(f);
  CHECK(st.st_mtim == unchanged.st_mtim);
  CHECK(st.st_atim == unchanged.st_atim);
  pause();
  const timespec t6 = Now();
  REQUIRE(utimensat(AT_FDCWD, f.c_str(), nullptr, 0) == 0);
  const timespec t7 = Now();
  st = Stat(f);
  CHECK((t6 <= st.st_atim && st.st_atim <= t7));
  CHECK((t6 <= st.st_mtim && st.st_mtim <= t7));

  // chmod and chown change ctime only.
  REQUIRE(utimensat(AT_FDCWD, f.c_str(), explicit_times, 0) == 0);
  pause();
  const timespec t8 = Now();
  REQUIRE(chmod(f.c_str(), 0600) == 0);
  const timespec t9 = Now();
  st = Stat(f);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK((t8 <= st.st_ctim && st.st_ctim <= t9));
  CHECK(st.st_mtim == explicit_times[1]);
  REQUIRE(chown(f.c_str(), 42, 43) == 0);
  st = Stat(f);
  CHECK(st.st_uid == 42);
  CHECK(st.st_gid == 43);
  CHECK(st.st_mtim == explicit_times[1]);

  // truncate changes mtime and ctime; link and xattrs change ctime.
  pause();
  const timespec t10 = Now();
  REQUIRE(truncate(f.c_str(), 1) == 0);
  st = Stat(f);
  CHECK(t10 <= st.st_mtim);
  CHECK(t10 <= st.st_ctim);
  REQUIRE(utimensat(AT_FDCWD, f.c_str(), explicit_times, 0) == 0);
  pause();
  const timespec t11 = Now();
  REQUIRE(link(f.c_str(), m.path("f2").c_str()) == 0);
  st = Stat(f);
  CHECK(t11 <= st.st_ctim);
  CHECK(st.st_mtim == explicit_times[1]);
  pause();
  const timespec t12 = Now();
  REQUIRE(setxattr(f.c_str(), "user.t", "1", 1, 0) == 0);
  CHECK(t12 <= Stat(f).st_ctim);

  // Directory times move with unlink and rename, in both directories.
  REQUIRE(mkdir(m.path("e").c_str(), 0755) == 0);
  pause();
  const timespec t13 = Now();
  REQUIRE(rename(m.path("d/f").c_str(), m.path("e/g").c_str()) == 0);
  CHECK(t13 <= Stat(d).st_mtim);
  CHECK(t13 <= Stat(m.path("e")).st_mtim);
  pause();
  const timespec t14 = Now();
  REQUIRE(unlink(m.path("e/g").c_str()) == 0);
  CHECK(t14 <= Stat(m.path("e")).st_mtim);
  CHECK(t14 <= Stat(m.path("e")).st_ctim);
  CHECK(m.Stop() == 0);
}

// What lstat(2) shows of a path, but st_dev (a remount changes it), as one
// line; "absent" for a name that is not there.
std::string SeenAt(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "absent" : std::strerror(errno);
  char line[400];
  std::snprintf(line, sizeof line,
                "ino %llu mode %o nlink %llu uid %u gid %u size %lld blocks %lld "
                "atime %lld.%09ld mtime %lld.%09ld ctime %lld.%09ld",
                static_cast<unsigned long long>(st.st_ino), st.st_mode,
                static_cast<unsigned long long>(st.st_nlink), st.st_uid, st.st_gid,
                static_cast<long long>(st.st_size), static_cast<long long>(st.st_blocks),
                static_cast<long long>(st.st_atim.tv_sec), st.st_atim.tv_nsec,
                static_cast<long long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec,
                static_cast<long long>(st.st_ctim.tv_sec), st.st_ctim.tv_nsec);
  return line;
}

// The kernel keeps entries and attributes as long as the mount
// (adapter.hpp): after every kind of change through the mount, what stat
// shows from the kernel's caches (warm: every path was stat'ed before the
// change) must equal what a fresh mount, with nothing cached, shows — the
// core's truth; so must the directories' listings. Each step is one kind of change; after it, every path is
// compared, and the fresh mount's stats warm the caches for the next step.
TEST_CASE("mount: the kernel's cached attributes stay true after every kind of change",
          "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "allow_other",
                                        "allow_other,cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  REQUIRE(chmod(m.dir().c_str(), 0777) == 0);
  const std::vector<std::string> paths = {
      "", "d", "e", "d/f", "d/g", "d/sub", "e/f", "e/h", "e/h2", "e/s", "e/dd", "e/dd/f", "e/x"};
  // Listings too (the kernel caches them: FOPEN_CACHE_DIR), read with
  // readdir(3) as ls would.
  const std::vector<std::string> dirs = {"", "d", "e", "e/dd"};
  const auto snapshot = [&] {
    std::map<std::string, std::string> seen;
    for (const std::string& p : paths) seen[p] = SeenAt(m.path(p));
    for (const std::string& p : dirs) {
      std::string names = "listing:";
      if (DIR* d = opendir(m.path(p).c_str())) {
        std::set<std::string> sorted;
        while (dirent* e = readdir(d)) sorted.insert(e->d_name);
        closedir(d);
        for (const std::string& n : sorted) names += " " + n;
      }
      seen["ls " + p] = names;
    }
    return seen;
  };
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("e").c_str(), 0755) == 0);
  WriteFile(m.path("e/h"), "victim");
  REQUIRE(link(m.path("e/h").c_str(), m.path("e/h2").c_str()) == 0);
  snapshot();  // every path in the kernel's caches
  const auto with_fd = [&](const std::string& path, int flags, auto&& body) {
    Fd fd(m.path(path), flags);
    INFO(path << ": " << std::strerror(fd.error()));
    REQUIRE(fd.ok());
    body(fd.get());
  };
  const std::vector<std::pair<std::string, std::function<void()>>> steps = {
      {"create d/f", [&] { WriteFile(m.path("d/f"), ""); }},
      {"write", [&] {
         with_fd("d/f", O_WRONLY, [](int fd) {
           REQUIRE(write(fd, std::string(10000, 'w').data(), 10000) == 10000);
         });
       }},
      {"O_APPEND write", [&] {
         with_fd("d/f", O_WRONLY | O_APPEND,
                 [](int fd) { REQUIRE(write(fd, "appended", 8) == 8); });
       }},
      {"pwrite past the end", [&] {
         with_fd("d/f", O_WRONLY, [](int fd) { REQUIRE(pwrite(fd, "far", 3, 1 << 20) == 3); });
       }},
      {"read (atime stays)", [&] { ReadAll(m.path("d/f")); }},
      {"truncate", [&] { REQUIRE(truncate(m.path("d/f").c_str(), 5000) == 0); }},
      {"ftruncate", [&] {
         with_fd("d/f", O_WRONLY, [](int fd) { REQUIRE(ftruncate(fd, 20000) == 0); });
       }},
      {"fallocate", [&] {
         with_fd("d/f", O_WRONLY, [](int fd) { REQUIRE(fallocate(fd, 0, 0, 256 << 10) == 0); });
       }},
      {"punch", [&] {
         with_fd("d/f", O_WRONLY, [](int fd) {
           REQUIRE(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 65536) == 0);
         });
       }},
      {"chmod", [&] { REQUIRE(chmod(m.path("d/f").c_str(), 0600) == 0); }},
      {"chown", [&] { REQUIRE(chown(m.path("d/f").c_str(), 42, 43) == 0); }},
      {"utimensat", [&] {
         const timespec times[2] = {{1000, 5}, {2000, 7}};
         REQUIRE(utimensat(AT_FDCWD, m.path("d/f").c_str(), times, 0) == 0);
       }},
      {"setxattr", [&] { REQUIRE(setxattr(m.path("d/f").c_str(), "user.a", "1", 1, 0) == 0); }},
      {"removexattr", [&] { REQUIRE(removexattr(m.path("d/f").c_str(), "user.a") == 0); }},
      {"link", [&] { REQUIRE(link(m.path("d/f").c_str(), m.path("d/g").c_str()) == 0); }},
      {"unlink of one link", [&] { REQUIRE(unlink(m.path("d/g").c_str()) == 0); }},
      {"mkdir", [&] { REQUIRE(mkdir(m.path("d/sub").c_str(), 0755) == 0); }},
      {"rmdir", [&] { REQUIRE(rmdir(m.path("d/sub").c_str()) == 0); }},
      {"rename across directories", [&] {
         REQUIRE(rename(m.path("d/f").c_str(), m.path("e/f").c_str()) == 0);
       }},
      {"rename over a target with another link", [&] {
         REQUIRE(rename(m.path("e/f").c_str(), m.path("e/h").c_str()) == 0);
       }},
      {"RENAME_EXCHANGE", [&] {
         REQUIRE(RenameAt2(m.path("e/h").c_str(), m.path("e/h2").c_str(), RENAME_EXCHANGE) == 0);
       }},
      {"symlink", [&] { REQUIRE(symlink("h", m.path("e/s").c_str()) == 0); }},
      {"O_TRUNC open", [&] {
         with_fd("e/h2", O_WRONLY | O_TRUNC, [](int fd) { REQUIRE(write(fd, "new", 3) == 3); });
       }},
      {"mmap store, msync", [&] {
         with_fd("e/h", O_RDWR, [](int fd) {
           void* p = mmap(nullptr, 4, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
           REQUIRE(p != MAP_FAILED);
           std::memcpy(p, "MMAP", 4);
           REQUIRE(msync(p, 4, MS_SYNC) == 0);
           REQUIRE(munmap(p, 4) == 0);
         });
       }},
      {"mmap store, munmap", [&] {
         with_fd("e/h", O_RDWR, [](int fd) {
           void* p = mmap(nullptr, 4, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
           REQUIRE(p != MAP_FAILED);
           std::memcpy(p, "mmap", 4);
           REQUIRE(munmap(p, 4) == 0);
         });
       }},
      {"rename of a directory into another", [&] {
         REQUIRE(mkdir(m.path("d/sub").c_str(), 0755) == 0);
         WriteFile(m.path("d/sub/f"), "in sub");
         REQUIRE(rename(m.path("d/sub").c_str(), m.path("e/dd").c_str()) == 0);
       }},
      {"a write by an unprivileged caller drops set-user-ID", [&] {
         WriteFile(m.path("e/x"), "suid");
         REQUIRE(chmod(m.path("e/x").c_str(), 06777) == 0);
         REQUIRE(SeenAt(m.path("e/x")).find("mode 106777") != std::string::npos);
         const int failed = RunInChild([&]() -> int {
           if (!BecomeNobody()) return 100;
           const int fd = open(m.path("e/x").c_str(), O_WRONLY);
           const int rc = fd >= 0 && pwrite(fd, "S", 1, 0) == 1 ? 0 : 1;
           if (fd >= 0) close(fd);
           return rc;
         });
         REQUIRE(failed == 0);
       }},
      {"unlink", [&] { REQUIRE(unlink(m.path("e/s").c_str()) == 0); }},
  };
  for (const auto& [name, change] : steps) {
    INFO("after: " << name);
    change();
    const std::map<std::string, std::string> cached = snapshot();
    REQUIRE(m.Stop() == 0);
    m.Start(options);
    const std::map<std::string, std::string> fresh = snapshot();
    for (const auto& [p, seen] : cached) {
      INFO("path: /" << p);
      CHECK(seen == fresh.at(p));
    }
  }
  // An unlinked file still open: its link count, ctime and size as the
  // core has them (fstat asks the daemon once the kernel dropped them).
  {
    Fd fd(m.path("e/h2"), O_RDWR);
    REQUIRE(fd.ok());
    struct stat before {};
    REQUIRE(fstat(fd.get(), &before) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const timespec t0 = Now();
    REQUIRE(unlink(m.path("e/h2").c_str()) == 0);
    struct stat st {};
    REQUIRE(fstat(fd.get(), &st) == 0);
    CHECK(st.st_nlink == before.st_nlink - 1);
    CHECK(t0 <= st.st_ctim);
    REQUIRE(pwrite(fd.get(), "grown", 5, 100000) == 5);
    REQUIRE(fstat(fd.get(), &st) == 0);
    CHECK(st.st_size == 100005);
    CHECK(t0 <= st.st_mtim);
  }
  CHECK(m.Stop() == 0);
  const FsckResult fsck = FsckImage(m.image());
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
}

// The mode the kernel caches is what exec(2) reads for set-user-ID
// (bprm_fill_uid), and a write only makes the kernel drop a file's size and
// times: when the core clears set-user-ID on a write by an unprivileged
// caller, the daemon must make the kernel forget the mode too, or the next
// exec of the file runs with its owner's uid.
TEST_CASE("mount: exec after a write that cleared set-user-ID runs without it", "[mount]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) {
    NVFS_SKIP("needs root (a root-owned set-user-ID program)");
  }
  const std::string options = GENERATE(as<std::string>{}, "allow_other,suid",
                                        "allow_other,suid,cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  REQUIRE(chmod(m.dir().c_str(), 0777) == 0);
  const std::string id = m.path("id");
  WriteFile(id, ReadAll("/usr/bin/id"), 0755);
  REQUIRE(chmod(id.c_str(), 04777) == 0);
  REQUIRE((Stat(id).st_mode & 07777) == 04777);  // cached by the kernel now
  const std::string out = "/tmp/nvfs-exec-" + std::to_string(getpid());
  const auto euid_of_exec = [&] {
    unlink(out.c_str());
    const int status = RunInChild([&]() -> int {
      const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || dup2(fd, 1) < 0 || !BecomeNobody()) return 100;
      execl(id.c_str(), "id", "-u", static_cast<char*>(nullptr));
      return 101;
    });
    std::string euid = status == 0 ? ReadAll(out) : "status " + std::to_string(status);
    unlink(out.c_str());
    return euid;
  };
  CHECK(euid_of_exec() == "0\n");  // set-user-ID root: the mount honours it
  // A write by nobody: the same byte again, so the program still runs.
  const std::string first = ReadAll(id).substr(0, 1);
  const int failed = RunInChild([&]() -> int {
    if (!BecomeNobody()) return 100;
    const int fd = open(id.c_str(), O_WRONLY);
    const int rc = fd >= 0 && pwrite(fd, first.data(), 1, 0) == 1 ? 0 : 1;
    if (fd >= 0) close(fd);
    return rc;
  });
  REQUIRE(failed == 0);
  // No stat in between: only the daemon's word makes the kernel look again.
  CHECK(euid_of_exec() == "65534\n");
  CHECK((Stat(id).st_mode & 07777) == 0777);
  CHECK(m.Stop() == 0);
}

TEST_CASE("mount: a 10,000-entry directory lists completely", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  const std::string d = m.path("big");
  REQUIRE(mkdir(d.c_str(), 0755) == 0);
  constexpr int kEntries = 10000;
  auto name = [](int i) {
    return "entry-" + std::to_string(i) + "-" + std::string(static_cast<size_t>(i % 40), 'p');
  };
  std::set<std::string> expected{".", ".."};
  for (int i = 0; i < kEntries; ++i) {
    const std::string n = name(i);
    REQUIRE(mknod((d + "/" + n).c_str(), S_IFREG | 0644, 0) == 0);
    expected.insert(n);
  }
  CHECK(ListDir(d) == expected);
  CHECK(Stat(m.path("big/" + name(1234))).st_size == 0);

  // A listing that runs while entries come and go: every entry present
  // throughout shows exactly once, none that never existed shows.
  std::set<std::string> stable = expected, ever = expected;
  DIR* dir = opendir(d.c_str());
  REQUIRE(dir != nullptr);
  std::multiset<std::string> seen;
  for (int i = 0; i < 300; ++i) {
    dirent* e = readdir(dir);
    REQUIRE(e != nullptr);
    seen.insert(e->d_name);
  }
  for (int i = 0; i < kEntries; i += 3) {
    REQUIRE(unlink((d + "/" + name(i)).c_str()) == 0);
    stable.erase(name(i));
    expected.erase(name(i));
  }
  for (int i = kEntries; i < kEntries + 2000; ++i) {
    REQUIRE(mknod((d + "/" + name(i)).c_str(), S_IFREG | 0644, 0) == 0);
    ever.insert(name(i));
    expected.insert(name(i));
  }
  while (dirent* e = readdir(dir)) seen.insert(e->d_name);
  closedir(dir);
  for (const std::string& n : stable) {
    INFO(n);
    CHECK(seen.count(n) == 1);
  }
  for (const std::string& n : seen) {
    INFO(n);
    CHECK(ever.count(n) == 1);
    CHECK(seen.count(n) == 1);
  }
  CHECK(ListDir(d) == expected);
  CHECK(m.Stop() == 0);
  m.Start();
  const uint64_t inodes_free = StatFs(m.dir()).f_ffree;
  CHECK(ListDir(d) == expected);  // readdirplus: a reference per entry
  // Every reference readdirplus handed out comes back (FORGET): removed
  // entries' inodes are freed while mounted.
  for (const std::string& n : expected) {
    if (n != "." && n != "..") REQUIRE(unlink((d + "/" + n).c_str()) == 0);
  }
  CHECK(ListDir(d) == std::set<std::string>{".", ".."});
  CHECK(Eventually([&] { return StatFs(m.dir()).f_ffree == inodes_free + expected.size() - 2; }));
  CHECK(m.Stop() == 0);
}

// (nodeid, generation) handles as NFS uses them: after a remount the kernel
// knows no inode, so open_by_handle_at makes it ask the daemon (LOOKUP of
// "." on the node id, and ".." to reconnect a directory).
TEST_CASE("mount: file handles survive a remount (NFS export)", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("d/sub").c_str(), 0755) == 0);
  WriteFile(m.path("d/sub/kept"), "kept");
  WriteFile(m.path("gone"), "gone");
  auto handle_of = [](const std::string& path) {
    std::vector<char> buf(sizeof(file_handle) + MAX_HANDLE_SZ);
    auto* fh = reinterpret_cast<file_handle*>(buf.data());
    fh->handle_bytes = MAX_HANDLE_SZ;
    int mount_id = 0;
    INFO(path << ": " << std::strerror(errno));
    REQUIRE(name_to_handle_at(AT_FDCWD, path.c_str(), fh, &mount_id, 0) == 0);
    return buf;
  };
  std::vector<char> kept = handle_of(m.path("d/sub/kept"));
  std::vector<char> sub = handle_of(m.path("d/sub"));
  std::vector<char> gone = handle_of(m.path("gone"));
  REQUIRE(unlink(m.path("gone").c_str()) == 0);
  CHECK(m.Stop() == 0);
  m.Start();
  Fd mount_fd(m.dir(), O_RDONLY | O_DIRECTORY);
  REQUIRE(mount_fd.ok());
  auto open_handle = [&](std::vector<char>& h, int flags) {
    return open_by_handle_at(mount_fd.get(), reinterpret_cast<file_handle*>(h.data()), flags);
  };
  int fd = open_handle(kept, O_RDONLY);
  REQUIRE(fd >= 0);
  char buf[8];
  CHECK(read(fd, buf, sizeof buf) == 4);
  CHECK(std::string(buf, 4) == "kept");
  close(fd);
  fd = open_handle(sub, O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  struct stat st {};
  REQUIRE(fstat(fd, &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK(st.st_ino == Stat(m.path("d/sub")).st_ino);
  close(fd);
  CHECK(Err(open_handle(gone, O_RDONLY)) == ESTALE);
  // A new file may reuse the freed inode number, never its generation.
  for (int i = 0; i < 20; ++i) WriteFile(m.path("new" + std::to_string(i)), "new");
  CHECK(Err(open_handle(gone, O_RDONLY)) == ESTALE);
  mount_fd.Close();
  CHECK(m.Stop() == 0);
}

// The cases NFS servers (ganesha's FSAL_VFS, the kernel's nfsd) meet after
// a remount, with the daemon asked about node ids it has never handed out:
// a freed inode's number taken by a new file (LOOKUP of "." answers the
// new inode, whose generation differs: ESTALE), a directory handle the
// kernel must reconnect to the root (LOOKUP of ".." up the tree, then the
// name found by READDIR), a handle of a non-directory (LOOKUP of "." on a
// file), and of a file kept open after its unlink.
TEST_CASE("mount: a handle is stale once its inode number is reused; directory handles reconnect",
          "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  // FUSE's handle (fs/fuse/inode.c, fuse_encode_fh): the node id's high and
  // low 32 bits, then the generation.
  struct Handle {
    std::vector<char> buf;
    file_handle* fh() { return reinterpret_cast<file_handle*>(buf.data()); }
    uint64_t ino() {
      uint32_t w[2];
      std::memcpy(w, fh()->f_handle, sizeof w);
      return (uint64_t{w[0]} << 32) | w[1];
    }
  };
  auto handle_of = [](const std::string& path) {
    Handle h{std::vector<char>(sizeof(file_handle) + MAX_HANDLE_SZ)};
    h.fh()->handle_bytes = MAX_HANDLE_SZ;
    int mount_id = 0;
    INFO(path << ": " << std::strerror(errno));
    REQUIRE(name_to_handle_at(AT_FDCWD, path.c_str(), h.fh(), &mount_id, 0) == 0);
    return h;
  };
  REQUIRE(mkdir(m.path("a").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("a/b").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("a/b/c").c_str(), 0755) == 0);
  WriteFile(m.path("a/b/c/file"), "file");
  WriteFile(m.path("gone"), "gone");
  WriteFile(m.path("open-unlinked"), "open");
  Handle deep = handle_of(m.path("a/b/c"));
  Handle file = handle_of(m.path("a/b/c/file"));
  Handle gone = handle_of(m.path("gone"));
  Handle unlinked = handle_of(m.path("open-unlinked"));
  CHECK(gone.ino() == Stat(m.path("gone")).st_ino);
  {
    Fd mount_fd(m.dir(), O_RDONLY | O_DIRECTORY);
    Fd held(m.path("open-unlinked"), O_RDONLY);
    REQUIRE(held.ok());
    REQUIRE(unlink(m.path("open-unlinked").c_str()) == 0);
    // Still open: the kernel knows the inode, and so does the daemon.
    const int fd = open_by_handle_at(mount_fd.get(), unlinked.fh(), O_RDONLY);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
  }
  REQUIRE(unlink(m.path("gone").c_str()) == 0);
  CHECK(m.Stop() == 0);
  m.Start();
  // A new file takes the freed number (the lowest free inode).
  bool reused = false;
  for (int i = 0; i < 64 && !reused; ++i) {
    const std::string path = m.path("new" + std::to_string(i));
    WriteFile(path, "new");
    reused = Stat(path).st_ino == gone.ino();
  }
  CHECK(reused);
  CHECK(m.Stop() == 0);
  m.Start();  // the kernel knows none of the inodes again
  Fd mount_fd(m.dir(), O_RDONLY | O_DIRECTORY);
  REQUIRE(mount_fd.ok());
  CHECK(Err(open_by_handle_at(mount_fd.get(), gone.fh(), O_RDONLY)) == ESTALE);
  // Freed at the remount (the orphan list), the open-unlinked file's too.
  CHECK(Err(open_by_handle_at(mount_fd.get(), unlinked.fh(), O_RDONLY)) == ESTALE);
  // The file first: its dentry stays disconnected (no path needed to read).
  int fd = open_by_handle_at(mount_fd.get(), file.fh(), O_RDONLY);
  REQUIRE(fd >= 0);
  char buf[8];
  CHECK(read(fd, buf, sizeof buf) == 4);
  close(fd);
  // A directory is always reconnected: its path is whole again.
  fd = open_by_handle_at(mount_fd.get(), deep.fh(), O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  char link[PATH_MAX] = {};
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  REQUIRE(readlink(proc.c_str(), link, sizeof link - 1) > 0);
  CHECK(std::string(link) == m.path("a/b/c"));
  struct stat parent {};
  REQUIRE(fstatat(fd, "..", &parent, 0) == 0);
  CHECK(parent.st_ino == Stat(m.path("a/b")).st_ino);
  close(fd);
  mount_fd.Close();
  CHECK(m.Stop() == 0);
  const FsckResult fsck = FsckImage(m.image());
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
}

TEST_CASE("mount: concurrent writers on separate files and on one directory", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  REQUIRE(mkdir(m.path("shared").c_str(), 0755) == 0);
  constexpr int kWriters = 4, kCreators = 4, kFilesEach = 250;
  const size_t file_size = 4 * kMiB;
  ThreadErrors errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&, t] {
      const std::string data = Pattern(file_size, 100 + t);
      const int fd = open(m.path("w" + std::to_string(t)).c_str(),
                          O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) return errors.Add("open writer file");
      std::mt19937 rng(t);
      size_t at = 0;
      while (at < data.size()) {
        const size_t n = std::min<size_t>(data.size() - at, 1 + rng() % (256 * kKiB));
        if (pwrite(fd, data.data() + at, n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) {
          errors.Add("pwrite");
          break;
        }
        at += n;
      }
      close(fd);
    });
  }
  for (int t = 0; t < kCreators; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kFilesEach; ++i) {
        const std::string n = m.path("shared/t" + std::to_string(t) + "-" + std::to_string(i));
        const int fd = open(n.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) {
          errors.Add("create " + n);
          continue;
        }
        if (write(fd, n.data(), n.size()) != static_cast<ssize_t>(n.size())) errors.Add("write");
        close(fd);
        if (i % 5 == 4 && unlink(n.c_str()) != 0) errors.Add("unlink " + n);
        if (i % 50 == 0) {
          const std::string sub = m.path("shared/dir" + std::to_string(t) + "-" + std::to_string(i));
          if (mkdir(sub.c_str(), 0755) != 0) errors.Add("mkdir " + sub);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  errors.Check();
  for (int t = 0; t < kWriters; ++t) {
    INFO("writer " << t);
    CHECK(ReadAll(m.path("w" + std::to_string(t))) == Pattern(file_size, 100 + t));
  }
  std::set<std::string> expected{".", ".."};
  for (int t = 0; t < kCreators; ++t) {
    for (int i = 0; i < kFilesEach; ++i) {
      const std::string n = "t" + std::to_string(t) + "-" + std::to_string(i);
      if (i % 5 != 4) expected.insert(n);
      if (i % 50 == 0) expected.insert("dir" + std::to_string(t) + "-" + std::to_string(i));
    }
  }
  CHECK(ListDir(m.path("shared")) == expected);
  CHECK(ReadAll(m.path("shared/t2-7")) == m.path("shared/t2-7"));
  CHECK(Stat(m.path("shared")).st_nlink == 2 + kCreators * (kFilesEach / 50));
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

// One file of the exerciser: its descriptor on the mount and in the shadow.
struct ExercisedFile {
  int fd = -1;
  int shadow = -1;
};

TEST_CASE("mount: seeded random exerciser against a shadow copy", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "read_path=map",
                                       "read_path=iter,threads=2", "read_path=read",
                                       "cache=page");
  const bool use_mmap = options.find("cache=page") != std::string::npos;
  const char* seed_env = std::getenv("NVFS_SEED");
  const uint64_t seed = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 0) : 20251130;
  INFO("options: " << options << ", seed " << seed << " (set NVFS_SEED to replay)");
  MountedFs m;
  m.Start(options);
  char shadow_dir[] = "/dev/shm/nvfs-shadow-XXXXXX";
  REQUIRE(mkdtemp(shadow_dir) != nullptr);
  // Removed on every exit, a failed REQUIRE's too.
  struct RemoveDir {
    const char* dir;
    ~RemoveDir() { std::filesystem::remove_all(dir); }
  } remove_shadow{shadow_dir};
  constexpr int kFiles = 3, kOps = 3000;
  constexpr uint64_t kMaxSize = 3 * kMiB;
  std::vector<ExercisedFile> files(kFiles);
  auto name = [](int i) { return "file" + std::to_string(i); };
  auto open_file = [&](int i) {
    files[i].fd = open(m.path(name(i)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    files[i].shadow =
        open((std::string(shadow_dir) + "/" + name(i)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(files[i].fd >= 0);
    REQUIRE(files[i].shadow >= 0);
  };
  for (int i = 0; i < kFiles; ++i) open_file(i);
  auto size_of = [](int fd) {
    struct stat st {};
    REQUIRE(fstat(fd, &st) == 0);
    return static_cast<uint64_t>(st.st_size);
  };
  std::mt19937_64 rng(seed);
  auto uniform = [&](uint64_t below) { return below == 0 ? 0 : rng() % below; };
  std::string buf, back, shadow_back;
  std::map<std::string, int> counts;
  for (int op = 0; op < kOps; ++op) {
    const int i = static_cast<int>(uniform(kFiles));
    ExercisedFile& f = files[i];
    const uint64_t size = size_of(f.shadow);
    const int kind = static_cast<int>(uniform(use_mmap ? 100 : 88));
    INFO("op " << op << " kind " << kind << " on " << name(i) << ", size " << size);
    if (kind < 30) {  // write
      const uint64_t off = uniform(kMaxSize);
      const size_t len = 1 + uniform(std::min<uint64_t>(kMaxSize - off, 300 * kKiB));
      buf = Pattern(len, rng());
      REQUIRE(pwrite(f.fd, buf.data(), len, static_cast<off_t>(off)) == static_cast<ssize_t>(len));
      REQUIRE(pwrite(f.shadow, buf.data(), len, static_cast<off_t>(off)) ==
              static_cast<ssize_t>(len));
      ++counts["write"];
    } else if (kind < 60) {  // read, sometimes past the end
      const uint64_t off = uniform(size + 8192);
      const size_t len = 1 + uniform(1200 * kKiB);
      back.assign(len, '\1');
      shadow_back.assign(len, '\2');
      const ssize_t n = pread(f.fd, back.data(), len, static_cast<off_t>(off));
      const ssize_t sn = pread(f.shadow, shadow_back.data(), len, static_cast<off_t>(off));
      REQUIRE(n == sn);
      if (n > 0) CHECK(std::memcmp(back.data(), shadow_back.data(), static_cast<size_t>(n)) == 0);
      ++counts["read"];
    } else if (kind < 70) {  // truncate
      const uint64_t to = uniform(kMaxSize);
      REQUIRE(ftruncate(f.fd, static_cast<off_t>(to)) == 0);
      REQUIRE(ftruncate(f.shadow, static_cast<off_t>(to)) == 0);
      ++counts["truncate"];
    } else if (kind < 82) {  // fallocate: allocate, keep size, punch, zero range
      static const int kModes[] = {0, FALLOC_FL_KEEP_SIZE,
                                   FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                   FALLOC_FL_ZERO_RANGE,
                                   FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE};
      const int mode = kModes[uniform(5)];
      const off_t off = static_cast<off_t>(uniform(kMaxSize));
      const off_t len = static_cast<off_t>(
          1 + uniform(std::min<uint64_t>(kMaxSize - static_cast<uint64_t>(off), 512 * kKiB)));
      INFO("fallocate mode " << mode << " at " << off << " len " << len);
      REQUIRE(fallocate(f.fd, mode, off, len) == 0);
      if (mode & FALLOC_FL_ZERO_RANGE) {
        // tmpfs has no ZERO_RANGE: a punch, then an allocation, is the same.
        REQUIRE(fallocate(f.shadow, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) == 0);
        REQUIRE(fallocate(f.shadow, mode & FALLOC_FL_KEEP_SIZE, off, len) == 0);
      } else {
        REQUIRE(fallocate(f.shadow, mode, off, len) == 0);
      }
      ++counts["fallocate"];
    } else if (kind < 85) {  // fsync
      REQUIRE(fsync(f.fd) == 0);
      ++counts["fsync"];
    } else if (kind < 88) {  // reopen
      close(f.fd);
      close(f.shadow);
      open_file(i);
      ++counts["reopen"];
    } else if (size > 0) {  // mmap: write a range, read it back, msync
      const uint64_t off = uniform(size);
      const size_t len = 1 + uniform(std::min<uint64_t>(size - off, 64 * kKiB));
      const uint64_t map_off = off & ~uint64_t{4095};
      const size_t map_len = len + (off - map_off);
      void* p = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd,
                     static_cast<off_t>(map_off));
      void* s = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, f.shadow,
                     static_cast<off_t>(map_off));
      REQUIRE(p != MAP_FAILED);
      REQUIRE(s != MAP_FAILED);
      char* pb = static_cast<char*>(p) + (off - map_off);
      char* sb = static_cast<char*>(s) + (off - map_off);
      CHECK(std::memcmp(pb, sb, len) == 0);
      if (uniform(2) == 0) {
        buf = Pattern(len, rng());
        std::memcpy(pb, buf.data(), len);
        std::memcpy(sb, buf.data(), len);
        REQUIRE(msync(p, map_len, MS_SYNC) == 0);
      }
      munmap(p, map_len);
      munmap(s, map_len);
      ++counts["mmap"];
    }
    REQUIRE(size_of(f.fd) == size_of(f.shadow));
  }
  for (int i = 0; i < kFiles; ++i) {
    close(files[i].fd);
    close(files[i].shadow);
  }
  auto compare_all = [&](const char* when) {
    for (int i = 0; i < kFiles; ++i) {
      INFO(when << ": " << name(i));
      const std::string shadow = ReadAll(std::string(shadow_dir) + "/" + name(i));
      CHECK(ReadAll(m.path(name(i))) == shadow);
    }
  };
  compare_all("end of run");
  CHECK(m.Stop() == 0);
  m.Start();  // no page cache left: what the daemon stored
  compare_all("after remount");
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
  for (const auto& [what, n] : counts) INFO(what << ": " << n);
  CHECK(counts["write"] > 0);
}

TEST_CASE("mount: the read paths return the same bytes", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  // Data, holes and a partial last block; the expected bytes built alongside.
  const size_t size = 5 * kMiB + 1234;
  std::string expected(size, '\0');
  {
    Fd fd(m.path("f"), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    REQUIRE(ftruncate(fd.get(), static_cast<off_t>(size)) == 0);
    std::mt19937_64 rng(7);
    for (int i = 0; i < 40; ++i) {
      const size_t off = rng() % size;
      const size_t len = std::min<size_t>(size - off, 1 + rng() % (200 * kKiB));
      const std::string data = Pattern(len, rng());
      REQUIRE(pwrite(fd.get(), data.data(), len, static_cast<off_t>(off)) ==
              static_cast<ssize_t>(len));
      expected.replace(off, len, data);
    }
  }
  CHECK(m.Stop() == 0);
  for (const char* options : {"read_path=read", "read_path=iter", "read_path=map",
                              "read_path=read,cache=page", "read_path=iter,cache=page",
                              "read_path=map,cache=page"}) {
    INFO(options);
    m.Start(options);
    Fd fd(m.path("f"), O_RDONLY);
    REQUIRE(fd.ok());
    std::string back;
    for (size_t chunk : {size_t{1}, size_t{4095}, size_t{4096}, size_t{65539}, size_t{kMiB},
                         size_t{3 * kMiB}}) {
      for (size_t start : {size_t{0}, size_t{1}, size_t{4095}, size_t{777777}}) {
        INFO("chunk " << chunk << " from " << start);
        size_t at = start;
        int reads = 0;
        while (at < size + 10 && reads++ < 64) {
          back.assign(chunk, '\x55');
          const ssize_t n = pread(fd.get(), back.data(), chunk, static_cast<off_t>(at));
          const size_t want = at >= size ? 0 : std::min(chunk, size - at);
          REQUIRE(n == static_cast<ssize_t>(want));
          if (n == 0) break;
          REQUIRE(back.compare(0, want, expected, at, want) == 0);
          at += want + (chunk > 4096 ? 12345 : 0);
        }
      }
    }
    CHECK(ReadAll(m.path("f")) == expected);
    fd.Close();
    CHECK(m.Stop() == 0);
  }
}

// A deterministic tree: what is made, and what it must look like later.
struct TreeEntry {
  std::string path;
  mode_t mode;
  std::string content;  // file data or symlink target
};

std::string DescribeTree(const std::string& root) {
  std::string out;
  std::vector<std::string> stack{""};
  while (!stack.empty()) {
    const std::string rel = stack.back();
    stack.pop_back();
    const std::string full = rel.empty() ? root : root + "/" + rel;
    const struct stat st = Stat(full);
    out += rel + " mode=" + std::to_string(st.st_mode) + " nlink=" + std::to_string(st.st_nlink) +
           " uid=" + std::to_string(st.st_uid) + " gid=" + std::to_string(st.st_gid) +
           " size=" + std::to_string(st.st_size) + " mtime=" + std::to_string(st.st_mtim.tv_sec) +
           "." + std::to_string(st.st_mtim.tv_nsec) + " ino=" + std::to_string(st.st_ino);
    if (S_ISREG(st.st_mode)) {
      out += " crc=" + std::to_string(DigestFile(full).crc);
    } else if (S_ISLNK(st.st_mode)) {
      char target[5000];
      const ssize_t n = readlink(full.c_str(), target, sizeof target);
      REQUIRE(n >= 0);
      out += " -> " + std::string(target, static_cast<size_t>(n));
    }
    char xattrs[4096];
    const ssize_t list = llistxattr(full.c_str(), xattrs, sizeof xattrs);
    if (list > 0) out += " xattrs=" + std::string(xattrs, static_cast<size_t>(list));
    out += "\n";
    if (S_ISDIR(st.st_mode)) {
      for (const std::string& n : ListDir(full)) {
        if (n != "." && n != "..") stack.push_back(rel.empty() ? n : rel + "/" + n);
      }
    }
  }
  return out;
}

// The `map` read path replies with pointers into the mapping, which the
// kernel copies from after Map returned. A truncate that frees the blocks in
// that window must not let another user's file have them before the copy:
// the reader would receive that user's bytes (issue 11: on the old code
// this returned whole 1 MiB pieces of the other user's marker). Tight on
// space, so the other user's files take the freed blocks at once.
TEST_CASE("mount: a read never shows another user's bytes while its file is truncated and "
          "rewritten", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "allow_other", "allow_other,cache=page");
  INFO("options: " << options);
  const bool page_cache = options.find("cache=page") != std::string::npos;
  // One 1 MiB file read and rewritten, 1.5 MiB free besides: on the old
  // code 8-27 of ~2500 reads in 6 s held the marker (cache=none).
  constexpr size_t kFile = kMiB, kChunk = kMiB;
  constexpr uint64_t kFree = 3 * kMiB / 2;
  constexpr double kSeconds = 6;
  MountedFs m(64 * kMiB);
  m.Start(options);
  REQUIRE(mkdir(m.path("shared").c_str(), 01777) == 0);
  REQUIRE(chmod(m.path("shared").c_str(), 01777) == 0);
  const std::string victim(kChunk, 'V');
  {
    Fd fd(m.path("victim"), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    for (size_t off = 0; off < kFile; off += kChunk) {
      REQUIRE(pwrite(fd.get(), victim.data(), kChunk, static_cast<off_t>(off)) == kChunk);
    }
  }
  // Leave kFree: the other user's 1 MiB files and the rewrite compete for
  // the blocks each truncate frees.
  {
    const struct statvfs sv = StatFs(m.dir());
    const uint64_t free_bytes = uint64_t{sv.f_bavail} * sv.f_frsize;
    REQUIRE(free_bytes > kFree);
    Fd fd(m.path("filler"), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    const std::string zeros(kChunk, 'f');
    uint64_t left = free_bytes - kFree;
    for (uint64_t off = 0; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kChunk));
      REQUIRE(pwrite(fd.get(), zeros.data(), n, static_cast<off_t>(off)) == static_cast<ssize_t>(n));
      off += n;
      left -= n;
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kSeconds);
  // The other user: 1 MiB files of 'M', created and removed in a loop.
  int other_exit = -1;
  std::thread other([&] {
    const std::string marker(kChunk, 'M');
    const std::string dir = m.path("shared");
    other_exit = RunInChild([&]() -> int {
      if (!BecomeNobody()) {
        return 100;
      }
      int files = 0;
      while (std::chrono::steady_clock::now() < deadline) {
        const std::string name = dir + "/m" + std::to_string(files++ % 2);
        const int fd = open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) return 101;
        const ssize_t n = write(fd, marker.data(), marker.size());
        close(fd);
        if (n < 0 && errno != ENOSPC) return 102;
        if (unlink(name.c_str()) != 0) return 103;
      }
      return files > 0 ? 0 : 104;
    }, static_cast<unsigned>(kSeconds + 30));
  });
  ThreadErrors errors;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, foreign{0}, rewrites{0}, bytes{0};
  std::thread rewriter([&] {
    Fd fd(m.path("victim"), O_RDWR);
    if (!fd.ok()) return errors.Add("open victim for rewriting");
    while (!stop.load(std::memory_order_relaxed)) {
      if (ftruncate(fd.get(), 0) != 0) return errors.Add("ftruncate");
      for (size_t off = 0; off < kFile; off += kChunk) {
        if (pwrite(fd.get(), victim.data(), kChunk, static_cast<off_t>(off)) < 0 &&
            errno != ENOSPC) {
          return errors.Add("pwrite");
        }
      }
      rewrites.fetch_add(1, std::memory_order_relaxed);
    }
  });
  std::thread reader([&] {
    Fd fd(m.path("victim"), O_RDONLY);
    if (!fd.ok()) return errors.Add("open victim for reading");
    std::string buf(kChunk, '\0');
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      const off_t off = static_cast<off_t>(i % (kFile / kChunk) * kChunk);
      // With the page cache, drop the range first, so each read is a fill.
      if (page_cache) (void)posix_fadvise(fd.get(), off, kChunk, POSIX_FADV_DONTNEED);
      const ssize_t n = pread(fd.get(), buf.data(), kChunk, off);
      if (n < 0) return errors.Add("pread");
      // The victim's own bytes, or zeros (a page-cache fill cut short by
      // the truncate): never anything else.
      for (ssize_t k = 0; k < n; ++k) {
        if (buf[k] != 'V' && buf[k] != '\0') {
          foreign.fetch_add(1, std::memory_order_relaxed);
          break;
        }
      }
      reads.fetch_add(1, std::memory_order_relaxed);
      bytes.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    }
  });
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  reader.join();
  rewriter.join();
  other.join();
  errors.Check();
  CHECK(other_exit == 0);
  INFO("reads: " << reads << " (" << bytes / kMiB << " MiB), rewrites: " << rewrites);
  CHECK(reads > 20);  // enough to have raced (a loaded machine did 84 in the window)
  CHECK(rewrites > 2);
  CHECK(foreign == 0);
  CHECK(m.Stop() == 0);
  const FsckResult fsck = FsckImage(m.image());
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
}

TEST_CASE("mount: persistence across unmount and mount", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  REQUIRE(mkdir(m.path("a").c_str(), 0750) == 0);
  REQUIRE(mkdir(m.path("a/b").c_str(), 0700) == 0);
  for (int i = 0; i < 50; ++i) {
    WriteFile(m.path("a/f" + std::to_string(i)), Pattern(static_cast<size_t>(i) * 997, i));
  }
  WriteFile(m.path("a/b/large"), Pattern(3 * kMiB + 17, 99));
  REQUIRE(link(m.path("a/f3").c_str(), m.path("a/b/hard").c_str()) == 0);
  REQUIRE(symlink("../f1", m.path("a/b/sym").c_str()) == 0);
  REQUIRE(mknod(m.path("fifo").c_str(), S_IFIFO | 0640, 0) == 0);
  REQUIRE(setxattr(m.path("a/f5").c_str(), "user.kept", "value", 5, 0) == 0);
  REQUIRE(chown(m.path("a/f6").c_str(), 1000, 1001) == 0);
  const timespec times[2] = {{111, 222}, {333, 444}};
  REQUIRE(utimensat(AT_FDCWD, m.path("a/f7").c_str(), times, 0) == 0);
  {
    Fd fd(m.path("sparse"), O_WRONLY | O_CREAT, 0644);
    REQUIRE(pwrite(fd.get(), "end", 3, 100 * kMiB) == 3);
  }
  const std::string before = DescribeTree(m.dir());
  CHECK(m.Stop() == 0);
  const FsckResult fsck = FsckImage(m.image());
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
  CHECK(fsck.output.find("not cleanly") == std::string::npos);
  m.Start();
  CHECK(DescribeTree(m.dir()) == before);
  CHECK(m.Stop() == 0);
  m.Start("cache=page,read_path=iter");
  CHECK(DescribeTree(m.dir()) == before);
  CHECK(m.Stop() == 0);
}

// Eight processes write files through the mount (each its own directory;
// every file created, written, closed, and every fourth fsynced first), and
// the daemon is killed under them; after each kill fsck -n finds the
// namespace recoverable as it is and a new mount reads back every file a
// writer had closed. One round here; NVFS_KILL_ROUNDS=20 for the longer
// run (issue 21, item 7). Over io_uring too: mount-uring runs this suite
// again with NVFS_IO_URING=on.
TEST_CASE("mount: kill -9 under eight writing processes", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  const char* env_rounds = std::getenv("NVFS_KILL_ROUNDS");
  const int rounds = env_rounds != nullptr ? std::max(1, std::atoi(env_rounds)) : 1;
  constexpr int kWriters = 8;
  INFO("options: " << options << "; " << rounds << " rounds");
  MountedFs m(512 * kMiB);
  m.Start(options);
  struct Shared {
    std::atomic<int> done[kWriters];  // files closed (and fsynced where due)
  };
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
  REQUIRE(mem != MAP_FAILED);
  auto* shared = new (mem) Shared{};
  auto content = [](int round, int k, int i) {
    const size_t size = i % 10 == 9 ? 1 * kMiB + 3 : 1 + static_cast<size_t>(i) * 7919 % 65536;
    return Pattern(size, static_cast<uint64_t>(round) * 1000003 + k * 10007 + i);
  };
  long total_files = 0;
  for (int round = 0; round < rounds; ++round) {
    INFO("round " << round);
    const std::string dir = "r" + std::to_string(round);
    REQUIRE(mkdir(m.path(dir).c_str(), 0755) == 0);
    for (int k = 0; k < kWriters; ++k) {
      REQUIRE(mkdir(m.path(dir + "/w" + std::to_string(k)).c_str(), 0755) == 0);
      shared->done[k] = 0;
    }
    std::vector<pid_t> writers;
    for (int k = 0; k < kWriters; ++k) {
      const pid_t pid = fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        for (int i = 0;; ++i) {
          const std::string f = m.path(dir + "/w" + std::to_string(k) + "/f" + std::to_string(i));
          const int fd = open(f.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
          if (fd < 0) _exit(0);  // the daemon is gone
          const std::string data = content(round, k, i);
          bool ok = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
          if (ok && i % 4 == 3) ok = fsync(fd) == 0;
          ok = close(fd) == 0 && ok;
          if (!ok) _exit(0);
          shared->done[k] = i + 1;
        }
      }
      writers.push_back(pid);
    }
    const auto sum = [&] {
      int n = 0;
      for (int k = 0; k < kWriters; ++k) n += shared->done[k];
      return n;
    };
    const bool progressed = Eventually([&] { return sum() >= 40 * kWriters; }, 60);
    const int code = m.Signal(SIGKILL);
    // Writers end on the dead mount's errors; one that does not is killed
    // (ours, by pid).
    for (pid_t pid : writers) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      int status = 0;
      while (waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          kill(pid, SIGKILL);
          waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    CHECK(progressed);
    CHECK(code == 128 + SIGKILL);
    int done[kWriters];
    for (int k = 0; k < kWriters; ++k) done[k] = shared->done[k];
    const FsckResult crashed = FsckImage(m.image());
    INFO("fsck after the kill: " << crashed.output);
    CHECK(crashed.exit_code == 0);
    m.Start(options);
    int checked = 0;
    for (int k = 0; k < kWriters; ++k) {
      for (int i = 0; i < done[k]; ++i) {
        const std::string f = m.path(dir + "/w" + std::to_string(k) + "/f" + std::to_string(i));
        INFO("writer " << k << " file " << i);
        REQUIRE(PathExists(f));
        CHECK(ReadAll(f) == content(round, k, i));
        ++checked;
      }
    }
    total_files += checked;
    std::printf("kill -9 under %d writers (%s), round %d: %d files closed before the kill, "
                "all read back\n", kWriters, options.empty() ? "cache=none" : options.c_str(),
                round, checked);
    // Room for the next round.
    std::filesystem::remove_all(m.path(dir));
  }
  munmap(mem, sizeof(Shared));
  REQUIRE(m.Stop() == 0);
  const FsckResult end = FsckImage(m.image());
  INFO(end.output);
  CHECK(end.exit_code == 0);
  std::printf("kill -9 under %d writers: %d rounds, %ld files checked\n", kWriters, rounds,
              total_files);
}

TEST_CASE("mount: kill -9 of the daemon in the middle of a workload", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  const int kill_after = GENERATE(30, 700);
  INFO("options: " << options << "; kill after " << kill_after << " files");
  MountedFs m;
  m.Start(options);
  REQUIRE(mkdir(m.path("w").c_str(), 0755) == 0);
  auto content = [](int i) {
    const size_t size = i % 10 == 9 ? 2 * kMiB + 3 : 1 + static_cast<size_t>(i) * 7919 % 65536;
    return Pattern(size, i);
  };
  // Step i: file f<i> created and written; every third also a directory
  // d<i>; every seventh also a 1 MiB scratch file t<i> written and removed
  // (its blocks must come back); then files_done = i + 1. Every fifth file
  // is renamed to r<i> afterwards (renames_done = i once that returned).
  std::atomic<int> files_done{0};
  std::atomic<int> renames_done{-1};
  std::atomic<bool> stopped{false};
  std::thread worker([&] {
    const std::string scratch = Pattern(1 * kMiB, 77);
    for (int i = 0;; ++i) {
      const std::string f = m.path("w/f" + std::to_string(i));
      int fd = open(f.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) break;
      const std::string data = content(i);
      bool ok = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
      close(fd);
      if (!ok) break;
      if (i % 3 == 0 && mkdir(m.path("w/d" + std::to_string(i)).c_str(), 0755) != 0) break;
      if (i % 7 == 6) {
        const std::string t = m.path("w/t" + std::to_string(i));
        fd = open(t.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) break;
        ok = write(fd, scratch.data(), scratch.size()) == static_cast<ssize_t>(scratch.size());
        close(fd);
        if (!ok || unlink(t.c_str()) != 0) break;
      }
      files_done = i + 1;
      if (i % 5 == 4) {
        if (rename(f.c_str(), m.path("w/r" + std::to_string(i)).c_str()) != 0) break;
        renames_done = i;
      }
    }
    stopped = true;
  });
  const bool progressed = Eventually([&] { return files_done >= kill_after || stopped; }, 30);
  const int code = m.Signal(SIGKILL);
  worker.join();
  REQUIRE(progressed);
  CHECK(code == 128 + SIGKILL);
  const int done = files_done, renamed = renames_done;
  INFO("files completed before the kill: " << done << ", last rename " << renamed);
  CHECK(done >= kill_after);

  // The namespace is recoverable as it is (fsck -n needs no repair), and a
  // new mount shows every completed operation.
  const FsckResult crashed = FsckImage(m.image());
  INFO("fsck after the kill: " << crashed.output);
  CHECK(crashed.exit_code == 0);
  m.Start(options);
  int checked = 0;
  for (int i = 0; i < done; ++i) {
    INFO("file " << i);
    const bool renamed_i = i % 5 == 4 && i <= renamed;
    const bool maybe_renamed = i % 5 == 4 && !renamed_i;  // the rename in flight
    std::string name = "w/" + std::string(renamed_i ? "r" : "f") + std::to_string(i);
    if (maybe_renamed && !PathExists(m.path(name))) name = "w/r" + std::to_string(i);
    REQUIRE(PathExists(m.path(name)));
    CHECK(ReadAll(m.path(name)) == content(i));
    if (i % 3 == 0) CHECK(S_ISDIR(Stat(m.path("w/d" + std::to_string(i))).st_mode));
    if (i % 7 == 6) CHECK_FALSE(PathExists(m.path("w/t" + std::to_string(i))));
    ++checked;
  }
  CHECK(checked == done);
  // And it works on: more writes, a clean unmount, a clean fsck.
  WriteFile(m.path("after"), "after the crash");
  CHECK(m.Stop() == 0);
  const FsckResult fsck = FsckImage(m.image());
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
}

TEST_CASE("mount: single-threaded (-s) and debug (-d) sessions", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start("", {"-s"});
  WriteFile(m.path("f"), Pattern(3 * kMiB, 8));
  CHECK(ReadAll(m.path("f")) == Pattern(3 * kMiB, 8));
  CHECK(m.Stop() == 0);
  m.Start("threads=1", {"-d"});
  CHECK(ReadAll(m.path("f")) == Pattern(3 * kMiB, 8));
  CHECK(m.Stop() == 0);
  const std::string log = m.log();
  CHECK(log.find("opcode: INIT") != std::string::npos);
  CHECK(log.find("opcode: READ") != std::string::npos);
}

TEST_CASE("mount: refusals fail with one line and mount nothing", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  auto expect_refusal = [&](const std::vector<std::string>& args, const std::string& why) {
    const DaemonResult r = RunDaemonExpectingFailure(args, m.dir());
    INFO(why << ": " << r.output);
    CHECK(r.exit_code == 1);
    CHECK_FALSE(r.mounted);
    const std::vector<std::string> lines = Lines(r.output);
    CHECK(lines.size() == 1);
    if (!lines.empty()) CHECK(lines[0].rfind("nvfs: ", 0) == 0);
    CHECK_FALSE(IsMountPoint(m.dir()));
    return lines.empty() ? std::string() : lines[0];
  };
  const std::string work = "/dev/shm/nvfs-mt-refuse-" + std::to_string(getpid());

  // A damaged image: the primary superblock's checksum no longer matches.
  const std::string damaged = work + "-damaged.img";
  REQUIRE(std::system(("cp " + m.image() + " " + damaged).c_str()) == 0);
  FlipByte(damaged, 64);
  const FileDigest damaged_before = DigestFile(damaged);
  CHECK(expect_refusal({damaged, m.dir()}, "damaged").find("superblock") != std::string::npos);
  CHECK(DigestFile(damaged) == damaged_before);
  unlink(damaged.c_str());

  // A foreign image (ext4), and one of zeros.
  const std::string foreign = work + "-ext4.img";
  MakeFile(foreign, 64 * kMiB);
  if (RunProgram({"mkfs.ext4", "-q", "-F", foreign}) == 0) {
    const FileDigest before = DigestFile(foreign);
    CHECK(expect_refusal({foreign, m.dir()}, "ext4").find("no nvfs superblock") !=
          std::string::npos);
    CHECK(DigestFile(foreign) == before);
  } else {
    WARN("mkfs.ext4 not available: the foreign-image case is skipped");
  }
  MakeFile(foreign, 64 * kMiB);
  expect_refusal({foreign, m.dir()}, "zeros");
  MakeFile(foreign, 4096);
  expect_refusal({foreign, m.dir()}, "too small");
  unlink(foreign.c_str());

  // Missing device, missing mount point, a directory as device.
  expect_refusal({work + "-missing.img", m.dir()}, "missing");
  expect_refusal({m.image(), m.dir() + "-missing"}, "no mount point");
  expect_refusal({"/tmp", m.dir()}, "a directory");
  // Options: an unknown nvfs value, and one libfuse does not know.
  CHECK(RunDaemonExpectingFailure({"-o", "cache=bogus", m.image(), m.dir()}, m.dir()).exit_code ==
        1);
  for (const char* timeout : {"attr_timeout=-2", "entry_timeout=1e10", "attr_timeout=x"}) {
    INFO(timeout);
    CHECK(RunDaemonExpectingFailure({"-o", timeout, m.image(), m.dir()}, m.dir()).exit_code == 1);
  }
  const DaemonResult unknown = RunDaemonExpectingFailure({"-o", "bogus", m.image(), m.dir()},
                                                         m.dir());
  CHECK(unknown.exit_code == 1);
  CHECK_FALSE(unknown.mounted);
  CHECK(RunDaemonExpectingFailure({m.image()}, m.dir()).exit_code == 1);

  // In use: a second mount of a mounted image.
  m.Start();
  WriteFile(m.path("first"), "still here");
  char other[] = "/tmp/nvfs-mnt-second-XXXXXX";
  REQUIRE(mkdtemp(other) != nullptr);
  {
    const DaemonResult r = RunDaemonExpectingFailure({m.image(), other}, other);
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_FALSE(r.mounted);
    CHECK(Lines(r.output).size() == 1);
    CHECK(r.output.find("in use") != std::string::npos);
  }
  rmdir(other);
  CHECK(ReadAll(m.path("first")) == "still here");
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

TEST_CASE("mount: SIGTERM and SIGINT unmount cleanly", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  int round = 0;
  for (int sig : {SIGTERM, SIGINT}) {
    INFO("signal " << sig);
    m.Start();
    WriteFile(m.path("f" + std::to_string(round)), "before signal");
    const int code = m.Signal(sig);
    INFO("daemon log: " << m.log());
    CHECK(code == 0);
    CHECK_FALSE(IsMountPoint(m.dir()));
    const FsckResult fsck = FsckImage(m.image());
    INFO(fsck.output);
    CHECK(fsck.exit_code == 0);
    CHECK(fsck.output.find("not cleanly") == std::string::npos);
    ++round;
  }
  m.Start("ro");
  CHECK(ReadAll(m.path("f0")) == "before signal");
  CHECK(ReadAll(m.path("f1")) == "before signal");
  CHECK(m.Stop() == 0);

  // SIGTERM while a process still holds an unlinked file open: the daemon
  // gives the kernel's open files back to the core before unmounting, so
  // the file is freed now, not left on the orphan list for the next mount.
  m.Start();
  {
    Fd fd(m.path("held"), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    const std::string data = Pattern(4 * kMiB, 9);
    REQUIRE(write(fd.get(), data.data(), data.size()) == static_cast<ssize_t>(data.size()));
    REQUIRE(unlink(m.path("held").c_str()) == 0);
    CHECK(m.Signal(SIGTERM) == 0);
  }
  const RunResult dump = Run("NVFS_DUMP", {m.image()});
  INFO(dump.out);
  CHECK(dump.out.find("Orphan list head:    0") != std::string::npos);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

TEST_CASE("mount: a read-only mount", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  WriteFile(m.path("f"), "content");
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  CHECK(m.Stop() == 0);
  const FileDigest before = DigestFile(m.image());
  m.Start("ro");
  CHECK(ReadAll(m.path("f")) == "content");
  CHECK(ListDir(m.path("d")) == std::set<std::string>{".", ".."});
  CHECK(Err(open(m.path("f").c_str(), O_WRONLY)) == EROFS);
  CHECK(Err(open(m.path("new").c_str(), O_CREAT | O_WRONLY, 0644)) == EROFS);
  CHECK(Err(mkdir(m.path("d2").c_str(), 0755)) == EROFS);
  CHECK(Err(unlink(m.path("f").c_str())) == EROFS);
  CHECK(Err(chmod(m.path("f").c_str(), 0600)) == EROFS);
  CHECK(Err(setxattr(m.path("f").c_str(), "user.x", "1", 1, 0)) == EROFS);
  CHECK((StatFs(m.dir()).f_flag & ST_RDONLY) != 0);
  // fsck may read a read-only mounted namespace alongside.
  CHECK(FsckImage(m.image()).exit_code == 0);
  CHECK(m.Stop() == 0);
  CHECK(DigestFile(m.image()) == before);  // a read-only mount writes nothing
}

// Kills a daemon serving `image` that the test started in another mount
// namespace (found by its command line: the image path is unique to the
// test). Returns the number killed.
int KillDaemonsOf(const std::string& image) {
  int killed = 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> argv;
    for (size_t at = 0; at < cmdline.size();) {
      const size_t end = cmdline.find('\0', at);
      argv.push_back(cmdline.substr(at, end - at));
      at = end == std::string::npos ? cmdline.size() : end + 1;
    }
    if (argv.size() >= 2 && argv[0].size() >= 4 &&
        argv[0].compare(argv[0].size() - 4, 4, "nvfs") == 0 &&
        std::find(argv.begin(), argv.end(), image) != argv.end()) {
      kill(pid, SIGKILL);
      ++killed;
    }
  }
  closedir(proc);
  return killed;
}

// mount(8) runs its helpers with a PATH of its own (the caller's is dropped),
// so mount.fuse3 finds `nvfs` only in the standard directories. The test
// runs in a private mount namespace where the build directory is bind-mounted
// over /usr/local/sbin: nothing is installed, nothing outside changes.
TEST_CASE("mount: mount -t fuse.nvfs and an fstab line", "[mount]") {
  NVFS_REQUIRE_FUSE();
  if (RunProgram({"unshare", "--version"}) != 0) {
    NVFS_SKIP("unshare(1) is not available");
  }
  MountedFs m;
  std::string build_dir = std::getenv("NVFS_DAEMON");
  build_dir.resize(build_dir.rfind('/'));
  const std::string fstab = m.image() + ".fstab";
  {
    std::ofstream out(fstab);
    out << "# nvfs test\n" << m.image() << " " << m.dir() << " fuse.nvfs defaults,allow_other 0 0\n";
  }
  const std::string script = m.image() + ".sh";
  {
    std::ofstream out(script);
    out << "set -eu\n"
           "img=$1 dir=$2 build=$3 fstab=$4\n"
           "wait_free() { for i in $(seq 500); do flock -n \"$img\" true && return 0; "
           "sleep 0.01; done; echo 'daemon did not exit'; return 1; }\n"
           "mount --bind \"$build\" /usr/local/sbin\n"
           "mount -t fuse.nvfs \"$img\" \"$dir\" -o allow_other,cache=page\n"
           "grep -q \"^$img $dir fuse.nvfs \" /proc/self/mounts\n"
           "echo via-mount-t > \"$dir/hello\"\n"
           "umount \"$dir\"\n"
           "wait_free\n"
           "mount -T \"$fstab\" \"$dir\"\n"
           "grep \"^$img $dir fuse.nvfs \" /proc/self/mounts | grep -q allow_other\n"
           "test \"$(cat \"$dir/hello\")\" = via-mount-t\n"
           "umount \"$dir\"\n"
           "wait_free\n"
           "echo ok\n";
  }
  const RunResult r = RunShell("unshare --mount --propagation private bash " + script + " " +
                               m.image() + " " + m.dir() + " " + build_dir + " " + fstab);
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("ok") != std::string::npos);
  if (!WaitImageFree(m.image(), 5)) {
    CHECK(KillDaemonsOf(m.image()) == 0);  // a daemon left behind in the namespace
    WaitImageFree(m.image(), 5);
  }
  unlink(script.c_str());
  unlink(fstab.c_str());
  CHECK(FsckImage(m.image()).exit_code == 0);
  m.Start();
  CHECK(ReadAll(m.path("hello")) == "via-mount-t\n");
  CHECK(m.Stop() == 0);
}

}  // namespace
}  // namespace nvfs::test

namespace nvfs::test {
namespace {

// Points file `name`'s first block at group 0's descriptor block, through the
// core on the unmounted image (the mapping is the image file).
void DamageFirstPointer(const std::string& image, const std::string& name) {
  auto fs = Filesystem::Mount(image, MountOptions{});
  REQUIRE(fs.ok());
  auto attr = (*fs)->Lookup(1, name);
  REQUIRE(attr.ok());
  const Geometry& g = (*fs)->geometry();
  auto* inode = reinterpret_cast<format::Inode*>(const_cast<std::byte*>((*fs)->media().base()) +
                                                 g.InodeOffset(attr->ino));
  inode->map.file.direct[0] = g.GroupDescBlock(0);
  (*fs)->Forget(attr->ino, 1);
  REQUIRE((*fs)->Unmount().ok());
}

TEST_CASE("mount: damage found by a read turns the mount read-only (errors=remount-ro)",
          "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  WriteFile(m.path("f"), Pattern(8192, 3));
  WriteFile(m.path("g"), "g");
  CHECK(m.Stop() == 0);
  DamageFirstPointer(m.image(), "f");

  m.Start("cache=none");
  {
    Fd fd(m.path("f"), O_RDONLY);
    REQUIRE(fd.ok());
    char buf[4096];
    CHECK(read(fd.get(), buf, sizeof buf) == -1);
    CHECK(errno == EIO);
  }
  CHECK(mkdir(m.path("d").c_str(), 0755) == -1);
  CHECK(errno == EROFS);
  {
    Fd fd(m.path("g"), O_WRONLY);
    CHECK(fd.error() == EROFS);
  }
  CHECK(ReadAll(m.path("g")) == "g");  // reads go on
  const std::string log = m.log();
  INFO(log);
  size_t lines = 0;
  for (size_t at = log.find("damage found"); at != std::string::npos;
       at = log.find("damage found", at + 1)) {
    ++lines;
  }
  CHECK(lines == 1);
  CHECK(log.find("read-only from now on") != std::string::npos);
  CHECK(m.Stop() == 0);

  // The flag is on the media: the next mount is read-only, with a warning.
  m.Start();
  CHECK(mkdir(m.path("d").c_str(), 0755) == -1);
  CHECK(errno == EROFS);
  CHECK(m.log().find("has recorded errors") != std::string::npos);
  CHECK(m.Stop() == 0);
}

// fstests generic/103 (issue 14.2): an allocation of what statfs says is
// available must succeed. The pointer blocks that map it come out of the
// free blocks too, so f_bavail leaves room for them.
TEST_CASE("mount: fallocate of all the space statfs says is available succeeds", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  struct statvfs sv;
  REQUIRE(statvfs(m.dir().c_str(), &sv) == 0);
  INFO("bsize " << sv.f_bsize << " bfree " << sv.f_bfree << " bavail " << sv.f_bavail);
  REQUIRE(sv.f_bavail > 0);
  CHECK(sv.f_bavail <= sv.f_bfree);
  const int fd = open(m.path("all").c_str(), O_CREAT | O_RDWR, 0644);
  REQUIRE(fd >= 0);
  const off_t len = static_cast<off_t>(sv.f_bavail * sv.f_frsize);
  const int rc = fallocate(fd, 0, 0, len);
  const int err = errno;
  INFO("fallocate: " << (rc == 0 ? "ok" : std::strerror(err)));
  CHECK(rc == 0);
  struct stat st;
  REQUIRE(fstat(fd, &st) == 0);
  CHECK(st.st_size == (rc == 0 ? len : 0));
  close(fd);
  REQUIRE(statvfs(m.dir().c_str(), &sv) == 0);
  CHECK(sv.f_bavail < 64);  // nearly nothing left: the estimate is close
  REQUIRE(unlink(m.path("all").c_str()) == 0);
}

// generic/511: a file filling the filesystem, removed, and at once a file
// of the same size — ENOSPC, because the removed file's blocks were freed
// only at the kernel's FORGET of its inode, which comes whenever the kernel
// drops the inode (asynchronously after the unlink; never while anything
// still holds it, as the O_PATH descriptor here does). The blocks of a
// file that has lost its last name and has no open file now go at the
// unlink, or at the RELEASE of its last open file; the inode itself (size
// 0 from then on) stays until FORGET.
TEST_CASE("mount: a removed file's blocks are free at once, its inode kept until forget "
          "(generic/511)",
          "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m(64 * kMiB);
  m.Start(options);
  // Waits up to 5 s for statfs to show at least `want` blocks available
  // (RELEASE is sent asynchronously after close).
  const auto wait_avail = [&](fsblkcnt_t want) {
    fsblkcnt_t avail = 0;
    for (int i = 0; i < 500; ++i) {
      avail = StatFs(m.dir()).f_bavail;
      if (avail >= want) break;
      usleep(10000);
    }
    return avail;
  };
  const struct statvfs empty = StatFs(m.dir());
  const off_t len = static_cast<off_t>(empty.f_bavail * empty.f_frsize);
  {
    Fd fd(m.path("fill"), O_CREAT | O_RDWR);
    REQUIRE(fd.ok());
    REQUIRE(fallocate(fd.get(), 0, 0, len) == 0);
    REQUIRE(pwrite(fd.get(), "data", 4, 0) == 4);
  }
  {
    // Held by an O_PATH descriptor (no OPEN): the kernel keeps the inode.
    Fd path(m.path("fill"), O_PATH);
    REQUIRE(path.ok());
    REQUIRE(unlink(m.path("fill").c_str()) == 0);
    {
      Fd fd(m.path("again"), O_CREAT | O_RDWR);
      REQUIRE(fd.ok());
      const int rc = fallocate(fd.get(), 0, 0, len);
      INFO("fallocate after the rm: " << (rc == 0 ? "ok" : std::strerror(errno)));
      CHECK(rc == 0);
    }
    // Opened again through /proc: the removed file reads as what it is
    // now, empty.
    Fd reopened("/proc/self/fd/" + std::to_string(path.get()), O_RDONLY);
    INFO("reopen: " << std::strerror(reopened.error()));
    REQUIRE(reopened.ok());
    struct stat st {};
    REQUIRE(fstat(reopened.get(), &st) == 0);
    CHECK(st.st_size == 0);
    CHECK(st.st_nlink == 0);
    char c;
    CHECK(pread(reopened.get(), &c, 1, 0) == 0);
  }
  REQUIRE(unlink(m.path("again").c_str()) == 0);
  CHECK(wait_avail(empty.f_bavail) == empty.f_bavail);

  // Removed while open: the data stays readable through the open file, and
  // its blocks go at the RELEASE of the last one.
  const std::string data = Pattern(4 * kMiB, 11);
  WriteFile(m.path("held"), data);
  {
    Fd path(m.path("held"), O_PATH);
    REQUIRE(path.ok());
    {
      Fd fd(m.path("held"), O_RDWR);
      REQUIRE(fd.ok());
      REQUIRE(unlink(m.path("held").c_str()) == 0);
      struct stat open_st {};
      REQUIRE(fstat(fd.get(), &open_st) == 0);  // the kernel caches the size
      CHECK(open_st.st_size == static_cast<off_t>(data.size()));
      std::string back(data.size(), '\0');
      REQUIRE(pread(fd.get(), back.data(), back.size(), 0) == static_cast<ssize_t>(back.size()));
      CHECK(back == data);
      CHECK(StatFs(m.dir()).f_bavail < empty.f_bavail);  // still in use
    }
    CHECK(wait_avail(empty.f_bavail) == empty.f_bavail);
    // Opened again after its last close: empty, though the kernel had the
    // old size (and, cache=page, the pages) cached from the reads above.
    Fd reopened("/proc/self/fd/" + std::to_string(path.get()), O_RDONLY);
    REQUIRE(reopened.ok());
    struct stat st {};
    REQUIRE(fstat(reopened.get(), &st) == 0);
    CHECK(st.st_size == 0);
    char c;
    CHECK(pread(reopened.get(), &c, 1, 0) == 0);
  }

  // An O_TMPFILE file keeps its data while it may still be linked: after
  // its last close, through an O_PATH descriptor of /proc/self/fd.
  {
    Fd tmp(m.dir(), O_TMPFILE | O_RDWR, 0600);
    INFO("O_TMPFILE: " << std::strerror(tmp.error()));
    REQUIRE(tmp.ok());
    REQUIRE(pwrite(tmp.get(), data.data(), data.size(), 0) == static_cast<ssize_t>(data.size()));
    Fd path("/proc/self/fd/" + std::to_string(tmp.get()), O_PATH);
    REQUIRE(path.ok());
    tmp.Close();
    usleep(100000);  // the RELEASE
    const std::string proc = "/proc/self/fd/" + std::to_string(path.get());
    REQUIRE(linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, m.path("linked").c_str(),
                   AT_SYMLINK_FOLLOW) == 0);
  }
  CHECK(ReadAll(m.path("linked")) == data);
  REQUIRE(unlink(m.path("linked").c_str()) == 0);
  CHECK(wait_avail(empty.f_bavail) == empty.f_bavail);
  CHECK(m.Stop() == 0);
  const FsckResult fsck = FsckImage(m.image());
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
}

// fstests runs fsck after every test and mounts again at once: umount(2)
// returns before the daemon has even seen its session end, so an fsck or
// a mount started right then found the image "in use" (12 of 20 fscks
// right after umount with 926e0ad's daemon, on a loaded machine). The
// daemon now marks the namespace as served through its mount; once the
// mount is gone, openers wait for the daemon to let go.
TEST_CASE("mount: fsck and a new mount right after umount wait for the daemon", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  for (int i = 0; i < 5; ++i) {
    INFO("cycle " << i);
    m.Start();
    {
      Fd fd(m.path("f" + std::to_string(i)), O_WRONLY | O_CREAT, 0644);
      REQUIRE(fd.ok());
      REQUIRE(write(fd.get(), "x", 1) == 1);
    }
    // Still mounted: refused at once.
    const auto asked = std::chrono::steady_clock::now();
    const FsckResult busy = FsckImage(m.image());
    CHECK(busy.exit_code == 8);
    CHECK(busy.output.find("in use") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - asked < std::chrono::seconds(2));
    // (umount may find the mount busy for a moment: the kernel sends the
    // file's RELEASE in the background.)
    REQUIRE(Eventually([&] { return RunProgram({"umount", m.dir()}) == 0; }));
    const FsckResult after = FsckImage(m.image());
    INFO("fsck: " << after.output);
    CHECK(after.exit_code == 0);
    CHECK(m.WaitExit() == 0);
  }
  m.Start();
  REQUIRE(Eventually([&] { return RunProgram({"umount", m.dir()}) == 0; }));
  const char* daemon = std::getenv("NVFS_DAEMON");
  REQUIRE(daemon != nullptr);
  const std::string log = m.dir() + ".again.log";
  const int rc = RunProgram({daemon, m.image(), m.dir()}, log);  // detaches once mounted
  INFO("second daemon: " << ReadAll(log));
  std::remove(log.c_str());
  CHECK(rc == 0);
  if (rc == 0) {
    CHECK(IsMountPoint(m.dir()));
    CHECK(PathExists(m.path("f4")));
    CHECK(Eventually([&] { return RunProgram({"umount", m.dir()}) == 0; }));
    CHECK(WaitImageFree(m.image(), 10));
  }
  CHECK(m.WaitExit() == 0);  // the first daemon, long gone
  CHECK(FsckImage(m.image()).exit_code == 0);
}

// fstests generic/451: buffered reads racing asynchronous direct writes of
// the same file (cache=page). The kernel drops no page after an
// asynchronous direct write (fs/fuse/file.c, fuse_aio_complete), so a page
// a reader cached while the write was in flight kept the old bytes, across
// opens (keep_cache). Readers in two processes reopen and read the file
// while one process overwrites it with io_submit(O_DIRECT) and then reads
// it back through a fresh buffered open, as generic/451 does, for 4 s.
// Timing-dependent: on 926e0ad's daemon it failed 3 of 4 runs; on 8d3bc82's
// (only the next open after a direct write kept no cache: a reader's open
// took that mark, and the checking open then read pages the thread had not
// dropped yet) it failed 4 of 4 runs, with stale bytes from byte 0 after
// 15 to 585 of about 1900 rounds; with the fix 4 of 4 passed (loaded
// machine).
TEST_CASE("mount: buffered reads after asynchronous direct writes see the new bytes",
          "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  // Over /dev/fuse even in the io_uring pass (mount_uring.sh), to keep the
  // pass short: 8d3bc82's daemon saw 1 stale round in 1217 over io_uring
  // too; with the fix a by-hand io_uring mount saw none (generic/451's
  // load 2 x 15 s, 300 rounds of this race).
  m.Start("cache=page,io_uring=off");
  const std::string f = m.path("cycle");
  constexpr size_t kSize = 640 * 1024;
  {
    Fd fd(f, O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    const std::string zeros(kSize, '\0');
    REQUIRE(pwrite(fd.get(), zeros.data(), kSize, 0) == static_cast<ssize_t>(kSize));
  }
  const std::string stop = m.dir() + ".stop";
  std::remove(stop.c_str());
  std::vector<pid_t> readers;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::vector<char> buf(kSize);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (access(stop.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < until) {
        const int fd = open(f.c_str(), O_RDWR | O_CREAT, 0644);  // as xfs_io -f
        if (fd >= 0) {
          struct stat st;
          (void)fstat(fd, &st);
          (void)!pread(fd, buf.data(), kSize, 0);
          close(fd);
        }
      }
      _exit(0);
    }
    readers.push_back(pid);
  }
  void* mem = nullptr;
  REQUIRE(posix_memalign(&mem, 4096, kSize) == 0);
  std::unique_ptr<char, void (*)(void*)> buf(static_cast<char*>(mem), std::free);
  aio_context_t ctx = 0;
  REQUIRE(syscall(SYS_io_setup, 1, &ctx) == 0);
  int stale_rounds = 0, rounds = 0;
  std::string first_stale;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (std::chrono::steady_clock::now() < until) {
    ++rounds;
    const char value = static_cast<char>(rounds % 2 ? 0xaa : 0x55);
    std::memset(buf.get(), value, kSize);
    Fd dio(f, O_RDWR | O_DIRECT);
    REQUIRE(dio.ok());
    iocb cb{};
    cb.aio_fildes = static_cast<uint32_t>(dio.get());
    cb.aio_lio_opcode = IOCB_CMD_PWRITE;
    cb.aio_buf = reinterpret_cast<uint64_t>(buf.get());
    cb.aio_nbytes = kSize;
    cb.aio_offset = 0;
    iocb* cbs[1] = {&cb};
    REQUIRE(syscall(SYS_io_submit, ctx, 1, cbs) == 1);
    io_event ev{};
    REQUIRE(syscall(SYS_io_getevents, ctx, 1, 1, &ev, nullptr) == 1);
    REQUIRE(ev.res == static_cast<int64_t>(kSize));
    std::string back(kSize, '\0');
    {
      Fd check(f, O_RDONLY);
      REQUIRE(check.ok());
      REQUIRE(pread(check.get(), back.data(), kSize, 0) == static_cast<ssize_t>(kSize));
    }
    const size_t at = back.find_first_not_of(value);
    if (at != std::string::npos) {
      if (stale_rounds++ == 0) {
        first_stale = "round " + std::to_string(rounds) + ": stale from byte " + std::to_string(at);
      }
    }
  }
  syscall(SYS_io_destroy, ctx);
  { Fd done(stop, O_WRONLY | O_CREAT, 0644); }
  for (pid_t pid : readers) {
    int status = 0;
    waitpid(pid, &status, 0);
  }
  std::remove(stop.c_str());
  INFO(rounds << " rounds; " << first_stale);
  CHECK(stale_rounds == 0);
  CHECK(rounds > 10);
}

// mount -o remount,ro of a fuse.nvfs mount (fstests' _scratch_remount,
// generic/306, or a user's fstab mount) has mount.fuse3 run
// "nvfs DEVICE DIR -o remount,ro,...": 926e0ad's daemon refused the option
// (libfuse: "unknown option(s): -o remount", exit 1). It hands the change
// to the kernel (mount -i), and starts no second daemon.
TEST_CASE("mount: nvfs -o remount,ro and remount,rw change the running mount", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  const char* daemon = std::getenv("NVFS_DAEMON");
  REQUIRE(daemon != nullptr);
  const std::string log = m.dir() + ".remount.log";
  WriteFile(m.path("before"), "x");
  const int ro = RunProgram({daemon, m.image(), m.dir(), "-o", "remount,ro,cache=page"}, log);
  INFO("remount: " << ReadAll(log));
  CHECK(ro == 0);
  CHECK(Err(open(m.path("after").c_str(), O_CREAT | O_WRONLY, 0644)) == EROFS);
  CHECK(ReadAll(m.path("before")) == "x");
  CHECK(RunProgram({daemon, m.image(), m.dir(), "-o", "remount,rw"}, log) == 0);
  WriteFile(m.path("after"), "y");
  std::remove(log.c_str());
  CHECK(m.Stop() == 0);
  CHECK(FsckImage(m.image()).exit_code == 0);
}

}  // namespace
}  // namespace nvfs::test

namespace nvfs::test {

// Issue 14, item 5 (fstests generic/020 on FUSE): 64 KiB values and a
// thousand attributes per file, through the kernel and the attr tools,
// and a remove on a filesystem left without a free block.
TEST_CASE("mount: a 64 KiB xattr, 1000 attributes, the list, a remove on a full filesystem",
          "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m(32ull << 20);
  m.Start();
  const std::string f = m.path("f");
  WriteFile(f, "");
  // 1000 names in one setfattr --restore (one process, not a thousand).
  const std::string dump = m.image() + ".dump";
  {
    std::ofstream out(dump);
    out << "# file: " << f << "\n";
    for (int i = 0; i < 1000; ++i) out << "user.attribute_" << i << "=\"value_" << i << "\"\n";
    out << "\n";
  }
  REQUIRE(RunProgram({"setfattr", "--restore=" + dump}) == 0);
  unlink(dump.c_str());
  // A 64 KiB value (XATTR_SIZE_MAX), and one byte more refused by the kernel.
  std::string big(65536, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  REQUIRE(setxattr(f.c_str(), "user.big", big.data(), big.size(), 0) == 0);
  CHECK(Err(setxattr(f.c_str(), "user.bigger", big.data(), big.size() + 1, 0)) == E2BIG);
  std::string back(65536, '\0');
  REQUIRE(getxattr(f.c_str(), "user.big", back.data(), back.size()) == 65536);
  CHECK(back == big);
  CHECK(Err(getxattr(f.c_str(), "user.big", back.data(), 100)) == ERANGE);
  // getfattr reads the list and every value back.
  const std::string out = m.image() + ".getfattr";
  REQUIRE(RunProgram({"sh", "-c", "getfattr -d '" + f + "' > '" + out + "'"}) == 0);
  {
    std::ifstream in(out);
    int attributes = 0;
    bool big_seen = false;
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("user.attribute_")) ++attributes;
      if (line.starts_with("user.big=\"abcdefghij")) big_seen = true;
    }
    CHECK(attributes == 1000);
    CHECK(big_seen);
  }
  unlink(out.c_str());
  const ssize_t list_size = listxattr(f.c_str(), nullptr, 0);
  REQUIRE(list_size > 0);
  std::string list(static_cast<size_t>(list_size), '\0');
  CHECK(Err(listxattr(f.c_str(), list.data(), list.size() - 1)) == ERANGE);
  REQUIRE(listxattr(f.c_str(), list.data(), list.size()) == list_size);
  // Fill the filesystem, then remove: no block is needed.
  {
    const int fd = open(m.path("filler").c_str(), O_WRONLY | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    const std::string chunk(1 << 20, 'z');
    while (write(fd, chunk.data(), chunk.size()) > 0) {}
    while (write(fd, chunk.data(), 4096) > 0) {}
    close(fd);
  }
  struct statvfs sv;
  REQUIRE(statvfs(m.dir().c_str(), &sv) == 0);
  CHECK(sv.f_bavail == 0);
  CHECK(Err(setxattr(f.c_str(), "user.more", big.data(), big.size(), 0)) == ENOSPC);
  REQUIRE(RunProgram({"setfattr", "-x", "user.attribute_500", f}) == 0);
  REQUIRE(removexattr(f.c_str(), "user.big") == 0);
  CHECK(Err(getxattr(f.c_str(), "user.big", nullptr, 0)) == ENODATA);
  CHECK(Err(getxattr(f.c_str(), "user.attribute_500", nullptr, 0)) == ENODATA);
  CHECK(getxattr(f.c_str(), "user.attribute_501", nullptr, 0) == 9);
  REQUIRE(statvfs(m.dir().c_str(), &sv) == 0);
  UNSCOPED_INFO("free after the removes: " << sv.f_bavail << " of " << sv.f_frsize);
  CHECK(sv.f_bavail > 0);
  // The freed blocks are usable: a new 64 KiB value fits again.
  CHECK(setxattr(f.c_str(), "user.again", big.data(), 40000, 0) == 0);
  REQUIRE(m.Stop() == 0);
  const FsckResult fsck = FsckImage(m.image());
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
}

}  // namespace nvfs::test
