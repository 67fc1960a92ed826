// What libnvfs-direct exports: it is built with -fvisibility=hidden, and
// only the C API (include/nvfs/direct.h) and the calls it interposes
// (preload.cpp, fault.cpp) are marked with this.
#pragma once

#define NVFS_DIRECT_EXPORT extern "C" __attribute__((visibility("default")))

// For what ThreadSanitizer's runtime may call before it can run instrumented
// code (tools/tsan.sh): it installs its own signal handlers, at start-up,
// through the next definition of sigaction after its own, which is the
// library's (fault.cpp). Nothing else needs it; elsewhere it means nothing.
#define NVFS_DIRECT_UNINSTRUMENTED __attribute__((no_sanitize_thread))
