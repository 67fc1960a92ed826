#include "fuse/thread_buffers.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "fuse/adapter.hpp"

namespace nvfs::fuse_ops {

ThreadBuffers::~ThreadBuffers() {
  if (data_ != nullptr) munmap(data_, capacity_);
}

void ThreadBuffers::Reserve(size_t size, uint32_t block_size) {
  if (size > capacity_) {
    const size_t capacity = std::max<size_t>((size + kIterSegment - 1) & ~(kIterSegment - 1),
                                             kFuseMaxIo);
    void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (data_ != nullptr) munmap(data_, capacity_);
    data_ = static_cast<char*>(p);
    capacity_ = capacity;
    segments_.resize(capacity / kIterSegment);
    for (size_t i = 0; i < segments_.size(); ++i) {
      segments_[i] = {data_ + i * kIterSegment, kIterSegment};
    }
  }
  // A read of `size` bytes touches at most size / block_size + 2 blocks,
  // each at most one run.
  const size_t runs = std::min(capacity_ / std::max<uint32_t>(block_size, 1) + 2, kMaxReplyRuns);
  if (runs > runs_.size()) {
    runs_.resize(runs);
    run_iov_.resize(runs);
  }
}

ThreadBuffers& LocalBuffers() {
  thread_local ThreadBuffers buffers;
  return buffers;
}

}  // namespace nvfs::fuse_ops
