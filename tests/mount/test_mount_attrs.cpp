// The mount suite (test_mount, tests/mount/test_mount_*.cpp): attributes — POSIX
// timestamps, and the kernel's cached attributes and listings staying true
// after every kind of change.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "helpers.hpp"
#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

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
  StopAndCheck(m);
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
  StopAndCheck(m);
}

}  // namespace
}  // namespace nvfs::test
