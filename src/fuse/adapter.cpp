// The FUSE adapter; adapter.hpp states the rules every callback follows.
//
// Each callback below has the same shape: take the adapter from the request,
// call the core once (twice where noted), reply. Replies that hand the kernel
// a reference (entry, create, open, readdirplus) undo it when the kernel
// refuses the reply, so the core's reference counts stay exact.
#include "fuse/adapter.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string_view>
#include <vector>

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

namespace {

// Segment size of the iter path's scatter list.
constexpr size_t kIterSegment = 4096;
// writev(2) takes at most UIO_MAXIOV (1024) segments; the reply header is one.
constexpr size_t kMaxReplyRuns = 1023;

// ---------------------------------------------------------------------------
// Per-thread buffers
// ---------------------------------------------------------------------------

// The buffers of the read, readdir and xattr replies, one set per worker
// thread. Allocated the first time a thread needs them (sized for the largest
// request the kernel sends, kFuseMaxIo, and populated so later requests take
// no page fault), reused by every later request of the thread, freed when the
// thread ends. They grow only if a request is larger than anything seen
// before (a -o max_read beyond kFuseMaxIo), so a read allocates nothing.
class ThreadBuffers {
 public:
  ThreadBuffers() = default;
  ~ThreadBuffers() {
    if (data_ != nullptr) munmap(data_, capacity_);
  }
  ThreadBuffers(const ThreadBuffers&) = delete;
  ThreadBuffers& operator=(const ThreadBuffers&) = delete;

  // Makes data() at least `size` bytes and runs() long enough for a mapped
  // read of `size` bytes in blocks of `block_size`. Throws std::bad_alloc.
  void Reserve(size_t size, uint32_t block_size) {
    if (size > capacity_) {
      const size_t capacity = std::max<size_t>((size + kIterSegment - 1) & ~(kIterSegment - 1),
                                               kFuseMaxIo);
      void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      if (data_ != nullptr) munmap(data_, capacity_);
      data_ = static_cast<char*>(p);
      capacity_ = capacity;
      segments_.resize(capacity / kIterSegment);
      for (size_t i = 0; i < segments_.size(); ++i) {
        segments_[i] = {data_ + i * kIterSegment, kIterSegment};
      }
    }
    // A read of `size` bytes touches at most size / block_size + 2 blocks,
    // each at most one run.
    const size_t runs = std::min(capacity_ / std::max<uint32_t>(block_size, 1) + 2, kMaxReplyRuns);
    if (runs > runs_.size()) {
      runs_.resize(runs);
      run_iov_.resize(runs);
    }
  }

