// What the daemon asks of the host around the mount (host.hpp).
#include "daemon/host.hpp"

#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

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

// The kernel gives a FUSE mount 128 KiB of read-ahead at most (the INIT
// reply can only lower it; ServeInit has run), so cold page-cache reads
// arrive in 128 KiB requests, each a round trip. Raising the mount's backing-device
// read-ahead lets one request fill up to kFuseMaxIo. Needs write access to
// sysfs (root); otherwise the kernel's value stays, with a warning when the
// value was asked for explicitly. Done before anything can open a file:
// a file takes its read-ahead window from the device when opened.
void SetReadAhead(const std::string& mountpoint, std::optional<dev_t> dev, int kb, bool asked) {
  const std::string path = dev ? "/sys/class/bdi/" + std::to_string(major(*dev)) + ":" +
                                     std::to_string(minor(*dev)) + "/read_ahead_kb"
                               : std::string();
  const int fd = dev ? open(path.c_str(), O_WRONLY | O_CLOEXEC) : -1;
  int error = dev ? errno : ENOENT;
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
