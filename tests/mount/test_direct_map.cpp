// Direct maps through real mounts (doc/integrity.md section 13): the C API
// in this process (nvfs_direct_mmap), linked with the tests' build of
// libnvfs-direct. The revoke case is also built against a library whose
// listener acknowledges without mapping anew (test_direct_map_norevoke,
// tests/mount/meson.build), where it fails: the store lands in the other
// file.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "mount_fixture.hpp"
#include "mount_helpers.hpp"
#include "nvfs/direct.h"

using nvfs::test::MountedFs;
using nvfs::test::Eventually;
using nvfs::test::ReadAll;

namespace {

bool RootDaemon() { return geteuid() == 0; }

std::string Program(const char* env) {
  const char* p = std::getenv(env);
  if (p == nullptr) FAIL(env << " is not set (run through meson)");
  return p;
}

void WriteKernel(const std::string& path, const std::string& bytes, off_t at) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(pwrite(fd, bytes.data(), bytes.size(), at) == static_cast<ssize_t>(bytes.size()));
  close(fd);
}

// `n` bytes of `path` at `at`, read through the kernel.
std::string ReadAt(const std::string& path, off_t at, size_t n) {
  const int fd = open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::string out(n, '\0');
  const ssize_t got = pread(fd, out.data(), n, at);
  close(fd);
  out.resize(got < 0 ? 0 : static_cast<size_t>(got));
  return out;
}

uint64_t FreeBlocks(const std::string& dir) { return nvfs::test::StatFs(dir).f_bfree; }

// Fills the filesystem with one file until a write fails ENOSPC.
void Fill(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  const std::string chunk(1 << 16, 'f');
  off_t at = 0;
  for (;;) {
    const ssize_t n = pwrite(fd, chunk.data(), chunk.size(), at);
    if (n <= 0) {
      REQUIRE(errno == ENOSPC);
      break;
    }
    at += n;
  }
  close(fd);
}

// A child that maps `length` bytes of `path` directly (opened with
// `flags`, mapped with `prot`, MAP_SHARED) and then runs `then` (which
// does not return); the parent gets its pid once the map is made
// (REQUIRE: direct).
template <class Then>
pid_t ForkMapper(const std::string& path, int flags, size_t length, int prot, Then&& then) {
  int ready[2];
  REQUIRE(pipe2(ready, O_CLOEXEC) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int fd = open(path.c_str(), flags);
    nvfs_direct* d = fd < 0 ? nullptr : nvfs_direct_attach(fd);
    void* p = d == nullptr ? MAP_FAILED : nvfs_direct_mmap(d, nullptr, length, prot, MAP_SHARED, 0);
    const char ok = p != MAP_FAILED && nvfs_direct_mmap_why(d) == NVFS_DIRECT_ACTIVE ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(2);
    then(ready[1]);
    _exit(3);
  }
  close(ready[1]);
  char ok = 0;
  REQUIRE(read(ready[0], &ok, 1) == 1);
  close(ready[0]);
  REQUIRE(ok == 'y');
  return child;
}

void PauseForever(int) {
  for (;;) pause();
}

sigjmp_buf* jump_to = nullptr;
void OnBus(int) { siglongjmp(*jump_to, 1); }

// Whether a load (or a store of `value`) at `p` raises SIGBUS.
bool Faults(volatile char* p, bool store = false, char value = 'X') {
  struct sigaction sa {}, old{};
  sa.sa_handler = OnBus;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &old);
  sigjmp_buf jb;
  jump_to = &jb;
  bool faulted = false;
  if (sigsetjmp(jb, 1) == 0) {
    if (store) {
      *p = value;
    } else {
      (void)*p;
    }
  } else {
    faulted = true;
  }
  sigaction(SIGBUS, &old, nullptr);
  return faulted;
}

// A descriptor of `path`, its handle and one map of it.
struct Mapped {
  int fd = -1;
  nvfs_direct* d = nullptr;
  char* p = nullptr;
  size_t len = 0;
  Mapped(const std::string& path, int flags, size_t length, int prot, int map_flags) : len(length) {
    fd = open(path.c_str(), flags);
    REQUIRE(fd >= 0);
    d = nvfs_direct_attach(fd);
    REQUIRE(d != nullptr);
    void* got = nvfs_direct_mmap(d, nullptr, length, prot, map_flags, 0);
    REQUIRE(got != MAP_FAILED);
    p = static_cast<char*>(got);
  }
  ~Mapped() { Unmap(); Close(); }
  void Unmap() {
    if (p != nullptr) nvfs_direct_munmap(p, len);
    p = nullptr;
  }
  void Close() {
    if (d != nullptr) nvfs_direct_detach(d);
    if (fd >= 0) close(fd);
    d = nullptr;
    fd = -1;
  }
  bool Direct() const { return nvfs_direct_mmap_why(d) == NVFS_DIRECT_ACTIVE; }
};

}  // namespace

