// The mount suite (test_mount, tests/mount/test_mount_*.cpp): a full
// filesystem fails no call that needs no space. A read never fails for want
// of space, nor does what frees space (unlink, rmdir, truncate down, a
// punched hole); a store the kernel accepted through a shared mapping is
// kept (its page's blocks are found when the kernel fills it, from the
// reserve if need be: doc/integrity.md, "Space").
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

// Writes 64 KiB pieces to a new file `path` until the filesystem refuses
// one: ENOSPC (or a short write) is the only failure accepted.
void FillUp(const std::string& path) {
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  const std::string piece = Pattern(64 * kKiB, 3);
  for (;;) {
    const ssize_t n = write(fd, piece.data(), piece.size());
    if (n == static_cast<ssize_t>(piece.size())) continue;
    if (n < 0) REQUIRE(errno == ENOSPC);
    break;
  }
  REQUIRE(close(fd) == 0);
  INFO("f_bavail " << StatFs(path.substr(0, path.rfind('/'))).f_bavail);
  CHECK(StatFs(path.substr(0, path.rfind('/'))).f_bavail < 64);
}

// Reads `path` with read(2) in 128 KiB pieces (cat's): every call must
// succeed. Returns the bytes.
std::string ReadEvery(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) FAIL(path << ": open: " << std::strerror(errno));
  std::string all;
  std::vector<char> buf(128 * kKiB);
  for (;;) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      const int read_errno = errno;
      close(fd);
      FAIL(path << " at " << all.size() << ": read: " << std::strerror(read_errno));
    }
    if (n == 0) break;
    all.append(buf.data(), static_cast<size_t>(n));
  }
  close(fd);
  return all;
}

// Stores `byte` over [offset, offset + len) of `path` through a shared
// mapping, then unmaps it (the kernel writes the pages back there).
void StoreMapped(const std::string& path, off_t offset, size_t len, char byte) {
  const int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const off_t page = offset & ~off_t{4095};
  const size_t span = len + static_cast<size_t>(offset - page);
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, page);
  REQUIRE(p != MAP_FAILED);
  std::memset(static_cast<char*>(p) + (offset - page), byte, len);
  REQUIRE(munmap(p, span) == 0);
  REQUIRE(close(fd) == 0);
}

