// libnvfs-direct against a fake daemon (direct_fake_daemon.hpp): the C API,
// refreshes of runs, the end of a session, threads against a file whose
// runs move, media errors, fork, and the preload in other processes
// (direct_helper.cpp). The end-to-end tests on a real mount are the mount
// suite's.
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "direct_fake_daemon.hpp"
#include "nvfs/direct.h"

namespace {

using nvfs::DirectRun;
using nvfs::kDirectHole;
using nvfs::test::FakeDirectDaemon;

constexpr uint64_t kNsSize = 64ull << 20;
constexpr uint64_t kBlock = 4096;

// The byte a file's namespace copy holds at `offset` in version `seed`:
// never 0 (holes) nor 0xFF (bytes of a run given up, in the race test), and
// `seed` mod 251 can be told from any one byte.
uint8_t Pattern(uint64_t seed, uint64_t offset) {
  return static_cast<uint8_t>((offset * 131 + seed * 17) % 251 + 1);
}

// The seed mod 251 that gives `byte` at `offset`.
uint64_t SeedOf(uint8_t byte, uint64_t offset) {
  // 17 * 192 = 3264 = 13 * 251 + 1: 192 is 17's inverse mod 251.
  const int64_t r = (static_cast<int64_t>(byte) - 1 - static_cast<int64_t>((offset * 131) % 251) + 251 * 2) % 251;
  return static_cast<uint64_t>(r * 192 % 251);
}

// The process's one fake daemon (sessions are per mount and live as long
// as the process, so every test shares it), under a directory of its own.
struct Env {
  std::string root;
  std::unique_ptr<FakeDirectDaemon> daemon;
  uint64_t next_ns = 1 << 20;  // namespace space handed out to files
  int next_file = 0;

  Env() {
    char tmpl[] = "/tmp/nvfs-direct-test-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) std::abort();
    root = tmpl;
    chmod(root.c_str(), 0755);
    daemon = std::make_unique<FakeDirectDaemon>(root, kNsSize, 256);
    setenv("NVFS_DIRECT_SOCKET_DIR", daemon->socket_dir().c_str(), 1);
  }
  ~Env() {
    daemon.reset();
    std::string cmd = "rm -rf '" + root + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "cannot remove %s\n", root.c_str());
  }
  uint64_t Alloc(uint64_t len) {
    const uint64_t at = next_ns;
    next_ns += (len + kBlock - 1) / kBlock * kBlock;
    REQUIRE(next_ns <= kNsSize - (8 << 20));  // the last 8 MiB are the media-error test's
    return at;
  }
  std::string NewPath(const std::string& tag) { return root + "/" + tag + "-" + std::to_string(next_file++); }
};

Env& E() {
  static Env env;
  return env;
}

// A file of `size` bytes of `kernel_byte`.
std::string MakeFile(const std::string& tag, uint64_t size, char kernel_byte) {
  const std::string path = E().NewPath(tag);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  std::vector<char> bytes(size, kernel_byte);
  REQUIRE(pwrite(fd, bytes.data(), size, 0) == static_cast<ssize_t>(size));
  close(fd);
  return path;
}

// Writes version `seed` of the file's bytes into the namespace where
// `runs` put them.
void WriteRuns(const std::vector<DirectRun>& runs, uint64_t seed) {
  uint64_t file_off = 0;
  for (const DirectRun& r : runs) {
    if (r.offset != kDirectHole) {
      std::vector<uint8_t> bytes(r.len);
      for (uint64_t i = 0; i < r.len; ++i) bytes[i] = Pattern(seed, file_off + i);
      E().daemon->WriteNamespace(r.offset, bytes.data(), bytes.size());
    }
    file_off += r.len;
  }
}

// What a direct read of the file must return at `offset`.
uint8_t Expected(const std::vector<DirectRun>& runs, uint64_t seed, uint64_t offset) {
  uint64_t file_off = 0;
  for (const DirectRun& r : runs) {
    if (offset < file_off + r.len) return r.offset == kDirectHole ? 0 : Pattern(seed, offset);
    file_off += r.len;
  }
  return 0;
}

struct Attached {
  int fd = -1;
  nvfs_direct* f = nullptr;
  Attached(const std::string& path, int flags = O_RDONLY) {
    fd = open(path.c_str(), flags);
    REQUIRE(fd >= 0);
    f = nvfs_direct_attach(fd);
    REQUIRE(f != nullptr);
  }
  ~Attached() {
    nvfs_direct_detach(f);
    close(fd);
  }
  int why() const { return nvfs_direct_why(f); }
};

void CheckRead(nvfs_direct* f, const std::vector<DirectRun>& runs, uint64_t seed, uint64_t size,
               uint64_t offset, size_t len) {
  std::vector<uint8_t> buf(len + 1, 0xAB);
  const ssize_t n = nvfs_direct_pread(f, buf.data(), len, static_cast<off_t>(offset));
  const uint64_t want = offset >= size ? 0 : std::min<uint64_t>(len, size - offset);
  INFO("read of " << len << " at " << offset);
  REQUIRE(n == static_cast<ssize_t>(want));
  for (uint64_t i = 0; i < want; ++i) {
    if (buf[i] != Expected(runs, seed, offset + i)) {
      FAIL("byte " << offset + i << " is " << int(buf[i]) << ", want " << int(Expected(runs, seed, offset + i)));
    }
  }
  REQUIRE(buf[want] == 0xAB);
}

}  // namespace