TEST_CASE("direct map: the pages are the file's blocks, coherent with the mount both ways",
          "[mount][direct][map]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  std::string bytes(65536, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>('a' + i % 26);
  WriteKernel(m.path("a"), bytes, 0);

  SECTION("read-only, shared") {
    Mapped r(m.path("a"), O_RDONLY, bytes.size(), PROT_READ, MAP_SHARED);
    REQUIRE(r.Direct());
    CHECK(nvfs_direct_addr_why(r.p + 100) == NVFS_DIRECT_ACTIVE);
    CHECK(std::memcmp(r.p, bytes.data(), bytes.size()) == 0);
    // A write through the mount is in the map at once: the same memory.
    WriteKernel(m.path("a"), "THROUGH-THE-MOUNT", 5000);
    CHECK(std::memcmp(r.p + 5000, "THROUGH-THE-MOUNT", 17) == 0);
    // The descriptor may go: the map stays (the daemon keeps the file open).
    r.Close();
    CHECK(r.p[0] == 'a');
  }
  SECTION("writable, shared: stores are seen by reads through the mount and direct reads") {
    Mapped w(m.path("a"), O_RDWR, bytes.size(), PROT_READ | PROT_WRITE, MAP_SHARED);
    REQUIRE(w.Direct());
    std::memcpy(w.p + 4096 * 3 + 7, "STORED", 6);
    CHECK(ReadAll(m.path("a")).substr(4096 * 3 + 7, 6) == "STORED");
    char back[6];
    CHECK(nvfs_direct_pread(w.d, back, 6, 4096 * 3 + 7) == 6);
    CHECK(std::memcmp(back, "STORED", 6) == 0);
    // A direct write is in the map at once too.
    CHECK(nvfs_direct_pwrite(w.d, "DIRECT", 6, 9000) == 6);
    CHECK(nvfs_direct_write_why(w.d) == NVFS_DIRECT_ACTIVE);
    CHECK(std::memcmp(w.p + 9000, "DIRECT", 6) == 0);
  }
  SECTION("mremap grows and moves a shared map, shrinks it in place; madvise(MADV_REMOVE) punches") {
    Mapped w(m.path("a"), O_RDWR, 2 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED);
    REQUIRE(w.Direct());
    void* grown = mremap(w.p, 2 * 4096, 8 * 4096, MREMAP_MAYMOVE);
    REQUIRE(grown != MAP_FAILED);
    w.p = static_cast<char*>(grown);
    w.len = 8 * 4096;
    CHECK(nvfs_direct_addr_why(w.p + 7 * 4096) == NVFS_DIRECT_ACTIVE);
    CHECK(std::memcmp(w.p, bytes.data(), 8 * 4096) == 0);
    std::memcpy(w.p + 6 * 4096, "GROWN", 5);
    CHECK(ReadAll(m.path("a")).substr(6 * 4096, 5) == "GROWN");
    void* shrunk = mremap(w.p, 8 * 4096, 4 * 4096, 0);
    REQUIRE(shrunk == w.p);
    w.len = 4 * 4096;
    CHECK(nvfs_direct_addr_why(w.p + 5 * 4096) != NVFS_DIRECT_ACTIVE);
    // The page's blocks go (a hole), then the map is given zeros there.
    REQUIRE(madvise(w.p + 4096, 4096, MADV_REMOVE) == 0);
    CHECK(ReadAll(m.path("a")).substr(4096, 4096) == std::string(4096, '\0'));
    CHECK(Eventually([&] { return w.p[4096] == 0 && w.p[8191] == 0; }, 5));
    CHECK(w.p[0] == 'a');
  }
  SECTION("private: copy-on-write, the file unchanged") {
    Mapped p(m.path("a"), O_RDONLY, bytes.size(), PROT_READ | PROT_WRITE, MAP_PRIVATE);
    REQUIRE(p.Direct());
    std::memcpy(p.p, "PRIVATE", 7);
    CHECK(std::memcmp(p.p, "PRIVATE", 7) == 0);
    CHECK(ReadAll(m.path("a")).substr(0, 7) == bytes.substr(0, 7));
    // A page not written follows the file.
    WriteKernel(m.path("a"), "LATER", 8192);
    CHECK(std::memcmp(p.p + 8192, "LATER", 5) == 0);
  }
  SECTION("a set-user-ID file is mapped for writing by the kernel, which drops the bit") {
    REQUIRE(chmod(m.path("a").c_str(), 04755) == 0);
    const int fd = open(m.path("a").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    nvfs_direct* d = nvfs_direct_attach(fd);
    void* got = nvfs_direct_mmap(d, nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, 0);
    REQUIRE(got != MAP_FAILED);
    CHECK(nvfs_direct_mmap_why(d) == NVFS_DIRECT_PRIVILEGED);
    CHECK(nvfs_direct_addr_why(got) != NVFS_DIRECT_ACTIVE);
    nvfs_direct_munmap(got, 4096);
    nvfs_direct_detach(d);
    close(fd);
  }
  SECTION("a read-only descriptor gets no writable shared map") {
    const int fd = open(m.path("a").c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    nvfs_direct* d = nvfs_direct_attach(fd);
    void* got = nvfs_direct_mmap(d, nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, 0);
    CHECK(got == MAP_FAILED);
    CHECK(errno == EACCES);  // the kernel's answer, which it gave
    CHECK(nvfs_direct_mmap_why(d) != NVFS_DIRECT_ACTIVE);
    nvfs_direct_detach(d);
    close(fd);
  }
  StopAndCheck(m);
}

TEST_CASE("direct map: another process's direct appends show in a map within milliseconds",
          "[mount][direct][map][word]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  WriteKernel(m.path("g"), std::string(4096, 'g'), 0);
  constexpr int kAppends = 20;
  Mapped r(m.path("g"), O_RDONLY, (kAppends + 1) * 4096, PROT_READ, MAP_SHARED);
  REQUIRE(r.Direct());
  // In lockstep: the child appends a page, the parent looks for it in its
  // map, then lets the child go on. (An append by word moves the size
  // without moving the file's seq: no word opens for a file mapped
  // directly, and a mapper's asking for runs closes one.)
  int to_parent[2], to_child[2];
  REQUIRE(pipe(to_parent) == 0);
  REQUIRE(pipe(to_child) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int fd = open(m.path("g").c_str(), O_RDWR);
    nvfs_direct* d = nvfs_direct_attach(fd);
    for (int i = 1; i <= kAppends; ++i) {
      const std::string page(4096, static_cast<char>('a' + i));
      if (nvfs_direct_pwrite(d, page.data(), page.size(), off_t{4096} * i) != 4096) _exit(1);
      char c = 0;
      if (write(to_parent[1], "a", 1) != 1 || read(to_child[0], &c, 1) != 1) _exit(2);
    }
    _exit(nvfs_direct_write_why(d) == NVFS_DIRECT_ACTIVE ? 0 : 3);
  }
  int late = 0;
  for (int i = 1; i <= kAppends; ++i) {
    char c = 0;
    REQUIRE(read(to_parent[0], &c, 1) == 1);
    volatile char* page = r.p + 4096 * i;
    if (!Eventually([&] { return !Faults(page) && *page == static_cast<char>('a' + i); }, 0.3)) {
      ++late;
    }
    REQUIRE(write(to_child[1], "g", 1) == 1);
  }
  CHECK(nvfs::test::WaitForExit(child, 30) == 0);
  CHECK(late == 0);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) close(fd);
  r.Unmap();
  r.Close();
  StopAndCheck(m);
}

TEST_CASE("direct map: a kernel map through the mount follows appends by word at the writer's "
          "fsync, and within a second without", "[mount][direct][map][word]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  WriteKernel(m.path("k"), std::string(4096, 'k'), 0);
  const int fd = open(m.path("k").c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  nvfs_direct* d = nvfs_direct_attach(fd);
  REQUIRE(d != nullptr);
  const auto append = [&](char c, off_t at) {
    const std::string page(4096, c);
    REQUIRE(nvfs_direct_pwrite(d, page.data(), page.size(), at) == 4096);
  };
  // The first append commits by request (the kernel's size moves with it)
  // and opens the word; the next two move the word alone.
  append('a', 4096);
  const int kfd = open(m.path("k").c_str(), O_RDONLY);
  REQUIRE(kfd >= 0);
  // This process does not preload the library: the kernel's map.
  void* p = mmap(nullptr, 16 * 4096, PROT_READ, MAP_SHARED, kfd, 0);
  REQUIRE(p != MAP_FAILED);
  auto* k = static_cast<volatile char*>(p);
  CHECK(k[4096] == 'a');
  append('b', 8192);
  append('c', 12288);
  REQUIRE(nvfs_direct_write_why(d) == NVFS_DIRECT_ACTIVE);
  // The writer's fsync folds the word and moves the kernel's size.
  REQUIRE(nvfs_direct_fsync(d) == 0);
  REQUIRE(!Faults(k + 12288));
  CHECK(k[8192] == 'b');
  CHECK(k[12288] == 'c');
  // Without one: the daemon's pass for the times, within a second.
  append('d', 16384);  // by request (the fsync closed the word); opens it again
  append('e', 20480);
  const bool seen = Eventually([&] { return !Faults(k + 20480) && k[20480] == 'e'; }, 3);
  CHECK(seen);
  CHECK(k[16384] == 'd');
  munmap(p, 16 * 4096);
  close(kfd);
  nvfs_direct_detach(d);
  close(fd);
  StopAndCheck(m);
}

TEST_CASE("direct map: holes read as zeros, a page past the end is SIGBUS, and both follow the file",
          "[mount][direct][map]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  // 3 pages: data, a hole, data; mapped over 5.
  WriteKernel(m.path("h"), std::string(4096, 'd'), 0);
  WriteKernel(m.path("h"), std::string(100, 'e'), 8192);
  Mapped r(m.path("h"), O_RDONLY, 5 * 4096, PROT_READ, MAP_SHARED);
  REQUIRE(r.Direct());
  CHECK(r.p[0] == 'd');
  CHECK(r.p[4096] == 0);
  CHECK(r.p[8192] == 'e');
  CHECK(r.p[8192 + 100] == 0);  // past the size, in its last page
  CHECK(Faults(r.p + 3 * 4096));
  // The hole filled through the mount, and the file grown: the map follows.
  WriteKernel(m.path("h"), "FILLED", 4096);
  WriteKernel(m.path("h"), "GROWN", 3 * 4096 + 10);
  const bool followed = Eventually([&] { return !Faults(r.p + 3 * 4096 + 10) && r.p[4096] == 'F'; }, 5);
  CHECK(followed);
  if (followed) CHECK(std::memcmp(r.p + 3 * 4096 + 10, "GROWN", 5) == 0);
  // Truncated: every page past the new end is SIGBUS (the bytes past the
  // end in the page it ends in are the block's, as they were: a read
  // through the mount ends at the size, and an extension zeroes them).
  REQUIRE(truncate(m.path("h").c_str(), 50) == 0);
  CHECK(Eventually([&] { return Faults(r.p + 4096); }, 5));
  CHECK(r.p[0] == 'd');
  CHECK(Faults(r.p + 8192));
  r.Unmap();
  r.Close();
  StopAndCheck(m);
}

TEST_CASE("direct map: the writer's own hole fill and extension are in its map when the write returns",
          "[mount][direct][map]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  // data, hole, hole, data; mapped over 6 pages (SQLite's pattern: a size
  // hint's ftruncate, a map of the new size, then its pages written).
  WriteKernel(m.path("w"), std::string(4096, 'd'), 0);
  WriteKernel(m.path("w"), std::string(4096, 'e'), 3 * 4096);
  Mapped r(m.path("w"), O_RDWR, 6 * 4096, PROT_READ, MAP_SHARED);
  REQUIRE(r.Direct());
  CHECK(r.p[2 * 4096] == 0);
  for (int round = 0; round < 20; ++round) {
    const std::string mark = "ROUND" + std::to_string(round);
    REQUIRE(nvfs_direct_pwrite(r.d, mark.data(), mark.size(), 2 * 4096 + 64 * round) ==
            static_cast<ssize_t>(mark.size()));
    CHECK(std::memcmp(r.p + 2 * 4096 + 64 * round, mark.data(), mark.size()) == 0);
  }
  // Past the end: the page is the file's once the write returns.
  REQUIRE(nvfs_direct_pwrite(r.d, "EXTENDED", 8, 4 * 4096 + 8) == 8);
  const bool mapped = !Faults(r.p + 4 * 4096);
  CHECK(mapped);
  if (mapped) CHECK(std::memcmp(r.p + 4 * 4096 + 8, "EXTENDED", 8) == 0);
  CHECK(Faults(r.p + 5 * 4096));
  r.Unmap();
  r.Close();
  StopAndCheck(m);
}

TEST_CASE("direct map: a block the file gave up goes to no other file while it is mapped (revoke)",
          "[mount][direct][map][race]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  const size_t kSize = 1 << 20;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  Mapped w(m.path("a"), O_RDWR, kSize, PROT_READ | PROT_WRITE, MAP_SHARED);
  REQUIRE(w.Direct());
  Fill(m.path("filler"));
  // The file gives its blocks up; another file wants every free block.
  REQUIRE(truncate(m.path("a").c_str(), 0) == 0);
  const int b = open(m.path("b").c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE(b >= 0);
  const std::string bytes(kSize, 'b');
  // Given once the map let them go (the listener maps past-the-end pages
  // over them and acknowledges: milliseconds).
  CHECK(Eventually([&] { return pwrite(b, bytes.data(), bytes.size(), 0) ==
                               static_cast<ssize_t>(bytes.size()); }, 5));
  close(b);
  // Stores through the old map reach nothing of b's: past the end of a.
  size_t faulted = 0;
  for (size_t at = 0; at < kSize; at += 4096) faulted += Faults(w.p + at, true, 'W');
  CHECK(faulted == kSize / 4096);
  const std::string got = ReadAll(m.path("b"));
  CHECK(got.find('W') == std::string::npos);
  CHECK(got == bytes);
  w.Unmap();
  w.Close();
  REQUIRE(unlink(m.path("filler").c_str()) == 0);
  StopAndCheck(m);
}

TEST_CASE("direct map: a client that does not acknowledge holds the blocks, and never corrupts",
          "[mount][direct][map]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  const size_t kSize = 1 << 20;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  const pid_t child = ForkMapper(m.path("a"), O_RDONLY, kSize, PROT_READ, PauseForever);
  REQUIRE(kill(child, SIGSTOP) == 0);
  const uint64_t before = FreeBlocks(m.dir());
  REQUIRE(truncate(m.path("a").c_str(), 0) == 0);
  // Held while the stopped client maps them: df does not count them free.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(FreeBlocks(m.dir()) < before + (kSize >> 12) / 2);
  REQUIRE(kill(child, SIGCONT) == 0);
  // Going on, it maps them no more: free.
  CHECK(Eventually([&] { return FreeBlocks(m.dir()) >= before + (kSize >> 12) - 2; }, 5));
  kill(child, SIGKILL);
  nvfs::test::WaitForExit(child, 10);
  StopAndCheck(m);
}

TEST_CASE("direct map: a mapper that execs holds nothing once its maps are gone",
          "[mount][direct][map]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  const size_t kSize = 1 << 20;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  int execed[2];
  REQUIRE(pipe2(execed, O_CLOEXEC) == 0);
  const pid_t child = ForkMapper(m.path("a"), O_RDONLY, kSize, PROT_READ, [](int) {
    // The same process, another program: its maps and the library's
    // connection (close-on-exec) go; it lives on.
    execl("/bin/sleep", "sleep", "5", static_cast<char*>(nullptr));
  });
  close(execed[1]);
  char byte;
  REQUIRE(read(execed[0], &byte, 1) == 0);  // EOF: the exec closed the child's copy
  close(execed[0]);
  const uint64_t before = FreeBlocks(m.dir());
  REQUIRE(truncate(m.path("a").c_str(), 0) == 0);
  // Nothing maps the blocks any more: they are free while it still runs.
  CHECK(Eventually([&] { return FreeBlocks(m.dir()) >= before + (kSize >> 12) - 2; }, 3));
  CHECK(kill(child, 0) == 0);
  kill(child, SIGKILL);
  nvfs::test::WaitForExit(child, 10);
  StopAndCheck(m);
}

TEST_CASE("direct map: kill -9 of the daemon with a client mapped; remount and fsck clean",
          "[mount][direct][map][restart]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  const size_t kSize = 256 << 10;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  WriteKernel(m.path("other"), std::string(100000, 'o'), 0);
  auto w = std::make_unique<Mapped>(m.path("a"), O_RDWR, kSize, PROT_READ | PROT_WRITE, MAP_SHARED);
  REQUIRE(w->Direct());
  std::memcpy(w->p, "BEFORE", 6);
  CHECK(m.Signal(SIGKILL) == 128 + SIGKILL);
  // The listener finds its daemon gone and takes the file's blocks out of
  // the map: a store faults instead of reaching blocks a new mount may give
  // to another file.
  CHECK(Eventually([&] { return Faults(w->p, true, 'Z'); }, 5));
  w.reset();
  m.Start();
  CHECK(ReadAll(m.path("a")).substr(0, 6) == "BEFORE");
  CHECK(ReadAll(m.path("other")) == std::string(100000, 'o'));
  StopAndCheck(m);
}

TEST_CASE("direct map: a writable mapper stopped when its daemon is killed holds the next mount back",
          "[mount][direct][map][restart]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  WriteKernel(m.path("a"), std::string(65536, 'a'), 0);
  const pid_t child =
      ForkMapper(m.path("a"), O_RDWR, 65536, PROT_READ | PROT_WRITE, PauseForever);
  // Stopped, it cannot take its map off the file's blocks when the daemon
  // goes: a new mount must not give them to another file meanwhile.
  REQUIRE(kill(child, SIGSTOP) == 0);
  CHECK(m.Signal(SIGKILL) == 128 + SIGKILL);
  std::thread resume([child] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    kill(child, SIGCONT);
  });
  const auto mount_at = std::chrono::steady_clock::now();
  m.Start();
  const auto waited = std::chrono::steady_clock::now() - mount_at;
  resume.join();
  CHECK(waited > std::chrono::milliseconds(1000));
  kill(child, SIGKILL);
  nvfs::test::WaitForExit(child, 10);
  CHECK(ReadAll(m.path("a")) == std::string(65536, 'a'));
  StopAndCheck(m);
}

TEST_CASE("direct map: a change of credentials ends the process's direct maps; the kernel's go on",
          "[mount][direct][map]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  WriteKernel(m.path("c"), std::string(16384, 'c'), 0);
  Mapped w(m.path("c"), O_RDWR, 16384, PROT_READ | PROT_WRITE, MAP_SHARED);
  REQUIRE(w.Direct());
  REQUIRE(nvfs_direct_addr_why(w.p) == NVFS_DIRECT_ACTIVE);
  // The same credentials again: the namespace leaves the process before
  // the change, and its maps with it (they hold no page of the namespace
  // past the credentials that made them).
  REQUIRE(setresuid(0, 0, 0) == 0);
  CHECK(nvfs_direct_addr_why(w.p) != NVFS_DIRECT_ACTIVE);
  CHECK(w.p[100] == 'c');  // the kernel's map of the same file
  std::memcpy(w.p + 300, "AFTER", 5);
  REQUIRE(msync(w.p, 4096, MS_SYNC) == 0);
  CHECK(ReadAll(m.path("c")).substr(300, 5) == "AFTER");
  // A new map proves the process again, as it is now.
  Mapped again(m.path("c"), O_RDONLY, 4096, PROT_READ, MAP_SHARED);
  CHECK(again.Direct());
  CHECK(std::memcmp(again.p + 300, "AFTER", 5) == 0);
  again.Unmap();
  again.Close();
  w.Unmap();
  w.Close();
  StopAndCheck(m);
}

TEST_CASE("direct map: fork, and a change of credentials, hand the maps to the kernel",
          "[mount][direct][map]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  REQUIRE(chmod(m.image().c_str(), 0600) == 0);
  m.Start("allow_other");
  WriteKernel(m.path("f"), std::string(16384, 'f'), 0);
  REQUIRE(chmod(m.path("f").c_str(), 0666) == 0);
  Mapped w(m.path("f"), O_RDWR, 16384, PROT_READ | PROT_WRITE, MAP_SHARED);
  REQUIRE(w.Direct());
  Mapped p(m.path("f"), O_RDONLY, 16384, PROT_READ | PROT_WRITE, MAP_PRIVATE);
  REQUIRE(p.Direct());
  std::memcpy(p.p, "MINE", 4);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The child's maps are the kernel's maps of the same files: shared
    // stays shared (through the file), private keeps the parent's copy.
    if (nvfs_direct_addr_why(w.p) == NVFS_DIRECT_ACTIVE) _exit(10);
    if (std::memcmp(p.p, "MINE", 4) != 0) _exit(11);
    if (w.p[100] != 'f') _exit(12);
    std::memcpy(w.p + 200, "CHILD", 5);
    if (msync(w.p, 4096, MS_SYNC) != 0) _exit(13);
    // Dropping to nobody: no new direct map, the old one is the kernel's.
    if (!nvfs::test::BecomeNobody()) _exit(14);
    const int fd = open(m.path("f").c_str(), O_RDONLY);
    nvfs_direct* d = nvfs_direct_attach(fd);
    void* q = nvfs_direct_mmap(d, nullptr, 4096, PROT_READ, MAP_SHARED, 0);
    if (q == MAP_FAILED || static_cast<char*>(q)[0] != 'f') _exit(15);
    if (nvfs_direct_mmap_why(d) != NVFS_DIRECT_NO_NAMESPACE) _exit(16);
    _exit(0);
  }
  CHECK(nvfs::test::WaitForExit(child, 30) == 0);
  CHECK(Eventually([&] { return std::memcmp(w.p + 200, "CHILD", 5) == 0; }, 5));
  CHECK(ReadAll(m.path("f")).substr(200, 5) == "CHILD");
  CHECK(nvfs_direct_addr_why(w.p) == NVFS_DIRECT_ACTIVE);  // the parent's are still direct
  w.Unmap();
  p.Unmap();
  w.Close();
  p.Close();
  StopAndCheck(m);
}

TEST_CASE("direct map: an unmodified program, SQLite with mmap_size, under the preload",
          "[mount][direct][map][sqlite]") {
#ifdef __SANITIZE_THREAD__
  // The detector's build of the library, preloaded into a program built
  // without it, does not start (tools/tsan.sh runs every other case).
  NVFS_SKIP("a ThreadSanitizer build cannot preload into an uninstrumented program");
#endif
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  if (nvfs::test::RunProgram({"sh", "-c", "command -v sqlite3 && command -v strace"}) != 0) {
    NVFS_SKIP("sqlite3 or strace is not installed (tools/check.sh installs them)");
  }
  MountedFs m;
  m.Start();
  const std::string preload = Program("NVFS_DIRECT_LIB");
  char dir[] = "/tmp/direct-map-sqlite-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string tmp = dir;
  {
    // The database read through its map; WAL's index (the -shm file) a
    // writable shared map, grown as the log grows.
    const int fd = open((tmp + "/w.sql").c_str(), O_WRONLY | O_CREAT, 0644);
    const std::string sql =
        "PRAGMA mmap_size=268435456;\n"
        "PRAGMA journal_mode=WAL;\n"
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n"
        "CREATE INDEX tv ON t(v);\n"
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<20000)\n"
        "  INSERT INTO t SELECT x, hex(randomblob(50)) FROM c;\n"
        "UPDATE t SET v = v || 'u' WHERE id % 3 = 0;\n"
        "DELETE FROM t WHERE id % 7 = 0;\n"
        "PRAGMA wal_checkpoint(TRUNCATE);\n"
        "BEGIN; UPDATE t SET v = 'x' || v WHERE id % 5 = 0; COMMIT;\n"
        "SELECT count(*) FROM t WHERE v > '0';\n"
        "PRAGMA integrity_check;\n"
        "SELECT count(*), sum(length(v)) FROM t;\n";
    REQUIRE(write(fd, sql.data(), sql.size()) == static_cast<ssize_t>(sql.size()));
    close(fd);
  }
  const auto run = [&](const std::string& db, bool preloaded, const std::string& tag) {
    const std::string cmd = std::string(preloaded ? "LD_PRELOAD=" + preload + " " : "") +
                            "strace -f -e trace=mremap -o " + tmp + "/" + tag +
                            ".strace sqlite3 " + db + " < " + tmp + "/w.sql > " + tmp + "/" +
                            tag + ".out 2>&1";
    return nvfs::test::RunProgram({"sh", "-c", cmd});
  };
  REQUIRE(run(m.path("direct.db"), true, "direct") == 0);
  REQUIRE(run(m.path("kernel.db"), false, "kernel") == 0);
  const std::string direct_out = ReadAll(tmp + "/direct.out");
  const std::string kernel_out = ReadAll(tmp + "/kernel.out");
  INFO("direct: " << direct_out << "kernel: " << kernel_out);
  CHECK(direct_out.find("\nok\n") != std::string::npos);
  CHECK(direct_out == kernel_out);
  // Its maps were direct: the library maps the namespace's pages anew
  // (mremap with an old size of 0), which neither SQLite nor the kernel's
  // mmap does.
  const size_t direct_maps = nvfs::test::CountLines(ReadAll(tmp + "/direct.strace"), ", 0, ");
  const size_t kernel_maps = nvfs::test::CountLines(ReadAll(tmp + "/kernel.strace"), ", 0, ");
  INFO("mremap(..., 0, ...) calls: direct " << direct_maps << ", kernel " << kernel_maps);
  CHECK(direct_maps > 0);
  CHECK(kernel_maps == 0);
  REQUIRE(nvfs::test::RunProgram({"sh", "-c", "sqlite3 " + m.path("direct.db") +
                                                  " 'PRAGMA integrity_check;' > " + tmp +
                                                  "/after.out 2>&1"}) == 0);
  CHECK(ReadAll(tmp + "/after.out") == "ok\n");
  nvfs::test::RunProgram({"rm", "-rf", tmp});
  StopAndCheck(m);
}