  char* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  std::vector<iovec>& segments() { return segments_; }
  std::vector<ReadRun>& runs() { return runs_; }
  std::vector<iovec>& run_iov() { return run_iov_; }
  std::vector<iovec>& write_iov() { return write_iov_; }
  std::vector<uint64_t>& looked_up() { return looked_up_; }
  char* name() { return name_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
  std::vector<iovec> segments_;    // kIterSegment pieces of data_ (iter path)
  std::vector<ReadRun> runs_;      // map path
  std::vector<iovec> run_iov_;     // runs_ as the iovecs of fuse_reply_iov
  std::vector<iovec> write_iov_;   // write_buf's memory buffers
  std::vector<uint64_t> looked_up_;  // readdirplus: inodes given a reference
  char name_[format::kNameMax + 1];  // a NUL-terminated directory entry name
};

thread_local ThreadBuffers t_buffers;

// ---------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------

FuseAdapter& AdapterOf(fuse_req_t req) {
  return *static_cast<FuseAdapter*>(fuse_req_userdata(req));
}

FileHandle HandleOf(const fuse_file_info* fi) { return reinterpret_cast<FileHandle>(fi->fh); }

Cred CredOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return Cred{ctx->uid, ctx->gid};
}

struct stat ToStat(const Attr& a) {
  struct stat st {};
  st.st_ino = a.ino;
  st.st_mode = a.mode;
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_rdev = a.rdev;
  st.st_size = static_cast<off_t>(a.size);
  st.st_blocks = static_cast<blkcnt_t>(a.blocks);
  st.st_blksize = a.blksize;
  st.st_atim = a.atime;
  st.st_mtim = a.mtime;
  st.st_ctim = a.ctime;
  return st;
}

fuse_entry_param ToEntry(const FuseAdapter& adapter, const Attr& a) {
  fuse_entry_param e{};
  e.ino = a.ino;
  e.generation = a.generation;
  e.attr = ToStat(a);
  e.attr_timeout = adapter.options().attr_timeout;
  e.entry_timeout = adapter.options().entry_timeout;
  return e;
}

// The open(2) flags the core's handle gets. With the page cache the kernel
// positions O_APPEND writes itself (under the inode lock, at its i_size),
// and writes back mmap'ed pages through whichever writable handle it picks,
// possibly an O_APPEND one: the core must then write at the offset it is
// given. With direct I/O no page is ever written back, and the core appends
// atomically.
int CoreOpenFlags(const FuseAdapter& adapter, int flags) {
  if (adapter.options().cache == CacheMode::kPage) flags &= ~O_APPEND;
  return flags;
}

void SetOpenReply(const FuseAdapter& adapter, fuse_file_info* fi, FileHandle file) {
  fi->fh = reinterpret_cast<uint64_t>(file);
  if (adapter.options().cache == CacheMode::kNone) {
    fi->direct_io = 1;
  } else {
    fi->keep_cache = 1;  // only the kernel changes the file: its cached pages stay valid
  }
  fi->noflush = 1;  // flush has nothing to do: spare close(2) a round trip
}

// A bufvec of one memory buffer (FUSE_BUFVEC_INIT is a C compound literal).
fuse_bufvec MemoryBufvec(void* mem, size_t size) {
  fuse_bufvec v{};
  v.count = 1;
  v.buf[0].size = size;
  v.buf[0].mem = mem;
  v.buf[0].fd = -1;
  return v;
}

// Runs a callback body; an exception still owes the request its one reply
// (bodies reply last, and fuse_reply_* do not throw, so an exception always
// comes before the reply).
template <class Body>
void Guarded(fuse_req_t req, Body&& body) noexcept {
  try {
    body();
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (...) {
    fuse_reply_err(req, EIO);
  }
}

// Replies to a request that hands the kernel one reference on success.
void ReplyEntry(fuse_req_t req, FuseAdapter& adapter, const Result<Attr>& attr) {
  if (!attr.ok()) {
    fuse_reply_err(req, attr.code());
    return;
  }
  const fuse_entry_param e = ToEntry(adapter, *attr);
  if (fuse_reply_entry(req, &e) != 0) adapter.fs().Forget(attr->ino, 1);
}

void ReplyStatus(fuse_req_t req, const Status& status) { fuse_reply_err(req, status.code()); }

// ---------------------------------------------------------------------------
// Session
// ---------------------------------------------------------------------------

void OpInit(void* userdata, fuse_conn_info* conn) {
  const auto& adapter = *static_cast<const FuseAdapter*>(userdata);
  auto want = [conn](unsigned cap) {
    if (conn->capable & cap) conn->want |= cap;
  };
  // libfuse clamps max_write to its receive buffer (1 MiB + header by
  // default) and derives max_pages, and so the largest read, from it.
  conn->max_write = kFuseMaxIo;
  want(FUSE_CAP_ASYNC_READ);
  want(FUSE_CAP_ASYNC_DIO);
  want(FUSE_CAP_ATOMIC_O_TRUNC);   // Open truncates atomically
  want(FUSE_CAP_EXPORT_SUPPORT);   // lookups of "." and ".." below
  want(FUSE_CAP_PARALLEL_DIROPS);  // lookups and readdir take shared locks only
  want(FUSE_CAP_READDIRPLUS);
  want(FUSE_CAP_READDIRPLUS_AUTO);
  // Splice would hand write_buf a pipe and move reads through one: extra
  // copies for a daemon whose data already sits in memory.
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;  // see adapter.hpp: write() stays durable
  if (adapter.options().cache == CacheMode::kPage) want(FUSE_CAP_CACHE_SYMLINKS);
  conn->time_gran = 1;  // nanosecond timestamps
}

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    const std::string_view n(name);
    // "." on any inode is how the kernel turns an NFS file handle back into
    // an inode (FUSE_CAP_EXPORT_SUPPORT); the core's Lookup wants a directory.
    Result<Attr> attr = n == "." ? adapter.fs().LookupInode(parent)
                                 : adapter.fs().Lookup(parent, n);
    if (!attr.ok() && attr.code() == ENOENT) {
      fuse_entry_param negative{};  // ino 0: the kernel caches the absence
      negative.entry_timeout = adapter.options().entry_timeout;
      fuse_reply_entry(req, &negative);
      return;
    }
    ReplyEntry(req, adapter, attr);
  });
}

