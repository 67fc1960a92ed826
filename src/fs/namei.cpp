// Names: lookup, create, link, unlink, rename (readdir and readlink: readdir.cpp).
//
// Every operation here that changes a directory holds tree_mu_ exclusively
// and the exclusive locks of the inodes it changes until its transaction has
// committed; see the lock order in src/fs/fs_impl.hpp. Within a transaction
// the order of the logged stores does not matter for crash safety (the undo
// journal makes the whole operation atomic); doc/integrity.md section 6 lists
// what each one stores.
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <vector>

#include "fs/fs_impl.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::Inode;

namespace {

bool IsDotOrDotDot(std::string_view name) { return name == "." || name == ".."; }

// ENOENT for an empty name, ENAMETOOLONG past 255 bytes, EINVAL for '/' or NUL.
Status CheckName(std::string_view name) {
  if (name.empty()) return Error(ENOENT);
  if (name.size() > format::kNameMax) return Error(ENAMETOOLONG);
  if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) {
    return Error(EINVAL);
  }
  return Status::Ok();
}

// A directory that can take a new entry: a live directory.
Status CheckParent(const Inode& dir) {
  if (!S_ISDIR(dir.mode)) return Error(ENOTDIR);
  if (dir.nlink == 0) return Error(ENOENT);
  return Status::Ok();
}

// The directory an operation holding tree_mu_ changes: pinned, then locked
// exclusively (the lock goes first: members go in reverse).
struct LockedDir {
  InodeRef ref;
  std::unique_lock<std::shared_mutex> lock;
};

Result<LockedDir> PinAndLockDir(FsImpl& fs, uint64_t ino) {
  Result<InodeRef> ref = fs.Get(ino);
  if (!ref.ok()) return ref.take_error();
  LockedDir dir{std::move(*ref), {}};
  dir.lock = std::unique_lock(dir.ref->lock);
  return dir;
}

// Two inodes an operation holding tree_mu_ changes, pinned, then locked
// exclusively in the order given (tree_mu_ makes it the only writer, so
// any order is safe); the second lock only if it is another inode. Members
// go in reverse: the locks before the pins.
struct LockedPair {
  InodeRef first, second;
  std::unique_lock<std::shared_mutex> first_lock, second_lock;
};

Result<LockedPair> PinAndLock(FsImpl& fs, uint64_t first, uint64_t second) {
  Result<InodeRef> a = fs.Get(first);
  if (!a.ok()) return a.take_error();
  Result<InodeRef> b = fs.Get(second);
  if (!b.ok()) return b.take_error();
  LockedPair pair{std::move(*a), std::move(*b), {}, {}};
  pair.first_lock = std::unique_lock(pair.first->lock);
  pair.second_lock = std::unique_lock(pair.second->lock, std::defer_lock);
  if (second != first) pair.second_lock.lock();
  return pair;
}

}  // namespace

Result<Attr> FsImpl::Lookup(uint64_t parent, std::string_view name) {
  uint64_t ino = 0;
  {
    Result<InodeRef> dir = Get(parent);
    if (!dir.ok()) return dir.take_error();
    std::shared_lock lock(dir.value()->lock);
    const Inode& d = dir->media();
    if (!S_ISDIR(d.mode)) return Error(ENOTDIR);
    if (name == ".") {
      ino = parent;
    } else if (name == "..") {
      ino = d.parent;
    } else {
      NVFS_TRY(CheckName(name));
      Result<DirEntryRef> entry = dir_->Lookup(d, name);
      if (!entry.ok()) return entry.error().code == EUCLEAN ? Error(EIO) : entry.take_error();
      ino = entry->ino;
    }
  }
  Result<InodeRef> child = Get(ino);
  if (!child.ok()) return child.error().code == ESTALE ? Error(EIO) : child.take_error();
  std::shared_lock lock(child.value()->lock);
  cache_->AddLookups(child->get(), 1);
  return MakeAttr(ino, child->media());
}

Result<Attr> FsImpl::LookupInode(uint64_t ino) {
  Result<InodeRef> inode = Get(ino);
  if (!inode.ok()) return inode.take_error();
  std::shared_lock lock(inode.value()->lock);
  cache_->AddLookups(inode->get(), 1);
  return MakeAttr(ino, inode->media());
}

void FsImpl::Forget(uint64_t ino, uint64_t count) noexcept {
  if (CachedInode* unlinked = cache_->ForgetLookups(ino, count)) {
    ReclaimIdleNoThrow(unlinked);
  }
}