TEST_CASE("direct map: an unmodified libpmem2 program under the preload maps the file's blocks",
          "[mount][direct][map][pmem2]") {
#ifdef __SANITIZE_THREAD__
  // The detector's build of the library, preloaded into a program built
  // without it, does not start (tools/tsan.sh runs every other case).
  NVFS_SKIP("a ThreadSanitizer build cannot preload into an uninstrumented program");
#endif
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  WriteKernel(m.path("p"), std::string(4 << 20, 'p'), 0);
  char dir[] = "/tmp/direct-map-pmem2-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string out = std::string(dir) + "/out";
  // nvfs-mapbench's pmem2 mode: pmem2_map_new over the file, 4 KiB copies,
  // each persisted by pmem2_get_persist_fn(); it says what backs its map.
  const std::string cmd = "LD_PRELOAD=" + Program("NVFS_DIRECT_LIB") + " " +
                          Program("NVFS_MAPBENCH") + " pmem2 " + m.path("p") +
                          " --iterations 2000 > " + out + " 2>&1";
  REQUIRE(nvfs::test::RunProgram({"sh", "-c", cmd}) == 0);
  const std::string got = ReadAll(out);
  INFO(got);
  CHECK(got.find("\"backing\": \"direct") != std::string::npos);
  // The namespace is memory here: stores need no flush, so the map is one
  // libpmem2 may persist with the CPU (MAP_SYNC accepted), not by msync.
  CHECK(got.find("\"granularity\": \"PAGE\"") == std::string::npos);
  nvfs::test::RunProgram({"rm", "-rf", dir});
  StopAndCheck(m);
}

