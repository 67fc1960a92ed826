// Credentials are part of the proof (credentials.hpp), and the calls that
// change them, interposed: each takes the sessions' mappings out of the
// process before it lets libc make the change. They are interposed whether
// the library was preloaded or linked: a program that attached files
// through the C API holds the same mappings.
#include "direct/credentials.hpp"

#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <stdarg.h>
#include <string.h>
#include <sys/fsuid.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <linux/sched.h>

#include <cstdlib>

#include "direct/epoch.hpp"
#include "direct/export.hpp"
#include "direct/fd_table.hpp"
#include "direct/libc.hpp"
#include "direct/map.hpp"
#include "direct/proof_fds.hpp"
#include "direct/session.hpp"

namespace nvfs::direct {

namespace {

// Three per session (its namespace, its table and its writers' page), and
// a writers' page of an earlier mount or of a fork's parent, which stays
// registered while it stays mapped.
constexpr int kMaxRevocable = 4 * 64;
Revocable ranges[kMaxRevocable];

// Changes of credentials under way, and their generation (credentials.hpp).
std::atomic<uint32_t> changing{0};
std::atomic<uint64_t> generation{0};

// Changes walking `ranges` right now: a range is given back to its owner
// (which may unmap it, and the kernel give the addresses to someone else)
// only when none is, so that no walk maps zeros over what is no longer
// the library's.
std::atomic<uint32_t> walking{0};

[[noreturn]] void Die(const char* what) {
  const int err = errno;
  const char* prefix = "libnvfs-direct: ";
  (void)!write(2, prefix, strlen(prefix));
  (void)!write(2, what, strlen(what));
  const char* reason = strerror(err);  // glibc's table: no allocation
  (void)!write(2, ": ", 2);
  (void)!write(2, reason, strlen(reason));
  (void)!write(2, "\n", 1);
  abort();
}

// Private and writable: a direct write's store that a signal handler on its
// own thread interrupted to change credentials lands in the zeros, not in
// the namespace, and the writer, finding the revocation counter moved,
// writes again through the kernel (write.cpp); other threads' stores are
// waited out before the zeros come (RevokeAll).
void Zero(uintptr_t base, uint64_t size) {
  void* p = libc::Mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE,
                 MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) Die("cannot take the namespace out of the process before a change of credentials");
}

// Maps zeros over every registered range. Every change does it again, even
// over zeros already there: a walk that skipped a range marked revoked
// could miss one a session is mapping again at that very moment (the
// session then finds the change itself, CredentialsUnchangedSince, but
// only once it has cleared the mark).
void RevokeAll(bool other_threads) {
  walking.fetch_add(1, std::memory_order_seq_cst);
  // The marks before the zeros: a reader that copied zeros finds them.
  for (Revocable& r : ranges) {
    if (r.base.load(std::memory_order_seq_cst) == 0) continue;
    r.revocations.fetch_add(1, std::memory_order_seq_cst);
    r.revoked.store(true, std::memory_order_seq_cst);
  }
  // A direct write of another thread that passed its check before the
  // marks ends its store before the zeros come (write.cpp): no store is
  // lost in them. (A fork's child has no other thread.)
  if (other_threads) WritersWaitOutOthers();
  for (Revocable& r : ranges) {
    const uintptr_t base = r.base.load(std::memory_order_seq_cst);
    if (base == 0) continue;
    Zero(base, r.size.load(std::memory_order_acquire));
  }
  walking.fetch_sub(1, std::memory_order_seq_cst);
}

bool RegisteredFile(uint64_t dev, uint64_t ino) {
  for (Revocable& r : ranges) {
    if (r.base.load(std::memory_order_seq_cst) != 0 &&
        r.file_ino.load(std::memory_order_relaxed) == ino &&
        r.file_dev.load(std::memory_order_relaxed) == dev && ino != 0) {
      return true;
    }
  }
  return false;
}

// One mapping of a registered file that is not a registered range (a
// direct map, a private map's own pages, a map being made right now): its
// bytes copied into anonymous memory that takes its place in one mremap,
// so the process keeps what it could see and no page of the file.
void TakeOutVma(uintptr_t start, uintptr_t end, const char* perms) {
  const size_t len = end - start;
  const int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                   (perms[2] == 'x' ? PROT_EXEC : 0);
  void* at = reinterpret_cast<void*>(start);
  if ((prot & PROT_READ) != 0) {
    void* copy = libc::Mmap(nullptr, len, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (copy != MAP_FAILED) {
      memcpy(copy, at, len);
      if ((prot == (PROT_READ | PROT_WRITE) || mprotect(copy, len, prot) == 0) &&
          libc::Get(&libc::Table::mremap)(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, at) == at) {
        return;
      }
      libc::Munmap(copy, len);
    }
  }
  // Not readable (or no memory for the copy): nothing of it is kept.
  if (libc::Mmap(at, len, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                 0) == MAP_FAILED) {
    Die("cannot take a map of the namespace out of the process before a change of credentials");
  }
}

uint64_t Hex(const char*& p, const char* end) {
  uint64_t v = 0;
  for (; p < end; ++p) {
    const char c = *p;
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) break;
    v = v * 16 + static_cast<uint64_t>(d);
  }
  return v;
}

// Takes every mapping of a registered file out of the process, as the
// kernel lists them (/proc/self/maps: read with plain system calls, no
// allocation, async-signal-safe). A line is `start-end perms offset
// major:minor inode path`.
void TakeOutFileMaps() {
  const int fd = libc::Get(&libc::Table::open)("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("cannot read /proc/self/maps before a change of credentials");
  char buf[8192];
  size_t have = 0;
  for (;;) {
    const ssize_t n = read(fd, buf + have, sizeof buf - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
    const char* line = buf;
    const char* stop = buf + have;
    for (;;) {
      const char* nl = static_cast<const char*>(memchr(line, '\n', stop - line));
      if (nl == nullptr) break;
      const char* p = line;
      const uint64_t start = Hex(p, nl);
      ++p;  // '-'
      const uint64_t end = Hex(p, nl);
      char perms[5] = {};
      if (p + 6 < nl) memcpy(perms, p + 1, 4);
      p += 6;
      Hex(p, nl);  // offset
      ++p;
      const uint64_t major = Hex(p, nl);
      ++p;  // ':'
      const uint64_t minor = Hex(p, nl);
      ++p;
      uint64_t ino = 0;
      for (; p < nl && *p >= '0' && *p <= '9'; ++p) ino = ino * 10 + static_cast<uint64_t>(*p - '0');
      if (ino != 0 && end > start && RegisteredFile(makedev(major, minor), ino)) {
        TakeOutVma(start, end, perms);
      }
      line = nl + 1;
    }
    have = static_cast<size_t>(stop - line);
    memmove(buf, line, have);
    if (have == sizeof buf) have = 0;  // a line longer than the buffer: a path, skipped
  }
  libc::Get(&libc::Table::close)(fd);
}

// Everything a proof gave, out of the process (CredentialChange).
void TakeOutAll(bool in_child) {
  RevokeAll(/*other_threads=*/!in_child);
  walking.fetch_add(1, std::memory_order_seq_cst);
  TakeOutFileMaps();
  walking.fetch_sub(1, std::memory_order_seq_cst);
  ProofFdsTakeOut(in_child);
}

void Begin() {
  changing.fetch_add(1, std::memory_order_seq_cst);
  generation.fetch_add(1, std::memory_order_seq_cst);
  TakeOutAll(/*in_child=*/false);
}

void End() {
  generation.fetch_add(1, std::memory_order_seq_cst);
  changing.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace

Revocable* RevocableRegister(const void* base, uint64_t size, int fd) {
  struct stat st {};
  if (fd >= 0 && fstat(fd, &st) != 0) return nullptr;
  for (Revocable& r : ranges) {
    bool expected = false;
    if (!r.claimed.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) continue;
    r.file_dev.store(fd >= 0 ? st.st_dev : 0, std::memory_order_relaxed);
    r.file_ino.store(fd >= 0 ? st.st_ino : 0, std::memory_order_relaxed);
    r.revoked.store(false, std::memory_order_relaxed);
    r.revocations.store(0, std::memory_order_relaxed);
    r.size.store(size, std::memory_order_release);
    // seq_cst: either a change that is walking sees the range, or the
    // registering session sees the change (CredentialsUnchangedSince).
    r.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_seq_cst);
    return &r;
  }
  return nullptr;
}

void RevocableUnregister(Revocable* r) {
  if (r == nullptr) return;
  r->base.store(0, std::memory_order_seq_cst);
  // A walk that loaded the base before the store may still map zeros over
  // the range: the owner unmaps it only after. Walks are a few system
  // calls long and never wait for anything.
  while (walking.load(std::memory_order_seq_cst) != 0) sched_yield();
  r->claimed.store(false, std::memory_order_release);
}

void RevocableZero(Revocable* r) {
  r->revocations.fetch_add(1, std::memory_order_seq_cst);
  r->revoked.store(true, std::memory_order_seq_cst);
  Zero(r->base.load(std::memory_order_acquire), r->size.load(std::memory_order_acquire));
}

uint64_t CredentialsGeneration() { return generation.load(std::memory_order_seq_cst); }

bool CredentialsChanging() { return changing.load(std::memory_order_seq_cst) != 0; }

bool CredentialsUnchangedSince(uint64_t g) {
  // Whether a change is under way first: one that began after this load
  // moves the generation before the load below, or walks the ranges after
  // the caller registered its own (seq_cst, both sides).
  const bool under_way = changing.load(std::memory_order_seq_cst) != 0;
  return !under_way && generation.load(std::memory_order_seq_cst) == g;
}

CredentialChange::CredentialChange(bool tidy) : tidy_(tidy) {
  const int saved = errno;
  // Direct maps end with the credentials that made them: the kernel's maps
  // of the same files from now on (what the kernel checked at their open).
  if (tidy_) MapsToKernel();
  Begin();
  // Closing the connections takes the library's locks, which a signal
  // handler that interrupted the library on this thread may hold; their
  // proof is over either way (the sessions find the generation moved).
  if (tidy_ && tls.depth == 0) SessionsDropConnections();
  errno = saved;
}

CredentialChange::~CredentialChange() {
  const int saved = errno;
  End();
  if (tidy_ && tls.depth == 0) FdForgetNotDirect();
  errno = saved;
}

void CredentialsChildAfterFork() {
  // A change the parent was making on another thread did not come along.
  changing.store(0, std::memory_order_relaxed);
  walking.store(0, std::memory_order_relaxed);
  generation.fetch_add(2, std::memory_order_seq_cst);
  // The sessions' and mappers' descriptors are closed by their own
  // handlers (session.cpp, map.cpp), which run first.
  RevokeAll(/*other_threads=*/false);
  TakeOutFileMaps();
}

}  // namespace nvfs::direct

using namespace nvfs::direct;

// --- the calls that change credentials ------------------------------------------
//
// Each is libc's, after the mappings are out. glibc makes a set*id change
// on every thread of the process; the mappings are the process's, so they
// go whatever the call's scope (setfsuid and setfsgid change only the
// calling thread). Not interposed: prctl (PR_SET_KEEPCAPS and
// PR_SET_SECUREBITS act through a later set*id call, which is; PR_CAPBSET_DROP
// and PR_CAP_AMBIENT through a later execve, which takes every mapping
// anyway), and execve itself.

NVFS_DIRECT_EXPORT int setuid(uid_t uid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setuid)(uid);
}

NVFS_DIRECT_EXPORT int seteuid(uid_t euid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::seteuid)(euid);
}