void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  try {
    AdapterOf(req).fs().Forget(ino, nlookup);
  } catch (...) {
    // Forget allocates nothing; nothing to report: forget has no error reply.
  }
  fuse_reply_none(req);
}

void OpForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  try {
    Filesystem& fs = AdapterOf(req).fs();
    for (size_t i = 0; i < count; ++i) fs.Forget(forgets[i].ino, forgets[i].nlookup);
  } catch (...) {
  }
  fuse_reply_none(req);
}

void OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    ReplyEntry(req, adapter, adapter.fs().Mknod(parent, name, mode, rdev, CredOf(req)));
  });
}

void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    ReplyEntry(req, adapter, adapter.fs().Mkdir(parent, name, mode, CredOf(req)));
  });
}

void OpSymlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    ReplyEntry(req, adapter, adapter.fs().Symlink(parent, name, target, CredOf(req)));
  });
}

void OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    ReplyEntry(req, adapter, adapter.fs().Link(ino, new_parent, new_name));
  });
}

void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guarded(req, [&] { ReplyStatus(req, AdapterOf(req).fs().Unlink(parent, name)); });
}

void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guarded(req, [&] { ReplyStatus(req, AdapterOf(req).fs().Rmdir(parent, name)); });
}

void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
              const char* new_name, unsigned int flags) {
  Guarded(req, [&] {
    ReplyStatus(req, AdapterOf(req).fs().Rename(parent, name, new_parent, new_name, flags));
  });
}

void OpReadlink(fuse_req_t req, fuse_ino_t ino) {
  Guarded(req, [&] {
    Result<std::string> target = AdapterOf(req).fs().Readlink(ino);
    if (!target.ok()) {
      fuse_reply_err(req, target.code());
      return;
    }
    fuse_reply_readlink(req, target->c_str());
  });
}

// ---------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------

void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* /*fi*/) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Result<Attr> attr = adapter.fs().GetAttr(ino);
    if (!attr.ok()) {
      fuse_reply_err(req, attr.code());
      return;
    }
    const struct stat st = ToStat(*attr);
    fuse_reply_attr(req, &st, adapter.options().attr_timeout);
  });
}

// FUSE_SET_ATTR_* to the core's SetAttrRequest. The size is changed through
// the inode whether or not the kernel names a handle (ftruncate): the
// handle's inode is `ino`, and an open handle keeps it alive.
void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
               fuse_file_info* /*fi*/) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    SetAttrRequest r;
    if (to_set & FUSE_SET_ATTR_MODE) {
      r.valid |= kSetMode;
      r.mode = attr->st_mode & 07777;
    }
    if (to_set & FUSE_SET_ATTR_UID) {
      r.valid |= kSetUid;
      r.uid = attr->st_uid;
    }
    if (to_set & FUSE_SET_ATTR_GID) {
      r.valid |= kSetGid;
      r.gid = attr->st_gid;
    }
    if (to_set & FUSE_SET_ATTR_SIZE) {
      r.valid |= kSetSize;
      r.size = static_cast<uint64_t>(attr->st_size);
    }
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
      r.valid |= kSetAtimeNow;
    } else if (to_set & FUSE_SET_ATTR_ATIME) {
      r.valid |= kSetAtime;
      r.atime = attr->st_atim;
    }
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
      r.valid |= kSetMtimeNow;
    } else if (to_set & FUSE_SET_ATTR_MTIME) {
      r.valid |= kSetMtime;
      r.mtime = attr->st_mtim;
    }
    if (to_set & FUSE_SET_ATTR_CTIME) {
      r.valid |= kSetCtime;
      r.ctime = attr->st_ctim;
    }
    // Nothing the core stores (only FORCE or KILL_* bits): no change, and
    // no ctime update either.
    Result<Attr> result = r.valid == 0 ? adapter.fs().GetAttr(ino) : adapter.fs().SetAttr(ino, r);
    if (!result.ok()) {
      fuse_reply_err(req, result.code());
      return;
    }
    const struct stat st = ToStat(*result);
    fuse_reply_attr(req, &st, adapter.options().attr_timeout);
  });
}

