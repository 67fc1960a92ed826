// Direct writes through real mounts (doc/integrity.md section 11): the C API
// in this process, linked with the tests' build of libnvfs-direct, which can
// hold a store between its check and its bytes
// (NVFS_DIRECT_TEST_STORE_DELAY_MS): the race and restart cases use it to
// put a store exactly where the grace period and the mount's guard must
// keep it out of another file. The preload's own calls are direct_probe's
// "writes" scenario.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mount_fixture.hpp"
#include "mount_helpers.hpp"
#include "nvfs/direct.h"

using nvfs::test::MountedFs;
using nvfs::test::ReadAll;

namespace {

bool RootDaemon() { return geteuid() == 0; }

std::string Program(const char* env) {
  const char* p = std::getenv(env);
  if (p == nullptr) FAIL(env << " is not set (run through meson)");
  return p;
}

// Through the kernel (this process links the library, but the preload's
// calls serve only a preloaded library: these are the kernel's).
void WriteKernel(const std::string& path, const std::string& bytes, off_t at, int flags = 0) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | flags, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(pwrite(fd, bytes.data(), bytes.size(), at) == static_cast<ssize_t>(bytes.size()));
  close(fd);
}


// An O_RDWR descriptor of `path` and its handle; both go with it.
struct Attached {
  int fd = -1;
  nvfs_direct* d = nullptr;
  explicit Attached(const std::string& path, int flags = O_RDWR | O_CREAT) {
    fd = open(path.c_str(), flags, 0644);
    REQUIRE(fd >= 0);
    d = nvfs_direct_attach(fd);
    REQUIRE(d != nullptr);
  }
  ~Attached() {
    nvfs_direct_detach(d);
    close(fd);
  }
  ssize_t Write(const std::string& bytes, off_t at) {
    return nvfs_direct_pwrite(d, bytes.data(), bytes.size(), at);
  }
};

// Fills the filesystem with one file, `name`, until a write fails ENOSPC.
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

uint64_t FreeBlocks(const std::string& dir) {
  struct statvfs st {};
  REQUIRE(statvfs(dir.c_str(), &st) == 0);
  return st.f_bfree;
}

// Sets the tests' build's store delay for this process while it lives.
struct StoreDelay {
  explicit StoreDelay(int ms) { setenv("NVFS_DIRECT_TEST_STORE_DELAY_MS", std::to_string(ms).c_str(), 1); }
  ~StoreDelay() { unsetenv("NVFS_DIRECT_TEST_STORE_DELAY_MS"); }
};

