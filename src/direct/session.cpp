#include "direct/session.hpp"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <new>

#include "direct/epoch.hpp"
#include "direct/libc.hpp"
#include "direct/proof_fds.hpp"
#include "direct/transport.hpp"
#include "nvfs/direct.h"
#include "nvfs/format.hpp"
#include "nvfs/paths.hpp"

namespace nvfs::direct {

const uint64_t Session::kMountCountOffset =
    format::kSuperDynamicOffset + offsetof(format::SuperDynamic, mount_count);
const uint64_t Session::kUuidOffset = format::kSuperStaticOffset + offsetof(format::SuperStatic, uuid);

namespace {

// How long a mount that served no session is left alone (unless its socket
// is made anew).
constexpr int64_t kRetrySeconds = 10;

constexpr int kMaxSessions = 64;
std::mutex registry_mu;
Session* registry[kMaxSessions];  // protected by registry_mu; the usable sessions by mount
Session* all_sessions = nullptr;  // protected by registry_mu; listed or not, until freed

int64_t NowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec;
}

void CloseFd(int fd) {
  if (fd >= 0) libc::Get(&libc::Table::close)(fd);
}

}  // namespace

const char* SocketDir() {
  const char* dir = secure_getenv("NVFS_DIRECT_SOCKET_DIR");
  return dir != nullptr && dir[0] != '\0' ? dir : kSocketDir;
}

// Only root can put a socket in the directory (or, in tests, this user).
bool SocketDirTrusted(const char* dir) {
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) return false;
  return st.st_uid == 0 || (TestMode() && st.st_uid == geteuid());
}

// A read of a word of a fresh mapping, inside the fault handler's reach.
static uint64_t GuardedWord(const std::byte* base, uint64_t offset) {
  tls.in_copy++;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const uint64_t v = __atomic_load_n(reinterpret_cast<const uint64_t*>(base + offset), __ATOMIC_RELAXED);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tls.in_copy--;
  return v;
}

// Virtual address space kept after a namespace's mapping, so that a grow
// while mounted is mapped in place: the base never moves under a reader.
constexpr uint64_t kGrowRoom = uint64_t{64} << 30;

