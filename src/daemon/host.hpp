// What the daemon asks of the host around the mount: its own descriptors
// and the mount's read-ahead in sysfs.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace nvfs::daemon {

// Closes every descriptor but 0-2 (see host.cpp for why).
void CloseInheritedDescriptors();

// Sets the read-ahead of the mount at `mountpoint` (device `dev`, from
// nvfs::MountAt; unknown: nothing is set) to `kb`; says so when it cannot
// and the value was `asked` for.
void SetReadAhead(const std::string& mountpoint, std::optional<dev_t> dev, int kb, bool asked);

}  // namespace nvfs::daemon
