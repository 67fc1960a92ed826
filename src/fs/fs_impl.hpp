// Shared by the files of the filesystem core (src/fs/*.cpp): the mounted
// filesystem (FsImpl): its state and lock order, private; the few calls the
// rest of src/fs/ makes into it; its own operations, private, grouped by the
// state they touch; and the RAII pin on a cached inode. What needs no state
// of the filesystem's is in inode_rules.hpp.
#pragma once

#include <sys/stat.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
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
#include "fs/inode_rules.hpp"
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
class DamageRecorder;
class ExtentMap;
class OrphanTx;

// The mounted filesystem behind nvfs::Filesystem (include/nvfs/fs.hpp, whose
// contracts the overrides keep). Its state is its members' alone; the files
// of src/fs/ share the operations below the Filesystem interface.
class FsImpl final : public Filesystem {
 public:
  FsImpl();
  ~FsImpl() override;  // unmounts cleanly if Unmount was not called

  // The implementation behind a Filesystem (every Filesystem is one).
  static FsImpl& Of(Filesystem& public_face) { return static_cast<FsImpl&>(public_face); }

  // Filesystem::Mount's work, on the media it opened.
  Status MountInternal(std::unique_ptr<Media> media, const MountOptions& options);

  void EndService() override;
  void ServeThroughMount(const MountName& mount) override;
  Status Unmount() override;
  Result<Attr> Lookup(uint64_t parent, std::string_view name) override;
  Result<Attr> LookupInode(uint64_t ino) override;
  void Forget(uint64_t ino, uint64_t count) noexcept override;
  void ForgetAll() noexcept override;
  Result<Attr> Mknod(uint64_t parent, std::string_view name, uint32_t mode, uint64_t rdev,
                     const Cred& cred) override;
  Result<Attr> Mkdir(uint64_t parent, std::string_view name, uint32_t mode, const Cred& cred) override;
  Result<Attr> Symlink(uint64_t parent, std::string_view name, std::string_view target,
                       const Cred& cred) override;
  Result<Attr> Link(uint64_t ino, uint64_t new_parent, std::string_view new_name) override;
  Status Unlink(uint64_t parent, std::string_view name) override;
  Status Rmdir(uint64_t parent, std::string_view name) override;
  Status Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                std::string_view new_name, unsigned flags, const Cred& cred = {}) override;
  Result<std::string> Readlink(uint64_t ino) override;
  Status ReadDir(uint64_t dir, uint64_t cookie,
                 const std::function<bool(const DirEntry& entry, uint64_t next_cookie)>& fn) override;
  Result<Attr> GetAttr(uint64_t ino) override;
  Result<Attr> SetAttr(uint64_t ino, const SetAttrRequest& request) override;
  Result<StatFs> GetStatFs() override;
  Result<GrowResult> Grow(uint64_t namespace_size) override;
  Result<uint32_t> GetInodeFlags(uint64_t ino) override;
  Status SetInodeFlags(uint64_t ino, uint32_t fs_flags, const Cred& cred) override;
  Result<FileHandle> Open(uint64_t ino, int flags, unsigned io_flags = 0) override;
  Result<FileHandle> Create(uint64_t parent, std::string_view name, uint32_t mode, int flags,
                            const Cred& cred, Attr* attr) override;
  void Release(FileHandle file) noexcept override;
  Result<FileHandle> Tmpfile(uint64_t parent, uint32_t mode, int flags, const Cred& cred,
                             Attr* attr) override;
  Result<size_t> Read(FileHandle file, uint64_t offset, void* buf, size_t len) override;
  Result<size_t> ReadIter(FileHandle file, uint64_t offset, const iovec* iov, int iovcnt) override;
  Result<size_t> Map(FileHandle file, uint64_t offset, size_t len, ReadRun* runs,
                     size_t max_runs, size_t* run_count, const MapGuard& held) override;
  Result<size_t> Write(FileHandle file, uint64_t offset, const void* buf, size_t len,
                       unsigned io_flags = 0) override;
  Result<size_t> WriteIter(FileHandle file, uint64_t offset, const iovec* iov, int iovcnt,
                           unsigned io_flags = 0) override;
  Status Fsync(FileHandle file) override;
  Status Fallocate(FileHandle file, int mode, uint64_t offset, uint64_t len,
                   unsigned io_flags = 0) override;
  Status BackMappedRange(FileHandle file, uint64_t offset, uint64_t len) override;
  Result<uint64_t> Lseek(FileHandle file, uint64_t offset, int whence) override;
  uint64_t HandleIno(FileHandle file) const override;
  Status SetXattr(uint64_t ino, std::string_view name, const void* value, size_t size,
                  int flags, unsigned xattr_flags = 0) override;
  Result<size_t> GetXattr(uint64_t ino, std::string_view name, void* value, size_t size) override;
  Result<size_t> ListXattr(uint64_t ino, char* list, size_t size, const Cred& cred) override;
  Status RemoveXattr(uint64_t ino, std::string_view name) override;
  void SetDirectTable(DirectSlot* table, uint32_t count) override;
  void SetDirectWatch(void (*changed)(void* ctx, uint32_t slot), void* ctx) override;
  Result<DirectMapping> DirectMap(uint64_t ino, uint64_t offset, DirectRun* runs,
                                  size_t max_runs) override;
  void SetExternalGrace(epoch::ExternalGrace* grace) override;
  Result<DirectMapping> DirectAllocate(uint64_t ino, uint64_t offset, uint64_t len,
                                       uint64_t reserve_end, DirectRun* runs,
                                       size_t max_runs) override;
  Result<DirectMapping> DirectCommit(uint64_t ino, uint64_t start, uint64_t end, uint64_t seq,
                                     uint64_t map_end, DirectRun* runs, size_t max_runs) override;
  Status DirectTrim(uint64_t ino) override;
  void SetAppendWords(bool on) override { append_words_.store(on, std::memory_order_release); }
  uint32_t block_size() const override;

  // Appends by word (direct.cpp; format.hpp Inode::append_end). CloseAppend
  // folds an open word into the size and closes it (the file's slot seq
  // moves): every change of a regular file does it first.
  // REQUIRES: the inode lock held exclusively, no transaction open.
  Status CloseAppend(CachedInode* ci);
  // For a path that reads the size or the blocks under the shared lock:
  // closes an open word first (taking the lock exclusively for it).
  // REQUIRES: the inode lock not held.
  Status SettleAppend(CachedInode* ci);
  // True once no section begun before the latest close can still run.
  bool AppendGraceOver();
  // The fold and the close of CloseAppend (and of mount's orphan pass): a
  // compare-and-swap loop through the media; with `leave_list`, a linked
  // file leaves the orphan list it was put on for the word.
  Status FoldAppend(uint64_t ino, const format::Inode& inode, bool leave_list);
  bool read_only() const override { return read_only_.load(std::memory_order_relaxed); }
  bool recorded_errors() const override { return recorded_errors_; }
  bool damage_found() const override;
  const Geometry& geometry() const override;
  Media& media() const override { return *media_; }
  size_t cached_inodes() const override;
  uint64_t extent_maps_built() const override {
    return extent_maps_built_.load(std::memory_order_relaxed);
  }
  void ReportReadFault(FileHandle file) override;

  // --- What code of src/fs/ outside FsImpl's members calls (free helpers,
  // InodeRef, DamageRecorder, the module tests). Everything else FsImpl
  // does, and all its state, is private.

  // The modules' shared state (media, geometry, allocator, journal, hash
  // key, damage sink): how code outside FsImpl's members reaches them.
  FsContext& context() const { return *ctx_; }

  // Inodes.
  // Pins the inode (after CheckIno).
  Result<InodeRef> Get(uint64_t ino);
  // Drops one pin where nothing may throw (InodeRef's destructor and move):
  // a reclaim that throws is said on stderr, and the inode stays on the
  // orphan list for its next pin or the next mount.
  void UnpinNoThrow(CachedInode* inode) noexcept;

  // Extended attributes (xattr.cpp), for the POSIX ACLs (acl.cpp).
  // The value of attribute `name` (any namespace, served or not), if the
  // inode has it; EIO if the attributes are damaged. REQUIRES: inode lock
  // held.
  Result<std::optional<std::string>> FindXattr(const format::Inode& inode,
                                               std::string_view name);

  // The orphan list and the dynamic superblock (orphan.cpp; orphan_mu_,
  // orphan_prev_), logged in `tx`; each takes tx's orphan lock (held until
  // tx finishes, so that an abort's undo, even one a throw starts, runs
  // under it).
  void OrphanAdd(OrphanTx& tx, uint64_t ino);
  Status OrphanRemove(OrphanTx& tx, uint64_t ino);
  // Stores fields of the dynamic superblock with its checksum, logged; takes
  // tx's orphan lock as OrphanAdd does.
  template <class Fn>
  void UpdateDynamic(OrphanTx& tx, Fn&& change);

  // Damage (super.cpp, damage.cpp).
  // From now on every change fails with EROFS (DamageRecorder).
  void SetReadOnly() { read_only_.store(true, std::memory_order_relaxed); }
  // A file's map is damaged (Bmap::kCorrupt, seen under the inode lock or
  // confirmed by the read's sequence check): reports it, returns EIO.
  Error BadMap(uint64_t ino);

 private:
  // --- FsImpl's own operations, grouped by the state they touch.

  // Inodes (inode_access.cpp, ialloc.cpp, reclaim.cpp).
  // Checks an inode number from outside or from the media: in range,
  // allocated, with a known file type. ESTALE when it is not in use. With
  // `wait_reclaim` (Get), an inode caught by a reclaim between its mode's
  // clearing and its bitmap bit's (mode 0, bit set) is waited out: EAGAIN,
  // look again; otherwise that is damage (EUCLEAN).
  Status CheckIno(uint64_t ino, bool wait_reclaim = false) const;
  Attr MakeAttr(uint64_t ino, const format::Inode& inode) const;
  // Allocates an inode near `parent` and writes it whole (fresh).
  Result<uint64_t> NewInode(Tx& tx, const format::Inode& parent_inode, uint64_t parent,
                            uint32_t mode, uint64_t rdev, const Cred& cred, timespec now);
  // Drops one pin.
  void Unpin(CachedInode* inode) {
    if (CachedInode* unlinked = cache_->Unpin(inode)) ReclaimIdle(unlinked);
  }
  // Called when a cached inode has no pins, lookups or opens left.
  // Frees an idle unlinked inode the cache handed back (InodeCache::Unpin),
  // then drops it from the cache.
  void ReclaimIdle(CachedInode* inode);
  // ReclaimIdle where nothing may throw (Forget, ForgetAll, Release): the
  // same report. False if it threw.
  bool ReclaimIdleNoThrow(CachedInode* inode) noexcept;

  // Privileges (inode.cpp; the rules without state: inode_rules.hpp).
  // KilledMode for a change by a caller known to lack CAP_FSETID (a write,
  // truncate or fallocate it marked): set-group-ID without group execution
  // goes too where the caller is outside the file's group `gid` (the
  // kernel's setattr_should_drop_sgid; MountOptions::caller_in_group).
  uint32_t KilledModeFor(uint32_t mode, uint32_t gid) const;
  // True if there is something to take away; EIO if the attributes are
  // damaged. REQUIRES: inode lock held.
  Result<bool> HasPrivs(const format::Inode& inode, bool suidgid);
  // Takes it away, logged in `tx` (ctime becomes `now`). REQUIRES: inode
  // lock held exclusively.
  Status KillPrivs(uint64_t ino, const format::Inode& inode, bool suidgid, Tx& tx,
                   timespec now);
  // For the calls that store bytes before their transaction commits (write,
  // fallocate): if there is anything to take away, does it in a transaction
  // of its own, committed before the caller stores anything. REQUIRES: inode
  // lock held exclusively, until the caller's change is done.
  Status KillPrivsFirst(uint64_t ino, const format::Inode& inode, bool suidgid);
  // Tells MountOptions::privs_dropped (after the commit that cleared them).
  void PrivsDropped(uint64_t ino);

  // Extended attributes (xattr.cpp).
  // security.capability, if the inode has it: present, and removed in `tx`.
  Result<bool> HasCapability(const format::Inode& inode);
  Status RemoveCapability(uint64_t ino, const format::Inode& inode, Tx& tx);
  // Frees the inode's extended attributes (blocks and value runs) in `tx`,
  // a record or block at a time while the slot has room: true when none is
  // left, false when the caller must commit and call again. EIO for damage
  // (nothing damaged is followed or freed). REQUIRES: inode lock held
  // exclusively, or no one else referencing the inode.
  Result<bool> FreeXattrs(Tx& tx, const format::Inode& inode);
  // With FindXattr (above), what the POSIX ACLs (acl.cpp) build on,
  // whatever the storage beneath. Sets (value) or removes (nullptr) each named attribute, in the caller's
  // transaction (ctime becomes `now` if anything changed; nothing is stored
  // if nothing did). REQUIRES: inode lock held exclusively.
  struct XattrChange {
    std::string_view name;
    const std::string* value;  // nullptr: remove
  };
  Status ChangeXattrs(Tx& tx, uint64_t ino, const format::Inode& inode,
                      std::span<const XattrChange> changes, timespec now);

  // POSIX ACLs (acl.cpp; fs.hpp, "POSIX ACLs"). SetAcl and GetAcl serve
  // SetXattr and GetXattr of the two ACL names.
  Status SetAcl(uint64_t ino, bool is_default, std::string_view value, unsigned xattr_flags);
  Result<size_t> GetAcl(uint64_t ino, bool is_default, void* value, size_t size);
  // What a new inode inherits from its parent's default ACL.
  struct InheritedAcl {
    std::optional<std::string> access;       // its access ACL, if not the mode's equal
    std::optional<std::string> default_acl;  // a directory's own default ACL
  };
  // The mode a new inode of `mode` (type and permission bits) gets in
  // `parent`: masked by the parent's default ACL where it has one (which
  // `out` then holds, as the new inode's), else by `umask`. Symlinks get
  // 0777 and nothing. REQUIRES: the parent's lock held.
  Result<uint32_t> InheritAcl(uint64_t parent_ino, const format::Inode& parent, uint32_t mode,
                              uint32_t umask, InheritedAcl* out);
  // Stores what InheritAcl gave, in the create's transaction.
  Status StoreInheritedAcl(Tx& tx, uint64_t ino, const format::Inode& inode,
                           const InheritedAcl& acl, timespec now);
  // A mode change (chmod) carried into the access ACL, if the inode has
  // one: its owner, mask (else owning group) and other entries become the
  // mode's, in the chmod's transaction. REQUIRES: inode lock held
  // exclusively.
  Status ChmodAcl(Tx& tx, uint64_t ino, const format::Inode& inode, uint32_t mode,
                  timespec now);

  // The orphan list (orphan.cpp; OrphanAdd and OrphanRemove above).
  // Finishes every inode on the orphan list (mount).
  Status ProcessOrphans();

  // Truncation and reclaim (truncate.cpp, reclaim.cpp).
  // Frees the blocks of `ino` from file block `from` on, in as many
  // transactions as it takes; the inode must be on the orphan list if more
  // than one is needed (the caller arranges it). The last transaction takes
  // it off the list, unless it is unlinked (reclaim does that). REQUIRES:
  // inode lock held exclusively.
  Status FreeBlocksFrom(uint64_t ino, uint64_t from);
  // Changes the size of a regular file (truncate up or down), atomically as
  // seen after a crash. A truncation too long for one transaction puts the
  // file on the orphan list in *first_tx, commits that (its orphan lock is
  // released) and goes on in further transactions. REQUIRES: inode lock
  // held exclusively. A truncation down to inside a mapped block commits
  // *first_tx too, and then zeroes that block past the new end.
  Status Resize(uint64_t ino, uint64_t new_size, OrphanTx* first_tx);
  // Zeroes the bytes of block `phys` past `size` (the file's new end, in
  // it), after the commit that made the size durable.
  Status ZeroTail(uint64_t ino, uint64_t phys, uint64_t size);
  // Gives every hole of blocks [index, end) of inode `ino` a block, zeroed
  // if below block `zero_below` (past it every byte is undefined until a
  // size exposes it), in `tx`; commits it and begins another (`name`,
  // allowed the reserve if `reserve`) whenever its slot runs low. An error
  // aborts the open transaction's part; what committed before stays.
  // REQUIRES: the inode lock held exclusively, under a MappingChange.
  Status MapHoles(std::optional<OrphanTx>& tx, const char* name, bool reserve, uint64_t ino,
                  uint64_t index, uint64_t end, uint64_t zero_below);
  // Frees an unlinked inode and everything it holds, and takes it off the
  // orphan list. REQUIRES: no one else references it.
  Status Reclaim(uint64_t ino);
  // The data of a regular file that has lost its last link and has no open
  // file left goes at once (generic/511), not when the kernel forgets the
  // inode: its size becomes 0 and its blocks are freed, in as many
  // transactions as it takes; the inode stays on the orphan list, with its
  // xattrs, for reclaim. Nothing if the file is open, may still get a name
  // (O_TMPFILE, `linkable`), has links, or the filesystem is read-only.
  // Called after the commit that dropped the last link, and at the release
  // of the last open file. REQUIRES: inode lock held exclusively.
  Status FreeUnlinkedData(CachedInode* inode);

  // Damage (super.cpp, cross_check.cpp).
  // A read-write mount's check of the bitmaps against the inodes
  // (cross_check.cpp): what contradicts them is reported as damage and
  // reserved in the allocator's DRAM bitmaps.
  void CrossCheck();

  friend class OrphanTx;

  // Locking (the order, outermost first):
  //   1. tree_mu_: taken exclusively by every operation that changes a
  //      directory (create, mknod, mkdir, symlink, link, unlink, rmdir, rename);
  //      such an operation may then lock several inodes. Every other operation
  //      locks at most one inode and takes no tree_mu_. Inode reclaim
  //      (ReclaimIdle) is one of those: it frees an inode no directory
  //      names (nlink 0) that no one can reach any more (InodeCache's
  //      `reclaiming` turns new references away), so it changes no directory;
  //      and it must not take tree_mu_, since it runs wherever the last
  //      reference goes, inside an unlink or rename still holding tree_mu_ as
  //      well as in Forget and Release.
  //   2. inode locks (CachedInode::lock), shared for reads, exclusive for
  //      changes. Under tree_mu_ in any order (one writer at a time); otherwise
  //      one at a time.
  //   3. a journal slot (Tx's constructor waits for one).
  //   4. orphan_mu_ (the orphan list and the dynamic superblock), taken only
  //      through an OrphanTx, which holds its slot first and keeps the lock
  //      until the transaction has finished. Waiting for a slot while holding
  //      orphan_mu_ deadlocks once every slot's holder waits for orphan_mu_
  //      (more serving threads than slots).
  //   5. leaf locks: the inode cache's mutex, the allocator's group mutexes, the
  //      journal's slot mutex.
  // File data readers (Read, ReadIter, Map) take no lock: they copy under the
  // inode's sequence counter (CachedInode::data_seq), which every change of the
  // file's mapping or size makes odd and then even again under the inode lock
  // held exclusively, and retry if it moved; after 4 retries they take the
  // inode lock shared. Every pointer they follow was checked against the
  // namespace when read, so a torn read can copy wrong bytes of the namespace
  // (thrown away by the retry) but never leave the mapping. Map's runs point
  // into the mapping and are read by the caller after the counter was checked,
  // under a MapGuard: blocks freed meanwhile are not reused until it ends (a
  // grace period; see Map). Readers find
  // runs in the file's extent map (a DRAM copy of its mapping, built by readers,
  // tagged with the counter value it describes, freed through epoch-based
  // reclamation: src/fs/extent_map.hpp), else in the bmap.

  std::unique_ptr<Media> media_;
  std::unique_ptr<Geometry> geometry_;
  std::unique_ptr<Journal> journal_;
  std::unique_ptr<Allocator> alloc_;
  std::unique_ptr<FsContext> ctx_;
  std::unique_ptr<Bmap> bmap_;
  std::unique_ptr<Directory> dir_;
  std::unique_ptr<InodeCache> cache_;
  // Set once, never cleared, by damage (DamageRecorder); read by every
  // change first.
  std::atomic<bool> read_only_{false};
  bool recorded_errors_ = false;
  bool mounted_ = false;
  uint32_t extent_map_runs_ = 0;
  NameHashKey hash_key_;
  std::function<void(uint64_t ino)> privs_dropped_;    // MountOptions::privs_dropped
  std::function<void(uint64_t ino)> data_freed_;       // MountOptions::data_freed
  std::function<bool(uint32_t gid)> caller_in_group_;  // MountOptions::caller_in_group
  std::function<void(uint64_t ino)> reclaim_fault_;    // MountOptions::reclaim_fault

  std::mutex grow_mu_;  // one Grow at a time; taken before its journal slot
  std::shared_mutex tree_mu_;  // see the lock order above
  // Protects the orphan list (SuperDynamic::orphan_head, Inode::orphan_next,
  // the orphan bit of Inode::flags) and the rest of the dynamic superblock.
  // orphan_next is written under this mutex alone, also the predecessor's,
  // whose inode lock OrphanRemove does not take: no other store may cover
  // it (StoreInodeDiff cuts its range around it). Locked only by
  // OrphanTx (below), after its journal slot; a transaction that stores
  // under it finishes (commits or aborts) before it is released.
  std::mutex orphan_mu_;
  // For each inode on the orphan list, the inode before it (0: the head):
  // what lets OrphanRemove unlink it without walking the singly
  // linked list. A hint only: each is checked against the media before it
  // is used (an aborted transaction's undo puts the list back, not this),
  // and a missing or wrong one falls back to the walk. Protected by
  // orphan_mu_.
  std::unordered_map<uint64_t, uint64_t> orphan_prev_;
  std::atomic<uint64_t> generation_state_{0};  // PRNG for inode generations
  std::atomic<uint64_t> extent_maps_built_{0};
  // Appends by word: on (SetAppendWords); the writers' grace period
  // (SetExternalGrace); the grace ticket of the latest close (a word opens
  // only once it is over: no store that began before a close may find its
  // word open again); the tags' counter.
  std::atomic<bool> append_words_{false};
  std::atomic<epoch::ExternalGrace*> grace_{nullptr};
  std::atomic<uint64_t> append_closed_{0};
  std::atomic<uint64_t> append_tags_{0};
  // Last: its writer thread uses everything above, and is joined first.
  std::unique_ptr<DamageRecorder> damage_;

  // The steps of operations that reach the block maps, the directories or
  // the tree lock, which no code outside FsImpl's members does.
  struct NewEntry;  // namei.cpp
  Result<Attr> CreateEntry(uint64_t parent, std::string_view name, const NewEntry& entry,
                           const Cred& cred, InodeRef* out);
  Status RemoveEntry(uint64_t parent, std::string_view name, bool rmdir);
  Result<bool> IsWithin(uint64_t ino, uint64_t ancestor);
  struct WriteSource;  // write.cpp
  Result<size_t> WriteCore(FileHandle file, uint64_t offset, WriteSource& src, size_t len,
                           unsigned io_flags);
  // The read paths (read.cpp).
  template <class Sink>
  int64_t CopyOutBmap(const format::Inode& inode, uint64_t offset, size_t len, Sink& sink,
                      uint64_t* work);
  template <class Sink>
  int64_t CopyOutMap(const ExtentMap& map, const format::Inode& inode, uint64_t offset,
                     size_t len, Sink& sink);
  template <class Sink>
  int64_t CopyOutStale(const format::Inode& inode, uint64_t offset, size_t len, Sink& sink,
                       uint64_t* work);
  void BuildExtents(CachedInode* ci);
  template <bool kCallerGuarded, class Sink>
  int64_t ReadSlow(CachedInode* ci, uint64_t offset, size_t len, Sink& sink);
  template <bool kCallerGuarded = false, class Sink>
  int64_t ReadInto(CachedInode* ci, uint64_t offset, size_t len, Sink& sink);
  Result<size_t> ReadSegments(FileHandle file, uint64_t offset, const iovec* iov, int iovcnt);
  uint64_t NextGeneration();  // PRNG for inode generations (ialloc.cpp)
};

