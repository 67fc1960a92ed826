// The mount suite (test_mount, tests/mount/test_mount_*.cpp): a file's bytes
// through read and write — a file unlinked while open, O_APPEND, sparse
// files with SEEK_DATA and SEEK_HOLE, a file past 4 GiB, and every read path
// returning the same bytes.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

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
  StopAndCheck(m);
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
  StopAndCheck(m);
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
  StopAndCheck(m);
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
  StopAndCheck(m);
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

}  // namespace
}  // namespace nvfs::test