void FsImpl::ForgetAll() noexcept {
  // Each on its own: a reclaim that throws leaves its inode on the orphan
  // list, but every other one is still reclaimed and leaves the cache.
  std::vector<CachedInode*> unlinked;
  try {
    unlinked = cache_->ForgetAllLookups();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "nvfs: forgetting every reference: out of memory; unlinked inodes "
                 "stay on the orphan list until the next mount\n");
    return;
  }
  for (CachedInode* inode : unlinked) ReclaimIdleNoThrow(inode);
}

struct FsImpl::NewEntry {
  uint32_t mode;
  uint64_t rdev = 0;
  std::string_view symlink_target;
};

// Shared by mknod, mkdir, symlink and create: allocates and writes the inode
// (fresh), inserts the name, adjusts the parent, all in one transaction.
Result<Attr> FsImpl::CreateEntry(uint64_t parent, std::string_view name, const NewEntry& entry,
                                 const Cred& cred, InodeRef* out) {
  if (read_only()) return Error(EROFS);
  if (IsDotOrDotDot(name)) return Error(EEXIST);
  NVFS_TRY(CheckName(name));
  std::unique_lock tree(tree_mu_);
  Result<LockedDir> dir = PinAndLockDir(*this, parent);
  if (!dir.ok()) return dir.take_error();
  const Inode& d = dir->ref.media();
  NVFS_TRY(CheckParent(d));
  if (Immutable(d)) return Error(EPERM);
  Result<DirEntryRef> existing = dir_->Lookup(d, name);
  if (existing.ok()) return Error(EEXIST);
  if (existing.error().code != ENOENT) return Error(EIO);
  const bool is_dir = S_ISDIR(entry.mode);
  if (is_dir && d.nlink >= kLinkMax) return Error(EMLINK);

  // The parent's default ACL, else the umask, masks the mode (acl.cpp); what
  // the new inode inherits is stored in this transaction.
  InheritedAcl acl;
  Result<uint32_t> mode = InheritAcl(parent, d, entry.mode, cred.umask, &acl);
  if (!mode.ok()) return mode.take_error();

  const timespec now = Now();
  Tx tx(*journal_, S_ISDIR(entry.mode) ? "mkdir" : S_ISLNK(entry.mode) ? "symlink" : "create");
  Result<uint64_t> ino = NewInode(tx, d, parent, *mode, entry.rdev, cred, now);
  if (!ino.ok()) return ino.take_error();
  const Inode& inode = ctx_->InodeAt(*ino);
  if (S_ISLNK(entry.mode)) {
    const std::string_view target = entry.symlink_target;
    if (target.size() <= format::kInlineSymlinkMax) {
      tx.StoreFresh(tx.OffsetOf(inode.map.symlink), target.data(), target.size());
    } else {
      Result<Extent> block = bmap_->MapForWrite(tx, inode, 0, 1, false);
      if (!block.ok()) return block.take_error();
      tx.StoreFresh(geometry_->BlockOffset(block->first), target.data(), target.size());
    }
    tx.Set(inode.size, uint64_t{target.size()});
  }
  NVFS_TRY(StoreInheritedAcl(tx, *ino, inode, acl, now));
  NVFS_TRY(dir_->Insert(tx, d, name, *ino, DirType(entry.mode)));
  if (is_dir) tx.Set(d.nlink, d.nlink + 1);
  Touch(tx, d, true, true, now);
  NVFS_TRY(tx.Commit());

  Result<InodeRef> child = Get(*ino);
  if (!child.ok()) return child.take_error();
  Attr attr = MakeAttr(*ino, inode);
  *out = std::move(child.value());
  return attr;
}

Result<Attr> FsImpl::Mknod(uint64_t parent, std::string_view name, uint32_t mode,
                           uint64_t rdev, const Cred& cred) {
  switch (mode & S_IFMT) {
    case 0: mode |= S_IFREG; break;
    case S_IFREG: case S_IFCHR: case S_IFBLK: case S_IFIFO: case S_IFSOCK: break;
    default: return Error(EINVAL);
  }
  InodeRef ref;
  Result<Attr> attr = CreateEntry(parent, name, {mode & (S_IFMT | 07777), rdev, {}}, cred, &ref);
  if (attr.ok()) cache_->AddLookups(ref.get(), 1);
  return attr;
}

