// The FUSE adapter: libfuse3's low-level operations (fuse_lowlevel_ops) over
// the errno-returning core (nvfs::Filesystem). The core never sees a
// fuse_req_t; the adapter is the only code that does.
//
// Rules every callback follows:
//   - its state comes from fuse_req_userdata(req) (the FuseAdapter), never a
//     global; the only per-thread state is the read/readdir buffers below;
//   - it calls the core, then replies EXACTLY once, as the last thing it does
//     (fuse_reply_* never throw, so nothing can follow a reply);
//   - it holds no lock of its own, and the core drops its locks before it
//     returns, so no lock is held across a reply;
//   - no exception crosses into libfuse: std::bad_alloc becomes ENOMEM and
//     anything else EIO (forget gets fuse_reply_none);
//   - a reply the kernel refuses (the request was interrupted) undoes the
//     references the reply would have handed over (Forget, Release).
//
// Two POSIX rules the kernel leaves to a FUSE daemon in some cases:
//   - privileges (set-user-ID, group-executable set-group-ID,
//     security.capability) are dropped by a write, truncate, O_TRUNC open
//     or fallocate of a caller without CAP_FSETID, in the core, before the
//     new bytes are visible. The kernel says which callers lack CAP_FSETID
//     (FUSE_HANDLE_KILLPRIV_V2, negotiated by the transport); for
//     fallocate it says nothing, and a non-root caller stands for one;
//   - xattr namespaces: the kernel checks nothing for system.* names and
//     filters nothing listxattr returns. The rules are the core's
//     (Filesystem::SetXattr and ListXattr, ext4's rules); the adapter passes
//     ListXattr the caller's credentials;
//   - POSIX ACLs (FUSE_CAP_POSIX_ACL, which also turns on the kernel's
//     default_permissions): the kernel reads them through getxattr,
//     enforces them, checks who sets them (owner or CAP_FOWNER) and
//     validates their values; the core keeps the mode and the access ACL
//     in step (set, chmod), inherits default ACLs on create and applies the
//     umask itself (FUSE_CAP_DONT_MASK: the kernel sends it with MKNOD,
//     MKDIR and CREATE, CredOf passes it on); set-group-ID is cleared on an
//     ACL set the kernel marks (FUSE_SETXATTR_ACL_KILL_SGID, transport.hpp).
//     The kernel forgets the ACLs it caches when it sets one, on SETATTR,
//     and when it refreshes an inode's attributes.
//
// The callbacks are split by concern like the core: names (namei.cpp),
// attributes and xattrs (attr.cpp), files and the read/write paths
// (file.cpp), directories (dir.cpp); ops.hpp holds what they share and
// adapter.cpp the session setup and the operations table.
//
// Inode numbers are the core's: the root is 1 == FUSE_ROOT_ID, and every
// entry carries the inode's generation, so (ino, generation) is a stable,
// NFS-export-safe handle (FUSE_CAP_EXPORT_SUPPORT).
//
// Caching (-o cache=):
//   none  FUSE direct I/O (fi->direct_io): every read and write reaches the
//         daemon, nothing is copied through the kernel's page cache — the
//         DAX-like default. Shared mmap works where the kernel offers
//         FUSE_DIRECT_IO_ALLOW_MMAP (6.6+; asked for by OpInit through the
//         transport, as libfuse 3.14 cannot): the mapping's pages are
//         cached and written back as FUSE_WRITE with FUSE_WRITE_CACHE,
//         through a writable handle of the inode, kept coherent with
//         direct reads and writes by the kernel. Elsewhere ENODEV.
//   page  the kernel's page cache (fi->keep_cache), write-through: write()
//         still reaches the core before it returns, so it stays durable on
//         return. FUSE_CAP_WRITEBACK_CACHE is never asked for: it would let
//         write() return with the data only in the kernel, which breaks the
//         durability contract and loses data on kill -9 of the daemon.
// Entry and attribute timeouts (kCacheForever, in both modes): the kernel
// keeps what it was told for as long as the mount lives. The daemon holds
// the namespace's lock, so nothing but the kernel's own requests changes
// it, and what those change the kernel learns or forgets by itself:
//   - replies carry the attributes of what they changed (SETATTR, LINK,
//     MKNOD, MKDIR, SYMLINK, CREATE, READDIRPLUS entries);
//   - it drops the attributes of a directory whose entries it changed
//     (fs/fuse/dir.c, fuse_dir_changed; Linux 6.18 drops all the basic
//     stats, mode, uid and gid too, so the next path walk through the
//     directory refetches them: fuse_permission, with default_permissions,
//     which FUSE_POSIX_ACL forces, sends a GETATTR whenever inval_mask
//     holds STATX_MODE, UID or GID. One GETATTR per create, unlink, mkdir
//     or rename; no notification stores attributes, so the daemon cannot
//     spare it. Newer fs/fuse trees drop only FUSE_STATX_MODDIR: size, nlink,
//     mtime, ctime, blocks) and of
//     an inode it unlinked, renamed or set an xattr on (fuse_update_ctime,
//     fuse_entry_unlinked, which also drops nlink), of a file it wrote
//     (fuse_write_update_attr: size, mtime, ctime, blocks, on direct and
//     cached writes), fallocated, opened with O_TRUNC, or whose mmap'ed
//     pages it wrote back (fuse_writepage_end, without writeback cache);
//   - the kernel keeps no times of its own (S_NOCMTIME without writeback
//     cache) and nvfs changes no atime on read (noatime semantics).
// The one change the kernel cannot foresee is the core dropping
// set-user-ID/set-group-ID on a write or fallocate by a caller without
// CAP_FSETID: the kernel drops only size and times after a write, and keeps
// the mode it has for permission checks and exec (fuse_permission refreshes
// the mode only once it expires, bprm_fill_uid reads i_mode as cached). The
// adapter then tells the kernel to forget the inode's attributes
// (fuse_lowlevel_notify_inval_inode, attributes only) before it replies.
// Negative lookups are cached as long: a name appears only by the kernel's
// own create, link, rename or mknod, which replace the negative entry. So are
// directory listings (FOPEN_CACHE_DIR, dir.cpp), which the kernel drops when
// it changes the directory's entries; with entry timeouts shorter than
// kCacheListingsFrom (entry_timeout=, for measurements) they are not.
// tests/mount/test_mount_attrs.cpp ("the kernel's cached attributes ...") checks each
// kind of change against a fresh mount's view.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "nvfs/fs.hpp"

