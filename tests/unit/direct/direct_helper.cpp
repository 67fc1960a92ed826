// The other process of tests/unit/direct/test_direct_client.cpp: run (mostly with
// LD_PRELOAD=libnvfs-direct.so) against the fake daemon, it does what an
// unmodified program does with descriptors and checks which bytes its
// preads get. Files hold one byte value throughout: a lowercase letter in
// the file itself (what the kernel returns), the uppercase one in the
// namespace (what a direct read returns).
//
//   direct_helper SCENARIO ARGS...   exit 0: as expected; else a message
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "nvfs/direct.h"
#include "util/races.hpp"

namespace {

constexpr size_t kLen = 4096;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "direct_helper: %s\n", what.c_str());
  std::exit(1);
}

// pread of kLen bytes at 4096 must return kLen bytes all `want`.
void Expect(int fd, char want, const char* what) {
  alignas(4096) static char buf[kLen];
  std::memset(buf, 0, sizeof buf);
  const ssize_t n = pread(fd, buf, kLen, 4096);
  if (n != static_cast<ssize_t>(kLen)) {
    Fail(std::string(what) + ": pread returned " + std::to_string(n) + " (" + std::strerror(errno) + ")");
  }
  for (size_t i = 0; i < kLen; ++i) {
    if (buf[i] != want) {
      Fail(std::string(what) + ": byte " + std::to_string(i) + " is '" + buf[i] + "', want '" + want + "'");
    }
  }
}

int Open(const char* path, int flags = O_RDONLY) {
  const int fd = open(path, flags);
  if (fd < 0) Fail(std::string("open ") + path + ": " + std::strerror(errno));
  return fd;
}

