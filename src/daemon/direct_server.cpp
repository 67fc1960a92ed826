// The direct-read server (direct_server.hpp, src/direct/protocol.hpp). One
// thread polls the listening socket and every connection; each request is
// read without blocking, answered at once, and never waited for: a client
// that sends half a request holds only its own buffer, one that does not
// read its replies is dropped, a user who asks too fast is not polled until
// the user's tokens come back, a connection not proven in time is closed.
// The thread takes no lock of the daemon's but the core's inode lock
// (shared, in DirectMap), and touches the mount only through descriptors it
// was given: statx(AT_STATX_DONT_SYNC) asks the kernel's cache, not this
// daemon. A descriptor is taken only from a peer who could open the
// namespace (protocol.hpp), and one whose close could wait is closed on the
// reaper's thread (daemon::ClientDescriptors), never here.
#include "daemon/direct_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include <linux/fs.h>

#include "daemon/direct_maps.hpp"
#include "daemon/direct_writers.hpp"
#include "daemon/socket_server.hpp"
#include "direct/protocol.hpp"
#include "nvfs/format.hpp"
#include "nvfs/media.hpp"
#include "nvfs/paths.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::direct {

namespace {

using Clock = std::chrono::steady_clock;

struct Connection {
  uint64_t id = 0;  // unique in this daemon: a mapper's name (direct_maps.hpp)
  int fd = -1;
  uid_t uid = 0;
  pid_t pid = 0;
  bool passes_fds = false;  // its peer may send descriptors (SO_PASSRIGHTS)
  bool proven = false;
  bool write_proven = false;  // kOpWriteProve succeeded: a page is the process's
  Clock::time_point accepted;
  size_t have = 0;  // bytes of `request` received so far
  Request request{};
  int passed = -1;  // the descriptor that came with the request, if any
  bool bad = false;  // a second descriptor, or ancillary data of another kind
  bool done = false;  // to be closed
  // Files this connection maps (kOpMmap), by inode: the descriptor it
  // passed, kept open until kOpMunmap or the connection's end.
  std::map<uint64_t, int> mapped;
  uint64_t start_time = 0;  // its process's, at its first kOpMmap
  // Files it passed a descriptor open for writing of (kOpMap for writing,
  // or a write request with the descriptor): the only ones a later write
  // request may name by inode alone, and the only ones its page's list of
  // written files is believed for.
  std::set<uint64_t> writable;
  uint64_t page = 0;  // its page of the writers' file (kOpWriteProve), 0: none
};

// Files a connection may name by inode: beyond this, a write request
// passes the descriptor again each time (it is checked, and served).
constexpr size_t kMaxWritableNames = 65536;

// The tests' way to widen a race window on the server thread: sleeps for
// the milliseconds the environment variable `name` gives (read once in a
// daemon; never set outside tests).
void TestPause(const char* name) {
  static const long ms = [name] {
    const char* v = secure_getenv(name);
    return v != nullptr ? std::strtol(v, nullptr, 10) : 0L;
  }();
  if (ms > 0 && ms <= 10000) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// A mapper whose connection closed while its process lived: it may still
// map the files, so what they free is held (Maps::Orphan) until the process
// is gone or maps the namespace no more.
struct Orphan {
  uint64_t id;
  uid_t uid;
  pid_t pid;
  uint64_t start_time;
  std::vector<int> fds;  // the descriptors the connection passed
};

// Whether process `pid` maps the file `dev`:`ino` (/proc/PID/maps): true
// when unknown. Reading it takes the process's mmap lock, which the process
// can hold, or queue a writer on, for as long as it likes: only the
// prober's thread calls it.
bool ProcessMaps(pid_t pid, dev_t dev, ino_t ino) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/maps", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return errno != ENOENT && errno != ESRCH;
  bool found = false;
  char line[512];
  // Bounded: a process with millions of mappings is read in part, and
  // counted as mapping the namespace.
  for (int n = 0; n < (1 << 20); ++n) {
    if (std::fgets(line, sizeof line, f) == nullptr) break;
    const size_t len = std::strlen(line);
    if (len > 0 && line[len - 1] != '\n' && !std::feof(f)) {
      int ch;  // the rest of a long line (a long path)
      while ((ch = std::fgetc(f)) != EOF && ch != '\n') {
      }
    }
    unsigned maj = 0, min = 0;
    unsigned long long at = 0;
    if (std::sscanf(line, "%*x-%*x %*s %*x %x:%x %llu", &maj, &min, &at) == 3 &&
        maj == major(dev) && min == minor(dev) && at == static_cast<unsigned long long>(ino)) {
      found = true;
      break;
    }
    if (n + 1 == (1 << 20)) found = true;
  }
  std::fclose(f);
  return found;
}

// Looks at orphans' processes on a thread of its own, one look at a time,
// and wakes the server thread with the answers: nothing a process does to
// its own /proc files makes the server thread wait. Shared with that
// thread, so that a look that never returns outlives the daemon's state.
struct Prober {
  std::mutex mu;
  bool busy = false;               // protected by mu: a look under way
  std::vector<uint64_t> gone;      // protected by mu: orphans found gone
  int wake_fd = -1;                // the maps' eventfd (a duplicate)
  ~Prober() {
    if (wake_fd >= 0) close(wake_fd);
  }
};

// One user's share: connections, and requests as tokens.
struct User {
  unsigned connections = 0;
  double tokens = kRequestBurst;
  Clock::time_point refilled = Clock::now();
};

void Refill(User& u, Clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - u.refilled).count();
  u.tokens = std::min<double>(kRequestBurst, u.tokens + seconds * kRequestsPerSecond);
  u.refilled = now;
}

// What the kernel knows of a descriptor, without asking the daemon that
// serves it (this one, for a file on the mount).
bool StatFd(int fd, struct statx* stx) {
  return statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_INO, stx) == 0;
}

