// The media layer: owns the mapping of a pmem namespace and is the ONLY code that
// stores to, flushes or fences it (nvfs's nv_store and pmem_wmb). Everyone else
// reads through base() and asks the Media to change bytes.
//
// Ordering contract (x86 with ADR, as libpmem2 describes it): a Store is
// visible to readers at once but durable only after a Flush of its range
// followed by a Drain. Store64 is a single aligned 8-byte store, so after a
// crash the word holds either the old or the new value, never a mix: it is the
// primitive every "publish" step uses.
//
// Thread safety: stores to disjoint ranges may run concurrently; callers
// serialise stores to the same bytes. Counters are approximate under
// concurrency.
#pragma once

#include <setjmp.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nvfs/result.hpp"

namespace nvfs {

// A mount as the kernel names it.
struct MountName {
  // Its device number (mountinfo's MAJOR:MINOR). A FUSE mount's is an
  // anonymous one, given again to the next mount once this one is gone.
  dev_t dev = 0;
  // Its unique mount id (statmount(2), Linux 6.8), never given to another
  // mount until the system restarts; 0 where the kernel does not say.
  uint64_t unique_id = 0;
};

// The mount at `mountpoint` in /proc/self/mountinfo (the last one, if several
// are stacked there), found without touching it (a stat of a FUSE mount
// point waits for its daemon); nullopt if nothing is mounted there.
std::optional<MountName> MountAt(const std::string& mountpoint);

enum class Granularity {
  kByte,       // eADR: stores are durable once visible; flushes are no-ops
  kCacheLine,  // ADR: cache lines must be flushed (clwb/clflushopt) and fenced
  kPage,       // not DAX: pages are flushed with msync
  // An image file on tmpfs (the embedded default, /dev/shm): the mapping is
  // the page cache, the only copy there is. It outlives the daemon (kill -9
  // loses nothing stored) and nothing of it outlives the host, and msync of
  // a tmpfs page writes nowhere, so flushes are no-ops and a drain is a
  // fence, as with kByte. PMEM2_FORCE_GRANULARITY=page keeps msync (tests).
  kMemory,
};

const char* GranularityName(Granularity g);

struct MediaOptions {
  bool read_only = false;
  // Take an advisory lock on the namespace: exclusive for writers, shared for
  // readers, so a mounted nvfs, mkfs and fsck never run on one namespace at once.
  bool lock = true;
  // With `lock`: how long an opener waits for a holder that is releasing
  // the namespace (Media::EndService) before failing with EBUSY.
  uint32_t release_wait_ms = 10000;
  // Refuse namespaces smaller than this many bytes (the message names it).
  uint64_t min_size = 0;
  // Address space reserved for the mapping, in bytes (0: none; less than
  // the namespace: none). The namespace is mapped at the start of the
  // reservation and Grow maps what a grow adds right after it, so the
  // mapping never moves (a mounted grow, doc/integrity.md section 12).
  uint64_t reserve = 0;
  // Regular files only: create the file if it is missing and extend it to this
  // size if it is shorter (never shrinks). Requires !read_only. A file
  // created gets 0600 less the umask, owner-only even under umask 0 (the
  // namespace is the boundary: NamespaceExposure); an existing one keeps
  // its mode.
  uint64_t grow_to = 0;
};

class Media {
 public:
  virtual ~Media() = default;
  Media(const Media&) = delete;
  Media& operator=(const Media&) = delete;

  const std::byte* base() const { return base_; }
  // Grows (Grow) while others read it: an acquire load, paired with Grow's
  // release store after the new part is mapped.
  uint64_t size() const { return __atomic_load_n(&size_, __ATOMIC_ACQUIRE); }
  bool read_only() const { return read_only_; }
  Granularity granularity() const { return granularity_; }
  const std::string& path() const { return path_; }

  // REQUIRES: !read_only(); [offset, offset + len) inside the namespace. A
  // range outside it is a bug in the caller and aborts the process rather than
  // write outside the mapping.
  // Copies `len` bytes to the media; not yet durable.
  virtual void Store(uint64_t offset, const void* src, size_t len) = 0;
  // One aligned 8-byte store. REQUIRES: offset % 8 == 0.
  virtual void Store64(uint64_t offset, uint64_t value) = 0;
  // One aligned 8-byte compare-and-swap, for a word other processes move
  // the same way (an append word: integrity.md section 11): true, with
  // `desired` stored, if the word held *expected; false otherwise, with
  // *expected set to what it holds. Not yet durable. REQUIRES: offset % 8 == 0.
  virtual bool CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) = 0;
  // Sets `len` bytes to `byte`; not yet durable.
  virtual void Fill(uint64_t offset, int byte, size_t len) = 0;
  // Starts write-back of the range; durable after the next Drain.
  virtual void Flush(uint64_t offset, size_t len) = 0;
  // Waits until every flushed range is durable (the fence).
  virtual void Drain() = 0;
  // Store + Flush, with non-temporal stores where that is faster (bulk data).
  virtual void StoreFlush(uint64_t offset, const void* src, size_t len) = 0;

  void Persist(uint64_t offset, size_t len) {
    Flush(offset, len);
    Drain();
  }

