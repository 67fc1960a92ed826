// An ordinary program for the preload's tests (test_direct_lib.cpp): run
// with LD_PRELOAD=libnvfs-direct.so, it does what unmodified programs do
// with descriptors (close and reopen at the same number, dup2, dup3,
// fclose, fork, exec, O_DIRECT, threads, its own SIGBUS handler, a drop of
// privileges, a full filesystem) and checks that every pread returns the bytes of the file
// the descriptor names now.
// It links nothing of nvfs: whether a descriptor is served directly it asks
// the preloaded library (nvfs_direct_fd_why, found with dlsym).
//
//   direct_probe SCENARIO DIR [ARG]
//
// Files DIR/a, DIR/b and DIR/c hold 64 KiB each of 'a', 'b' and 'c'
// (written by the test). Exits 0 if every check held; otherwise prints the
// first failure on stderr and exits 1.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kFileSize = 64 * 1024;
std::string g_dir;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "direct_probe: %s (errno %d: %s)\n", what.c_str(), errno,
               std::strerror(errno));
  std::exit(1);
}

void Check(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

// What the preload says of `fd`: 0 (NVFS_DIRECT_ACTIVE) if served
// directly; -100 if no library is preloaded.
int Why(int fd) {
  using Fn = int (*)(int);
  static const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "nvfs_direct_fd_why"));
  return fn == nullptr ? -100 : fn(fd);
}

std::string Path(const char* name) { return g_dir + "/" + name; }

// pread of 4 KiB at a few offsets: every byte must be `c`.
void ExpectFile(int fd, char c, const std::string& what) {
  char buf[4096];
  for (off_t off : {off_t{0}, off_t{4096}, off_t{40000}, off_t{kFileSize - 4096}}) {
    const ssize_t n = pread(fd, buf, sizeof buf, off);
    Check(n == static_cast<ssize_t>(sizeof buf), what + ": pread length");
    for (char b : buf) Check(b == c, what + ": a byte of another file (" + std::string(1, b) + ")");
  }
  char tail[4096];
  iovec iov[2] = {{buf, 100}, {tail, 4096}};
  Check(preadv(fd, iov, 2, kFileSize - 200) == 200, what + ": preadv at the end");
  for (int i = 0; i < 100; ++i) Check(buf[i] == c && tail[i] == c, what + ": preadv bytes");
}

void ExpectDirect(int fd, const std::string& what) {
  const int why = Why(fd);
  Check(why == 0, what + ": not served directly (why " + std::to_string(why) + ")");
}

int OpenRead(const char* name, int flags = 0) {
  const int fd = open(Path(name).c_str(), O_RDONLY | flags);
  Check(fd >= 0, std::string("open ") + name);
  return fd;
}

void Reuse() {
  // close, then another file at the same number.
  int fd = OpenRead("a");
  ExpectFile(fd, 'a', "a");
  ExpectDirect(fd, "a");
  close(fd);
  int again = OpenRead("b");
  Check(again == fd, "b did not get a's number");
  ExpectFile(again, 'b', "b at a's old number");
  ExpectDirect(again, "b");
  // dup2 and dup3 over an attached descriptor.
  const int c = OpenRead("c");
  ExpectFile(c, 'c', "c");
  Check(dup2(c, again) == again, "dup2");
  ExpectFile(again, 'c', "dup2 of c over b");
  const int a = OpenRead("a");
  ExpectFile(a, 'a', "a again");
  Check(dup3(a, again, O_CLOEXEC) == again, "dup3");
  ExpectFile(again, 'a', "dup3 of a over c");
  close(again);
  close(a);
  close(c);
  // fclose closes inside libc: the number reused must not read the old file.
  FILE* f = std::fopen(Path("a").c_str(), "r");
  Check(f != nullptr, "fopen");
  const int ff = fileno(f);
  ExpectFile(ff, 'a', "fopen'd a");
  std::fclose(f);
  const int b = OpenRead("b");
  Check(b == ff, "b did not get the fclose'd number");
  ExpectFile(b, 'b', "b at the fclose'd number");
  close(b);
  // fcntl(F_DUPFD) and a descriptor made by dup.
  const int x = OpenRead("c");
  ExpectFile(x, 'c', "c for dup");
  const int y = dup(x);
  ExpectFile(y, 'c', "dup of c");
  const int z = fcntl(x, F_DUPFD_CLOEXEC, 0);
  ExpectFile(z, 'c', "F_DUPFD of c");
  close(x);
  close(y);
  close(z);
}

