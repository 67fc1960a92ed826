// The libpmem2 backend: the real mapping of a namespace.
#include <fcntl.h>
#include <libpmem2.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "nvfs/media.hpp"

namespace nvfs {

const char* GranularityName(Granularity g) {
  switch (g) {
    case Granularity::kByte: return "byte";
    case Granularity::kCacheLine: return "cache line";
    case Granularity::kPage: return "page";
  }
  return "?";
}

void Media::CheckWrite(uint64_t offset, size_t len) const {
  if (read_only_ || offset > size_ || len > size_ - offset) {
    std::fprintf(stderr,
                 "nvfs: BUG: media write of %zu bytes at offset %" PRIu64
                 " outside a %s namespace of %" PRIu64 " bytes\n",
                 len, offset, read_only_ ? "read-only" : "writable", size_);
    std::abort();
  }
}

namespace {

// Owns the file descriptor (and with it the advisory lock) and the pmem2 objects.
class Pmem2Media final : public Media {
 public:
  ~Pmem2Media() override {
    if (map_ != nullptr) pmem2_map_delete(&map_);
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

 private:
  Pmem2Media() = default;

  int fd_ = -1;
  pmem2_source* source_ = nullptr;
  pmem2_map* map_ = nullptr;
  pmem2_flush_fn flush_ = nullptr;
  pmem2_drain_fn drain_ = nullptr;
  pmem2_memcpy_fn memcpy_ = nullptr;
};

// libpmem2 returns -errno, or one of its own PMEM2_E_* codes. Debian's build
// does not export pmem2_err_to_errno, so the few codes we meet are mapped here.
int Pmem2ErrorToErrno(int ret) {
  if (ret < 0 && ret > PMEM2_E_UNKNOWN) return -ret;
  switch (ret) {
    case PMEM2_E_NOSUPP:
    case PMEM2_E_GRANULARITY_NOT_SUPPORTED:
    case PMEM2_E_SOURCE_TYPE_NOT_SUPPORTED: return ENOTSUP;
    case PMEM2_E_INVALID_FILE_TYPE: return ENODEV;
    case PMEM2_E_NO_ACCESS: return EACCES;
    case PMEM2_E_SOURCE_EMPTY: return ENOSPC;
    case PMEM2_E_IO_FAIL: return EIO;
    default: return EINVAL;
  }
}

Error Pmem2Error(const std::string& path, const char* what, int pmem2_ret) {
  const int code = Pmem2ErrorToErrno(pmem2_ret);
  return MakeError(code, "%s: %s: %s", path.c_str(), what, pmem2_errormsg());
}

Result<std::unique_ptr<Media>> Pmem2Media::Open(const std::string& path,
                                                const MediaOptions& options) {
  const char* p = path.c_str();
  struct stat st;
  const bool may_create = options.grow_to != 0 && !options.read_only;
  if (stat(p, &st) != 0) {
    if (!(errno == ENOENT && may_create)) {
      if (errno == ENOENT) return MakeError(ENOENT, "%s: no such file or directory", p);
      return MakeError(errno, "%s: %s", p, std::strerror(errno));
    }
  } else if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
    return MakeError(ENODEV, "%s: not a regular file or a DAX character device", p);
  } else if (S_ISCHR(st.st_mode) && options.grow_to != 0) {
    return MakeError(EINVAL, "%s: a device cannot be created or resized; a size applies to "
                     "image files only", p);
  }

