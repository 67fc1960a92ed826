// The mount suite (test_mount, tests/mount/test_mount_*.cpp): space — statfs
// following use, fallocate of all it says is available, and a removed
// file's blocks free at once (fstests generic/103 and generic/511).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

TEST_CASE("mount: statfs numbers follow use", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m(256 * kMiB);
  m.Start();
  const struct statvfs s0 = StatFs(m.dir());
  CHECK(s0.f_bsize == 4096);
  CHECK(s0.f_frsize == 4096);
  CHECK(s0.f_blocks == 256 * kMiB / 4096);
  CHECK(s0.f_bfree <= s0.f_blocks);
  // Available: the free blocks less the reserve (5 % of the blocks, at
  // most 32 MiB) and the pointer blocks mapping the rest takes (1 in 512,
  // and a few tree roots).
  const uint64_t reserve = std::min<uint64_t>(s0.f_blocks / 20, 32 * kMiB / 4096);
  CHECK(s0.f_bavail <= s0.f_bfree - reserve);
  CHECK(s0.f_bavail >= s0.f_bfree - reserve - s0.f_bfree / 500 - 8);
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
  StopAndCheck(m);
}

// fstests generic/103 (issue 14.2): an allocation of what statfs says is
// available must succeed. The pointer blocks that map it come out of the
// free blocks too, so f_bavail leaves room for them.
TEST_CASE("mount: fallocate of all the space statfs says is available succeeds", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
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
  StopAndCheck(m);
}

}  // namespace
}  // namespace nvfs::test