Result<Attr> FsImpl::Mkdir(uint64_t parent, std::string_view name, uint32_t mode,
                           const Cred& cred) {
  InodeRef ref;
  Result<Attr> attr = CreateEntry(parent, name, {S_IFDIR | (mode & 07777), 0, {}}, cred, &ref);
  if (attr.ok()) cache_->AddLookups(ref.get(), 1);
  return attr;
}

Result<Attr> FsImpl::Symlink(uint64_t parent, std::string_view name,
                             std::string_view target, const Cred& cred) {
  if (target.empty()) return Error(ENOENT);
  if (target.size() > format::kSymlinkMax) return Error(ENAMETOOLONG);
  InodeRef ref;
  Result<Attr> attr = CreateEntry(parent, name, {S_IFLNK | 0777, 0, target}, cred, &ref);
  if (attr.ok()) cache_->AddLookups(ref.get(), 1);
  return attr;
}

Result<FileHandle> FsImpl::Create(uint64_t parent, std::string_view name, uint32_t mode,
                                  int flags, const Cred& cred, Attr* attr) {
  InodeRef ref;
  Result<Attr> created = CreateEntry(parent, name, {S_IFREG | (mode & 07777), 0, {}}, cred, &ref);
  if (!created.ok()) return created.take_error();
  if (attr != nullptr) *attr = *created;
  cache_->AddLookups(ref.get(), 1);
  cache_->AddOpen(ref.get());
  return new OpenFile{ref.get(), flags};
}

// One transaction: the inode (fresh), link count 0, onto the orphan list.
// No directory changes, so no tree_mu_; the parent is only read (its group,
// its set-group-ID bit) under its shared lock.
Result<FileHandle> FsImpl::Tmpfile(uint64_t parent, uint32_t mode, int flags,
                                   const Cred& cred, Attr* attr) {
  if (read_only_) return Error(EROFS);
  Result<InodeRef> dir = Get(parent);
  if (!dir.ok()) return dir.take_error();
  uint64_t ino;
  {
    std::shared_lock dir_lock(dir.value()->lock);
    const Inode& d = dir->media();
    NVFS_TRY(CheckParent(d));
    if (Immutable(d)) return Error(EPERM);
    // As for a named file: the parent's default ACL, else the umask (the
    // kernel applies neither with FUSE_DONT_MASK).
    InheritedAcl acl;
    Result<uint32_t> masked = InheritAcl(parent, d, S_IFREG | (mode & 07777), cred.umask, &acl);
    if (!masked.ok()) return masked.take_error();
    const timespec now = Now();
    OrphanTx tx(*this, "tmpfile");
    Result<uint64_t> made = NewInode(tx, d, parent, *masked, 0, cred, now);
    if (!made.ok()) return made.take_error();
    ino = *made;
    const Inode& inode = ctx_->InodeAt(ino);
    NVFS_TRY(StoreInheritedAcl(tx, ino, inode, acl, now));
    tx.Set(inode.nlink, uint32_t{0});
    OrphanAdd(tx, ino);
    NVFS_TRY(tx.Commit());
  }
  Result<InodeRef> file = Get(ino);
  if (!file.ok()) return file.take_error();
  {
    std::unique_lock lock(file.value()->lock);
    file.value()->linkable = true;
    if (attr != nullptr) *attr = MakeAttr(ino, file->media());
  }
  cache_->AddLookups(file->get(), 1);
  cache_->AddOpen(file->get());
  return new OpenFile{file->get(), flags};
}

