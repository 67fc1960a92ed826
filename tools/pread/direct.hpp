// nvfs-pread file mode's reads of one thread's descriptor: through
// libnvfs-direct (--direct) or through the kernel.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "nvfs/direct.h"

namespace nvfs::pread {

class ThreadReader {
 public:
  // With `use_library`, attaches a handle to `fd` (the file at `path`) and
  // says once per process on stderr when the file is read through the
  // kernel, and why.
  ThreadReader(int fd, bool use_library, const std::string& path);
  // Detaches the handle: destroy the reader before closing `fd`.
  ~ThreadReader();
  ThreadReader(const ThreadReader&) = delete;
  ThreadReader& operator=(const ThreadReader&) = delete;

  // False when --direct was asked and no handle could be attached.
  bool ok() const { return !use_library_ || handle_ != nullptr; }
  ssize_t Pread(void* dst, size_t len, uint64_t off) const;
  ssize_t Preadv(const iovec* iov, int count, uint64_t off) const;

 private:
  const int fd_;
  const bool use_library_;
  nvfs_direct* const handle_;
};

}  // namespace nvfs::pread