void OpStatfs(fuse_req_t req, fuse_ino_t /*ino*/) {
  Guarded(req, [&] {
    Result<StatFs> s = AdapterOf(req).fs().GetStatFs();
    if (!s.ok()) {
      fuse_reply_err(req, s.code());
      return;
    }
    struct statvfs sv {};
    sv.f_bsize = s->block_size;
    sv.f_frsize = s->block_size;
    sv.f_blocks = s->blocks;
    sv.f_bfree = s->blocks_free;
    sv.f_bavail = s->blocks_free;  // no blocks reserved for root
    sv.f_files = s->inodes;
    sv.f_ffree = s->inodes_free;
    sv.f_favail = s->inodes_free;
    sv.f_namemax = s->name_max;
    fuse_reply_statfs(req, &sv);
  });
}

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Result<FileHandle> file = adapter.fs().Open(ino, CoreOpenFlags(adapter, fi->flags));
    if (!file.ok()) {
      fuse_reply_err(req, file.code());
      return;
    }
    SetOpenReply(adapter, fi, *file);
    if (fuse_reply_open(req, fi) != 0) adapter.fs().Release(*file);
  });
}

// O_CREAT: the kernel sends CREATE after a negative lookup. The core's Create
// is exclusive; without O_EXCL a name that appeared in between is opened
// instead, as open(2) would.
void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Filesystem& fs = adapter.fs();
    const int flags = CoreOpenFlags(adapter, fi->flags);
    Attr attr;
    Result<FileHandle> file = fs.Create(parent, name, mode, flags, CredOf(req), &attr);
    if (!file.ok() && file.code() == EEXIST && !(fi->flags & O_EXCL)) {
      Result<Attr> found = fs.Lookup(parent, name);
      if (!found.ok()) {
        fuse_reply_err(req, found.code());
        return;
      }
      file = S_ISDIR(found->mode) ? Result<FileHandle>(Error(EISDIR)) : fs.Open(found->ino, flags);
      Result<Attr> now = file.ok() ? fs.GetAttr(found->ino) : Result<Attr>(Error(EIO));
      if (!file.ok() || !now.ok()) {
        if (file.ok()) fs.Release(*file);
        fs.Forget(found->ino, 1);
        fuse_reply_err(req, file.ok() ? now.code() : file.code());
        return;
      }
      attr = *now;
    }
    if (!file.ok()) {
      fuse_reply_err(req, file.code());
      return;
    }
    const fuse_entry_param e = ToEntry(adapter, attr);
    SetOpenReply(adapter, fi, *file);
    if (fuse_reply_create(req, &e, fi) != 0) {
      fs.Release(*file);
      fs.Forget(attr.ino, 1);
    }
  });
}

void OpRelease(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
  Guarded(req, [&] {
    AdapterOf(req).fs().Release(HandleOf(fi));
    fuse_reply_err(req, 0);
  });
}

void OpFlush(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* /*fi*/) {
  fuse_reply_err(req, 0);  // every write is durable already (and open sets noflush)
}

void OpFsync(fuse_req_t req, fuse_ino_t /*ino*/, int /*datasync*/, fuse_file_info* fi) {
  Guarded(req, [&] { ReplyStatus(req, AdapterOf(req).fs().Fsync(HandleOf(fi))); });
}