namespace nvfs {

// Which core read path serves FUSE_READ (-o read_path=).
enum class ReadPath {
  kRead,  // Filesystem::Read into a per-thread buffer, fuse_reply_buf
  kIter,  // Filesystem::ReadIter into that buffer as 4 KiB iovecs, fuse_reply_buf
  kMap,   // Filesystem::Map: reply straight from the mapping (zero copy)
};

enum class CacheMode {
  kNone,  // FUSE direct I/O
  kPage,  // the kernel page cache, write-through
};

const char* ReadPathName(ReadPath path);
const char* CacheModeName(CacheMode mode);

// Longer than any mount lives (about 31 years): the kernel caps it to its
// own maximum. Below 2^63 ns, which the kernel's conversion of the reply's
// seconds must not exceed.
inline constexpr double kCacheForever = 1e9;
// Directory listings are cached from this entry timeout on (adapter.cpp).
inline constexpr double kCacheListingsFrom = 60;

struct AdapterOptions {
  ReadPath read_path = ReadPath::kMap;
  CacheMode cache = CacheMode::kNone;
  double entry_timeout = kCacheForever;  // seconds; see above
  double attr_timeout = kCacheForever;
  // Ask for FUSE over io_uring when the kernel offers it (-o io_uring=auto
  // or on; uring.hpp). REQUIRES if set: once INIT agreed to it
  // (Protocol::io_uring), the caller starts a UringTransport, since the
  // kernel holds every request back until the rings are registered.
  bool io_uring = false;
};

// Largest FUSE_WRITE (and, through max_pages, FUSE_READ) the adapter asks
// the kernel for.
inline constexpr uint32_t kFuseMaxIo = 1u << 20;

// Background requests (asynchronous direct I/O, read-ahead) the kernel keeps
// in flight to the daemon (OpInit). Past it the kernel marks the connection
// blocked and puts every thread that submits one more to sleep until one
// completes: seed 000's fio (4 jobs x 128 reads queued, 512 in flight) ran
// 0.65x as fast at 256 as at 1024, its submitters woken one completion at a
// time (doc/bench.md, "Reads at queue depth").
inline constexpr unsigned kMaxBackground = 1024;

// Whether the caller of the request this thread serves is in group `gid`
// (MountOptions::caller_in_group): its fsgid, else its supplementary groups
// (fuse_req_getgroups, from /proc). False where that cannot be told, and on
// a thread serving no request.
bool CallerInGroup(uint32_t gid);

class FuseAdapter {
 public:
  explicit FuseAdapter(const AdapterOptions& options) : options_(options) {}
  ~FuseAdapter() { StopInvalidations(); }
  FuseAdapter(const FuseAdapter&) = delete;
  FuseAdapter& operator=(const FuseAdapter&) = delete;