TEST_CASE("direct: runs, holes and the end of the file come from the namespace", "[direct]") {
  const uint64_t size = 5 * kBlock + 100;
  const std::string path = MakeFile("layout", size, 'k');
  const std::vector<DirectRun> runs = {
      {E().Alloc(2 * kBlock), 2 * kBlock}, {kDirectHole, 2 * kBlock}, {E().Alloc(2 * kBlock), 2 * kBlock}};
  WriteRuns(runs, 1);
  E().daemon->Serve(path, size, runs);
  Attached a(path);
  REQUIRE(a.why() == NVFS_DIRECT_ACTIVE);

  CheckRead(a.f, runs, 1, size, 0, 4096);                // one run: the fast path
  CheckRead(a.f, runs, 1, size, 4000, 200);
  CheckRead(a.f, runs, 1, size, 8000, 400);              // a run, then a hole
  CheckRead(a.f, runs, 1, size, 2 * kBlock, 2 * kBlock);  // the hole alone
  CheckRead(a.f, runs, 1, size, 16000, 8192);            // hole, run, the end
  CheckRead(a.f, runs, 1, size, size - 1, 1);
  CheckRead(a.f, runs, 1, size, size, 10);               // at the end
  CheckRead(a.f, runs, 1, size, 30000, 10);              // past it
  CheckRead(a.f, runs, 1, size, 0, 1 << 20);             // all of it
  CheckRead(a.f, runs, 1, size, 0, 0);

  // preadv over iovecs that do not line up with the runs.
  std::vector<uint8_t> a1(100), a2(5000), a3(7000);
  const iovec iov[3] = {{a1.data(), a1.size()}, {a2.data(), a2.size()}, {a3.data(), a3.size()}};
  REQUIRE(nvfs_direct_preadv(a.f, iov, 3, 3000) == 12100);
  uint64_t off = 3000;
  for (const auto* v : {&a1, &a2, &a3}) {
    for (uint8_t b : *v) REQUIRE(b == Expected(runs, 1, off++));
  }

  char c;
  errno = 0;
  REQUIRE(nvfs_direct_pread(a.f, &c, 1, -1) == -1);
  REQUIRE(errno == EINVAL);
}

TEST_CASE("direct: a moved seq makes the client ask for the runs again", "[direct]") {
  const std::string path = MakeFile("seq", 4 * kBlock, 'k');
  std::vector<DirectRun> runs = {{E().Alloc(4 * kBlock), 4 * kBlock}};
  WriteRuns(runs, 1);
  const uint32_t slot = E().daemon->Serve(path, 4 * kBlock, runs);
  Attached a(path);
  CheckRead(a.f, runs, 1, 4 * kBlock, 0, 4 * kBlock);
  const uint64_t maps = E().daemon->maps();
  CheckRead(a.f, runs, 1, 4 * kBlock, 0, 4 * kBlock);
  REQUIRE(E().daemon->maps() == maps);  // known runs: no request

  // The file moves to other blocks.
  runs = {{E().Alloc(4 * kBlock), 4 * kBlock}};
  WriteRuns(runs, 2);
  E().daemon->Change(slot, 4 * kBlock, runs);
  CheckRead(a.f, runs, 2, 4 * kBlock, 0, 4 * kBlock);
  REQUIRE(E().daemon->maps() == maps + 1);

  // It grows, and shrinks.
  runs.push_back({E().Alloc(kBlock), kBlock});
  WriteRuns(runs, 2);
  E().daemon->Change(slot, 5 * kBlock - 10, runs);
  CheckRead(a.f, runs, 2, 5 * kBlock - 10, 0, 8 * kBlock);
  E().daemon->Change(slot, 100, runs);
  CheckRead(a.f, runs, 2, 100, 0, 8 * kBlock);
  CheckRead(a.f, runs, 2, 100, 4096, 10);
}

TEST_CASE("direct: runs past a reply are asked for at their offset, and kept", "[direct]") {
  const uint64_t blocks = 12;
  const std::string path = MakeFile("window", blocks * kBlock, 'k');
  std::vector<DirectRun> runs;
  for (uint64_t i = 0; i < blocks; ++i) runs.push_back({E().Alloc(kBlock), kBlock});
  std::reverse(runs.begin(), runs.end());  // not contiguous in the namespace
  WriteRuns(runs, 3);
  E().daemon->Serve(path, blocks * kBlock, runs);
  E().daemon->set_max_runs(3);
  Attached a(path);
  CheckRead(a.f, runs, 3, blocks * kBlock, (blocks - 1) * kBlock + 5, 100);  // past the first window
  CheckRead(a.f, runs, 3, blocks * kBlock, 0, blocks * kBlock);             // across every window
  const uint64_t maps = E().daemon->maps();
  CheckRead(a.f, runs, 3, blocks * kBlock, 0, blocks * kBlock);
  CheckRead(a.f, runs, 3, blocks * kBlock, 7 * kBlock - 3, 6);
  REQUIRE(E().daemon->maps() == maps);  // all of it is known now
  E().daemon->set_max_runs(nvfs::direct::kMaxRuns);
}

