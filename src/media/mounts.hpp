// The media layer's view of mounts beyond MountAt (include/nvfs/media.hpp):
// whether a mount named by its unique id is still in this process's mount
// namespace (the lock's mount marks, pmem2_lock.cpp).
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "nvfs/media.hpp"

namespace nvfs {

// statmount(2) of the mount `unique_id`: 0 if it is in this process's mount
// namespace (its device number in *dev), -ENOENT if not, another -errno if
// the kernel cannot say (-ENOSYS before Linux 6.8, -EPERM where the mount is
// out of reach).
int MountLive(uint64_t unique_id, dev_t* dev);

}  // namespace nvfs
