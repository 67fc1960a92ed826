// The FUSE adapter's session callback and its operations table; the
// callbacks live in namei.cpp, attr.cpp, file.cpp and dir.cpp (ops.hpp).
#include "fuse/adapter.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "fuse/kernel_abi.hpp"
#include "fuse/ops.hpp"
#include "fuse/uring_abi.hpp"
#include "nvfs/format.hpp"

namespace nvfs {

static_assert(format::kRootIno == FUSE_ROOT_ID, "nvfs inode numbers are FUSE node ids");

const char* ReadPathName(ReadPath path) {
  switch (path) {
    case ReadPath::kRead: return "read";
    case ReadPath::kIter: return "iter";
    case ReadPath::kMap: return "map";
  }
  return "?";
}

const char* CacheModeName(CacheMode mode) { return mode == CacheMode::kNone ? "none" : "page"; }

bool CallerInGroup(uint32_t gid) {
  const fuse_req_t req = fuse_ops::current_request;
  if (req == nullptr) return false;
  if (fuse_req_ctx(req)->gid == gid) return true;
  std::vector<gid_t> groups(32);
  for (;;) {
    const int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
    if (n < 0) return false;
    if (static_cast<size_t>(n) <= groups.size()) {
      return std::find(groups.begin(), groups.begin() + n, gid) != groups.begin() + n;
    }
    groups.resize(static_cast<size_t>(n));
  }
}

void FuseAdapter::ForgetCachedAttr(fuse_ino_t ino) const {
  // A negative offset: attributes only. An error (ENOENT: the kernel no
  // longer has the inode) leaves nothing cached to forget.
  if (se_ != nullptr) (void)fuse_lowlevel_notify_inval_inode(se_, ino, -1, 0);
}

void FuseAdapter::DirectlyGrown(fuse_ino_t ino, uint64_t size, uint8_t last_byte) const {
  if (se_ == nullptr || size == 0) return;
  // The file's own last byte, so that a page the kernel has cached stays
  // true. ENOENT: the kernel has no such inode, and nothing to correct.
  fuse_bufvec one = FUSE_BUFVEC_INIT(1);
  one.buf[0].mem = &last_byte;
  (void)fuse_lowlevel_notify_store(se_, ino, static_cast<off_t>(size - 1), &one,
                                   FUSE_BUF_SPLICE_NONBLOCK);
}

void FuseAdapter::DirectWritten(fuse_ino_t ino, uint64_t off, uint64_t len) {
  if (len == 0) return;
  std::lock_guard lock(inval_mu_);
  if (inval_stop_) return;
  ++unsettled_[ino];
  unsettled_inodes_.store(unsettled_.size(), std::memory_order_release);
  const Range range{off, off + len, 1};
  auto [it, inserted] = inval_pending_.try_emplace(ino, range);
  if (!inserted) {
    it->second.begin = std::min(it->second.begin, range.begin);
    it->second.end = std::max(it->second.end, range.end);
    ++it->second.writes;
  }
  if (!inval_thread_.joinable()) inval_thread_ = std::thread([this] { InvalidateLoop(); });
  inval_cv_.notify_one();
}

bool FuseAdapter::OpenMustDropCache(fuse_ino_t ino) {
  // Every cache=page open asks: no lock while no direct write awaits its drop.
  if (unsettled_inodes_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(inval_mu_);
  return unsettled_.contains(ino);
}

void FuseAdapter::InvalidateLoop() {
  std::unique_lock lock(inval_mu_);
  for (;;) {
    inval_cv_.wait(lock, [this] { return inval_stop_ || !inval_pending_.empty(); });
    if (inval_pending_.empty()) return;  // stopping, nothing left
    const auto node = inval_pending_.begin();
    const fuse_ino_t ino = node->first;
    const Range range = node->second;
    inval_pending_.erase(node);
    lock.unlock();
    // ENOENT: the kernel has no such inode cached, so no page either.
    (void)fuse_lowlevel_notify_inval_inode(se_, ino, static_cast<off_t>(range.begin),
                                           static_cast<off_t>(range.end - range.begin));
    lock.lock();
    // Settled: the writes this range merged. Writes since have their own
    // count (and their own range in inval_pending_).
    const auto count = unsettled_.find(ino);
    if (count != unsettled_.end()) {
      count->second -= std::min(count->second, range.writes);
      if (count->second == 0) {
        unsettled_.erase(count);
        unsettled_inodes_.store(unsettled_.size(), std::memory_order_release);
      }
    }
  }
}

void FuseAdapter::StopInvalidations() {
  {
    std::lock_guard lock(inval_mu_);
    inval_stop_ = true;
  }
  inval_cv_.notify_one();
  if (inval_thread_.joinable()) inval_thread_.join();
}

void FuseAdapter::TrackOpen(FileHandle file) {
  std::lock_guard lock(open_mu_);
  open_.insert(file);
}

void FuseAdapter::UntrackOpen(FileHandle file) noexcept {
  std::lock_guard lock(open_mu_);
  open_.erase(file);
}

void FuseAdapter::EndSession() {
  std::unordered_set<FileHandle> left;
  {
    std::lock_guard lock(open_mu_);
    left.swap(open_);
  }
  // Neither throws: a reclaim that failed (an allocation) is said on
  // stderr and leaves its inode on the orphan list, which the next mount
  // finishes; the daemon goes on to the clean unmount.
  for (FileHandle file : left) fs_->Release(file);
  fs_->ForgetAll();
}

namespace fuse_ops {

void OpInit(void* userdata, fuse_conn_info* conn) noexcept {
  auto& adapter = *static_cast<FuseAdapter*>(userdata);
  auto want = [conn](unsigned cap) {
    if (conn->capable & cap) conn->want |= cap;
  };
  // libfuse clamps max_write to its receive buffer (1 MiB + header by
  // default) and derives max_pages, and so the largest read, from it.
  conn->max_write = kFuseMaxIo;
  // Asynchronous direct I/O (libaio, io_uring) and read-ahead are the
  // kernel's background requests, of which it keeps max_background in
  // flight (12 by default) and makes the submitter of the next one sleep:
  // a program with 128 reads queued got 12 served at a time. Each costs
  // the daemon nothing while it waits (no buffer, no thread).
  conn->max_background = kMaxBackground;
  conn->congestion_threshold = kMaxBackground * 3 / 4;
  want(FUSE_CAP_ASYNC_READ);
  want(FUSE_CAP_ASYNC_DIO);
  want(FUSE_CAP_ATOMIC_O_TRUNC);   // Open truncates atomically
  want(FUSE_CAP_EXPORT_SUPPORT);   // OpLookup answers "." and ".." on any node id
  want(FUSE_CAP_PARALLEL_DIROPS);  // lookups and readdir take shared locks only
  want(FUSE_CAP_READDIRPLUS);
  want(FUSE_CAP_READDIRPLUS_AUTO);
  want(FUSE_CAP_IOCTL_DIR);        // chattr of a directory (OpIoctl)
  // Listings cached by the kernel, and no OPENDIR/RELEASEDIR trips (dir.cpp),
  // only where names are cached too: a cached listing spares READDIRPLUS,
  // which revalidates a directory's names a hundred a request, so with
  // short entry timeouts every expired name would cost a LOOKUP of its own.
  adapter.protocol().cache_listings = adapter.options().entry_timeout >= kCacheListingsFrom;
  if (adapter.protocol().cache_listings) want(FUSE_CAP_NO_OPENDIR_SUPPORT);
  adapter.protocol().no_opendir = conn->want & FUSE_CAP_NO_OPENDIR_SUPPORT;
  // Splice would hand write_buf a pipe and move reads through one: extra
  // copies for a daemon whose data already sits in memory.
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;  // see adapter.hpp: write() stays durable
  if (adapter.options().cache == CacheMode::kPage) want(FUSE_CAP_CACHE_SYMLINKS);
  // POSIX ACLs (src/fs/acl.cpp): the kernel enforces them and checks who
  // sets them; with DONT_MASK it sends the umask instead of applying it, so
  // that the core can let a parent's default ACL mask the mode in its place.
  want(FUSE_CAP_POSIX_ACL);
  want(FUSE_CAP_DONT_MASK);
  // Privileges (adapter.hpp). KILLPRIV (v1, which libfuse asks for by
  // default) would leave every write, truncate and chown to the daemon with
  // no word on the caller's CAP_FSETID: never. KILLPRIV_V2 where the kernel
  // offers it (the transport adds it to the reply); without it the kernel
  // drops privileges itself on its page-cache path, and still marks direct
  // writes.
  conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
  // The flags libfuse 3.14 cannot ask for (transport.hpp, which sends each
  // only if the kernel offered it).
  uint64_t& extra = adapter.protocol().extra_flags;
  extra |= FUSE_HANDLE_KILLPRIV_V2;
  // The extended SETXATTR request, for its FUSE_SETXATTR_ACL_KILL_SGID
  // (the transport gives libfuse the request it knows).
  extra |= FUSE_SETXATTR_EXT;
  // Shared mmap of direct-I/O files (cache=none; adapter.hpp). Harmless
  // with cache=page, whose files are not FOPEN_DIRECT_IO.
  extra |= FUSE_DIRECT_IO_ALLOW_MMAP;
  // FUSE over io_uring (uring.hpp): the rings register after this reply.
  FuseAdapter::Protocol& protocol = adapter.protocol();
  if (adapter.options().io_uring && (protocol.kernel_flags & FUSE_OVER_IO_URING)) {
    protocol.io_uring = true;
    extra |= FUSE_OVER_IO_URING;
  }
  conn->time_gran = 1;  // nanosecond timestamps
}

}  // namespace fuse_ops

namespace {

// Only a callback declared noexcept goes into the table: an exception
// thrown into libfuse's C frames would unwind through them or terminate,
// and one caught by a callback after its reply would reply twice (ops.hpp,
// Guarded).
template <class... Args>
constexpr auto NoThrow(void (*callback)(Args...) noexcept) {
  return callback;
}

}  // namespace

const fuse_lowlevel_ops& FuseAdapter::Ops() {
  static const fuse_lowlevel_ops ops = [] {
    using namespace fuse_ops;
    fuse_lowlevel_ops o{};
    o.init = NoThrow(OpInit);
    o.lookup = NoThrow(OpLookup);
    o.forget = NoThrow(OpForget);
    o.forget_multi = NoThrow(OpForgetMulti);
    o.getattr = NoThrow(OpGetattr);
    o.setattr = NoThrow(OpSetattr);
    o.readlink = NoThrow(OpReadlink);
    o.mknod = NoThrow(OpMknod);
    o.mkdir = NoThrow(OpMkdir);
    o.unlink = NoThrow(OpUnlink);
    o.rmdir = NoThrow(OpRmdir);
    o.symlink = NoThrow(OpSymlink);
    o.rename = NoThrow(OpRename);
    o.link = NoThrow(OpLink);
    o.open = NoThrow(OpOpen);
    o.read = NoThrow(OpRead);
    o.write = NoThrow(OpWrite);
    o.write_buf = NoThrow(OpWriteBuf);
    o.flush = NoThrow(OpFlush);
    o.release = NoThrow(OpRelease);
    o.fsync = NoThrow(OpFsync);
    o.opendir = NoThrow(OpOpendir);
    o.readdir = NoThrow(OpReaddir);
    o.readdirplus = NoThrow(OpReaddirplus);
    o.releasedir = NoThrow(OpReleasedir);
    o.fsyncdir = NoThrow(OpFsyncdir);
    o.statfs = NoThrow(OpStatfs);
    o.setxattr = NoThrow(OpSetxattr);
    o.getxattr = NoThrow(OpGetxattr);
    o.listxattr = NoThrow(OpListxattr);
    o.removexattr = NoThrow(OpRemovexattr);
    o.create = NoThrow(OpCreate);
    o.fallocate = NoThrow(OpFallocate);
    o.lseek = NoThrow(OpLseek);
    o.ioctl = NoThrow(OpIoctl);
    return o;
  }();
  return ops;
}

}  // namespace nvfs
