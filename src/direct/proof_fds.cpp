// The registry of the descriptors a proof gave the library (proof_fds.hpp).
#include "direct/proof_fds.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "direct/libc.hpp"

namespace nvfs::direct {

namespace {

// Two per mount a process uses (its session's connection; its mapper's
// connection and namespace), for the 64 mounts a process may use.
constexpr int kMaxProofFds = 3 * 64;

struct Entry {
  std::atomic<int> fd{-1};  // -1: free
  std::atomic<bool> stolen{false};
  std::atomic<bool> socket{false};
  std::atomic<uint64_t> dev{0};
  std::atomic<uint64_t> ino{0};
};
Entry entries[kMaxProofFds];
std::atomic<int> used{0};

// Take-outs walking the entries right now: a slot is given back to its owner
// (which then closes the number, and the kernel may give it to another
// open) only when none is.
std::atomic<uint32_t> walking{0};
std::atomic<unsigned long> taken_out{0};

// What a descriptor taken out names: /dev/null, opened once.
std::atomic<int> stand_in{-1};
uint64_t stand_in_dev = 0;
uint64_t stand_in_ino = 0;

bool EnsureStandIn() {
  if (stand_in.load(std::memory_order_acquire) >= 0) return true;
  const int fd = libc::Get(&libc::Table::open)("/dev/null", O_RDWR | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
    libc::Get(&libc::Table::close)(fd);
    return false;
  }
  int expected = -1;
  stand_in_dev = st.st_dev;
  stand_in_ino = st.st_ino;
  if (!stand_in.compare_exchange_strong(expected, fd, std::memory_order_acq_rel)) {
    libc::Get(&libc::Table::close)(fd);  // another thread's is there
  }
  return true;
}

bool Same(int fd, uint64_t dev, uint64_t ino) {
  struct stat st {};
  return fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_dev) == dev &&
         static_cast<uint64_t>(st.st_ino) == ino;
}

}  // namespace

int ProofFdAdd(int fd) {
  struct stat st {};
  if (fd < 0 || !EnsureStandIn() || fstat(fd, &st) != 0) return -1;
  for (int i = 0; i < kMaxProofFds; ++i) {
    Entry& e = entries[i];
    int expected = -1;
    // Claimed with a placeholder while the entry is filled in.
    if (!e.fd.compare_exchange_strong(expected, -2, std::memory_order_acq_rel)) continue;
    e.stolen.store(false, std::memory_order_relaxed);
    e.socket.store(S_ISSOCK(st.st_mode), std::memory_order_relaxed);
    e.dev.store(st.st_dev, std::memory_order_relaxed);
    e.ino.store(st.st_ino, std::memory_order_relaxed);
    used.fetch_add(1, std::memory_order_relaxed);
    // seq_cst: a take-out that walks after this sees the descriptor; the
    // owner checks for a change that walked before (CredentialsUnchangedSince).
    e.fd.store(fd, std::memory_order_seq_cst);
    return i;
  }
  return -1;
}

bool ProofFdStolen(int slot) {
  return slot >= 0 && entries[slot].stolen.load(std::memory_order_acquire);
}

void ProofFdMarkStolen(int slot) {
  if (slot >= 0) entries[slot].stolen.store(true, std::memory_order_release);
}

bool ProofFdRemove(int slot) {
  if (slot < 0) return true;
  Entry& e = entries[slot];
  const bool ours = !e.stolen.load(std::memory_order_acquire);
  e.fd.store(-2, std::memory_order_seq_cst);
  // A take-out that loaded the number before the store may still point it
  // at /dev/null: the owner closes it only after (a walk is a few system
  // calls long and waits for nothing).
  while (walking.load(std::memory_order_seq_cst) != 0) sched_yield();
  e.stolen.store(false, std::memory_order_relaxed);
  used.fetch_sub(1, std::memory_order_relaxed);
  e.fd.store(-1, std::memory_order_release);
  return ours;
}

void ProofFdsNoteClosed(unsigned first, unsigned last) {
  if (used.load(std::memory_order_relaxed) == 0) return;
  for (Entry& e : entries) {
    const int fd = e.fd.load(std::memory_order_acquire);
    if (fd >= 0 && static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last) {
      e.stolen.store(true, std::memory_order_release);
    }
  }
}

void ProofFdsTakeOut(bool in_child) {
  if (used.load(std::memory_order_seq_cst) == 0) return;
  walking.fetch_add(1, std::memory_order_seq_cst);
  const int saved = errno;
  const int null_fd = stand_in.load(std::memory_order_acquire);
  const bool null_ok = null_fd >= 0 && Same(null_fd, stand_in_dev, stand_in_ino);
  for (Entry& e : entries) {
    const int fd = e.fd.load(std::memory_order_seq_cst);
    if (fd < 0 || e.stolen.load(std::memory_order_acquire)) continue;
    // Still the descriptor registered (and not one taken out already).
    if (!Same(fd, e.dev.load(std::memory_order_relaxed), e.ino.load(std::memory_order_relaxed))) {
      continue;
    }
    if (!in_child && e.socket.load(std::memory_order_relaxed)) shutdown(fd, SHUT_RDWR);
    if (null_ok && dup3(null_fd, fd, O_CLOEXEC) == fd) {
      taken_out.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // No stand-in (the program closed it): the number is freed, and never
    // closed again by its owner.
    e.stolen.store(true, std::memory_order_release);
    libc::Get(&libc::Table::close)(fd);
    taken_out.fetch_add(1, std::memory_order_relaxed);
  }
  errno = saved;
  walking.fetch_sub(1, std::memory_order_seq_cst);
}

void ProofFdsChildAfterFork() { walking.store(0, std::memory_order_relaxed); }

unsigned long ProofFdsTakenOut() { return taken_out.load(std::memory_order_relaxed); }

}  // namespace nvfs::direct
