// The nvfs filesystem core: every POSIX operation as an errno-returning C++
// API, thread-safe, usable in process (tools, tests) or behind the FUSE
// adapter. It never sees a fuse_req_t.
//
// Inode references follow the FUSE model: Lookup, Create, Mknod, Mkdir,
// Symlink, Link and LookupInode each add one reference to the inode they
// return; Forget(ino, n) drops n. An inode whose link count reaches zero is
// freed when its last reference and its last open file are gone (and, after
// a crash, at the next mount).
//
// Every metadata operation is atomic and durable when it returns; data passed
// to Write is durable when Write returns (doc/integrity.md).
//
// Concurrency: every operation may be called from any thread at once, but
// Unmount and ForgetAll (which say so). Operations that change a directory
// are serialized against each other; the others lock only the inode they
// act on. File data readers (Read, ReadIter, Map) take no lock: a read that
// races a change of the file sees the bytes from before or after it (a
// sequence counter makes the reader retry a torn copy), and never bytes of
// another file or outside the namespace. The lock order and what each lock
// protects are written beside the fields, in src/fs/fs_impl.hpp.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "nvfs/direct_abi.hpp"
#include "nvfs/epoch.hpp"
#include "nvfs/media.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/result.hpp"

namespace nvfs {

class Media;
class Geometry;

struct Attr {
  uint64_t ino = 0;
  uint32_t mode = 0;
  uint32_t nlink = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t rdev = 0;
  uint64_t size = 0;
  uint64_t blocks = 0;      // 512-byte units, as st_blocks
  uint32_t blksize = 0;     // preferred I/O size
  uint32_t generation = 0;
  timespec atime{}, mtime{}, ctime{}, btime{};
  // The file's append word is open (Filesystem::SetAppendWords): its size
  // may grow without the daemon, so it must not be cached.
  bool size_moving = false;
};

struct Cred {
  uint32_t uid = 0;
  uint32_t gid = 0;
  // The caller's umask, for Create, Mknod and Mkdir: applied to the mode
  // where the parent has no default ACL (where it has one, the ACL masks
  // the mode instead; see "POSIX ACLs" below). 0 for callers that applied
  // it themselves.
  uint32_t umask = 0;
};

// Which fields SetAttr changes (bits may be combined).
enum SetAttrBits : uint32_t {
  kSetMode = 1u << 0,
  kSetUid = 1u << 1,
  kSetGid = 1u << 2,
  kSetSize = 1u << 3,
  kSetAtime = 1u << 4,      // to .atime
  kSetMtime = 1u << 5,      // to .mtime
  kSetAtimeNow = 1u << 6,
  kSetMtimeNow = 1u << 7,
  kSetCtime = 1u << 8,      // to .ctime (otherwise ctime becomes now)
  // The caller may not keep set-user-ID, nor set-group-ID where group
  // execution is on (it lacks CAP_FSETID): with a size or owner change,
  // they are cleared in the same transaction (FUSE's FATTR_KILL_SUIDGID).
  kSetKillSuidgid = 1u << 9,
};

// Privileges and changes of a file. Every change of a regular file's bytes
// or owner (Write, WriteIter, Fallocate, a size change, an O_TRUNC Open, an
// owner change) removes its security.capability attribute, whoever the
// caller (the kernel's file_remove_privs does the same for every local
// filesystem). Set-user-ID and group-executable set-group-ID are cleared
// only when the caller says so (kKillSuidgid, kSetKillSuidgid). Either way
// it is done before the change's bytes are visible: in the same
// transaction where the change is one (size, owner), else in one committed
// before the first byte is stored, under the same hold of the inode lock,
// so no reader and no crash ever sees new bytes under the old privileges.
//
// Flags of Open, Write, WriteIter and Fallocate.
enum IoFlags : unsigned {
  // The caller lacks CAP_FSETID (FUSE_WRITE_KILL_SUIDGID, FUSE_OPEN_KILL_SUIDGID
  // with O_TRUNC, a fallocate by an unprivileged caller): clear set-user-ID
  // and group-executable set-group-ID.
  kKillSuidgid = 1u << 0,
  // Write at the offset given even on an O_APPEND handle: pages of a shared
  // mapping written back (FUSE_WRITE_CACHE), which belong where they were
  // mapped, whichever handle carries them.
  kAtOffset = 1u << 1,
  // Open: the caller opened with O_APPEND, though `flags` may lack it (a
  // cache=page mount leaves appending to the kernel): what an append-only
  // file (chattr +a) asks of every writer.
  kOpenAppend = 1u << 2,
};

// POSIX ACLs, with ext4's semantics (acl(5); src/fs/acl.cpp). Served as
// the attributes system.posix_acl_access and system.posix_acl_default, in
// the kernel's xattr ACL format (doc/format.md), which the kernel enforces
// (FUSE_POSIX_ACL). Setting an access ACL sets the mode's permission bits
// from it (owner, mask or owning group, other) in the same transaction, and
// one the mode says as well (no named entry, no mask) is not stored; a
// chmod sets those entries from the mode; a default ACL (directories only)
// is inherited by what is created in the directory: it masks the create's
// mode in place of the umask, becomes the new inode's access ACL and a new
// directory's default ACL, all in the create's transaction. Who may set an
// ACL (the owner, or CAP_FOWNER) is the kernel's check, as for chmod.
enum XattrFlags : unsigned {
  // Setting an access ACL also clears set-group-ID: the caller is not in
  // the file's group and lacks CAP_FSETID (the kernel says so with
  // FUSE_SETXATTR_ACL_KILL_SGID; posix_acl_update_mode).
  kXattrKillSgid = 1u << 0,
};

struct SetAttrRequest {
  uint32_t valid = 0;  // SetAttrBits
  uint32_t mode = 0;   // permission bits (07777) only
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t size = 0;
  timespec atime{}, mtime{}, ctime{};
};

struct StatFs {
  uint32_t block_size = 0;
  uint64_t blocks = 0;
  uint64_t blocks_free = 0;
  // What one file can be given of blocks_free: the free blocks less the
  // pointer blocks that mapping all of them would take (statfs's f_bavail,
  // so that an allocation of what df says is available succeeds).
  uint64_t blocks_avail = 0;
  // The part of blocks_free only what must not fail may take (the
  // allocator's reserve: doc/integrity.md, "A full filesystem").
  uint64_t blocks_reserved = 0;
  uint64_t inodes = 0;
  uint64_t inodes_free = 0;
  uint32_t name_max = 0;
};

// One piece of a mapped read (the `map` read path): bytes inside the mapping,
// or, for holes, inside a shared page of zeros.
struct ReadRun {
  const void* data;
  size_t len;
};

// What a mounted filesystem does when it finds damage on the media (a
// pointer naming no data block, a damaged directory or xattr block, a free
// of a block not in use, a damaged orphan list): the operation fails (EIO or
// EUCLEAN), one line goes to stderr and the superblock's errors flag is set,
// then, as ext4's errors= option:
enum class ErrorBehavior {
  kRemountReadOnly,  // errors=remount-ro (default): every later change EROFS
  kContinue,         // errors=continue: go on serving changes
};

struct MountOptions {
  bool read_only = false;
  // Also for a namespace whose errors flag is set already: with
  // kRemountReadOnly it mounts read-only (after journal recovery; orphans
  // are left to fsck.nvfs), with kContinue read-write; either way
  // recorded_errors() says so.
  ErrorBehavior errors = ErrorBehavior::kRemountReadOnly;
  // Where the one line about damage goes (from any thread, possibly under
  // the filesystem's locks: it must not call into the filesystem). Empty:
  // stderr.
  std::function<void(const std::string& line)> log;
  // The most runs (holes or contiguous blocks) a file's extent map holds;
  // past them reads use the bmap. Bounds a map's DRAM at about 20 bytes per
  // run. 0: no extent maps (every read walks the bmap).
  uint32_t extent_map_runs = 1u << 16;
  // Called with an inode's number after the filesystem cleared its
  // set-user-ID or set-group-ID bit on its own account (kKillSuidgid: a
  // write, fallocate or O_TRUNC open by a caller without CAP_FSETID), once
  // that change has committed, also when the operation then failed. A
  // mode the caller did not set is stale wherever it is cached (the FUSE
  // kernel's attribute cache). From any thread, under the inode's lock: it
  // must not call into the filesystem. Empty: no one is told.
  std::function<void(uint64_t ino)> privs_dropped;
  // Called with an inode's number after the filesystem freed the data of
  // an unlinked file at the release of its last open file (its size is now
  // 0): the size the kernel cached, and with it
  // its cached pages, are stale. The same rules as privs_dropped.
  std::function<void(uint64_t ino)> data_freed;
  // Whether the caller of the operation this thread is serving belongs to
  // group `gid` (its own or a supplementary group). Asked only where a
  // caller without CAP_FSETID changes a file whose set-group-ID bit is on
  // without group execution: outside the file's group it loses that bit,
  // as the kernel rules for local filesystems. From the serving thread,
  // possibly under the inode's lock: it must not call into the filesystem.
  // Empty: every caller is a member (the bit stays; in-process callers).
  std::function<bool(uint32_t gid)> caller_in_group;
  // Fault injection (tests): called with an unlinked inode's number as its
  // last reference goes, just before it is reclaimed,
  // under the inode's lock. A throw from it stands for an allocation
  // failure in the reclaim and leaves Forget (or the operation that dropped
  // the reference) the way such a failure would. Empty in production.
  std::function<void(uint64_t ino)> reclaim_fault;
  // Address space reserved for the mapping (MediaOptions::reserve): the
  // namespace may grow while mounted (Grow) up to this many bytes. 0: it
  // cannot grow while mounted.
  uint64_t grow_reserve = 0;
};

// Held by a caller of Map from before the call until it has consumed the
// runs (for the FUSE adapter: until fuse_reply_* has written them to the
// kernel). While any guard lives, no block freed after it began is handed
// out again (the allocator defers frees for a grace period,
// doc/integrity.md section 8), so the runs show bytes of the file read and
// of no other. Costs two stores to a thread-local record. Nests.
// Whoever holds one must not block on anything a filesystem operation may
// hold (an operation that needs freed blocks waits for the guards), nor
// call an operation that frees or allocates.
class MapGuard : epoch::Guard {  // an epoch guard by another name
 public:
  MapGuard() = default;
  MapGuard(const MapGuard&) = delete;
  MapGuard& operator=(const MapGuard&) = delete;
};

// An open file: what Open returns and Read/Write take, so the data path needs
// no inode-number lookup.
struct OpenFile;
using FileHandle = OpenFile*;

class Filesystem {
 public:
  // Maps the namespace at `path`, recovers it if needed (journal, orphans) and
  // returns the mounted filesystem. Clear one-line errors for every refusal.
  static Result<std::unique_ptr<Filesystem>> Mount(const std::string& path,
                                                   const MountOptions& options);
  // The same on an already opened namespace (any Media backend, e.g. the
  // recording backend of the crash tests). REQUIRES: media->read_only() ==
  // options.read_only.
  static Result<std::unique_ptr<Filesystem>> Mount(std::unique_ptr<Media> media,
                                                   const MountOptions& options);
  virtual ~Filesystem() = default;  // unmounts cleanly if Unmount was not called
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  // The caller's service ends (the daemon's session with the kernel is
  // over; Unmount follows): a mount of this namespace that starts from now
  // on waits for this process to let go of it instead of failing with "in
  // use" (Media::EndService). Thread-safe; idempotent.
  virtual void EndService() = 0;
  // The daemon has mounted the namespace through FUSE, and `mount` is
  // that mount (MountAt): openers refuse at once only while that mount
  // exists, and wait for this process once it is gone; nvfs-resize finds
  // the mount, and the control socket named by its device number, through
  // the namespace (Media::ServeThroughMount, FindServingMount). Call once
  // the mount is in place.
  virtual void ServeThroughMount(const MountName& mount) = 0;
  // Writes exact counters and marks the filesystem clean. Nothing may run
  // concurrently; no call may follow but the destructor.
  virtual Status Unmount() = 0;