// Open for reading: not O_PATH, not write-only.
bool Readable(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_PATH)) return false;
  return (flags & O_ACCMODE) == O_RDONLY || (flags & O_ACCMODE) == O_RDWR;
}

// Open for reading and writing: what the namespace a direct writer maps
// shared and writable must be.
bool ReadWrite(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && !(flags & O_PATH) && (flags & O_ACCMODE) == O_RDWR;
}

// Open for writing (O_WRONLY or O_RDWR), not O_APPEND (whose writes the
// kernel places at the end, whatever the offset): what a direct writer's
// file descriptor must be. A write-only one is mapped for a writer alone,
// who may read the whole namespace anyway.
bool Writable(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_PATH) || (flags & O_ACCMODE) == O_RDONLY) return false;
  return (flags & O_APPEND) == 0;
}

DirectFlush FlushOf(Granularity g) {
  switch (g) {
    case Granularity::kMemory: return kDirectFlushNone;
    case Granularity::kByte: return kDirectFlushFence;
    case Granularity::kCacheLine: return kDirectFlushCacheLine;
    default: return kDirectFlushPage;
  }
}

// After a writer's request: its next one (an append's commit follows its
// store by microseconds) is looked for by polling, at most
// kWriterSpinMicroseconds, before the thread goes back to sleep in poll()
// (whose wake-up costs tens of microseconds on a virtual machine). Bounded:
// no client can hold the thread longer, and only a connection proven for
// writing (a process that could change the namespace anyway) gets it.
constexpr auto kWriterSpin = std::chrono::microseconds(50);

bool AwaitNext(int fd) {
  const Clock::time_point until = Clock::now() + kWriterSpin;
  do {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) != 0) return true;
  } while (Clock::now() < until);
  return false;
}

int MillisecondsUntil(Clock::time_point now, Clock::time_point then) {
  if (then <= now) return 0;
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(then - now).count());
}

}  // namespace

struct Server::State {
  Filesystem* fs = nullptr;
  ServerOptions options;
  bool writes_enabled = false;       // direct writes served
  std::unique_ptr<Writers> writers;  // made at the first proof for writing
  // Direct maps: made with the table; the filesystem's external grace from
  // the first proof for writing or the first map on (InstallGrace).
  std::unique_ptr<Maps> maps;
  int maps_wake_fd = -1;             // an eventfd: mappers to tell
  bool grace_installed = false;
  uint64_t next_id = 1;
  std::vector<Orphan> orphans;
  Clock::time_point next_orphan_check;
  std::shared_ptr<Prober> prober = std::make_shared<Prober>();
  Clock::time_point next_times;      // when the writers' dirty lists are taken next
  std::set<uint64_t> stale_attrs;    // inodes whose kernel attributes Times drops
  static constexpr size_t kMaxStaleAttrs = 1024;
  dev_t mount_dev = 0;
  std::string socket_path;
  struct stat namespace_stat {};
  bool namespace_has_acl = false;  // then a user the mode leaves out may read it
  DirectSlot* table = nullptr;
  size_t table_bytes = 0;
  int table_fd = -1;     // the memfd, sealed against writes but through `table`
  int table_ro_fd = -1;  // what clients get: the same, opened read-only
  daemon::SocketServer socket;  // the listening socket, its thread
  daemon::ClientDescriptors descriptors;
  std::vector<Connection> connections;
  std::map<uid_t, User> users;

  ~State() {
    // After the filesystem's unmount: its file goes unless a writer
    // process still lives (the next mount's guard reads it then).
    if (writers != nullptr) writers->RemoveIfIdle();
    if (table != nullptr) munmap(table, table_bytes);
    if (table_fd >= 0) close(table_fd);
    if (table_ro_fd >= 0) close(table_ro_fd);
    if (maps_wake_fd >= 0) close(maps_wake_fd);
  }

  void Run();
  // One poll and what it found ready; false when the thread must return.
  bool Round(std::vector<pollfd>& fds, std::vector<size_t>& which);
  void Accept();
  // Whether the peer could open the namespace for reading, as far as its
  // uid and groups and the namespace's owner and mode tell: a superset (a
  // capability, an ACL), which the proof then narrows.
  bool MayReadNamespace(int fd, const ucred& cred) const;
  void Receive(Connection& c);
  void Handle(Connection& c);
  void Hello(Connection& c);
  void Prove(Connection& c);
  void Map(Connection& c);
  void WriteProve(Connection& c);
  // The filesystem waits out the maps' (and writers') grace from now on.
  void InstallGrace();
  // kOpMmap, kOpMunmap, kOpMapAck, kOpMapDone.
  void MmapOp(Connection& c);
  void MapsOp(Connection& c);
  // Sends kOpNotify to the mappers Maps says are to be told.
  void Notify();
  // Starts a look at the orphans' processes (Prober), unless one is under
  // way; forgets those an earlier look found gone or mapping the namespace
  // no more.
  void CheckOrphans(Clock::time_point now);
  void ForgetGoneOrphans();
  // kOpAllocate, kOpCommit and kOpTrim: the file of `c.passed`, checked and
  // released, then the core's call.
  void WriteOp(Connection& c);
  // The passed descriptor's inode, if it is a regular file of this mount
  // open for reading and writing (not O_APPEND): else 0 and the errno in
  // *error. The descriptor is released either way.
  uint64_t WriterFile(Connection& c, int* error);
  // Whether `ino` may be written directly at the state just mapped: none of
  // what a write must take away first (set-ID bits, a capability), nor
  // chattr's immutable or append-only.
  bool MayWriteDirectly(uint64_t ino);
  // A reply's fields from the core's answer for `ino` (its runs are in
  // reply->runs already).
  void FillReply(MapReply* reply, uint64_t ino, const Filesystem::DirectMapping& m) const;
  // The byte at `size` - 1 of `ino`, for the kernel's copy of its size.
  uint8_t LastByte(uint64_t ino, uint64_t size);
  // After a commit (`stored`: bytes, else the times only) answered with `m`
  // and `runs`: the kernel's size moved up now, its cached times dropped
  // soon (stale_attrs) or, for the times alone, now.
  void Committed(uint64_t ino, bool stored, const Filesystem::DirectMapping& m,
                 const DirectRun* runs);
  void ForgetStaleAttrs();
  // Sets the times of the files writers listed, and stops direct writes
  // if the filesystem turned read-only.
  void Times(Clock::time_point now);
  // Sends the whole reply at once, or drops the connection (a client that
  // does not read its replies fills its socket; nothing is queued for it).
  void Send(Connection& c, const void* reply, size_t size, int fd = -1);
  // One reply with `error`, then the connection is closed.
  void Refuse(Connection& c, uint32_t op, int error);
  // `stopping`: the daemon ends, and every mapper with it.
  void Close(Connection& c, bool stopping = false);
};

