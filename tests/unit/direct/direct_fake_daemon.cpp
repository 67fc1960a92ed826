#include "direct_fake_daemon.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>

#include "nvfs/format.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::test {

namespace {

using direct::MapReply;
using direct::ProveReply;
using direct::ReplyHeader;
using direct::Request;

constexpr uint64_t kMountCountOffset =
    format::kSuperDynamicOffset + offsetof(format::SuperDynamic, mount_count);
constexpr uint64_t kUuidOffset = format::kSuperStaticOffset + offsetof(format::SuperStatic, uuid);

void Check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("fake daemon: ") + what + ": " + std::strerror(errno));
}

bool SendReply(int conn, const void* reply, size_t len, int fd) {
  return direct::SendWithFd(conn, reply, len, fd, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

ReplyHeader Header(uint32_t op, int error, size_t size) {
  return {direct::kMagic, op, error, static_cast<uint32_t>(size)};
}

}  // namespace

FakeDirectDaemon::FakeDirectDaemon(const std::string& root, uint64_t ns_size, uint32_t slot_count,
                                   const std::string& socket_dir)
    : socket_dir_(socket_dir.empty() ? root + "/run" : socket_dir), ns_path_(root + "/ns.img"),
      ns_size_(ns_size),
      slot_count_(slot_count) {
  ns_fd_ = open(ns_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  Check(ns_fd_ >= 0, "ns.img");
  Check(ftruncate(ns_fd_, static_cast<off_t>(ns_size)) == 0, "ftruncate ns.img");
  WriteIdentity(7);

  table_fd_ = memfd_create("nvfs-direct-table", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  Check(table_fd_ >= 0, "memfd_create");
  const size_t bytes = size_t{slot_count} * sizeof(DirectSlot);
  Check(ftruncate(table_fd_, static_cast<off_t>(bytes)) == 0, "ftruncate table");
  void* t = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, table_fd_, 0);
  Check(t != MAP_FAILED, "mmap table");
  table_ = static_cast<DirectSlot*>(t);
  auto* header = reinterpret_cast<DirectTableHeader*>(table_);
  header->magic = kDirectTableMagic;
  header->version = kDirectTableVersion;
  header->slot_count = slot_count;
  Check(fcntl(table_fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0, "seal");

  mkdir(socket_dir_.c_str(), 0755);
  chmod(socket_dir_.c_str(), 0755);
  struct stat st;
  Check(stat(root.c_str(), &st) == 0, "stat root");
  socket_path_ = direct::SocketPath(st.st_dev);
  socket_path_ = socket_dir_ + socket_path_.substr(std::strlen(kSocketDir));
  unlink(socket_path_.c_str());
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  Check(listen_fd_ >= 0, "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path_.c_str());
  Check(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "bind");
  chmod(socket_path_.c_str(), 0666);
  // What a real mount's line in mountinfo gives the library: the source
  // (session.cpp, NamespacePath in test mode).
  {
    const std::string source = socket_path_ + ".source";
    FILE* out = std::fopen(source.c_str(), "w");
    Check(out != nullptr && std::fputs(ns_path_.c_str(), out) >= 0 && std::fclose(out) == 0,
          "write the source");
  }
  Check(listen(listen_fd_, 64) == 0, "listen");
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

FakeDirectDaemon::~FakeDirectDaemon() {
  stop_ = true;
  acceptor_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
  close(listen_fd_);
  unlink(socket_path_.c_str());
  unlink((socket_path_ + ".source").c_str());
  rmdir(socket_dir_.c_str());  // fails while another daemon's socket is in it
  munmap(table_, size_t{slot_count_} * sizeof(DirectSlot));
  close(table_fd_);
  close(ns_fd_);
  unlink(ns_path_.c_str());
}

uint32_t FakeDirectDaemon::Serve(const std::string& path, uint64_t size,
                                 const std::vector<DirectRun>& runs) {
  struct stat st;
  Check(stat(path.c_str(), &st) == 0, "stat file");
  std::lock_guard lock(mu_);
  const auto key = std::make_pair(uint64_t{st.st_dev}, uint64_t{st.st_ino});
  auto it = files_.find(key);
  if (it == files_.end()) {
    Check(next_slot_ < slot_count_, "table full");
    it = files_.emplace(key, File{next_slot_++, 0, {}}).first;
  }
  File& f = it->second;
  DirectSlot& slot = table_[f.slot];
  slot.seq.store(slot.seq.load() + 1);
  f.size = size;
  f.runs = runs;
  slot.size.store(size);
  slot.ino.store(st.st_ino);
  slot.seq.store(slot.seq.load() + 1);
  return f.slot;
}

void FakeDirectDaemon::Change(uint32_t slot_index, uint64_t size, const std::vector<DirectRun>& runs) {
  std::lock_guard lock(mu_);
  for (auto& [key, f] : files_) {
    if (f.slot != slot_index) continue;
    DirectSlot& slot = table_[f.slot];
    slot.seq.store(slot.seq.load() + 1, std::memory_order_seq_cst);
    f.size = size;
    f.runs = runs;
    slot.size.store(size);
    slot.seq.store(slot.seq.load() + 1, std::memory_order_seq_cst);
    return;
  }
  throw std::runtime_error("fake daemon: no such slot");
}

uint64_t FakeDirectDaemon::Seq(uint32_t slot) const { return table_[slot].seq.load(); }

void FakeDirectDaemon::WriteNamespace(uint64_t offset, const void* data, size_t len) {
  Check(pwrite(ns_fd_, data, len, static_cast<off_t>(offset)) == static_cast<ssize_t>(len),
        "write ns.img");
}

void FakeDirectDaemon::FillNamespace(uint64_t offset, uint8_t byte, size_t len) {
  std::vector<uint8_t> fill(len, byte);
  WriteNamespace(offset, fill.data(), len);
}

void FakeDirectDaemon::SetMountCount(uint64_t mount_count) {
  WriteNamespace(kMountCountOffset, &mount_count, sizeof mount_count);
}

void FakeDirectDaemon::WriteIdentity(uint64_t mount_count) {
  const uint8_t uuid[16] = {0x6e, 0x76, 0x66, 0x73, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  WriteNamespace(kUuidOffset, uuid, sizeof uuid);
  SetMountCount(mount_count);
}

uint64_t FakeDirectDaemon::MountCount() const {
  uint64_t v = 0;
  Check(pread(ns_fd_, &v, sizeof v, static_cast<off_t>(kMountCountOffset)) == sizeof v, "read ns.img");
  return v;
}

void FakeDirectDaemon::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    connections_++;
    std::lock_guard lock(mu_);
    threads_.emplace_back([this, conn] {
      Serve(conn);
      close(conn);
    });
  }
}

void FakeDirectDaemon::Serve(int conn) {
  bool proved = false;
  while (!stop_) {
    pollfd p{conn, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    Request req{};
    PassedFds passed;
    const ssize_t n = ReceiveWithFds(conn, &req, sizeof req, MSG_WAITALL, &passed);
    if (n <= 0) return;
    // The first descriptor is the request's; more are closed, and the
    // request served as ever.
    const int fd = passed.count > 0 ? passed.fds[0] : -1;
    for (size_t i = 1; i < passed.count; ++i) close(passed.fds[i]);
    struct FdCloser {
      int fd;
      ~FdCloser() {
        if (fd >= 0) close(fd);
      }
    } const closer{fd};
    if (n != sizeof req || req.magic != direct::kMagic || req.version != direct::kVersion) {
      const ReplyHeader h = Header(req.op, EPROTO, sizeof(ReplyHeader));
      SendReply(conn, &h, sizeof h, -1);
      return;
    }
    if (req.op == direct::kOpHello) {
      const ReplyHeader h = Header(req.op, 0, sizeof(ReplyHeader));
      if (!SendReply(conn, &h, sizeof h, -1)) return;
      continue;
    }
    if (req.op == direct::kOpProve) {
      struct stat mine, theirs;
      fstat(ns_fd_, &mine);
      if (fd < 0 || fstat(fd, &theirs) != 0 || theirs.st_dev != mine.st_dev ||
          theirs.st_ino != mine.st_ino) {
        const ReplyHeader h = Header(req.op, EACCES, sizeof(ReplyHeader));
        SendReply(conn, &h, sizeof h, -1);
        return;
      }
      proves_++;
      proved = true;
      ProveReply r{};
      r.h = Header(req.op, 0, sizeof r);
      r.namespace_size = ns_size_;
      r.mount_count = MountCount();
      Check(pread(ns_fd_, r.uuid, sizeof r.uuid, static_cast<off_t>(kUuidOffset)) == sizeof r.uuid,
            "read uuid");
      r.slot_count = slot_count_;
      r.table_bytes = uint64_t{slot_count_} * sizeof(DirectSlot);
      if (!SendReply(conn, &r, sizeof r, table_fd_)) return;
      continue;
    }
    if (req.op != direct::kOpMap || !proved) {
      const ReplyHeader h = Header(req.op, EPERM, sizeof(ReplyHeader));
      SendReply(conn, &h, sizeof h, -1);
      return;
    }
    maps_++;
    MapReply r{};
    r.h = Header(req.op, 0, sizeof r);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      r.h = Header(req.op, EBADF, sizeof(ReplyHeader));
      if (!SendReply(conn, &r, sizeof r.h, -1)) return;
      continue;
    }
    {
      std::lock_guard lock(mu_);
      auto it = files_.find({uint64_t{st.st_dev}, uint64_t{st.st_ino}});
      if (it == files_.end()) {
        r.h = Header(req.op, EXDEV, sizeof(ReplyHeader));
      } else {
        const File& f = it->second;
        r.ino = st.st_ino;
        r.slot = f.slot;
        r.seq = table_[f.slot].seq.load();
        r.size = f.size;
        // The window: from the run holding the offset on.
        uint64_t file_off = 0;
        size_t first = 0;
        while (first < f.runs.size() && file_off + f.runs[first].len <= req.offset) {
          file_off += f.runs[first].len;
          ++first;
        }
        r.start = file_off;
        r.namespace_size = ns_size_;
        for (size_t i = first; i < f.runs.size() && r.run_count < max_runs_.load(); ++i) {
          r.runs[r.run_count++] = f.runs[i];
        }
      }
    }
    if (!SendReply(conn, &r, r.h.error == 0 ? sizeof r : sizeof r.h, -1)) return;
  }
}

}  // namespace nvfs::test
