// The data path: the three read paths, write, fallocate and lseek.
//
// Reads take no lock: they copy under the inode's sequence counter and
// retry if a writer changed the file's mapping meanwhile (ReadInto), so a
// block freed and reused under the copy is never returned. They walk the
// file in physical runs, one copy per run, found in the file's extent map
// (a DRAM copy of the mapping tagged with the counter value it describes;
// extent_map.hpp) or, while there is no current one, in the bmap; reads
// that walked the bmap long enough build the map (doc/integrity.md,
// section 8). All three paths are one loop with a different sink; a
// one-segment iovec list is a plain buffer, so read_iter costs what read
// costs without a special case.
//
// Writes: data goes straight to the media with non-temporal stores
// (Media::StoreFlush); blocks that were holes are allocated, and filled aside
// (write before publish) before the transaction that links them, the new size
// and the times commits. Overwrites in place are not atomic (as on every POSIX
// filesystem); everything is durable when Write returns.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>

#include "fs/extent_map.hpp"
#include "fs/fs_impl.hpp"
#include "util/races.hpp"
#include "nvfs/epoch.hpp"

namespace nvfs {

using format::Inode;

namespace {

// Holes in the `map` path point here.
alignas(4096) const std::byte kZeros[1 << 20] = {};

struct BufferSink {
  std::byte* const start;
  std::byte* out = start;
  void Reset() { out = start; }
  size_t Copy(const std::byte* src, size_t n) {
    std::memcpy(out, src, n);  // under the caller's RacingReads
    out += n;
    return n;
  }
  size_t Zero(size_t n) {
    std::memset(out, 0, n);
    out += n;
    return n;
  }
};

// A scatter list of two or more segments.
struct IovecSink {
  const iovec* const first;
  const iovec* const end;
  const iovec* iov = first;
  size_t used = 0;  // bytes of *iov filled
  void Reset() {
    iov = first;
    used = 0;
  }

  template <class Fill>
  size_t Put(size_t n, Fill&& fill) {
    size_t done = 0;
    while (done < n && iov != end) {
      const size_t k = std::min(n - done, iov->iov_len - used);
      fill(static_cast<std::byte*>(iov->iov_base) + used, done, k);
      done += k;
      used += k;
      if (used == iov->iov_len) {
        ++iov;
        used = 0;
      }
    }
    return done;
  }
  size_t Copy(const std::byte* src, size_t n) {
    // Under the caller's RacingReads.
    return Put(n, [&](std::byte* dst, size_t at, size_t k) { std::memcpy(dst, src + at, k); });
  }
  size_t Zero(size_t n) {
    return Put(n, [](std::byte* dst, size_t, size_t k) { std::memset(dst, 0, k); });
  }
};

struct RunSink {
  ReadRun* const runs;
  const size_t max_runs;
  size_t count = 0;
  void Reset() { count = 0; }
  size_t Copy(const std::byte* src, size_t n) {
    if (count == max_runs) return 0;
    runs[count++] = {src, n};
    return n;
  }
  size_t Zero(size_t n) {
    size_t done = 0;
    while (done < n && count < max_runs) {
      const size_t k = std::min(n - done, sizeof kZeros);
      runs[count++] = {kZeros, k};
      done += k;
    }
    return done;
  }
};

size_t IovecTotal(const iovec* iov, int iovcnt) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  return total;
}

}  // namespace

// What a bmap lookup costs besides the pointers it compares (a descent from
// the inode to the leaf array), in the same unit: blocks.
constexpr uint64_t kLookupWork = 16;
// Reads build a file's extent map once the bmap work they did since the last
// build reaches what a build costs (about one unit per block the file holds)
// plus this: a build is paid for by at most as much work as it saves, so
// a file read once or written between every read costs at most twice its
// bmap walks, and a file read often walks the bmap about once per change.
constexpr uint64_t kBuildWork = 64;