char C(const char* arg) { return arg[0]; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Fail("no scenario");
  const std::string s = argv[1];
  auto need = [&](int n) {
    if (argc != n + 2) Fail(s + ": wants " + std::to_string(n) + " arguments");
  };
  if (s == "inherited") {  // FD WANT
    need(2);
    Expect(std::atoi(argv[2]), C(argv[3]), "inherited descriptor");
  } else if (s == "reuse" || s == "fclose" || s == "close_range") {  // A A_WANT B B_WANT
    need(4);
    int fd;
    FILE* f = nullptr;
    if (s == "fclose") {
      f = fopen(argv[2], "r");
      if (f == nullptr) Fail("fopen");
      fd = fileno(f);
    } else {
      fd = Open(argv[2]);
    }
    Expect(fd, C(argv[3]), "first file");
    if (s == "fclose") {
      fclose(f);
    } else if (s == "close_range") {
      close_range(static_cast<unsigned>(fd), static_cast<unsigned>(fd), 0);
    } else {
      close(fd);
    }
    const int again = Open(argv[4]);
    if (again != fd) Fail("the number was not reused");
    Expect(again, C(argv[5]), "second file at the same number");
  } else if (s == "dup2") {  // A A_WANT B B_WANT
    need(4);
    const int a = Open(argv[2]);
    Expect(a, C(argv[3]), "first file");
    const int b = Open(argv[4]);
    if (dup2(b, a) != a) Fail("dup2");
    Expect(a, C(argv[5]), "second file dup2'ed over the first");
    close(b);
    Expect(a, C(argv[5]), "second file after its other descriptor closed");
  } else if (s == "odirect") {  // A A_WANT A_KERNEL
    need(3);
    const int fd = Open(argv[2]);
    Expect(fd, C(argv[3]), "before O_DIRECT");
    if (fcntl(fd, F_SETFL, O_DIRECT) != 0) Fail("F_SETFL O_DIRECT");
    Expect(fd, C(argv[4]), "after F_SETFL O_DIRECT");
    if (fcntl(fd, F_SETFL, 0) != 0) Fail("F_SETFL 0");
    Expect(fd, C(argv[3]), "after O_DIRECT is cleared");
  } else if (s == "preadv") {  // A A_WANT A_KERNEL
    need(3);
    const int fd = Open(argv[2]);
    std::vector<char> a(1000), b(kLen - 1000);
    const iovec iov[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
    auto check = [&](ssize_t n, char want, const char* what) {
      if (n != static_cast<ssize_t>(kLen)) Fail(std::string(what) + ": short");
      for (char c : a) {
        if (c != want) Fail(std::string(what) + ": wrong bytes in the first iovec");
      }
      for (char c : b) {
        if (c != want) Fail(std::string(what) + ": wrong bytes in the second iovec");
      }
    };
    check(preadv(fd, iov, 2, 4096), C(argv[3]), "preadv");
    check(preadv2(fd, iov, 2, 4096, 0), C(argv[3]), "preadv2 flags 0");
    const ssize_t n = preadv2(fd, iov, 2, 4096, RWF_HIPRI);
    if (n >= 0) check(n, C(argv[4]), "preadv2 RWF_HIPRI");
  } else if (s == "pipe") {
    need(0);
    int p[2];
    if (pipe(p) != 0) Fail("pipe");
    char c;
    if (pread(p[0], &c, 1, 0) != -1 || errno != ESPIPE) Fail("pread of a pipe is not ESPIPE");
  } else if (s == "wronly") {  // A
    need(1);
    const int fd = Open(argv[2], O_WRONLY);
    char c;
    if (pread(fd, &c, 1, 0) != -1 || errno != EBADF) Fail("pread of O_WRONLY is not EBADF");
  } else if (s == "fork") {  // A A_WANT
    need(2);
    const int fd = Open(argv[2]);
    Expect(fd, C(argv[3]), "parent before fork");
    const pid_t pid = fork();
    if (pid == 0) {
      Expect(fd, C(argv[3]), "child");
      _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      Fail("the child failed");
    }
    Expect(fd, C(argv[3]), "parent after fork");
  } else if (s == "churn") {  // A A_WANT B B_WANT: dup2 over a number other threads read
    need(4);
    const int a = Open(argv[2]);
    const int b = Open(argv[4]);
    const int target = dup(a);
    // The session first: its socket is made when the first read needs it.
    Expect(target, C(argv[3]), "before the churn");
    std::atomic<bool> stop{false};
    std::atomic<long> bad{0}, reads{0}, direct{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t) {
      readers.emplace_back([&] {
        std::vector<char> buf(kLen);
        while (!stop.load(std::memory_order_relaxed)) {
          ssize_t n;
          {
            // The number is closed and reused under this read on purpose
            // (util/races.hpp): the detector's descriptor check is a load.
            [[maybe_unused]] const nvfs::RacingReads racing;
            n = pread(target, buf.data(), kLen, 4096);
          }
          reads++;
          if (n < 0 && errno == EBADF) continue;  // between a close and the open
          if (n > 0 && std::isupper(static_cast<unsigned char>(buf[0]))) direct++;
          // One file's bytes, whole (from the namespace or, while the
          // number is being classified anew, from the kernel): the number
          // names one file at a time.
          const char first = static_cast<char>(std::tolower(buf[0]));
          if (n != static_cast<ssize_t>(kLen) ||
              (first != std::tolower(C(argv[3])) && first != std::tolower(C(argv[5]))) ||
              std::count(buf.begin(), buf.end(), buf[0]) != static_cast<ptrdiff_t>(kLen)) {
            if (bad++ < 5) {
              std::fprintf(stderr, "wrong read: %zd bytes, first '%c', %ld of them\n", n, buf[0],
                           static_cast<long>(std::count(buf.begin(), buf.end(), buf[0])));
            }
          }
        }
      });
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    for (int i = 0; i < 4000 || (reads.load() < 20000 && std::chrono::steady_clock::now() < end); ++i) {
      if (dup2(i % 2 == 0 ? b : a, target) != target) Fail("dup2");
      if (i % 100 == 0) {
        // A close and an open that gets the number back, too.
        close(target);
        const int again = open(argv[i % 200 == 0 ? 4 : 2], O_RDONLY);
        if (again != target) Fail("the number was not reused");
      }
    }
    stop = true;
    for (auto& t : readers) t.join();
    std::fprintf(stderr, "churn: %ld reads, %ld of them direct\n", reads.load(), direct.load());
    if (bad.load() != 0) Fail(std::to_string(bad.load()) + " of " + std::to_string(reads.load()) + " reads were wrong");
    if (dup2(b, target) != target) Fail("dup2");
    Expect(target, C(argv[5]), "after the churn");
  } else if (s == "closefrom") {  // A A_WANT C: the program closes the library's socket too
    need(3);
    const int a = Open(argv[2]);
    Expect(a, C(argv[3]), "before closefrom");
    struct stat before;
    if (stat(argv[4], &before) != 0) Fail("stat");
    closefrom(3);
    // The numbers the library's socket had are the program's now: files
    // opened for writing, which a request sent on the old number would hit.
    std::vector<int> mine;
    for (int i = 0; i < 8; ++i) mine.push_back(Open(argv[4], O_RDWR));
    for (int at : {256, 257}) mine.push_back(fcntl(mine[0], F_DUPFD, at));  // where it keeps it
    const int again = Open(argv[2]);  // attached anew: a request to the daemon
    Expect(again, C(argv[3]), "after closefrom");
    struct stat after;
    if (stat(argv[4], &after) != 0) Fail("stat");
    if (after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
        after.st_mtim.tv_nsec != before.st_mtim.tv_nsec) {
      Fail("a file that took the socket's number was written");
    }
    for (int fd : mine) {
      struct stat st;
      if (fstat(fd, &st) != 0 || st.st_ino != before.st_ino) {
        Fail("the library closed a descriptor that took its socket's number");
      }
    }
    Expect(mine[0], 'c', "the other file");
  } else if (s == "attach") {  // A WHY WANT: through the C API
    need(3);
    const int fd = Open(argv[2]);
    nvfs_direct* f = nvfs_direct_attach(fd);
    if (f == nullptr) Fail("attach: no memory");
    if (nvfs_direct_why(f) != std::atoi(argv[3])) {
      Fail(std::string("why is ") + std::to_string(nvfs_direct_why(f)) + ": " +
           nvfs_direct_strwhy(nvfs_direct_why(f)));
    }
    std::vector<char> buf(kLen);
    if (nvfs_direct_pread(f, buf.data(), kLen, 4096) != static_cast<ssize_t>(kLen)) Fail("pread");
    for (char c : buf) {
      if (c != C(argv[4])) Fail("attach: wrong bytes");
    }
    nvfs_direct_detach(f);
  } else {
    Fail("unknown scenario " + s);
  }
  return 0;
}
