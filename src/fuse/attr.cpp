// Attributes (getattr, setattr, statfs) and extended attributes.
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstring>


#include "fuse/kernel_abi.hpp"
#include "fuse/ops.hpp"
#include "fuse/transport.hpp"
#include "fuse/thread_buffers.hpp"

namespace nvfs::fuse_ops {

namespace {

// chattr's attributes (Filesystem::GetInodeFlags) that statx(2) reports,
// each FS_*_FL with its STATX_ATTR_*.
constexpr struct {
  uint32_t fs_flag;
  uint64_t statx_attr;
} kStatxAttrs[] = {
    {FS_IMMUTABLE_FL, STATX_ATTR_IMMUTABLE},
    {FS_APPEND_FL, STATX_ATTR_APPEND},
    {FS_NODUMP_FL, STATX_ATTR_NODUMP},
};

kernel_abi::SxTime ToSxTime(const timespec& t) {
  return kernel_abi::SxTime{t.tv_sec, static_cast<uint32_t>(t.tv_nsec), 0};
}

// The reply to a FUSE_STATX (transport.hpp): the basic stats and the
// creation time, all of them always (the kernel caches the basic stats
// only from a reply that has every one, fuse_do_statx), and the chattr
// attributes. Only regular files and directories carry those
// (GetInodeFlags: ENOTTY for the rest, which have none).
void ReplyStatx(fuse_req_t req, FuseAdapter& adapter, fuse_ino_t ino, const Attr& a) {
  uint32_t fs_flags = 0;
  if (S_ISREG(a.mode) || S_ISDIR(a.mode)) {
    Result<uint32_t> got = adapter.fs().GetInodeFlags(ino);
    if (!got.ok()) {
      fuse_reply_err(req, got.code());
      return;
    }
    fs_flags = *got;
  }
  kernel_abi::StatxOut out{};
  const double timeout = std::max(AttrTimeout(adapter, a), 0.0);  // as fuse_reply_attr
  out.attr_valid = static_cast<uint64_t>(timeout);
  out.attr_valid_nsec = static_cast<uint32_t>((timeout - static_cast<double>(out.attr_valid)) * 1e9);
  kernel_abi::Statx& sx = out.stat;
  sx.mask = STATX_BASIC_STATS | STATX_BTIME;
  sx.blksize = a.blksize;
  for (const auto& x : kStatxAttrs) {
    sx.attributes_mask |= x.statx_attr;
    if (fs_flags & x.fs_flag) sx.attributes |= x.statx_attr;
  }
  sx.nlink = a.nlink;
  sx.uid = a.uid;
  sx.gid = a.gid;
  sx.mode = static_cast<uint16_t>(a.mode);
  sx.ino = a.ino;
  sx.size = a.size;
  sx.blocks = a.blocks;
  sx.atime = ToSxTime(a.atime);
  sx.btime = ToSxTime(a.btime);
  sx.ctime = ToSxTime(a.ctime);
  sx.mtime = ToSxTime(a.mtime);
  sx.rdev_major = major(static_cast<dev_t>(a.rdev));
  sx.rdev_minor = minor(static_cast<dev_t>(a.rdev));
  fuse_reply_buf(req, reinterpret_cast<const char*>(&out), sizeof out);
}

}  // namespace

// GETATTR, and FUSE_STATX served as one (transport.hpp).
void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* /*fi*/) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Result<Attr> attr = adapter.fs().GetAttr(ino);
    if (!attr.ok()) {
      fuse_reply_err(req, attr.code());
      return;
    }
    if (RequestIsStatx()) {
      ReplyStatx(req, adapter, ino, *attr);
      return;
    }
    const struct stat st = ToStat(*attr);
    fuse_reply_attr(req, &st, AttrTimeout(adapter, *attr));
  });
}