NVFS_DIRECT_EXPORT int setreuid(uid_t ruid, uid_t euid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setreuid)(ruid, euid);
}

NVFS_DIRECT_EXPORT int setresuid(uid_t ruid, uid_t euid, uid_t suid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setresuid)(ruid, euid, suid);
}

NVFS_DIRECT_EXPORT int setgid(gid_t gid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setgid)(gid);
}

NVFS_DIRECT_EXPORT int setegid(gid_t egid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setegid)(egid);
}

NVFS_DIRECT_EXPORT int setregid(gid_t rgid, gid_t egid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setregid)(rgid, egid);
}

NVFS_DIRECT_EXPORT int setresgid(gid_t rgid, gid_t egid, gid_t sgid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setresgid)(rgid, egid, sgid);
}

NVFS_DIRECT_EXPORT int setgroups(size_t count, const gid_t* groups) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setgroups)(count, groups);
}

// glibc's initgroups calls its own setgroups, which no interposition sees.
NVFS_DIRECT_EXPORT int initgroups(const char* user, gid_t group) {
  CredentialChange change(true);
  return libc::Get(&libc::Table::initgroups)(user, group);
}

NVFS_DIRECT_EXPORT int setfsuid(uid_t fsuid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setfsuid)(fsuid);
}

NVFS_DIRECT_EXPORT int setfsgid(gid_t fsgid) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::setfsgid)(fsgid);
}