void Server::State::Run() {
  std::vector<pollfd> fds;
  std::vector<size_t> which;  // connection of each pollfd past the first two
  for (;;) {
    try {
      if (!Round(fds, which)) return;
    } catch (const std::bad_alloc&) {
      // What this round could not hold is left for the next (a connection
      // not accepted waits in the backlog); a short pause, not a spin.
      poll(nullptr, 0, 10);
    }
  }
}

// The pollfds before the connections': the stop pipe, the listening socket
// and the maps' eventfd.
constexpr size_t kFixedFds = 3;

bool Server::State::Round(std::vector<pollfd>& fds, std::vector<size_t>& which) {
  const Clock::time_point now = Clock::now();
  for (auto& [uid, user] : users) Refill(user, now);
  int timeout = -1;
  const auto wake_at = [&](Clock::time_point then) {
    const int ms = MillisecondsUntil(now, then);
    timeout = timeout < 0 ? ms : std::min(timeout, ms);
  };
  for (Connection& c : connections) {
    const Clock::time_point deadline = c.accepted + std::chrono::seconds(kUnprovenSeconds);
    if (!c.proven && deadline <= now) c.done = true;
    if (c.done) Close(c);
  }
  std::erase_if(connections, [](const Connection& c) { return c.fd < 0; });

  if (writers != nullptr) {
    if (now >= next_times) Times(now);
    wake_at(next_times);
  }
  if (!orphans.empty()) {
    if (now >= next_orphan_check) CheckOrphans(now);
    wake_at(next_orphan_check);
  }

  fds.assign({{socket.wake_fd(), POLLIN, 0},
              {socket.listen_fd(), POLLIN, 0},
              {maps_wake_fd, POLLIN, 0}});
  which.clear();
  for (size_t i = 0; i < connections.size(); ++i) {
    Connection& c = connections[i];
    if (!c.proven) wake_at(c.accepted + std::chrono::seconds(kUnprovenSeconds));
    const User& user = users[c.uid];
    if (user.tokens < 1) {  // out of tokens: not heard until one is back
      wake_at(now + std::chrono::milliseconds(
                        static_cast<int>((1 - user.tokens) * 1000 / kRequestsPerSecond) + 1));
      continue;
    }
    if (c.passes_fds && descriptors.Pending(c.uid) >= kMaxPendingCloses) {
      // This user's closes are stuck: only this user waits for them.
      wake_at(now + std::chrono::milliseconds(100));
      continue;
    }
    fds.push_back({c.fd, POLLIN, 0});
    which.push_back(i);
  }
  if (poll(fds.data(), fds.size(), timeout) < 0) {
    // Cannot fail with valid descriptors but for a signal; the mount goes on.
    return errno == EINTR;
  }
  if (fds[0].revents != 0) return false;
  for (size_t k = kFixedFds; k < fds.size(); ++k) {
    if (fds[k].revents != 0) Receive(connections[which[k - kFixedFds]]);
  }
  if (fds[1].revents & POLLIN) Accept();
  if (fds[2].revents & POLLIN) {
    uint64_t count;
    [[maybe_unused]] ssize_t n = read(maps_wake_fd, &count, sizeof count);
    ForgetGoneOrphans();
    Notify();
  }
  return true;
}

bool Server::State::MayReadNamespace(int fd, const ucred& cred) const {
  const struct stat& ns = namespace_stat;
  if (cred.uid == 0 || namespace_has_acl || (ns.st_mode & S_IROTH)) return true;
  if (cred.uid == ns.st_uid) return (ns.st_mode & S_IRUSR) != 0;
  if ((ns.st_mode & S_IRGRP) == 0) return false;
  if (cred.gid == ns.st_gid) return true;
  gid_t groups[256];
  socklen_t len = sizeof groups;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0) {
    return errno == ERANGE;  // more groups than room: let the proof decide
  }
  return std::find(groups, groups + len / sizeof(gid_t), ns.st_gid) != groups + len / sizeof(gid_t);
}

void Server::State::Accept() {
  for (int n = 0; n < 64; ++n) {  // a bounded batch; the rest at the next poll
    const int fd = accept4(socket.listen_fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    // Nothing can have come with descriptors yet (they are refused from
    // the connect on), so a close here cannot wait.
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      close(fd);
      continue;
    }
    Connection c;
    c.id = next_id++;
    c.fd = fd;
    c.uid = cred.uid;
    c.pid = cred.pid;
    c.accepted = Clock::now();
    User& user = users[cred.uid];
    const unsigned limit = cred.uid == 0 ? kMaxConnections : kMaxConnections - kRootReserve;
    if (connections.size() >= limit || user.connections >= kMaxConnectionsPerUid ||
        descriptors.Pending(cred.uid) >= kMaxPendingCloses) {
      Refuse(c, 0, EUSERS);
      close(fd);
      if (user.connections == 0) users.erase(cred.uid);
      continue;
    }
    c.passes_fds = MayReadNamespace(fd, cred) && AcceptDescriptors(fd, true);
    connections.push_back(c);
    ++user.connections;
  }
}