// Reads `size` bytes at `off` through the configured read path.
//   read: one copy into the thread's buffer, one reply buffer.
//   iter: the same buffer described as 4 KiB segments (what the kernel's
//         read_iter would hand a filesystem), one reply buffer.
//   map:  the runs inside the mapping go to the kernel as they are: one run
//         by fuse_reply_data (libfuse writev()s a single memory buffer
//         without copying or allocating), several by fuse_reply_iov (one
//         writev; libfuse's fuse_reply_data would copy them into a fresh
//         malloc'ed buffer first). The runs are read after the core dropped
//         the inode lock: a write racing with the read may show in it, as
//         with any read racing a write.
void OpRead(fuse_req_t req, fuse_ino_t /*ino*/, size_t size, off_t off, fuse_file_info* fi) {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Filesystem& fs = adapter.fs();
    const FileHandle file = HandleOf(fi);
    const uint64_t offset = static_cast<uint64_t>(off);
    if (size == 0) {
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    ThreadBuffers& tb = t_buffers;
    tb.Reserve(size, fs.block_size());
    ReadPath path = adapter.options().read_path;
    if (path == ReadPath::kMap) {
      std::vector<ReadRun>& runs = tb.runs();
      size_t count = 0;
      Result<size_t> n = fs.Map(file, offset, size, runs.data(), runs.size(), &count);
      if (!n.ok()) {
        fuse_reply_err(req, n.code());
        return;
      }
      if (count < runs.size() || *n == size) {
        if (count == 0) {
          fuse_reply_buf(req, nullptr, 0);
        } else if (count == 1) {
          fuse_bufvec one = MemoryBufvec(const_cast<void*>(runs[0].data), runs[0].len);
          fuse_reply_data(req, &one, FUSE_BUF_NO_SPLICE);
        } else {
          std::vector<iovec>& iov = tb.run_iov();
          for (size_t i = 0; i < count; ++i) iov[i] = {const_cast<void*>(runs[i].data), runs[i].len};
          fuse_reply_iov(req, iov.data(), static_cast<int>(count));
        }
        return;
      }
      path = ReadPath::kRead;  // more runs than one reply may carry: copy instead
    }
    Result<size_t> n = Error(EIO);
    if (path == ReadPath::kIter) {
      std::vector<iovec>& seg = tb.segments();
      const size_t count = (size + kIterSegment - 1) / kIterSegment;
      const iovec last = seg[count - 1];
      seg[count - 1].iov_len = size - (count - 1) * kIterSegment;
      n = fs.ReadIter(file, offset, seg.data(), static_cast<int>(count));
      seg[count - 1] = last;
    } else {
      n = fs.Read(file, offset, tb.data(), size);
    }
    if (!n.ok()) {
      fuse_reply_err(req, n.code());
      return;
    }
    fuse_reply_buf(req, tb.data(), *n);
  });
}

void OpWrite(fuse_req_t req, fuse_ino_t /*ino*/, const char* buf, size_t size, off_t off,
             fuse_file_info* fi) {
  Guarded(req, [&] {
    Result<size_t> n =
        AdapterOf(req).fs().Write(HandleOf(fi), static_cast<uint64_t>(off), buf, size);
    if (!n.ok()) {
      fuse_reply_err(req, n.code());
      return;
    }
    fuse_reply_write(req, *n);
  });
}

// With splice off, libfuse hands write_buf the request's own memory: those
// buffers go to WriteIter as they are, with no copy in the daemon. A buffer
// that is a file descriptor (splice) is copied into the thread's buffer.
void OpWriteBuf(fuse_req_t req, fuse_ino_t /*ino*/, fuse_bufvec* bufv, off_t off,
                fuse_file_info* fi) {
  Guarded(req, [&] {
    Filesystem& fs = AdapterOf(req).fs();
    const FileHandle file = HandleOf(fi);
    const uint64_t offset = static_cast<uint64_t>(off);
    ThreadBuffers& tb = t_buffers;
    std::vector<iovec>& iov = tb.write_iov();
    iov.clear();
    size_t total = 0;
    bool from_fd = false;
    for (size_t i = bufv->idx; i < bufv->count; ++i) {
      const fuse_buf& b = bufv->buf[i];
      const size_t skip = i == bufv->idx ? bufv->off : 0;
      if (b.size <= skip) continue;
      total += b.size - skip;
      if (b.flags & FUSE_BUF_IS_FD) {
        from_fd = true;
      } else {
        iov.push_back({static_cast<char*>(b.mem) + skip, b.size - skip});
      }
    }
    Result<size_t> n = size_t{0};
    if (!from_fd) {
      n = fs.WriteIter(file, offset, iov.data(), static_cast<int>(iov.size()));
    } else {
      tb.Reserve(total, fs.block_size());
      fuse_bufvec dst = MemoryBufvec(tb.data(), total);
      const ssize_t got = fuse_buf_copy(&dst, bufv, FUSE_BUF_NO_SPLICE);
      if (got < 0) {
        fuse_reply_err(req, static_cast<int>(-got));
        return;
      }
      n = fs.Write(file, offset, tb.data(), static_cast<size_t>(got));
    }
    if (!n.ok()) {
      fuse_reply_err(req, n.code());
      return;
    }
    fuse_reply_write(req, *n);
  });
}