  // --- Names -------------------------------------------------------------
  virtual Result<Attr> Lookup(uint64_t parent, std::string_view name) = 0;
  // A reference to an inode known by number (readdirplus, NFS handles).
  virtual Result<Attr> LookupInode(uint64_t ino) = 0;
  // Never throws (a caller has no one to tell: a FUSE FORGET has no reply,
  // and a reply that failed is already gone): a reclaim of an unlinked
  // inode whose last reference this was that fails (std::bad_alloc) is said
  // on stderr; the inode stays on the orphan list, for its next use or the
  // next mount, and leaves the cache all the same.
  virtual void Forget(uint64_t ino, uint64_t count) noexcept = 0;
  // Drops every reference Lookup & co. handed out, as if each had been
  // forgotten: for a FUSE session that ended (umount, SIGTERM) before the
  // kernel sent its FORGETs. Unlinked inodes left without a reference or an
  // open file are freed now rather than at the next mount. Never throws, as
  // Forget: each reclaim on its own, a failed one said on stderr.
  // REQUIRES: nothing runs concurrently (the session loop has returned;
  // before Unmount).
  virtual void ForgetAll() noexcept = 0;

  virtual Result<Attr> Mknod(uint64_t parent, std::string_view name, uint32_t mode, uint64_t rdev,
                             const Cred& cred) = 0;
  virtual Result<Attr> Mkdir(uint64_t parent, std::string_view name, uint32_t mode, const Cred& cred) = 0;
  virtual Result<Attr> Symlink(uint64_t parent, std::string_view name, std::string_view target,
                               const Cred& cred) = 0;
  virtual Result<Attr> Link(uint64_t ino, uint64_t new_parent, std::string_view new_name) = 0;
  virtual Status Unlink(uint64_t parent, std::string_view name) = 0;
  virtual Status Rmdir(uint64_t parent, std::string_view name) = 0;
  // flags: 0, RENAME_NOREPLACE, RENAME_EXCHANGE, or RENAME_WHITEOUT (with
  // or without RENAME_NOREPLACE): the source name is then left naming a new
  // whiteout (a character device 0:0, mode 0, owned by `cred`), in the same
  // atomic operation.
  virtual Status Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                        std::string_view new_name, unsigned flags, const Cred& cred = {}) = 0;
  virtual Result<std::string> Readlink(uint64_t ino) = 0;

