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

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "nvfs/result.hpp"

namespace nvfs {

enum class Granularity {
  kByte,       // eADR: stores are durable once visible; flushes are no-ops
  kCacheLine,  // ADR: cache lines must be flushed (clwb/clflushopt) and fenced
  kPage,       // not DAX: pages are flushed with msync
};

const char* GranularityName(Granularity g);

struct MediaOptions {
  bool read_only = false;
  // Take an advisory lock on the namespace: exclusive for writers, shared for
  // readers, so a mounted nvfs, mkfs and fsck never run on one namespace at once.
  bool lock = true;
  // Refuse namespaces smaller than this many bytes (the message names it).
  uint64_t min_size = 0;
  // Regular files only: create the file if it is missing and extend it to this
  // size if it is shorter (never shrinks). Requires !read_only.
  uint64_t grow_to = 0;
};

class Media {
 public:
  virtual ~Media() = default;
  Media(const Media&) = delete;
  Media& operator=(const Media&) = delete;

  const std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
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

  // Marks where one filesystem operation begins and ends; the recording backend
  // uses them to check and enumerate crash states per operation.
  virtual void BeginOp(const char* /*name*/) {}
  virtual void EndOp() {}

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
  void CountStored(size_t len) { bytes_stored_.fetch_add(len, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> bytes_stored_{0};
};

// Opens and maps the namespace at `path`: a DAX character device or a regular
// file (on a DAX filesystem or not). Errors carry one line naming the path:
// ENOENT missing, EACCES no permission, ENODEV neither a regular file nor a
// DAX device, EBUSY in use, ENOSPC too small (with the minimum), and what
// libpmem2 says when it cannot map.
Result<std::unique_ptr<Media>> OpenMedia(const std::string& path, const MediaOptions& options);

}  // namespace nvfs