  // The namespace grows to `new_size` bytes (a mounted grow): an image file
  // is extended to it, and the part past size() is mapped right after the
  // mapping, inside the address space reserved at open
  // (MediaOptions::reserve), so base() does not move and every address
  // handed out stays valid. size() moves last. ENOSPC (one line) past the
  // reservation, ENOTSUP for a backend that cannot grow. Serialised by the
  // caller (one grow at a time).
  // The default: a namespace mapped whole already (memory, the recording
  // backend of the crash suite, made with room past the filesystem) grows
  // into what it maps.
  virtual Status Grow(uint64_t new_size) {
    if (new_size <= size()) return Status::Ok();
    return MakeError(ENOTSUP, "%s: this namespace cannot grow while it is open", path_.c_str());
  }
  // Bytes the namespace may grow to while open (the reservation; size()
  // without one).
  virtual uint64_t reserved() const { return size(); }

  // Marks where one filesystem operation begins and ends; the recording backend
  // uses them to check and enumerate crash states per operation.
  virtual void BeginOp(const char* /*name*/) {}
  virtual void EndOp() {}

  // Host backing (doc/integrity.md, "Host space"). An image file may be
  // sparse: a store into a page its host filesystem cannot supply raises
  // SIGBUS, so nothing may store into a byte that is not backed. Back()
  // makes [offset, offset + len) backed (fallocate, in aligned chunks of
  // kBackChunk, remembered, so a range backed once costs one load per chunk
  // after that); ENOSPC with a message when the host cannot, and then
  // nothing was changed on the namespace. A device, a file without holes and
  // memory are backed whole: Back() is free. Thread-safe.
  virtual Status Back(uint64_t /*offset*/, uint64_t /*len*/) { return Status::Ok(); }
  // True if [offset, offset + len) is known to be backed (no fallocate).
  virtual bool Backed(uint64_t /*offset*/, uint64_t /*len*/) const { return true; }
  // Bytes the host can still back beyond what is backed already
  // (statvfs of the host filesystem); kBackedWhole when all is backed.
  virtual uint64_t HostAvailable() const { return kBackedWhole; }
  // Bytes known to be backed (a lower bound: what Back() and the scan at
  // open found backed in whole chunks).
  virtual uint64_t BackedBytes() const { return size_; }
  static constexpr uint64_t kBackedWhole = UINT64_MAX;

  // False when the namespace can no longer serve every mapped byte: an image
  // file cut shorter than the mapping under us (every load or store past its
  // end is a SIGBUS). Checked before work that must not fault (unmount).
  // Also false once a page was lost (LostPages).
  virtual bool Intact() const { return true; }
  // Pages of the mapping lost to media errors met outside every recovery
  // point (doc/integrity.md, "Media errors"): each was replaced by memory
  // that reads as all ones and keeps no store. Once it is non-zero, no
  // transaction commits (Tx::Commit fails with EIO) but the one recording
  // the error, and the namespace is not Intact.
  virtual uint64_t LostPages() const { return 0; }
  // Known bad ranges (namespace offsets and lengths) that libpmem2 reported
  // at open (pmem2_badblock_*: a DAX device or a file on fsdax); empty where
  // it has none or cannot tell (a file on tmpfs).
  struct BadRange {
    uint64_t offset;
    uint64_t length;
  };
  const std::vector<BadRange>& bad_ranges() const { return bad_ranges_; }
  static constexpr uint64_t kBackChunk = 2u << 20;

  // The holder begins to shut down: an opener that finds the namespace
  // locked by it waits (MediaOptions::release_wait_ms) instead of failing
  // with EBUSY
  // (OpenMedia). The lock itself is held until the media is destroyed.
  virtual void EndService() {}
  // The holder now serves the namespace through the FUSE mount `mount`,
  // and says so in a mark on the namespace itself, naming the mount as the
  // kernel does (never by its source, which fsname= lets a user choose):
  // by its unique id where the kernel gives one, else by its device number.
  // From now on an opener that finds the namespace locked refuses at once
  // only while that mount is in its mount namespace; once the mount is gone
  // (umount(2) returns before the daemon has noticed the end of its session,
  // let alone released the namespace) the opener waits for the holder as it
  // does after EndService (release_wait_ms). A device number is the
  // weaker name: the kernel gives it to the next mount as soon as this one
  // is gone, so an opener may meet another FUSE mount under it and refuse
  // at once. FindServingMount reads the mark.
  virtual void ServeThroughMount(const MountName& mount) { (void)mount; }

  // Bytes stored since the media was opened (all kinds of store).
  uint64_t bytes_stored() const { return bytes_stored_.load(std::memory_order_relaxed); }

 protected:
  Media() = default;
  // Aborts unless the media is writable and the range lies inside it.
  void CheckWrite(uint64_t offset, size_t len) const;