  // Lists `dir` from `cookie` (0 to start): ".", "..", then the entries.
  // fn gets each entry and the cookie that resumes after it; it returns false
  // to stop (that entry is then not consumed).
  struct DirEntry {
    std::string_view name;
    uint64_t ino;
    uint32_t type;  // DT_*
  };
  virtual Status ReadDir(uint64_t dir, uint64_t cookie,
                         const std::function<bool(const DirEntry& entry, uint64_t next_cookie)>& fn) = 0;

  // --- Attributes ----------------------------------------------------------
  virtual Result<Attr> GetAttr(uint64_t ino) = 0;
  virtual Result<Attr> SetAttr(uint64_t ino, const SetAttrRequest& request) = 0;
  virtual Result<StatFs> GetStatFs() = 0;

  // --- Growing while mounted (doc/integrity.md, section 12) ----------------
  struct GrowResult {
    uint64_t old_blocks = 0;
    uint64_t new_blocks = 0;  // equal to old_blocks: nothing to do
    uint32_t block_size = 0;
    uint64_t added_free_blocks = 0;
    uint64_t added_free_inodes = 0;
  };
  // Grows the namespace to `namespace_size` bytes (an image file is
  // extended) and the filesystem into it by whole groups, while operations
  // run: the new part is mapped after the mapping, which does not move, and
  // the grow is one transaction (as the offline one, nvfs/resize.hpp); the new blocks
  // and inodes are handed out, and GetStatFs counts them, once it has
  // committed. EROFS read-only; EINVAL smaller than the filesystem; ENOSPC
  // past the address space reserved at mount (MountOptions::grow_reserve)
  // or the host. One grow at a time (a second waits).
  virtual Result<GrowResult> Grow(uint64_t namespace_size) = 0;
  // The attributes chattr(1) and lsattr(1) see (FS_IOC_GETFLAGS and
  // FS_IOC_SETFLAGS), as FS_*_FL bits of <linux/fs.h>: FS_IMMUTABLE_FL,
  // FS_APPEND_FL, FS_NODUMP_FL, FS_NOATIME_FL and FS_SYNC_FL (the last two
  // change nothing: no atime is updated on reads, and every operation is
  // synchronous already). Regular files and directories only (ENOTTY).
  // SetInodeFlags replaces them all: EOPNOTSUPP for any other bit; EPERM
  // unless `cred` owns the inode or is root, and for a change of
  // FS_IMMUTABLE_FL or FS_APPEND_FL unless it is root (the kernel checks
  // CAP_LINUX_IMMUTABLE first; a FUSE daemon knows only the uid); while
  // immutable and staying so, no other flag may change. Atomic, sets ctime.
  virtual Result<uint32_t> GetInodeFlags(uint64_t ino) = 0;
  virtual Status SetInodeFlags(uint64_t ino, uint32_t fs_flags, const Cred& cred) = 0;