// No glibc header declares it (libcap's <sys/capability.h> does, with
// cap_user_header_t and cap_user_data_t: pointers, as here).
NVFS_DIRECT_EXPORT int capset(void* header, void* data) noexcept {
  CredentialChange change(true);
  return libc::Get(&libc::Table::capset)(header, data);
}

// A new user namespace: the process's capabilities no longer reach the
// namespace's file.
NVFS_DIRECT_EXPORT int unshare(int flags) noexcept {
  if ((flags & CLONE_NEWUSER) == 0) return libc::Get(&libc::Table::unshare)(flags);
  CredentialChange change(true);
  return libc::Get(&libc::Table::unshare)(flags);
}

// nstype 0 may name a user namespace too.
NVFS_DIRECT_EXPORT int setns(int fd, int nstype) noexcept {
  if (nstype != 0 && (nstype & CLONE_NEWUSER) == 0) return libc::Get(&libc::Table::setns)(fd, nstype);
  CredentialChange change(true);
  return libc::Get(&libc::Table::setns)(fd, nstype);
}

namespace {

bool ChangesCredentials(long number, long arg0, long arg1) {
  switch (number) {
    case SYS_setuid: case SYS_setgid: case SYS_setreuid: case SYS_setregid:
    case SYS_setresuid: case SYS_setresgid: case SYS_setgroups:
    case SYS_setfsuid: case SYS_setfsgid: case SYS_capset:
#ifdef SYS_setuid32
    case SYS_setuid32: case SYS_setgid32: case SYS_setreuid32: case SYS_setregid32:
    case SYS_setresuid32: case SYS_setresgid32: case SYS_setgroups32:
    case SYS_setfsuid32: case SYS_setfsgid32:
#endif
      return true;
    case SYS_unshare:
    case SYS_clone:  // x86-64: flags first
      return (arg0 & CLONE_NEWUSER) != 0;
    case SYS_clone3: {
      // struct clone_args: flags first. A child in a new user namespace
      // has other credentials and the parent's memory: everything is taken
      // out before, here, and the parent proves itself again.
      if (arg0 == 0 || static_cast<unsigned long>(arg1) < sizeof(uint64_t)) return false;
      uint64_t flags;
      memcpy(&flags, reinterpret_cast<const void*>(arg0), sizeof flags);
      return (flags & CLONE_NEWUSER) != 0;
    }
    case SYS_setns:
      return arg1 == 0 || (arg1 & CLONE_NEWUSER) != 0;
    default:
      return false;
  }
}

}  // namespace