// A write of `size` bytes of 'W' at offset 0 of `a`, on a thread of its
// own, held inside its store (its check passed, no byte stored yet) for
// `ms` by the tests' build's store delay; Join() gives what it returned.
class HeldStore {
 public:
  HeldStore(Attached& a, size_t size, int ms) {
    StoreDelay delay(ms);
    thread_ = std::thread([this, &a, size] { stored_ = a.Write(std::string(size, 'W'), 0); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  ~HeldStore() { Join(); }
  HeldStore(const HeldStore&) = delete;
  HeldStore& operator=(const HeldStore&) = delete;
  ssize_t Join() {
    if (thread_.joinable()) thread_.join();
    return stored_;
  }

 private:
  std::atomic<ssize_t> stored_{-2};
  std::thread thread_;
};

}  // namespace

TEST_CASE("direct write: overwrites, appends and holes, seen through the kernel and by readers",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  std::string model;
  {
    Attached f(m.path("f"));
    REQUIRE(nvfs_direct_write_why(f.d) == NVFS_DIRECT_ACTIVE);
    // Appends (the first allocates with a reserve, the rest commit only).
    for (int i = 0; i < 40; ++i) {
      const std::string bytes(5000, static_cast<char>('a' + i % 26));
      REQUIRE(f.Write(bytes, static_cast<off_t>(model.size())) == 5000);
      model += bytes;
      REQUIRE(nvfs_direct_write_why(f.d) == NVFS_DIRECT_ACTIVE);
    }
    CHECK(ReadAll(m.path("f")) == model);
    // Overwrites inside, across blocks.
    for (off_t at : {off_t{0}, off_t{4000}, off_t{70000}, off_t{199990}}) {
      const std::string bytes(10, 'O');
      REQUIRE(f.Write(bytes, at) == 10);
      model.replace(static_cast<size_t>(at), 10, bytes);
    }
    // Past the end, leaving a gap (zeros), and a hole filled.
    REQUIRE(f.Write("END", 300000) == 3);
    model.resize(300000, '\0');
    model += "END";
    CHECK(ReadAll(m.path("f")) == model);
    REQUIRE(ftruncate(f.fd, 1 << 20) == 0);  // a hole at the end
    model.resize(1 << 20, '\0');
    REQUIRE(f.Write("HOLE", 900000) == 4);
    model.replace(900000, 4, "HOLE");
    CHECK(ReadAll(m.path("f")) == model);
    // A direct reader in another process sees it at once.
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      const int fd = open(m.path("f").c_str(), O_RDONLY);
      nvfs_direct* d = nvfs_direct_attach(fd);
      std::string got(model.size(), 'x');
      const ssize_t n = nvfs_direct_pread(d, got.data(), got.size(), 0);
      _exit(n == static_cast<ssize_t>(model.size()) && got == model &&
                    nvfs_direct_why(d) == NVFS_DIRECT_ACTIVE
                ? 0
                : 1);
    }
    CHECK(nvfs::test::WaitForExit(child, 30) == 0);
    // And a write through the mount is seen by the next direct read.
    WriteKernel(m.path("f"), "KERNEL", 10);
    model.replace(10, 6, "KERNEL");
    std::string got(model.size(), 'x');
    REQUIRE(nvfs_direct_pread(f.d, got.data(), got.size(), 0) == static_cast<ssize_t>(got.size()));
    CHECK(got == model);
  }
  // After the close, the reserve past the end is given back.
  struct stat st {};
  REQUIRE(stat(m.path("f").c_str(), &st) == 0);
  CHECK(st.st_size == static_cast<off_t>(model.size()));
  StopAndCheck(m);
}

TEST_CASE("direct write: appends by word ask the daemon nothing, and every reader sees them",
          "[mount][direct][write][word]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  if (nvfs::test::RunProgram({"sh", "-c", "command -v strace"}) != 0) {
    NVFS_SKIP("strace is not installed (tools/check.sh installs it)");
  }
  MountedFs m(256ull << 20);
  m.Start();
  const auto letters = [](int count) {
    std::string model;
    for (int i = 0; i < count; ++i) model += std::string(4096, static_cast<char>('a' + i % 26));
    return model;
  };
#ifndef __SANITIZE_THREAD__
  // (Not in a ThreadSanitizer build: its library, preloaded into a program
  // built without it, does not start.)
  {
    // An unmodified program's 2,000 appends under the preload: a request
    // for a reserve now and then (and one a second, when the daemon folds
    // the word to set the times), never one per append.
    char dir[] = "/tmp/direct-word-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    const std::string tmp = dir;
    const std::string cmd = "LD_PRELOAD=" + Program("NVFS_DIRECT_LIB") +
                            " strace -f -qq -e trace=sendmsg -o " + tmp + "/s " +
                            Program("NVFS_DIRECT_PROBE") + " appends " + m.path("") + " 2000";
    REQUIRE(nvfs::test::RunProgram({"sh", "-c", cmd}) == 0);
    const size_t requests = nvfs::test::CountLines(ReadAll(tmp + "/s"), "sendmsg(");
    nvfs::test::RunProgram({"rm", "-rf", tmp});
    INFO("requests for 2,000 appends: " << requests);
    CHECK(requests < 200);
    CHECK(ReadAll(m.path("appends")) == letters(2000));
  }
#endif
  std::string model;
  {
    Attached f(m.path("f"));
    for (int i = 0; i < 300; ++i) {
      const std::string bytes(4096, static_cast<char>('a' + i % 26));
      REQUIRE(f.Write(bytes, static_cast<off_t>(model.size())) == 4096);
      model += bytes;
      // Seen at once by a stat through the mount: the kernel keeps no size
      // of a file whose word is open.
      struct stat st {};
      REQUIRE(stat(m.path("f").c_str(), &st) == 0);
      REQUIRE(st.st_size == static_cast<off_t>(model.size()));
      // And by the writer's own direct read (its runs past the old size
      // hold the bytes up to the word's end).
      std::string back(8192, 'x');
      REQUIRE(nvfs_direct_pread(f.d, back.data(), back.size(), static_cast<off_t>(model.size()) - 4096) ==
              4096);
      REQUIRE(back.substr(0, 4096) == bytes);
      if (i % 50 == 49) {
        // By a direct reader in another process, and through the mount.
        const pid_t child = fork();
        REQUIRE(child >= 0);
        if (child == 0) {
          const int fd = open(m.path("f").c_str(), O_RDONLY);
          nvfs_direct* d = nvfs_direct_attach(fd);
          std::string got(model.size() + 4096, 'x');
          const ssize_t n = nvfs_direct_pread(d, got.data(), got.size(), 0);
          got.resize(n < 0 ? 0 : static_cast<size_t>(n));
          _exit(got == model && nvfs_direct_why(d) == NVFS_DIRECT_ACTIVE ? 0 : 1);
        }
        REQUIRE(nvfs::test::WaitForExit(child, 30) == 0);
        REQUIRE(ReadAll(m.path("f")) == model);
      }
      if (i == 150) {
        // A truncation through the mount between appends: the word is
        // folded and closed first; the appends go on from the new end.
        REQUIRE(truncate(m.path("f").c_str(), 100000) == 0);
        model.resize(100000);
        REQUIRE(f.Write(std::string(4096 - 100000 % 4096, 't'), 100000) ==
                static_cast<ssize_t>(4096 - 100000 % 4096));
        model.resize(model.size() + 4096 - 100000 % 4096, 't');
      }
    }
    CHECK(nvfs_direct_write_why(f.d) == NVFS_DIRECT_ACTIVE);
    // The daemon dies with the word open (no close, no fsync): the next
    // mount folds it (the file is on the orphan list), every append kept.
    CHECK(m.Signal(SIGKILL) == 128 + SIGKILL);
  }
  m.Start();
  struct stat st {};
  REQUIRE(stat(m.path("f").c_str(), &st) == 0);
  CHECK(st.st_size == static_cast<off_t>(model.size()));
  CHECK(ReadAll(m.path("f")) == model);
#ifndef __SANITIZE_THREAD__
  CHECK(ReadAll(m.path("appends")) == letters(2000));
#endif
  StopAndCheck(m);
}