// FUSE_SET_ATTR_* to the core's SetAttrRequest. The size is changed through
// the inode whether or not the kernel names a handle (ftruncate): the
// handle's inode is `ino`, and an open handle keeps it alive.
void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
               fuse_file_info* /*fi*/) noexcept {
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
    // FATTR_KILL_SUIDGID (KILLPRIV_V2; libfuse passes it under this name):
    // a truncate by a caller without CAP_FSETID, or a chown.
    if ((to_set & FUSE_SET_ATTR_KILL_SUID) && (r.valid & (kSetSize | kSetUid | kSetGid))) {
      r.valid |= kSetKillSuidgid;
    }
    // Nothing the core stores (only FORCE or KILL_* bits): no change, and
    // no ctime update either.
    Result<Attr> result = r.valid == 0 ? adapter.fs().GetAttr(ino) : adapter.fs().SetAttr(ino, r);
    if (!result.ok()) {
      fuse_reply_err(req, result.code());
      return;
    }
    const struct stat st = ToStat(*result);
    fuse_reply_attr(req, &st, AttrTimeout(adapter, *result));
  });
}

void OpStatfs(fuse_req_t req, fuse_ino_t /*ino*/) noexcept {
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
    sv.f_bavail = s->blocks_avail;  // none reserved for root; less the pointer blocks
    sv.f_files = s->inodes;
    sv.f_ffree = s->inodes_free;
    sv.f_favail = s->inodes_free;
    sv.f_namemax = s->name_max;
    fuse_reply_statfs(req, &sv);
  });
}

// The xattr namespace rules (of system.* only the POSIX ACL names) are the
// core's; ListXattr needs the caller's credentials (adapter.hpp). Setting
// an access ACL clears set-group-ID where the kernel marks the request
// (FUSE_SETXATTR_ACL_KILL_SGID, read by the transport).
void OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags) noexcept {
  Guarded(req, [&] {
    const unsigned xattr_flags = RequestKillsSgid() ? unsigned{kXattrKillSgid} : 0u;
    ReplyStatus(req, AdapterOf(req).fs().SetXattr(ino, name, value, size, flags, xattr_flags));
  });
}

// getxattr and listxattr: size 0 asks for the size (fuse_reply_xattr);
// otherwise `query` fills a buffer of `size` bytes (or fails, ERANGE if it
// is too small) and the bytes are the reply.
template <class Query>
static void ReplyXattrQuery(fuse_req_t req, size_t size, Query&& query) {
  Filesystem& fs = AdapterOf(req).fs();
  ThreadBuffers& tb = LocalBuffers();
  if (size != 0) tb.Reserve(size, fs.block_size());
  Result<size_t> n = query(fs, size != 0 ? tb.data() : nullptr);
  if (!n.ok()) {
    fuse_reply_err(req, n.code());
  } else if (size == 0) {
    fuse_reply_xattr(req, *n);
  } else {
    fuse_reply_buf(req, tb.data(), *n);
  }
}

void OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) noexcept {
  Guarded(req, [&] {
    ReplyXattrQuery(req, size, [&](Filesystem& fs, char* buf) {
      return fs.GetXattr(ino, name, buf, size);
    });
  });
}

void OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) noexcept {
  Guarded(req, [&] {
    const Cred cred = CredOf(req);
    ReplyXattrQuery(req, size, [&](Filesystem& fs, char* buf) {
      return fs.ListXattr(ino, buf, size, cred);
    });
  });
}

void OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) noexcept {
  Guarded(req, [&] {
    ReplyStatus(req, AdapterOf(req).fs().RemoveXattr(ino, name));
  });
}

namespace {

// FS_XFLAG_* (struct fsxattr, FS_IOC_FSGETXATTR) <-> FS_*_FL: the five
// attributes the core keeps (Filesystem::GetInodeFlags).
constexpr struct {
  uint32_t xflag;
  uint32_t flag;
} kXflags[] = {
    {FS_XFLAG_IMMUTABLE, FS_IMMUTABLE_FL}, {FS_XFLAG_APPEND, FS_APPEND_FL},
    {FS_XFLAG_NODUMP, FS_NODUMP_FL},       {FS_XFLAG_NOATIME, FS_NOATIME_FL},
    {FS_XFLAG_SYNC, FS_SYNC_FL},
};

}  // namespace

