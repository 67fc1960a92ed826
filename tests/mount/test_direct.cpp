// Direct reads through a real mount (issue 20): the daemon's socket and its
// hardening, spoken to byte by byte (no client library), and the slot table
// it keeps current. The library's own cases through a mount are in
// test_direct_lib.cpp. Also the daemon's other socket, the control socket
// (nvfs-resize of a mounted filesystem), spoken to the same way.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/select.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "direct/protocol.hpp"
#include "mount_fixture.hpp"
#include "nvfs/control.hpp"
#include "nvfs/format.hpp"

using namespace nvfs;
using namespace nvfs::direct;
using nvfs::test::MountedFs;

namespace {

// The socket of the mount at `dir`.
std::string SocketOf(const std::string& dir) {
  struct stat st;
  REQUIRE(stat(dir.c_str(), &st) == 0);
  return SocketPath(st.st_dev);
}

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};  // no test waits forever for a reply
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends `size` bytes with descriptors `fds`.
bool SendRaw(int sock, const void* data, size_t size, std::vector<int> fds = {}) {
  iovec iov{const_cast<void*>(data), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (fds.empty() ? 1 : fds.size())));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(size);
}

bool SendRequest(int sock, uint32_t op, int fd = -1, uint64_t offset = 0) {
  Request r{kMagic, kVersion, op, 0, offset, 0};
  return SendRaw(sock, &r, sizeof r, fd >= 0 ? std::vector<int>{fd} : std::vector<int>{});
}

// Receives one reply of at most `size` bytes (a whole message: replies are
// sent in one piece); the descriptor that came with it in *fd. Returns the
// bytes received, 0 at EOF, -1 on error or timeout.
ssize_t Receive(int sock, void* reply, size_t size, int* fd = nullptr) {
  size_t have = 0;
  if (fd != nullptr) *fd = -1;
  while (have < size) {
    iovec iov{static_cast<char*>(reply) + have, size - have};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) return have > 0 ? static_cast<ssize_t>(have) : n;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_type == SCM_RIGHTS && fd != nullptr) std::memcpy(fd, CMSG_DATA(cm), sizeof(int));
    }
    have += static_cast<size_t>(n);
    const auto* h = static_cast<const ReplyHeader*>(reply);
    if (have >= sizeof(ReplyHeader) && have >= h->size) break;
  }
  return static_cast<ssize_t>(have);
}

// True once the peer has closed the connection (EOF), within 5 s.
bool Disconnected(int sock) {
  char byte;
  return recv(sock, &byte, 1, 0) == 0;
}

// A hello on `sock`, answered: from then on a peer who may read the
// namespace may pass descriptors on it.
void Hello(int sock) {
  REQUIRE(SendRequest(sock, kOpHello));
  ReplyHeader h{};
  REQUIRE(Receive(sock, &h, sizeof h) == static_cast<ssize_t>(sizeof h));
  REQUIRE(h.error == 0);
}

// The next reply on `sock` is the error `error`, and then the daemon closes
// the connection.
void RequireErrorThenClosed(int sock, int error) {
  ReplyHeader h{};
  REQUIRE(Receive(sock, &h, sizeof h) == sizeof h);
  CHECK(h.error == error);
  CHECK(Disconnected(sock));
}

// On a new connection to the socket `path`: `op` (with the descriptor `fd`,
// if any) is answered with EACCES, then the connection closed.
void RequireRefusedThenClosed(const std::string& path, uint32_t op, int fd = -1) {
  const int sock = Connect(path);
  if (fd >= 0) Hello(sock);
  REQUIRE(SendRequest(sock, op, fd));
  RequireErrorThenClosed(sock, EACCES);
  close(sock);
}

// A proven session: the socket, the table's descriptor.
struct Session {
  int sock = -1;
  int table_fd = -1;
  ProveReply prove{};
  ~Session() {
    if (sock >= 0) close(sock);
    if (table_fd >= 0) close(table_fd);
  }
};

