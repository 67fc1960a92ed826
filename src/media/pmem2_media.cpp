// The libpmem2 backend: the real mapping of a namespace. This file opens
// and maps it (Pmem2Media::Open); the class is pmem2_media.hpp's.
#include "media/pmem2_media.hpp"

#include <fcntl.h>
#include <libpmem2.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "nvfs/media.hpp"

namespace nvfs {

const char* GranularityName(Granularity g) {
  switch (g) {
    case Granularity::kByte: return "byte";
    case Granularity::kCacheLine: return "cache line";
    case Granularity::kPage: return "page";
    case Granularity::kMemory: return "memory (tmpfs)";
  }
  return "?";
}

void Media::CheckWrite(uint64_t offset, size_t len) const {
  const uint64_t size = this->size();
  if (read_only_ || offset > size || len > size - offset) {
    std::fprintf(stderr,
                 "nvfs: BUG: media write of %zu bytes at offset %" PRIu64
                 " outside a %s namespace of %" PRIu64 " bytes\n",
                 len, offset, read_only_ ? "read-only" : "writable", size);
    std::abort();
  }
}

namespace {

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

}  // namespace

Error Pmem2Error(const std::string& path, const char* what, int pmem2_ret) {
  const int code = Pmem2ErrorToErrno(pmem2_ret);
  return MakeError(code, "%s: %s: %s", path.c_str(), what, pmem2_errormsg());
}

namespace {

// A file whose pages are tmpfs's (Granularity::kMemory).
bool OnTmpfs(int fd) {
  struct statfs sfs;
  return fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC;
}

}  // namespace

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
  // Created owner-only: whoever can read the image reads every file in it
  // (NamespaceExposure). An existing file keeps its mode.
  media->fd_ = open(p, flags, 0600);
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
    Status locked = media->Lock(options.read_only, options.release_wait_ms);
    if (!locked.ok()) return locked.error();
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
  media->alignment_ = alignment ? alignment : 4096;
  if (ret == 0 && !options.read_only && options.reserve > usable) {
    // Rounded to 1 GiB, a multiple of every alignment a source has.
    const uint64_t reserve = (options.reserve + (1ull << 30) - 1) >> 30 << 30;
    // Without the address space (a ulimit -v, a 32-bit host) the namespace
    // is mapped as before and cannot grow while open.
    if (pmem2_vm_reservation_new(&media->reservation_, nullptr, reserve) == 0) {
      media->reserved_ = reserve;
      ret = pmem2_config_set_vm_reservation(config, media->reservation_, 0);
    } else {
      media->reservation_ = nullptr;
    }
  }
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
  if (media->granularity_ == Granularity::kPage && OnTmpfs(media->fd_) &&
      std::getenv("PMEM2_FORCE_GRANULARITY") == nullptr) {
    media->granularity_ = Granularity::kMemory;
    media->flush_ = [](const void*, size_t) {};
    media->drain_ = [] { std::atomic_thread_fence(std::memory_order_seq_cst); };
    media->memcpy_ = [](void* dst, const void* src, size_t len, unsigned) {
      return std::memcpy(dst, src, len);
    };
  }
  if (!options.read_only) media->ScanBacking(st);
  media->is_file_ = S_ISREG(st.st_mode);
  media->ReadBadBlocks();
  RegisterMapping(media->base_, media->size_);
  return std::unique_ptr<Media>(std::move(media));
}

void Pmem2Media::ReadBadBlocks() {
  pmem2_badblock_context* ctx = nullptr;
  if (pmem2_badblock_context_new(&ctx, source_) != 0) return;
  pmem2_badblock bb;
  while (pmem2_badblock_next(ctx, &bb) == 0) {
    if (bb.offset < size_) {
      bad_ranges_.push_back({bb.offset, std::min<uint64_t>(bb.length, size_ - bb.offset)});
    }
  }
  pmem2_badblock_context_delete(&ctx);
}

Result<std::unique_ptr<Media>> OpenMedia(const std::string& path, const MediaOptions& options) {
  return Pmem2Media::Open(path, options);
}

}  // namespace nvfs
