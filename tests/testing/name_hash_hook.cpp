// The test library's NameHash (tests/testing/name_hash_hook.hpp): linked
// whole into every program of the test library, so the linker takes it and
// never the core's src/format/name_hash.cpp, which holds nothing else.
#include "nvfs/name_hash.hpp"
#include "testing/name_hash_hook.hpp"

namespace nvfs {

namespace {
testing::NameHashHook name_hash_hook = nullptr;
}  // namespace

uint64_t NameHash(const NameHashKey& key, std::string_view name) {
  if (name_hash_hook != nullptr) return name_hash_hook(key, name);
  return SipHash24(key.k0, key.k1, name.data(), name.size());
}

void testing::SetNameHashHook(NameHashHook hook) { name_hash_hook = hook; }

}  // namespace nvfs
