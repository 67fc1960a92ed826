// nvfs-pread's reads through libnvfs-direct (direct.hpp).
#include "pread/direct.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace nvfs::pread {

ThreadReader::ThreadReader(int fd, bool use_library, const std::string& path)
    : fd_(fd), use_library_(use_library), handle_(use_library ? nvfs_direct_attach(fd) : nullptr) {
  if (handle_ == nullptr) return;
  static std::atomic<bool> warned{false};
  const int why = nvfs_direct_why(handle_);
  if (why != NVFS_DIRECT_ACTIVE && !warned.exchange(true)) {
    std::fprintf(stderr, "nvfs-pread: --direct: %s is read through the kernel: %s\n",
                 path.c_str(), nvfs_direct_strwhy(why));
  }
}

ThreadReader::~ThreadReader() {
  if (handle_ != nullptr) nvfs_direct_detach(handle_);
}

ssize_t ThreadReader::Pread(void* dst, size_t len, uint64_t off) const {
  return handle_ != nullptr ? nvfs_direct_pread(handle_, dst, len, static_cast<off_t>(off))
                            : ::pread(fd_, dst, len, static_cast<off_t>(off));
}

ssize_t ThreadReader::Preadv(const iovec* iov, int count, uint64_t off) const {
  return handle_ != nullptr ? nvfs_direct_preadv(handle_, iov, count, static_cast<off_t>(off))
                            : ::preadv(fd_, iov, count, static_cast<off_t>(off));
}

}  // namespace nvfs::pread
