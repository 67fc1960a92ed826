// The libpmem2 backend's size and backing: which chunks of an image the
// host has allocated (ScanBacking, Back, HostAvailable) and growing the
// mapping into its reservation while open (Grow).
#include <fcntl.h>
#include <libpmem2.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <linux/falloc.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <mutex>

#include "media/pmem2_media.hpp"

namespace nvfs {

void Pmem2Media::ScanBacking(const struct stat& st) {
  backed_whole_ = !S_ISREG(st.st_mode) ||  // a DAX device has no holes
                  static_cast<uint64_t>(st.st_blocks) * 512 >= size_;
  // A file that may grow keeps the map of its chunks from the start: what a
  // grow adds is a hole until backed.
  const bool may_grow = S_ISREG(st.st_mode) && reservation_ != nullptr;
  if (backed_whole_ && !may_grow) return;
  const uint64_t chunks = (size_ + kBackChunk - 1) / kBackChunk;
  const uint64_t capacity = (std::max<uint64_t>(size_, reserved_) + kBackChunk - 1) / kBackChunk;
  backed_.reset(new std::atomic<uint64_t>[(capacity + 63) / 64]());
  if (backed_whole_) {
    for (uint64_t c = 0; c < chunks; ++c) MarkBacked(c);
    backed_whole_ = false;
    return;
  }
  off_t at = 0;
  while (static_cast<uint64_t>(at) < size_) {
    const off_t data = lseek(fd_, at, SEEK_DATA);
    if (data < 0) break;  // ENXIO: no data past `at`; anything else: assume holes
    off_t hole = lseek(fd_, data, SEEK_HOLE);
    if (hole < 0 || static_cast<uint64_t>(hole) > size_) hole = static_cast<off_t>(size_);
    for (uint64_t c = (static_cast<uint64_t>(data) + kBackChunk - 1) / kBackChunk;
         c < chunks && std::min((c + 1) * kBackChunk, size_) <= static_cast<uint64_t>(hole);
         ++c) {
      MarkBacked(c);
    }
    at = hole;
  }
}

// Order: the file is extended, the new part mapped into the reservation
// right after the mapping (one more pmem2 map: the same source, the same
// flush functions, which take addresses), the SIGBUS handler told, and size
// moved last, with release, so no one is handed an offset in the new part
// before it is mapped.
Status Pmem2Media::Grow(uint64_t new_size) {
  const uint64_t old_size = size();
  new_size = new_size / alignment_ * alignment_;
  if (new_size <= old_size) return Status::Ok();
  if (read_only_) return MakeError(EROFS, "%s: read-only", path_.c_str());
  if (reservation_ == nullptr || new_size > reserved_) {
    return MakeError(ENOSPC, "%s: cannot grow to %" PRIu64 " bytes while mounted: the mount "
                     "reserved address space for %" PRIu64 " (remount, or grow it unmounted)",
                     path_.c_str(), new_size, reservation_ != nullptr ? reserved_ : old_size);
  }
  struct stat st;
  if (fstat(fd_, &st) != 0) return MakeError(errno, "%s: %s", path_.c_str(), std::strerror(errno));
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < new_size &&
      ftruncate(fd_, static_cast<off_t>(new_size)) != 0) {
    return MakeError(errno, "%s: cannot extend to %" PRIu64 " bytes: %s", path_.c_str(), new_size,
                     std::strerror(errno));
  }
  pmem2_config* config = nullptr;
  int ret = pmem2_config_new(&config);
  if (ret != 0) return Pmem2Error(path_, "cannot map", ret);
  std::unique_ptr<pmem2_config, int (*)(pmem2_config*)> config_owner(
      config, [](pmem2_config* c) { return pmem2_config_delete(&c); });
  ret = pmem2_config_set_required_store_granularity(config, PMEM2_GRANULARITY_PAGE);
  if (ret == 0) ret = pmem2_config_set_offset(config, old_size);
  if (ret == 0) ret = pmem2_config_set_length(config, new_size - old_size);
  if (ret == 0) ret = pmem2_config_set_protection(config, PMEM2_PROT_READ | PMEM2_PROT_WRITE);
  if (ret == 0) ret = pmem2_config_set_vm_reservation(config, reservation_, old_size);
  if (ret != 0) return Pmem2Error(path_, "cannot map the grown part", ret);
  pmem2_map* map = nullptr;
  ret = pmem2_map_new(&map, config, source_);
  if (ret != 0) return Pmem2Error(path_, "cannot map the grown part", ret);
  if (static_cast<const std::byte*>(pmem2_map_get_address(map)) != base_ + old_size ||
      pmem2_map_get_store_granularity(map) != pmem2_map_get_store_granularity(map_)) {
    pmem2_map_delete(&map);
    return MakeError(EINVAL, "%s: the grown part maps elsewhere or with another store granularity",
                     path_.c_str());
  }
  grown_maps_.push_back(map);
  ResizeMapping(base_, new_size);
  __atomic_store_n(&size_, new_size, __ATOMIC_RELEASE);
  return Status::Ok();
}

// Backs whole chunks (KEEP_SIZE: a file cut short under the mount stays cut,
// its lost pages keep failing as media errors rather than reading as zeros).
// A chunk the host cannot back whole is backed just where asked, so the last
// free pages of the host stay usable.
Status Pmem2Media::Back(uint64_t offset, uint64_t len) {
  if (backed_whole_ || len == 0) return Status::Ok();
  const uint64_t size = this->size();  // a grow may move it meanwhile
  if (offset > size || len > size - offset) return MakeError(EINVAL, "backing outside the namespace");
  const uint64_t first = offset / kBackChunk, last = (offset + len - 1) / kBackChunk;
  for (uint64_t c = first; c <= last; ++c) {
    if (ChunkBacked(c)) continue;
    std::lock_guard lock(back_mu_);
    if (ChunkBacked(c)) continue;
    const uint64_t start = c * kBackChunk;
    const uint64_t n = std::min(kBackChunk, size - start);
    if (fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(start), static_cast<off_t>(n)) == 0) {
      MarkBacked(c);
      continue;
    }
    if (errno == EOPNOTSUPP) {
      // The host cannot reserve space (no fallocate): nothing better to do
      // than to store and hope, as before.
      MarkBacked(c);
      continue;
    }
    const int chunk_errno = errno;
    const uint64_t from = std::max(offset, start) / 4096 * 4096;
    const uint64_t to = std::min(offset + len, start + n);
    if ((chunk_errno == ENOSPC || chunk_errno == EDQUOT) &&
        fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                  static_cast<off_t>(to - from)) == 0) {
      continue;  // backed where asked; the chunk stays unmarked
    }
    return MakeError(chunk_errno == EDQUOT ? EDQUOT : ENOSPC,
                     "%s: the host filesystem cannot back %" PRIu64 " bytes at %" PRIu64 ": %s",
                     path_.c_str(), to - from, from, std::strerror(chunk_errno));
  }
  return Status::Ok();
}

uint64_t Pmem2Media::HostAvailable() const {
  if (backed_whole_) return kBackedWhole;
  struct statvfs sv;
  if (fstatvfs(fd_, &sv) != 0) return kBackedWhole;
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

}  // namespace nvfs