void Prove(const MountedFs& m, Session* s) {
  s->sock = Connect(SocketOf(m.dir()));
  REQUIRE(s->sock >= 0);
  Hello(s->sock);
  const int ns = open(m.image().c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(ns >= 0);
  REQUIRE(SendRequest(s->sock, kOpProve, ns));
  close(ns);
  REQUIRE(Receive(s->sock, &s->prove, sizeof s->prove, &s->table_fd) ==
          static_cast<ssize_t>(sizeof s->prove));
  REQUIRE(s->prove.h.error == 0);
  REQUIRE(s->table_fd >= 0);
}

MapReply MapFile(int sock, int fd, uint64_t offset = 0, uint32_t flags = 0) {
  MapReply reply{};
  Request r{kMagic, kVersion, kOpMap, flags, offset, 0};
  REQUIRE(SendRaw(sock, &r, sizeof r, std::vector<int>{fd}));
  REQUIRE(Receive(sock, &reply, sizeof reply) == static_cast<ssize_t>(sizeof reply));
  return reply;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  close(fd);
}

// Reads the file's bytes the way a client does: from its own mapping of
// the namespace, through the runs.
std::string ReadThroughRuns(const std::byte* ns, const MapReply& r) {
  std::string out;
  for (uint32_t i = 0; i < r.run_count && out.size() < r.size; ++i) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(r.runs[i].len, r.size - out.size()));
    if (r.runs[i].offset == kDirectHole) {
      out.append(n, '\0');
    } else {
      out.append(reinterpret_cast<const char*>(ns + r.runs[i].offset), n);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("direct: the socket, its mode, and direct=off", "[mount][direct]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  const std::string path = SocketOf(m.dir());
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0666);
  const ino_t socket_ino = st.st_ino;
  const timespec socket_ctime = st.st_ctim;
  CHECK(m.log().find("direct reads on " + path) != std::string::npos);
  REQUIRE(stat(kSocketDir, &st) == 0);
  CHECK(st.st_uid == 0);
  CHECK((st.st_mode & 022) == 0);
  REQUIRE(m.Stop() == 0);
  // Removed at unmount. The path names the device number, which the next
  // FUSE mount (another suite's, beside this one) may take at once and bind
  // a socket of its own there: ours is gone if the path is, or is another.
  struct stat after;
  // (By inode and change time: on ext4 a new socket may get the number of
  // our freed inode at once.)
  CHECK((stat(path.c_str(), &after) != 0 || after.st_ino != socket_ino ||
         after.st_ctim.tv_sec != socket_ctime.tv_sec ||
         after.st_ctim.tv_nsec != socket_ctime.tv_nsec));

  m.Start("direct=off");
  // Nothing serves the mount's socket path. (A file may be there: a daemon
  // killed with -9 leaves its socket, and a later mount, this one, may get
  // its device number; connecting to it is refused.)
  const int sock = Connect(SocketOf(m.dir()));
  CHECK(sock < 0);
  if (sock >= 0) close(sock);
  CHECK(m.log().find("direct reads off") != std::string::npos);
  REQUIRE(m.Stop() == 0);
}

TEST_CASE("direct: hello, proof, runs and the shared table", "[mount][direct]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  const int sock = Connect(SocketOf(m.dir()));
  REQUIRE(sock >= 0);
  REQUIRE(SendRequest(sock, kOpHello));
  // Nothing about the namespace before the proof: a header, no more.
  ReplyHeader hello{};
  char more;
  REQUIRE(Receive(sock, &hello, sizeof hello) == static_cast<ssize_t>(sizeof hello));
  CHECK(hello.error == 0);
  CHECK(hello.size == sizeof hello);
  CHECK(recv(sock, &more, 1, MSG_DONTWAIT) < 0);
  close(sock);

  Session s;
  Prove(m, &s);
  CHECK(s.prove.slot_count >= 2);
  CHECK(s.prove.table_bytes == uint64_t{s.prove.slot_count} * sizeof(DirectSlot));
  // The table is read-only to clients: no writable mapping, no write.
  CHECK(mmap(nullptr, s.prove.table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.table_fd, 0) ==
        MAP_FAILED);
  const char zero = 0;
  CHECK(pwrite(s.table_fd, &zero, 1, 0) < 0);
  const std::string self = "/proc/self/fd/" + std::to_string(s.table_fd);
  const int rw = open(self.c_str(), O_RDWR);
  if (rw >= 0) {  // reopened writable: the seals still refuse
    CHECK(pwrite(rw, &zero, 1, 0) < 0);
    CHECK(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) == MAP_FAILED);
    close(rw);
  }
  auto* table = static_cast<const DirectSlot*>(
      mmap(nullptr, s.prove.table_bytes, PROT_READ, MAP_SHARED, s.table_fd, 0));
  REQUIRE(table != MAP_FAILED);
  CHECK(mprotect(const_cast<DirectSlot*>(table), 4096, PROT_READ | PROT_WRITE) != 0);
  const auto* header = reinterpret_cast<const DirectTableHeader*>(table);
  CHECK(header->magic == kDirectTableMagic);
  CHECK(header->slot_count == s.prove.slot_count);
  const int nsfd = open(m.image().c_str(), O_RDONLY);
  REQUIRE(nsfd >= 0);
  auto* ns = static_cast<const std::byte*>(
      mmap(nullptr, s.prove.namespace_size, PROT_READ, MAP_SHARED, nsfd, 0));
  close(nsfd);
  REQUIRE(ns != MAP_FAILED);
  uint64_t mount_count;
  std::memcpy(&mount_count,
              ns + format::kSuperDynamicOffset + offsetof(format::SuperDynamic, mount_count), 8);
  CHECK(mount_count == s.prove.mount_count);
  CHECK(std::memcmp(ns + offsetof(format::SuperStatic, uuid), s.prove.uuid, 16) == 0);

  // A file with a hole: its runs read from the client's own mapping give
  // its bytes.
  std::string bytes(100000, 'a');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>('a' + i % 23);
  std::fill(bytes.begin() + 8192, bytes.begin() + 40960, '\0');
  {
    const int fd = open(m.path("f").c_str(), O_WRONLY | O_CREAT, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(pwrite(fd, bytes.data(), 8192, 0) == 8192);
    REQUIRE(pwrite(fd, bytes.data() + 40960, bytes.size() - 40960, 40960) ==
            static_cast<ssize_t>(bytes.size() - 40960));
    close(fd);
  }
  const int fd = open(m.path("f").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  MapReply r = MapFile(s.sock, fd);
  REQUIRE(r.h.error == 0);
  CHECK(r.size == bytes.size());
  CHECK(r.start == 0);
  CHECK(r.slot >= 1);
  CHECK(r.slot < s.prove.slot_count);
  CHECK(r.seq % 2 == 0);
  bool hole = false;
  for (uint32_t i = 0; i < r.run_count; ++i) hole = hole || r.runs[i].offset == kDirectHole;
  CHECK(hole);
  CHECK(ReadThroughRuns(ns, r) == bytes);
  const DirectSlot& slot = table[r.slot];
  CHECK(slot.seq.load() == r.seq);
  CHECK(slot.size.load() == bytes.size());
  struct stat fst;
  REQUIRE(fstat(fd, &fst) == 0);
  CHECK(slot.ino.load() == fst.st_ino);
  CHECK(r.ino == fst.st_ino);

  // An overwrite in place leaves the slot; a truncate moves it, and the new
  // runs say the new size.
  {
    const int w = open(m.path("f").c_str(), O_WRONLY);
    REQUIRE(w >= 0);
    REQUIRE(pwrite(w, "XYZ", 3, 10) == 3);
    CHECK(slot.seq.load() == r.seq);
    REQUIRE(ftruncate(w, 5000) == 0);
    close(w);
  }
  CHECK(slot.seq.load() > r.seq);
  CHECK(slot.seq.load() % 2 == 0);
  CHECK(slot.size.load() == 5000);
  MapReply r2 = MapFile(s.sock, fd);
  REQUIRE(r2.h.error == 0);
  CHECK(r2.slot == r.slot);
  CHECK(r2.seq == slot.seq.load());
  CHECK(r2.size == 5000);
  std::string expect = bytes.substr(0, 5000);
  expect.replace(10, 3, "XYZ");
  CHECK(ReadThroughRuns(ns, r2) == expect);
  // Runs from an offset start at its block.
  MapReply r3 = MapFile(s.sock, fd, 4100);
  REQUIRE(r3.h.error == 0);
  CHECK(r3.start == 4096);

  // When the inode leaves the cache, its slot moves by 2 and is freed.
  const uint64_t before = slot.seq.load();
  close(fd);
  REQUIRE(unlink(m.path("f").c_str()) == 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (slot.ino.load() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(slot.ino.load() == 0);
  CHECK(slot.seq.load() > before);
  CHECK(slot.seq.load() % 2 == 0);
  munmap(const_cast<std::byte*>(ns), s.prove.namespace_size);
  munmap(const_cast<DirectSlot*>(table), s.prove.table_bytes);
  REQUIRE(m.Stop() == 0);
}

// A descriptor open for writing only (as cp, dd and NFS servers open
// files) is mapped for a writer alone: a connection proven for reading
// cannot use one, and a connection proven for writing only with
// kMapForWrite (src/daemon/direct_server.cpp, Map). O_APPEND stays the
// kernel's.
TEST_CASE("direct: a write-only descriptor is mapped only for a writer, and only for writing",
          "[mount][direct]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  WriteFile(m.path("f"), std::string(10000, 'w'));
  Session s;
  Prove(m, &s);
  const int wronly = open(m.path("f").c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(wronly >= 0);
  const int append = open(m.path("f").c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  REQUIRE(append >= 0);
  const int rdonly = open(m.path("f").c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(rdonly >= 0);

  // Proven for reading: a write-only descriptor is refused, with or
  // without the flag; a readable one is served, and not as writable.
  CHECK(MapFile(s.sock, wronly).h.error == EBADF);
  CHECK(MapFile(s.sock, wronly, 0, kMapForWrite).h.error == EBADF);
  MapReply readable = MapFile(s.sock, rdonly, 0, kMapForWrite);
  CHECK(readable.h.error == 0);
  CHECK((readable.flags & kMapWritable) == 0);

  // Proven for writing: the flag is what lets a write-only descriptor in.
  const int ns = open(m.image().c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(ns >= 0);
  REQUIRE(SendRequest(s.sock, kOpWriteProve, ns));
  close(ns);
  WriteProveReply wp{};
  int writers_fd = -1;
  REQUIRE(Receive(s.sock, &wp, sizeof wp, &writers_fd) == static_cast<ssize_t>(sizeof wp));
  REQUIRE(wp.h.error == 0);
  if (writers_fd >= 0) close(writers_fd);
  CHECK(MapFile(s.sock, wronly).h.error == EBADF);
  MapReply written = MapFile(s.sock, wronly, 0, kMapForWrite);
  CHECK(written.h.error == 0);
  CHECK((written.flags & kMapWritable) != 0);
  CHECK(written.size == 10000);
  CHECK(MapFile(s.sock, append, 0, kMapForWrite).h.error == EBADF);
  // The connection still serves (an error for a request, not the end).
  CHECK(MapFile(s.sock, rdonly).h.error == 0);
  close(rdonly);
  close(append);
  close(wronly);
  REQUIRE(m.Stop() == 0);
}

TEST_CASE("direct: no proof, no session; refusals keep the mount serving", "[mount][direct]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start("allow_other");  // the file modes alone refuse (the last section)
  WriteFile(m.path("f"), "hello");
  const std::string path = SocketOf(m.dir());
  const int file = open(m.path("f").c_str(), O_RDONLY);
  REQUIRE(file >= 0);

  SECTION("a map before the proof is answered once, then the connection closed") {
    RequireRefusedThenClosed(path, kOpMap, file);
  }
  SECTION("a proof with another file, or the namespace opened write-only, is refused") {
    for (int bad : {file, open(m.image().c_str(), O_WRONLY), open(m.image().c_str(), O_PATH)}) {
      REQUIRE(bad >= 0);
      RequireRefusedThenClosed(path, kOpProve, bad);
      if (bad != file) close(bad);
    }
  }
  SECTION("a proof without a descriptor is refused") {
    RequireRefusedThenClosed(path, kOpProve);
  }
  SECTION("malformed messages: an error, then the connection closed") {
    Request wrong_magic{0x1234, kVersion, kOpHello, 0, 0, 0};
    Request wrong_version{kMagic, 99, kOpHello, 0, 0, 0};
    Request wrong_op{kMagic, kVersion, 77, 0, 0, 0};
    for (const Request& r : {wrong_magic, wrong_version, wrong_op}) {
      const int sock = Connect(path);
      REQUIRE(SendRaw(sock, &r, sizeof r));
      RequireErrorThenClosed(sock, EPROTO);
      close(sock);
    }
    // Two descriptors with one request.
    Session s;
    Prove(m, &s);
    Request r{kMagic, kVersion, kOpMap, 0, 0, 0};
    REQUIRE(SendRaw(s.sock, &r, sizeof r, {file, file}));
    RequireErrorThenClosed(s.sock, EPROTO);
    // Half a request, then the client goes.
    const int sock = Connect(path);
    REQUIRE(SendRaw(sock, &r, 7));
    close(sock);
  }
  SECTION("a proven client: a write-only descriptor, a directory, a file elsewhere") {
    Session s;
    Prove(m, &s);
    const int wo = open(m.path("f").c_str(), O_WRONLY);
    REQUIRE(wo >= 0);
    CHECK(MapFile(s.sock, wo).h.error == EBADF);
    close(wo);
    const int dir = open(m.dir().c_str(), O_RDONLY | O_DIRECTORY);
    CHECK(MapFile(s.sock, dir).h.error == EINVAL);
    close(dir);
    const int other = open("/proc/self/exe", O_RDONLY);
    CHECK(MapFile(s.sock, other).h.error == EXDEV);
    close(other);
    // ...and the session goes on serving.
    CHECK(MapFile(s.sock, file).h.error == 0);
  }
  SECTION("one user's connections are bounded") {
    std::vector<int> socks;
    int refused = 0;
    for (unsigned i = 0; i < kMaxConnectionsPerUid + 4; ++i) {
      const int sock = Connect(path);
      REQUIRE(sock >= 0);
      socks.push_back(sock);
    }
    // The server sees each in turn: the first kMaxConnectionsPerUid are
    // served (a hello each), the rest refused with EUSERS.
    for (int sock : socks) {
      if (!SendRequest(sock, kOpHello)) {
        ++refused;
        continue;
      }
      ReplyHeader reply{};
      const ssize_t n = Receive(sock, &reply, sizeof reply);
      if (n == static_cast<ssize_t>(sizeof reply) && reply.error == EUSERS) ++refused;
    }
    CHECK(refused == 4);
    for (int sock : socks) close(sock);
  }
  SECTION("a user who cannot read the namespace gets no session") {
    struct stat st;
    REQUIRE(stat(m.image().c_str(), &st) == 0);
    REQUIRE((st.st_mode & 0007) == 0);  // the image is no one else's to read
    REQUIRE(chmod(m.path("f").c_str(), 0644) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (!nvfs::test::BecomeNobody()) _exit(10);
      if (open(m.image().c_str(), O_RDONLY) >= 0) _exit(11);
      const int sock = Connect(path);
      if (sock < 0) _exit(12);
      // The file is readable to it, through the mount: still no runs.
      const int f = open(m.path("f").c_str(), O_RDONLY);
      if (f < 0) _exit(13);
      // Its descriptor is refused by the kernel: the daemon takes none
      // from a user who could not open the namespace.
      Request r{kMagic, kVersion, kOpMap, 0, 0, 0};
      if (SendRaw(sock, &r, sizeof r, {f}) || errno != EPERM) _exit(14);
      // Without one, before a proof: refused, and the connection closed.
      if (!SendRaw(sock, &r, sizeof r)) _exit(18);
      ReplyHeader h{};
      if (Receive(sock, &h, sizeof h) != sizeof h || h.error != EACCES) _exit(15);
      if (!Disconnected(sock)) _exit(16);
      char buf[8] = {};
      if (pread(f, buf, sizeof buf, 0) != 5 || std::memcmp(buf, "hello", 5) != 0) _exit(17);
      _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // Whatever came before, the mount serves.
  char buf[8] = {};
  CHECK(pread(file, buf, sizeof buf, 0) == 5);
  CHECK(std::string(buf, 5) == "hello");
  close(file);
  REQUIRE(m.Stop() == 0);
}

// The control socket (include/nvfs/control.hpp) shares the direct socket's
// skeleton and descriptor passing (src/daemon/socket_server.cpp,
// src/util/fd_passing.hpp): root's alone, and no grow without a descriptor
// of the very namespace open for reading and writing.
TEST_CASE("control: the socket is root's alone and grows only for the namespace opened read-write",
          "[mount][control]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the control socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  struct stat mnt;
  REQUIRE(stat(m.dir().c_str(), &mnt) == 0);
  const std::string path = control::SocketPath(mnt.st_dev);
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_uid == 0);
  const ino_t socket_ino = st.st_ino;
  const timespec socket_ctime = st.st_ctim;

  // One request, one reply, then the daemon closes the connection.
  const auto ask = [&](const void* request, size_t size, const std::vector<int>& fds) {
    const int sock = Connect(path);
    REQUIRE(sock >= 0);
    REQUIRE(SendRaw(sock, request, size, fds));
    control::Reply reply{};
    size_t got = 0;
    while (got < sizeof reply) {
      const ssize_t n = read(sock, reinterpret_cast<char*>(&reply) + got, sizeof reply - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    close(sock);
    REQUIRE(got == sizeof reply);
    CHECK(reply.magic == control::kMagic);
    return reply;
  };
  const uint64_t old_size = 64ull << 20, new_size = 128ull << 20;
  const control::Request grow{control::kMagic, control::kVersion, control::kOpGrow, 0, new_size};
  const int rw = open(m.image().c_str(), O_RDWR | O_CLOEXEC);
  const int ro = open(m.image().c_str(), O_RDONLY | O_CLOEXEC);
  const int other = open("/dev/null", O_RDWR | O_CLOEXEC);
  REQUIRE(rw >= 0);
  REQUIRE(ro >= 0);
  REQUIRE(other >= 0);
  CHECK(ask(&grow, sizeof grow, {}).error == EPERM);       // no proof
  CHECK(ask(&grow, sizeof grow, {ro}).error == EPERM);     // not open for writing
  CHECK(ask(&grow, sizeof grow, {other}).error == EPERM);  // not the namespace
  CHECK(ask(&grow, sizeof grow - 8, {rw}).error == EPROTO);  // short
  control::Request wrong = grow;
  wrong.op = 9;
  CHECK(ask(&wrong, sizeof wrong, {rw}).error == EPROTO);
  wrong = grow;
  wrong.magic = 0;
  CHECK(ask(&wrong, sizeof wrong, {rw}).error == EPROTO);
  // Two descriptors in one message: refused (EPROTO since the servers share
  // one receive; EPERM, "no descriptor", before).
  CHECK(ask(&grow, sizeof grow, {rw, rw}).error != 0);
  REQUIRE(stat(m.image().c_str(), &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_size) == old_size);  // nothing grew

  const control::Reply grown = ask(&grow, sizeof grow, {rw});
  CHECK(grown.error == 0);
  CHECK(grown.new_blocks > grown.old_blocks);
  REQUIRE(stat(m.image().c_str(), &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_size) == new_size);
  close(rw);
  close(ro);
  close(other);
  REQUIRE(m.Stop() == 0);
  // Removed at unmount. The path names the device number, which the next
  // FUSE mount (another suite's, beside this one) may take at once and bind
  // a socket of its own there: ours is gone if the path is, or is another.
  struct stat after;
  // (By inode and change time: on ext4 a new socket may get the number of
  // our freed inode at once.)
  CHECK((stat(path.c_str(), &after) != 0 || after.st_ino != socket_ino ||
         after.st_ctim.tv_sec != socket_ctime.tv_sec ||
         after.st_ctim.tv_nsec != socket_ctime.tv_nsec));
  CHECK(nvfs::test::FsckImage(m.image()).exit_code == 0);
}

namespace {

// In a child (no REQUIRE): a connection to the socket `path`, -1 if none.
int ConnectRaw(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  return fd;
}

// A loopback TCP socket whose last close lingers (SO_LINGER, 300 s) on
// bytes its peer never reads; the peer (never read) in *peer. -1 if the
// machine will not make one.
int LingeringSocket(int* peer) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return -1;
  }
  const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  *peer = accept(listener, nullptr, nullptr);
  close(listener);
  const linger lg{1, 300};
  if (*peer < 0 || setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) != 0) return -1;
  fcntl(s, F_SETFL, O_NONBLOCK);
  static char bytes[65536];
  while (write(s, bytes, sizeof bytes) > 0) {
  }
  return s;
}

// Processes a test starts, killed (SIGKILL, by PID) and reaped at the end
// whatever happened; a FUSE mount of theirs unmounted.
struct Children {
  std::vector<pid_t> pids;
  std::string fuse_dir;
  ~Children() {
    for (pid_t pid : pids) kill(pid, SIGKILL);
    for (pid_t pid : pids) waitpid(pid, nullptr, 0);
    if (!fuse_dir.empty()) {
      (void)nvfs::test::RunProgram({"umount", "-l", fuse_dir});
      rmdir(fuse_dir.c_str());
    }
  }
};

// What a child that attacked reports on its pipe: the errno of its
// sendmsg of the descriptor (0: the daemon's socket took it).
int AttackResult(int pipe_fd) {
  timeval tv{10, 0};
  fd_set set;
  FD_ZERO(&set);
  FD_SET(pipe_fd, &set);
  int result = -1;
  if (select(pipe_fd + 1, &set, nullptr, nullptr, &tv) == 1 &&
      read(pipe_fd, &result, sizeof result) != sizeof result) {
    result = -1;
  }
  return result;
}

// In a child, as nobody: sends the daemon's socket a proof carrying `fd` (a descriptor whose close can wait), closes its own
// copy unless `keep`, writes the sendmsg's errno to `report` and stays
// (holding what it made) until killed.
[[noreturn]] void PassAndStay(const std::string& socket_path, int fd, int report, bool keep) {
  int result = 1000;
  const int sock = ConnectRaw(socket_path);
  if (sock >= 0) {
    // At once, as the first message: a daemon that takes the descriptor
    // closes it whatever it makes of the request.
    const Request prove{kMagic, kVersion, kOpProve, 0, 0, 0};
    result = SendWithFd(sock, &prove, sizeof prove, fd, MSG_NOSIGNAL) >= 0 ? 0 : errno;
  }
  (void)!write(report, &result, sizeof result);
  // (A close of the last copy of a lingering socket waits here: after the
  // report.)
  if (!keep) close(fd);
  for (;;) pause();
}

}  // namespace

// A local user passed the daemon a descriptor whose close waits (for as
// long as that user wants), and the direct thread closed it: every other
// client's first read stalled, and after umount the daemon never exited, so
// the image could not be mounted again.
TEST_CASE("direct: no client can make the daemon wait on a descriptor it passes",
          "[mount][direct][stall]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  Children children;  // destroyed first: the daemon is never left waiting on them
  m.Start();
  WriteFile(m.path("f"), "bytes of f");
  const std::string path = SocketOf(m.dir());
  int report[2];
  REQUIRE(pipe2(report, O_CLOEXEC) == 0);

  SECTION("a socket that lingers on close") {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (!nvfs::test::BecomeNobody()) _exit(10);
      int peer = -1;
      const int s = LingeringSocket(&peer);
      if (s < 0) _exit(11);
      // Its own copy closed at once: the daemon's would be the last.
      PassAndStay(path, s, report[1], /*keep=*/false);
    }
    children.pids.push_back(pid);
  }
  SECTION("a file whose FLUSH is never answered") {
    const char* stall = std::getenv("NVFS_STALL_FUSE");
    REQUIRE(stall != nullptr);
    char tmpl[] = "/tmp/nvfs-stall-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    children.fuse_dir = tmpl;
    REQUIRE(chmod(tmpl, 0755) == 0);
    // Mounted by root here, where /dev/fuse is root's alone (on most
    // distributions any user may mount one); the user opens its file.
    const pid_t server = fork();
    REQUIRE(server >= 0);
    if (server == 0) {
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      execl(stall, stall, tmpl, static_cast<char*>(nullptr));
      _exit(127);
    }
    children.pids.push_back(server);
    bool mounted = false;
    for (int i = 0; i < 200 && !mounted; ++i) {
      mounted = nvfs::test::IsMountPoint(tmpl);
      if (!mounted) usleep(50 * 1000);
    }
    REQUIRE(mounted);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (!nvfs::test::BecomeNobody()) _exit(10);
      const int f = open((std::string(tmpl) + "/f").c_str(), O_RDONLY);
      if (f < 0) _exit(11);
      PassAndStay(path, f, report[1], /*keep=*/true);  // its own close would wait too
    }
    children.pids.push_back(pid);
  }
  // The descriptor never reached the daemon: no one may pass one who could
  // not open the namespace.
  CHECK(AttackResult(report[0]) == EPERM);
  close(report[0]);
  close(report[1]);

  // Another client is served at once.
  const int sock = Connect(path);
  REQUIRE(sock >= 0);
  Hello(sock);  // answered within 5 s
  close(sock);
  Session s;
  Prove(m, &s);
  const int f = open(m.path("f").c_str(), O_RDONLY);
  REQUIRE(f >= 0);
  CHECK(MapFile(s.sock, f).h.error == 0);
  close(f);

  // The daemon stops at once, and the image can be mounted again.
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(m.Stop() == 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 5);
  CHECK(nvfs::test::WaitImageFree(m.image(), 1));
}

// The bounds of the socket: 32 of its 256 connections are kept for root,
// and a connection not proven within kUnprovenSeconds is closed. (Unproven
// connections were kept for good, and nine users holding 32 each starved
// root's client.)
TEST_CASE("direct: the bounds: root's reserve, unproven connections",
          "[mount][direct][bounds]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  Children children;
  m.Start();
  const std::string path = SocketOf(m.dir());
  const unsigned users = (kMaxConnections - kRootReserve) / kMaxConnectionsPerUid;  // 7
  int ready[2];
  REQUIRE(pipe2(ready, O_CLOEXEC) == 0);
  // Each user holds all the connections it may, each answered (a hello).
  for (unsigned u = 0; u < users; ++u) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const uid_t uid = 60000 + u;
      if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
          setresuid(uid, uid, uid) != 0) {
        _exit(10);
      }
      unsigned served = 0;
      for (unsigned i = 0; i < kMaxConnectionsPerUid; ++i) {
        const int sock = ConnectRaw(path);
        const Request hello{kMagic, kVersion, kOpHello, 0, 0, 0};
        ReplyHeader h{};
        if (sock >= 0 && write(sock, &hello, sizeof hello) == sizeof hello &&
            read(sock, &h, sizeof h) == sizeof h && h.error == 0) {
          ++served;
        }
      }
      (void)!write(ready[1], &served, sizeof served);
      for (;;) pause();
    }
    children.pids.push_back(pid);
  }
  unsigned served = 0;
  for (unsigned u = 0; u < users; ++u) {
    unsigned n = 0;
    REQUIRE(read(ready[0], &n, sizeof n) == sizeof n);
    served += n;
  }
  close(ready[0]);
  close(ready[1]);
  REQUIRE(served == users * kMaxConnectionsPerUid);

  // Another user is refused; root is served.
  const pid_t other = fork();
  REQUIRE(other >= 0);
  if (other == 0) {
    if (!nvfs::test::BecomeNobody()) _exit(10);
    // Refused as it is accepted, before it asks anything.
    const int sock = ConnectRaw(path);
    ReplyHeader h{};
    if (sock < 0) _exit(11);
    _exit(read(sock, &h, sizeof h) == sizeof h && h.error == EUSERS ? 0 : 12);
  }
  CHECK(nvfs::test::WaitForExit(other, 10) == 0);
  const int sock = Connect(path);
  REQUIRE(sock >= 0);
  Hello(sock);
  // Not proven: closed once its time is up, and so are all the others.
  const auto start = std::chrono::steady_clock::now();
  timeval tv{kUnprovenSeconds + 5, 0};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  CHECK(Disconnected(sock));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited < kUnprovenSeconds + 2);
  close(sock);
  REQUIRE(m.Stop() == 0);
}

// Requests are counted per user, not per connection: one user with all its
// connections gets the rate of one (before, a user with 32 connections
// kept the direct thread at 60-70 % of a CPU).
TEST_CASE("direct: one user's rate, over all its connections", "[mount][direct][bounds]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  // Proven connections (an unproven one would be closed before the end).
  std::vector<std::unique_ptr<Session>> sessions;
  for (unsigned i = 0; i + 1 < kMaxConnectionsPerUid; ++i) {
    sessions.push_back(std::make_unique<Session>());
    Prove(m, sessions.back().get());
  }
  // Each asks a burst's worth, 64 requests in flight at a time (more
  // replies than a socket holds, unread, would get it dropped); all are
  // answered, at the user's rate.
  constexpr size_t kInFlight = 64;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Request> batch(kInFlight, Request{kMagic, kVersion, kOpHello, 0, 0, 0});
  std::vector<size_t> sent(sessions.size(), 0), got(sessions.size(), 0);  // requests, replies
  const auto send_batch = [&](size_t i) {
    const size_t n = std::min(kInFlight, kRequestBurst - sent[i]);
    REQUIRE(send(sessions[i]->sock, batch.data(), n * sizeof(Request), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(n * sizeof(Request)));
    sent[i] += n;
  };
  for (size_t i = 0; i < sessions.size(); ++i) send_batch(i);
  bool all_ok = true;
  for (size_t done = 0; done < sessions.size();) {
    std::vector<pollfd> fds;
    for (const auto& s : sessions) fds.push_back({s->sock, POLLIN, 0});
    REQUIRE(poll(fds.data(), fds.size(), 30000) > 0);
    for (size_t i = 0; i < sessions.size(); ++i) {
      if (fds[i].revents == 0 || got[i] == kRequestBurst) continue;
      ReplyHeader buf[kInFlight];
      const ssize_t n = recv(sessions[i]->sock, buf, (sent[i] - got[i]) * sizeof(ReplyHeader),
                             MSG_DONTWAIT);
      INFO("connection " << i << " after " << got[i] << " replies: " << std::strerror(errno));
      REQUIRE(n > 0);
      REQUIRE(n % sizeof(ReplyHeader) == 0);  // replies are whole messages
      for (ssize_t k = 0; k < n / static_cast<ssize_t>(sizeof(ReplyHeader)); ++k) {
        all_ok &= buf[k].error == 0;
      }
      got[i] += static_cast<size_t>(n) / sizeof(ReplyHeader);
      if (got[i] == kRequestBurst) {
        ++done;
      } else if (got[i] == sent[i]) {
        send_batch(i);
      }
    }
  }
  CHECK(all_ok);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // One burst at once, then kRequestsPerSecond: no sooner than this.
  const double least =
      double(sessions.size() - 1) * kRequestBurst / kRequestsPerSecond;
  INFO(sessions.size() * kRequestBurst << " requests in " << seconds << " s");
  CHECK(seconds >= least * 0.9);
  sessions.clear();
  REQUIRE(m.Stop() == 0);
}

namespace {

// A proven session, proven for writing too: the writers' page it was
// given, mapped (shared, writable, as a writer maps it).
struct WriterSession : Session {
  DirectWriterPage* page = nullptr;
  uint64_t page_offset = 0;
  ~WriterSession() {
    if (page != nullptr) munmap(page, sizeof *page);
  }
};

void ProveForWriting(const MountedFs& m, WriterSession* s) {
  Prove(m, s);
  const int ns = open(m.image().c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(ns >= 0);
  REQUIRE(SendRequest(s->sock, kOpWriteProve, ns));
  close(ns);
  WriteProveReply wp{};
  int writers_fd = -1;
  REQUIRE(Receive(s->sock, &wp, sizeof wp, &writers_fd) == static_cast<ssize_t>(sizeof wp));
  REQUIRE(wp.h.error == 0);
  REQUIRE(writers_fd >= 0);
  void* p = mmap(nullptr, sizeof(DirectWriterPage), PROT_READ | PROT_WRITE, MAP_SHARED, writers_fd,
                 static_cast<off_t>(wp.page_offset));
  close(writers_fd);
  REQUIRE(p != MAP_FAILED);
  s->page = static_cast<DirectWriterPage*>(p);
  s->page_offset = wp.page_offset;
}

uint64_t StartTimeOf(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i < 22; ++i) rest >> field;  // fields 3..21
  uint64_t start = 0;
  rest >> start;
  return start;
}

}  // namespace

// The daemon believes nothing a client writes into shared memory that it
// has not checked, and a request names a file only by what its own
// connection was given (doc/integrity.md section 11).
TEST_CASE("direct: a writer's requests and page name only what its connection was given",
          "[mount][direct][write]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m;
  m.Start();
  WriteFile(m.path("mine"), std::string(4096, 'm'));
  WriteFile(m.path("theirs"), std::string(100, 't'));
  REQUIRE(chmod(m.path("theirs").c_str(), 0644) == 0);
  struct stat theirs {};
  REQUIRE(stat(m.path("theirs").c_str(), &theirs) == 0);
  // Kept open (by the kernel's descriptor of someone), as a file in use.
  const int theirs_fd = open(m.path("theirs").c_str(), O_RDONLY);
  REQUIRE(theirs_fd >= 0);

  SECTION("an allocation naming by inode a file the connection never passed is refused") {
    WriterSession s;
    ProveForWriting(m, &s);
    Request r{kMagic, kVersion, kOpAllocate, 0, 100, 1 << 20, 0, 1 << 20, theirs.st_ino, 0};
    REQUIRE(SendRaw(s.sock, &r, sizeof r));
    MapReply reply{};
    REQUIRE(Receive(s.sock, &reply, sizeof reply) == static_cast<ssize_t>(sizeof reply));
    CHECK(reply.h.error == EBADF);
    Request c{kMagic, kVersion, kOpCommit, 0, 0, 1 << 20, 0, 1 << 20, theirs.st_ino, 0};
    REQUIRE(SendRaw(s.sock, &c, sizeof c));
    REQUIRE(Receive(s.sock, &reply, sizeof reply) == static_cast<ssize_t>(sizeof reply));
    CHECK(reply.h.error == EBADF);
    struct stat after {};
    REQUIRE(stat(m.path("theirs").c_str(), &after) == 0);
    CHECK(after.st_size == 100);
    // A file it passed a descriptor open for writing of may be named.
    const int mine = open(m.path("mine").c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(mine >= 0);
    MapReply mapped = MapFile(s.sock, mine, 0, kMapForWrite);
    REQUIRE(mapped.h.error == 0);
    REQUIRE((mapped.flags & kMapWritable) != 0);
    Request ok{kMagic, kVersion, kOpCommit, 0, 0, 0, 0, 0, mapped.ino, 0};
    REQUIRE(SendRaw(s.sock, &ok, sizeof ok));
    REQUIRE(Receive(s.sock, &reply, sizeof reply) == static_cast<ssize_t>(sizeof reply));
    CHECK(reply.h.error == 0);
    close(mine);
  }
  SECTION("a file listed in a writer's page that it was never given keeps its times") {
    WriterSession s;
    ProveForWriting(m, &s);
    s.page->dirty[0].store(theirs.st_ino);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two of the daemon's passes
    struct stat after {};
    REQUIRE(stat(m.path("theirs").c_str(), &after) == 0);
    CHECK(after.st_mtim.tv_sec == theirs.st_mtim.tv_sec);
    CHECK(after.st_mtim.tv_nsec == theirs.st_mtim.tv_nsec);
    CHECK(after.st_ctim.tv_nsec == theirs.st_ctim.tv_nsec);
  }
  SECTION("a page that names another process holds back no later mount") {
    // A writer (which then exits) marks its page as pid 1's, inside a
    // store, with writable maps.
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      WriterSession s;
      ProveForWriting(m, &s);
      s.page->pid = 1;
      s.page->start_time = StartTimeOf(1);
      s.page->threads[0].gen.store(1);
      s.page->maps.store(1);
      _exit(0);
    }
    REQUIRE(nvfs::test::WaitForExit(child, 30) == 0);
    close(theirs_fd);
    REQUIRE(m.Stop() == 0);
    const auto before = std::chrono::steady_clock::now();
    m.Start();
    CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(5));
    REQUIRE(m.Stop() == 0);
    return;
  }
  close(theirs_fd);
  REQUIRE(m.Stop() == 0);
}