// chattr, lsattr, xfs_io's chattr/lsattr: the kernel answers FS_IOC_GETFLAGS,
// FS_IOC_SETFLAGS, FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR itself
// (vfs_fileattr_get/set, which check ownership and CAP_LINUX_IMMUTABLE) and
// asks the daemon through fuse_fileattr_get/set (fs/fuse/ioctl.c): a
// restricted FUSE_IOCTL of the same command on a handle it opened O_RDONLY
// for the purpose (none for a directory without OPENDIR: so only `ino` is
// used), the flags as a 4-byte unsigned int (not the ioctl's long), or a
// struct fsxattr. Every other command is ENOTTY, as for a filesystem
// without ioctls.
void OpIoctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void* /*arg*/, fuse_file_info* /*fi*/,
             unsigned /*flags*/, const void* in_buf, size_t in_bufsz, size_t out_bufsz) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    Filesystem& fs = adapter.fs();
    const auto set = [&](uint32_t fs_flags) {
      const Status st = fs.SetInodeFlags(ino, fs_flags, CredOf(req));
      if (st.ok()) adapter.ForgetCachedAttr(ino);  // its ctime moved
      if (!st.ok()) {
        fuse_reply_err(req, st.code());
      } else {
        fuse_reply_ioctl(req, 0, nullptr, 0);
      }
    };
    switch (cmd) {
      case FS_IOC_GETFLAGS: {
        uint32_t value = 0;
        if (out_bufsz < sizeof value) break;
        Result<uint32_t> got = fs.GetInodeFlags(ino);
        if (!got.ok()) {
          fuse_reply_err(req, got.code());
          return;
        }
        value = *got;
        fuse_reply_ioctl(req, 0, &value, sizeof value);
        return;
      }
      case FS_IOC_SETFLAGS: {
        uint32_t value = 0;
        if (in_bufsz < sizeof value) break;
        std::memcpy(&value, in_buf, sizeof value);
        set(value);
        return;
      }
      case FS_IOC_FSGETXATTR: {
        fsxattr fsx{};
        if (out_bufsz < sizeof fsx) break;
        Result<uint32_t> got = fs.GetInodeFlags(ino);
        if (!got.ok()) {
          fuse_reply_err(req, got.code());
          return;
        }
        for (const auto& x : kXflags) {
          if (*got & x.flag) fsx.fsx_xflags |= x.xflag;
        }
        fuse_reply_ioctl(req, 0, &fsx, sizeof fsx);
        return;
      }
      case FS_IOC_FSSETXATTR: {
        fsxattr fsx{};
        if (in_bufsz < sizeof fsx) break;
        std::memcpy(&fsx, in_buf, sizeof fsx);
        // No extent size hints, no project quotas.
        if (fsx.fsx_extsize != 0 || fsx.fsx_projid != 0 || fsx.fsx_cowextsize != 0) {
          fuse_reply_err(req, EOPNOTSUPP);
          return;
        }
        uint32_t value = 0;
        for (const auto& x : kXflags) {
          if (fsx.fsx_xflags & x.xflag) {
            value |= x.flag;
            fsx.fsx_xflags &= ~x.xflag;
          }
        }
        if (fsx.fsx_xflags != 0) {
          fuse_reply_err(req, EOPNOTSUPP);
          return;
        }
        set(value);
        return;
      }
      default:
        fuse_reply_err(req, ENOTTY);
        return;
    }
    fuse_reply_err(req, EINVAL);  // a buffer too small for the command
  });
}

}  // namespace nvfs::fuse_ops