  // The mounted core that requests go to. REQUIRES: called before the FUSE
  // session is mounted (no request can arrive earlier); `fs` outlives the
  // session loop.
  void set_filesystem(Filesystem* fs) { fs_ = fs; }
  Filesystem& fs() const { return *fs_; }
  // The session notifications go to. REQUIRES: set before it is mounted.
  void set_session(fuse_session* se) { se_ = se; }

  // Makes the kernel forget the attributes it caches for `ino` (not its
  // pages), for a change it cannot know of (above). Safe inside a request
  // that holds the inode's locks in the kernel: an attributes-only
  // invalidation takes none of them.
  void ForgetCachedAttr(fuse_ino_t ino) const;
  // A direct writer (src/direct/) grew `ino` without the kernel: its size
  // is now at least `size`, and its last byte is `last_byte`. The kernel's
  // own size of the inode, which it checks on every fault of a mapping
  // through the mount (a page past it is SIGBUS) and which a stat with
  // cached attributes shows, is moved up to it (a FUSE_NOTIFY_STORE of that
  // byte: the kernel grows i_size to the end of a store of one byte or more;
  // of none, it leaves it). Waits for nothing the kernel could hold for
  // long (the store locks one page).
  void DirectlyGrown(fuse_ino_t ino, uint64_t size, uint8_t last_byte) const;
  const AdapterOptions& options() const { return options_; }

  // The operations table; pass `this` as the session's userdata.
  static const fuse_lowlevel_ops& Ops();

  // What INIT settled beyond what libfuse 3.14 knows (transport.hpp). Set
  // while INIT is served (one thread, before the worker threads start);
  // read-only after.
  struct Protocol {
    uint64_t kernel_flags = 0;  // the kernel's offer: flags | flags2 << 32
    uint64_t extra_flags = 0;   // OpInit's wishes beyond libfuse, same layout
    uint64_t agreed_flags = 0;  // what the INIT reply carried, same layout
    uint64_t init_unique = 0;   // the INIT request, until its reply is sent
    // The kernel caches directory listings (dir.cpp; entry timeouts of at
    // least kCacheListingsFrom).
    bool cache_listings = false;
    // FUSE_CAP_NO_OPENDIR_SUPPORT agreed (through libfuse, with
    // cache_listings): OPENDIR may fail with ENOSYS, and the kernel stops
    // sending it (dir.cpp).
    bool no_opendir = false;
    bool agreed(uint64_t flag) const { return (agreed_flags & flag) == flag; }
    // FUSE_OVER_IO_URING agreed: requests come through the rings
    // (uring.hpp) once they are registered.
    bool io_uring = false;
  };
  Protocol& protocol() { return protocol_; }
  const Protocol& protocol() const { return protocol_; }