Result<Attr> FsImpl::Link(uint64_t ino, uint64_t new_parent, std::string_view new_name) {
  if (read_only_) return Error(EROFS);
  if (IsDotOrDotDot(new_name)) return Error(EEXIST);
  NVFS_TRY(CheckName(new_name));
  std::unique_lock tree(tree_mu_);
  Result<LockedPair> pair = PinAndLock(*this, new_parent, ino);
  if (!pair.ok()) return pair.take_error();
  InodeRef& target = pair->second;
  const Inode& d = pair->first.media();
  const Inode& inode = target.media();
  NVFS_TRY(CheckParent(d));
  if (S_ISDIR(inode.mode)) return Error(EPERM);
  if (Immutable(d) || Pinned(inode)) return Error(EPERM);
  // Of the unlinked, only a file made by Tmpfile gets a name again.
  const bool first_name = inode.nlink == 0 && target->linkable;
  if (inode.nlink == 0 && !first_name) return Error(ENOENT);
  if (inode.nlink >= kLinkMax) return Error(EMLINK);
  Result<DirEntryRef> existing = dir_->Lookup(d, new_name);
  if (existing.ok()) return Error(EEXIST);
  if (existing.error().code != ENOENT) return Error(EIO);
  // The orphan list is an open append word's record for a crash: the word
  // goes first (folded) when a name takes the file off it.
  if (first_name) NVFS_TRY(CloseAppend(target.get()));
  const timespec now = Now();
  OrphanTx tx(*this, "link");
  NVFS_TRY(dir_->Insert(tx, d, new_name, ino, DirType(inode.mode)));
  tx.Set(inode.nlink, inode.nlink + 1);
  if (first_name) NVFS_TRY(OrphanRemove(tx, ino));
  Touch(tx, inode, false, true, now);
  Touch(tx, d, true, true, now);
  NVFS_TRY(tx.Commit());
  if (first_name) target->linkable = false;
  cache_->AddLookups(target.get(), 1);
  return MakeAttr(ino, inode);
}

// Unlink and rmdir: one transaction removes the name, drops the link count
// and, at zero, puts the inode on the orphan list; the inode itself is freed
// when its last reference goes (InodeCache::Unpin, FsImpl::ReclaimIdle), or
// at the next mount. A regular file left with no link and no open file
// loses its data at once, in transactions after that one
// (FsImpl::FreeUnlinkedData), under its own lock only.
Status FsImpl::RemoveEntry(uint64_t parent, std::string_view name, bool rmdir) {
  if (read_only()) return Error(EROFS);
  if (name == ".") return Error(rmdir ? EINVAL : EISDIR);
  if (name == "..") return Error(rmdir ? ENOTEMPTY : EISDIR);
  NVFS_TRY(CheckName(name));
  std::unique_lock tree(tree_mu_);
  Result<LockedDir> dir = PinAndLockDir(*this, parent);
  if (!dir.ok()) return dir.take_error();
  const Inode& d = dir->ref.media();
  if (!S_ISDIR(d.mode)) return Error(ENOTDIR);
  Result<DirEntryRef> entry = dir_->Lookup(d, name);
  if (!entry.ok()) return entry.error().code == ENOENT ? Error(ENOENT) : Error(EIO);
  Result<InodeRef> child = Get(entry->ino);
  if (!child.ok()) return Error(EIO);
  std::unique_lock child_lock(child.value()->lock);
  const Inode& inode = child->media();
  // EPERM first, as the kernel's may_delete answers it before any type or
  // emptiness check (fstests generic/079: rmdir of a non-empty directory
  // that is immutable or in an append-only one).
  if (Pinned(d) || Pinned(inode)) return Error(EPERM);
  if (rmdir) {
    if (!S_ISDIR(inode.mode)) return Error(ENOTDIR);
    if (inode.map.dir.entries != 0) return Error(ENOTEMPTY);
  } else if (S_ISDIR(inode.mode)) {
    return Error(EISDIR);
  }
  const timespec now = Now();
  OrphanTx tx(*this, rmdir ? "rmdir" : "unlink");
  NVFS_TRY(dir_->Remove(tx, d, name));
  const uint32_t nlink = rmdir ? 0 : inode.nlink - 1;
  tx.Set(inode.nlink, nlink);
  Touch(tx, inode, false, true, now);
  if (rmdir) tx.Set(d.nlink, d.nlink - 1);
  Touch(tx, d, true, true, now);
  if (nlink == 0) OrphanAdd(tx, child->ino());
  NVFS_TRY(tx.Commit());
  if (nlink == 0 && !rmdir) {
    // The name is gone: nothing else here needs the directory locks. A
    // failure leaves the blocks to reclaim; the unlink stands.
    dir->lock.unlock();
    tree.unlock();
    (void)FreeUnlinkedData(child.value().get());
  }
  return Status::Ok();
}

Status FsImpl::Unlink(uint64_t parent, std::string_view name) {
  return RemoveEntry(parent, name, false);
}

Status FsImpl::Rmdir(uint64_t parent, std::string_view name) {
  return RemoveEntry(parent, name, true);
}