  // --- Files -----------------------------------------------------------------
  // Opens a regular file (O_TRUNC truncates, as one atomic operation); the
  // handle holds the inode until Release.
  virtual Result<FileHandle> Open(uint64_t ino, int flags, unsigned io_flags = 0) = 0;
  // Creates and opens: EEXIST if the name exists.
  virtual Result<FileHandle> Create(uint64_t parent, std::string_view name, uint32_t mode, int flags,
                                    const Cred& cred, Attr* attr) = 0;
  // Never throws, as Forget: a failed reclaim, or freeing of an unlinked
  // file's data, is said on stderr and left to the inode's next use or the
  // next mount.
  virtual void Release(FileHandle file) noexcept = 0;
  // O_TMPFILE: a regular file in directory `parent`'s group that no
  // directory names (link count 0), open with `flags`, on the orphan list
  // from the transaction that makes it, so that a crash or its release
  // frees it; Link of it (linkat from /proc/self/fd) gives it a name and
  // takes it off the list in one transaction. Adds one reference, as Create.
  virtual Result<FileHandle> Tmpfile(uint64_t parent, uint32_t mode, int flags, const Cred& cred,
                                     Attr* attr) = 0;

  // The three read paths; all return the same bytes: past EOF nothing, holes
  // zeros.
  // read: one contiguous copy (nvfs ->read).
  virtual Result<size_t> Read(FileHandle file, uint64_t offset, void* buf, size_t len) = 0;
  // read_iter: copy into a scatter list (nvfs ->read_iter).
  virtual Result<size_t> ReadIter(FileHandle file, uint64_t offset, const iovec* iov, int iovcnt) = 0;
  // map: no copy; fills up to max_runs runs covering [offset, offset + len)
  // (clipped at EOF) and returns the bytes covered. The runs were this
  // range's bytes when Map returned; while `held` (entered before the call)
  // lives they show those bytes or, where the file is written meanwhile,
  // its newer bytes (as any read racing a write may) — never bytes of
  // another file, even if the file is truncated, punched or deleted
  // meanwhile: the blocks it frees are not reused until every guard older
  // than the free has ended.
  virtual Result<size_t> Map(FileHandle file, uint64_t offset, size_t len, ReadRun* runs,
                             size_t max_runs, size_t* run_count, const MapGuard& held) = 0;