TEST_CASE("direct write: mtime and ctime move, at fsync at once and within a second without",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  WriteKernel(m.path("t"), std::string(8192, 't'), 0);
  Attached f(m.path("t"));
  REQUIRE(f.Write("x", 0) == 1);  // the session is proven for writing
  struct stat before {};
  REQUIRE(stat(m.path("t").c_str(), &before) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(f.Write("y", 100) == 1);
  REQUIRE(nvfs_direct_fsync(f.d) == 0);
  struct stat after {};
  REQUIRE(stat(m.path("t").c_str(), &after) == 0);
  CHECK((after.st_mtim.tv_sec > before.st_mtim.tv_sec ||
         (after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
          after.st_mtim.tv_nsec > before.st_mtim.tv_nsec)));
  CHECK(after.st_ctim.tv_sec * 1000000000L + after.st_ctim.tv_nsec >=
        after.st_mtim.tv_sec * 1000000000L + after.st_mtim.tv_nsec);
  // No fsync: the daemon sets them within its period (1 s).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(f.Write("z", 200) == 1);
  const auto written = std::chrono::steady_clock::now();
  struct stat later {};
  bool moved = false;
  while (std::chrono::steady_clock::now() - written < std::chrono::milliseconds(2500)) {
    REQUIRE(stat(m.path("t").c_str(), &later) == 0);
    if (later.st_mtim.tv_sec != after.st_mtim.tv_sec || later.st_mtim.tv_nsec != after.st_mtim.tv_nsec) {
      moved = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(moved);
  CHECK(std::chrono::steady_clock::now() - written < std::chrono::milliseconds(1500));
}

TEST_CASE("direct write: who may not write directly writes right through the kernel",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start("allow_other");  // the file modes alone decide who writes p
  WriteKernel(m.path("p"), std::string(8192, 'p'), 0);
  SECTION("a descriptor opened read-only, or O_APPEND") {
    const int ro = open(m.path("p").c_str(), O_RDONLY);
    REQUIRE(ro >= 0);
    nvfs_direct* d = nvfs_direct_attach(ro);
    CHECK(nvfs_direct_write_why(d) == NVFS_DIRECT_NOT_WRITABLE);
    CHECK(nvfs_direct_pwrite(d, "x", 1, 0) == -1);
    CHECK(errno == EBADF);
    nvfs_direct_detach(d);
    close(ro);
    Attached app(m.path("p"), O_RDWR | O_APPEND);
    CHECK(nvfs_direct_write_why(app.d) == NVFS_DIRECT_NOT_WRITABLE);
    REQUIRE(app.Write("APP", 0) == 3);  // the kernel appends
    CHECK(ReadAll(m.path("p")) == std::string(8192, 'p') + "APP");
  }
  SECTION("a set-user-ID file: the kernel writes it (and drops the bit as it does)") {
    REQUIRE(chmod(m.path("p").c_str(), 04755) == 0);
    Attached f(m.path("p"));
    REQUIRE(f.Write("S", 0) == 1);
    CHECK(nvfs_direct_write_why(f.d) == NVFS_DIRECT_PRIVILEGED);
    CHECK(ReadAll(m.path("p"))[0] == 'S');
    // Made set-user-ID while attached: the next write maps again and goes
    // to the kernel too.
    REQUIRE(chmod(m.path("p").c_str(), 0644) == 0);
    Attached g(m.path("p"));
    REQUIRE(g.Write("T", 1) == 1);
    CHECK(nvfs_direct_write_why(g.d) == NVFS_DIRECT_ACTIVE);
    REQUIRE(chmod(m.path("p").c_str(), 04755) == 0);
    REQUIRE(g.Write("U", 2) == 1);
    CHECK(nvfs_direct_write_why(g.d) == NVFS_DIRECT_PRIVILEGED);
    CHECK(ReadAll(m.path("p")).substr(0, 3) == "STU");
    // Root keeps the bit through a write (CAP_FSETID), as through the
    // mount; a user without it loses it in the kernel's write.
    REQUIRE(chmod(m.path("p").c_str(), 04777) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      if (!nvfs::test::BecomeNobody()) _exit(10);
      const int fd = open(m.path("p").c_str(), O_RDWR);
      if (fd < 0) _exit(11);
      nvfs_direct* d = nvfs_direct_attach(fd);
      _exit(nvfs_direct_pwrite(d, "V", 1, 3) == 1 ? 0 : 12);
    }
    CHECK(nvfs::test::WaitForExit(child, 30) == 0);
    struct stat st {};
    REQUIRE(stat(m.path("p").c_str(), &st) == 0);
    CHECK((st.st_mode & S_ISUID) == 0);
  }
  SECTION("a full filesystem: ENOSPC, nothing half-written") {
    Attached f(m.path("q"));
    REQUIRE(f.Write("start", 0) == 5);
    Fill(m.path("filler"));
    const std::string big(4 << 20, 'B');
    errno = 0;
    CHECK(f.Write(big, 5) == -1);
    CHECK(errno == ENOSPC);
    CHECK(ReadAll(m.path("q")) == "start");
    REQUIRE(unlink(m.path("filler").c_str()) == 0);
  }
  StopAndCheck(m);
}

// cp, dd, tar and NFS servers open the files they write O_WRONLY: such a
// descriptor is attached for its writes alone (a writer may read the whole
// namespace anyway), and its reads stay the kernel's.
TEST_CASE("direct write: a write-only descriptor writes directly; its reads are the kernel's "
          "(EBADF)", "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  WriteKernel(m.path("w"), std::string(8192, 'w'), 0);
  {
    Attached f(m.path("w"), O_WRONLY);
    CHECK(nvfs_direct_why(f.d) == NVFS_DIRECT_NOT_READABLE);
    CHECK(nvfs_direct_write_why(f.d) == NVFS_DIRECT_ACTIVE);
    REQUIRE(f.Write("over", 100) == 4);  // maps it, proves the session
    REQUIRE(f.Write("tail", 8192) == 4);  // extends it
    CHECK(nvfs_direct_write_why(f.d) == NVFS_DIRECT_ACTIVE);
    char byte;
    errno = 0;
    CHECK(nvfs_direct_pread(f.d, &byte, 1, 0) == -1);
    CHECK(errno == EBADF);
    CHECK(nvfs_direct_why(f.d) == NVFS_DIRECT_NOT_READABLE);
    // A new file, O_WRONLY | O_CREAT | O_TRUNC as cp makes it.
    Attached g(m.path("copy"), O_WRONLY | O_CREAT | O_TRUNC);
    std::string model;
    for (int i = 0; i < 8; ++i) {
      const std::string bytes(6000, static_cast<char>('A' + i));
      REQUIRE(g.Write(bytes, static_cast<off_t>(model.size())) == 6000);
      model += bytes;
    }
    CHECK(nvfs_direct_write_why(g.d) == NVFS_DIRECT_ACTIVE);
    CHECK(ReadAll(m.path("copy")) == model);
  }
  std::string expect(8192, 'w');
  expect.replace(100, 4, "over");
  CHECK(ReadAll(m.path("w")) == expect + "tail");
  {
    // Write-only and O_APPEND: the kernel's.
    Attached app(m.path("w"), O_WRONLY | O_APPEND);
    CHECK(nvfs_direct_write_why(app.d) == NVFS_DIRECT_NOT_WRITABLE);
  }
  StopAndCheck(m);
}

TEST_CASE("direct write: a process that may read but not write the namespace",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  // Others may read the image (the daemon warns of it), not write it.
  REQUIRE(chmod(m.image().c_str(), 0604) == 0);
  m.Start("allow_other");
  WriteKernel(m.path("p"), std::string(8192, 'p'), 0);
  REQUIRE(chmod(m.path("p").c_str(), 0666) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (!nvfs::test::BecomeNobody()) _exit(10);
    const int fd = open(m.path("p").c_str(), O_RDWR);
    if (fd < 0) _exit(11);
    nvfs_direct* d = nvfs_direct_attach(fd);
    if (nvfs_direct_why(d) != NVFS_DIRECT_ACTIVE) _exit(20 + nvfs_direct_why(d));  // it reads directly
    if (nvfs_direct_pwrite(d, "NOBODY", 6, 4096) != 6) _exit(13);
    if (nvfs_direct_write_why(d) != NVFS_DIRECT_NO_WRITE_NAMESPACE) _exit(14);
    char back[6];
    if (nvfs_direct_pread(d, back, 6, 4096) != 6 || std::memcmp(back, "NOBODY", 6) != 0) _exit(15);
    _exit(0);
  }
  CHECK(nvfs::test::WaitForExit(child, 30) == 0);
  CHECK(ReadAll(m.path("p")).substr(4096, 6) == "NOBODY");
  REQUIRE(m.Stop() == 0);
  REQUIRE(chmod(m.image().c_str(), 0600) == 0);
  nvfs::test::CheckFsckClean(m.image());
}

TEST_CASE("direct write: a store never lands in a block another file was given (grace period)",
          "[mount][direct][write][race]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  // One chunk of a write (1 MiB) is one store: its check, then its bytes.
  const size_t kSize = 1 << 20;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  auto a = std::make_unique<Attached>(m.path("a"));
  REQUIRE(a->Write("a", 0) == 1);  // proven for writing, runs known
  Fill(m.path("filler"));
  const uint64_t free_full = FreeBlocks(m.dir());
  HeldStore writer(*a, kSize, 1500);
  // The writer is inside its store, its check passed: its file gives the
  // blocks up, and another file wants every free block there is.
  REQUIRE(truncate(m.path("a").c_str(), 0) == 0);
  // Held back while the store may run: statfs does not count them free.
  CHECK(FreeBlocks(m.dir()) < free_full + (kSize >> 12) / 2);
  const int b = open(m.path("b").c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE(b >= 0);
  const std::string bytes(kSize, 'b');
  const ssize_t n = pwrite(b, bytes.data(), bytes.size(), 0);
  const bool written = n == static_cast<ssize_t>(bytes.size());
  // Its only blocks are those the store may still reach: not given.
  CHECK(!written);
  if (!written) CHECK(errno == ENOSPC);
  CHECK(writer.Join() == static_cast<ssize_t>(kSize));
  // Once it is out, the blocks are free again.
  if (!written) REQUIRE(pwrite(b, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
  close(b);
  const std::string got = ReadAll(m.path("b"));
  CHECK(got.find('W') == std::string::npos);
  CHECK(got == bytes);
  REQUIRE(unlink(m.path("filler").c_str()) == 0);
  a.reset();  // its descriptor keeps the mount busy
  StopAndCheck(m);
}

// Whether statfs counts at least `free` blocks within `within` (it counts
// no block a grace still holds back).
bool FreeWithin(const std::string& dir, uint64_t free, std::chrono::milliseconds within) {
  const auto end = std::chrono::steady_clock::now() + within;
  for (;;) {
    if (FreeBlocks(dir) >= free) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST_CASE("direct write: without the daemon's barrier, frees wait for every live writer and for "
          "nothing else",
          "[mount][direct][write][race]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  // The tests' switch: the daemon's membarrier fails, so no writer's store
  // is known ordered against its changes.
  REQUIRE(setenv("NVFS_TEST_MEMBARRIER_FAILS", "1", 1) == 0);
  MountedFs m(64ull << 20);
  m.Start();
  REQUIRE(unsetenv("NVFS_TEST_MEMBARRIER_FAILS") == 0);
  const size_t kSize = 8 << 20;
  const uint64_t blocks = kSize >> 12;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  const uint64_t with_a = FreeBlocks(m.dir());
  // No writer lives: there is none to order, the blocks are free at once.
  REQUIRE(truncate(m.path("a").c_str(), 0) == 0);
  CHECK(FreeWithin(m.dir(), with_a + blocks, std::chrono::milliseconds(2000)));
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  // A writer (a child proven for writing), alive and outside any store.
  int ready[2];
  int go[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(go) == 0);
  const std::string path = m.path("a");
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(ready[0]);
    close(go[1]);
    char ok = 0;
    const int fd = open(path.c_str(), O_RDWR);
    nvfs_direct* d = fd >= 0 ? nvfs_direct_attach(fd) : nullptr;
    if (d != nullptr && nvfs_direct_pwrite(d, "x", 1, 0) == 1) ok = 1;
    if (d != nullptr) nvfs_direct_detach(d);
    if (fd >= 0) close(fd);
    if (write(ready[1], &ok, 1) != 1) _exit(2);
    char c;
    if (read(go[0], &c, 1) < 0) _exit(3);
    _exit(0);
  }
  close(ready[1]);
  close(go[0]);
  char ok = 0;
  REQUIRE(read(ready[0], &ok, 1) == 1);
  CHECK(ok == 1);
  const uint64_t before = FreeBlocks(m.dir());
  REQUIRE(truncate(m.path("a").c_str(), 0) == 0);
  // Held while the writer lives: its next store may have loaded what the
  // truncation changed before it changed, and no barrier says otherwise.
  CHECK(!FreeWithin(m.dir(), before + blocks / 2, std::chrono::milliseconds(1000)));
  REQUIRE(write(go[1], "g", 1) == 1);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(status == 0);
  close(ready[0]);
  close(go[1]);
  // Gone, it stores nothing more: free again.
  CHECK(FreeWithin(m.dir(), before + blocks, std::chrono::milliseconds(3000)));
  StopAndCheck(m);
}

TEST_CASE("direct write: kill -9 of the daemon under a writer; the next mount waits it out",
          "[mount][direct][write][restart]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  const size_t kSize = 1 << 20;
  WriteKernel(m.path("a"), std::string(kSize, 'a'), 0);
  WriteKernel(m.path("other"), std::string(100000, 'o'), 0);
  auto a = std::make_unique<Attached>(m.path("a"));
  REQUIRE(a->Write("a", 0) == 1);
  Fill(m.path("filler"));
  HeldStore writer(*a, kSize, 2500);
  // The file gives its blocks up while the store may still run: this
  // daemon holds them back, and dies. Free on the media, they are the
  // first a new mount could give away.
  REQUIRE(truncate(m.path("a").c_str(), 0) == 0);
  CHECK(m.Signal(SIGKILL) == 128 + SIGKILL);
  const auto mount_at = std::chrono::steady_clock::now();
  m.Start();
  // The new mount waited for the store (about 2 s left of it).
  CHECK(std::chrono::steady_clock::now() - mount_at > std::chrono::milliseconds(1000));
  const int b = open(m.path("b").c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE(b >= 0);
  const std::string bytes(kSize, 'b');
  REQUIRE(pwrite(b, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
  close(b);
  writer.Join();
  const std::string got = ReadAll(m.path("b"));
  CHECK(got.find('W') == std::string::npos);
  CHECK(got == bytes);
  CHECK(ReadAll(m.path("other")) == std::string(100000, 'o'));
  REQUIRE(unlink(m.path("filler").c_str()) == 0);
  a.reset();
  StopAndCheck(m);
}

namespace {

// Runs direct_probe SCENARIO DIR under the preload; its exit status, what
// it printed in *log.
int RunProbe(const char* scenario, const std::string& dir, std::string* log) {
  const std::string probe = Program("NVFS_DIRECT_PROBE");
  const std::string preload = "LD_PRELOAD=" + Program("NVFS_DIRECT_LIB");
  char log_path[] = "/tmp/direct-write-probe-XXXXXX";
  const int log_fd = mkstemp(log_path);
  REQUIRE(log_fd >= 0);
  close(log_fd);
  const int status = nvfs::test::RunProgram({"env", preload, probe, scenario, dir}, log_path);
  log->clear();
  const int fd = open(log_path, O_RDONLY);
  if (fd >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) log->append(buf, static_cast<size_t>(n));
    close(fd);
  }
  unlink(log_path);
  return status;
}

}  // namespace

TEST_CASE("direct write: the preload under fork, dup2 and descriptor reuse",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  std::string log;
  const int status = RunProbe("writes", m.dir(), &log);
  INFO(log);
  CHECK(status == 0);
  CHECK(ReadAll(m.path("w1")) == std::string(4096, '1') + "parent");
  CHECK(ReadAll(m.path("w2")) == std::string(4096, '2') + "child");
  CHECK(ReadAll(m.path("w3")) == "reused");
  StopAndCheck(m);
}

TEST_CASE("direct write: a full filesystem fails no call that needs no space, under the preload",
          "[mount][direct][write][full]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(32ull << 20);
  m.Start();
  for (const char* name : {"a", "b", "c"}) {
    nvfs::test::WriteFile(m.path(name), std::string(65536, name[0]));
  }
  std::string log;
  const int status = RunProbe("full", m.dir(), &log);
  INFO(log);
  CHECK(status == 0);
  CHECK(ReadAll(m.path("a")) == std::string(65536, 'a'));
  CHECK(ReadAll(m.path("more")) == std::string(65536, 'm'));
  StopAndCheck(m);
}

TEST_CASE("direct write: threads writing through changes of credentials lose no write",
          "[mount][direct][write][credentials]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  constexpr int kBlocks = 16;
  WriteKernel(m.path("c1"), std::string(kBlocks * 4096, '.'), 0);
  WriteKernel(m.path("c2"), std::string(kBlocks * 4096, '.'), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::atomic<int> ready{0};
  std::vector<std::string> last[2];
  const auto writer = [&](int which) {
    // Attached (and proven) before the changes begin: an attach during a
    // change reads through the kernel for good, as a reader's does. (No
    // REQUIRE on these threads: Catch's assertions are the main thread's.)
    const int fd = open(m.path(which == 0 ? "c1" : "c2").c_str(), O_RDWR);
    nvfs_direct* d = fd < 0 ? nullptr : nvfs_direct_attach(fd);
    const auto write = [&](const std::string& bytes, off_t at) {
      return nvfs_direct_pwrite(d, bytes.data(), bytes.size(), at);
    };
    last[which].assign(kBlocks, std::string(4096, '.'));
    if (d == nullptr || write(std::string(4096, '.'), 0) != 4096) ++failures;
    ++ready;
    if (d == nullptr) return;
    for (int i = 0; !stop.load(); ++i) {
      std::string bytes(4096, static_cast<char>('A' + (i + which) % 26));
      std::memcpy(bytes.data(), &i, sizeof i);
      if (write(bytes, static_cast<off_t>(i % kBlocks) * 4096) != 4096) ++failures;
      last[which][i % kBlocks] = bytes;
    }
    if (nvfs_direct_write_why(d) != NVFS_DIRECT_ACTIVE) ++failures;  // still direct
    nvfs_direct_detach(d);
    close(fd);
  };
  std::thread t1(writer, 0), t2(writer, 1);
  while (ready < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The same credentials, over and over: each change takes the namespace
  // out of the process and the next write proves it again.
  // (A change takes out a proof under way too: the gaps leave room for
  // new proofs, and the writers go on a while after the last change.)
  for (int i = 0; i < 200; ++i) {
    REQUIRE(setresuid(0, 0, 0) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stop = true;
  t1.join();
  t2.join();
  CHECK(failures == 0);
  for (int which = 0; which < 2; ++which) {
    const std::string got = ReadAll(m.path(which == 0 ? "c1" : "c2"));
    for (int b = 0; b < kBlocks; ++b) {
      INFO("file " << which << " block " << b);
      CHECK(got.substr(static_cast<size_t>(b) * 4096, 4096) == last[which][b]);
    }
  }
  StopAndCheck(m);
}

namespace {

std::string ReadFileText(const std::string& path) {
  std::string out;
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// pwrite64 system calls strace counted (its -c table), -1 if none is listed.
long CountedCalls(const std::string& table, const std::string& call) {
  size_t at = table.find(" " + call + "\n");
  if (at == std::string::npos) return 0;
  const size_t line = table.rfind('\n', at);
  std::vector<std::string> fields;
  std::string field;
  for (char ch : table.substr(line + 1, at - line - 1)) {
    if (ch == ' ') {
      if (!field.empty()) fields.push_back(field);
      field.clear();
    } else {
      field += ch;
    }
  }
  if (!field.empty()) fields.push_back(field);
  // % time, seconds, usecs/call, calls[, errors]
  return fields.size() >= 4 ? std::stol(fields[3]) : -1;
}

}  // namespace

TEST_CASE("direct write: a writer proven again after each change of credentials keeps one page",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  // Pages of the writers' files that name this process (those of earlier
  // mounts of this run too: a page stays its process's while it lives).
  const auto pages_of_this_process = [] {
    size_t mine = 0;
    const uint64_t pid = static_cast<uint64_t>(getpid());
    DIR* dir = opendir("/run/nvfs");
    REQUIRE(dir != nullptr);
    while (dirent* e = readdir(dir)) {
      if (std::strncmp(e->d_name, "writers-", 8) != 0) continue;
      const std::string file = ReadAll(std::string("/run/nvfs/") + e->d_name);
      for (size_t at = 4096; at + 4096 <= file.size(); at += 4096) {
        uint64_t owner;
        std::memcpy(&owner, file.data() + at, sizeof owner);
        mine += owner == pid;
      }
    }
    closedir(dir);
    return mine;
  };
  MountedFs m;
  m.Start();
  const size_t before = pages_of_this_process();
  auto a = std::make_unique<Attached>(m.path("p"));
  REQUIRE(a->Write(std::string(8192, 'p'), 0) == 8192);
  // More changes than the writers' file has pages (128): each takes the
  // namespace out of the process, and the next write proves it again.
  for (int i = 0; i < 150; ++i) {
    REQUIRE(setresuid(0, 0, 0) == 0);
    REQUIRE(a->Write(std::string(4096, static_cast<char>('a' + i % 26)), 4096) == 4096);
  }
  CHECK(nvfs_direct_write_why(a->d) == NVFS_DIRECT_ACTIVE);
  CHECK(pages_of_this_process() == before + 1);  // this mount's one page
  a.reset();  // its descriptor keeps the mount busy
  StopAndCheck(m);
}

TEST_CASE("direct write: an unmodified program, SQLite, under the preload",
          "[mount][direct][write][sqlite]") {
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
  char dir[] = "/tmp/direct-sqlite-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string tmp = dir;
  {
    const int fd = open((tmp + "/w.sql").c_str(), O_WRONLY | O_CREAT, 0644);
    const std::string sql =
        "PRAGMA journal_mode=WAL;\n"
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n"
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<20000)\n"
        "  INSERT INTO t SELECT x, hex(randomblob(50)) FROM c;\n"
        "UPDATE t SET v = v || 'u' WHERE id % 3 = 0;\n"
        "DELETE FROM t WHERE id % 7 = 0;\n"
        "BEGIN; UPDATE t SET v = 'x' || v WHERE id % 5 = 0; COMMIT;\n"
        "PRAGMA wal_checkpoint(TRUNCATE);\n"
        "PRAGMA integrity_check;\n"
        "SELECT count(*), sum(length(v)) FROM t;\n";
    REQUIRE(write(fd, sql.data(), sql.size()) == static_cast<ssize_t>(sql.size()));
    close(fd);
  }
  const auto run = [&](const std::string& db, bool preloaded, const std::string& tag) {
    const std::string cmd = std::string(preloaded ? "LD_PRELOAD=" + preload + " " : "") +
                            "strace -f -c -e trace=pwrite64 -o " + tmp + "/" + tag +
                            ".strace sqlite3 " + db + " < " + tmp + "/w.sql > " + tmp + "/" +
                            tag + ".out 2>&1";
    return nvfs::test::RunProgram({"sh", "-c", cmd});
  };
  REQUIRE(run(m.path("direct.db"), true, "direct") == 0);
  REQUIRE(run(m.path("kernel.db"), false, "kernel") == 0);
  const std::string direct_out = ReadFileText(tmp + "/direct.out");
  const std::string kernel_out = ReadFileText(tmp + "/kernel.out");
  INFO("direct: " << direct_out << "kernel: " << kernel_out);
  CHECK(direct_out.find("\nok\n") != std::string::npos);
  CHECK(direct_out == kernel_out);
  // Its writes went direct: a handful of pwrite64 system calls where the
  // kernel's run made thousands.
  const long direct_calls = CountedCalls(ReadFileText(tmp + "/direct.strace"), "pwrite64");
  const long kernel_calls = CountedCalls(ReadFileText(tmp + "/kernel.strace"), "pwrite64");
  INFO("pwrite64 calls: direct " << direct_calls << ", kernel " << kernel_calls);
  CHECK(kernel_calls > 1000);
  CHECK(direct_calls * 100 < kernel_calls);
  // The database reads the same through the kernel afterwards.
  REQUIRE(nvfs::test::RunProgram({"sh", "-c", "sqlite3 " + m.path("direct.db") +
                                                  " 'PRAGMA integrity_check;' > " + tmp +
                                                  "/after.out 2>&1"}) == 0);
  CHECK(ReadFileText(tmp + "/after.out") == "ok\n");
  nvfs::test::RunProgram({"rm", "-rf", tmp});
  StopAndCheck(m);
}

TEST_CASE("direct write: a media error fails that write with EIO, and the process lives",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(256ull << 20);
  m.Start();
  const std::string f = m.path("big");
  WriteKernel(f, std::string(100 << 20, 'q'), 0);
  {
    Attached a(f);
    const std::string bytes(1 << 20, 'w');
    REQUIRE(a.Write(bytes, 90 << 20) == static_cast<ssize_t>(bytes.size()));
    // The namespace cut short under everyone's mapping: the end of the
    // file is lost, and a store there faults.
    REQUIRE(truncate(m.image().c_str(), 64 << 20) == 0);
    errno = 0;
    CHECK(a.Write(bytes, 90 << 20) == -1);
    CHECK(errno == EIO);
    // The process lives, and reads before the cut. The daemon found the
    // pages lost too, and turned the filesystem read-only (errors=):
    // a write before the cut gets what a write through the mount gets.
    char back[4];
    CHECK(nvfs_direct_pread(a.d, back, 4, 0) == 4);
    CHECK(std::string(back, 4) == "qqqq");
    errno = 0;
    const ssize_t direct = a.Write("fine", 0);
    const int direct_errno = errno;
    const int kfd = open(f.c_str(), O_RDWR);
    errno = 0;
    const ssize_t kernel = kfd < 0 ? -1 : pwrite(kfd, "fine", 4, 0);
    const int kernel_errno = kfd < 0 ? EROFS : errno;
    if (kfd >= 0) close(kfd);
    CHECK(direct == kernel);
    if (direct < 0) CHECK(direct_errno == kernel_errno);
  }
  // The daemon lives (it found the lost pages too); it is not marked clean.
  CHECK(m.Stop() == 1);
}

TEST_CASE("direct write: RLIMIT_FSIZE, a read-only mount and cache=page are the kernel's",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  SECTION("RLIMIT_FSIZE: an extension past it gets EFBIG (SIGXFSZ ignored)") {
    m.Start();
    WriteKernel(m.path("l"), std::string(4096, 'l'), 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      signal(SIGXFSZ, SIG_IGN);
      const rlimit lim{8192, 8192};
      if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(10);
      const int fd = open(m.path("l").c_str(), O_RDWR);
      nvfs_direct* d = nvfs_direct_attach(fd);
      if (nvfs_direct_pwrite(d, "in", 2, 100) != 2) _exit(11);  // an overwrite
      if (nvfs_direct_write_why(d) != NVFS_DIRECT_ACTIVE) _exit(12);
      errno = 0;
      if (nvfs_direct_pwrite(d, "past", 4, 10000) != -1 || errno != EFBIG) _exit(13);
      _exit(0);
    }
    CHECK(nvfs::test::WaitForExit(child, 30) == 0);
    struct stat st {};
    REQUIRE(stat(m.path("l").c_str(), &st) == 0);
    CHECK(st.st_size == 4096);
  }
  SECTION("a read-only mount (as one whose errors flag is set): EROFS from the kernel") {
    m.Start();
    WriteKernel(m.path("r"), std::string(4096, 'r'), 0);
    REQUIRE(m.Stop() == 0);
    m.Start("ro");
    const int fd = open(m.path("r").c_str(), O_RDWR);
    if (fd >= 0) {
      nvfs_direct* d = nvfs_direct_attach(fd);
      errno = 0;
      CHECK(nvfs_direct_pwrite(d, "x", 1, 0) == -1);
      CHECK(errno == EROFS);
      CHECK(nvfs_direct_write_why(d) == NVFS_DIRECT_NO_WRITES);
      nvfs_direct_detach(d);
      close(fd);
    } else {
      CHECK(errno == EROFS);  // the kernel refuses the open itself
    }
    CHECK(ReadAll(m.path("r")) == std::string(4096, 'r'));
  }
  SECTION("cache=page: reads direct, writes through the kernel") {
    m.Start("cache=page");
    WriteKernel(m.path("c"), std::string(4096, 'c'), 0);
    Attached a(m.path("c"));
    CHECK(nvfs_direct_why(a.d) == NVFS_DIRECT_ACTIVE);
    REQUIRE(a.Write("page", 0) == 4);
    CHECK(nvfs_direct_write_why(a.d) == NVFS_DIRECT_NO_WRITES);
    CHECK(ReadAll(m.path("c")).substr(0, 4) == "page");
  }
  StopAndCheck(m);
}
