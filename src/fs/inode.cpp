// Attributes, open and release.
#include <fcntl.h>
#include <sys/stat.h>

#include <optional>

#include "fs/fs_impl.hpp"

namespace nvfs {

using format::Inode;

Result<Attr> Filesystem::GetAttr(uint64_t ino) {
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  std::shared_lock lock(ref.value()->lock);
  return FsOps::MakeAttr(*this, ino, ref->media());
}

Result<bool> FsOps::HasPrivs(Filesystem& fs, const Inode& inode, bool suidgid) {
  if (!S_ISREG(inode.mode)) return false;
  if (suidgid && KilledMode(inode.mode) != inode.mode) return true;
  return HasCapability(fs, inode);
}

// Order: the mode, then the attribute block (copy on write, published by
// one logged store), in the caller's transaction.
Status FsOps::KillPrivs(Filesystem& fs, uint64_t ino, const Inode& inode, bool suidgid, Tx& tx,
                        timespec now) {
  if (!S_ISREG(inode.mode)) return Status::Ok();
  const uint32_t mode = suidgid ? KilledMode(inode.mode) : inode.mode;
  if (mode != inode.mode) tx.Set(inode.mode, static_cast<uint16_t>(mode));
  NVFS_TRY(RemoveCapability(fs, ino, inode, tx));
  Touch(tx, inode, false, true, now);
  return Status::Ok();
}

Status FsOps::KillPrivsFirst(Filesystem& fs, uint64_t ino, const Inode& inode, bool suidgid) {
  Result<bool> has = HasPrivs(fs, inode, suidgid);
  if (!has.ok()) return has.take_error();
  if (!*has) return Status::Ok();
  const uint16_t mode = inode.mode;
  Tx tx(Jnl(fs), "kill-privs");
  NVFS_TRY(KillPrivs(fs, ino, inode, suidgid, tx, Now()));
  NVFS_TRY(tx.Commit());
  if (inode.mode != mode) PrivsDropped(fs, ino);
  return Status::Ok();
}

void FsOps::PrivsDropped(Filesystem& fs, uint64_t ino) {
  if (fs.privs_dropped_) fs.privs_dropped_(ino);
}

// One transaction changes every requested field, the size included (a
// truncation too large for one transaction continues in further ones, with
// the inode on the orphan list: the new size is visible from the first commit).
Result<Attr> Filesystem::SetAttr(uint64_t ino, const SetAttrRequest& req) {
  if (read_only_) return Error(EROFS);
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  // Lock-free readers care only about the size (and the mapping a
  // truncation changes): begun only for a size change, before the Tx so
  // that an abort's undo happens under it too.
  std::optional<MappingChange> change;
  const Inode& inode = ref->media();
  if (req.valid & kSetSize) {
    if (S_ISDIR(inode.mode)) return Error(EISDIR);
    if (!S_ISREG(inode.mode)) return Error(EINVAL);
  }
  const timespec now = FsOps::Now();
  Tx tx(*journal_, "setattr");
  // Privileges go in the same transaction as the size or owner change that
  // takes them away (fs.hpp), after a requested mode, so that they go from
  // it too.
  const bool changes_file = S_ISREG(inode.mode) &&
                            (((req.valid & kSetSize) && req.size != inode.size) ||
                             ((req.valid & kSetUid) && req.uid != inode.uid) ||
                             ((req.valid & kSetGid) && req.gid != inode.gid));
  if (changes_file) NVFS_TRY(FsOps::RemoveCapability(*this, ino, inode, tx));
  uint32_t mode = inode.mode;
  if (req.valid & kSetMode) mode = (inode.mode & S_IFMT) | (req.mode & 07777);
  if ((req.valid & kSetKillSuidgid) && (req.valid & (kSetSize | kSetUid | kSetGid)) &&
      !S_ISDIR(inode.mode)) {
    mode = FsOps::KilledMode(mode);
  }
  // A chmod carries into the access ACL (posix_acl_chmod), before ctime is
  // set below.
  if (req.valid & kSetMode) NVFS_TRY(FsOps::ChmodAcl(*this, tx, ino, inode, mode, now));
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
    if (!(req.valid & (kSetMtime | kSetMtimeNow))) FsOps::Touch(tx, inode, true, false, now);
    change.emplace(ref->get());
    NVFS_TRY(FsOps::Resize(*this, ino, req.size, &tx));
  }
  NVFS_TRY(tx.Commit());  // a no-op if a long truncation committed it already
  return FsOps::MakeAttr(*this, ino, inode);
}

Result<FileHandle> Filesystem::Open(uint64_t ino, int flags, unsigned io_flags) {
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  const int access = flags & O_ACCMODE;
  {
    std::unique_lock lock(ref.value()->lock);
    const Inode& inode = ref->media();
    if (S_ISDIR(inode.mode) && access != O_RDONLY) return Error(EISDIR);
    if (access != O_RDONLY && read_only_) return Error(EROFS);
    const bool truncating = (flags & O_TRUNC) && access != O_RDONLY && S_ISREG(inode.mode);
    const bool suidgid = io_flags & kKillSuidgid;
    if (truncating && inode.size != 0) {
      const MappingChange change(ref->get());  // lock-free readers retry
      const timespec now = FsOps::Now();
      const uint16_t mode = inode.mode;
      Tx tx(*journal_, "open-truncate");
      NVFS_TRY(FsOps::KillPrivs(*this, ino, inode, suidgid, tx, now));
      FsOps::Touch(tx, inode, true, true, now);
      NVFS_TRY(FsOps::Resize(*this, ino, 0, &tx));
      NVFS_TRY(tx.Commit());
      if (inode.mode != mode) FsOps::PrivsDropped(*this, ino);
    } else if (truncating) {
      // Nothing to cut, but a truncation all the same (as do_truncate).
      NVFS_TRY(FsOps::KillPrivsFirst(*this, ino, inode, suidgid));
    }
  }
  cache_->AddOpen(ref->get());
  return new OpenFile{ref->get(), flags};
}

void Filesystem::Release(FileHandle file) {
  CachedInode* inode = file->inode;
  delete file;
  if (CachedInode* unlinked = cache_->CloseOpen(inode)) FsOps::ReclaimIdle(*this, unlinked);
}

uint64_t Filesystem::HandleIno(FileHandle file) const { return file->inode->ino; }

}  // namespace nvfs