// A pinned cached inode; unpins on destruction. Declare it before any lock
// on the inode so the lock is released first.
class InodeRef {
 public:
  InodeRef() = default;
  InodeRef(FsImpl& fs, CachedInode* inode) : fs_(&fs), inode_(inode) {}
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
    if (inode_ != nullptr) fs_->UnpinNoThrow(std::exchange(inode_, nullptr));
  }
  // Gives up the pin without unpinning (it now belongs to the caller).
  CachedInode* Release() { return std::exchange(inode_, nullptr); }

  CachedInode* get() const { return inode_; }
  CachedInode* operator->() const { return inode_; }
  const format::Inode& media() const { return *inode_->media; }
  uint64_t ino() const { return inode_->ino; }

 private:
  FsImpl* fs_ = nullptr;
  CachedInode* inode_ = nullptr;
};

// A transaction that may store what orphan_mu_ protects (the orphan list,
// the dynamic superblock, an inode's flags word, which holds the orphan bit).
// It keeps the one order of the two (FsImpl's lock order, 3 and 4): the
// journal slot first, in the constructor, then orphan_mu_ when the
// operation first needs it (LockOrphans; OrphanAdd, OrphanRemove and
// UpdateDynamic call it); and orphan_mu_ is released only once the
// transaction has finished, committed or aborted (by the destructor, even
// on a throw), so that an abort's undo of orphan_next runs under it.
// Nothing else locks orphan_mu_. A thread that holds it begins no other
// OrphanTx (checked: the process stops; it would wait for a slot under the
// lock).
class OrphanTx : public Tx {
 public:
  OrphanTx(FsImpl& fs, const char* op_name);  // waits for a slot; no lock yet
  ~OrphanTx();                                // aborts if open, then unlocks
  OrphanTx(const OrphanTx&) = delete;
  OrphanTx& operator=(const OrphanTx&) = delete;

  // Takes orphan_mu_ if this transaction does not hold it yet.
  // REQUIRES: the transaction is open.
  void LockOrphans();
  // Tx::Commit, then orphan_mu_ is released (a truncation's later
  // transactions each take it again).
  Status Commit();

 private:
  FsImpl& fs_;
  bool locked_ = false;
};

template <class Fn>
void FsImpl::UpdateDynamic(OrphanTx& tx, Fn&& change) {
  tx.LockOrphans();
  const auto& current = *reinterpret_cast<const format::SuperDynamic*>(
      media_->base() + format::kSuperDynamicOffset);
  format::SuperDynamic updated = current;
  change(updated);
  updated.checksum = SuperDynamicChecksum(updated);
  // Only the fields before the reserved area and the checksum can change.
  tx.Store(format::kSuperDynamicOffset, &updated, offsetof(format::SuperDynamic, reserved));
  tx.Set(current.checksum, updated.checksum);
}

}  // namespace nvfs