void OpFallocate(fuse_req_t req, fuse_ino_t /*ino*/, int mode, off_t offset, off_t length,
                 fuse_file_info* fi) {
  Guarded(req, [&] {
    if (offset < 0 || length <= 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    ReplyStatus(req, AdapterOf(req).fs().Fallocate(HandleOf(fi), mode,
                                                   static_cast<uint64_t>(offset),
                                                   static_cast<uint64_t>(length)));
  });
}

// The kernel answers SEEK_SET/CUR/END itself; SEEK_DATA and SEEK_HOLE come here.
void OpLseek(fuse_req_t req, fuse_ino_t /*ino*/, off_t off, int whence, fuse_file_info* fi) {
  Guarded(req, [&] {
    if (off < 0) {
      fuse_reply_err(req, ENXIO);
      return;
    }
    Result<uint64_t> pos =
        AdapterOf(req).fs().Lseek(HandleOf(fi), static_cast<uint64_t>(off), whence);
    if (!pos.ok()) {
      fuse_reply_err(req, pos.code());
      return;
    }
    fuse_reply_lseek(req, static_cast<off_t>(*pos));
  });
}

// ---------------------------------------------------------------------------
// Directories
// ---------------------------------------------------------------------------

void OpOpendir(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
  // Directory streams need no state: the core's cookies resume anywhere.
  fi->fh = 0;
  fuse_reply_open(req, fi);
}

void OpReleasedir(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* /*fi*/) {
  fuse_reply_err(req, 0);
}

void OpFsyncdir(fuse_req_t req, fuse_ino_t /*ino*/, int /*datasync*/, fuse_file_info* /*fi*/) {
  fuse_reply_err(req, 0);  // directory operations are durable when they return
}

// readdir and readdirplus: entries from `cookie` on, as many as fit in `size`
// bytes; each entry's offset is the core's cookie that resumes after it.
// readdirplus takes a reference (LookupInode) only for an entry that fits,
// and none for "." and ".." (the kernel ignores their attributes); an entry
// whose inode went away after the listing copied it is left out.
void ListDirectory(fuse_req_t req, fuse_ino_t ino, size_t size, off_t cookie, bool plus) {
  FuseAdapter& adapter = AdapterOf(req);
  Filesystem& fs = adapter.fs();
  ThreadBuffers& tb = t_buffers;
  tb.Reserve(size, fs.block_size());
  tb.looked_up().clear();
  struct Listing {
    fuse_req_t req;
    FuseAdapter& adapter;
    ThreadBuffers& tb;
    size_t size;
    bool plus;
    size_t used = 0;
    int error = 0;
  } l{req, adapter, tb, size, plus};
  // One capture, so the std::function stores it without allocating.
  auto add = [s = &l](const Filesystem::DirEntry& e, uint64_t next) {
    char* out = s->tb.data() + s->used;
    const size_t room = s->size - s->used;
    char* name = s->tb.name();
    const size_t len = std::min<size_t>(e.name.size(), format::kNameMax);
    std::memcpy(name, e.name.data(), len);
    name[len] = '\0';
    if (!s->plus) {
      struct stat attr {};
      attr.st_ino = e.ino;
      attr.st_mode = e.type << 12;
      const size_t need =
          fuse_add_direntry(s->req, out, room, name, &attr, static_cast<off_t>(next));
      if (need > room) return false;
      s->used += need;
      return true;
    }
    const size_t need = fuse_add_direntry_plus(s->req, nullptr, 0, name, nullptr, 0);
    if (need > room) return false;
    fuse_entry_param entry{};
    if (e.name == "." || e.name == "..") {
      entry.attr.st_ino = e.ino;
      entry.attr.st_mode = e.type << 12;
    } else {
      Result<Attr> attr = s->adapter.fs().LookupInode(e.ino);
      if (!attr.ok()) {
        if (attr.code() == ESTALE) return true;  // removed meanwhile
        s->error = attr.code();
        return false;
      }
      s->tb.looked_up().push_back(e.ino);
      entry = ToEntry(s->adapter, *attr);
    }
    fuse_add_direntry_plus(s->req, out, room, name, &entry, static_cast<off_t>(next));
    s->used += need;
    return true;
  };
  Status st;
  try {
    st = fs.ReadDir(ino, static_cast<uint64_t>(cookie), add);
  } catch (...) {
    for (uint64_t looked_up : tb.looked_up()) fs.Forget(looked_up, 1);
    throw;  // Guarded replies
  }
  if (l.used == 0 && (!st.ok() || l.error != 0)) {
    fuse_reply_err(req, st.ok() ? l.error : st.code());
    return;
  }
  // A failure after some entries: they go out now, the error on the next call.
  if (fuse_reply_buf(req, tb.data(), l.used) != 0) {
    for (uint64_t looked_up : tb.looked_up()) fs.Forget(looked_up, 1);
  }
}

void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* /*fi*/) {
  Guarded(req, [&] { ListDirectory(req, ino, size, off, false); });
}

void OpReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   fuse_file_info* /*fi*/) {
  Guarded(req, [&] { ListDirectory(req, ino, size, off, true); });
}

// ---------------------------------------------------------------------------
// Extended attributes
// ---------------------------------------------------------------------------

void OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags) {
  Guarded(req, [&] {
    ReplyStatus(req, AdapterOf(req).fs().SetXattr(ino, name, value, size, flags));
  });
}

// size 0 asks for the size (fuse_reply_xattr); otherwise the value, or ERANGE.
void OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  Guarded(req, [&] {
    Filesystem& fs = AdapterOf(req).fs();
    ThreadBuffers& tb = t_buffers;
    if (size != 0) tb.Reserve(size, fs.block_size());
    Result<size_t> n = fs.GetXattr(ino, name, size != 0 ? tb.data() : nullptr, size);
    if (!n.ok()) {
      fuse_reply_err(req, n.code());
    } else if (size == 0) {
      fuse_reply_xattr(req, *n);
    } else {
      fuse_reply_buf(req, tb.data(), *n);
    }
  });
}

void OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  Guarded(req, [&] {
    Filesystem& fs = AdapterOf(req).fs();
    ThreadBuffers& tb = t_buffers;
    if (size != 0) tb.Reserve(size, fs.block_size());
    Result<size_t> n = fs.ListXattr(ino, size != 0 ? tb.data() : nullptr, size);
    if (!n.ok()) {
      fuse_reply_err(req, n.code());
    } else if (size == 0) {
      fuse_reply_xattr(req, *n);
    } else {
      fuse_reply_buf(req, tb.data(), *n);
    }
  });
}

void OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  Guarded(req, [&] { ReplyStatus(req, AdapterOf(req).fs().RemoveXattr(ino, name)); });
}

}  // namespace

const fuse_lowlevel_ops& FuseAdapter::Ops() {
  static const fuse_lowlevel_ops ops = [] {
    fuse_lowlevel_ops o{};
    o.init = OpInit;
    o.lookup = OpLookup;
    o.forget = OpForget;
    o.forget_multi = OpForgetMulti;
    o.getattr = OpGetattr;
    o.setattr = OpSetattr;
    o.readlink = OpReadlink;
    o.mknod = OpMknod;
    o.mkdir = OpMkdir;
    o.unlink = OpUnlink;
    o.rmdir = OpRmdir;
    o.symlink = OpSymlink;
    o.rename = OpRename;
    o.link = OpLink;
    o.open = OpOpen;
    o.read = OpRead;
    o.write = OpWrite;
    o.write_buf = OpWriteBuf;
    o.flush = OpFlush;
    o.release = OpRelease;
    o.fsync = OpFsync;
    o.opendir = OpOpendir;
    o.readdir = OpReaddir;
    o.readdirplus = OpReaddirplus;
    o.releasedir = OpReleasedir;
    o.fsyncdir = OpFsyncdir;
    o.statfs = OpStatfs;
    o.setxattr = OpSetxattr;
    o.getxattr = OpGetxattr;
    o.listxattr = OpListxattr;
    o.removexattr = OpRemovexattr;
    o.create = OpCreate;
    o.fallocate = OpFallocate;
    o.lseek = OpLseek;
    return o;
  }();
  return ops;
}

}  // namespace nvfs
