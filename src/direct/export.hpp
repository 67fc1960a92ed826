// What libnvfs-direct exports: it is built with -fvisibility=hidden, and
// only the C API (include/nvfs/direct.h) and the calls it interposes
// (preload.cpp, fault.cpp) are marked with this.
#pragma once

#define NVFS_DIRECT_EXPORT extern "C" __attribute__((visibility("default")))