// The same system calls made through syscall(3) (libcap's and libpsx's
// way, and programs' own), and clone/clone3 of a child in a new user
// namespace. Everything a proof gave is taken out, as for the libc calls;
// a thread inside the library (a signal handler that interrupted it: libpsx
// makes the call from one on every thread) may hold its locks, so there the
// direct maps are copied instead of handed to the kernel (credentials.hpp).
// As glibc's own syscall(), six arguments are passed on whatever the call
// takes.
NVFS_DIRECT_EXPORT long syscall(long number, ...) noexcept {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& v : a) v = va_arg(ap, long);
  va_end(ap);
  auto* real = libc::Get(&libc::Table::syscall);
  if (!ChangesCredentials(number, a[0], a[1])) return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
  CredentialChange change(/*tidy=*/tls.depth == 0);
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

// glibc's clone(): a child in a new user namespace (above).
NVFS_DIRECT_EXPORT int clone(int (*fn)(void*), void* stack, int flags, void* arg, ...) noexcept {
  va_list ap;
  va_start(ap, arg);
  void* parent_tid = va_arg(ap, void*);
  void* tls_arg = va_arg(ap, void*);
  void* child_tid = va_arg(ap, void*);
  va_end(ap);
  auto* real = libc::Get(&libc::Table::clone);
  if ((flags & CLONE_NEWUSER) == 0) return real(fn, stack, flags, arg, parent_tid, tls_arg, child_tid);
  CredentialChange change(/*tidy=*/tls.depth == 0);
  return real(fn, stack, flags, arg, parent_tid, tls_arg, child_tid);
}
