// The client's side of the control socket (include/nvfs/control.hpp).
#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "nvfs/control.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::control {

std::string SocketPath(dev_t mount_dev) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/run/nvfs/control-%u:%u", major(mount_dev), minor(mount_dev));
  return buf;
}

namespace {

// mountinfo writes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string oct = field.substr(i + 1, 3);
      if (oct.size() == 3 && oct.find_first_not_of("01234567") == std::string::npos) {
        out += static_cast<char>(std::strtol(oct.c_str(), nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

}  // namespace

Result<dev_t> FindMount(const std::string& path) {
  char real[PATH_MAX];
  if (realpath(path.c_str(), real) == nullptr) {
    return MakeError(errno, "%s: %s", path.c_str(), std::strerror(errno));
  }
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // id parent MAJ:MIN root mountpoint options ... - fstype source superopts
    std::istringstream fields(line);
    std::string id, parent, dev, root, mountpoint;
    fields >> id >> parent >> dev >> root >> mountpoint;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype, source;
    tail >> fstype >> source;
    if (fstype.rfind("fuse", 0) != 0) continue;
    if (Unescape(source) != real && Unescape(mountpoint) != real) continue;
    unsigned maj = 0, min = 0;
    if (std::sscanf(dev.c_str(), "%u:%u", &maj, &min) != 2) continue;
    return makedev(maj, min);
  }
  return MakeError(ENOENT, "%s: no nvfs mount of it found", path.c_str());
}

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