void Fork() {
  const int fd = OpenRead("a");
  ExpectFile(fd, 'a', "parent before fork");
  const pid_t pid = fork();
  Check(pid >= 0, "fork");
  if (pid == 0) {
    ExpectFile(fd, 'a', "child");
    ExpectDirect(fd, "child");
    const int b = OpenRead("b");  // a new attach: the child's own session
    ExpectFile(b, 'b', "child's own open");
    ExpectDirect(b, "child's own open");
    std::_Exit(0);
  }
  ExpectFile(fd, 'a', "parent after fork");
  int status = 0;
  Check(waitpid(pid, &status, 0) == pid, "waitpid");
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed");
  ExpectFile(fd, 'a', "parent after the child");
  ExpectDirect(fd, "parent after the child");
}

void Exec(const char* self) {
  const int fd = OpenRead("a");  // no O_CLOEXEC: the new image inherits it
  ExpectFile(fd, 'a', "before exec");
  const std::string arg = std::to_string(fd);
  execl(self, self, "exec-child", g_dir.c_str(), arg.c_str(), static_cast<char*>(nullptr));
  Fail("exec");
}

void ExecChild(int fd) {
  // A descriptor opened before this image's library attached to anything.
  ExpectFile(fd, 'a', "inherited across exec");
  ExpectDirect(fd, "inherited across exec");
}

void Direct() {
  const int fd = OpenRead("a", O_DIRECT);
  void* buf = nullptr;
  Check(posix_memalign(&buf, 4096, 4096) == 0, "posix_memalign");
  Check(pread(fd, buf, 4096, 0) == 4096, "O_DIRECT pread");
  Check(static_cast<char*>(buf)[4095] == 'a', "O_DIRECT bytes");
  Check(Why(fd) == 5, "O_DIRECT descriptor said to be served directly");  // NVFS_DIRECT_O_DIRECT
  std::free(buf);
  close(fd);
  // O_DIRECT added later, by fcntl.
  const int g = OpenRead("b");
  ExpectFile(g, 'b', "b before F_SETFL");
  Check(fcntl(g, F_SETFL, O_DIRECT) == 0, "F_SETFL O_DIRECT");
  Check(Why(g) == 5, "O_DIRECT by F_SETFL said to be served directly");
  close(g);
  // A write-only descriptor is the kernel's.
  const int w = open(Path("c").c_str(), O_WRONLY);
  Check(w >= 0, "open c write-only");
  char byte;
  Check(pread(w, &byte, 1, 0) < 0 && errno == EBADF, "pread of a write-only descriptor");
  close(w);
}