// The copy loop behind all three read paths, through the bmap: one lookup
// and one copy per physical run. REQUIRES: [offset, offset + len) inside the
// file. Returns the bytes put into `sink`, or -EIO if the first block's
// pointer is corrupt; adds the lookups' work to *work.
template <class Sink>
[[gnu::always_inline]] inline int64_t CopyOutBmap(FsImpl& fs, const Inode& inode,
                                                  uint64_t offset, size_t len, Sink& sink,
                                                  uint64_t* work) {
  const FsContext& ctx = FsOps::Ctx(fs);
  const Bmap& bmap = FsOps::BmapOf(fs);
  const uint32_t shift = ctx.geometry.block_shift();
  const uint64_t mask = ctx.geometry.block_size() - 1;
  size_t done = 0;
  while (done < len) {
    const uint64_t pos = offset + done;
    const uint64_t in_block = pos & mask;
    const uint64_t blocks = (in_block + (len - done) + mask) >> shift;
    uint64_t run;
    const uint64_t phys = bmap.Lookup(inode, pos >> shift, blocks, &run);
    *work += kLookupWork + run;
    if (phys == Bmap::kCorrupt) return done != 0 ? static_cast<int64_t>(done) : -EIO;
    const size_t n = static_cast<size_t>(std::min<uint64_t>((run << shift) - in_block, len - done));
    const size_t put = phys != 0 ? sink.Copy(ctx.Block(phys) + in_block, n) : sink.Zero(n);
    done += put;
    if (put < n) break;
  }
  return static_cast<int64_t>(done);
}

// The same through the file's extent map: one step per run, whatever its
// length. Bytes past the map's coverage go through the bmap. REQUIRES:
// [offset, offset + len) inside the file as of the map.
template <class Sink>
static int64_t CopyOutMap(FsImpl& fs, const ExtentMap& map, const Inode& inode,
                          uint64_t offset, size_t len, Sink& sink) {
  size_t done = 0;
  while (done < len) {
    const uint64_t pos = offset + done;
    if (pos >= map.covered()) {
      uint64_t work = 0;
      const int64_t tail = CopyOutBmap(fs, inode, pos, len - done, sink, &work);
      if (tail < 0) return done != 0 ? static_cast<int64_t>(done) : tail;
      return static_cast<int64_t>(done) + tail;
    }
    const ExtentMap::Run run = map.At(pos);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(run.len, len - done));
    const size_t put = run.addr != nullptr ? sink.Copy(run.addr, n) : sink.Zero(n);
    done += put;
    if (put < n) break;
  }
  return static_cast<int64_t>(done);
}

// A read that found no current extent map: checks the file type and size on
// the media and walks the bmap, adding what that cost to *work.
template <class Sink>
static int64_t CopyOutStale(FsImpl& fs, const Inode& inode, uint64_t offset, size_t len,
                            Sink& sink, uint64_t* work) {
  if (!S_ISREG(inode.mode)) return S_ISDIR(inode.mode) ? -EISDIR : -EINVAL;
  if (offset >= inode.size) return 0;
  return CopyOutBmap(fs, inode, offset,
                     static_cast<size_t>(std::min<uint64_t>(len, inode.size - offset)), sink, work);
}

// Builds the file's extent map as of its current data_seq and publishes it,
// unless a writer got in the way or another reader published one as new.
// Takes no lock: the build is checked against data_seq like any read.
[[gnu::noinline]] static void BuildExtents(FsImpl& fs, CachedInode* ci) {
  ci->bmap_work.store(0, std::memory_order_relaxed);
  const uint64_t seq = ci->data_seq.load(std::memory_order_acquire);
  if (seq & 1) return;
  ExtentMap* map = ExtentMap::Build(FsOps::Ctx(fs), FsOps::BmapOf(fs), *ci->media, seq,
                                    FsOps::ExtentMapRuns(fs));
  if (map == nullptr) return;
  std::atomic_thread_fence(std::memory_order_acquire);
  ExtentMap* old = ci->extents.load(std::memory_order_acquire);
  do {
    if (ci->data_seq.load(std::memory_order_relaxed) != seq ||
        (old != nullptr && old->seq() >= seq)) {
      ExtentMap::Destroy(map);  // never published
      return;
    }
  } while (!ci->extents.compare_exchange_weak(old, map, std::memory_order_acq_rel,
                                              std::memory_order_acquire));
  FsOps::CountExtentMap(fs);
  if (old != nullptr) epoch::Retire(old, ExtentMap::DestroyErased);
}

// An epoch guard around the use of an extent map, unless the caller holds
// one already (Map: the MapGuard covers the whole read, so nesting one
// would only cost instructions).
template <bool kCallerGuarded>
struct MapUseGuard {
  epoch::Guard guard;
};
template <>
struct MapUseGuard<true> {};