TEST_CASE("direct: what the kernel serves, and why", "[direct]") {
  const std::string path = MakeFile("kernel", 4 * kBlock, 'k');
  const std::vector<DirectRun> runs = {{E().Alloc(4 * kBlock), 4 * kBlock}};
  WriteRuns(runs, 4);
  E().daemon->Serve(path, 4 * kBlock, runs);
  std::vector<char> buf(kBlock);
  auto all_k = [&] {
    for (char c : buf) {
      if (c != 'k') return false;
    }
    return true;
  };

  SECTION("write-only") {
    Attached a(path, O_WRONLY);
    REQUIRE(a.why() == NVFS_DIRECT_NOT_READABLE);
    errno = 0;
    REQUIRE(nvfs_direct_pread(a.f, buf.data(), kBlock, 0) == -1);
    REQUIRE(errno == EBADF);
  }
  SECTION("O_DIRECT") {
    Attached a(path, O_RDONLY | O_DIRECT);
    REQUIRE(a.why() == NVFS_DIRECT_O_DIRECT);
    void* aligned = nullptr;
    REQUIRE(posix_memalign(&aligned, 4096, kBlock) == 0);
    REQUIRE(nvfs_direct_pread(a.f, aligned, kBlock, 0) == static_cast<ssize_t>(kBlock));
    std::memcpy(buf.data(), aligned, kBlock);
    free(aligned);
    REQUIRE(all_k());
  }
  SECTION("a file the daemon does not serve") {
    Attached a(MakeFile("unserved", 4 * kBlock, 'k'));
    REQUIRE(a.why() == NVFS_DIRECT_NOT_NVFS);
    REQUIRE(nvfs_direct_pread(a.f, buf.data(), kBlock, 0) == static_cast<ssize_t>(kBlock));
    REQUIRE(all_k());
  }
  SECTION("a mount without a socket") {
    const std::string shm = "/dev/shm/nvfs-direct-test-" + std::to_string(getpid());
    const int fd = open(shm.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(pwrite(fd, std::string(kBlock, 'k').data(), kBlock, 0) == static_cast<ssize_t>(kBlock));
    nvfs_direct* f = nvfs_direct_attach(fd);
    unlink(shm.c_str());
    REQUIRE(nvfs_direct_why(f) == NVFS_DIRECT_NO_SERVER);
    REQUIRE(nvfs_direct_pread(f, buf.data(), kBlock, 0) == static_cast<ssize_t>(kBlock));
    nvfs_direct_detach(f);
    close(fd);
    REQUIRE(all_k());
  }
  SECTION("not a regular file") {
    int p[2];
    REQUIRE(pipe(p) == 0);
    nvfs_direct* f = nvfs_direct_attach(p[0]);
    REQUIRE(nvfs_direct_why(f) == NVFS_DIRECT_NOT_NVFS);
    errno = 0;
    REQUIRE(nvfs_direct_pread(f, buf.data(), 1, 0) == -1);
    REQUIRE(errno == ESPIPE);
    nvfs_direct_detach(f);
    close(p[0]);
    close(p[1]);
    const int dir = open(E().root.c_str(), O_RDONLY | O_DIRECTORY);
    f = nvfs_direct_attach(dir);
    REQUIRE(nvfs_direct_why(f) == NVFS_DIRECT_NOT_NVFS);
    nvfs_direct_detach(f);
    close(dir);
  }
  for (int why = 0; why <= NVFS_DIRECT_NO_MEMORY + 1; ++why) REQUIRE(nvfs_direct_strwhy(why) != nullptr);
}

TEST_CASE("direct: a new mount of the namespace ends the session", "[direct]") {
  const std::string path = MakeFile("remount", 4 * kBlock, 'k');
  const std::vector<DirectRun> runs = {{E().Alloc(4 * kBlock), 4 * kBlock}};
  WriteRuns(runs, 5);
  E().daemon->Serve(path, 4 * kBlock, runs);
  auto old = std::make_unique<Attached>(path);
  CheckRead(old->f, runs, 5, 4 * kBlock, 0, kBlock);

  const uint64_t proves = E().daemon->proves();
  E().daemon->SetMountCount(E().daemon->MountCount() + 1);
  std::vector<char> buf(kBlock);
  REQUIRE(nvfs_direct_pread(old->f, buf.data(), kBlock, 0) == static_cast<ssize_t>(kBlock));
  REQUIRE(buf == std::vector<char>(kBlock, 'k'));  // from the kernel
  REQUIRE(old->why() == NVFS_DIRECT_GONE);

  // A file attached now gets a session of the new mount.
  Attached fresh(path);
  REQUIRE(fresh.why() == NVFS_DIRECT_ACTIVE);
  REQUIRE(E().daemon->proves() == proves + 1);
  CheckRead(fresh.f, runs, 5, 4 * kBlock, 0, kBlock);
  old.reset();
  CheckRead(fresh.f, runs, 5, 4 * kBlock, kBlock, kBlock);
}

TEST_CASE("direct: a handle whose descriptor number now names another file reads through the kernel",
          "[direct]") {
  const std::string a_path = MakeFile("renamed-a", 2 * kBlock, 'k');
  const std::string b_path = MakeFile("renamed-b", 2 * kBlock, 'm');
  std::vector<DirectRun> a_runs = {{E().Alloc(2 * kBlock), 2 * kBlock}};
  const std::vector<DirectRun> b_runs = {{E().Alloc(2 * kBlock), 2 * kBlock}};
  WriteRuns(a_runs, 12);
  WriteRuns(b_runs, 13);
  const uint32_t a_slot = E().daemon->Serve(a_path, 2 * kBlock, a_runs);
  E().daemon->Serve(b_path, 2 * kBlock, b_runs);
  const int fd = open(a_path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  nvfs_direct* f = nvfs_direct_attach(fd);
  CheckRead(f, a_runs, 12, 2 * kBlock, 0, kBlock);
  // The caller breaks the contract: the number is closed and reused while
  // the handle lives, and A's runs move, so the handle asks again.
  close(fd);
  REQUIRE(open(b_path.c_str(), O_RDONLY) == fd);
  a_runs = {{E().Alloc(2 * kBlock), 2 * kBlock}};
  E().daemon->Change(a_slot, 2 * kBlock, a_runs);
  std::vector<char> buf(kBlock);
  REQUIRE(nvfs_direct_pread(f, buf.data(), kBlock, 0) == static_cast<ssize_t>(kBlock));
  REQUIRE(buf == std::vector<char>(kBlock, 'm'));  // B's own bytes, through the kernel
  REQUIRE(nvfs_direct_why(f) == NVFS_DIRECT_NOT_NVFS);
  nvfs_direct_detach(f);
  close(fd);
}

TEST_CASE("direct: a mount whose daemon starts later is served at once, and one that stops is not",
          "[direct]") {
  (void)E();  // test mode (NVFS_DIRECT_SOCKET_DIR) on
  // Another file system (tmpfs), no socket for it yet.
  const std::string shm = "/dev/shm/nvfs-direct-test-late-" + std::to_string(getpid());
  REQUIRE(mkdir(shm.c_str(), 0755) == 0);
  const std::string path = shm + "/file";
  {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(pwrite(fd, std::string(2 * kBlock, 'k').data(), 2 * kBlock, 0) == static_cast<ssize_t>(2 * kBlock));
    close(fd);
  }
  {
    Attached before(path);
    REQUIRE(before.why() == NVFS_DIRECT_NO_SERVER);
  }
  const std::vector<DirectRun> runs = {{1 << 20, 2 * kBlock}};
  {
    FakeDirectDaemon late(shm, 4 << 20, 16, E().daemon->socket_dir());
    for (const DirectRun& r : runs) late.FillNamespace(r.offset, 'L', r.len);
    late.Serve(path, 2 * kBlock, runs);
    Attached a(path);  // the socket is new: no waiting out the failure
    REQUIRE(a.why() == NVFS_DIRECT_ACTIVE);
    std::vector<char> buf(kBlock);
    REQUIRE(nvfs_direct_pread(a.f, buf.data(), kBlock, 0) == static_cast<ssize_t>(kBlock));
    REQUIRE(buf == std::vector<char>(kBlock, 'L'));
  }
  // The daemon stopped (its socket is gone): asking finds no daemon, the
  // session is over, and a new one cannot be had.
  Attached after(path);
  REQUIRE(after.why() == NVFS_DIRECT_NO_SERVER);
  std::vector<char> buf(kBlock);
  REQUIRE(nvfs_direct_pread(after.f, buf.data(), kBlock, 0) == static_cast<ssize_t>(kBlock));
  REQUIRE(buf == std::vector<char>(kBlock, 'k'));
  unlink(path.c_str());
  REQUIRE(std::system(("rm -rf '" + shm + "'").c_str()) == 0);
}

// The daemon moves a file to other blocks again and again, and hands the
// blocks it left to "another file" (fills them with 0xFF) right after it
// moved the seq; readers in other threads must see one whole version of
// the file in every read, never a byte of a run given up.
TEST_CASE("direct: readers never return a byte of a run the file gave up", "[direct][race]") {
  const uint64_t size = 64 * kBlock;
  const std::string path = MakeFile("race", size, 'k');
  const uint64_t region[2] = {E().Alloc(size), E().Alloc(size)};
  // Version v lies in region v % 2: whole for even v, in two swapped
  // halves for odd v (reads across runs take the slow path).
  auto runs_of = [&](uint64_t v) -> std::vector<DirectRun> {
    const uint64_t r = region[v % 2];
    if (v % 2 == 0) return {{r, size}};
    return {{r + size / 2, size / 2}, {r, size / 2}};
  };
  // Every version's bytes, by seed mod 251 (all a read can tell apart).
  std::vector<std::vector<uint8_t>> versions(251, std::vector<uint8_t>(size));
  for (uint64_t seed = 0; seed < 251; ++seed) {
    for (uint64_t i = 0; i < size; ++i) versions[seed][i] = Pattern(seed, i);
  }
  auto write_version = [&](uint64_t v) {
    uint64_t file_off = 0;
    for (const DirectRun& r : runs_of(v)) {
      E().daemon->WriteNamespace(r.offset, versions[v % 251].data() + file_off, r.len);
      file_off += r.len;
    }
  };
  write_version(0);
  const uint32_t slot = E().daemon->Serve(path, size, runs_of(0));

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, failures{0}, kernel_reads{0};
  Attached shared(path);
  auto reader = [&](int t) {
    std::mt19937_64 rng(t);
    std::vector<uint8_t> buf(size);
    int own_fd = -1;
    nvfs_direct* own = nullptr;
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      // Every eighth read goes through a handle of the thread's own, made
      // and dropped as it goes (handles retired while others read). Not an
      // Attached: its REQUIREs would run on this thread, and Catch2's
      // assertions are not thread-safe (tools/tsan.sh found them racing).
      nvfs_direct* f = shared.f;
      if (i % 8 == 0) {
        own_fd = open(path.c_str(), O_RDONLY);
        own = own_fd >= 0 ? nvfs_direct_attach(own_fd) : nullptr;
        if (own == nullptr) {
          failures++;
          if (own_fd >= 0) close(own_fd);
          continue;
        }
        f = own;
      }
      const uint64_t off = rng() % size;
      const size_t len = 1 + rng() % (size - off);
      ssize_t n;
      if (i % 3 == 0 && len >= 3) {
        const iovec iov[3] = {{buf.data(), 1}, {buf.data() + 1, len / 2}, {buf.data() + 1 + len / 2, len - 1 - len / 2}};
        n = nvfs_direct_preadv(f, iov, 3, static_cast<off_t>(off));
      } else {
        n = nvfs_direct_pread(f, buf.data(), len, static_cast<off_t>(off));
      }
      if (i % 8 == 0) {
        nvfs_direct_detach(own);
        close(own_fd);
      }
      reads.fetch_add(1, std::memory_order_relaxed);
      if (n != static_cast<ssize_t>(len)) {
        failures++;
        continue;
      }
      // A read whose file changed under it more often than the client asks
      // again goes to the kernel: the file's own bytes, right on a mount.
      if (std::all_of(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(len),
                      [](uint8_t b) { return b == 'k'; })) {
        kernel_reads.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (std::memcmp(buf.data(), versions[SeedOf(buf[0], off)].data() + off, len) != 0) failures++;
    }
  };
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) readers.emplace_back(reader, t);
  uint64_t v = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
  while (std::chrono::steady_clock::now() < end) {
    ++v;
    write_version(v);                                    // into the region no one reads
    E().daemon->Change(slot, size, runs_of(v));          // seq moves
    // The blocks it left, reused at once (for a while: a longer window for a
    // reader still copying from them).
    for (int k = 0; k < 3; ++k) E().daemon->FillNamespace(region[(v - 1) % 2], 0xFF, size);
  }
  stop = true;
  for (auto& t : readers) t.join();
  INFO(reads.load() << " reads (" << kernel_reads.load() << " through the kernel), " << v
                      << " versions, " << E().daemon->maps() << " maps");
  REQUIRE(reads.load() > 1000);
  REQUIRE(failures.load() == 0);
  REQUIRE(kernel_reads.load() * 100 < reads.load());
}

namespace {

sigjmp_buf program_jump;
volatile sig_atomic_t program_faults = 0;

void ProgramHandler(int, siginfo_t*, void*) {
  program_faults = program_faults + 1;
  siglongjmp(program_jump, 1);
}

// The handler the kernel runs for SIGBUS, past the library's sigaction.
void* KernelSigbusHandler() {
  struct {
    void* handler;
    unsigned long flags;
    void* restorer;
    uint64_t mask;
  } k{};
  REQUIRE(syscall(SYS_rt_sigaction, SIGBUS, nullptr, &k, 8) == 0);
  return k.handler;
}

// A private mapping of a file cut under it: touching it faults.
const volatile char* FaultingPage(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 8192) == 0);
  void* p = mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  REQUIRE(ftruncate(fd, 0) == 0);
  close(fd);
  unlink(path.c_str());
  return static_cast<const volatile char*>(p);
}

}  // namespace

