// Where the daemon's sockets are, named once for both ends: the daemon
// (src/daemon/) binds them, libnvfs-direct (src/direct/) and nvfs-resize
// (src/control/) connect to them. Plain values, no dependency on either
// side; the library allocates nothing through the first SocketPath.
//
// A root daemon makes them in kSocketDir, 0755 and root's, so that only
// root can put a socket there: a client that finds one trusts it is the
// mount's daemon, and checks the directory the same way. Beside them lie
// the direct writers' files, writers-UUID (src/daemon/direct_writers.hpp),
// which only the daemon opens by name.
#pragma once

#include <sys/sysmacros.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdio>
#include <string>

namespace nvfs {

inline constexpr const char* kSocketDir = "/run/nvfs";

namespace direct {

// The direct socket of the FUSE mount whose st_dev is `dev`:
// DIR/direct-MAJOR:MINOR, written into `buf` (cut short if it does not
// fit), DIR being `dir` (libnvfs-direct's tests name another).
inline void SocketPath(char* buf, size_t size, dev_t dev, const char* dir) {
  std::snprintf(buf, size, "%s/direct-%u:%u", dir, major(dev), minor(dev));
}

// /run/nvfs/direct-MAJOR:MINOR.
inline std::string SocketPath(dev_t dev) {
  char buf[96];
  SocketPath(buf, sizeof buf, dev, kSocketDir);
  return buf;
}

}  // namespace direct

namespace control {

// The control socket of the mount whose st_dev is `dev`
// (include/nvfs/control.hpp): /run/nvfs/control-MAJOR:MINOR.
inline std::string SocketPath(dev_t dev) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s/control-%u:%u", kSocketDir, major(dev), minor(dev));
  return buf;
}

}  // namespace control

}  // namespace nvfs
