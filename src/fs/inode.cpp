// Attributes, open and release.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <new>
#include <optional>

#include "fs/fs_impl.hpp"

namespace nvfs {

using format::Inode;

Result<Attr> FsImpl::GetAttr(uint64_t ino) {
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::shared_lock lock(ref.value()->lock);
  return MakeAttr(ino, ref->media());
}

uint32_t FsImpl::KilledModeFor(uint32_t mode, uint32_t gid) const {
  mode = KilledMode(mode);
  if ((mode & S_ISGID) && caller_in_group_ && !caller_in_group_(gid)) mode &= ~S_ISGID;
  return mode;
}

Result<bool> FsImpl::HasPrivs(const Inode& inode, bool suidgid) {
  if (!S_ISREG(inode.mode)) return false;
  if (suidgid && KilledModeFor(inode.mode, inode.gid) != inode.mode) return true;
  return HasCapability(inode);
}

// Order: the mode, then the attribute block (copy on write, published by
// one logged store), in the caller's transaction.
Status FsImpl::KillPrivs(uint64_t ino, const Inode& inode, bool suidgid, Tx& tx, timespec now) {
  if (!S_ISREG(inode.mode)) return Status::Ok();
  const uint32_t mode = suidgid ? KilledModeFor(inode.mode, inode.gid) : inode.mode;
  if (mode != inode.mode) tx.Set(inode.mode, static_cast<uint16_t>(mode));
  NVFS_TRY(RemoveCapability(ino, inode, tx));
  Touch(tx, inode, false, true, now);
  return Status::Ok();
}

Status FsImpl::KillPrivsFirst(uint64_t ino, const Inode& inode, bool suidgid) {
  Result<bool> has = HasPrivs(inode, suidgid);
  if (!has.ok()) return has.take_error();
  if (!*has) return Status::Ok();
  const uint16_t mode = inode.mode;
  Tx tx(*journal_, "kill-privs");
  NVFS_TRY(KillPrivs(ino, inode, suidgid, tx, Now()));
  NVFS_TRY(tx.Commit());
  if (inode.mode != mode) PrivsDropped(ino);
  return Status::Ok();
}

void FsImpl::PrivsDropped(uint64_t ino) {
  if (privs_dropped_) privs_dropped_(ino);
}

// One transaction changes every requested field, the size included (a
// truncation too large for one transaction continues in further ones, with
// the inode on the orphan list: the new size is visible from the first commit).
Result<Attr> FsImpl::SetAttr(uint64_t ino, const SetAttrRequest& req) {
  if (read_only_) return Error(EROFS);
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  NVFS_TRY(CloseAppend(ref->get()));
  // Lock-free readers care only about the size (and the mapping a
  // truncation changes), direct writers also about the mode and owner:
  // begun only for those, before the Tx so that an abort's undo happens
  // under it too.
  std::optional<MappingChange> change;
  const Inode& inode = ref->media();
  if (req.valid & kSetSize) {
    if (S_ISDIR(inode.mode)) return Error(EISDIR);
    if (!S_ISREG(inode.mode)) return Error(EINVAL);
  }
  // chattr's attributes (notify_change, do_truncate): nothing changes an
  // immutable inode; an append-only one may only have its times set to now.
  if (Immutable(inode)) return Error(EPERM);
  if (AppendOnly(inode) &&
      (req.valid & (kSetMode | kSetUid | kSetGid | kSetSize | kSetAtime | kSetMtime))) {
    return Error(EPERM);
  }
  // A direct writer maps again after a change of mode or owner, and the
  // daemon looks at the set-ID bits again (src/daemon/direct_server.cpp).
  if (req.valid & (kSetSize | kSetMode | kSetUid | kSetGid)) change.emplace(ref->get());
  const timespec now = Now();
  OrphanTx tx(*this, "setattr");
  // Privileges go in the same transaction as the size or owner change that
  // takes them away (include/nvfs/fs.hpp), after a requested mode, so that they go from
  // it too.
  const bool changes_file = S_ISREG(inode.mode) &&
                            (((req.valid & kSetSize) && req.size != inode.size) ||
                             ((req.valid & kSetUid) && req.uid != inode.uid) ||
                             ((req.valid & kSetGid) && req.gid != inode.gid));
  if (changes_file) NVFS_TRY(RemoveCapability(ino, inode, tx));
  uint32_t mode = inode.mode;
  if (req.valid & kSetMode) mode = (inode.mode & S_IFMT) | (req.mode & 07777);
  if ((req.valid & kSetKillSuidgid) && (req.valid & (kSetSize | kSetUid | kSetGid)) &&
      !S_ISDIR(inode.mode)) {
    // A truncate's mark says the caller lacks CAP_FSETID; a chown's is sent
    // for every caller, root's too (the kernel's fuse_do_setattr).
    const bool truncate_only = (req.valid & kSetSize) && !(req.valid & (kSetUid | kSetGid));
    mode = truncate_only ? KilledModeFor(mode, inode.gid) : KilledMode(mode);
  }
  // A chmod carries into the access ACL (posix_acl_chmod), before ctime is
  // set below.
  if (req.valid & kSetMode) NVFS_TRY(ChmodAcl(tx, ino, inode, mode, now));
  if (mode != inode.mode) tx.Set(inode.mode, static_cast<uint16_t>(mode));
  if (req.valid & kSetUid) tx.Set(inode.uid, req.uid);
  if (req.valid & kSetGid) tx.Set(inode.gid, req.gid);
  if (req.valid & (kSetAtime | kSetAtimeNow)) {
    const timespec t = (req.valid & kSetAtimeNow) ? now : req.atime;
    tx.Set(inode.atime_sec, static_cast<int64_t>(t.tv_sec));
    tx.Set(inode.atime_nsec, static_cast<uint32_t>(t.tv_nsec));
  }
  if (req.valid & (kSetMtime | kSetMtimeNow)) {
    const timespec t = (req.valid & kSetMtimeNow) ? now : req.mtime;
    tx.Set(inode.mtime_sec, static_cast<int64_t>(t.tv_sec));
    tx.Set(inode.mtime_nsec, static_cast<uint32_t>(t.tv_nsec));
  }
  const timespec ctime = (req.valid & kSetCtime) ? req.ctime : now;
  tx.Set(inode.ctime_sec, static_cast<int64_t>(ctime.tv_sec));
  tx.Set(inode.ctime_nsec, static_cast<uint32_t>(ctime.tv_nsec));
  if ((req.valid & kSetSize) && req.size != inode.size) {
    // POSIX: a size change updates mtime too, unless it was given.
    if (!(req.valid & (kSetMtime | kSetMtimeNow))) Touch(tx, inode, true, false, now);
    NVFS_TRY(Resize(ino, req.size, &tx));
  }
  NVFS_TRY(tx.Commit());  // a no-op if a long truncation committed it already
  return MakeAttr(ino, inode);
}

namespace {

// FS_*_FL (<linux/fs.h>, what FS_IOC_GETFLAGS speaks) <-> kInodeFlag*.
struct FlagName {
  uint32_t fs;
  uint32_t media;
};
constexpr FlagName kFlagNames[] = {
    {FS_IMMUTABLE_FL, format::kInodeFlagImmutable}, {FS_APPEND_FL, format::kInodeFlagAppend},
    {FS_NODUMP_FL, format::kInodeFlagNoDump},       {FS_NOATIME_FL, format::kInodeFlagNoAtime},
    {FS_SYNC_FL, format::kInodeFlagSync},
};

uint32_t ToFsFlags(uint32_t media) {
  uint32_t fs = 0;
  for (const FlagName& f : kFlagNames) {
    if (media & f.media) fs |= f.fs;
  }
  return fs;
}

// UINT32_MAX for a bit nvfs does not keep.
uint32_t ToMediaFlags(uint32_t fs) {
  uint32_t media = 0;
  for (const FlagName& f : kFlagNames) {
    if (fs & f.fs) {
      media |= f.media;
      fs &= ~f.fs;
    }
  }
  return fs == 0 ? media : UINT32_MAX;
}

}  // namespace

Result<uint32_t> FsImpl::GetInodeFlags(uint64_t ino) {
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::shared_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (!S_ISREG(inode.mode) && !S_ISDIR(inode.mode)) return Error(ENOTTY);
  return ToFsFlags(inode.flags);
}

// One logged store of `flags` (the orphan bit kept as it is: orphan_mu_,
// which guards it, is held) and ctime.
Status FsImpl::SetInodeFlags(uint64_t ino, uint32_t fs_flags, const Cred& cred) {
  if (read_only_) return Error(EROFS);
  const uint32_t wanted = ToMediaFlags(fs_flags);
  if (wanted == UINT32_MAX) return Error(EOPNOTSUPP);
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (!S_ISREG(inode.mode) && !S_ISDIR(inode.mode)) return Error(ENOTTY);
  if (cred.uid != 0 && cred.uid != inode.uid) return Error(EPERM);
  const uint32_t changed = (inode.flags & format::kInodeAttrFlags) ^ wanted;
  if ((changed & (format::kInodeFlagImmutable | format::kInodeFlagAppend)) && cred.uid != 0) {
    return Error(EPERM);
  }
  // ext4's rule: a file that is and stays immutable keeps its other flags.
  if (Immutable(inode) && (wanted & format::kInodeFlagImmutable) &&
      (changed & ~format::kInodeFlagImmutable)) {
    return Error(EPERM);
  }
  if (changed == 0) return Status::Ok();
  // Immutable or append-only from now on: no direct writer's append may
  // move the size past this (its word closes, the file's seq moves).
  std::optional<MappingChange> change;
  if (changed & (format::kInodeFlagImmutable | format::kInodeFlagAppend)) {
    NVFS_TRY(CloseAppend(ref->get()));
    change.emplace(ref->get());
  }
  OrphanTx tx(*this, "setflags");
  tx.LockOrphans();  // the flags word holds the orphan bit
  tx.Set(inode.flags, (inode.flags & ~format::kInodeAttrFlags) | wanted);
  Touch(tx, inode, false, true, Now());
  return tx.Commit();
}

Result<FileHandle> FsImpl::Open(uint64_t ino, int flags, unsigned io_flags) {
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  const int access = flags & O_ACCMODE;
  {
    std::unique_lock lock(ref.value()->lock);
    const Inode& inode = ref->media();
    if (S_ISDIR(inode.mode) && access != O_RDONLY) return Error(EISDIR);
    if ((flags & O_TRUNC) && access != O_RDONLY) NVFS_TRY(CloseAppend(ref->get()));
    if (access != O_RDONLY && read_only_) return Error(EROFS);
    // chattr's attributes (may_open): no writer of an immutable file; an
    // append-only one only through O_APPEND, and never truncated.
    if (access != O_RDONLY && Immutable(inode)) return Error(EPERM);
    const bool append = (flags & O_APPEND) || (io_flags & kOpenAppend);
    if (access != O_RDONLY && AppendOnly(inode) && (!append || (flags & O_TRUNC))) {
      return Error(EPERM);
    }
    const bool truncating = (flags & O_TRUNC) && access != O_RDONLY && S_ISREG(inode.mode);
    const bool suidgid = io_flags & kKillSuidgid;
    if (truncating && inode.size != 0) {
      const MappingChange change(ref->get());  // lock-free readers retry
      const timespec now = Now();
      const uint16_t mode = inode.mode;
      OrphanTx tx(*this, "open-truncate");
      NVFS_TRY(KillPrivs(ino, inode, suidgid, tx, now));
      Touch(tx, inode, true, true, now);
      NVFS_TRY(Resize(ino, 0, &tx));
      NVFS_TRY(tx.Commit());
      if (inode.mode != mode) PrivsDropped(ino);
    } else if (truncating) {
      // Nothing to cut, but a truncation all the same (as do_truncate).
      NVFS_TRY(KillPrivsFirst(ino, inode, suidgid));
    }
    // Under the lock: FreeUnlinkedData, holding it, must see every open.
    cache_->AddOpen(ref->get());
  }
  return new OpenFile{ref->get(), flags};
}

void FsImpl::Release(FileHandle file) noexcept {
  CachedInode* inode = file->inode;
  delete file;
  bool free_data = false;
  if (CachedInode* unlinked = cache_->CloseOpen(inode, &free_data)) {
    ReclaimIdleNoThrow(unlinked);
  } else if (free_data) {
    // The last open file of an unlinked inode the kernel still holds (an
    // O_PATH descriptor, a cached dentry): its data goes now, the inode at
    // the FORGET; a failure leaves the blocks to reclaim. The kernel may
    // have the old size cached (and, cache=page, pages from one open to the
    // next): told, a reopen through /proc/self/fd fetches the new one and
    // drops the pages past it.
    const InodeRef ref(*this, inode);  // the pin CloseOpen took
    const char* what = nullptr;
    try {
      std::unique_lock lock(inode->lock);
      (void)CloseAppend(inode);  // folded, so that the freeing sees every block in use
      const uint64_t size = inode->media->size;
      if (FreeUnlinkedData(inode).ok() && size != inode->media->size && data_freed_) {
        data_freed_(inode->ino);
      }
    } catch (const std::bad_alloc&) {
      what = "out of memory";
    } catch (...) {
      what = "unexpected exception";
    }
    if (what != nullptr) {
      std::fprintf(stderr, "nvfs: freeing the data of unlinked inode %" PRIu64 " failed (%s); "
                   "it goes with the inode\n", inode->ino, what);
    }
  }
}

uint64_t FsImpl::HandleIno(FileHandle file) const { return file->inode->ino; }

}  // namespace nvfs