TEST_CASE("direct: a media error fails that read with EIO and the program's SIGBUS handler still runs",
          "[direct][sigbus]") {
  // Two files in the namespace's last 8 MiB, cut off by truncating the
  // namespace file under the client's mapping; a third one before it.
  FakeDirectDaemon& d = *E().daemon;
  const uint64_t tail = kNsSize - (8 << 20);
  const std::string lost1 = MakeFile("lost1", 2 * kBlock, 'k');
  const std::string lost2 = MakeFile("lost2", 2 * kBlock, 'k');
  const std::string kept = MakeFile("kept", 2 * kBlock, 'k');
  const std::vector<DirectRun> runs1 = {{tail, 2 * kBlock}};
  const std::vector<DirectRun> runs2 = {{tail + (1 << 20), 2 * kBlock}};
  const std::vector<DirectRun> runs3 = {{E().Alloc(2 * kBlock), 2 * kBlock}};
  WriteRuns(runs1, 6);
  WriteRuns(runs2, 7);
  WriteRuns(runs3, 8);
  d.Serve(lost1, 2 * kBlock, runs1);
  d.Serve(lost2, 2 * kBlock, runs2);
  d.Serve(kept, 2 * kBlock, runs3);
  Attached a1(lost1), a2(lost2), a3(kept);
  CheckRead(a1.f, runs1, 6, 2 * kBlock, 0, 2 * kBlock);
  CheckRead(a3.f, runs3, 8, 2 * kBlock, 0, 2 * kBlock);

  REQUIRE(truncate(d.ns_path().c_str(), static_cast<off_t>(tail)) == 0);
  std::vector<char> buf(2 * kBlock);
  errno = 0;
  REQUIRE(nvfs_direct_pread(a1.f, buf.data(), kBlock, 0) == -1);
  REQUIRE(errno == EIO);
  errno = 0;
  REQUIRE(nvfs_direct_pread(a1.f, buf.data(), 2 * kBlock, 0) == -1);  // a page recorded before
  REQUIRE(errno == EIO);
  CheckRead(a3.f, runs3, 8, 2 * kBlock, 0, 2 * kBlock);  // the rest of the namespace reads on

  // A handler the program installs for SIGBUS gets the program's faults,
  // and the library keeps its own.
  void* const library_handler = KernelSigbusHandler();
  struct sigaction mine {}, previous {};
  mine.sa_sigaction = ProgramHandler;
  mine.sa_flags = SA_SIGINFO;
  sigemptyset(&mine.sa_mask);
  REQUIRE(sigaction(SIGBUS, &mine, &previous) == 0);
  REQUIRE(KernelSigbusHandler() == library_handler);
  struct sigaction current {};
  REQUIRE(sigaction(SIGBUS, nullptr, &current) == 0);
  REQUIRE(current.sa_sigaction == ProgramHandler);

  const volatile char* page = FaultingPage(E().root + "/fault");
  program_faults = 0;
  if (sigsetjmp(program_jump, 1) == 0) {
    (void)page[0];
    FAIL("no fault");
  }
  REQUIRE(program_faults == 1);
  // A fault of the library's meanwhile is still the library's.
  errno = 0;
  REQUIRE(nvfs_direct_pread(a2.f, buf.data(), kBlock, kBlock) == -1);
  REQUIRE(errno == EIO);
  REQUIRE(program_faults == 1);
  REQUIRE(sigaction(SIGBUS, &previous, nullptr) == 0);

  // With the default action the program dies of its fault, as without the library.
  const pid_t pid = fork();
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, nullptr);
    (void)page[0];
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGBUS);
  munmap(const_cast<char*>(page), 8192);

  REQUIRE(truncate(d.ns_path().c_str(), static_cast<off_t>(kNsSize)) == 0);
  CheckRead(a3.f, runs3, 8, 2 * kBlock, 0, 2 * kBlock);

  // The superblock's page lost: the session's identity is unreadable, so
  // its files go to the kernel, and the process lives.
  const uint64_t mount_count = d.MountCount();
  REQUIRE(truncate(d.ns_path().c_str(), 0) == 0);
  REQUIRE(nvfs_direct_pread(a3.f, buf.data(), kBlock, 0) == static_cast<ssize_t>(kBlock));
  REQUIRE(std::vector<char>(buf.begin(), buf.begin() + kBlock) == std::vector<char>(kBlock, 'k'));
  REQUIRE(a3.why() == NVFS_DIRECT_GONE);
  REQUIRE(truncate(d.ns_path().c_str(), static_cast<off_t>(kNsSize)) == 0);
  d.WriteIdentity(mount_count + 1);
}

