// The direct-read server (server.hpp, protocol.hpp). One thread polls the
// listening socket and every connection; each request is read without
// blocking, answered at once, and never waited for: a client that sends
// half a request holds only its own buffer, one that does not read its
// replies is dropped, one that asks too fast is not polled until its
// tokens come back. The thread takes no lock of the daemon's but the core's
// inode lock (shared, in DirectMap), and touches the mount only through
// descriptors it was given: statx(AT_STATX_DONT_SYNC) asks the kernel's
// cache, not this daemon, and close() sends no FLUSH (open sets noflush)
// and only queues a RELEASE; so it never waits for the mount it serves.
#include "direct/server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <vector>

#include "daemon/socket_server.hpp"
#include "direct/protocol.hpp"
#include "nvfs/format.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::direct {

namespace {

using Clock = std::chrono::steady_clock;

struct Connection {
  int fd = -1;
  uid_t uid = 0;
  bool proven = false;
  size_t have = 0;  // bytes of `request` received so far
  Request request{};
  int passed = -1;  // the descriptor that came with the request, if any
  bool bad = false;  // a second descriptor, or ancillary data of another kind
  double tokens = kRequestBurst;
  Clock::time_point refilled = Clock::now();
  bool done = false;  // to be closed
};

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
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

}  // namespace

struct Server::State {
  Filesystem* fs = nullptr;
  dev_t mount_dev = 0;
  std::string socket_path;
  std::string namespace_path;
  struct stat namespace_stat {};
  uint64_t namespace_size = 0;
  DirectSlot* table = nullptr;
  size_t table_bytes = 0;
  int table_fd = -1;     // the memfd, sealed against writes but through `table`
  int table_ro_fd = -1;  // what clients get: the same, opened read-only
  daemon::SocketServer socket;  // the listening socket, its thread
  std::vector<Connection> connections;
  std::map<uid_t, unsigned> per_uid;

  ~State() {
    if (table != nullptr) munmap(table, table_bytes);
    CloseFd(table_fd);
    CloseFd(table_ro_fd);
  }

  void Run();
  void Accept();
  void Receive(Connection& c);
  void Handle(Connection& c);
  void Hello(Connection& c);
  void Prove(Connection& c);
  void Map(Connection& c);
  // Sends the whole reply at once, or drops the connection (a client that
  // does not read its replies fills its socket; nothing is queued for it).
  void Send(Connection& c, const void* reply, size_t size, int fd = -1);
  // One reply with `error`, then the connection is closed.
  void Refuse(Connection& c, uint32_t op, int error);
  void Close(Connection& c);
};

namespace {

void Refill(Connection& c, Clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - c.refilled).count();
  c.tokens = std::min<double>(kRequestBurst, c.tokens + seconds * kRequestsPerSecond);
  c.refilled = now;
}

}  // namespace

void Server::State::Run() {
  std::vector<pollfd> fds;
  std::vector<size_t> which;  // connection of each pollfd past the first two
  for (;;) {
    fds.assign({{socket.wake_fd(), POLLIN, 0}, {socket.listen_fd(), POLLIN, 0}});
    which.clear();
    int timeout = -1;
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      Refill(c, now);
      if (c.tokens >= 1) {
        fds.push_back({c.fd, POLLIN, 0});
        which.push_back(i);
      } else {  // out of tokens: not heard until one is back
        const int ms = static_cast<int>((1 - c.tokens) * 1000 / kRequestsPerSecond) + 1;
        timeout = timeout < 0 ? ms : std::min(timeout, ms);
      }
    }
    if (poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      return;  // cannot happen with valid descriptors; the mount goes on
    }
    if (fds[0].revents != 0) return;
    for (size_t k = 2; k < fds.size(); ++k) {
      if (fds[k].revents != 0) Receive(connections[which[k - 2]]);
    }
    if (fds[1].revents & POLLIN) Accept();
    for (Connection& c : connections) {
      if (c.done) Close(c);
    }
    std::erase_if(connections, [](const Connection& c) { return c.fd < 0; });
  }
}

void Server::State::Accept() {
  for (int n = 0; n < 64; ++n) {  // a bounded batch; the rest at the next poll
    const int fd = accept4(socket.listen_fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      close(fd);
      continue;
    }
    Connection c;
    c.fd = fd;
    c.uid = cred.uid;
    if (connections.size() >= kMaxConnections || per_uid[cred.uid] >= kMaxConnectionsPerUid) {
      Refuse(c, 0, EUSERS);
      close(fd);
      continue;
    }
    ++per_uid[cred.uid];
    connections.push_back(c);
  }
}

void Server::State::Receive(Connection& c) {
  for (int n = 0; n < 16 && !c.done && c.tokens >= 1; ++n) {
    const ssize_t got =
        ReceiveWithFd<4>(c.fd, reinterpret_cast<char*>(&c.request) + c.have,
                         sizeof(Request) - c.have, MSG_DONTWAIT, &c.passed, &c.bad);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (got <= 0) {
      c.done = true;
      return;
    }
    c.have += static_cast<size_t>(got);
    if (c.have < sizeof(Request)) continue;
    c.tokens -= 1;
    Handle(c);
    CloseFd(c.passed);
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
      if (!c.proven) {
        Refuse(c, r.op, EACCES);
        return;
      }
      Map(c);
      return;
    default:
      Refuse(c, r.op, EPROTO);
  }
}