// What the three read paths share (behind ReadInto's fast case): `len`
// bytes at `offset`, clipped to the file, copied into `sink` under the data
// path's sequence lock: retried (the sink reset) if a writer changed the
// mapping meanwhile, and after a few retries done under the shared lock
// instead, so readers cannot starve.
// A current extent map (one built at this data_seq) is used; else the bmap,
// and the work that cost counts towards building the map. Returns the bytes
// read or a negative errno: a Result is made once, by the caller (its
// variant, moved through the retry loop, cost more instructions than the
// lookup).
template <bool kCallerGuarded, class Sink>
[[gnu::noinline]] static int64_t ReadSlow(FsImpl& fs, CachedInode* ci, uint64_t offset,
                                          size_t len, Sink& sink) {
  uint64_t work = 0;
  const auto attempt = [&](uint64_t seq) __attribute__((always_inline)) -> int64_t {
    sink.Reset();
    const Inode& inode = *ci->media;
    {
      [[maybe_unused]] const MapUseGuard<kCallerGuarded> guard;
      const ExtentMap* map = ci->extents.load(std::memory_order_acquire);
      if (map != nullptr && map->seq() == seq) {
        if (offset >= map->size()) return 0;
        return CopyOutMap(fs, *map, inode, offset,
                          static_cast<size_t>(std::min<uint64_t>(len, map->size() - offset)), sink);
      }
    }
    return CopyOutStale(fs, inode, offset, len, sink, &work);
  };
  int64_t n;
  for (int tries = 0;; ++tries) {
    if (tries == 4) {
      // No guard while waiting for the lock: a writer holding it may be
      // waiting for a grace period (an allocation that needs freed blocks).
      // Re-entered under the lock, before anything is read.
      std::shared_lock lock(ci->lock, std::defer_lock);
      {
        const epoch::Suspend unguarded;
        lock.lock();
      }
      // Its own recovery point: a media error must not jump past the lock.
      const uint32_t depth = epoch::GuardDepth();
      if (!RunFaultGuarded([&] { n = attempt(ci->data_seq.load(std::memory_order_acquire)); })) {
        epoch::AbandonGuardsTo(depth);
        n = -EIO;
      }
      break;
    }
    const uint64_t seq = ci->data_seq.load(std::memory_order_acquire);
    if (seq & 1) continue;
    {
      [[maybe_unused]] const RacingReads racing;  // checked against seq below
      n = attempt(seq);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (ci->data_seq.load(std::memory_order_relaxed) == seq) break;
  }
  // A damaged pointer confirmed by the sequence check (not a torn read).
  if (n == -EIO) [[unlikely]] (void)FsOps::BadMap(fs, ci->ino);
  if (work != 0) [[unlikely]] {
    const uint64_t total = ci->bmap_work.load(std::memory_order_relaxed) + work;
    ci->bmap_work.store(total, std::memory_order_relaxed);
    if (total >= LoadRacing(ci->media->blocks) + kBuildWork && n >= 0 &&
        FsOps::ExtentMapRuns(fs) != 0) {
      BuildExtents(fs, ci);
    }
  }
  return n;
}

// The common case, kept apart so that it stays small (few registers live
// across the copy): a current extent map and a range inside one mapped run,
// copied in one piece and checked against the sequence counter. Anything
// else, a retry included, is ReadSlow, which starts over.
template <bool kCallerGuarded = false, class Sink>
[[gnu::always_inline]] inline int64_t ReadInto(FsImpl& fs, CachedInode* ci, uint64_t offset,
                                               size_t len, Sink& sink) {
  const uint64_t seq = ci->data_seq.load(std::memory_order_acquire);
  if (!(seq & 1)) [[likely]] {
    [[maybe_unused]] const MapUseGuard<kCallerGuarded> guard;
    [[maybe_unused]] const RacingReads racing;  // checked against seq below
    const ExtentMap* map = ci->extents.load(std::memory_order_acquire);
    if (map != nullptr && map->seq() == seq && offset < map->size() && offset < map->covered())
        [[likely]] {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(len, map->size() - offset));
      const ExtentMap::Run run = map->At(offset);
      if (run.len >= want && run.addr != nullptr) [[likely]] {
        const size_t put = sink.Copy(run.addr, want);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (ci->data_seq.load(std::memory_order_relaxed) == seq) [[likely]] {
          return static_cast<int64_t>(put);
        }
      }
    }
  }
  sink.Reset();
  return ReadSlow<kCallerGuarded>(fs, ci, offset, len, sink);
}

