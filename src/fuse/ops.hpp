// What the adapter's callbacks share (src/fuse/*.cpp): the conversions from
// core results to FUSE replies, the exception boundary, and the callbacks
// themselves, which adapter.cpp collects into the fuse_lowlevel_ops table.
// adapter.hpp states the rules every callback follows.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <new>

#include "fuse/adapter.hpp"

namespace nvfs::fuse_ops {

inline FuseAdapter& AdapterOf(fuse_req_t req) {
  return *static_cast<FuseAdapter*>(fuse_req_userdata(req));
}

inline FileHandle HandleOf(const fuse_file_info* fi) { return reinterpret_cast<FileHandle>(fi->fh); }

// The caller; the umask is the one the kernel sent with MKNOD, MKDIR and
// CREATE (FUSE_DONT_MASK: the core applies it, or the parent's default ACL
// in its place), 0 for other requests.
inline Cred CredOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return Cred{ctx->uid, ctx->gid, static_cast<uint32_t>(ctx->umask)};
}

inline struct stat ToStat(const Attr& a) {
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

// How long the kernel may keep `a`: not at all while the file's size moves
// without the daemon (an open append word: Attr::size_moving).
inline double AttrTimeout(const FuseAdapter& adapter, const Attr& a) {
  return a.size_moving ? 0.0 : adapter.options().attr_timeout;
}

inline fuse_entry_param ToEntry(const FuseAdapter& adapter, const Attr& a) {
  fuse_entry_param e{};
  e.ino = a.ino;
  e.generation = a.generation;
  e.attr = ToStat(a);
  e.attr_timeout = AttrTimeout(adapter, a);
  e.entry_timeout = adapter.options().entry_timeout;
  return e;
}

// The request the calling thread is serving (set by Guarded), for the
// core's questions about its caller (CallerInGroup).
inline thread_local fuse_req_t current_request = nullptr;

// Runs a callback body; an exception still owes the request its one reply
// (bodies reply last; fuse_reply_* do not throw, nor does what may follow a
// reply that failed: Forget, Release and UntrackOpen are noexcept. So an
// exception always comes before the reply, and the catch never answers a
// request libfuse has already freed).
template <class Body>
void Guarded(fuse_req_t req, Body&& body) noexcept {
  const fuse_req_t outer = current_request;
  current_request = req;
  try {
    body();
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (...) {
    fuse_reply_err(req, EIO);
  }
  current_request = outer;
}

// Replies to a request that hands the kernel one reference on success.
inline void ReplyEntry(fuse_req_t req, FuseAdapter& adapter, const Result<Attr>& attr) {
  if (!attr.ok()) {
    fuse_reply_err(req, attr.code());
    return;
  }
  const fuse_entry_param e = ToEntry(adapter, *attr);
  if (fuse_reply_entry(req, &e) != 0) adapter.fs().Forget(attr->ino, 1);
}

inline void ReplyStatus(fuse_req_t req, const Status& status) { fuse_reply_err(req, status.code()); }

// Session (adapter.cpp)
void OpInit(void* userdata, fuse_conn_info* conn) noexcept;

// Names (namei.cpp)
void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) noexcept;
void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) noexcept;
void OpForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) noexcept;
void OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) noexcept;
void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) noexcept;
void OpSymlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) noexcept;
void OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name) noexcept;
void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) noexcept;
void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) noexcept;
void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
              const char* new_name, unsigned int flags) noexcept;
void OpReadlink(fuse_req_t req, fuse_ino_t ino) noexcept;

// Attributes and extended attributes (attr.cpp)
void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept;
void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
               fuse_file_info* fi) noexcept;
void OpStatfs(fuse_req_t req, fuse_ino_t ino) noexcept;
void OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags) noexcept;
void OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) noexcept;
void OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) noexcept;
void OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) noexcept;
void OpIoctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void* arg, fuse_file_info* fi,
             unsigned flags, const void* in_buf, size_t in_bufsz, size_t out_bufsz) noexcept;

// Files and the data path (file.cpp)
void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept;
void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) noexcept;
void OpRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept;
void OpFlush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept;
void OpFsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi) noexcept;
void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) noexcept;
void OpWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
             fuse_file_info* fi) noexcept;
void OpWriteBuf(fuse_req_t req, fuse_ino_t ino, fuse_bufvec* bufv, off_t off,
                fuse_file_info* fi) noexcept;
void OpFallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
                 fuse_file_info* fi) noexcept;
void OpLseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info* fi) noexcept;

// Directories (dir.cpp)
void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept;
void OpReleasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) noexcept;
void OpFsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi) noexcept;
void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) noexcept;
void OpReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   fuse_file_info* fi) noexcept;

}  // namespace nvfs::fuse_ops