void Server::State::Hello(Connection& c) {
  if (c.passed >= 0) {
    Refuse(c, kOpHello, EPROTO);
    return;
  }
  HelloReply reply{};
  reply.h = {kMagic, kOpHello, 0, sizeof reply};
  reply.namespace_size = namespace_size;
  reply.path_len = static_cast<uint32_t>(std::min(namespace_path.size(), sizeof reply.path));
  std::memcpy(reply.path, namespace_path.data(), reply.path_len);
  Send(c, &reply, sizeof reply);
}

// The proof: a descriptor of this very namespace, open for reading, that
// the client had (it opened it, or was given it by someone who could).
void Server::State::Prove(Connection& c) {
  struct statx stx {};
  bool same = c.passed >= 0 && StatFd(c.passed, &stx) && Readable(c.passed) &&
              (stx.stx_mode & S_IFMT) == (namespace_stat.st_mode & S_IFMT);
  if (same && S_ISCHR(namespace_stat.st_mode)) {
    same = makedev(stx.stx_rdev_major, stx.stx_rdev_minor) == namespace_stat.st_rdev;
  } else if (same) {
    same = makedev(stx.stx_dev_major, stx.stx_dev_minor) == namespace_stat.st_dev &&
           stx.stx_ino == namespace_stat.st_ino;
  }
  if (!same) {
    Refuse(c, kOpProve, EACCES);
    return;
  }
  c.proven = true;
  const std::byte* base = fs->media().base();
  ProveReply reply{};
  reply.h = {kMagic, kOpProve, 0, sizeof reply};
  reply.namespace_size = namespace_size;
  std::memcpy(&reply.mount_count,
              base + format::kSuperDynamicOffset + offsetof(format::SuperDynamic, mount_count),
              sizeof reply.mount_count);
  std::memcpy(reply.uuid, base + offsetof(format::SuperStatic, uuid), sizeof reply.uuid);
  reply.slot_count = kSlots;
  reply.table_bytes = table_bytes;
  Send(c, &reply, sizeof reply, table_ro_fd);
}

// A file of this mount, open for reading: the kernel checked the caller's
// permission at that open. Its inode number is the mount's st_ino.
void Server::State::Map(Connection& c) {
  MapReply reply{};
  reply.h = {kMagic, kOpMap, 0, sizeof reply};
  struct statx stx {};
  if (c.passed < 0 || !StatFd(c.passed, &stx) ||
      makedev(stx.stx_dev_major, stx.stx_dev_minor) != mount_dev) {
    reply.h.error = EXDEV;
  } else if (!S_ISREG(stx.stx_mode)) {
    reply.h.error = EINVAL;
  } else if (!Readable(c.passed)) {
    reply.h.error = EBADF;
  } else {
    // The inode stays open (the client's descriptor) while DirectMap runs
    // only if the client keeps it; ours goes first, so that a last close
    // here never runs under the core's locks. DirectMap refuses an inode
    // no one has open (EBADF).
    CloseFd(c.passed);
    Result<Filesystem::DirectMapping> m =
        fs->DirectMap(stx.stx_ino, c.request.offset, reply.runs, kMaxRuns);
    if (!m.ok()) {
      reply.h.error = m.code();
    } else {
      reply.ino = stx.stx_ino;
      reply.seq = m->seq;
      reply.size = m->size;
      reply.start = m->start;
      reply.slot = m->slot;
      reply.run_count = static_cast<uint32_t>(m->run_count);
    }
  }
  Send(c, &reply, sizeof reply);
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

void Server::State::Close(Connection& c) {
  CloseFd(c.passed);
  if (c.fd >= 0) {
    close(c.fd);
    c.fd = -1;
    if (--per_uid[c.uid] == 0) per_uid.erase(c.uid);
  }
}

std::unique_ptr<Server> Server::Create(Filesystem& fs, dev_t mount_dev,
                                       const std::string& namespace_path, std::string* why) {
  auto s = std::make_unique<State>();
  if (!daemon::RootAndNamespace(namespace_path, &s->namespace_stat, why)) return nullptr;
  s->fs = &fs;
  s->mount_dev = mount_dev;
  s->namespace_path = namespace_path;
  s->namespace_size = fs.media().size();
  s->socket_path = SocketPath(mount_dev);
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
  if (!s->socket.Listen(s->socket_path, 0666, 128, SOCK_NONBLOCK, why)) return nullptr;
  fs.SetDirectTable(s->table, kSlots);
  return std::unique_ptr<Server>(new Server(std::move(s)));
}

Server::Server(std::unique_ptr<State> state) : state_(std::move(state)) {}

Server::~Server() { Stop(); }

bool Server::Serve() {
  State* s = state_.get();
  return s->socket.Start([s] { s->Run(); });
}

void Server::Stop() {
  State* s = state_.get();
  s->socket.Join();
  for (Connection& c : s->connections) s->Close(c);
  s->connections.clear();
  s->socket.Stop();
}

const std::string& Server::socket_path() const { return state_->socket_path; }

}  // namespace nvfs::direct
