// Open files and the data path: open, create, release, flush, fsync, the
// three read paths, write and write_buf, fallocate, lseek.
#include <fcntl.h>
#include <sys/uio.h>

#include <vector>

#include "fuse/ops.hpp"
#include "fuse/thread_buffers.hpp"
#include "fuse/transport.hpp"

namespace nvfs::fuse_ops {

namespace {

// The open(2) flags the core's handle gets. With the page cache the kernel
// positions O_APPEND writes itself (under the inode lock, at its i_size),
// and writes back mmap'ed pages through whichever writable handle it picks,
// possibly an O_APPEND one: the core must then write at the offset it is
// given. With direct I/O the core appends atomically; the only pages written
// back are a shared mapping's (FUSE_DIRECT_IO_ALLOW_MMAP), marked
// FUSE_WRITE_CACHE, and those land at their offset (WriteFlags).
int CoreOpenFlags(const FuseAdapter& adapter, int flags) {
  if (adapter.options().cache == CacheMode::kPage) flags &= ~O_APPEND;
  return flags;
}

// Fills the open reply for `file`, which the adapter then tracks until
// RELEASE (or session end). If tracking fails (std::bad_alloc) the file is
// released and the exception goes on to Guarded.
void SetOpenReply(FuseAdapter& adapter, fuse_ino_t ino, fuse_file_info* fi, FileHandle file) {
  try {
    adapter.TrackOpen(file);
  } catch (...) {
    adapter.fs().Release(file);
    throw;
  }
  fi->fh = reinterpret_cast<uint64_t>(file);
  if (adapter.options().cache == CacheMode::kNone) {
    fi->direct_io = 1;
  } else {
    // Only the kernel changes the file, so its cached pages stay valid;
    // but for an asynchronous direct write's (adapter.hpp, DirectWritten).
    fi->keep_cache = adapter.OpenMustDropCache(ino) ? 0 : 1;
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

}  // namespace

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    // O_TRUNC by a caller without CAP_FSETID (FUSE_OPEN_KILL_SUIDGID).
    const unsigned io_flags = (RequestKillsPrivs() ? kKillSuidgid : 0u) |
                              ((fi->flags & O_APPEND) ? kOpenAppend : 0u);
    Result<FileHandle> file = adapter.fs().Open(ino, CoreOpenFlags(adapter, fi->flags), io_flags);
    if (!file.ok()) {
      fuse_reply_err(req, file.code());
      return;
    }
    SetOpenReply(adapter, ino, fi, *file);
    if (fuse_reply_open(req, fi) != 0) {
      adapter.UntrackOpen(*file);
      adapter.fs().Release(*file);
    }
  });
}

// O_CREAT: the kernel sends CREATE only for a name it believes absent, and
// it holds the directory's i_rwsem exclusively from that belief to our reply
// (fs/namei.c, open_last_lookups), so no create, link or rename of its own
// can slip in between; a name exists here only if the kernel's negative
// dentry was wrong. Opening the
// file we find instead would skip every check the kernel makes before an
// open of an existing file (permission for the access mode and for O_TRUNC,
// EISDIR, O_NOFOLLOW, ...), so a core EEXIST is never turned into an open.
// With O_EXCL, EEXIST is the answer. Without it, EEXIST would be wrong for
// open(2), and fuse_atomic_open passes it straight to the caller (it only
// invalidates the dentry first). ESTALE is the answer that ends well:
// do_filp_open retries the whole open once with LOOKUP_REVAL, which makes
// fuse_dentry_revalidate drop the negative dentry and look the name up
// afresh, and the kernel then opens the file it finds by its normal path,
// with its own checks. Only if the name vanishes and reappears again in
// between does the caller see ESTALE.
void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Filesystem& fs = adapter.fs();
    const int flags = CoreOpenFlags(adapter, fi->flags);
    Attr attr;
    // O_TMPFILE arrives here as a CREATE of the name "/" (transport.hpp).
    Result<FileHandle> file = RequestIsTmpfile()
                                  ? fs.Tmpfile(parent, mode, flags, CredOf(req), &attr)
                                  : fs.Create(parent, name, mode, flags, CredOf(req), &attr);
    if (!file.ok() && file.code() == EEXIST && !(fi->flags & O_EXCL)) {
      fuse_reply_err(req, ESTALE);
      return;
    }
    if (!file.ok()) {
      fuse_reply_err(req, file.code());
      return;
    }
    const fuse_entry_param e = ToEntry(adapter, attr);
    try {
      SetOpenReply(adapter, attr.ino, fi, *file);
    } catch (...) {
      fs.Forget(attr.ino, 1);
      throw;
    }
    if (fuse_reply_create(req, &e, fi) != 0) {
      adapter.UntrackOpen(*file);
      fs.Release(*file);
      fs.Forget(attr.ino, 1);
    }
  });
}

