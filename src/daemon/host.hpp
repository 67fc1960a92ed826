// What the daemon asks of the host around the mount: its own descriptors,
// the mount's device number (from /proc/self/mountinfo, never a stat of the
// mount point) and the mount's read-ahead in sysfs.
#pragma once

#include <string>

namespace nvfs::daemon {

// Closes every descriptor but 0-2 (see host.cpp for why).
void CloseInheritedDescriptors();

// The "major:minor" of the file system mounted at `mountpoint` (the last
// one, if several are stacked there); "" if none is.
std::string MountDevice(const std::string& mountpoint);

// Sets the mount's backing-device read-ahead to `kb`; says so when it
// cannot and the value was `asked` for.
void SetReadAhead(const std::string& mountpoint, int kb, bool asked);

}  // namespace nvfs::daemon
