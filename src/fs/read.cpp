// The read paths: read, read_iter and map (direct reads' runs).
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
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "fs/extent_map.hpp"
#include "fs/fs_impl.hpp"
#include "fs/iovec.hpp"
#include "util/races.hpp"
#include "nvfs/epoch.hpp"

namespace nvfs {

using format::Inode;

namespace {

// Holes in the `map` path point here.
alignas(4096) const std::byte kZeros[1 << 20] = {};

// Every sink notes a copy from a page lost to a media error (MediaLost: the
// substitute's ones, never the file's bytes), asked after the copy; the
// read then fails with EIO (LostRead).
struct BufferSink {
  std::byte* const start;
  std::byte* out = start;
  bool lost = false;
  void Reset() {
    out = start;
    lost = false;
  }
  size_t Copy(const std::byte* src, size_t n) {
    std::memcpy(out, src, n);  // under the caller's RacingReads
    if (MediaLost(src, n)) [[unlikely]] lost = true;
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
  bool lost = false;
  void Reset() {
    iov = first;
    used = 0;
    lost = false;
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
    const size_t put =
        Put(n, [&](std::byte* dst, size_t at, size_t k) { std::memcpy(dst, src + at, k); });
    if (MediaLost(src, put)) [[unlikely]] lost = true;
    return put;
  }
  size_t Zero(size_t n) {
    return Put(n, [](std::byte* dst, size_t, size_t k) { std::memset(dst, 0, k); });
  }
};

struct RunSink {
  ReadRun* const runs;
  const size_t max_runs;
  size_t count = 0;
  bool lost = false;
  void Reset() {
    count = 0;
    lost = false;
  }
  size_t Copy(const std::byte* src, size_t n) {
    if (count == max_runs) return 0;
    if (MediaLost(src, n)) [[unlikely]] lost = true;
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
[[gnu::always_inline]] inline int64_t FsImpl::CopyOutBmap(const Inode& inode, uint64_t offset,
                                                          size_t len, Sink& sink, uint64_t* work) {
  const FsContext& ctx = *ctx_;
  const Bmap& bmap = *bmap_;
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
int64_t FsImpl::CopyOutMap(const ExtentMap& map, const Inode& inode, uint64_t offset, size_t len,
                           Sink& sink) {
  size_t done = 0;
  while (done < len) {
    const uint64_t pos = offset + done;
    if (pos >= map.covered()) {
      uint64_t work = 0;
      const int64_t tail = CopyOutBmap(inode, pos, len - done, sink, &work);
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
int64_t FsImpl::CopyOutStale(const Inode& inode, uint64_t offset, size_t len, Sink& sink,
                             uint64_t* work) {
  if (!S_ISREG(inode.mode)) return S_ISDIR(inode.mode) ? -EISDIR : -EINVAL;
  if (offset >= inode.size) return 0;
  return CopyOutBmap(inode, offset,
                     static_cast<size_t>(std::min<uint64_t>(len, inode.size - offset)), sink, work);
}

// Builds the file's extent map as of its current data_seq and publishes it,
// unless a writer got in the way or another reader published one as new.
// Takes no lock: the build is checked against data_seq like any read.
[[gnu::noinline]] void FsImpl::BuildExtents(CachedInode* ci) {
  ci->bmap_work.store(0, std::memory_order_relaxed);
  const uint64_t seq = ci->data_seq.load(std::memory_order_acquire);
  if (seq & 1) return;
  ExtentMap* map = ExtentMap::Build(*ctx_, *bmap_, *ci->media, seq, extent_map_runs_);
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
  extent_maps_built_.fetch_add(1, std::memory_order_relaxed);
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
[[gnu::noinline]] int64_t FsImpl::ReadSlow(CachedInode* ci, uint64_t offset, size_t len,
                                           Sink& sink) {
  uint64_t work = 0;
  const auto attempt = [&](uint64_t seq) __attribute__((always_inline)) -> int64_t {
    sink.Reset();
    const Inode& inode = *ci->media;
    if (const uint64_t word = AppendWordOf(inode); word != 0 && S_ISREG(inode.mode)) [[unlikely]] {
      // Appends by word (direct.cpp): the bytes up to its end are the
      // file's, in blocks it has past the size.
      const uint64_t size = SizeWithWord(inode, word, bmap_->max_size());
      if (offset >= size) return 0;
      return CopyOutBmap(inode, offset, static_cast<size_t>(std::min<uint64_t>(len, size - offset)),
                         sink, &work);
    }
    {
      [[maybe_unused]] const MapUseGuard<kCallerGuarded> guard;
      const ExtentMap* map = ci->extents.load(std::memory_order_acquire);
      if (map != nullptr && map->seq() == seq) {
        if (offset >= map->size()) return 0;
        return CopyOutMap(*map, inode, offset,
                          static_cast<size_t>(std::min<uint64_t>(len, map->size() - offset)), sink);
      }
    }
    return CopyOutStale(inode, offset, len, sink, &work);
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
  if (n == -EIO) [[unlikely]] (void)BadMap(ci->ino);
  if (work != 0) [[unlikely]] {
    const uint64_t total = ci->bmap_work.load(std::memory_order_relaxed) + work;
    ci->bmap_work.store(total, std::memory_order_relaxed);
    if (total >= LoadRacing(ci->media->blocks) + kBuildWork && n >= 0 && extent_map_runs_ != 0) {
      BuildExtents(ci);
    }
  }
  return n;
}

// The common case, kept apart so that it stays small (few registers live
// across the copy): a current extent map and a range inside one mapped run,
// copied in one piece and checked against the sequence counter. Anything
// else, a retry included, is ReadSlow, which starts over.
template <bool kCallerGuarded, class Sink>
[[gnu::always_inline]] inline int64_t FsImpl::ReadInto(CachedInode* ci, uint64_t offset, size_t len,
                                                       Sink& sink) {
  const uint64_t seq = ci->data_seq.load(std::memory_order_acquire);
  if (!(seq & 1)) [[likely]] {
    [[maybe_unused]] const MapUseGuard<kCallerGuarded> guard;
    [[maybe_unused]] const RacingReads racing;  // checked against seq below
    const ExtentMap* map = ci->extents.load(std::memory_order_acquire);
    if (map != nullptr && map->seq() == seq && offset < map->size() && offset < map->covered())
        [[likely]] {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(len, map->size() - offset));
      const ExtentMap::Run run = map->At(offset);
      // A read cut short by the size: unless an append word says more
      // (ReadSlow reads past the size up to the word's end).
      if (run.len >= want && run.addr != nullptr &&
          (want == len || AppendWordOf(*ci->media) == 0)) [[likely]] {
        const size_t put = sink.Copy(run.addr, want);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (ci->data_seq.load(std::memory_order_relaxed) == seq) [[likely]] {
          return static_cast<int64_t>(put);
        }
      }
    }
  }
  sink.Reset();
  return ReadSlow<kCallerGuarded>(ci, offset, len, sink);
}

static Result<size_t> ToResult(int64_t n) {
  if (n < 0) return Error(static_cast<int>(-n));
  return static_cast<size_t>(n);
}

// Says once per error (the first 16; then every 1024th) which request met
// a media error, on stderr (the daemon's log).
void ReportMediaError(const char* what, uint64_t ino) {
  const uint64_t n = MediaErrorCount();
  if (n <= 16 || n % 1024 == 0) {
    std::fprintf(stderr, "nvfs: media error (SIGBUS at namespace offset %" PRIu64 ", %" PRIu64
                 " so far): %s of inode %" PRIu64 " fails with EIO\n",
                 LastMediaErrorOffset(), n, what, ino);
  }
}

void FsImpl::ReportReadFault(FileHandle file) { ReportMediaError("read", file->inode->ino); }

// A read that copied bytes of a page lost to a media error (the sinks'
// `lost`): said as a media error, failed with EIO.
[[gnu::cold, gnu::noinline]] static Error LostRead(FileHandle file) {
  ReportMediaError("read of a page lost to a media error", file->inode->ino);
  return Error(EIO);
}

Result<size_t> FsImpl::Read(FileHandle file, uint64_t offset, void* buf, size_t len) {
  BufferSink sink{static_cast<std::byte*>(buf)};
  const int64_t n = ReadInto(file->inode, offset, len, sink);
  if (sink.lost) [[unlikely]] return LostRead(file);
  return ToResult(n);
}

// Out of line, so that ReadIter's one-segment case is a bare jump to Read.
[[gnu::noinline]] Result<size_t> FsImpl::ReadSegments(FileHandle file, uint64_t offset,
                                                      const iovec* iov, int iovcnt) {
  IovecSink sink{iov, iov + iovcnt};
  const int64_t n = ReadInto(file->inode, offset, IovecTotal(iov, iovcnt), sink);
  if (sink.lost) [[unlikely]] return LostRead(file);
  return ToResult(n);
}

Result<size_t> FsImpl::ReadIter(FileHandle file, uint64_t offset, const iovec* iov,
                                int iovcnt) {
  if (iovcnt == 1) return Read(file, offset, iov[0].iov_base, iov[0].iov_len);
  return ReadSegments(file, offset, iov, iovcnt);
}

Result<size_t> FsImpl::Map(FileHandle file, uint64_t offset, size_t len, ReadRun* runs,
                           size_t max_runs, size_t* run_count, const MapGuard& /*held*/) {
  RunSink sink{runs, max_runs};
  const int64_t n = ReadInto</*kCallerGuarded=*/true>(file->inode, offset, len, sink);
  if (sink.lost) [[unlikely]] {
    *run_count = 0;
    return LostRead(file);
  }
  *run_count = sink.count;
  return ToResult(n);
}

}  // namespace nvfs