// mountinfo writes space, tab, newline and backslash as \ooo; in place.
static void UnescapeMountField(char* field) {
  char* out = field;
  for (const char* in = field; *in != '\0'; ++in) {
    if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' &&
        in[3] >= '0' && in[3] <= '7') {
      *out++ = static_cast<char>((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
      in += 3;
    } else {
      *out++ = *in;
    }
  }
  *out = '\0';
}

// The source of the mount whose device is `dev`, from one line of
// mountinfo ("ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [TAGS...] - TYPE
// SOURCE SUPER"): what its daemon, root, mounted it from (the namespace's
// absolute path). Found by the device number, which the kernel gave the
// mount, so no user's mount can stand in for it.
static bool SourceOfLine(char* line, dev_t dev, char* out, size_t size) {
  unsigned maj = 0, min = 0;
  if (std::sscanf(line, "%*u %*u %u:%u", &maj, &min) != 2 || makedev(maj, min) != dev) return false;
  char* dash = std::strstr(line, " - ");
  if (dash == nullptr) return false;
  char* type = dash + 3;
  char* source = std::strchr(type, ' ');
  if (source == nullptr) return false;
  ++source;
  char* end = std::strchr(source, ' ');
  if (end != nullptr) *end = '\0';
  UnescapeMountField(source);
  if (source[0] != '/' || std::strlen(source) >= size) return false;
  std::strcpy(out, source);
  return true;
}

// In test mode (no mount): the source the test's daemon wrote beside its
// socket, SOCKET.source.
static bool TestSource(dev_t dev, char* out, size_t size) {
  char path[PATH_MAX];
  SocketPath(path, sizeof path - 8, dev, SocketDir());
  std::strcat(path, ".source");
  const int fd = libc::Get(&libc::Table::open)(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  const ssize_t n = read(fd, out, size - 1);
  CloseFd(fd);
  if (n <= 0) return false;
  out[n] = '\0';
  return out[0] == '/';
}

// The namespace the mount `dev` serves: its source in this process's
// /proc/self/mountinfo. Allocates nothing.
bool NamespacePath(dev_t dev, char* out, size_t size) {
  if (TestMode()) return TestSource(dev, out, size);
  const int fd = libc::Get(&libc::Table::open)("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[8192];
  size_t have = 0;
  bool found = false, skipping = false;  // skipping: the rest of a line longer than buf
  for (;;) {
    const ssize_t n = read(fd, buf + have, sizeof buf - 1 - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
    buf[have] = '\0';
    char* line = buf;
    for (char* nl; !found && (nl = std::strchr(line, '\n')) != nullptr; line = nl + 1) {
      *nl = '\0';
      if (!skipping) found = SourceOfLine(line, dev, out, size);
      skipping = false;
    }
    if (found) break;
    have = static_cast<size_t>(buf + have - line);
    if (have == sizeof buf - 1) {  // no newline in a full buffer
      have = 0;
      skipping = true;
    } else {
      std::memmove(buf, line, have);
    }
  }
  CloseFd(fd);
  return found;
}

// Opens the namespace at `path` for reading without following a symbolic
// link or blocking (a FIFO put at a moved image's path), and only if it is
// a regular file or a character device: -1 otherwise. Whether it is the
// very namespace the daemon serves, the proof tells.
int OpenNamespace(const char* path, struct stat* st, int access) {
  const int fd = libc::Get(&libc::Table::open)(
      path, access | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  if (fstat(fd, st) != 0 || !(S_ISREG(st->st_mode) || S_ISCHR(st->st_mode))) {
    CloseFd(fd);
    errno = EACCES;
    return -1;
  }
  return fd;
}


bool Session::GuardedIdentityHolds() const {
  tls.in_copy++;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const bool holds = IdentityHolds();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tls.in_copy--;
  return holds;
}

namespace {

int WhyOfConnectError(int err) {
  return err == ENOMEM || err == ENOBUFS ? NVFS_DIRECT_NO_MEMORY : NVFS_DIRECT_NO_SERVER;
}

int WhyOfDaemonError(int err) {
  switch (err) {
    case EPROTO: case EPROTONOSUPPORT: case EBADMSG: case ENOSYS: case EOPNOTSUPP:
      return NVFS_DIRECT_NO_SERVER;  // an older (or newer) daemon
    default:
      return NVFS_DIRECT_REFUSED;
  }
}

}  // namespace

bool TestMode() {
  const char* dir = secure_getenv("NVFS_DIRECT_SOCKET_DIR");
  return dir != nullptr && dir[0] != '\0';
}

Session::~Session() {
  {
    std::lock_guard lock(registry_mu);
    if (prev_ != nullptr) prev_->next_ = next_;
    if (next_ != nullptr) next_->prev_ = prev_;
    if (all_sessions == this) all_sessions = next_;
  }
  if (fault != nullptr) FaultUnregisterMapping(fault);
  RevocableUnregister(ns_range);
  RevocableUnregister(table_range_);
  if (writer_page_range_ != nullptr) {
    // Every store through the session is over (the epoch freed it): the
    // page goes as a change of credentials would take it.
    RevocableZero(writer_page_range_);
    RevocableUnregister(writer_page_range_);
  }
  if (ns_base != nullptr) libc::Munmap(const_cast<std::byte*>(ns_base), ns_reserved_);
  if (table != nullptr) libc::Munmap(const_cast<DirectSlot*>(table), table_bytes_);
  DropSocketLocked();
}

// Sessions whose last reference went, freed by the next SessionFor: a last
// reference may go inside a retire (epoch.hpp) that runs under another
// session's lock, and ~Session takes the registry's, which fork's handler
// takes before every session's (a lock-order inversion: a deadlock with a
// fork on another thread).
static std::atomic<Session*> dead_sessions{nullptr};

void Session::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Session* head = dead_sessions.load(std::memory_order_relaxed);
  do {
    dead_next_ = head;
  } while (!dead_sessions.compare_exchange_weak(head, this, std::memory_order_release,
                                                std::memory_order_relaxed));
}

void FreeDeadSessions() {
  Session* s = dead_sessions.exchange(nullptr, std::memory_order_acquire);
  while (s != nullptr) {
    Session* next = s->dead_next_;
    delete s;
    s = next;
  }
}

void Session::DropSocketLocked() {
  // A socket the program closed (or a change of credentials took out and
  // the program then freed) is not ours to close again.
  if (ProofFdRemove(proof_fd_)) CloseFd(sock_);
  proof_fd_ = -1;
  sock_ = -1;
}

int Session::ConnectLocked() {
  // Credentials are part of the proof: a connection that proved itself
  // before a change of credentials (or in the parent of a fork) is not
  // used again, and no proof is made while a change is under way. The
  // generation is read before anything is opened.
  const uint64_t generation = CredentialsGeneration();
  if (CredentialsChanging()) {
    DropSocketLocked();
    return NVFS_DIRECT_REFUSED;  // this time only: nothing is remembered
  }
  if (sock_ >= 0 && proved_generation_ != generation) DropSocketLocked();
  if (sock_ >= 0) {
    // Still our socket: a close the library did not see (a raw system
    // call) may have given its number to another descriptor, which a
    // request must not be written into, nor closed.
    struct stat st;
    if (!ProofFdStolen(proof_fd_) &&
        (fstat(sock_, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != sock_ino_ ||
         st.st_dev != sock_dev_)) {
      ProofFdMarkStolen(proof_fd_);
    }
    if (!ProofFdStolen(proof_fd_)) return NVFS_DIRECT_ACTIVE;
    DropSocketLocked();
  }
  const char* dir = SocketDir();
  char path[PATH_MAX];
  SocketPath(path, sizeof path, dev_, dir);

  // A mount that refused us lately is left alone unless its socket is new.
  struct stat sock_st {};
  const bool sock_exists = stat(path, &sock_st) == 0;
  if (why_ != NVFS_DIRECT_ACTIVE && why_generation_ == generation && NowSeconds() < retry_after_ &&
      (!sock_exists || (sock_st.st_ino == socket_ino_ && sock_st.st_mtime == socket_mtime_))) {
    return why_;
  }
  auto fail = [&](int why) {
    DropSocketLocked();
    // A session that served, which the process as it is now may not
    // read: its mappings go too.
    if (mapped_ && why == NVFS_DIRECT_NO_NAMESPACE) EndLocked();
    why_ = why;
    why_generation_ = generation;
    retry_after_ = NowSeconds() + kRetrySeconds;
    socket_ino_ = sock_exists ? sock_st.st_ino : 0;
    socket_mtime_ = sock_exists ? sock_st.st_mtime : 0;
    return why;
  };
  if (!sock_exists || !S_ISSOCK(sock_st.st_mode) || !SocketDirTrusted(dir)) {
    return fail(NVFS_DIRECT_NO_SERVER);
  }
  const uid_t peer = TestMode() ? geteuid() : 0;
  int sock = -1;
  int err = TransportConnect(path, peer, &sock);
  if (err != 0) return fail(WhyOfConnectError(err));
  sock_ = sock;
  struct stat sock_fd_st {};
  fstat(sock, &sock_fd_st);
  sock_dev_ = sock_fd_st.st_dev;
  sock_ino_ = sock_fd_st.st_ino;

  write_connection_ = false;
  Request req{kMagic, kVersion, kOpHello, 0, 0, 0, 0, 0};
  ReplyHeader hello{};
  err = TransportCall(sock_, req, -1, &hello, sizeof hello, sizeof hello, nullptr);
  if (err != 0 || hello.error != 0) {
    return fail(err != 0 ? NVFS_DIRECT_NO_SERVER : WhyOfDaemonError(hello.error));
  }
  char ns_path[PATH_MAX];
  if (!NamespacePath(dev_, ns_path, sizeof ns_path)) return fail(NVFS_DIRECT_NO_NAMESPACE);
  struct stat ns_st {};
  const int ns_fd = OpenNamespace(ns_path, &ns_st);
  if (ns_fd < 0) return fail(errno == ENOMEM ? NVFS_DIRECT_NO_MEMORY : NVFS_DIRECT_NO_NAMESPACE);

  // The descriptor is kept until the namespace is mapped from it: the
  // mapping is made from the very file the daemon checked.
  struct NsFd {
    int fd;
    ~NsFd() { CloseFd(fd); }
  } const ns{ns_fd};
  req.op = kOpProve;
  ProveReply prove{};
  int table_fd = -1;
  err = TransportCall(sock_, req, ns.fd, &prove, sizeof prove, sizeof prove, &table_fd);
  // EPERM: the daemon takes no descriptor from this process's user, who
  // could not open the namespace (protocol.hpp).
  if (err == EPERM) return fail(NVFS_DIRECT_NO_NAMESPACE);
  if (err != 0) return fail(NVFS_DIRECT_NO_SERVER);
  if (prove.h.error != 0) {
    return fail(prove.h.error == EACCES || prove.h.error == EPERM || prove.h.error == EBADF
                    ? NVFS_DIRECT_NO_NAMESPACE
                    : WhyOfDaemonError(prove.h.error));
  }
  struct stat table_st {};
  if (table_fd < 0 || fstat(table_fd, &table_st) != 0) {
    CloseFd(table_fd);
    return fail(NVFS_DIRECT_NO_SERVER);
  }
  uint64_t uuid[2];
  std::memcpy(uuid, prove.uuid, sizeof uuid);

  if (mapped_) {
    // A reconnect (after fork, a change of credentials, a timeout, a
    // stolen socket): the same namespace at the same mount, or the
    // session is over.
    if (prove.mount_count != mount_count || uuid[0] != uuid_words[0] || uuid[1] != uuid_words[1] ||
        prove.namespace_size < ns_size || static_cast<uint64_t>(ns_st.st_dev) != ns_dev_ ||
        static_cast<uint64_t>(ns_st.st_ino) != ns_ino_ ||
        static_cast<uint64_t>(ns_st.st_rdev) != ns_rdev_ ||
        static_cast<uint64_t>(table_st.st_dev) != table_dev_ ||
        static_cast<uint64_t>(table_st.st_ino) != table_ino_) {
      CloseFd(table_fd);
      gone.store(true, std::memory_order_release);
      return fail(NVFS_DIRECT_GONE);
    }
    if (Revoked()) {
      // Mapped again from what the process opened as it is now, at the
      // same addresses (the handles' snapshots point there).
      const bool remapped = RemapLocked(ns.fd, table_fd);
      CloseFd(table_fd);
      if (!remapped) return fail(NVFS_DIRECT_NO_MEMORY);
      if (!CredentialsUnchangedSince(generation)) {
        // A change began meanwhile, and may have walked past before the
        // mark was cleared: the zeros again, and a proof another time.
        RevocableZero(ns_range);
        RevocableZero(table_range_);
        DropSocketLocked();
        return NVFS_DIRECT_REFUSED;
      }
    } else {
      CloseFd(table_fd);
    }
    if (!GuardedIdentityHolds()) {
      if (Revoked()) {  // a change put its zeros there since
        DropSocketLocked();
        return NVFS_DIRECT_REFUSED;
      }
      gone.store(true, std::memory_order_release);
      return fail(NVFS_DIRECT_GONE);
    }
    if (prove.namespace_size > ns_size && !ExtendLocked(ns.fd, prove.namespace_size)) {
      gone.store(true, std::memory_order_release);  // a new session maps it whole
      return fail(NVFS_DIRECT_GONE);
    }
    if (!RegisterSocketLocked(generation)) return NVFS_DIRECT_REFUSED;
    proved_generation_ = generation;
    why_ = NVFS_DIRECT_ACTIVE;
    return NVFS_DIRECT_ACTIVE;
  }

  // The first connection: map the table and the namespace, and check the
  // namespace's identity in our own mapping against the daemon's word.
  const uint64_t need = format::kSuperDynamicOffset + format::kSuperHalfSize;
  const bool is_file = S_ISREG(ns_st.st_mode);
  if (prove.namespace_size < need ||
      (is_file && static_cast<uint64_t>(ns_st.st_size) < prove.namespace_size) ||
      prove.slot_count < 2 || prove.table_bytes != uint64_t{prove.slot_count} * sizeof(DirectSlot) ||
      static_cast<uint64_t>(table_st.st_size) < prove.table_bytes) {
    CloseFd(table_fd);
    return fail(NVFS_DIRECT_NO_SERVER);
  }
  void* t = libc::Mmap(nullptr, prove.table_bytes, PROT_READ, MAP_SHARED, table_fd, 0);
  CloseFd(table_fd);
  if (t == MAP_FAILED) return fail(NVFS_DIRECT_NO_MEMORY);
  const auto* header = static_cast<const DirectTableHeader*>(t);
  if (header->magic != kDirectTableMagic || header->version != kDirectTableVersion ||
      header->slot_count != prove.slot_count) {
    libc::Munmap(t, prove.table_bytes);
    return fail(NVFS_DIRECT_NO_SERVER);
  }
  // A file may grow while mounted: room is kept after it to map the rest
  // in place (ExtendLocked). A device keeps its size.
  const uint64_t reserve = is_file ? prove.namespace_size + kGrowRoom : prove.namespace_size;
  void* room = is_file ? libc::Mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                              -1, 0)
                       : nullptr;
  if (room == MAP_FAILED) {
    libc::Munmap(t, prove.table_bytes);
    return fail(NVFS_DIRECT_NO_MEMORY);
  }
  void* n = libc::Mmap(room, prove.namespace_size, PROT_READ, MAP_SHARED | (is_file ? MAP_FIXED : 0),
                 ns.fd, 0);
  if (n == MAP_FAILED) {
    if (room != nullptr) libc::Munmap(room, reserve);
    libc::Munmap(t, prove.table_bytes);
    return fail(errno == ENOMEM ? NVFS_DIRECT_NO_MEMORY : NVFS_DIRECT_NO_NAMESPACE);
  }
  FaultMapping* fm = FaultRegisterMapping(static_cast<std::byte*>(n), prove.namespace_size);
  Revocable* ns_r = RevocableRegister(n, prove.namespace_size, ns.fd);
  Revocable* table_r = RevocableRegister(t, prove.table_bytes, -1);
  auto undo = [&] {
    if (fm != nullptr) FaultUnregisterMapping(fm);
    RevocableUnregister(ns_r);
    RevocableUnregister(table_r);
    libc::Munmap(n, reserve);
    libc::Munmap(t, prove.table_bytes);
  };
  if (fm == nullptr || ns_r == nullptr || table_r == nullptr) {
    undo();
    return fail(NVFS_DIRECT_NO_MEMORY);
  }
  if (!CredentialsUnchangedSince(generation)) {
    // Proved as the process was before a change that may not have seen
    // these mappings: they go, and the next read proves it anew.
    undo();
    DropSocketLocked();
    return NVFS_DIRECT_REFUSED;
  }
  const auto* base = static_cast<const std::byte*>(n);
  const bool same = GuardedWord(base, kMountCountOffset) == prove.mount_count &&
                    GuardedWord(base, kUuidOffset) == uuid[0] &&
                    GuardedWord(base, kUuidOffset + 8) == uuid[1] &&
                    fm->poisoned.load(std::memory_order_acquire) == 0;
  if (!same) {
    // Mounted anew meanwhile (or a page of the superblock is lost, or a
    // change of credentials put zeros there since the check above).
    undo();
    return fail(NVFS_DIRECT_GONE);
  }
  EpochInit();  // before any reader can reach what the session serves
  ns_base = base;
  ns_size = prove.namespace_size;
  ns_reserved_ = reserve;
  table = static_cast<const DirectSlot*>(t);
  table_bytes_ = prove.table_bytes;
  slot_count = prove.slot_count;
  fault = fm;
  ns_range = ns_r;
  table_range_ = table_r;
  proved_generation_ = generation;
  mount_count = prove.mount_count;
  uuid_words[0] = uuid[0];
  uuid_words[1] = uuid[1];
  ns_dev_ = static_cast<uint64_t>(ns_st.st_dev);
  ns_ino_ = static_cast<uint64_t>(ns_st.st_ino);
  ns_rdev_ = static_cast<uint64_t>(ns_st.st_rdev);
  table_dev_ = static_cast<uint64_t>(table_st.st_dev);
  table_ino_ = static_cast<uint64_t>(table_st.st_ino);
  mapped_ = true;
  if (!RegisterSocketLocked(generation)) return NVFS_DIRECT_REFUSED;
  why_ = NVFS_DIRECT_ACTIVE;
  return NVFS_DIRECT_ACTIVE;
}

bool Session::RegisterSocketLocked(uint64_t generation) {
  // A proof is finished before its connection is registered (a change of
  // credentials while it is under way is seen here, and the prover holds
  // the session's lock, so the connection is dropped at once rather than
  // left for the next use); from now on a change takes it out of the
  // process, whatever thread makes it (proof_fds.hpp).
  proof_fd_ = ProofFdAdd(sock_);
  if (proof_fd_ >= 0 && CredentialsUnchangedSince(generation)) return true;
  DropSocketLocked();  // this time only: nothing is remembered
  return false;
}

bool Session::RemapLocked(int ns_fd, int table_fd) {
  // The counters move before the mappings come back: a reader that copied
  // zeros and then finds the namespace's identity in place again (these
  // mappings) finds its counter moved too, and copies again.
  ns_range->revocations.fetch_add(1, std::memory_order_seq_cst);
  table_range_->revocations.fetch_add(1, std::memory_order_seq_cst);
  // The mark is cleared after the mappings are back (seq_cst): a change
  // that walks the ranges after it puts zeros over them again, one that
  // walked before is seen by the caller's CredentialsUnchangedSince.
  void* t = libc::Mmap(const_cast<DirectSlot*>(table), table_bytes_, PROT_READ, MAP_SHARED | MAP_FIXED,
                 table_fd, 0);
  void* n = t == MAP_FAILED ? MAP_FAILED
                            : libc::Mmap(const_cast<std::byte*>(ns_base), ns_size, PROT_READ,
                                   MAP_SHARED | MAP_FIXED, ns_fd, 0);
  if (t == MAP_FAILED || n == MAP_FAILED) {
    // A failed MAP_FIXED may leave the range unmapped: zeros over both.
    RevocableZero(table_range_);
    RevocableZero(ns_range);
    return false;
  }
  // Read-only again: a proof for writing, as the process now is, maps it
  // writable when it next writes.
  writable.store(false, std::memory_order_seq_cst);
  table_range_->revoked.store(false, std::memory_order_seq_cst);
  ns_range->revoked.store(false, std::memory_order_seq_cst);
  return true;
}

namespace {
// Set once the process registered; cleared in a child of fork (whose new
// memory is not registered) until it registers again.
std::atomic<bool> writers_asymmetric{false};
}  // namespace

bool WritersAsymmetric() { return writers_asymmetric.load(std::memory_order_relaxed); }

int Session::EnsureWriterLocked() {
  if (writable.load(std::memory_order_acquire) && write_connection_ && !Revoked()) {
    return NVFS_DIRECT_ACTIVE;
  }
  return WriteProveLocked();
}

int Session::WriteProveLocked() {
  const uint64_t generation = CredentialsGeneration();
  if (write_why_ != NVFS_DIRECT_ACTIVE && write_why_generation_ == generation) return write_why_;
  auto fail = [&](int why) {
    write_why_ = why;
    write_why_generation_ = generation;
    return why;
  };
  const int why = ConnectLocked();
  if (why != NVFS_DIRECT_ACTIVE) return why;  // not remembered: the read side's
  if (Revoked()) return NVFS_DIRECT_REFUSED;
  char path[PATH_MAX];
  if (!NamespacePath(dev_, path, sizeof path)) return fail(NVFS_DIRECT_NO_WRITE_NAMESPACE);
  // As OpenNamespace, for reading and writing.
  const int rw = libc::Get(&libc::Table::open)(
      path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
  if (rw < 0) return fail(errno == ENOMEM ? NVFS_DIRECT_NO_MEMORY : NVFS_DIRECT_NO_WRITE_NAMESPACE);
  struct NsFd {
    int fd;
    ~NsFd() { CloseFd(fd); }
  } const ns{rw};
  struct stat st {};
  if (fstat(ns.fd, &st) != 0 || static_cast<uint64_t>(st.st_dev) != ns_dev_ ||
      static_cast<uint64_t>(st.st_ino) != ns_ino_ || static_cast<uint64_t>(st.st_rdev) != ns_rdev_) {
    return fail(NVFS_DIRECT_NO_WRITE_NAMESPACE);  // not the file mapped
  }
  const Request req{kMagic, kVersion, kOpWriteProve, 0, 0, 0, 0, 0};
  WriteProveReply reply{};
  int writers_fd = -1;
  const int err = TransportCall(sock_, req, ns.fd, &reply, sizeof reply, sizeof reply, &writers_fd);
  if (err != 0) {
    DropSocketLocked();
    return NVFS_DIRECT_REFUSED;  // this time only
  }
  if (reply.h.error != 0) {
    CloseFd(writers_fd);
    switch (reply.h.error) {
      case EROFS: case EOPNOTSUPP: case EPROTO: return fail(NVFS_DIRECT_NO_WRITES);
      case EACCES: case EPERM: case EBADF: return fail(NVFS_DIRECT_NO_WRITE_NAMESPACE);
      default: return fail(NVFS_DIRECT_REFUSED);
    }
  }
  struct stat wst {};
  if (writers_fd < 0 || fstat(writers_fd, &wst) != 0 || !S_ISREG(wst.st_mode) ||
      reply.page_offset % sizeof(DirectWriterPage) != 0 || reply.page_offset == 0 ||
      reply.page_offset + sizeof(DirectWriterPage) > static_cast<uint64_t>(wst.st_size) ||
      reply.flush > kDirectFlushPage) {
    CloseFd(writers_fd);
    DropSocketLocked();
    return fail(NVFS_DIRECT_NO_WRITES);
  }
  struct WritersFd {
    int fd;
    ~WritersFd() { CloseFd(fd); }
  } const writers{writers_fd};
  const bool same_page = writer_page.load(std::memory_order_relaxed) != nullptr &&
                         reply.page_offset == writer_page_offset_ &&
                         static_cast<uint64_t>(wst.st_dev) == writers_dev_ &&
                         static_cast<uint64_t>(wst.st_ino) == writers_ino_;
  // The daemon gave the process its own page again: the threads keep their
  // slots at the addresses they have, mapped again if a change of
  // credentials put zeros there.
  void* page = nullptr;
  Revocable* page_range = nullptr;
  if (!same_page) {
    page = libc::Mmap(nullptr, sizeof(DirectWriterPage), PROT_READ | PROT_WRITE, MAP_SHARED,
                      writers.fd, static_cast<off_t>(reply.page_offset));
    if (page == MAP_FAILED) return fail(NVFS_DIRECT_NO_MEMORY);
    page_range = RevocableRegister(page, sizeof(DirectWriterPage), writers.fd);
    if (page_range == nullptr) {
      libc::Munmap(page, sizeof(DirectWriterPage));
      return fail(NVFS_DIRECT_NO_MEMORY);
    }
  }
  auto drop_page = [&] {
    if (page_range == nullptr) return;
    RevocableUnregister(page_range);
    libc::Munmap(page, sizeof(DirectWriterPage));
  };
  // The namespace, shared and writable, over the read-only mapping at the
  // same addresses (snapshots point there). On persistent memory behind a
  // DAX file system, MAP_SYNC: the file's blocks are durable before a
  // store can reach them, so CPU flushes make stores durable.
  uint32_t flush_kind = reply.flush;
  const bool cpu_flush = flush_kind == kDirectFlushCacheLine || flush_kind == kDirectFlushFence;
  void* base = const_cast<std::byte*>(ns_base);
  const uint64_t size = ns_size;
  void* n = MAP_FAILED;
  if (!CredentialsUnchangedSince(generation)) {
    drop_page();
    return NVFS_DIRECT_REFUSED;
  }
  if (same_page && writer_page_range_->revoked.load(std::memory_order_seq_cst)) {
    void* at = writer_page.load(std::memory_order_relaxed);
    if (libc::Mmap(at, sizeof(DirectWriterPage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   writers.fd, static_cast<off_t>(reply.page_offset)) == MAP_FAILED) {
      RevocableZero(writer_page_range_);
      return fail(NVFS_DIRECT_NO_MEMORY);
    }
    // Cleared after the page is back (seq_cst): a change that walks after
    // this puts zeros there again; one that walked before is seen below.
    writer_page_range_->revoked.store(false, std::memory_order_seq_cst);
  }
  if (cpu_flush && S_ISREG(st.st_mode)) {
    n = libc::Mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED_VALIDATE | MAP_SYNC | MAP_FIXED, ns.fd, 0);
    if (n == MAP_FAILED) flush_kind = kDirectFlushPage;  // not DAX here: msync instead
  }
  if (n == MAP_FAILED) n = libc::Mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ns.fd, 0);
  if (n == MAP_FAILED) {
    // A failed MAP_FIXED may have left the range unmapped: read-only
    // again, or zeros.
    if (libc::Mmap(base, size, PROT_READ, MAP_SHARED | MAP_FIXED, ns.fd, 0) == MAP_FAILED) {
      RevocableZero(ns_range);
    }
    drop_page();
    return fail(NVFS_DIRECT_NO_MEMORY);
  }
  if (!CredentialsUnchangedSince(generation)) {
    // A change walked past meanwhile: its zeros again.
    RevocableZero(ns_range);
    if (same_page) RevocableZero(writer_page_range_);
    drop_page();
    return NVFS_DIRECT_REFUSED;
  }
  // Before any store: the daemon's barriers reach this process's threads
  // from now on (or, if the kernel refuses, each store fences itself).
  if (!writers_asymmetric.load(std::memory_order_relaxed) &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0) {
    writers_asymmetric.store(true, std::memory_order_seq_cst);
  }
  flush = flush_kind;
  writable_size.store(size, std::memory_order_release);
  if (!same_page) {
    // The old page (an earlier mount's, or a fork's parent's) stays
    // mapped, and registered: a thread may be between loading it and its
    // store.
    writer_page.store(static_cast<DirectWriterPage*>(page), std::memory_order_release);
    writer_page_range_ = page_range;
    writer_page_offset_ = reply.page_offset;
    writers_dev_ = static_cast<uint64_t>(wst.st_dev);
    writers_ino_ = static_cast<uint64_t>(wst.st_ino);
    writer_generation.fetch_add(1, std::memory_order_release);
  }
  write_connection_ = true;
  writable.store(true, std::memory_order_seq_cst);
  write_why_ = NVFS_DIRECT_ACTIVE;
  return NVFS_DIRECT_ACTIVE;
}

void Session::EndLocked() {
  RevocableZero(ns_range);
  RevocableZero(table_range_);
  gone.store(true, std::memory_order_release);
}

int Session::CheckReply(const MapReply& r, uint64_t offset) const {
  if (r.slot == 0 || r.slot >= slot_count || r.run_count > kMaxRuns || (r.seq & 1) != 0) return EPROTO;
  if (r.h.size < offsetof(MapReply, runs) + r.run_count * sizeof(DirectRun)) return EPROTO;
  if (offset < r.size && (r.start > offset || r.run_count == 0)) return EPROTO;
  uint64_t file_off = r.start;
  for (uint32_t i = 0; i < r.run_count; ++i) {
    const DirectRun& run = r.runs[i];
    if (run.len == 0 || run.len > UINT64_MAX - file_off) return EPROTO;
    if (run.offset != kDirectHole && (run.offset > ns_size || run.len > ns_size - run.offset)) {
      return EPROTO;
    }
    file_off += run.len;
  }
  return 0;
}

bool Session::ExtendLocked(int ns_fd, uint64_t new_size) {
  if (new_size > ns_reserved_) return false;
  // The mapping grows from the very file that was mapped, and the part
  // added is mapped before the size that lets replies use it moves.
  struct stat st {};
  if (fstat(ns_fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_dev) != ns_dev_ ||
      static_cast<uint64_t>(st.st_ino) != ns_ino_ || static_cast<uint64_t>(st.st_size) < new_size) {
    return false;
  }
  // What a change of credentials takes out covers the part before it is
  // mapped (zeros over room no one reads, if one comes between); one that
  // walked the ranges before is caught after, as a new mapping's is.
  const uint64_t generation = CredentialsGeneration();
  if (Revoked() || !CredentialsUnchangedSince(generation)) return false;
  ns_range->size.store(new_size, std::memory_order_seq_cst);
  void* at = const_cast<std::byte*>(ns_base) + ns_size;
  if (libc::Mmap(at, new_size - ns_size, PROT_READ, MAP_SHARED | MAP_FIXED, ns_fd,
           static_cast<off_t>(ns_size)) == MAP_FAILED) {
    ns_range->size.store(ns_size, std::memory_order_seq_cst);
    return false;
  }
  if (!CredentialsUnchangedSince(generation)) {
    RevocableZero(ns_range);
    return false;
  }
  fault->size.store(new_size, std::memory_order_release);
  ns_size = new_size;
  return true;
}

bool Session::ExtendLocked(uint64_t new_size) {
  char path[PATH_MAX];
  struct stat st {};
  const int fd = NamespacePath(dev_, path, sizeof path) ? OpenNamespace(path, &st) : -1;
  if (fd < 0) return false;
  const bool extended = ExtendLocked(fd, new_size);
  CloseFd(fd);
  return extended;
}

int Session::CallOnceLocked(const Request& req, int fd, MapReply* reply) {
  const size_t min_ok = req.op == kOpTrim ? sizeof(ReplyHeader) : offsetof(MapReply, runs);
  const int err = TransportCall(sock_, req, fd, reply, sizeof *reply, min_ok, nullptr);
  if (err == EBADF) return EBADF;  // the descriptor, not the connection: nothing was sent
  if (err != 0) {
    DropSocketLocked();
    return kMapUnavailable;
  }
  if (reply->h.error != 0) return reply->h.error;
  if (req.op == kOpTrim) return kMapOk;
  if (reply->namespace_size > ns_size && !ExtendLocked(reply->namespace_size)) {
    // Grown past what this session can map: its files go through the
    // kernel, and a new session maps the namespace whole; asking again
    // would only get the same runs.
    gone.store(true, std::memory_order_release);
    return kMapGone;
  }
  // A commit of the times alone (offset == length) answers no runs.
  const bool times_only = req.op == kOpCommit && req.offset == req.length;
  if (!times_only && CheckReply(*reply, req.op == kOpCommit ? req.length : req.offset) != 0) {
    DropSocketLocked();  // a daemon that says nonsense is not asked again on this connection
    return kMapUnavailable;
  }
  return kMapOk;
}

int Session::MapLocked(int fd, uint64_t offset, MapReply* reply) {
  return CallLocked(Request{kMagic, kVersion, kOpMap, 0, offset, 0, 0, 0}, fd, reply);
}

int Session::CallLocked(const Request& req, int fd, MapReply* reply) {
  if (gone.load(std::memory_order_acquire)) return kMapGone;
  // A connection that failed is made again once per request.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int why = ConnectLocked();
    if (why == NVFS_DIRECT_GONE) return kMapGone;
    if (why == NVFS_DIRECT_NO_NAMESPACE && gone.load(std::memory_order_acquire)) return kMapEnded;
    if (why != NVFS_DIRECT_ACTIVE) {
      // The daemon is not there any more (a socket that refuses, a socket
      // file removed at unmount): the session is over.
      if (mapped_ && why == NVFS_DIRECT_NO_SERVER) {
        gone.store(true, std::memory_order_release);
        return kMapGone;
      }
      return kMapUnavailable;
    }
    // A write request on a connection made anew needs its proof for
    // writing again (the daemon knows the writer by the connection).
    if (req.op != kOpMap || (req.flags & kMapForWrite) != 0) {
      const int w = EnsureWriterLocked();
      if (w != NVFS_DIRECT_ACTIVE) {
        no_writes_why_ = w;
        return kMapNoWrites;
      }
    }
    const int r = CallOnceLocked(req, fd, reply);
    if (r != kMapUnavailable) return r;
  }
  return kMapUnavailable;
}

int Session::Map(int fd, uint64_t offset, MapReply* reply, bool for_write) {
  std::lock_guard lock(mu);
  if (!for_write) return MapLocked(fd, offset, reply);
  return CallLocked(Request{kMagic, kVersion, kOpMap, kMapForWrite, offset, 0, 0, 0}, fd, reply);
}

Session* SessionFor(dev_t dev, int* why) {
  FreeDeadSessions();  // no session's lock is held here
  Session* s = nullptr;
  // Released after the registry's lock: a last reference frees the
  // session, which takes that lock to leave the list of all sessions.
  Session* dropped[kMaxSessions];
  int dropped_count = 0;
  {
    std::lock_guard lock(registry_mu);
    int free_index = -1;
    for (int i = 0; i < kMaxSessions; ++i) {
      Session* e = registry[i];
      if (e == nullptr) {
        if (free_index < 0) free_index = i;
        continue;
      }
      if (e->dev_ != dev) continue;
      if (e->gone.load(std::memory_order_acquire)) {
        // Its handles keep it until they are detached; new ones get a new one.
        registry[i] = nullptr;
        dropped[dropped_count++] = e;
        if (free_index < 0) free_index = i;
        continue;
      }
      s = e;
      break;
    }
    if (s == nullptr && free_index < 0) {
      // Make room: a session no handle uses any more.
      for (int i = 0; i < kMaxSessions && free_index < 0; ++i) {
        if (registry[i]->refs_.load(std::memory_order_acquire) == 1) {
          dropped[dropped_count++] = registry[i];
          registry[i] = nullptr;
          free_index = i;
        }
      }
    }
    if (s == nullptr && free_index >= 0) {
      s = new (std::nothrow) Session(dev);
      if (s != nullptr) {
        registry[free_index] = s;
        s->next_ = all_sessions;
        if (all_sessions != nullptr) all_sessions->prev_ = s;
        all_sessions = s;
      }
    }
    if (s != nullptr) s->Ref();
  }
  for (int i = 0; i < dropped_count; ++i) dropped[i]->Unref();
  if (s == nullptr) {
    *why = NVFS_DIRECT_NO_MEMORY;
    return nullptr;
  }
  int w;
  {
    std::lock_guard lock(s->mu);
    w = s->ConnectLocked();
  }
  if (w != NVFS_DIRECT_ACTIVE) {
    s->Unref();
    *why = w;
    return nullptr;
  }
  return s;
}

void SessionsDropConnections() {
  std::lock_guard lock(registry_mu);
  for (Session* s = all_sessions; s != nullptr; s = s->next_) {
    // One that is waiting for its daemon is not waited for.
    if (!s->mu.try_lock()) continue;
    if (s->sock_ >= 0) s->DropSocketLocked();
    s->mu.unlock();
  }
}

void SessionsPrepareFork() {
  registry_mu.lock();
  for (Session* s = all_sessions; s != nullptr; s = s->next_) s->mu.lock();
}

void SessionsParentAfterFork() {
  for (Session* s = all_sessions; s != nullptr; s = s->next_) s->mu.unlock();
  registry_mu.unlock();
}

void SessionsChildAfterFork() {
  for (Session* s = all_sessions; s != nullptr; s = s->next_) {
    // The parent's page is the parent's: the child proves itself for
    // writing on its own, and gets its own.
    s->writable.store(false, std::memory_order_relaxed);
    s->writer_page.store(nullptr, std::memory_order_relaxed);
    writers_asymmetric.store(false, std::memory_order_relaxed);
    s->write_why_ = NVFS_DIRECT_ACTIVE;
    s->writer_generation.fetch_add(1, std::memory_order_relaxed);
    if (s->sock_ >= 0) s->DropSocketLocked();
    s->mu.unlock();
  }
  registry_mu.unlock();
}

}  // namespace nvfs::direct