TEST_CASE("direct: a forked child reads, with a connection of its own", "[direct][fork]") {
  const std::string path = MakeFile("fork", 4 * kBlock, 'k');
  std::vector<DirectRun> runs = {{E().Alloc(4 * kBlock), 4 * kBlock}};
  WriteRuns(runs, 9);
  const uint32_t slot = E().daemon->Serve(path, 4 * kBlock, runs);
  Attached a(path);
  CheckRead(a.f, runs, 9, 4 * kBlock, 0, 4 * kBlock);
  // Moved before the fork: the child's first read asks for the runs.
  runs = {{E().Alloc(4 * kBlock), 4 * kBlock}};
  WriteRuns(runs, 10);
  E().daemon->Change(slot, 4 * kBlock, runs);
  const uint64_t connections = E().daemon->connections();
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<uint8_t> buf(4 * kBlock);
    bool ok = nvfs_direct_pread(a.f, buf.data(), buf.size(), 0) == static_cast<ssize_t>(buf.size()) &&
              nvfs_direct_why(a.f) == NVFS_DIRECT_ACTIVE;
    for (size_t i = 0; ok && i < buf.size(); ++i) ok = buf[i] == Pattern(10, i);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(E().daemon->connections() == connections + 1);  // the child's own
  CheckRead(a.f, runs, 10, 4 * kBlock, 0, 4 * kBlock);     // the parent's still works
  REQUIRE(E().daemon->connections() == connections + 1);
}

