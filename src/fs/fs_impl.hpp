// Shared by the files of the filesystem core (src/fs/*.cpp): helpers with
// access to Filesystem's private state, and the RAII pin on a cached inode.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "alloc/allocator.hpp"
#include "bmap/bmap.hpp"
#include "ctx/context.hpp"
#include "dir/dir.hpp"
#include "fs/inode_cache.hpp"
#include "journal/journal.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs {

inline constexpr uint32_t kLinkMax = 65000;

struct OpenFile {
  CachedInode* inode;
  int flags;  // open(2) flags
};

class InodeRef;

struct FsOps {
  // Current time for timestamps.
  static timespec Now();

  // Checks an inode number from outside or from the media: in range,
  // allocated, with a known file type. ESTALE when it is not in use. With
  // `wait_reclaim` (Get), an inode caught by a reclaim between its mode's
  // clearing and its bitmap bit's (mode 0, bit set) is waited out: EAGAIN,
  // look again; otherwise that is damage (EUCLEAN).
  static Status CheckIno(const Filesystem& fs, uint64_t ino, bool wait_reclaim = false);
  // Pins the inode (after CheckIno).
  static Result<InodeRef> Get(Filesystem& fs, uint64_t ino);
  static Attr MakeAttr(const Filesystem& fs, uint64_t ino, const format::Inode& inode);

  // chattr's attributes (format.hpp kInodeFlag*, enforced as ext4 does;
  // doc/format.md): an immutable inode changes in nothing — bytes, size,
  // attributes, xattrs, names (no link, unlink or rename of it, no entry
  // added to or removed from it as a directory); an append-only one takes
  // bytes only at its end and keeps its names and attributes likewise, but
  // as a directory takes new entries. Both EPERM. REQUIRES: inode lock held.
  static bool Immutable(const format::Inode& inode) {
    return inode.flags & format::kInodeFlagImmutable;
  }
  static bool AppendOnly(const format::Inode& inode) {
    return inode.flags & format::kInodeFlagAppend;
  }
  // Neither its names nor its attributes may change (either flag).
  static bool Pinned(const format::Inode& inode) {
    return inode.flags & (format::kInodeFlagImmutable | format::kInodeFlagAppend);
  }

  // Sets mtime and/or ctime to `now`, logged. REQUIRES: inode lock held.
  static void Touch(Tx& tx, const format::Inode& inode, bool mtime, bool ctime, timespec now);
  // Logs and stores the bytes where `updated` differs from the on-media inode,
  // as one record (two if they lie on both sides of orphan_next, which is
  // never stored: OrphanAdd and OrphanRemove own it, under orphan_mu_).
  static void StoreInodeDiff(Tx& tx, const format::Inode& on_media,
                             const format::Inode& updated);

