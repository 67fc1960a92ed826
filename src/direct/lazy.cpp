#include "direct/lazy.hpp"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "direct/file.hpp"
#include "direct/libc.hpp"

// Debian 12's kernel headers (6.1) predate these (Linux 6.4).
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

namespace nvfs::direct {

namespace {

constexpr uint64_t kPage = 4096;

std::mutex mu;
// -2: not tried yet; -1: none to be had; else the userfaultfd.
std::atomic<int> uffd{-2};
LazyResolver resolve = nullptr;  // protected by mu (written once per fd)


int Make() {
  // Full mode needs CAP_SYS_PTRACE (or vm.unprivileged_userfaultfd).
  int fd = static_cast<int>(libc::Get(&libc::Table::syscall)(SYS_userfaultfd, O_CLOEXEC));
  if (fd < 0) fd = static_cast<int>(
        libc::Get(&libc::Table::syscall)(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
  if (fd < 0) return -1;
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_WP_UNPOPULATED;
  if (ioctl(fd, UFFDIO_API, &api) != 0 || (api.features & UFFD_FEATURE_WP_UNPOPULATED) == 0 ||
      (api.ioctls & (uint64_t{1} << _UFFDIO_REGISTER)) == 0) {
    libc::Get(&libc::Table::close)(fd);
    return -1;
  }
  return fd;
}

void* Resolve(void* arg) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  DepthGuard depth;  // its calls are the library's own
  for (;;) {
    uffd_msg msgs[16];
    // (The syscall: the library may come to serve read(2) itself.)
    const ssize_t n = libc::Get(&libc::Table::syscall)(SYS_read, fd, msgs, sizeof msgs);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return nullptr;  // closed (a child of fork) or broken
    }
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(uffd_msg); ++i) {
      if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
      const uintptr_t page = msgs[i].arg.pagefault.address & ~(kPage - 1);
      LazyResolver r;
      {
        std::lock_guard lock(mu);
        r = resolve;
      }
      if (r != nullptr) {
        r(page);
      } else {
        LazyWake(page, kPage);
      }
    }
  }
}

}  // namespace

bool LazyAvailable(LazyResolver resolver) {
  const int now = uffd.load(std::memory_order_acquire);
  if (now != -2) return now >= 0;
  std::lock_guard lock(mu);
  if (uffd.load(std::memory_order_relaxed) != -2) return uffd.load(std::memory_order_relaxed) >= 0;
  int fd = Make();
  if (fd >= 0) {
    resolve = resolver;
    // The resolver blocks every signal: the program's handlers run on its
    // own threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    const int err = pthread_create(&thread, nullptr, Resolve, reinterpret_cast<void*>(intptr_t{fd}));
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (err == 0) {
      pthread_detach(thread);
    } else {
      libc::Get(&libc::Table::close)(fd);
      fd = -1;
    }
  }
  uffd.store(fd, std::memory_order_release);
  return fd >= 0;
}

bool LazyProtect(uintptr_t at, uint64_t len) {
  const int fd = uffd.load(std::memory_order_acquire);
  if (fd < 0) return false;
  uffdio_register reg{};
  reg.range = {at, len};
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  if (ioctl(fd, UFFDIO_REGISTER, &reg) != 0) return false;
  // Marks the unpopulated pages too (UFFD_FEATURE_WP_UNPOPULATED).
  uffdio_writeprotect wp{};
  wp.range = {at, len};
  wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
  return ioctl(fd, UFFDIO_WRITEPROTECT, &wp) == 0;
}

void LazyWake(uintptr_t at, uint64_t len) {
  const int fd = uffd.load(std::memory_order_acquire);
  if (fd < 0) return;
  uffdio_range range{at, len};
  (void)ioctl(fd, UFFDIO_WAKE, &range);
}

void LazyChildAfterFork() {
  const int fd = uffd.load(std::memory_order_relaxed);
  if (fd >= 0) libc::Get(&libc::Table::close)(fd);
  new (&mu) std::mutex;  // its holder (a thread of the parent) is not here
  resolve = nullptr;
  uffd.store(-2, std::memory_order_relaxed);
}

}  // namespace nvfs::direct