  // Runs `read` (a call of Read, ReadIter or Map on `file`) so that a media
  // error met while it loads from the mapping (SIGBUS: a poisoned pmem page,
  // a backing file cut short) fails it with EIO, counted and said on stderr,
  // instead of killing the process (doc/integrity.md, "Media errors"). The
  // FUSE adapter reads this way. The read paths carry no recovery point of
  // their own (but for the rare retry under the inode lock, which must not
  // be jumped over): a sigsetjmp costs them ~30% in process, and a request
  // through FUSE pays it once. Safe to abandon a read at any load: it holds
  // no lock, owns nothing but its epoch guards (their depth is put back
  // here) and has written only into the caller's buffer or run list, which
  // is then thrown away.
  template <class Read>
  Result<size_t> RecoverMediaErrors(FileHandle file, Read&& read) {
    const uint32_t depth = epoch::GuardDepth();
    Result<size_t> n = Error(EIO);
    if (!RunFaultGuarded([&] { n = read(); })) {
      epoch::AbandonGuardsTo(depth);
      ReportReadFault(file);
      return Error(EIO);
    }
    return n;
  }

  // Writes at `offset` (O_APPEND handles: at the end, unless kAtOffset).
  // Durable on return.
  virtual Result<size_t> Write(FileHandle file, uint64_t offset, const void* buf, size_t len,
                               unsigned io_flags = 0) = 0;
  virtual Result<size_t> WriteIter(FileHandle file, uint64_t offset, const iovec* iov, int iovcnt,
                                   unsigned io_flags = 0) = 0;
  // Everything is durable already; checks the handle.
  virtual Status Fsync(FileHandle file) = 0;
  // mode: 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE.
  virtual Status Fallocate(FileHandle file, int mode, uint64_t offset, uint64_t len,
                           unsigned io_flags = 0) = 0;
  // The kernel is filling pages of `file` (a handle open for writing) that
  // a shared mapping may store into: gives every hole of [offset, offset +
  // len) inside the file's size a zeroed block, from the reserve if need be
  // (Tx::AllowReserve), so the write-back of such a store needs no space.
  // A FUSE server cannot fail a store at its fault, as ext4 and DAX do with
  // SIGBUS; a write-back that fails instead loses the store and fails the
  // file's next read (the kernel reports it there). Nothing is seen to
  // change: no time moves, no byte. Ok at once when there is no hole;
  // ENOSPC when even the reserve is used up, EBADF for a read-only handle,
  // EROFS on a read-only mount: the caller fills the pages all the same.
  virtual Status BackMappedRange(FileHandle file, uint64_t offset, uint64_t len) = 0;
  // SEEK_DATA / SEEK_HOLE (and SEEK_SET/SEEK_CUR/SEEK_END for completeness).
  virtual Result<uint64_t> Lseek(FileHandle file, uint64_t offset, int whence) = 0;
  virtual uint64_t HandleIno(FileHandle file) const = 0;