void Server::State::Receive(Connection& c) {
  User& user = users[c.uid];
  for (int n = 0; n < 16 && !c.done && user.tokens >= 1; ++n) {
    PassedFds got_fds;
    const ssize_t got = ReceiveWithFds(c.fd, reinterpret_cast<char*>(&c.request) + c.have,
                                       sizeof(Request) - c.have, MSG_DONTWAIT, &got_fds);
    if (got < 0 && errno == EAGAIN && n > 0 && c.write_proven && c.have == 0 &&
        AwaitNext(c.fd)) {
      continue;  // a writer's next request, without a sleep between
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (got <= 0) {
      c.done = true;
      return;
    }
    c.bad |= got_fds.other;
    for (size_t i = 0; i < got_fds.count; ++i) {
      if (c.passed < 0 && !c.bad) {
        c.passed = got_fds.fds[i];
      } else {
        descriptors.Release(got_fds.fds[i], c.uid);
        c.bad = true;
      }
    }
    c.have += static_cast<size_t>(got);
    if (c.have >= 8 && (c.request.magic != kMagic || c.request.version != kVersion)) {
      // Another version's requests may be of another size: said at once.
      Refuse(c, 0, EPROTO);
      return;
    }
    if (c.have < sizeof(Request)) continue;
    if (!c.write_proven) user.tokens -= 1;
    try {
      Handle(c);
    } catch (const std::bad_alloc&) {
      Refuse(c, c.request.op, ENOMEM);
    }
    descriptors.Release(c.passed, c.uid);
    c.passed = -1;
    c.have = 0;
    c.bad = false;
  }
}

void Server::State::Handle(Connection& c) {
  const Request& r = c.request;
  if (r.magic != kMagic || r.version != kVersion || c.bad) {
    Refuse(c, r.op, EPROTO);
    return;
  }
  switch (r.op) {
    case kOpHello:
      Hello(c);
      return;
    case kOpProve:
      Prove(c);
      return;
    case kOpMap:
    case kOpWriteProve:
    case kOpAllocate:
    case kOpCommit:
    case kOpTrim:
    case kOpMmap:
    case kOpMunmap:
    case kOpMapAck:
    case kOpMapDone:
      if (!c.proven) {
        Refuse(c, r.op, EACCES);
        return;
      }
      if (r.op == kOpMap) {
        Map(c);
      } else if (r.op == kOpWriteProve) {
        WriteProve(c);
      } else if (r.op == kOpMmap) {
        MmapOp(c);
      } else if (r.op >= kOpMunmap) {
        MapsOp(c);
      } else {
        WriteOp(c);
      }
      return;
    default:
      Refuse(c, r.op, EPROTO);
  }
}

// This daemon speaks this version; nothing more before the proof.
void Server::State::Hello(Connection& c) {
  if (c.passed >= 0) {
    Refuse(c, kOpHello, EPROTO);
    return;
  }
  const ReplyHeader reply{kMagic, kOpHello, 0, sizeof reply};
  Send(c, &reply, sizeof reply);
}

// The proof: a descriptor of this very namespace, open for reading, that
// the client had (it opened it, or was given it by someone who could).
void Server::State::Prove(Connection& c) {
  if (c.passed < 0 || !descriptors.IsNamespace(c.passed) || !Readable(c.passed)) {
    Refuse(c, kOpProve, EACCES);
    return;
  }
  c.proven = true;
  const std::byte* base = fs->media().base();
  ProveReply reply{};
  reply.h = {kMagic, kOpProve, 0, sizeof reply};
  reply.namespace_size = fs->media().size();
  std::memcpy(&reply.mount_count,
              base + format::kSuperDynamicOffset + offsetof(format::SuperDynamic, mount_count),
              sizeof reply.mount_count);
  std::memcpy(reply.uuid, base + offsetof(format::SuperStatic, uuid), sizeof reply.uuid);
  reply.slot_count = kSlots;
  reply.table_bytes = table_bytes;
  Send(c, &reply, sizeof reply, table_ro_fd);
}

// A file of this mount, open for reading (or, for a writer, for writing):
// the kernel checked the caller's permission at that open. Its inode number
// is the mount's st_ino.
void Server::State::Map(Connection& c) {
  MapReply reply{};
  reply.h = {kMagic, kOpMap, 0, sizeof reply};
  struct statx stx {};
  if (c.passed < 0 || !StatFd(c.passed, &stx) ||
      makedev(stx.stx_dev_major, stx.stx_dev_minor) != mount_dev) {
    reply.h.error = EXDEV;
  } else if (!S_ISREG(stx.stx_mode)) {
    reply.h.error = EINVAL;
  } else if (!Readable(c.passed) &&
             !((c.request.flags & kMapForWrite) != 0 && c.write_proven && Writable(c.passed))) {
    reply.h.error = EBADF;
  } else {
    const bool for_write =
        (c.request.flags & kMapForWrite) != 0 && c.write_proven && Writable(c.passed);
    // The inode stays open (the client's descriptor) while DirectMap runs
    // only if the client keeps it; ours goes first, so that a last close
    // here never runs under the core's locks. DirectMap refuses an inode
    // no one has open (EBADF).
    descriptors.Release(c.passed, c.uid);
    c.passed = -1;
    Result<Filesystem::DirectMapping> m =
        fs->DirectMap(stx.stx_ino, c.request.offset, reply.runs, kMaxRuns);
    if (!m.ok()) {
      reply.h.error = m.code();
    } else {
      FillReply(&reply, stx.stx_ino, *m);
      // Looked at after the runs: a change of mode or owner after them
      // moves the seq they are valid for.
      if (for_write && MayWriteDirectly(stx.stx_ino)) {
        reply.flags = kMapWritable;
        if (c.writable.size() < kMaxWritableNames) c.writable.insert(stx.stx_ino);
      }
    }
  }
  Send(c, &reply, sizeof reply);
}

void Server::State::FillReply(MapReply* reply, uint64_t ino,
                              const Filesystem::DirectMapping& m) const {
  reply->ino = ino;
  reply->seq = m.seq;
  reply->size = m.size;
  reply->start = m.start;
  reply->namespace_size = fs->media().size();
  reply->slot = m.slot;
  reply->run_count = static_cast<uint32_t>(m.run_count);
  reply->append_at = m.append_at;
  reply->append_word = m.append_word;
}

uint8_t Server::State::LastByte(uint64_t ino, uint64_t size) {
  if (size == 0) return 0;
  DirectRun run;
  Result<Filesystem::DirectMapping> m = fs->DirectMap(ino, size - 1, &run, 1);
  if (!m.ok() || m->run_count == 0 || run.offset == kDirectHole) return 0;
  uint8_t byte = 0;
  // Under a recovery point: a lost page fails this byte (0), not the daemon.
  const std::byte* at = fs->media().base() + run.offset + (size - 1 - m->start);
  if (!RunFaultGuarded([&] { std::memcpy(&byte, at, 1); })) return 0;
  return byte;
}

bool Server::State::MayWriteDirectly(uint64_t ino) {
  Result<Attr> attr = fs->GetAttr(ino);
  if (!attr.ok()) return false;
  const uint32_t mode = attr->mode;
  if ((mode & S_ISUID) || (mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP)) return false;
  Result<size_t> cap = fs->GetXattr(ino, "security.capability", nullptr, 0);
  if (cap.ok() || cap.code() != ENODATA) return false;
  Result<uint32_t> flags = fs->GetInodeFlags(ino);
  return flags.ok() && (*flags & (FS_IMMUTABLE_FL | FS_APPEND_FL)) == 0;
}

// The proof for writing: this very namespace, open for reading and
// writing, which the client maps shared and writable itself.
void Server::State::WriteProve(Connection& c) {
  WriteProveReply reply{};
  reply.h = {kMagic, kOpWriteProve, 0, sizeof reply};
  if (writers == nullptr && writes_enabled && !fs->read_only()) {
    // Made at the first writer, not at mount: a mount no one writes
    // directly leaves no file behind. Before the writer can be given a
    // run: every block freed from now on waits out the writers' stores
    // (a block freed before had left its file before any writer was).
    const NamespaceIdentity id = IdentityAt(fs->media().base());
    std::string why;
    writers = Writers::Open(id.uuid, id.mount_count, &why);
    if (writers != nullptr) {
      maps->SetWriters(writers.get());
      InstallGrace();
    }
  }
  if (writers == nullptr) {
    reply.h.error = fs->read_only() ? EROFS : EOPNOTSUPP;
  } else if (c.passed < 0 || !descriptors.IsNamespace(c.passed) ||
             !ReadWrite(c.passed)) {
    reply.h.error = EACCES;
  } else if (fs->read_only()) {
    reply.h.error = EROFS;
  } else if ((c.request.flags & kProveNoPage) != 0) {
    c.write_proven = true;  // a mapper's: its process's page is its session's
    reply.flush = FlushOf(fs->media().granularity());
  } else {
    const uint64_t page = writers->Assign(static_cast<uint64_t>(c.pid));
    if (page == 0) {
      reply.h.error = EUSERS;
    } else {
      c.write_proven = true;
      c.page = page;
      reply.page_offset = page;
      reply.flush = FlushOf(fs->media().granularity());
    }
  }
  Send(c, &reply, sizeof reply,
       reply.h.error == 0 && reply.page_offset != 0 ? writers->fd() : -1);
}

void Server::State::InstallGrace() {
  if (grace_installed) return;
  fs->SetExternalGrace(maps.get());
  // A mount with direct writes caches no file pages in the kernel
  // (ServerOptions::writes): its files may be appended to by word.
  if (options.writes) fs->SetAppendWords(true);
  grace_installed = true;
}

// A file of this mount the client maps into its own address space: opened
// for reading (and writing, for a writable shared map), as the kernel's mmap
// wants it; or named by `ino` when this connection maps it already.
void Server::State::MmapOp(Connection& c) {
  const Request& r = c.request;
  MapReply reply{};
  reply.h = {kMagic, kOpMmap, 0, sizeof reply};
  const bool for_write = (r.flags & kMapForWrite) != 0;
  uint64_t ino = 0;
  int error = 0;
  if (c.passed < 0) {
    if (c.mapped.count(r.ino) != 0) {
      ino = r.ino;
    } else {
      error = EBADF;
    }
  } else {
    struct statx stx {};
    if (!StatFd(c.passed, &stx) || makedev(stx.stx_dev_major, stx.stx_dev_minor) != mount_dev) {
      error = EXDEV;
    } else if (!S_ISREG(stx.stx_mode)) {
      error = EINVAL;
    } else if (!Readable(c.passed) || (for_write && !ReadWrite(c.passed))) {
      error = EACCES;  // mmap(2)'s errno for a descriptor not open as the map needs
    } else {
      ino = stx.stx_ino;
    }
  }
  if (error == 0 && for_write && !c.write_proven) error = EACCES;
  if (error == 0 && c.mapped.count(ino) == 0 && c.mapped.size() >= kMaxMappedFiles) error = EMFILE;
  bool fresh = false;  // its descriptor kept by this request
  if (error == 0 && c.passed >= 0 && c.mapped.count(ino) == 0) {
    // Kept: the file stays open while the client maps it (as the kernel's
    // mmap holds the file), so its blocks are not freed by its last close.
    if (c.mapped.empty() && c.start_time == 0) {
      c.start_time = ProcessStartTime(static_cast<uint64_t>(c.pid));
    }
    c.mapped[ino] = c.passed;
    c.passed = -1;
    fresh = true;
  }
  if (error != 0) {
    reply.h.error = error;
    Send(c, &reply, sizeof reply);
    return;
  }
  InstallGrace();
  // Held before the runs are read, let go once they are registered: no
  // block they name goes to another file in between.
  maps->BeginRegister(c.id);
  Result<Filesystem::DirectMapping> m = Error(EIO);
  if (for_write && !MayWriteDirectly(ino)) {
    m = Error(EPERM);  // a store must drop what the kernel drops: the kernel maps it
  } else if (for_write && (r.flags & kMapAllocate) != 0) {
    // A store into a hole of the map: the holes of a bounded range get
    // blocks, committed before the reply, so what the client stores lands
    // in blocks the file has for good.
    Result<Attr> attr = fs->GetAttr(ino);
    const uint64_t size = attr.ok() ? attr->size : 0;
    const uint64_t want = std::min({r.length, kMaxMapAllocateBytes, UINT64_MAX - r.offset});
    const uint64_t end = std::min(size, r.offset + want);
    m = end > r.offset ? fs->DirectAllocate(ino, r.offset, end - r.offset, 0, reply.runs, kMaxRuns)
                       : fs->DirectMap(ino, r.offset, reply.runs, kMaxRuns);
  } else {
    m = fs->DirectMap(ino, r.offset, reply.runs, kMaxRuns);
  }
  TestPause("NVFS_TEST_MMAP_PAUSE_MS");
  if (!m.ok()) {
    reply.h.error = m.code();
  } else if (!maps->Register(c.id, ino, m->slot, m->seq)) {
    reply.h.error = EIO;
  } else {
    FillReply(&reply, ino, *m);
    if (for_write) reply.flags = kMapWritable;
  }
  maps->EndRegister(c.id);
  if (reply.h.error != 0 && fresh) {
    // Refused: the client maps nothing of it, and says nothing more of it.
    descriptors.Release(c.mapped[ino], c.uid);
    c.mapped.erase(ino);
  }
  Send(c, &reply, sizeof reply);
}

void Server::State::MapsOp(Connection& c) {
  const Request& r = c.request;
  if (c.passed >= 0) {
    Refuse(c, r.op, EPROTO);
    return;
  }
  if (r.op == kOpMunmap) {
    auto it = c.mapped.find(r.ino);
    if (it == c.mapped.end()) return;  // nothing to say: no reply to this op
    maps->Unregister(c.id, r.ino);
    descriptors.Release(it->second, c.uid);
    c.mapped.erase(it);
  } else if (r.op == kOpMapAck) {
    maps->Acknowledged(c.id, r.ino, r.seq);
  } else {
    maps->Done(c.id);
  }
}

void Server::State::Notify() {
  const ReplyHeader notify{kMagic, kOpNotify, 0, sizeof(ReplyHeader)};
  for (uint64_t id : maps->TakeNotifications()) {
    for (Connection& c : connections) {
      if (c.id == id && c.fd >= 0 && !c.done) Send(c, &notify, sizeof notify);
    }
  }
}

void Server::State::CheckOrphans(Clock::time_point now) {
  next_orphan_check = now + std::chrono::seconds(1);
  struct Look {
    uint64_t id;
    pid_t pid;
    uint64_t start_time;
  };
  std::vector<Look> looks;
  for (const Orphan& o : orphans) looks.push_back({o.id, o.pid, o.start_time});
  {
    std::lock_guard lock(prober->mu);
    if (prober->busy) return;  // one stuck look holds the orphans: held is safe
    prober->busy = true;
  }
  const dev_t dev = namespace_stat.st_dev;
  const ino_t ino = namespace_stat.st_ino;
  try {
    std::thread([p = prober, looks = std::move(looks), dev, ino] {
      std::vector<uint64_t> gone;
      for (const Look& l : looks) {
        if (!ProcessAlive(static_cast<uint64_t>(l.pid), l.start_time) || !ProcessMaps(l.pid, dev, ino)) {
          gone.push_back(l.id);
        }
      }
      std::lock_guard lock(p->mu);
      p->gone.insert(p->gone.end(), gone.begin(), gone.end());
      p->busy = false;
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = write(p->wake_fd, &one, sizeof one);
    }).detach();
  } catch (const std::system_error&) {
    std::lock_guard lock(prober->mu);
    prober->busy = false;  // no thread: looked at again in a second
  }
}

void Server::State::ForgetGoneOrphans() {
  std::vector<uint64_t> gone;
  {
    std::lock_guard lock(prober->mu);
    gone.swap(prober->gone);
  }
  for (uint64_t id : gone) {
    std::erase_if(orphans, [&](Orphan& o) {
      if (o.id != id) return false;
      maps->Drop(o.id);
      for (int fd : o.fds) descriptors.Release(fd, o.uid);
      return true;
    });
  }
}

uint64_t Server::State::WriterFile(Connection& c, int* error) {
  struct statx stx {};
  *error = 0;
  if (!c.write_proven) {
    *error = EACCES;
  } else if (c.passed < 0 && c.request.ino != 0) {
    // Named: only a file this connection passed a descriptor open for
    // writing of (the kernel checked that open); EBADF asks the client for
    // the descriptor. The core checks it is an open regular file.
    if (c.writable.count(c.request.ino) == 0) {
      *error = EBADF;
      return 0;
    }
    return c.request.ino;
  } else if (c.passed < 0 || !StatFd(c.passed, &stx) ||
             makedev(stx.stx_dev_major, stx.stx_dev_minor) != mount_dev) {
    *error = EXDEV;
  } else if (!S_ISREG(stx.stx_mode)) {
    *error = EINVAL;
  } else if (!Writable(c.passed)) {
    *error = EBADF;
  }
  // Ours goes first, as in Map: the client's keeps the inode open.
  descriptors.Release(c.passed, c.uid);
  c.passed = -1;
  if (*error != 0) return 0;
  if (c.writable.size() < kMaxWritableNames) c.writable.insert(stx.stx_ino);
  return stx.stx_ino;
}

void Server::State::WriteOp(Connection& c) {
  const Request& r = c.request;
  int error = 0;
  const uint64_t ino = WriterFile(c, &error);
  if (r.op == kOpTrim) {
    if (error == 0) {
      Status st = fs->DirectTrim(ino);
      error = st.ok() ? 0 : st.code();
      if (st.ok() && options.attrs_changed) options.attrs_changed(ino);  // st_blocks
    }
    const ReplyHeader h{kMagic, kOpTrim, error, sizeof(ReplyHeader)};
    Send(c, &h, sizeof h);
    return;
  }
  MapReply reply{};
  reply.h = {kMagic, r.op, error, sizeof reply};
  if (error == 0) {
    Result<Filesystem::DirectMapping> m =
        r.op == kOpAllocate
            ? fs->DirectAllocate(ino, r.offset, r.length, r.limit, reply.runs, kMaxRuns)
            : fs->DirectCommit(ino, r.offset, r.length, r.seq, r.limit, reply.runs, kMaxRuns);
    if (!m.ok()) {
      reply.h.error = m.code();
    } else {
      FillReply(&reply, ino, *m);
      // A commit checked that the file is as it was when its runs were
      // given writable (a change of mode or owner moves the seq): it still
      // is, so its reply is too, without asking the core again.
      if (r.op == kOpCommit || MayWriteDirectly(ino)) reply.flags = kMapWritable;
      if (r.op == kOpCommit) Committed(ino, r.length > r.offset, *m, reply.runs);
      // The size moves without us from now on: the kernel asks for it
      // (Attr::size_moving) rather than keep what it has.
      if (m->append_opened && options.attrs_changed) options.attrs_changed(ino);
    }
  }
  Send(c, &reply, sizeof reply);
}

void Server::State::Times(Clock::time_point now) {
  next_times = now + std::chrono::milliseconds(kTimesMilliseconds);
  auto* header = reinterpret_cast<DirectTableHeader*>(table);
  if (fs->read_only() && header->write_state.load(std::memory_order_relaxed) == 0) {
    // Writers look at it inside every store; those inside one finish it.
    header->write_state.store(kDirectWritesStopped, std::memory_order_seq_cst);
  }
  DirectRun run;
  writers->TakeDirty([&](uint64_t page, uint64_t ino) {
    // Believed only for a file a connection of the page's process passed
    // a descriptor open for writing of: a process's page lists what it
    // likes.
    const bool given = std::any_of(connections.begin(), connections.end(), [&](const Connection& c) {
      return c.fd >= 0 && c.page == page && c.writable.count(ino) != 0;
    });
    if (!given) return;
    Result<Filesystem::DirectMapping> m = fs->DirectCommit(ino, 0, 0, 0, 0, &run, 1);
    if (!m.ok()) return;
    stale_attrs.insert(ino);
    // Appends by word folded: the kernel's size moves (a map through the
    // mount faults past it otherwise), within kTimesMilliseconds.
    if (m->append_folded && options.size_changed) {
      options.size_changed(ino, m->size, LastByte(ino, m->size));
    }
  });
  ForgetStaleAttrs();
}

void Server::State::ForgetStaleAttrs() {
  if (options.attrs_changed) {
    for (uint64_t ino : stale_attrs) options.attrs_changed(ino);
  }
  stale_attrs.clear();
}

void Server::State::Committed(uint64_t ino, bool stored, const Filesystem::DirectMapping& m,
                              const DirectRun* runs) {
  if (!stored) {
    // fsync, close: the writer's next stat must see the times, and a map
    // through the mount the size its appends by word made.
    if (m.append_folded && options.size_changed) {
      options.size_changed(ino, m.size, LastByte(ino, m.size));
    }
    if (options.attrs_changed) options.attrs_changed(ino);
    return;
  }
  if (options.size_changed) {
    // The last byte lies in the reply's first run when the end is not on a
    // block boundary (the runs start at the block holding it).
    const uint64_t end = m.size;
    uint8_t last = 0;
    if (end > m.start && m.run_count > 0 && runs[0].offset != kDirectHole &&
        end - 1 - m.start < runs[0].len) {
      const std::byte* at = fs->media().base() + runs[0].offset + (end - 1 - m.start);
      if (!RunFaultGuarded([&] { std::memcpy(&last, at, 1); })) last = 0;
    } else {
      last = LastByte(ino, end);
    }
    options.size_changed(ino, end, last);
  }
  // The times: within kTimesMilliseconds (Times), or at the writer's
  // fsync or close; one notification per second for a file appended to at
  // memory speed, not one per append.
  stale_attrs.insert(ino);
  if (stale_attrs.size() >= kMaxStaleAttrs) ForgetStaleAttrs();
}

void Server::State::Send(Connection& c, const void* reply, size_t size, int fd) {
  if (SendWithFd(c.fd, reply, size, fd, MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(size)) {
    c.done = true;
  }
}

void Server::State::Refuse(Connection& c, uint32_t op, int error) {
  const ReplyHeader h{kMagic, op, error, sizeof(ReplyHeader)};
  Send(c, &h, sizeof h);
  c.done = true;
}

void Server::State::Close(Connection& c, bool stopping) {
  descriptors.Release(c.passed, c.uid);
  c.passed = -1;
  if (!c.mapped.empty()) {
    if (!stopping && ProcessAlive(static_cast<uint64_t>(c.pid), c.start_time)) {
      // Closed by the process (exec, a raw close, close_range) or by us (a
      // protocol error) while it lives and may still map: held until the
      // prober finds it gone or mapping the namespace no more.
      maps->Orphan(c.id);
      Orphan o{c.id, c.uid, c.pid, c.start_time, {}};
      for (auto& [ino, fd] : c.mapped) o.fds.push_back(fd);
      orphans.push_back(std::move(o));
      next_orphan_check = Clock::now();  // looked at in this round
    } else {
      maps->Drop(c.id);
      for (auto& [ino, fd] : c.mapped) descriptors.Release(fd, c.uid);
    }
    c.mapped.clear();
  } else {
    maps->Drop(c.id);
  }
  if (c.fd < 0) return;
  descriptors.CloseConnection(c.fd, c.uid);
  c.fd = -1;
  auto it = users.find(c.uid);
  if (it != users.end() && --it->second.connections == 0) users.erase(it);
}

std::unique_ptr<Server> Server::Create(Filesystem& fs, dev_t mount_dev,
                                       const std::string& namespace_path,
                                       const ServerOptions& options, std::string* why,
                                       std::string* writes_why) {
  auto s = std::make_unique<State>();
  if (!daemon::RootAndNamespace(namespace_path, &s->namespace_stat, why)) return nullptr;
  if (options.writes) RemoveIdleWriterFiles();
  s->fs = &fs;
  s->options = options;
  s->mount_dev = mount_dev;
  s->namespace_has_acl = getxattr(namespace_path.c_str(), "system.posix_acl_access", nullptr, 0) > 0;
  s->socket_path = SocketPath(mount_dev);
  if (!s->descriptors.Start(s->namespace_stat, mount_dev, why)) return nullptr;
  // The table: a memfd sealed so that no one can write it after this but
  // through the mapping made here; clients get a read-only descriptor.
  s->table_bytes = size_t{kSlots} * sizeof(DirectSlot);
  s->table_fd = memfd_create("nvfs-direct-table", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s->table_fd < 0 || ftruncate(s->table_fd, static_cast<off_t>(s->table_bytes)) != 0) {
    *why = std::string("cannot make the slot table: ") + std::strerror(errno);
    return nullptr;
  }
  void* table = mmap(nullptr, s->table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->table_fd, 0);
  if (table == MAP_FAILED) {
    *why = std::string("cannot map the slot table: ") + std::strerror(errno);
    return nullptr;
  }
  s->table = static_cast<DirectSlot*>(table);
  auto* header = reinterpret_cast<DirectTableHeader*>(s->table);
  header->magic = kDirectTableMagic;
  header->version = kDirectTableVersion;
  header->slot_count = kSlots;
  if (fcntl(s->table_fd, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    *why = std::string("cannot seal the slot table: ") + std::strerror(errno);
    return nullptr;
  }
  const std::string self = "/proc/self/fd/" + std::to_string(s->table_fd);
  s->table_ro_fd = open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (s->table_ro_fd < 0) {
    *why = std::string("cannot reopen the slot table read-only: ") + std::strerror(errno);
    return nullptr;
  }

  // Anyone may connect; what they may do is the protocol's (protocol.hpp).
  if (!s->socket.Listen(s->socket_path, 0666, 128, SOCK_NONBLOCK,
                       /*descriptors_from_connect=*/false, why)) {
    return nullptr;
  }
  if (!s->socket.descriptors_gated()) {
    // Without it any local user could pass a descriptor whose close waits
    // for as long as that user wants.
    *why = "the kernel cannot refuse descriptors from clients (SO_PASSRIGHTS, Linux 6.16)";
    return nullptr;
  }
  fs.SetDirectTable(s->table, kSlots);
  s->maps_wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->maps_wake_fd < 0) {
    *why = std::string("cannot make an eventfd: ") + std::strerror(errno);
    return nullptr;
  }
  s->maps = std::make_unique<Maps>(s->table, kSlots, s->maps_wake_fd);
  s->prober->wake_fd = fcntl(s->maps_wake_fd, F_DUPFD_CLOEXEC, 0);
  if (s->prober->wake_fd < 0) {
    *why = std::string("cannot duplicate an eventfd: ") + std::strerror(errno);
    return nullptr;
  }
  fs.SetDirectWatch(&Maps::Changed, s->maps.get());
  s->writes_enabled = options.writes && !fs.read_only();
  if (!s->writes_enabled) *writes_why = fs.read_only() ? "the mount is read-only" : "cache=page";
  return std::unique_ptr<Server>(new Server(std::move(s)));
}

Server::Server(std::unique_ptr<State> state) : state_(std::move(state)) {}

Server::~Server() { Stop(); }

bool Server::Serve() {
  State* s = state_.get();
  return s->socket.Start(s->descriptors, [s] { s->Run(); });
}

void Server::Stop() {
  State* s = state_.get();
  s->socket.Join();
  for (Connection& c : s->connections) s->Close(c, /*stopping=*/true);
  s->connections.clear();
  for (Orphan& o : s->orphans) {
    s->maps->Drop(o.id);
    for (int fd : o.fds) s->descriptors.Release(fd, o.uid);
  }
  s->orphans.clear();
  s->socket.Stop();
}

const std::string& Server::socket_path() const { return state_->socket_path; }

bool Server::writes() const { return state_->writes_enabled; }

}  // namespace nvfs::direct