  std::unique_ptr<Pmem2Media> media(new Pmem2Media());
  media->path_ = path;
  media->read_only_ = options.read_only;
  int flags = (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NONBLOCK;
  if (may_create) flags |= O_CREAT;
  media->fd_ = open(p, flags, 0644);
  if (media->fd_ < 0) {
    if (errno == EACCES || errno == EPERM || errno == EROFS) {
      return MakeError(errno, "%s: permission denied (%s access)", p,
                       options.read_only ? "read" : "read-write");
    }
    return MakeError(errno, "%s: %s", p, std::strerror(errno));
  }
  if (fstat(media->fd_, &st) != 0) return MakeError(errno, "%s: %s", p, std::strerror(errno));
  if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
    return MakeError(ENODEV, "%s: not a regular file or a DAX character device", p);
  }
  if (options.lock) {
    const int op = (options.read_only ? LOCK_SH : LOCK_EX) | LOCK_NB;
    if (flock(media->fd_, op) != 0) {
      if (errno == EWOULDBLOCK) {
        return MakeError(EBUSY, "%s: in use (mounted by nvfs, or mkfs/fsck running on it)", p);
      }
      return MakeError(errno, "%s: cannot lock: %s", p, std::strerror(errno));
    }
  }
  if (S_ISREG(st.st_mode) && options.grow_to > static_cast<uint64_t>(st.st_size)) {
    if (ftruncate(media->fd_, static_cast<off_t>(options.grow_to)) != 0) {
      return MakeError(errno, "%s: cannot extend to %" PRIu64 " bytes: %s", p, options.grow_to,
                       std::strerror(errno));
    }
  }

  int ret = pmem2_source_from_fd(&media->source_, media->fd_);
  if (ret != 0) {
    if (ret == PMEM2_E_INVALID_FILE_TYPE) {
      return MakeError(ENODEV, "%s: not a regular file or a DAX character device", p);
    }
    return Pmem2Error(path, "cannot use as a pmem source", ret);
  }
  size_t size = 0;
  ret = pmem2_source_size(media->source_, &size);
  if (ret != 0) return Pmem2Error(path, "cannot read size", ret);
  size_t alignment = 0;
  ret = pmem2_source_alignment(media->source_, &alignment);
  if (ret != 0) return Pmem2Error(path, "cannot read alignment", ret);
  size_t usable = alignment ? size / alignment * alignment : size;
  if (usable == 0 && options.min_size == 0) {
    // No minimum was asked for: say what the mapping needs, not "at least 0".
    return MakeError(ENOSPC, "%s: too small: %zu bytes; a mapping needs at least %zu bytes", p,
                     size, alignment ? alignment : size_t{1});
  }
  if (usable < options.min_size) {
    return MakeError(ENOSPC, "%s: too small: %zu bytes; nvfs needs at least %" PRIu64 " bytes",
                     p, size, options.min_size);
  }

  pmem2_config* config = nullptr;
  ret = pmem2_config_new(&config);
  if (ret != 0) return Pmem2Error(path, "cannot map", ret);
  std::unique_ptr<pmem2_config, int (*)(pmem2_config*)> config_owner(
      config, [](pmem2_config* c) { return pmem2_config_delete(&c); });
  // Accept any granularity: the flush functions libpmem2 picks for the mapping
  // (msync for PAGE) are the ones we use.
  ret = pmem2_config_set_required_store_granularity(config, PMEM2_GRANULARITY_PAGE);
  if (ret == 0) ret = pmem2_config_set_length(config, usable);
  if (ret == 0) {
    ret = pmem2_config_set_protection(config, options.read_only
                                                  ? PMEM2_PROT_READ
                                                  : PMEM2_PROT_READ | PMEM2_PROT_WRITE);
  }
  if (ret != 0) return Pmem2Error(path, "cannot map", ret);
  ret = pmem2_map_new(&media->map_, config, media->source_);
  if (ret != 0) return Pmem2Error(path, "cannot be mapped", ret);

  media->base_ = static_cast<std::byte*>(pmem2_map_get_address(media->map_));
  media->size_ = pmem2_map_get_size(media->map_);
  switch (pmem2_map_get_store_granularity(media->map_)) {
    case PMEM2_GRANULARITY_BYTE: media->granularity_ = Granularity::kByte; break;
    case PMEM2_GRANULARITY_CACHE_LINE: media->granularity_ = Granularity::kCacheLine; break;
    default: media->granularity_ = Granularity::kPage; break;
  }
  media->flush_ = pmem2_get_flush_fn(media->map_);
  media->drain_ = pmem2_get_drain_fn(media->map_);
  media->memcpy_ = pmem2_get_memcpy_fn(media->map_);
  return std::unique_ptr<Media>(std::move(media));
}

}  // namespace

Result<std::unique_ptr<Media>> OpenMedia(const std::string& path, const MediaOptions& options) {
  return Pmem2Media::Open(path, options);
}

}  // namespace nvfs