  // cache=page: a direct write (O_DIRECT, not a mapping's write-back) of
  // [off, off + len) of `ino` has been stored. The kernel drops the range's
  // cached pages before it sends a direct write, and again after one that
  // completed synchronously (mm/filemap.c, generic_file_direct_write); after
  // an asynchronous one (io_submit, io_uring) it drops nothing
  // (fs/fuse/file.c, fuse_aio_complete). A buffered read served while such a
  // write was in flight leaves pages of the old bytes in the cache, and with
  // keep_cache they would stay there, across opens, for as long as the
  // inode is cached (fstests generic/451). So the adapter
  //   - has a thread of its own drop the range's pages
  //     (fuse_lowlevel_notify_inval_inode with a range: the kernel locks
  //     each page, so it waits for reads in flight, which may sit in the
  //     queue of the very thread serving this write; a worker thread must
  //     not wait for it);
  //   - until that drop has returned, replies to every OPEN of `ino`
  //     without keep_cache, which makes the kernel drop all of the inode's
  //     pages in that open, before it returns (FOPEN_KEEP_CACHE unset).
  // Either drop starts after the bytes are stored: a page in the cache by
  // then is dropped (a read in flight holds its page locked, the drop
  // waits), a page read after it has the new bytes. Both are needed: the
  // thread's drop can come after the writer has seen its write complete and
  // a new open has read; and an open's drop happens in the opener's own
  // time, after the daemon replied, so one opener's reply says nothing of
  // another's reads (marking only the next open was tried: generic/451
  // still read stale pages when a reader's open took the mark).
  void DirectWritten(fuse_ino_t ino, uint64_t off, uint64_t len);
  // True while a DirectWritten(ino, ...) drop has not returned: the open
  // being replied to must not keep the cache (above).
  bool OpenMustDropCache(fuse_ino_t ino);
  // Stops the invalidation thread, after sending what it still had.
  // REQUIRES: before the session is destroyed; no request is being served.
  void StopInvalidations();

  // Handles handed to the kernel (open, create) and not yet released. A
  // session can end (SIGTERM, umount) with files still open, their RELEASE
  // or the kernel's FORGETs still in flight: EndSession gives the core back
  // every handle and every lookup reference the kernel held, so an unlinked
  // file still open is freed at unmount rather than at the next mount.
  // REQUIRES for EndSession: the session loop has returned.
  void TrackOpen(FileHandle file);
  void UntrackOpen(FileHandle file) noexcept;
  void EndSession();

 private:
  // Both set before the session mounts and constant while it runs, so the
  // worker threads read them without a lock.
  Filesystem* fs_ = nullptr;
  fuse_session* se_ = nullptr;
  const AdapterOptions options_;
  Protocol protocol_;

  std::mutex open_mu_;  // a leaf lock: never held while calling the core
  std::unordered_set<FileHandle> open_;  // protected by open_mu_

  // DirectWritten's state; inval_mu_ is a leaf lock, never held across a
  // notification. Ranges waiting for the thread merge per inode (the
  // smallest range covering them), so the map holds an inode once.
  // unsettled_ counts, per inode, the direct writes whose drop has not
  // returned (waiting in inval_pending_ or being sent).
  struct Range {
    uint64_t begin;
    uint64_t end;
    unsigned writes;  // how many DirectWritten calls the range merges
  };
  std::mutex inval_mu_;
  std::condition_variable inval_cv_;
  std::unordered_map<fuse_ino_t, Range> inval_pending_;  // protected by inval_mu_
  std::unordered_map<fuse_ino_t, unsigned> unsettled_;  // protected by inval_mu_
  // unsettled_.size(), for OpenMustDropCache to read without the lock: an
  // open takes inval_mu_ only while some direct write's drop is pending.
  std::atomic<size_t> unsettled_inodes_{0};
  bool inval_stop_ = false;                              // protected by inval_mu_
  std::thread inval_thread_;  // started by the first DirectWritten
  void InvalidateLoop();
};

}  // namespace nvfs