static Result<size_t> ToResult(int64_t n) {
  if (n < 0) return Error(static_cast<int>(-n));
  return static_cast<size_t>(n);
}

// Says once per error (the first 16; then every 1024th) which request met
// a media error, on stderr (the daemon's log).
void FsOps::ReportMediaError(const char* what, uint64_t ino) {
  const uint64_t n = MediaErrorCount();
  if (n <= 16 || n % 1024 == 0) {
    std::fprintf(stderr, "nvfs: media error (SIGBUS at namespace offset %" PRIu64 ", %" PRIu64
                 " so far): %s of inode %" PRIu64 " fails with EIO\n",
                 LastMediaErrorOffset(), n, what, ino);
  }
}

void FsImpl::ReportReadFault(FileHandle file) { FsOps::ReportMediaError("read", file->inode->ino); }

Result<size_t> FsImpl::Read(FileHandle file, uint64_t offset, void* buf, size_t len) {
  BufferSink sink{static_cast<std::byte*>(buf)};
  return ToResult(ReadInto(*this, file->inode, offset, len, sink));
}

// Out of line, so that ReadIter's one-segment case is a bare jump to Read.
[[gnu::noinline]] static Result<size_t> ReadSegments(FsImpl& fs, FileHandle file,
                                                     uint64_t offset, const iovec* iov,
                                                     int iovcnt) {
  IovecSink sink{iov, iov + iovcnt};
  return ToResult(ReadInto(fs, file->inode, offset, IovecTotal(iov, iovcnt), sink));
}

Result<size_t> FsImpl::ReadIter(FileHandle file, uint64_t offset, const iovec* iov,
                                    int iovcnt) {
  if (iovcnt == 1) return Read(file, offset, iov[0].iov_base, iov[0].iov_len);
  return ReadSegments(*this, file, offset, iov, iovcnt);
}

Result<size_t> FsImpl::Map(FileHandle file, uint64_t offset, size_t len, ReadRun* runs,
                               size_t max_runs, size_t* run_count, const MapGuard& /*held*/) {
  RunSink sink{runs, max_runs};
  const int64_t n = ReadInto</*kCallerGuarded=*/true>(*this, file->inode, offset, len, sink);
  *run_count = sink.count;
  return ToResult(n);
}

namespace {

// Where Write takes its bytes from.
struct Source {
  const iovec* iov;
  const iovec* end;
  size_t used = 0;

  // Stores the next n bytes at `offset` on the media, flushed, not drained.
  void StoreTo(Media& media, uint64_t offset, size_t n) {
    while (n > 0 && iov != end) {
      const size_t k = std::min(n, iov->iov_len - used);
      media.StoreFlush(offset, static_cast<const std::byte*>(iov->iov_base) + used, k);
      offset += k;
      n -= k;
      used += k;
      if (used == iov->iov_len) {
        ++iov;
        used = 0;
      }
    }
  }
};

}  // namespace