// --- credentials are part of the proof (issue 29) --------------------------------

namespace {

// Whether this process maps the file at `path` (/proc/self/maps).
bool MapsFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return false;
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long start, end, offset, ino;
    unsigned dev_major, dev_minor;
    char perms[8];
    found = std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &start, &end, perms, &offset, &dev_major,
                        &dev_minor, &ino) == 7 &&
            ino == st.st_ino && dev_major == major(st.st_dev) && dev_minor == minor(st.st_dev);
  }
  std::fclose(maps);
  return found;
}

// A read of the whole file: true if every byte is the namespace's version
// `seed` (`*direct`) or the file's own byte `kernel` (read by the kernel).
bool ReadsWhole(nvfs_direct* f, uint64_t size, uint64_t seed, char kernel, bool* direct) {
  std::vector<uint8_t> buf(size);
  if (nvfs_direct_pread(f, buf.data(), size, 0) != static_cast<ssize_t>(size)) return false;
  bool all_direct = true, all_kernel = true;
  for (uint64_t i = 0; i < size; ++i) {
    all_direct = all_direct && buf[i] == Pattern(seed, i);
    all_kernel = all_kernel && buf[i] == static_cast<uint8_t>(kernel);
  }
  *direct = all_direct;
  return all_direct || all_kernel;
}