  // What a change of a file takes away (fs.hpp, "Privileges"): the
  // security.capability attribute always; with `suidgid`, set-user-ID and
  // set-group-ID where group execution is on (without it the bit marks
  // mandatory locking and stays, as on every Linux filesystem).
  static uint32_t KilledMode(uint32_t mode) {
    uint32_t kill = mode & S_ISUID;
    if ((mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP)) kill |= S_ISGID;
    return mode & ~kill;
  }
  // The same for a change by a caller known to lack CAP_FSETID (a write,
  // truncate or fallocate it marked): set-group-ID without group execution
  // goes too where the caller is outside the file's group `gid` (the
  // kernel's setattr_should_drop_sgid; MountOptions::caller_in_group).
  static uint32_t KilledModeFor(const Filesystem& fs, uint32_t mode, uint32_t gid);
  // True if there is something to take away; EIO if the attributes are
  // damaged. REQUIRES: inode lock held.
  static Result<bool> HasPrivs(Filesystem& fs, const format::Inode& inode, bool suidgid);
  // Takes it away, logged in `tx` (ctime becomes `now`). REQUIRES: inode
  // lock held exclusively.
  static Status KillPrivs(Filesystem& fs, uint64_t ino, const format::Inode& inode, bool suidgid,
                          Tx& tx, timespec now);
  // For the calls that store bytes before their transaction commits (write,
  // fallocate): if there is anything to take away, does it in a transaction
  // of its own, committed before the caller stores anything. REQUIRES: inode
  // lock held exclusively, until the caller's change is done.
  static Status KillPrivsFirst(Filesystem& fs, uint64_t ino, const format::Inode& inode,
                               bool suidgid);
  // Tells MountOptions::privs_dropped (after the commit that cleared them).
  static void PrivsDropped(Filesystem& fs, uint64_t ino);
  // security.capability, if the inode has it: present, and removed in `tx`
  // (xattr.cpp).
  static Result<bool> HasCapability(Filesystem& fs, const format::Inode& inode);
  static Status RemoveCapability(Filesystem& fs, uint64_t ino, const format::Inode& inode, Tx& tx);
  // Frees the inode's extended attributes (blocks and value runs) in `tx`,
  // a record or block at a time while the slot has room: true when none is
  // left, false when the caller must commit and call again. EIO for damage
  // (nothing damaged is followed or freed). REQUIRES: inode lock held
  // exclusively, or no one else referencing the inode (xattr.cpp).
  static Result<bool> FreeXattrs(Filesystem& fs, Tx& tx, const format::Inode& inode);

  // Extended attributes for the core's own features (xattr.cpp): the two
  // calls the POSIX ACLs (acl.cpp) build on, whatever the storage beneath.
  // The value of attribute `name` (any namespace, served or not), if the
  // inode has it; EIO if the attributes are damaged. REQUIRES: inode lock
  // held.
  static Result<std::optional<std::string>> FindXattr(Filesystem& fs, const format::Inode& inode,
                                                      std::string_view name);
  // Sets (value) or removes (nullptr) each named attribute, in the caller's
  // transaction (ctime becomes `now` if anything changed; nothing is stored
  // if nothing did). REQUIRES: inode lock held exclusively.
  struct XattrChange {
    std::string_view name;
    const std::string* value;  // nullptr: remove
  };
  static Status ChangeXattrs(Filesystem& fs, Tx& tx, uint64_t ino, const format::Inode& inode,
                             std::span<const XattrChange> changes, timespec now);

  // POSIX ACLs (acl.cpp; fs.hpp, "POSIX ACLs"). SetAcl and GetAcl serve
  // SetXattr and GetXattr of the two ACL names.
  static Status SetAcl(Filesystem& fs, uint64_t ino, bool is_default, std::string_view value,
                       unsigned xattr_flags);
  static Result<size_t> GetAcl(Filesystem& fs, uint64_t ino, bool is_default, void* value,
                               size_t size);
  // What a new inode inherits from its parent's default ACL.
  struct InheritedAcl {
    std::optional<std::string> access;       // its access ACL, if not the mode's equal
    std::optional<std::string> default_acl;  // a directory's own default ACL
  };
  // The mode a new inode of `mode` (type and permission bits) gets in
  // `parent`: masked by the parent's default ACL where it has one (which
  // `out` then holds, as the new inode's), else by `umask`. Symlinks get
  // 0777 and nothing. REQUIRES: the parent's lock held.
  static Result<uint32_t> InheritAcl(Filesystem& fs, uint64_t parent_ino,
                                     const format::Inode& parent, uint32_t mode, uint32_t umask,
                                     InheritedAcl* out);
  // Stores what InheritAcl gave, in the create's transaction.
  static Status StoreInheritedAcl(Filesystem& fs, Tx& tx, uint64_t ino, const format::Inode& inode,
                                  const InheritedAcl& acl, timespec now);
  // A mode change (chmod) carried into the access ACL, if the inode has
  // one: its owner, mask (else owning group) and other entries become the
  // mode's, in the chmod's transaction. REQUIRES: inode lock held
  // exclusively.
  static Status ChmodAcl(Filesystem& fs, Tx& tx, uint64_t ino, const format::Inode& inode,
                         uint32_t mode, timespec now);