static Result<size_t> WriteCore(FsImpl& fs, FileHandle file, uint64_t offset, Source& src,
                                size_t len, unsigned io_flags) {
  if (fs.read_only()) return Error(EROFS);
  if ((file->flags & O_ACCMODE) == O_RDONLY) return Error(EBADF);
  CachedInode* ci = file->inode;
  std::unique_lock lock(ci->lock);
  // Lock-free readers (ReadInto) must retry only if this write changes the
  // file's mapping or size; an overwrite in place does neither, and a reader
  // racing with it may see some of its bytes, as on any filesystem. Begun at
  // the first such change, and declared before the Tx so that an abort's
  // undo happens under it too.
  std::optional<MappingChange> change;
  const auto changing = [&] {
    if (!change) change.emplace(ci);
  };
  const Inode& inode = *ci->media;
  if (S_ISDIR(inode.mode)) return Error(EISDIR);
  if (!S_ISREG(inode.mode)) return Error(EINVAL);
  if ((file->flags & O_APPEND) && !(io_flags & kAtOffset)) offset = inode.size;
  // chattr's attributes, also through handles opened before they were set.
  if (FsOps::Immutable(inode)) return Error(EPERM);
  if (FsOps::AppendOnly(inode) && offset != inode.size) return Error(EPERM);
  const Geometry& g = FsOps::Geo(fs);
  const uint32_t shift = g.block_shift();
  const uint64_t mask = g.block_size() - 1;
  // A byte may land at max_size() - 1 at most: the size stays a
  // non-negative off_t (2^63 - 1 bytes, not the 2^63 of max_blocks() blocks).
  const uint64_t max_bytes = FsOps::BmapOf(fs).max_size();
  if (len == 0) return size_t{0};
  if (offset >= max_bytes) return Error(EFBIG);
  len = static_cast<size_t>(std::min<uint64_t>(len, max_bytes - offset));
  // Before any byte lands: an overwrite in place is visible at once.
  NVFS_TRY(FsOps::KillPrivsFirst(fs, ci->ino, inode, io_flags & kKillSuidgid));

  Media& media = fs.media();
  Bmap& bmap = FsOps::BmapOf(fs);
  std::unique_lock orphans(FsOps::OrphanMu(fs), std::defer_lock);  // before the Tx (fs_impl.hpp)
  std::optional<Tx> tx;
  tx.emplace(FsOps::Jnl(fs), "write");
  // The new size, once data up to `end` is on the media.
  const auto grow_to = [&](uint64_t end) {
    if (end <= inode.size) return;
    changing();
    tx->Set(inode.size, end);
  };
  const timespec now = FsOps::Now();
  // Past the end: the bytes between the old end and the write, inside the old
  // last block, must read as zeros.
  if (offset > inode.size) changing();
  NVFS_TRY(FsOps::Resize(fs, ci->ino, std::max<uint64_t>(inode.size, offset), &*tx, orphans));

  size_t done = 0;
  Error failure;
  bool failed = false;
  while (done < len) {
    const uint64_t pos = offset + done;
    const uint64_t index = pos >> shift;
    const uint64_t in_block = pos & mask;
    const size_t remaining = len - done;
    const uint64_t blocks = (in_block + remaining + mask) >> shift;
    uint64_t run;
    uint64_t phys = bmap.Lookup(inode, index, blocks, &run);
    if (phys == Bmap::kCorrupt) {
      failure = FsOps::BadMap(fs, ci->ino);
      failed = true;
      break;
    }
    if (phys == 0) {
      // A hole: allocate. Blocks only partly written are zero-filled first.
      const uint64_t full = (in_block == 0) ? (remaining >> shift) : 0;
      const uint64_t want = full == 0 ? 1 : std::min(run, full);
      changing();
      Result<Extent> mapped = bmap.MapForWrite(*tx, inode, index, want, full == 0);
      if (!mapped.ok()) {
        failure = mapped.take_error();
        failed = true;
        break;
      }
      phys = mapped->first;
      run = mapped->count;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>((run << shift) - in_block, remaining));
    // A media error in the data blocks (SIGBUS on the store) fails this
    // run with EIO; the bytes before it are written as on any short write.
    // Safe to abandon: StoreTo takes no lock and owns nothing; the inode
    // lock and the Tx are ours, out here, and end through normal returns.
    if (!RunFaultGuarded([&] { src.StoreTo(media, g.BlockOffset(phys) + in_block, n); })) {
      FsOps::ReportMediaError("write", ci->ino);
      failure = Error(EIO);
      failed = true;
      break;
    }
    done += n;
    if (tx->room() < 8192 && done < len) {
      // Long writes commit as they go: write() is not atomic, only durable.
      grow_to(offset + done);
      NVFS_TRY(tx->Commit());
      tx.emplace(FsOps::Jnl(fs), "write");
    }
  }
  if (done == 0 && failed) return failure;  // the Tx aborts: nothing happened
  grow_to(offset + done);
  FsOps::Touch(*tx, inode, true, true, now);
  NVFS_TRY(tx->Commit());
  return done;
}

Result<size_t> FsImpl::Write(FileHandle file, uint64_t offset, const void* buf, size_t len,
                                 unsigned io_flags) {
  iovec iov{const_cast<void*>(buf), len};
  Source src{&iov, &iov + 1};
  return WriteCore(*this, file, offset, src, len, io_flags);
}