  // --- Extended attributes ------------------------------------------------------
  // Names in the user., trusted. and security. namespaces, and the two POSIX
  // ACL names (above: values checked, EINVAL if malformed, EOPNOTSUPP for
  // another version, as the kernel answers; a default ACL on
  // anything but a directory is EACCES, any ACL on a symlink EOPNOTSUPP);
  // every other system. name is EOPNOTSUPP, as is a name of no namespace.
  // Who may set or read which namespace is the kernel's check
  // (src/fs/xattr.cpp).
  // flags: 0, XATTR_CREATE or XATTR_REPLACE (ignored for ACLs, as by the
  // kernel); xattr_flags: XattrFlags.
  virtual Status SetXattr(uint64_t ino, std::string_view name, const void* value, size_t size,
                          int flags, unsigned xattr_flags = 0) = 0;
  // With size 0 returns the value's size; ERANGE if it does not fit.
  virtual Result<size_t> GetXattr(uint64_t ino, std::string_view name, void* value, size_t size) = 0;
  // NUL-separated names, those `cred` is shown: trusted. names only to uid 0,
  // of system. names only the ACL names. With size 0 returns the size that list needs.
  virtual Result<size_t> ListXattr(uint64_t ino, char* list, size_t size, const Cred& cred) = 0;
  virtual Status RemoveXattr(uint64_t ino, std::string_view name) = 0;

  // --- Direct reads (src/direct/, include/nvfs/direct_abi.hpp) ---------------------
  // Other processes that map the namespace themselves read files from it
  // directly, checking each copy against the file's slot in `table`, a
  // table of `count` slots (slot 0 the header, the rest zeroed) that the
  // caller shares with them read-only. From now on the filesystem keeps
  // the slot of every inode DirectMap was asked about current: its seq
  // moves with the file's sequence counter (odd during each change of the file's
  // mapping or size, before any block it frees can be reused), and by 2
  // when the inode leaves the cache (doc/integrity.md section 10). Call
  // once; the table must outlive the filesystem.
  virtual void SetDirectTable(DirectSlot* table, uint32_t count) = 0;
  // Direct maps (doc/integrity.md section 13): after SetDirectTable,
  // `changed(ctx, slot)` is called after each change of the mapping or size
  // of a file whose slot's `watchers` is not zero, on the thread that made
  // it, under the file's lock: it must not wait nor call the filesystem.
  // Call once; `ctx` must outlive the filesystem.
  virtual void SetDirectWatch(void (*changed)(void* ctx, uint32_t slot), void* ctx) = 0;
  struct DirectMapping {
    uint32_t slot = 0;     // index into the table
    uint64_t seq = 0;      // the slot's seq the runs and size were read at (even)
    uint64_t size = 0;     // the file's size then
    uint64_t start = 0;    // file offset of runs[0]: `offset` rounded down to a block
    size_t run_count = 0;  // runs filled, consecutive in the file, whole blocks up to EOF
    // The file's append word (format.hpp Inode::append_end): its namespace
    // offset, its value when the runs were read (0: closed), and whether
    // this call opened it (then the caller makes the kernel forget the
    // file's cached attributes before it replies: the size moves without
    // the daemon from now on).
    uint64_t append_at = 0;
    uint64_t append_word = 0;
    bool append_opened = false;
    // This call folded appends by word into the size (it grew): the caller
    // moves the kernel's size of the file, as after a commit that stored.
    bool append_folded = false;
  };
  // The runs of regular file `ino` from the block holding `offset` on (at
  // most `max_runs`, none if `offset` is at or past EOF) as byte ranges of
  // the namespace, and its slot. The inode must be open (EBADF otherwise:
  // its slot would go with its cache entry at once). EINVAL for anything
  // but a regular file, ENOSPC when every slot is taken, EIO for a damaged
  // map, ESTALE for an inode not in use.
  virtual Result<DirectMapping> DirectMap(uint64_t ino, uint64_t offset, DirectRun* runs,
                                          size_t max_runs) = 0;