// Runs `body` in a child (credentials are the process's: the test's own
// must stay root's) and returns its exit status.
template <class Body>
int InChild(Body body) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(body());
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("direct: a change of credentials takes the namespace out first; the process proves "
          "itself again as what it now is",
          "[direct][credentials]") {
  const std::string path = MakeFile("creds", 4 * kBlock, 'k');
  const std::vector<DirectRun> runs = {{E().Alloc(4 * kBlock), 4 * kBlock}};
  WriteRuns(runs, 11);
  E().daemon->Serve(path, 4 * kBlock, runs);
  const std::string other = MakeFile("creds-other", kBlock, 'o');
  const uint64_t other_at = E().Alloc(kBlock);
  E().daemon->FillNamespace(other_at, 'O', kBlock);
  E().daemon->Serve(other, kBlock, {{other_at, kBlock}});
  const std::string ns = E().daemon->ns_path();
  const uint64_t proves = E().daemon->proves();
  const int status = InChild([&] {
    const int fd = open(path.c_str(), O_RDONLY);
    nvfs_direct* f = nvfs_direct_attach(fd);
    bool direct = false;
    if (f == nullptr || nvfs_direct_why(f) != NVFS_DIRECT_ACTIVE) return 10;
    if (!ReadsWhole(f, 4 * kBlock, 11, 'k', &direct) || !direct) return 11;
    if (!MapsFile(ns)) return 12;
    // A change to the same credentials is a change still: the namespace
    // leaves before it, and comes back with a new proof.
    if (setegid(getegid()) != 0) return 13;
    if (MapsFile(ns)) return 14;
    if (!ReadsWhole(f, 4 * kBlock, 11, 'k', &direct) || !direct) return 15;
    if (nvfs_direct_why(f) != NVFS_DIRECT_ACTIVE || !MapsFile(ns)) return 16;
    // Down to nobody, who may not open the namespace (0600, root's).
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      return 17;
    }
    if (MapsFile(ns)) return 18;
    if (!ReadsWhole(f, 4 * kBlock, 11, 'k', &direct) || direct) return 19;  // the kernel's
    if (nvfs_direct_why(f) != NVFS_DIRECT_NO_NAMESPACE) return 20;
    if (MapsFile(ns)) return 21;
    // A file attached now: not read directly either.
    const int ofd = open(other.c_str(), O_RDONLY);
    nvfs_direct* o = nvfs_direct_attach(ofd);
    if (o == nullptr || nvfs_direct_why(o) != NVFS_DIRECT_NO_NAMESPACE) return 22;
    char c = 0;
    if (nvfs_direct_pread(o, &c, 1, 0) != 1 || c != 'o') return 23;
    if (MapsFile(ns)) return 24;
    return 0;
  });
  INFO("the child's status (the step that failed)");
  REQUIRE(status == 0);
  // Root's two proofs, and nobody's refused one (the namespace never came).
  REQUIRE(E().daemon->proves() == proves + 2);
}

