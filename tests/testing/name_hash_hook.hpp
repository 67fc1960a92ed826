// For tests only: a hook that replaces NameHash, so that a test can force
// names onto chosen hash values (collisions that the keyed hash makes
// impossible to find on purpose). Part of the test library (nvfs_testing,
// tests/meson.build), whose NameHash (name_hash_hook.cpp) takes the place of
// the core's in the programs that link it; the daemon, mkfs and fsck have
// neither the hook nor a way to set it.
#pragma once

#include <cstdint>
#include <string_view>

#include "nvfs/name_hash.hpp"

namespace nvfs::testing {

// While set (non-null), NameHash(key, name) returns hook(key, name) in this
// process: in the directory code, in mkfs and in fsck alike.
// REQUIRES: no filesystem is in use while it changes.
using NameHashHook = uint64_t (*)(const NameHashKey& key, std::string_view name);
void SetNameHashHook(NameHashHook hook);

}  // namespace nvfs::testing
