// Per-thread reply buffers of the FUSE data path (read, readdir, xattr
// replies), so that serving a request allocates nothing and takes no page
// fault in the daemon.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nvfs/format.hpp"
#include "nvfs/fs.hpp"

namespace nvfs::fuse_ops {

// Segment size of the iter path's scatter list.
inline constexpr size_t kIterSegment = 4096;
// writev(2) takes at most UIO_MAXIOV (1024) segments; the reply header is one.
inline constexpr size_t kMaxReplyRuns = 1023;

// The buffers of the read, readdir and xattr replies, one set per worker
// thread. Allocated the first time a thread needs them (sized for the largest
// request the kernel sends, kFuseMaxIo, and populated so later requests take
// no page fault), reused by every later request of the thread, freed when the
// thread ends. They grow only if a request is larger than anything seen
// before (a -o max_read beyond kFuseMaxIo), so a read allocates nothing.
class ThreadBuffers {
 public:
  ThreadBuffers() = default;
  ~ThreadBuffers();
  ThreadBuffers(const ThreadBuffers&) = delete;
  ThreadBuffers& operator=(const ThreadBuffers&) = delete;

  // Makes data() at least `size` bytes and runs() long enough for a mapped
  // read of `size` bytes in blocks of `block_size`. Throws std::bad_alloc.
  void Reserve(size_t size, uint32_t block_size);

  char* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  std::vector<iovec>& segments() { return segments_; }
  std::vector<ReadRun>& runs() { return runs_; }
  std::vector<iovec>& run_iov() { return run_iov_; }
  std::vector<iovec>& write_iov() { return write_iov_; }
  std::vector<uint64_t>& looked_up() { return looked_up_; }
  char* name() { return name_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
  std::vector<iovec> segments_;    // kIterSegment pieces of data_ (iter path)
  std::vector<ReadRun> runs_;      // map path
  std::vector<iovec> run_iov_;     // runs_ as the iovecs of fuse_reply_iov
  std::vector<iovec> write_iov_;   // write_buf's memory buffers
  std::vector<uint64_t> looked_up_;  // readdirplus: inodes given a reference
  char name_[format::kNameMax + 1];  // a NUL-terminated directory entry name
};

// The calling thread's buffers.
ThreadBuffers& LocalBuffers();

}  // namespace nvfs::fuse_ops