TEST_CASE("direct map: a truncation is in the truncating process's own maps when the call returns",
          "[mount][direct][map][truncate]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  constexpr size_t kSize = 16384;
  WriteKernel(m.path("t"), std::string(kSize, 't'), 0);
  Mapped w(m.path("t"), O_RDWR, kSize, PROT_READ | PROT_WRITE, MAP_SHARED);
  REQUIRE(w.Direct());
  REQUIRE(!Faults(w.p + 12288));
  // No pause between the call and the load: the kernel's maps fault at
  // once, and so must these.
  SECTION("ftruncate") {
    REQUIRE(ftruncate(w.fd, 4096) == 0);
    CHECK(Faults(w.p + 8192));
    CHECK(Faults(w.p + 4096, true));
    CHECK(!Faults(w.p + 100));
    // Grown again: the pages inside the new size are the file's (zeros).
    REQUIRE(ftruncate(w.fd, kSize) == 0);
    CHECK(!Faults(w.p + 12288));
    CHECK(w.p[12288] == 0);
  }
  SECTION("truncate by path") {
    REQUIRE(truncate(m.path("t").c_str(), 100) == 0);
    CHECK(Faults(w.p + 4096));
    // The last page past the new end: zeros, as POSIX and the kernel's
    // maps have it (fsx's "non-zero data past EOF"), in this map and in
    // a new one.
    CHECK(w.p[99] == 't');
    CHECK(std::string(w.p + 100, 4096 - 100) == std::string(4096 - 100, '\0'));
    Mapped fresh(m.path("t"), O_RDONLY, 4096, PROT_READ, MAP_SHARED);
    REQUIRE(fresh.Direct());
    CHECK(std::string(fresh.p + 100, 4096 - 100) == std::string(4096 - 100, '\0'));
    fresh.Unmap();
    fresh.Close();
  }
  SECTION("an open with O_TRUNC") {
    const int fd = open(m.path("t").c_str(), O_RDWR | O_TRUNC);
    REQUIRE(fd >= 0);
    CHECK(Faults(w.p));
    close(fd);
  }
  SECTION("a hole punched") {
    REQUIRE(fallocate(w.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096) == 0);
    CHECK(w.p[4096] == 0);
    CHECK(w.p[4095] == 't');
  }
  w.Unmap();
  w.Close();
  StopAndCheck(m);
}