  // Allocates an inode near `parent` and writes it whole (fresh).
  static Result<uint64_t> NewInode(Filesystem& fs, Tx& tx, const format::Inode& parent_inode,
                                   uint64_t parent, uint32_t mode, uint64_t rdev,
                                   const Cred& cred, timespec now);

  // Orphan list, logged in `tx`. REQUIRES: orphan_mu_ held until tx commits
  // or aborts: by a lock declared before `tx` (fs.hpp), so that an abort's
  // undo, even one a throw starts, runs under it.
  static void OrphanAdd(Filesystem& fs, Tx& tx, uint64_t ino);
  static Status OrphanRemove(Filesystem& fs, Tx& tx, uint64_t ino);
  // Stores fields of the dynamic superblock with its checksum, logged.
  // REQUIRES: orphan_mu_ held until tx commits or aborts (as OrphanAdd).
  template <class Fn>
  static void UpdateDynamic(Filesystem& fs, Tx& tx, Fn&& change);

  // Frees the blocks of `ino` from file block `from` on, in as many
  // transactions as it takes; the inode must be on the orphan list if more
  // than one is needed (the caller arranges it). The last transaction takes
  // it off the list, unless it is unlinked (reclaim does that). REQUIRES:
  // inode lock held exclusively.
  static Status FreeBlocksFrom(Filesystem& fs, uint64_t ino, uint64_t from);
  // Changes the size of a regular file (truncate up or down), atomically as
  // seen after a crash. `orphan_lock` is the caller's, on orphan_mu_, not
  // held, declared before *first_tx (fs.hpp): a truncation too long for one
  // transaction locks it to put the file on the orphan list in *first_tx,
  // and commits that. REQUIRES: inode lock held exclusively.
  static Status Resize(Filesystem& fs, uint64_t ino, uint64_t new_size, Tx* first_tx,
                       std::unique_lock<std::mutex>& orphan_lock);

  // Frees an unlinked inode and everything it holds, and takes it off the
  // orphan list. REQUIRES: no one else references it.
  static Status Reclaim(Filesystem& fs, uint64_t ino);
  // The data of a regular file that has lost its last link and has no open
  // file left goes at once (generic/511), not when the kernel forgets the
  // inode: its size becomes 0 and its blocks are freed, in as many
  // transactions as it takes; the inode stays on the orphan list, with its
  // xattrs, for reclaim. Nothing if the file is open, may still get a name
  // (O_TMPFILE, `linkable`), has links, or the filesystem is read-only.
  // Called after the commit that dropped the last link, and at the release
  // of the last open file. REQUIRES: inode lock held exclusively.
  static Status FreeUnlinkedData(Filesystem& fs, CachedInode* inode);
  // Called when a cached inode has no pins, lookups or opens left.
  // Frees an idle unlinked inode the cache handed back (InodeCache::Unpin),
  // then drops it from the cache.
  static void ReclaimIdle(Filesystem& fs, CachedInode* inode);
  // Finishes every inode on the orphan list (mount).
  static Status ProcessOrphans(Filesystem& fs);
  // A read-write mount's check of the bitmaps against the inodes
  // (cross_check.cpp): what contradicts them is reported as damage and
  // reserved in the allocator's DRAM bitmaps.
  static void CrossCheck(Filesystem& fs);

  // Drops one pin.
  static void Unpin(Filesystem& fs, CachedInode* inode) {
    if (CachedInode* unlinked = fs.cache_->Unpin(inode)) ReclaimIdle(fs, unlinked);
  }
  // Drops one pin where nothing may throw (InodeRef's destructor and move):
  // a reclaim that throws is said on stderr, and the inode stays on the
  // orphan list for its next pin or the next mount.
  static void UnpinNoThrow(Filesystem& fs, CachedInode* inode) noexcept;