  // --- Direct writes (src/direct/, doc/integrity.md section 11) ---------------------
  // Processes that may write the namespace store into a file's blocks from
  // their own mapping of it; the daemon gives them blocks and commits what
  // they stored. From this call on, a block freed is reused only once
  // `grace` says that no such store begun before the free still runs.
  // Call once, before the first DirectAllocate; `grace` must outlive the
  // filesystem.
  virtual void SetExternalGrace(epoch::ExternalGrace* grace) = 0;
  // For a direct write of [offset, offset + len) of regular file `ino`
  // (open, as for DirectMap): every hole of the range gets a block (zeroed
  // inside the size), and so does every block past the end of the file up
  // to `reserve_end` (kept past the size, as fallocate's KEEP_SIZE keeps
  // them), committed before this returns; the size does not change.
  // Returns the runs from the block holding `offset` on, as DirectMap's but
  // reaching past the size over the blocks the file has there, up to
  // `reserve_end`. EROFS, EPERM (immutable, append-only), EFBIG, ENOSPC
  // (blocks allocated before stay: zeros in holes, or past the size).
  virtual Result<DirectMapping> DirectAllocate(uint64_t ino, uint64_t offset, uint64_t len,
                                               uint64_t reserve_end, DirectRun* runs,
                                               size_t max_runs) = 0;
  // After a direct writer made [start, end) durable in runs it was given at
  // slot seq `seq`: if the slot's seq is still `seq` and every block of the
  // range is mapped, zeroes the bytes between the size and `start`, makes
  // the size at least `end`, and mtime and ctime now, in one transaction;
  // EAGAIN if the file changed since (the writer stores again, into fresh
  // runs). With start == end only the times change, whatever the seq.
  // Returns the runs from `end` on, as DirectAllocate's, up to `map_end`.
  virtual Result<DirectMapping> DirectCommit(uint64_t ino, uint64_t start, uint64_t end,
                                             uint64_t seq, uint64_t map_end, DirectRun* runs,
                                             size_t max_runs) = 0;
  // Frees the blocks the file has past its end (DirectAllocate's reserve,
  // or fallocate's KEEP_SIZE): its last direct writer is done with them.
  virtual Status DirectTrim(uint64_t ino) = 0;
  // From this call on, a DirectCommit that leaves blocks past the new size
  // opens the file's append word at it (doc/integrity.md section 11,
  // "Appends by word"): direct writers then append into those blocks and
  // move the word themselves, with no request; the core folds the word into
  // the size, and closes it, before any other change of the file, and
  // Attr::size_moving says a file's size may move under the caller. Only
  // for a mount whose kernel caches no file pages (cache=none): a page the
  // kernel kept past the old size would stay stale. After SetExternalGrace.
  virtual void SetAppendWords(bool on) = 0;

  // --- Information ----------------------------------------------------------------
  virtual uint32_t block_size() const = 0;
  // True if mounted read-only, or turned read-only since by damage.
  virtual bool read_only() const = 0;
  // True if the superblock recorded errors when mounted (an earlier mount
  // found damage, and no fsck.nvfs -y has cleared it since).
  virtual bool recorded_errors() const = 0;
  // True if damage was found on this mount (the flag is being, or has been,
  // set on the media if the mount is writable).
  virtual bool damage_found() const = 0;
  virtual const Geometry& geometry() const = 0;
  virtual Media& media() const = 0;
  // Inodes on the orphan list and cached inodes (tests).
  virtual size_t cached_inodes() const = 0;
  // Extent maps the read paths built and published so far (tests, tools).
  virtual uint64_t extent_maps_built() const = 0;


  // What RecoverMediaErrors does when `file`'s read met a media error:
  // counts it and says so in one line on stderr.
  [[gnu::cold]] virtual void ReportReadFault(FileHandle file) = 0;

 protected:
  Filesystem() = default;
};

}  // namespace nvfs