Result<size_t> FsImpl::WriteIter(FileHandle file, uint64_t offset, const iovec* iov,
                                     int iovcnt, unsigned io_flags) {
  Source src{iov, iov + iovcnt};
  return WriteCore(*this, file, offset, src, IovecTotal(iov, iovcnt), io_flags);
}

Status FsImpl::Fsync(FileHandle file) {
  (void)file;  // every operation was durable when it returned
  return Status::Ok();
}

// Zeroes the bytes of [from, to) that lie in mapped blocks, in place, as a
// write of zeros would: flushed now, drained by the caller's commit; durable,
// not atomic. Holes already read as zeros. REQUIRES: inode lock held
// exclusively (and a MappingChange, so lock-free readers retry).
static Status ZeroMapped(FsImpl& fs, uint64_t ino, const Inode& inode, uint64_t from,
                         uint64_t to) {
  const Geometry& g = FsOps::Geo(fs);
  const uint32_t shift = g.block_shift();
  const uint64_t mask = g.block_size() - 1;
  Media& media = fs.media();
  while (from < to) {
    const uint64_t in_block = from & mask;
    uint64_t run;
    const uint64_t phys =
        FsOps::BmapOf(fs).Lookup(inode, from >> shift, (in_block + (to - from) + mask) >> shift, &run);
    if (phys == Bmap::kCorrupt) {
      return FsOps::Ctx(fs).Damaged(
          MakeError(EIO, "a block pointer names no data block; run fsck.nvfs"));
    }
    const uint64_t n = std::min((run << shift) - in_block, to - from);
    // File data: a media error fails the request (a recovery point, as a
    // write's copy), so a lost data page is never replaced by the handler
    // and keeps failing every read of it.
    if (phys != 0 && !RunFaultGuarded([&] {
          media.Fill(g.BlockOffset(phys) + in_block, 0, n);
          media.Flush(g.BlockOffset(phys) + in_block, n);
        })) {
      FsOps::ReportMediaError("zeroing", ino);
      return Error(EIO);
    }
    from += n;
  }
  return Status::Ok();
}