  static const format::Inode& InodeAt(const Filesystem& fs, uint64_t ino) {
    return fs.ctx_->InodeAt(ino);
  }
  static FsContext& Ctx(Filesystem& fs) { return *fs.ctx_; }
  // From now on every change fails with EROFS (DamageRecorder).
  static void SetReadOnly(Filesystem& fs) { fs.read_only_.store(true, std::memory_order_relaxed); }
  // A file's map is damaged (Bmap::kCorrupt, seen under the inode lock or
  // confirmed by the read's sequence check): reports it, returns EIO.
  static Error BadMap(Filesystem& fs, uint64_t ino);
  // A media error (SIGBUS) met under a recovery point by `what` on inode
  // `ino`: says so on stderr (the first 16, then every 1024th); the caller
  // fails the request with EIO.
  [[gnu::cold]] static void ReportMediaError(const char* what, uint64_t ino);
  static Journal& Jnl(Filesystem& fs) { return *fs.journal_; }
  static Allocator& Alloc(Filesystem& fs) { return *fs.alloc_; }
  static Bmap& BmapOf(Filesystem& fs) { return *fs.bmap_; }
  static Directory& DirOf(Filesystem& fs) { return *fs.dir_; }
  static InodeCache& Cache(Filesystem& fs) { return *fs.cache_; }
  static std::shared_mutex& TreeMu(Filesystem& fs) { return fs.tree_mu_; }
  static std::mutex& OrphanMu(Filesystem& fs) { return fs.orphan_mu_; }
  static const Geometry& Geo(const Filesystem& fs) { return *fs.geometry_; }
  static uint64_t NextGeneration(Filesystem& fs);
  static uint32_t ExtentMapRuns(const Filesystem& fs) { return fs.extent_map_runs_; }
  static void CountExtentMap(Filesystem& fs) {
    fs.extent_maps_built_.fetch_add(1, std::memory_order_relaxed);
  }
};

// A pinned cached inode; unpins on destruction. Declare it before any lock
// on the inode so the lock is released first.
class InodeRef {
 public:
  InodeRef() = default;
  InodeRef(Filesystem& fs, CachedInode* inode) : fs_(&fs), inode_(inode) {}
  InodeRef(InodeRef&& other) noexcept
      : fs_(other.fs_), inode_(std::exchange(other.inode_, nullptr)) {}
  InodeRef& operator=(InodeRef&& other) noexcept {
    Reset();
    fs_ = other.fs_;
    inode_ = std::exchange(other.inode_, nullptr);
    return *this;
  }
  ~InodeRef() { Reset(); }
  void Reset() noexcept {
    if (inode_ != nullptr) FsOps::UnpinNoThrow(*fs_, std::exchange(inode_, nullptr));
  }
  // Gives up the pin without unpinning (it now belongs to the caller).
  CachedInode* Release() { return std::exchange(inode_, nullptr); }

  CachedInode* get() const { return inode_; }
  CachedInode* operator->() const { return inode_; }
  const format::Inode& media() const { return *inode_->media; }
  uint64_t ino() const { return inode_->ino; }

 private:
  Filesystem* fs_ = nullptr;
  CachedInode* inode_ = nullptr;
};

template <class Fn>
void FsOps::UpdateDynamic(Filesystem& fs, Tx& tx, Fn&& change) {
  const auto& current = *reinterpret_cast<const format::SuperDynamic*>(
      fs.media_->base() + format::kSuperDynamicOffset);
  format::SuperDynamic updated = current;
  change(updated);
  updated.checksum = SuperDynamicChecksum(updated);
  // Only the fields before the reserved area and the checksum can change.
  tx.Store(format::kSuperDynamicOffset, &updated, offsetof(format::SuperDynamic, reserved));
  tx.Set(current.checksum, updated.checksum);
}

inline uint8_t DirType(uint32_t mode) { return static_cast<uint8_t>((mode & S_IFMT) >> 12); }

inline timespec ToTimespec(int64_t sec, uint32_t nsec) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(sec);
  ts.tv_nsec = static_cast<long>(nsec);
  return ts;
}

}  // namespace nvfs
