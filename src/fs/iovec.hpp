// What the read and write paths (read.cpp, write.cpp) share about iovec
// lists.
#pragma once

#include <sys/uio.h>

#include <cstddef>

namespace nvfs {

inline size_t IovecTotal(const iovec* iov, int iovcnt) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  return total;
}

}  // namespace nvfs
