// What the daemon asks of the host around the mount (host.hpp).
#include "daemon/host.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "daemon/say.hpp"

namespace nvfs::daemon {

// Descriptors inherited from whoever started the daemon (a shell's
// redirections, a test harness's open files) would stay open for the life of
// the mount: one on a file of another mount keeps that mount busy ("umount:
// target is busy", fstests' checks after a test that mounted its scratch
// device) until this daemon exits. Only 0-2 are kept (fuse_daemonize points
// them at /dev/null when the daemon detaches); nothing reaches the daemon as
// a descriptor (MOUNTPOINT is a directory, never /dev/fd/N).
void CloseInheritedDescriptors() {
  if (close_range(3, ~0U, 0) == 0) return;
  const long limit = sysconf(_SC_OPEN_MAX);  // kernels before 5.9
  for (long fd = 3; fd < (limit > 0 ? limit : 1024); ++fd) (void)close(static_cast<int>(fd));
}

// The "major:minor" of the file system mounted at `mountpoint` (the last
// one, if several are stacked there), from /proc/self/mountinfo: a stat()
// of the mount point would wait for this daemon's own GETATTR reply.
std::string MountDevice(const std::string& mountpoint) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line, found;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    if (!(fields >> id >> parent >> dev >> root >> point)) continue;
    std::string unescaped;  // mountinfo writes space, tab, newline and \ as \ooo
    for (size_t i = 0; i < point.size(); ++i) {
      const auto octal = [&](size_t at) { return point[at] >= '0' && point[at] <= '7'; };
      if (point[i] == '\\' && i + 3 < point.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
        unescaped += static_cast<char>((point[i + 1] - '0') * 64 + (point[i + 2] - '0') * 8 +
                                       (point[i + 3] - '0'));
        i += 3;
      } else {
        unescaped += point[i];
      }
    }
    if (unescaped == mountpoint) found = dev;
  }
  return found;
}

// The kernel gives a FUSE mount 128 KiB of read-ahead at most (the INIT
// reply can only lower it; ServeInit has run), so cold page-cache reads
// arrive in 128 KiB requests, each a round trip. Raising the mount's backing-device
// read-ahead lets one request fill up to kFuseMaxIo. Needs write access to
// sysfs (root); otherwise the kernel's value stays, with a warning when the
// value was asked for explicitly. Done before anything can open a file:
// a file takes its read-ahead window from the device when opened.
void SetReadAhead(const std::string& mountpoint, int kb, bool asked) {
  const std::string dev = MountDevice(mountpoint);
  const std::string path = "/sys/class/bdi/" + dev + "/read_ahead_kb";
  const int fd = dev.empty() ? -1 : open(path.c_str(), O_WRONLY | O_CLOEXEC);
  int error = dev.empty() ? ENOENT : errno;
  if (fd >= 0) {
    const std::string value = std::to_string(kb) + "\n";
    const bool ok = write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
    error = ok ? 0 : errno;
    close(fd);
  }
  if (error != 0 && asked) {
    Say("%s: cannot set read_ahead_kb (%s): kept the kernel's", mountpoint.c_str(),
        std::strerror(error));
  }
}

}  // namespace nvfs::daemon