  std::byte* base_ = nullptr;  // the mapping; written only by the backends
  uint64_t size_ = 0;
  bool read_only_ = true;
  Granularity granularity_ = Granularity::kPage;
  std::string path_;
  std::vector<BadRange> bad_ranges_;
  void CountStored(size_t len) { bytes_stored_.fetch_add(len, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> bytes_stored_{0};
};

// Media errors (doc/integrity.md, "Media errors"). A load or store in a
// mapped namespace that the hardware or the host cannot serve (a poisoned
// pmem page; a backing file cut short) raises SIGBUS. The media layer's
// handler (installed by OpenMedia) turns it into a failed call of the
// innermost RunFaultGuarded on the faulting thread, if the address lies in
// a mapping. A fault in a mapping outside every recovery point replaces the
// page (LostPages) and the instruction goes on; any other SIGBUS kills the
// process as before.
struct FaultPoint {
  sigjmp_buf env;
  FaultPoint* prev;
};
namespace media_detail {
extern constinit thread_local FaultPoint* fault_point;
// Pages replaced in every mapping of the process so far (LostPages).
extern std::atomic<uint64_t> pages_lost;
bool LostIn(const std::byte* addr, size_t len);
}  // namespace media_detail

// True if [addr, addr + len), in a mapping, overlaps a page lost to a media
// error (LostPages): its bytes are the substitute's ones, not the
// namespace's, and must never be handed out as file data (the read fails
// with EIO). One load while no page of the process was ever lost. A page
// is counted before it is replaced, so a copy that read the substitute and
// then asks is told.
inline bool MediaLost(const std::byte* addr, size_t len) {
  if (media_detail::pages_lost.load(std::memory_order_acquire) == 0) [[likely]] return false;
  return media_detail::LostIn(addr, len);
}

// Runs f() and returns true; if a load or store in a mapping faults while it
// runs, f is abandoned at the fault (siglongjmp: nothing of f's frames is
// unwound) and false is returned, the error counted (MediaErrorCount).
// REQUIRES of f, because it may stop at any load of the mapping: it takes
// no lock, creates no object with a destructor that must run, and changes
// nothing outside its caller's locals that the caller cannot throw away (a
// copy into a buffer, a store of data bytes). Locks, transactions and
// guards the caller holds are outside f and are released by the caller as
// on any error return.
template <class F>
[[gnu::noinline]] bool RunFaultGuarded(F&& f) {
  FaultPoint point;
  point.prev = media_detail::fault_point;
  // savemask 0: no syscall; the handler runs with SA_NODEFER, so SIGBUS is
  // not left blocked by the jump. Under ThreadSanitizer our handler is run
  // by the detector's, which blocks every signal meanwhile: there the jump
  // restores the mask (a syscall per point, in that build only), or the
  // next fault, blocked, would kill the process.
#if defined(__SANITIZE_THREAD__)
  constexpr int kSaveMask = 1;
#else
  constexpr int kSaveMask = 0;
#endif
  if (sigsetjmp(point.env, kSaveMask) != 0) return false;  // the handler popped `point`
  media_detail::fault_point = &point;
  // The handler reads fault_point on this thread: without the fences the
  // compiler may move the stores across f's loads of the mapping (or drop
  // both, if f is inlined and calls nothing).
  std::atomic_signal_fence(std::memory_order_seq_cst);
  f();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  media_detail::fault_point = point.prev;
  return true;
}

// Media errors caught since the process started, and the namespace offset
// of the last one (UINT64_MAX if none).
uint64_t MediaErrorCount();
uint64_t LastMediaErrorOffset();

// Opens and maps the namespace at `path`: a DAX character device or a regular
// file (on a DAX filesystem or not). Errors carry one line naming the path:
// ENOENT missing, EACCES no permission, ENODEV neither a regular file nor a
// DAX device, EBUSY in use, ENOSPC too small (with the minimum), and what
// libpmem2 says when it cannot map.
Result<std::unique_ptr<Media>> OpenMedia(const std::string& path, const MediaOptions& options);

// The device number of the FUSE mount through which a daemon serves the
// namespace at `path` (the mark Media::ServeThroughMount leaves on the
// namespace, whatever path it was opened by), if that mount shows in this
// process's /proc/self/mountinfo: nvfs-resize finds the daemon's control
// socket by it (include/nvfs/control.hpp). ENOENT (one line) when no daemon
// serves it through a mount this process sees.
Result<dev_t> FindServingMount(const std::string& path);

// The namespace is the security boundary (doc/integrity.md, "The namespace
// is the boundary"): whoever can read its bytes can read every file in it,
// whatever the files' modes say, and whoever can write them can change any
// file. Returns one line for a warning when `path` can be read or written
// by every user (S_IROTH or S_IWOTH in stat(2) of it; of a device node, the
// node's own mode): what that exposes and the chmod that ends it, e.g.
//   "/dev/shm/x.img can be read by every user, who can then read every file
//    in it whatever its permissions; chmod o-rw /dev/shm/x.img"
// Empty when neither bit is set, or the path cannot be stat'ed (opening it
// says why). Group bits are never warned about: letting a group in is the
// administrator's choice, as `disk` is for block devices. Callers add their
// own "PROGRAM: warning: " and print it once (mkfs.nvfs, fsck.nvfs,
// nvfs-dump, the daemon).
std::string NamespaceExposure(const std::string& path);

}  // namespace nvfs