// RWF_DONTCACHE asks for buffered I/O that leaves nothing in the page
// cache; the kernel's FUSE refuses it (EOPNOTSUPP on Linux 6.18). A direct
// read caches nothing, so the library serves it. A flag only the kernel
// can honour (RWF_HIPRI) gets the kernel's answer.
void DontCache() {
  const int fd = OpenRead("a");
  std::vector<char> a(4096), b(5000);
  iovec iov[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  constexpr int kDontCache = 0x80;  // RWF_DONTCACHE (Linux 6.14)
  Check(preadv2(fd, iov, 2, 100, kDontCache) == 4096 + 5000, "preadv2 RWF_DONTCACHE");
  Check(a == std::vector<char>(4096, 'a') && b == std::vector<char>(5000, 'a'),
        "preadv2 RWF_DONTCACHE bytes");
  Check(Why(fd) == 0, "RWF_DONTCACHE descriptor not served directly");
  errno = 0;
  const ssize_t through = preadv2(fd, iov, 1, 0, RWF_HIPRI);
  const int through_errno = errno;
  const ssize_t kernel = syscall(SYS_preadv2, fd, iov, 1, 0, 0, RWF_HIPRI);
  Check(through == kernel && (kernel >= 0 || through_errno == errno), "RWF_HIPRI not the kernel's");
  close(fd);
}

void Threads() {
  std::vector<int> fds;
  for (const char* n : {"a", "b", "c"}) fds.push_back(OpenRead(n));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const int fd = fds[t % 3];
      const char c = "abc"[t % 3];
      char buf[8192];
      for (int i = 0; i < 20000; ++i) {
        const off_t off = (i * 4096) % (kFileSize - sizeof buf);
        if (pread(fd, buf, sizeof buf, off) != static_cast<ssize_t>(sizeof buf)) ++bad;
        for (char b : buf) {
          if (b != c) {
            ++bad;
            break;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  Check(bad == 0, std::to_string(bad.load()) + " wrong reads from threads");
  for (int fd : fds) ExpectDirect(fd, "threads");
}

sigjmp_buf g_jump;
volatile sig_atomic_t g_caught = 0;
void OnBus(int) {
  g_caught = 1;
  siglongjmp(g_jump, 1);
}

// The program's own SIGBUS handler, installed after the library loaded,
// still runs for a fault that is not the library's: a read of its own
// mapping past the end of a file.
void OwnSigbus() {
  const int fd = OpenRead("a");
  ExpectFile(fd, 'a', "before the program's SIGBUS");
  struct sigaction sa {};
  sa.sa_handler = OnBus;
  sigemptyset(&sa.sa_mask);
  Check(sigaction(SIGBUS, &sa, nullptr) == 0, "sigaction");
  char tmpl[] = "/tmp/direct-probe-XXXXXX";
  const int t = mkstemp(tmpl);
  Check(t >= 0, "mkstemp");
  unlink(tmpl);
  Check(ftruncate(t, 8192) == 0, "ftruncate");
  auto* p = static_cast<volatile char*>(mmap(nullptr, 8192, PROT_READ, MAP_SHARED, t, 0));
  Check(p != MAP_FAILED, "mmap");
  Check(ftruncate(t, 0) == 0, "ftruncate to 0");
  if (sigsetjmp(g_jump, 1) == 0) {
    (void)p[4096];
    Fail("no SIGBUS from a cut mapping");
  }
  Check(g_caught == 1, "the program's SIGBUS handler did not run");
  ExpectFile(fd, 'a', "after the program's SIGBUS");
  ExpectDirect(fd, "after the program's SIGBUS");
}

// Reads DIR/ARG in a loop for ARG2 seconds, 4 KiB at 8 KiB (a reader under
// a daemon kill and remount, while the file is rewritten with another byte
// and another file, of 'x', takes its old blocks): a read may fail (the
// dead mount) or come short (the rewrite), but never holds an 'x', nor two
// different bytes. Prints "reads R errors E direct D last B".
void Reader(const char* name, double seconds) {
  int fd = OpenRead(name);
  char buf[4096];
  long reads = 0, errors = 0, direct = 0;
  char last = '?';
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = pread(fd, buf, sizeof buf, 8192);
    if (n < 0) {
      ++errors;
      // The mount went away: open the file again (the new mount, once it is
      // there), as a program that retries would.
      const int again = open(Path(name).c_str(), O_RDONLY);
      if (again >= 0) {
        close(fd);
        fd = again;
      }
      usleep(1000);
      continue;
    }
    if (n != static_cast<ssize_t>(sizeof buf)) {  // the file being rewritten
      ++reads;
      continue;
    }
    char seen = 0;
    for (char b : buf) {
      if (b == 0) continue;  // a block being written
      Check(b != 'x', "a read that holds another file's bytes");
      Check(seen == 0 || b == seen, "a read that mixes the file's old and new bytes");
      seen = b;
      last = b;
    }
    if (Why(fd) == 0) ++direct;
    ++reads;
  }
  std::printf("reads %ld errors %ld direct %ld last %c\n", reads, errors, direct, last);
  ExpectDirect(fd, "the reader's last descriptor");
}

// A line from the test on stdin (it says when to go on).
void WaitForTest() {
  char line[64];
  Check(std::fgets(line, sizeof line, stdin) != nullptr, "the test went away");
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// A root program reads through the library, closes what it opened and
// drops to nobody, dumpable (issue 29): meanwhile the test, as nobody,
// looks for another file's bytes in this process's memory where the
// namespace was mapped. Afterwards the program still reads right, through
// the kernel: nobody may not read the namespace.
void Drop() {
  Check(geteuid() == 0, "drop wants to start as root");
  const int a = OpenRead("a");
  ExpectFile(a, 'a', "a as root");
  ExpectDirect(a, "a as root");
  const int b = OpenRead("b");
  ExpectFile(b, 'b', "b as root");
  ExpectDirect(b, "b as root");
  close(b);
  Say("mapped");
  WaitForTest();
  Check(setgroups(0, nullptr) == 0, "setgroups");
  Check(setresgid(65534, 65534, 65534) == 0, "setresgid");
  Check(setresuid(65534, 65534, 65534) == 0, "setresuid");
  Check(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0, "PR_SET_DUMPABLE");
  // Where Yama restricts ptrace to ancestors: any process of the uid.
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  Say("dropped");
  WaitForTest();
  ExpectFile(a, 'a', "a, opened as root, after the drop");
  Check(Why(a) == 3, "a after the drop: why " + std::to_string(Why(a)));  // NVFS_DIRECT_NO_NAMESPACE
  const int c = OpenRead("c");
  ExpectFile(c, 'c', "c opened after the drop");
  Check(Why(c) == 3, "c after the drop: why " + std::to_string(Why(c)));
  Say("read");
  WaitForTest();
}

// A child of fork() keeps nothing of the parent's namespace mapping (the
// test looks at its maps before it reads) and proves itself when it reads.
void ForkMaps() {
  const int a = OpenRead("a");
  ExpectFile(a, 'a', "parent before fork");
  ExpectDirect(a, "parent before fork");
  int go[2], ready[2];
  Check(pipe(go) == 0 && pipe(ready) == 0, "pipe");
  std::fflush(stdout);
  const pid_t pid = fork();
  Check(pid >= 0, "fork");
  if (pid == 0) {
    // fork() has returned here, so the library's handlers have run: what
    // the test sees in the child's maps from now on is what it keeps.
    close(go[1]);
    close(ready[0]);
    Check(write(ready[1], "r", 1) == 1, "tell the parent");
    char c;
    Check(read(go[0], &c, 1) == 1, "the parent went away");
    ExpectFile(a, 'a', "child, the inherited descriptor");
    ExpectDirect(a, "child, the inherited descriptor");
    const int b = OpenRead("b");
    ExpectFile(b, 'b', "child's own open");
    ExpectDirect(b, "child's own open");
    std::_Exit(0);
  }
  close(go[0]);
  close(ready[1]);
  char r;
  Check(read(ready[0], &r, 1) == 1, "the child did not start");
  Say("child " + std::to_string(pid));
  WaitForTest();
  Check(write(go[1], "g", 1) == 1, "write to the child");
  int status = 0;
  Check(waitpid(pid, &status, 0) == pid, "waitpid");
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed");
  ExpectFile(a, 'a', "parent after the child");
  ExpectDirect(a, "parent after the child");
  Say("done");
}

int WriteWhy(int fd) {
  using Fn = int (*)(int);
  static const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "nvfs_direct_fd_write_why"));
  return fn == nullptr ? -100 : fn(fd);
}

void PwriteAll(int fd, const std::string& bytes, off_t at, const std::string& what) {
  Check(pwrite(fd, bytes.data(), bytes.size(), at) == static_cast<ssize_t>(bytes.size()), what);
  Check(WriteWhy(fd) == 0, what + ": not written directly (why " + std::to_string(WriteWhy(fd)) + ")");
}

// Writes through the preload under fork, dup2 and a reused number
// (tests/mount/test_direct_write.cpp checks the files after).
void Writes() {
  const int w1 = open(Path("w1").c_str(), O_RDWR | O_CREAT, 0644);
  Check(w1 >= 0, "open w1");
  PwriteAll(w1, std::string(4096, '1'), 0, "w1");
  const pid_t pid = fork();
  Check(pid >= 0, "fork");
  if (pid == 0) {
    const int w2 = open(Path("w2").c_str(), O_RDWR | O_CREAT, 0644);
    Check(w2 >= 0, "open w2");
    PwriteAll(w2, std::string(4096, '2'), 0, "child's w2");
    PwriteAll(w2, "child", 4096, "child's w2 append");
    // The parent's descriptor, inherited: the child's own session writes it.
    PwriteAll(w1, std::string(4096, '1'), 0, "child's w1");
    close(w2);
    std::_Exit(0);
  }
  int status = 0;
  Check(waitpid(pid, &status, 0) == pid, "waitpid");
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed");
  PwriteAll(w1, "parent", 4096, "parent's w1 after the child");
  const int w3 = open(Path("w3").c_str(), O_RDWR | O_CREAT, 0644);
  Check(w3 >= 0, "open w3");
  PwriteAll(w3, "XXXXXX", 0, "w3");
  // w1's number now names w3: a write to it lands in w3.
  Check(dup2(w3, w1) == w1, "dup2");
  PwriteAll(w1, "reused", 0, "w3 through w1's number");
  close(w3);
  close(w1);
  Say("done");
}

// A full filesystem under the preload, with a direct reader, writer and
// map alive: DIR/fill is written directly until ENOSPC; then every call
// that needs no space must work: reads (direct and through the map),
// overwrites in place, stat, getxattr, readdir, open and close, fsync, a
// truncation down, a punched hole and the unlink of the filler, after
// which a write that needs a block works again.
void Full() {
  const int a = open(Path("a").c_str(), O_RDWR);
  Check(a >= 0, "open a");
  const int b = OpenRead("b");
  void* map = mmap(nullptr, kFileSize, PROT_READ, MAP_SHARED, b, 0);
  Check(map != MAP_FAILED, "mmap b");
  const int c = OpenRead("c");
  ExpectFile(a, 'a', "a before");
  ExpectDirect(a, "a");
  PwriteAll(a, std::string(4096, 'a'), 0, "a, an overwrite before");
  const int fill = open(Path("fill").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  Check(fill >= 0, "open fill");
  const std::string piece(64 * 1024, 'f');
  off_t at = 0;
  for (;;) {
    const ssize_t n = pwrite(fill, piece.data(), piece.size(), at);
    if (n < 0) {
      Check(errno == ENOSPC, "fill: an error other than ENOSPC");
      break;
    }
    at += n;
    if (n < static_cast<ssize_t>(piece.size())) break;
  }
  Check(at > 0, "fill wrote nothing");
  struct statvfs sv;
  Check(statvfs(g_dir.c_str(), &sv) == 0, "statvfs");
  Check(sv.f_bavail < 64, "not full after the fill: " + std::to_string(sv.f_bavail) + " blocks available after " + std::to_string(at) + " bytes");
  // Reads: direct, through the map, through the kernel's descriptor path.
  ExpectFile(a, 'a', "a at 100 %");
  ExpectFile(c, 'c', "c at 100 %");
  const char* bytes = static_cast<const char*>(map);
  for (size_t i = 0; i < kFileSize; i += 4096) Check(bytes[i] == 'b', "the map of b at 100 %");
  std::string back(static_cast<size_t>(at), '\0');
  Check(pread(fill, back.data(), back.size(), 0) == at, "fill read back");
  Check(back.find_first_not_of('f') == std::string::npos, "fill's bytes");
  // An overwrite needs no block.
  PwriteAll(a, std::string(4096, 'a'), 4096, "a, an overwrite at 100 %");
  struct stat st;
  Check(stat(Path("a").c_str(), &st) == 0, "stat at 100 %");
  char value[8];
  Check(getxattr(Path("a").c_str(), "user.none", value, sizeof value) == -1 && errno == ENODATA,
        "getxattr at 100 %");
  DIR* d = opendir(g_dir.c_str());
  Check(d != nullptr, "opendir at 100 %");
  int names = 0;
  while (readdir(d) != nullptr) ++names;
  closedir(d);
  Check(names >= 6, "readdir at 100 %");
  const int again = OpenRead("c");
  ExpectFile(again, 'c', "c opened at 100 %");
  Check(close(again) == 0, "close at 100 %");
  Check(fsync(a) == 0, "fsync at 100 %");
  Check(fallocate(fill, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 8192) == 0,
        "punch at 100 %");
  Check(ftruncate(fill, at / 2 + 100) == 0, "truncate down at 100 %");
  Check(close(fill) == 0, "close fill");
  Check(unlink(Path("fill").c_str()) == 0, "unlink at 100 %");
  const int more = open(Path("more").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  Check(more >= 0, "create after the unlink");
  PwriteAll(more, std::string(65536, 'm'), 0, "a write after the unlink");
  close(more);
  munmap(map, kFileSize);
  close(a);
  close(b);
  close(c);
  Say("done");
}

// `count` appends of 4 KiB to DIR/appends (made empty first), the i-th
// of the letter 'a' + i % 26, each written directly; the file stays open
// until the process ends (test_direct_write.cpp counts its requests).
void Appends(int count) {
  const int fd = open(Path("appends").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  Check(fd >= 0, "open appends");
  for (int i = 0; i < count; ++i) {
    PwriteAll(fd, std::string(4096, static_cast<char>('a' + i % 26)), off_t{4096} * i, "append");
  }
  Say("done");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: direct_probe SCENARIO DIR [ARG...]\n");
    return 2;
  }
  const std::string scenario = argv[1];
  g_dir = argv[2];
  Check(Why(0) != -100, "libnvfs-direct is not preloaded");
  if (scenario == "reuse") {
    Reuse();
  } else if (scenario == "fork") {
    Fork();
  } else if (scenario == "exec") {
    Exec(argv[0]);
  } else if (scenario == "exec-child" && argc > 3) {
    ExecChild(std::atoi(argv[3]));
  } else if (scenario == "odirect") {
    Direct();
  } else if (scenario == "dontcache") {
    DontCache();
  } else if (scenario == "threads") {
    Threads();
  } else if (scenario == "sigbus") {
    OwnSigbus();
  } else if (scenario == "drop") {
    Drop();
  } else if (scenario == "forkmaps") {
    ForkMaps();
  } else if (scenario == "writes") {
    Writes();
  } else if (scenario == "full") {
    Full();
  } else if (scenario == "appends" && argc > 3) {
    Appends(std::atoi(argv[3]));
  } else if (scenario == "reader" && argc > 4) {
    Reader(argv[3], std::atof(argv[4]));
  } else {
    std::fprintf(stderr, "direct_probe: unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  return 0;
}