TEST_CASE("direct map: another process's map faults past a new end within milliseconds",
          "[mount][direct][map][truncate]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  constexpr size_t kSize = 16384;
  WriteKernel(m.path("o"), std::string(kSize, 'o'), 0);
  // The child maps the file, says so, and loads past 4096 until the load
  // faults; it reports when (CLOCK_MONOTONIC), the parent when its
  // truncation returned.
  int ready[2], report[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(report) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int fd = open(m.path("o").c_str(), O_RDONLY);
    nvfs_direct* d = fd < 0 ? nullptr : nvfs_direct_attach(fd);
    void* p = d == nullptr ? MAP_FAILED : nvfs_direct_mmap(d, nullptr, kSize, PROT_READ, MAP_SHARED, 0);
    const char ok = p != MAP_FAILED && nvfs_direct_mmap_why(d) == NVFS_DIRECT_ACTIVE ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1 || ok != 'y') _exit(20);
    const auto start = std::chrono::steady_clock::now();
    while (!Faults(static_cast<char*>(p) + 8192)) {
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(10)) _exit(21);
    }
    timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    if (write(report[1], &at, sizeof at) != sizeof at) _exit(22);
    _exit(0);
  }
  char ok = 0;
  REQUIRE(read(ready[0], &ok, 1) == 1);
  REQUIRE(ok == 'y');
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(truncate(m.path("o").c_str(), 4096) == 0);
  timespec returned;
  clock_gettime(CLOCK_MONOTONIC, &returned);
  CHECK(nvfs::test::WaitForExit(child, 30) == 0);
  timespec faulted{};
  REQUIRE(read(report[0], &faulted, sizeof faulted) == sizeof faulted);
  const long us = (faulted.tv_sec - returned.tv_sec) * 1000000L +
                  (faulted.tv_nsec - returned.tv_nsec) / 1000L;
  // Negative: the map followed before the call had returned.
  std::fprintf(stderr, "another process's map faulted past the new end %ld us after the truncation returned\n",
               us);
  CHECK(us < 1000000);
  close(ready[0]);
  close(ready[1]);
  close(report[0]);
  close(report[1]);
  StopAndCheck(m);
}