TEST_CASE("full: a store through a shared mapping into a hole is kept, and no read fails",
          "[mount][full]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m(64 * kMiB);
  m.Start(options);
  const std::string sparse = m.path("sparse");
  {
    const int fd = open(sparse.c_str(), O_CREAT | O_RDWR, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 1 * kMiB) == 0);  // a hole, no block
    close(fd);
  }
  {
    // read(2) through a writable handle gives a hole no block (the kernel
    // marks such reads with the caller's lock owner); with cache=none a
    // mapping's fault does (BackMappedRange).
    const std::string probe = m.path("probe");
    const int fd = open(probe.c_str(), O_CREAT | O_RDWR, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 64 * kKiB) == 0);
    std::string buf(64 * kKiB, 'x');
    REQUIRE(pread(fd, buf.data(), buf.size(), 0) == static_cast<ssize_t>(buf.size()));
    CHECK(buf == std::string(64 * kKiB, '\0'));
    CHECK(Stat(probe).st_blocks == 0);
    void* p = mmap(nullptr, 64 * kKiB, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    CHECK(static_cast<const char*>(p)[8192] == 0);
    REQUIRE(munmap(p, 64 * kKiB) == 0);
    close(fd);
    if (options.empty()) {
      CHECK(Stat(probe).st_blocks > 0);
    } else {
      CHECK(Stat(probe).st_blocks == 0);  // cache=page: every read is a page fill
    }
    REQUIRE(unlink(probe.c_str()) == 0);
  }
  REQUIRE(mkdir(m.path("empty").c_str(), 0755) == 0);
  WriteFile(m.path("small"), Pattern(10000, 4));
  FillUp(m.path("fill"));

  // The mapping's stores: taken by the kernel at once, written back at the
  // unmap, into blocks the filesystem has no room left for but its reserve.
  // 1 MiB: a third of the reserve (3.2 MiB).
  StoreMapped(sparse, 0, 1 * kMiB, 'M');
  // Before: the write-back failed (ENOSPC), and so did the next read, of
  // zeros once it succeeded.
  CHECK(ReadEvery(sparse) == std::string(1 * kMiB, 'M'));
  {
    const int fd = open(sparse.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    CHECK(Err(fsync(fd)) == 0);
    close(fd);
  }

  // Every call that needs no space, at 100 %.
  CHECK(ReadEvery(m.path("small")) == Pattern(10000, 4));
  CHECK(ReadEvery(m.path("fill")).size() == static_cast<size_t>(Stat(m.path("fill")).st_size));
  struct stat st;
  CHECK(stat(m.path("small").c_str(), &st) == 0);
  char value[16];
  CHECK(getxattr(m.path("small").c_str(), "user.none", value, sizeof value) == -1);
  CHECK(errno == ENODATA);
  CHECK(listxattr(m.path("small").c_str(), value, sizeof value) >= 0);
  CHECK(ListDir(m.dir()).count("fill") == 1);
  {
    const int fd = open(m.path("small").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    CHECK(Err(fsync(fd)) == 0);
    CHECK(Err(close(fd)) == 0);
  }
  // Frees: a hole punched, a truncation to the middle of a block, an
  // unlink, an rmdir.
  {
    const int fd = open(m.path("fill").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    CHECK(Err(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 3 * 4096 + 100)) ==
          0);
    CHECK(Err(ftruncate(fd, Stat(m.path("fill")).st_size / 2 + 1000)) == 0);
    close(fd);
  }
  CHECK(Err(rmdir(m.path("empty").c_str())) == 0);
  CHECK(Err(unlink(m.path("fill").c_str())) == 0);
  CHECK(Err(unlink(m.path("sparse").c_str())) == 0);
  CHECK(Err(unlink(m.path("small").c_str())) == 0);
  StopAndCheck(m);
}

TEST_CASE("full: a filesystem out of inodes serves every call that needs none", "[mount][full]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m(16 * kMiB);
  m.Start();
  WriteFile(m.path("data"), Pattern(100000, 5));
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  const uint64_t files = StatFs(m.dir()).f_ffree;
  INFO("free inodes " << files);
  REQUIRE(files < 20000);
  int made = 0;
  for (;; ++made) {
    const int fd = open(m.path("d/" + std::to_string(made)).c_str(), O_CREAT | O_EXCL | O_WRONLY,
                        0644);
    if (fd < 0) {
      CHECK(errno == ENOSPC);
      break;
    }
    close(fd);
    REQUIRE(made < 40000);
  }
  CHECK(StatFs(m.dir()).f_ffree == 0);
  CHECK(ReadEvery(m.path("data")) == Pattern(100000, 5));
  // The space is not used up: a write that needs blocks but no inode works.
  {
    const int fd = open(m.path("data").c_str(), O_WRONLY | O_APPEND);
    REQUIRE(fd >= 0);
    CHECK(write(fd, "tail", 4) == 4);
    close(fd);
  }
  CHECK(ListDir(m.path("d")).size() == static_cast<size_t>(made) + 2);
  struct stat st;
  CHECK(stat(m.path("d/0").c_str(), &st) == 0);
  for (int i = 0; i < made; ++i) {
    REQUIRE(Err(unlink(m.path("d/" + std::to_string(i)).c_str())) == 0);
  }
  CHECK(Err(rmdir(m.path("d").c_str())) == 0);
  StopAndCheck(m);
}

// What fsstress does to fill a filesystem, in one process and a fixed
// order: writes at random offsets, truncations up (holes) and down, stores
// through shared and private mappings, punched holes, removals. Then every
// file is read whole with read(2), and removed.
TEST_CASE("full: a mixed workload to full, then every file reads and rm -rf works",
          "[mount][full]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "", "cache=page");
  INFO("options: " << options);
  MountedFs m(16 * kMiB);
  m.Start(options);
  REQUIRE(mkdir(m.path("w").c_str(), 0755) == 0);
  std::mt19937_64 rng(1);
  const auto pick = [&](uint64_t n) { return static_cast<uint64_t>(rng() % n); };
  constexpr int kFiles = 32;
  const auto name = [&](uint64_t i) { return m.path("w/f" + std::to_string(i)); };
  const std::string piece = Pattern(256 * kKiB, 7);
  int full_ops = 0;
  int enospc = 0;
  for (int op = 0; op < 4000 && full_ops < 600; ++op) {
    const std::string path = name(pick(kFiles));
    const int fd = open(path.c_str(), O_CREAT | O_RDWR, 0644);
    REQUIRE(fd >= 0);
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    switch (pick(8)) {
      case 0:
      case 1:
      case 2: {  // a write somewhere up to 2 MiB
        const off_t at = static_cast<off_t>(pick(2 * kMiB));
        const size_t len = 1 + pick(piece.size());
        if (pwrite(fd, piece.data(), len, at) < 0) {
          REQUIRE(errno == ENOSPC);
          ++enospc;
        }
        break;
      }
      case 3:  // a hole past the end
        REQUIRE(ftruncate(fd, static_cast<off_t>(size + pick(512 * kKiB))) == 0);
        break;
      case 4:  // shorter
        REQUIRE(ftruncate(fd, static_cast<off_t>(size == 0 ? 0 : pick(size))) == 0);
        break;
      case 5:
      case 6: {  // stores through a mapping (shared or private) of up to 16 KiB
        if (size < 4096) break;
        const off_t at = static_cast<off_t>(pick(size) & ~uint64_t{4095});
        const size_t len = 1 + pick(std::min<uint64_t>(16 * kKiB, size - at));
        void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, pick(2) ? MAP_SHARED : MAP_PRIVATE,
                       fd, at);
        REQUIRE(p != MAP_FAILED);
        std::memset(p, 'a' + static_cast<int>(pick(26)), len);
        REQUIRE(munmap(p, len) == 0);
        break;
      }
      case 7:
        if (pick(4) == 0) {
          REQUIRE(Err(unlink(path.c_str())) == 0);
        } else if (size > 0) {
          REQUIRE(Err(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                static_cast<off_t>(pick(size)), 1 + pick(64 * kKiB))) == 0);
        }
        break;
    }
    REQUIRE(close(fd) == 0);
    if (StatFs(m.dir()).f_bavail == 0) ++full_ops;
  }
  INFO("operations at 100 %: " << full_ops << ", writes refused: " << enospc);
  CHECK(full_ops > 0);
  CHECK(enospc > 0);
  // Before: reads of files a mapping had stored into failed with ENOSPC.
  for (int i = 0; i < kFiles; ++i) {
    struct stat st;
    if (stat(name(i).c_str(), &st) != 0) continue;
    CHECK(ReadEvery(name(i)).size() == static_cast<size_t>(st.st_size));
  }
  for (int i = 0; i < kFiles; ++i) {
    if (unlink(name(i).c_str()) != 0) CHECK(errno == ENOENT);
  }
  CHECK(ListDir(m.path("w")).size() == 2);
  CHECK(Err(rmdir(m.path("w").c_str())) == 0);
  StopAndCheck(m);
}

}  // namespace
}  // namespace nvfs::test
