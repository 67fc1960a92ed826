// The transport below libfuse (transport.hpp).
#include "fuse/transport.hpp"

#include "fuse/uring.hpp"

#include <linux/fuse.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace nvfs {

namespace {

// The mark of the request this thread read last (libfuse serves a request
// on the thread that read it).
thread_local bool request_kills_privs = false;

// A request header followed by at least `Arg`, as the kernel sent it.
template <class Arg>
bool ReadArg(const void* buf, size_t len, Arg* arg) {
  if (len < sizeof(fuse_in_header) + sizeof(Arg)) return false;
  std::memcpy(arg, static_cast<const std::byte*>(buf) + sizeof(fuse_in_header), sizeof(Arg));
  return true;
}

}  // namespace

ssize_t ObserveRequest(const void* buf, ssize_t n, void* userdata) {
  request_kills_privs = false;
  if (n < static_cast<ssize_t>(sizeof(fuse_in_header))) return n;
  const size_t len = static_cast<size_t>(n);
  fuse_in_header header;
  std::memcpy(&header, buf, sizeof header);
  switch (header.opcode) {
    case FUSE_WRITE: {
      fuse_write_in arg;
      request_kills_privs = ReadArg(buf, len, &arg) && (arg.write_flags & FUSE_WRITE_KILL_SUIDGID);
      break;
    }
    case FUSE_OPEN: {
      fuse_open_in arg;
      request_kills_privs = ReadArg(buf, len, &arg) && (arg.open_flags & FUSE_OPEN_KILL_SUIDGID);
      break;
    }
    case FUSE_INIT: {
      // Older kernels send the 16-byte fuse_init_in of protocol 7.35 and
      // before (no flags2); FUSE_INIT_EXT says flags2 is there.
      constexpr size_t kShort = offsetof(fuse_init_in, flags2);
      if (len < sizeof(fuse_in_header) + kShort) break;
      fuse_init_in arg{};
      std::memcpy(&arg, static_cast<const std::byte*>(buf) + sizeof(fuse_in_header),
                  std::min(sizeof arg, len - sizeof(fuse_in_header)));
      FuseAdapter::Protocol& p = static_cast<FuseAdapter*>(userdata)->protocol();
      p.kernel_flags = arg.flags;
      if ((arg.flags & FUSE_INIT_EXT) && len >= sizeof(fuse_in_header) + sizeof arg) {
        p.kernel_flags |= uint64_t{arg.flags2} << 32;
      }
      p.init_unique = header.unique;
      break;
    }
    default:
      break;
  }
  return n;
}

namespace {

ssize_t TransportRead(int fd, void* buf, size_t buf_len, void* userdata) {
  return ObserveRequest(buf, read(fd, buf, buf_len), userdata);
}

// The INIT reply libfuse built: header, then fuse_init_out. Adds the flags
// OpInit agreed to that libfuse has no name for.
ssize_t TransportWritev(int fd, iovec* iov, int count, void* userdata) {
  ssize_t ring_written;
  if (TakeRingReply(iov, count, &ring_written)) return ring_written;  // uring.hpp
  FuseAdapter::Protocol& p = static_cast<FuseAdapter*>(userdata)->protocol();
  if (p.init_unique != 0 && count == 2 && iov[0].iov_len == sizeof(fuse_out_header) &&
      iov[1].iov_len >= offsetof(fuse_init_out, max_write)) {
    fuse_out_header header;
    std::memcpy(&header, iov[0].iov_base, sizeof header);
    if (header.unique == p.init_unique) {
      p.init_unique = 0;
      if (header.error == 0 && p.extra_flags != 0) {
        fuse_init_out out{};
        const size_t out_len = std::min(sizeof out, iov[1].iov_len);
        std::memcpy(&out, iov[1].iov_base, out_len);
        out.flags |= static_cast<uint32_t>(p.extra_flags);
        if (out_len >= offsetof(fuse_init_out, flags2) + sizeof out.flags2) {
          out.flags2 |= static_cast<uint32_t>(p.extra_flags >> 32);
        }
        iovec amended[2] = {iov[0], {&out, out_len}};
        return writev(fd, amended, 2);
      }
    }
  }
  return writev(fd, iov, count);
}

}  // namespace

int InstallTransport(fuse_session* se) {
  fuse_custom_io io{};
  io.read = TransportRead;
  io.writev = TransportWritev;
  return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

bool RequestKillsPrivs() { return request_kills_privs; }

}  // namespace nvfs
