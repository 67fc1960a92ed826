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
  if (req.valid & kSetMode) {
    tx.Set(inode.mode, static_cast<uint16_t>((inode.mode & S_IFMT) | (req.mode & 07777)));
  }
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

Result<FileHandle> Filesystem::Open(uint64_t ino, int flags) {
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  const int access = flags & O_ACCMODE;
  {
    std::unique_lock lock(ref.value()->lock);
    const Inode& inode = ref->media();
    if (S_ISDIR(inode.mode) && access != O_RDONLY) return Error(EISDIR);
    if (access != O_RDONLY && read_only_) return Error(EROFS);
    if ((flags & O_TRUNC) && access != O_RDONLY && S_ISREG(inode.mode) && inode.size != 0) {
      const MappingChange change(ref->get());  // lock-free readers retry
      const timespec now = FsOps::Now();
      Tx tx(*journal_, "open-truncate");
      FsOps::Touch(tx, inode, true, true, now);
      NVFS_TRY(FsOps::Resize(*this, ino, 0, &tx));
      NVFS_TRY(tx.Commit());
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
