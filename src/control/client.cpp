// The client's side of the control socket (include/nvfs/control.hpp).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "nvfs/control.hpp"
#include "nvfs/paths.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::control {

Result<Reply> AskGrow(dev_t mount_dev, int namespace_fd, uint64_t size) {
  const std::string path = SocketPath(mount_dev);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return MakeError(errno, "socket: %s", std::strerror(errno));
  const auto fail = [&](int code, const std::string& what) {
    close(sock);
    return MakeError(code, "%s", what.c_str());
  };
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    return fail(e, path + ": " + std::strerror(e) +
                       " (is the daemon running as root, with this version?)");
  }
  // The daemon must be root: a socket in /run/nvfs that is not root's
  // could be anyone's.
  ucred peer{};
  socklen_t len = sizeof peer;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != 0) {
    return fail(EPERM, path + ": the process at the other end is not root");
  }
  const timeval timeout{600, 0};  // a grow to a large size backs its metadata first
  (void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  const Request req{kMagic, kVersion, kOpGrow, 0, size};
  if (SendWithFd(sock, &req, sizeof req, namespace_fd, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof req)) {
    const int e = errno;
    return fail(e, path + ": cannot send the request: " + std::strerror(e));
  }
  Reply reply{};
  size_t got = 0;
  while (got < sizeof reply) {
    const ssize_t n = read(sock, reinterpret_cast<char*>(&reply) + got, sizeof reply - got);
    if (n <= 0) {
      return fail(n == 0 ? EPROTO : errno, path + ": no reply from the daemon");
    }
    got += static_cast<size_t>(n);
  }
  close(sock);
  if (reply.magic != kMagic) return MakeError(EPROTO, "%s: a reply in another protocol", path.c_str());
  reply.message[sizeof reply.message - 1] = '\0';
  return reply;
}

}  // namespace nvfs::control