// True if directory `ino` is `ancestor` or lies below it. REQUIRES: tree_mu_
// held exclusively (parent fields change only under it).
Result<bool> FsImpl::IsWithin(uint64_t ino, uint64_t ancestor) {
  uint64_t steps = 0;
  for (;;) {
    if (ino == ancestor) return true;
    if (ino == format::kRootIno) return false;
    if (!CheckIno(ino).ok() || ++steps > geometry_->inode_count()) {
      return Error(EIO);
    }
    ino = ctx_->InodeAt(ino).parent;
  }
}

// RENAME_WHITEOUT (overlayfs): the source name is left naming a new
// whiteout, a character device 0:0 of mode 0 owned by the caller, made in
// the same transaction (so no crash shows the rename without it, nor the
// whiteout without the rename). Only CAP_MKNOD may ask (the kernel checks).
Status FsImpl::Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                      std::string_view new_name, unsigned flags, const Cred& cred) {
  if (read_only_) return Error(EROFS);
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT)) return Error(EINVAL);
  // As do_renameat2: EXCHANGE goes with neither of the others.
  if ((flags & RENAME_EXCHANGE) && (flags & (RENAME_NOREPLACE | RENAME_WHITEOUT))) {
    return Error(EINVAL);
  }
  const bool exchange = flags & RENAME_EXCHANGE;
  const bool whiteout = flags & RENAME_WHITEOUT;
  if (IsDotOrDotDot(name) || IsDotOrDotDot(new_name)) return Error(EINVAL);
  NVFS_TRY(CheckName(name));
  NVFS_TRY(CheckName(new_name));

  std::unique_lock tree(tree_mu_);
  Result<LockedPair> dirs = PinAndLock(*this, parent, new_parent);
  if (!dirs.ok()) return dirs.take_error();
  std::unique_lock<std::shared_mutex>& src_dir_lock = dirs->first_lock;
  std::unique_lock<std::shared_mutex>& dst_dir_lock = dirs->second_lock;
  const Inode& sd = dirs->first.media();
  const Inode& dd = dirs->second.media();
  if (!S_ISDIR(sd.mode) || !S_ISDIR(dd.mode)) return Error(ENOTDIR);
  if (dd.nlink == 0) return Error(ENOENT);

  Result<DirEntryRef> src_entry = dir_->Lookup(sd, name);
  if (!src_entry.ok()) return src_entry.error().code == ENOENT ? Error(ENOENT) : Error(EIO);
  Result<DirEntryRef> dst_entry = dir_->Lookup(dd, new_name);
  const bool have_dst = dst_entry.ok();
  if (!have_dst && dst_entry.error().code != ENOENT) return Error(EIO);
  if (exchange && !have_dst) return Error(ENOENT);
  if ((flags & RENAME_NOREPLACE) && have_dst) return Error(EEXIST);
  const uint64_t src_ino = src_entry->ino;
  const uint64_t dst_ino = have_dst ? dst_entry->ino : 0;
  if (src_ino == dst_ino) return Status::Ok();  // two names of one inode: nothing to do

  // The source or the target may be one of the parents (a directory moved
  // into itself, or over its own parent): each inode is locked once.
  Result<InodeRef> src = Get(src_ino);
  if (!src.ok()) return Error(EIO);
  std::unique_lock src_lock(src.value()->lock, std::defer_lock);
  if (src_ino != parent && src_ino != new_parent) src_lock.lock();
  InodeRef dst;
  std::unique_lock<std::shared_mutex> dst_lock;
  if (have_dst) {
    Result<InodeRef> got = Get(dst_ino);
    if (!got.ok()) return Error(EIO);
    dst = std::move(got.value());
    dst_lock = std::unique_lock(dst->lock, std::defer_lock);
    if (dst_ino != parent && dst_ino != new_parent) dst_lock.lock();
  }
  const Inode& s = src->media();
  const bool src_is_dir = S_ISDIR(s.mode);
  const Inode* t = have_dst ? &dst.media() : nullptr;
  const bool dst_is_dir = have_dst && S_ISDIR(t->mode);

  // chattr's attributes: the source name is removed, the target name
  // replaced (or, exchanged, removed too): as unlink, on both sides.
  if (Pinned(sd) || Pinned(s) || Immutable(dd)) return Error(EPERM);
  if (have_dst && (AppendOnly(dd) || Pinned(*t))) return Error(EPERM);
  if (!exchange && have_dst) {
    if (src_is_dir && !dst_is_dir) return Error(ENOTDIR);
    if (!src_is_dir && dst_is_dir) return Error(EISDIR);
    if (dst_is_dir && t->map.dir.entries != 0) return Error(ENOTEMPTY);
  }
  // A directory may not move below itself.
  if (src_is_dir && new_parent != parent) {
    Result<bool> within = IsWithin(new_parent, src_ino);
    if (!within.ok()) return within.take_error();
    if (*within) return Error(EINVAL);
  }
  if (exchange && dst_is_dir && new_parent != parent) {
    Result<bool> within = IsWithin(parent, dst_ino);
    if (!within.ok()) return within.take_error();
    if (*within) return Error(EINVAL);
  }
  // Link counts of the parents: a directory moving in adds one.
  int src_dir_delta = 0, dst_dir_delta = 0;
  if (new_parent != parent) {
    if (src_is_dir) { --src_dir_delta; ++dst_dir_delta; }
    if (exchange && dst_is_dir) { ++src_dir_delta; --dst_dir_delta; }
  }
  if (!exchange && dst_is_dir) --dst_dir_delta;  // the replaced directory goes
  if (dst_dir_delta > 0 && dd.nlink >= kLinkMax) return Error(EMLINK);
  if (src_dir_delta > 0 && sd.nlink >= kLinkMax) return Error(EMLINK);

  const timespec now = Now();
  OrphanTx tx(*this, exchange ? "rename-exchange" : whiteout ? "rename-whiteout" : "rename");
  // The new name is made to point at the source before the old name goes, so
  // even inside the transaction the inode is never in neither directory.
  if (exchange) {
    NVFS_TRY(dir_->Replace(tx, dd, new_name, src_ino, DirType(s.mode)));
    NVFS_TRY(dir_->Replace(tx, sd, name, dst_ino, DirType(t->mode)));
    if (dst_is_dir && new_parent != parent) tx.Set(t->parent, parent);
  } else {
    if (have_dst) {
      NVFS_TRY(dir_->Replace(tx, dd, new_name, src_ino, DirType(s.mode)));
    } else {
      NVFS_TRY(dir_->Insert(tx, dd, new_name, src_ino, DirType(s.mode)));
    }
    if (whiteout) {
      // The whiteout takes the old name's entry over (a Replace, as
      // RENAME_EXCHANGE does), so the name never stops existing.
      Result<uint64_t> wh = NewInode(tx, sd, parent, S_IFCHR, 0, cred, now);
      if (!wh.ok()) return wh.take_error();
      NVFS_TRY(dir_->Replace(tx, sd, name, *wh, DirType(S_IFCHR)));
    } else {
      NVFS_TRY(dir_->Remove(tx, sd, name));
    }
  }
  if (src_is_dir && new_parent != parent) tx.Set(s.parent, new_parent);
  if (src_dir_delta != 0) tx.Set(sd.nlink, static_cast<uint32_t>(int64_t{sd.nlink} + src_dir_delta));
  if (dst_dir_delta != 0 && new_parent != parent) {
    tx.Set(dd.nlink, static_cast<uint32_t>(int64_t{dd.nlink} + dst_dir_delta));
  } else if (dst_dir_delta != 0) {
    // Same parent: both deltas apply to one inode.
    tx.Set(sd.nlink, static_cast<uint32_t>(int64_t{sd.nlink} + dst_dir_delta));
  }
  if (!exchange && have_dst) {
    const uint32_t nlink = dst_is_dir ? 0 : t->nlink - 1;
    tx.Set(t->nlink, nlink);
    Touch(tx, *t, false, true, now);
    if (nlink == 0) OrphanAdd(tx, dst_ino);
  } else if (exchange) {
    Touch(tx, *t, false, true, now);
  }
  Touch(tx, s, false, true, now);
  Touch(tx, sd, true, true, now);
  if (new_parent != parent) Touch(tx, dd, true, true, now);
  NVFS_TRY(tx.Commit());
  if (!exchange && have_dst && t->nlink == 0 && !dst_is_dir) {
    // The replaced file lost its last name: its data goes now, under its
    // own lock only (as in RemoveEntry).
    for (std::unique_lock<std::shared_mutex>* l : {&src_lock, &dst_dir_lock, &src_dir_lock}) {
      if (l->owns_lock()) l->unlock();
    }
    tree.unlock();
    if (dst_lock.owns_lock()) (void)FreeUnlinkedData(dst.get());
  }
  return Status::Ok();
}

}  // namespace nvfs
