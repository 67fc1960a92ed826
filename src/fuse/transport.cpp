// The transport below libfuse (transport.hpp).
#include "fuse/transport.hpp"

#include <linux/fuse.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "fuse/kernel_abi.hpp"
#include "fuse/uring.hpp"
#include "util/races.hpp"

namespace nvfs {

namespace {

// The marks of the request this thread read last (libfuse serves a request
// on the thread that read it).
thread_local bool request_kills_privs = false;
thread_local bool request_writes_back = false;
thread_local bool request_fills_pages = false;
thread_local bool request_kills_sgid = false;
thread_local bool request_is_tmpfile = false;
thread_local bool request_is_statx = false;

// A request header followed by at least `Arg`, as the kernel sent it.
template <class Arg>
bool ReadArg(const void* buf, size_t len, Arg* arg) {
  if (len < sizeof(fuse_in_header) + sizeof(Arg)) return false;
  std::memcpy(arg, static_cast<const std::byte*>(buf) + sizeof(fuse_in_header), sizeof(Arg));
  return true;
}

}  // namespace

ssize_t ObserveRequest(void* buf, ssize_t n, void* userdata) {
  request_kills_privs = false;
  request_writes_back = false;
  request_fills_pages = false;
  request_kills_sgid = false;
  request_is_tmpfile = false;
  request_is_statx = false;
  if (n < static_cast<ssize_t>(sizeof(fuse_in_header))) return n;
  const size_t len = static_cast<size_t>(n);
  fuse_in_header header;
  std::memcpy(&header, buf, sizeof header);
  switch (header.opcode) {
    case FUSE_WRITE: {
      fuse_write_in arg;
      if (ReadArg(buf, len, &arg)) {
        request_kills_privs = arg.write_flags & FUSE_WRITE_KILL_SUIDGID;
        request_writes_back = arg.write_flags & FUSE_WRITE_CACHE;
      }
      break;
    }
    case FUSE_READ: {
      fuse_read_in arg;
      request_fills_pages = ReadArg(buf, len, &arg) && !(arg.read_flags & FUSE_READ_LOCKOWNER);
      break;
    }
    case FUSE_OPEN: {
      fuse_open_in arg;
      request_kills_privs = ReadArg(buf, len, &arg) && (arg.open_flags & FUSE_OPEN_KILL_SUIDGID);
      break;
    }
    case FUSE_SETXATTR: {
      // With FUSE_SETXATTR_EXT the kernel sends the whole fuse_setxattr_in
      // (size, flags, setxattr_flags, padding); libfuse 3.14 reads only the
      // first 8 bytes (FUSE_COMPAT_SETXATTR_IN_SIZE) before the name. The
      // flags are kept, and the name and value moved down over the rest,
      // so libfuse gets the request it knows.
      const auto* adapter = static_cast<const FuseAdapter*>(userdata);
      fuse_setxattr_in arg;
      if (!adapter->protocol().agreed(FUSE_SETXATTR_EXT) || !ReadArg(buf, len, &arg)) break;
      request_kills_sgid = arg.setxattr_flags & FUSE_SETXATTR_ACL_KILL_SGID;
      constexpr size_t kDropped = sizeof arg - FUSE_COMPAT_SETXATTR_IN_SIZE;
      auto* bytes = static_cast<std::byte*>(buf);
      const size_t tail = sizeof(fuse_in_header) + sizeof arg;
      std::memmove(bytes + tail - kDropped, bytes + tail, len - tail);
      header.len = static_cast<uint32_t>(len - kDropped);
      std::memcpy(buf, &header, sizeof header);
      return n - static_cast<ssize_t>(kDropped);
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
    case FUSE_TMPFILE:
      // Served as the CREATE it resembles (transport.hpp).
      request_is_tmpfile = true;
      header.opcode = FUSE_CREATE;
      std::memcpy(buf, &header, sizeof header);
      break;
    case kernel_abi::kOpStatx:
      // Served as the GETATTR whose argument begins it (transport.hpp):
      // libfuse reads fuse_getattr_in (flags, fh) and leaves the rest.
      if (len < sizeof(fuse_in_header) + sizeof(kernel_abi::StatxIn)) break;
      request_is_statx = true;
      header.opcode = FUSE_GETATTR;
      std::memcpy(buf, &header, sizeof header);
      break;
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
// OpInit asked for that libfuse has no name for, each only if the kernel
// offered it; bits 32-63 go in flags2, which the kernel reads only with
// FUSE_INIT_EXT in flags (libfuse 3.14 sets it when it answers an extended
// INIT, but not necessarily: it is set here whenever flags2 is used). A
// reply too short for flags2 (a kernel older than 7.23 gets libfuse's
// short reply) carries none of them. What was sent is kept in
// Protocol::agreed_flags.
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
      fuse_init_out out{};
      const size_t out_len = std::min(sizeof out, iov[1].iov_len);
      std::memcpy(&out, iov[1].iov_base, out_len);
      uint64_t extra = p.extra_flags & p.kernel_flags;
      const bool has_flags2 = out_len >= offsetof(fuse_init_out, flags2) + sizeof out.flags2;
      if (!has_flags2) extra &= 0xffffffffull;
      if (header.error == 0 && extra != 0) {
        out.flags |= static_cast<uint32_t>(extra);
        if ((extra >> 32) != 0) {
          out.flags |= FUSE_INIT_EXT;
          out.flags2 |= static_cast<uint32_t>(extra >> 32);
        }
      }
      p.agreed_flags = out.flags;
      if (has_flags2 && (out.flags & FUSE_INIT_EXT)) p.agreed_flags |= uint64_t{out.flags2} << 32;
      if (header.error == 0 && extra != 0) {
        iovec amended[2] = {iov[0], {&out, out_len}};
        return writev(fd, amended, 2);
      }
    }
  }
  // A map-path read reply (fuse/file.cpp, OpRead) points into the mapping,
  // and the kernel copies it during this writev (util/races.hpp).
  [[maybe_unused]] const RacingReads racing;
  return writev(fd, iov, count);
}

}  // namespace

std::string LibfuseUnsupported(int version, const char* package_version) {
  if (version == kLibfuseWrittenFor) return "";
  return std::string("libfuse ") + package_version +
         " is loaded, but nvfs rewrites FUSE messages around what libfuse 3.14 parses "
         "(src/fuse/transport.hpp) and runs only with 3.14";
}

int InstallTransport(fuse_session* se) {
  fuse_custom_io io{};
  io.read = TransportRead;
  io.writev = TransportWritev;
  return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

bool RequestKillsPrivs() { return request_kills_privs; }

bool RequestWritesBack() { return request_writes_back; }
bool RequestFillsPages() { return request_fills_pages; }

bool RequestKillsSgid() { return request_kills_sgid; }
bool RequestIsTmpfile() { return request_is_tmpfile; }
bool RequestIsStatx() { return request_is_statx; }

}  // namespace nvfs