void OpRelease(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    adapter.UntrackOpen(HandleOf(fi));
    adapter.fs().Release(HandleOf(fi));
    fuse_reply_err(req, 0);
  });
}

void OpFlush(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* /*fi*/) noexcept {
  fuse_reply_err(req, 0);  // every write is durable already (and open sets noflush)
}

// Every write is durable when its reply leaves (the core's Fsync has nothing
// to do), so the first FSYNC answers ENOSYS: the kernel then stops sending
// FSYNC for the connection (fc->no_fsync) and fsync(2) returns 0 after its
// own part, which is the part that matters (fs/fuse/file.c, fuse_fsync:
// it writes back the dirty pages of a shared mapping or of cache=page, as
// FUSE_WRITEs that are durable when answered, and waits for them and their
// errors before it would send FSYNC). That spares every fsync a round trip:
// an append + fsync loop takes one request per append instead of two.
void OpFsync(fuse_req_t req, fuse_ino_t /*ino*/, int /*datasync*/,
             fuse_file_info* /*fi*/) noexcept {
  fuse_reply_err(req, ENOSYS);
}

// Reads `size` bytes at `off` through the configured read path.
//   read: one copy into the thread's buffer, one reply buffer.
//   iter: the same buffer described as 4 KiB segments (what the kernel's
//         read_iter would hand a filesystem), one reply buffer.
//   map:  the runs inside the mapping go to the kernel as they are: one run
//         by fuse_reply_data (libfuse writev()s a single memory buffer
//         without copying or allocating; FUSE_BUF_NO_SPLICE, so no page is
//         referenced after it returns), several by fuse_reply_iov (one
//         writev; libfuse's fuse_reply_data would copy them into a fresh
//         malloc'ed buffer first). The kernel copies out of the runs during
//         that writev, after Map returned, so the MapGuard spans Map and the
//         reply: a block the file frees meanwhile (truncate, punch, O_TRUNC)
//         is not given to another file until the writev is done. A write
//         racing with the read may show in it, as with any read racing a
//         write. The page cache's fills (cache=page) come here too.
void OpRead(fuse_req_t req, fuse_ino_t /*ino*/, size_t size, off_t off,
            fuse_file_info* fi) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Filesystem& fs = adapter.fs();
    const FileHandle file = HandleOf(fi);
    const uint64_t offset = static_cast<uint64_t>(off);
    if (size == 0) {
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    // cache=none: a page fill is a shared mapping's, whose stores the
    // kernel writes back later; their blocks are found now (BackMappedRange:
    // a write-back that fails loses the stores, and the kernel fails the
    // file's next read with its error). Ignored when they cannot be: the
    // pages read as they are all the same.
    if (adapter.options().cache == CacheMode::kNone && RequestFillsPages()) {
      (void)fs.BackMappedRange(file, offset, size);
    }
    ThreadBuffers& tb = LocalBuffers();
    tb.Reserve(size, fs.block_size());
    ReadPath path = adapter.options().read_path;
    if (path == ReadPath::kMap) {
      std::vector<ReadRun>& runs = tb.runs();
      size_t count = 0;
      const MapGuard held;  // until the reply is written
      Result<size_t> n = fs.RecoverMediaErrors(file, [&] {
        return fs.Map(file, offset, size, runs.data(), runs.size(), &count, held);
      });
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
      n = fs.RecoverMediaErrors(
          file, [&] { return fs.ReadIter(file, offset, seg.data(), static_cast<int>(count)); });
      seg[count - 1] = last;
    } else {
      n = fs.RecoverMediaErrors(file, [&] { return fs.Read(file, offset, tb.data(), size); });
    }
    if (!n.ok()) {
      fuse_reply_err(req, n.code());
      return;
    }
    fuse_reply_buf(req, tb.data(), *n);
  });
}

