// The mount suite (test_mount, tests/mount/test_mount_*.cpp): shared mappings and
// the kernel's page cache — mmap in both cache modes, fsync of a mapping's
// pages without FSYNC requests, read-ahead, and buffered reads after
// asynchronous direct writes.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/aio_abi.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

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
  StopAndCheck(m);
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
  StopAndCheck(m);
}

// The mount's read-ahead, as the kernel sees it, or -1 if unreadable.
int ReadAheadKb(const std::string& dir) {
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
  StopAndCheck(m);
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

}  // namespace
}  // namespace nvfs::test