Status FsImpl::Fallocate(FileHandle file, int mode, uint64_t offset, uint64_t len,
                             unsigned io_flags) {
  if (read_only_) return Error(EROFS);
  if ((file->flags & O_ACCMODE) == O_RDONLY) return Error(EBADF);
  if (len == 0) return Error(EINVAL);
  const bool punch = mode & FALLOC_FL_PUNCH_HOLE;
  const bool zero_range = mode & FALLOC_FL_ZERO_RANGE;
  if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
    return Error(EOPNOTSUPP);
  }
  if (punch && !(mode & FALLOC_FL_KEEP_SIZE)) return Error(EOPNOTSUPP);
  if (punch && zero_range) return Error(EOPNOTSUPP);  // as vfs_fallocate
  CachedInode* ci = file->inode;
  std::unique_lock lock(ci->lock);
  const MappingChange change(ci);
  const Inode& inode = *ci->media;
  if (S_ISDIR(inode.mode)) return Error(EISDIR);
  if (!S_ISREG(inode.mode)) return Error(ENODEV);
  // chattr's attributes (vfs_fallocate): nothing on an immutable file; on
  // an append-only one only allocation that keeps the bytes.
  if (FsOps::Immutable(inode)) return Error(EPERM);
  if (FsOps::AppendOnly(inode) && (mode & ~FALLOC_FL_KEEP_SIZE)) return Error(EPERM);
  const Geometry& g = *geometry_;
  const uint32_t shift = g.block_shift();
  const uint64_t bs = g.block_size();
  const uint64_t max_bytes = bmap_->max_size();
  if (offset >= max_bytes || len > max_bytes - offset) return Error(EFBIG);
  const uint64_t end = offset + len;
  // Before anything changes (zero range stores zeros in place).
  NVFS_TRY(FsOps::KillPrivsFirst(*this, ci->ino, inode, io_flags & kKillSuidgid));
  const timespec now = FsOps::Now();

  if (punch) {
    const uint64_t size = inode.size;
    const uint64_t zero_end = std::min(end, size);
    if (offset >= zero_end) return Status::Ok();
    const uint64_t first_full = (offset + bs - 1) >> shift;
    const uint64_t end_full = zero_end == size ? (zero_end + bs - 1) >> shift : zero_end >> shift;
    std::optional<Tx> tx;
    tx.emplace(*journal_, "punch");
    // Partial blocks at the edges: zeroed in place (ZeroMapped). Logging them
    // cost a record as large as the range, which with large blocks does not
    // fit a journal slot, so such a punch failed with ENOSPC.
    if (first_full >= end_full) {
      NVFS_TRY(ZeroMapped(*this, ci->ino, inode, offset, zero_end));
    } else {
      NVFS_TRY(ZeroMapped(*this, ci->ino, inode, offset, first_full << shift));
      if ((end_full << shift) < zero_end) {
        NVFS_TRY(ZeroMapped(*this, ci->ino, inode, end_full << shift, zero_end));
      }
      for (;;) {
        Result<bool> done = bmap_->Punch(*tx, inode, first_full, end_full - first_full);
        if (!done.ok()) return done.take_error();
        if (*done) break;
        NVFS_TRY(tx->Commit());
        tx.emplace(*journal_, "punch");
      }
    }
    FsOps::Touch(*tx, inode, true, true, now);
    return tx->Commit();
  }

  // Allocation: every hole in the range gets zeroed blocks. Blocks wholly
  // past the end that the size change below exposes are zeroed by Resize,
  // which zeroes every mapped byte it exposes; zeroing them here too would
  // write them twice.
  const bool extend = !(mode & FALLOC_FL_KEEP_SIZE) && end > inode.size;
  std::unique_lock orphans(orphan_mu_, std::defer_lock);  // before the Tx (fs_impl.hpp)
  std::optional<Tx> tx;
  tx.emplace(*journal_, zero_range ? "zero range" : "fallocate");
  // ZERO_RANGE: first the mapped bytes of the range inside the file are
  // zeroed in place (ZeroMapped; drained by the commit below); mapped bytes
  // past the end need nothing, as above.
  if (zero_range) NVFS_TRY(ZeroMapped(*this, ci->ino, inode, offset, std::min(end, inode.size)));
  uint64_t index = offset >> shift;
  const uint64_t end_index = (end + bs - 1) >> shift;
  while (index < end_index) {
    uint64_t run;
    const uint64_t phys = bmap_->Lookup(inode, index, end_index - index, &run);
    if (phys == Bmap::kCorrupt) return FsOps::BadMap(*this, ci->ino);
    if (phys == 0) {
      const bool zero = !extend || (index << shift) < inode.size;
      Result<Extent> mapped = bmap_->MapForWrite(*tx, inode, index, run, zero);
      if (!mapped.ok()) return mapped.take_error();  // aborts this transaction's part
      run = mapped->count;
    }
    index += run;
    if (tx->room() < 8192 && index < end_index) {
      NVFS_TRY(tx->Commit());
      tx.emplace(*journal_, "fallocate");
    }
  }
  if (extend) NVFS_TRY(FsOps::Resize(*this, ci->ino, end, &*tx, orphans));
  FsOps::Touch(*tx, inode, false, true, now);
  return tx->Commit();
}

Result<uint64_t> FsImpl::Lseek(FileHandle file, uint64_t offset, int whence) {
  CachedInode* ci = file->inode;
  std::shared_lock lock(ci->lock);
  const Inode& inode = *ci->media;
  const uint64_t size = inode.size;
  switch (whence) {
    case SEEK_SET: return offset;
    case SEEK_END: return size + offset;
    case SEEK_DATA:
    case SEEK_HOLE: break;
    default: return Error(EINVAL);
  }
  if (offset >= size) return Error(ENXIO);
  if (!S_ISREG(inode.mode)) return whence == SEEK_DATA ? offset : size;
  const uint32_t shift = geometry_->block_shift();
  const uint64_t limit = (size + geometry_->block_size() - 1) >> shift;
  const uint64_t index = offset >> shift;
  if (whence == SEEK_DATA) {
    const uint64_t found = bmap_->NextMapped(inode, index, limit);
    if (found >= limit) return Error(ENXIO);
    return std::max(offset, found << shift);
  }
  const uint64_t found = bmap_->NextHole(inode, index, limit);
  return std::max(offset, std::min(size, found << shift));
}

}  // namespace nvfs