// A write by a caller without CAP_FSETID drops the file's privileges
// (adapter.hpp), in the core, before any byte lands; the core then says so
// (MountOptions::privs_dropped), and the adapter makes the kernel forget the
// mode it caches. The kernel marks such
// writes (FUSE_WRITE_KILL_SUIDGID: every direct write, and with
// KILLPRIV_V2 cached ones too); the transport reads the mark. A write-back
// of a shared mapping's pages (FUSE_WRITE_CACHE) carries no such mark (a
// store through a mapping keeps set-user-ID, as on ext4, whose page_mkwrite
// drops nothing either) and lands at its own offset, also through an
// O_APPEND handle (cache=none keeps O_APPEND in the core, see CoreOpenFlags).
static unsigned WriteFlags() {
  return (RequestKillsPrivs() ? kKillSuidgid : 0u) | (RequestWritesBack() ? kAtOffset : 0u);
}

// After a direct write with the page cache on, pages of the old bytes may
// be cached (adapter.hpp, DirectWritten). The flags are the file's at the
// time of the write (fcntl F_SETFL O_DIRECT included).
static void AfterWrite(FuseAdapter& adapter, fuse_ino_t ino, const fuse_file_info* fi,
                       uint64_t off, size_t written) {
  if (adapter.options().cache == CacheMode::kPage && (fi->flags & O_DIRECT) &&
      !RequestWritesBack()) {
    adapter.DirectWritten(ino, off, written);
  }
}

void OpWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
             fuse_file_info* fi) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Filesystem& fs = adapter.fs();
    Result<size_t> n =
        fs.Write(HandleOf(fi), static_cast<uint64_t>(off), buf, size, WriteFlags());
    if (!n.ok()) {
      fuse_reply_err(req, n.code());
      return;
    }
    AfterWrite(adapter, ino, fi, static_cast<uint64_t>(off), *n);
    fuse_reply_write(req, *n);
  });
}

// With splice off, libfuse hands write_buf the request's own memory: those
// buffers go to WriteIter as they are, with no copy in the daemon. A buffer
// that is a file descriptor (splice) is copied into the thread's buffer.
void OpWriteBuf(fuse_req_t req, fuse_ino_t ino, fuse_bufvec* bufv, off_t off,
                fuse_file_info* fi) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Filesystem& fs = adapter.fs();
    const FileHandle file = HandleOf(fi);
    const uint64_t offset = static_cast<uint64_t>(off);
    ThreadBuffers& tb = LocalBuffers();
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
    const unsigned flags = WriteFlags();
    if (!from_fd) {
      n = fs.WriteIter(file, offset, iov.data(), static_cast<int>(iov.size()), flags);
    } else {
      tb.Reserve(total, fs.block_size());
      fuse_bufvec dst = MemoryBufvec(tb.data(), total);
      const ssize_t got = fuse_buf_copy(&dst, bufv, FUSE_BUF_NO_SPLICE);
      if (got < 0) {
        fuse_reply_err(req, static_cast<int>(-got));
        return;
      }
      n = fs.Write(file, offset, tb.data(), static_cast<size_t>(got), flags);
    }
    if (!n.ok()) {
      fuse_reply_err(req, n.code());
      return;
    }
    AfterWrite(adapter, ino, fi, static_cast<uint64_t>(off), *n);
    fuse_reply_write(req, *n);
  });
}

void OpFallocate(fuse_req_t req, fuse_ino_t /*ino*/, int mode, off_t offset, off_t length,
                 fuse_file_info* fi) noexcept {
  Guarded(req, [&] {
    if (offset < 0 || length <= 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    FuseAdapter& adapter = AdapterOf(req);
    Filesystem& fs = adapter.fs();
    // The kernel marks no fallocate (it neither drops privileges itself nor
    // says whether the caller has CAP_FSETID): root stands for it.
    const bool unprivileged = fuse_req_ctx(req)->uid != 0;
    const Status st = fs.Fallocate(HandleOf(fi), mode, static_cast<uint64_t>(offset),
                                   static_cast<uint64_t>(length),
                                   unprivileged ? kKillSuidgid : 0u);
    ReplyStatus(req, st);
  });
}

// The kernel answers SEEK_SET/CUR/END itself; SEEK_DATA and SEEK_HOLE come here.
void OpLseek(fuse_req_t req, fuse_ino_t /*ino*/, off_t off, int whence,
             fuse_file_info* fi) noexcept {
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

}  // namespace nvfs::fuse_ops