TEST_CASE("direct: readers in other threads while the process changes its credentials",
          "[direct][credentials]") {
  const uint64_t size = 64 * kBlock;
  const std::string path = MakeFile("creds-threads", size, 'k');
  const std::vector<DirectRun> runs = {{E().Alloc(size), size}};
  WriteRuns(runs, 12);
  E().daemon->Serve(path, size, runs);
  const int status = InChild([&] {
    const int fd = open(path.c_str(), O_RDONLY);
    nvfs_direct* f = nvfs_direct_attach(fd);
    if (f == nullptr || nvfs_direct_why(f) != NVFS_DIRECT_ACTIVE) return 10;
    std::atomic<bool> stop{false};
    std::atomic<long> bad{0}, direct{0}, reads{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t) {
      readers.emplace_back([&, t] {
        std::vector<uint8_t> buf(16 * kBlock);
        for (uint64_t i = 0; !stop.load(); ++i) {
          const uint64_t off = (i * 7 + static_cast<uint64_t>(t)) % 48 * kBlock;
          const ssize_t n = nvfs_direct_pread(f, buf.data(), buf.size(), static_cast<off_t>(off));
          bool all_direct = n == static_cast<ssize_t>(buf.size()), all_kernel = all_direct;
          for (size_t j = 0; j < buf.size() && (all_direct || all_kernel); ++j) {
            all_direct = all_direct && buf[j] == Pattern(12, off + j);
            all_kernel = all_kernel && buf[j] == 'k';
          }
          if (!all_direct && !all_kernel) bad++;
          if (all_direct) direct++;
          reads++;
        }
      });
    }
    // A change takes out a proof under way too (its connection is the
    // process's as it was): the gaps leave room for new proofs.
    for (int i = 0; i < 200; ++i) {
      if (setegid(getegid()) != 0) bad++;
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    stop = true;
    for (auto& t : readers) t.join();
    std::fprintf(stderr, "credentials under readers: %ld reads, %ld direct, %ld wrong\n", reads.load(),
                 direct.load(), bad.load());
    if (bad.load() != 0) return 11;
    if (direct.load() == 0) return 12;
    // Still served directly after it all.
    bool d = false;
    if (!ReadsWhole(f, size, 12, 'k', &d) || !d || nvfs_direct_why(f) != NVFS_DIRECT_ACTIVE) return 13;
    return 0;
  });
  REQUIRE(status == 0);
}

TEST_CASE("direct: a forked child does not keep the parent's mapping", "[direct][credentials][fork]") {
  const std::string path = MakeFile("creds-fork", kBlock, 'k');
  const std::vector<DirectRun> runs = {{E().Alloc(kBlock), kBlock}};
  WriteRuns(runs, 13);
  E().daemon->Serve(path, kBlock, runs);
  Attached a(path);
  CheckRead(a.f, runs, 13, kBlock, 0, kBlock);
  const std::string ns = E().daemon->ns_path();
  REQUIRE(MapsFile(ns));
  const int status = InChild([&] {
    if (MapsFile(ns)) return 10;  // before the child reads anything
    bool direct = false;
    if (!ReadsWhole(a.f, kBlock, 13, 'k', &direct) || !direct) return 11;  // its own proof
    return MapsFile(ns) ? 0 : 12;
  });
  REQUIRE(status == 0);
  REQUIRE(MapsFile(ns));
  CheckRead(a.f, runs, 13, kBlock, 0, kBlock);
}

// --- the preload, in other processes -------------------------------------------

namespace {

struct PreloadFiles {
  std::string a, b, c;  // a and b served (namespace 'A', 'B'), c not
  PreloadFiles() {
    a = MakeFile("pa", 4 * kBlock, 'a');
    b = MakeFile("pb", 4 * kBlock, 'b');
    c = MakeFile("pc", 4 * kBlock, 'c');
    for (auto [path, byte] : {std::pair{a, 'A'}, std::pair{b, 'B'}}) {
      const uint64_t at = E().Alloc(4 * kBlock);
      E().daemon->FillNamespace(at, static_cast<uint8_t>(byte), 4 * kBlock);
      E().daemon->Serve(path, 4 * kBlock, {{at, 4 * kBlock}});
    }
  }
};

// Runs the helper; `preload`: with LD_PRELOAD; `uid`: as that user.
int Helper(const std::vector<std::string>& args, bool preload = true, uid_t uid = 0,
           int keep_fd = -1) {
  const char* helper = std::getenv("NVFS_DIRECT_HELPER");
  const char* lib = std::getenv("NVFS_DIRECT_LIB");
  REQUIRE(helper != nullptr);
  REQUIRE(lib != nullptr);
  (void)E();
  const pid_t pid = fork();
  if (pid == 0) {
    if (preload) {
      setenv("LD_PRELOAD", lib, 1);
      // Under AddressSanitizer (tools/check.sh's second build) the library
      // comes before the sanitizer's runtime in the load order.
      const char* asan = std::getenv("ASAN_OPTIONS");
      setenv("ASAN_OPTIONS", (std::string(asan != nullptr ? asan : "") + ":verify_asan_link_order=0").c_str(), 1);
    } else {
      unsetenv("LD_PRELOAD");
    }
    if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);
    if (uid != 0 && (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)) _exit(125);
    std::vector<char*> argv = {const_cast<char*>(helper)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(helper, argv.data());
    _exit(126);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("preload: pread and preadv of nvfs files are served, the rest goes to the kernel",
          "[direct][preload]") {
  static PreloadFiles f;
  REQUIRE(Helper({"reuse", f.a, "A", f.b, "B"}) == 0);
  REQUIRE(Helper({"preadv", f.a, "A", "a"}) == 0);
  REQUIRE(Helper({"pipe"}) == 0);
  REQUIRE(Helper({"wronly", f.a}) == 0);
  REQUIRE(Helper({"odirect", f.a, "A", "a"}) == 0);
  REQUIRE(Helper({"fork", f.a, "A"}) == 0);
  // Linked but not preloaded: libc's pread.
  REQUIRE(Helper({"reuse", f.a, "a", f.b, "b"}, false) == 0);
  REQUIRE(Helper({"attach", f.a, std::to_string(NVFS_DIRECT_ACTIVE), "A"}, false) == 0);
}

TEST_CASE("preload: a descriptor number reused for another file reads that file", "[direct][preload]") {
  static PreloadFiles f;
  REQUIRE(Helper({"reuse", f.a, "A", f.c, "c"}) == 0);
  REQUIRE(Helper({"reuse", f.c, "c", f.a, "A"}) == 0);
  REQUIRE(Helper({"fclose", f.a, "A", f.b, "B"}) == 0);
  REQUIRE(Helper({"close_range", f.a, "A", f.b, "B"}) == 0);
  REQUIRE(Helper({"dup2", f.a, "A", f.b, "B"}) == 0);
  REQUIRE(Helper({"dup2", f.a, "A", f.c, "c"}) == 0);
  REQUIRE(Helper({"closefrom", f.a, "A", f.c}) == 0);
  REQUIRE(Helper({"churn", f.a, "A", f.b, "B"}) == 0);
  REQUIRE(Helper({"churn", f.a, "A", f.c, "c"}) == 0);
}

TEST_CASE("preload: a descriptor opened before the library was loaded", "[direct][preload]") {
  static PreloadFiles f;
  const int fd = open(f.a.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(Helper({"inherited", std::to_string(fd), "A"}, true, 0, fd) == 0);
  close(fd);
}

TEST_CASE("direct: a process that may not read the namespace reads through the kernel", "[direct]") {
  static PreloadFiles f;
  REQUIRE(Helper({"attach", f.a, std::to_string(NVFS_DIRECT_NO_NAMESPACE), "a"}, false, 65534) == 0);
  REQUIRE(Helper({"reuse", f.a, "a", f.b, "b"}, true, 65534) == 0);
}
