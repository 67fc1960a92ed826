// The libpmem2 backend (OpenMedia, include/nvfs/media.hpp): the class,
// whose work is spread by job over pmem2_media.cpp (opening and mapping),
// pmem2_lock.cpp (the lock and the serving marks) and pmem2_grow.cpp
// (growing the mapping, backing it on the host); sigbus.cpp handles its
// faults.
#pragma once

#include <libpmem2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "media/sigbus.hpp"
#include "nvfs/media.hpp"

namespace nvfs {

// Owns the file descriptor (and with it the advisory lock) and the pmem2 objects.
class Pmem2Media final : public Media {
 public:
  ~Pmem2Media() override {
    if (base_ != nullptr) UnregisterMapping(base_);
    for (auto it = grown_maps_.rbegin(); it != grown_maps_.rend(); ++it) pmem2_map_delete(&*it);
    if (map_ != nullptr) pmem2_map_delete(&map_);
    if (reservation_ != nullptr) pmem2_vm_reservation_delete(&reservation_);
    if (source_ != nullptr) pmem2_source_delete(&source_);
    if (fd_ >= 0) close(fd_);
  }

  static Result<std::unique_ptr<Media>> Open(const std::string& path,
                                             const MediaOptions& options);

  void Store(uint64_t offset, const void* src, size_t len) override {
    CheckWrite(offset, len);
    std::memcpy(base_ + offset, src, len);
    CountStored(len);
  }
  void Store64(uint64_t offset, uint64_t value) override {
    CheckWrite(offset, 8);
    if (offset % 8 != 0) {
      std::fprintf(stderr, "nvfs: BUG: unaligned 8-byte store at %" PRIu64 "\n", offset);
      std::abort();
    }
    __atomic_store_n(reinterpret_cast<uint64_t*>(base_ + offset), value, __ATOMIC_RELAXED);
    CountStored(8);
  }
  bool CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) override {
    CheckWrite(offset, 8);
    if (offset % 8 != 0) {
      std::fprintf(stderr, "nvfs: BUG: unaligned 8-byte compare-and-swap at %" PRIu64 "\n", offset);
      std::abort();
    }
    CountStored(8);
    return __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(base_ + offset), expected,
                                       desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  }
  void Fill(uint64_t offset, int byte, size_t len) override {
    CheckWrite(offset, len);
    std::memset(base_ + offset, byte, len);
    CountStored(len);
  }
  void Flush(uint64_t offset, size_t len) override {
    CheckWrite(offset, len);
    if (len != 0) flush_(base_ + offset, len);
  }
  void Drain() override { drain_(); }
  void StoreFlush(uint64_t offset, const void* src, size_t len) override {
    CheckWrite(offset, len);
    memcpy_(base_ + offset, src, len, PMEM2_F_MEM_NODRAIN);
    CountStored(len);
  }

  Status Back(uint64_t offset, uint64_t len) override;
  Status Grow(uint64_t new_size) override;
  uint64_t reserved() const override { return reservation_ != nullptr ? reserved_ : size(); }
  uint64_t HostAvailable() const override;
  bool Backed(uint64_t offset, uint64_t len) const override {
    if (backed_whole_ || len == 0) return true;
    for (uint64_t c = offset / kBackChunk; c <= (offset + len - 1) / kBackChunk; ++c) {
      if (!ChunkBacked(c)) return false;
    }
    return true;
  }
  bool Intact() const override {
    if (LostPages() != 0) return false;
    struct stat st;
    if (!is_file_ || fstat(fd_, &st) != 0) return true;
    return static_cast<uint64_t>(st.st_size) >= size();
  }
  uint64_t LostPages() const override { return LostPagesOf(base_); }
  void EndService() override;
  void ServeThroughMount(const MountName& mount) override;
  uint64_t BackedBytes() const override {
    if (backed_whole_) return size();
    return std::min<uint64_t>(size(), backed_chunks_.load(std::memory_order_relaxed) * kBackChunk);
  }

 private:
  Pmem2Media() = default;
  // Marks the chunks wholly inside a data extent of the file (SEEK_DATA /
  // SEEK_HOLE) as backed; everything if the file has no hole.
  void ScanBacking(const struct stat& st);
  // Takes the lock (above Lock's definition). REQUIRES: fd_ and path_ set.
  Status Lock(bool shared, uint32_t wait_ms);
  bool serving_ = false;  // a mark is held (byte 0, or the mount mark after ServeThroughMount)
  off_t mount_mark_ = -1;  // the mount mark's offset once held (ServeThroughMount)
  // Fills bad_ranges_ from libpmem2's bad block list (none where it cannot
  // tell: no error, since a file on tmpfs has no such list).
  void ReadBadBlocks();
  bool ChunkBacked(uint64_t chunk) const {
    return (backed_[chunk / 64].load(std::memory_order_acquire) >> (chunk % 64)) & 1u;
  }
  void MarkBacked(uint64_t chunk) {
    backed_[chunk / 64].fetch_or(uint64_t{1} << (chunk % 64), std::memory_order_release);
    backed_chunks_.fetch_add(1, std::memory_order_relaxed);
  }

  // Backing (Back): a bit per kBackChunk of the namespace, set once the
  // chunk is allocated on the host; never cleared (nvfs never punches the
  // image). backed_whole_ is set at open and read-only after.
  bool is_file_ = false;
  bool backed_whole_ = true;
  std::unique_ptr<std::atomic<uint64_t>[]> backed_;  // set under back_mu_, read without it
  std::atomic<uint64_t> backed_chunks_{0};
  std::mutex back_mu_;  // serialises fallocate; a leaf lock

  int fd_ = -1;
  pmem2_source* source_ = nullptr;
  pmem2_map* map_ = nullptr;
  // MediaOptions::reserve: the address space the mapping may grow into, and
  // the maps Grow added after map_, in order (written by Grow only, which
  // one caller at a time runs; freed with the media).
  pmem2_vm_reservation* reservation_ = nullptr;
  uint64_t reserved_ = 0;
  size_t alignment_ = 0;
  std::vector<pmem2_map*> grown_maps_;
  pmem2_flush_fn flush_ = nullptr;
  pmem2_drain_fn drain_ = nullptr;
  pmem2_memcpy_fn memcpy_ = nullptr;
};

// A libpmem2 error as an Error: "PATH: WHAT: libpmem2's message", with
// the errno pmem2_ret stands for.
Error Pmem2Error(const std::string& path, const char* what, int pmem2_ret);

}  // namespace nvfs