// A map's runs are read, then registered with the maps' grace. A block the
// file gives up in between must not go to another file before the client
// has mapped the file again: the daemon holds every later free from before
// it reads the runs (Maps::BeginRegister). The daemon's test hook widens
// the window: it pauses 600 ms after reading the runs.
TEST_CASE("direct map: blocks freed while a map's runs are being registered go to no other file",
          "[mount][direct][map][race]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  REQUIRE(setenv("NVFS_TEST_MMAP_PAUSE_MS", "600", 1) == 0);
  m.Start();
  REQUIRE(unsetenv("NVFS_TEST_MMAP_PAUSE_MS") == 0);
  const size_t kSize = 1 << 20;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  Fill(m.path("filler"));
  // While the map is being made: a gives its blocks up, and b wants every
  // free block (a child: nothing of this process's library in its way).
  const pid_t taker = fork();
  REQUIRE(taker >= 0);
  if (taker == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (syscall(SYS_truncate, m.path("a").c_str(), 0L) != 0) _exit(10);
    const int b = open(m.path("b").c_str(), O_WRONLY | O_CREAT, 0644);
    if (b < 0) _exit(11);
    const std::string bytes(kSize, 'b');
    for (int i = 0; i < 500; ++i) {
      if (pwrite(b, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size())) _exit(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    _exit(12);
  }
  Mapped w(m.path("a"), O_RDWR, kSize, PROT_READ | PROT_WRITE, MAP_SHARED);
  REQUIRE(w.Direct());
  // At once, before the listener hears of the truncation: stores through
  // every page. Each lands in a block of a's (held) or faults.
  for (size_t at = 0; at < kSize; at += 4096) (void)Faults(w.p + at, true, 'W');
  CHECK(nvfs::test::WaitForExit(taker, 30) == 0);
  const std::string got = ReadAll(m.path("b"));
  CHECK(got.find('W') == std::string::npos);
  CHECK(got == std::string(kSize, 'b'));
  w.Unmap();
  w.Close();
  REQUIRE(unlink(m.path("filler").c_str()) == 0);
  StopAndCheck(m);
}

namespace {

sigjmp_buf* any_jump_to = nullptr;
void OnAnyFault(int) { siglongjmp(*any_jump_to, 1); }

// A store at `p`; true if it faulted (SIGBUS or SIGSEGV).
bool StoreFaults(volatile char* p, char value) {
  struct sigaction sa {}, old_bus{}, old_segv{};
  sa.sa_handler = OnAnyFault;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &old_bus);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigjmp_buf jb;
  any_jump_to = &jb;
  bool faulted = false;
  if (sigsetjmp(jb, 1) == 0) {
    *p = value;
  } else {
    faulted = true;
  }
  sigaction(SIGBUS, &old_bus, nullptr);
  sigaction(SIGSEGV, &old_segv, nullptr);
  return faulted;
}

}  // namespace

// A mapper that cannot take its pages off a file's freed blocks the usual
// way (no descriptor for the past-the-end pages: RLIMIT_NOFILE) takes them
// off another way, or does not acknowledge: the blocks go to no other file
// while a page of it is on them.
TEST_CASE("direct map: a replacement that fails is never acknowledged", "[mount][direct][map][race]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  const size_t kSize = 1 << 20;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  Fill(m.path("filler"));
  int ready[2], go[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(go) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int fd = open(m.path("a").c_str(), O_RDWR);
    nvfs_direct* d = fd < 0 ? nullptr : nvfs_direct_attach(fd);
    void* p = d == nullptr ? MAP_FAILED
                           : nvfs_direct_mmap(d, nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, 0);
    char ok = p != MAP_FAILED && nvfs_direct_mmap_why(d) == NVFS_DIRECT_ACTIVE ? 'y' : 'n';
    // No new descriptor from now on (0, 1 and 2 are open): memfd_create
    // fails.
    const rlimit none{3, 3};
    if (setrlimit(RLIMIT_NOFILE, &none) != 0) ok = 'r';
    if (write(ready[1], &ok, 1) != 1 || ok != 'y') _exit(20);
    char word;
    if (read(go[0], &word, 1) != 1) _exit(21);
    for (size_t at = 0; at < kSize; at += 4096) (void)StoreFaults(static_cast<char*>(p) + at, 'W');
    _exit(0);
  }
  char ok = 0;
  REQUIRE(read(ready[0], &ok, 1) == 1);
  REQUIRE(ok == 'y');
  REQUIRE(truncate(m.path("a").c_str(), 0) == 0);
  const int b = open(m.path("b").c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE(b >= 0);
  const std::string bytes(kSize, 'b');
  // Given once the mapper let them go, if it does.
  const bool given = Eventually(
      [&] { return pwrite(b, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()); },
      3);
  close(b);
  REQUIRE(write(go[1], "g", 1) == 1);
  CHECK(nvfs::test::WaitForExit(child, 30) == 0);
  // The pages went another way (inaccessible), and the blocks with them.
  CHECK(given);
  const std::string got = ReadAll(m.path("b"));
  CHECK(got.find('W') == std::string::npos);
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
  REQUIRE(unlink(m.path("filler").c_str()) == 0);
  StopAndCheck(m);
}

TEST_CASE("direct map: a sparse writable map gets blocks at the first store into a page, not at mmap",
          "[mount][direct][map][lazy]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  // LMDB's MDB_WRITEMAP: a file truncated up to a map size far larger than
  // the filesystem, mapped whole, written page by page.
  constexpr uint64_t kSize = 1ull << 30;
  {
    const int fd = open(m.path("sparse").c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, kSize) == 0);
    close(fd);
  }
  const uint64_t bsize = nvfs::test::StatFs(m.dir()).f_bsize;
  const uint64_t free_before = FreeBlocks(m.dir());
  Mapped w(m.path("sparse"), O_RDWR, kSize, PROT_READ | PROT_WRITE, MAP_SHARED);
  REQUIRE(w.Direct());
  // The map and loads from it allocate nothing.
  CHECK(w.p[512ull << 20] == 0);
  CHECK(w.p[kSize - 1] == 0);
  CHECK((free_before - FreeBlocks(m.dir())) * bsize < (64u << 10));
  // Stores into three far-apart pages: each gets its block (and its
  // chunk's), and nothing else does.
  const uint64_t at[] = {0, 100ull << 20, 900ull << 20};
  for (uint64_t a : at) std::memcpy(w.p + a + 10, "STORED", 6);
  for (uint64_t a : at) CHECK(std::memcmp(w.p + a + 10, "STORED", 6) == 0);
  const uint64_t used = (free_before - FreeBlocks(m.dir())) * bsize;
  CHECK(used >= 3 * 4096);
  CHECK(used <= 3 * (64u << 10) + (64u << 10));
  // Through the mount, at once.
  for (uint64_t a : at) {
    const std::string got = ReadAt(m.path("sparse"), static_cast<off_t>(a + 10), 6);
    CHECK(got == "STORED");
  }
  // No block to be had: the store gets SIGBUS, as ext4-DAX gives; the
  // stores before stay.
  Fill(m.path("filler"));
  CHECK(Faults(w.p + (700ull << 20), /*store=*/true));
  CHECK(std::memcmp(w.p + (100ull << 20) + 10, "STORED", 6) == 0);
  w.Unmap();
  w.Close();
  REQUIRE(unlink(m.path("filler").c_str()) == 0);
  CHECK(ReadAt(m.path("sparse"), (900ll << 20) + 10, 6) == "STORED");
  StopAndCheck(m);
}
