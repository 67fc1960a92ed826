// NameHash, alone in its file: the test library (tests/testing/) links its own
// definition in its place to force names onto chosen hash values, so this
// object must hold nothing else the program needs. The product has no hook.
#include "nvfs/name_hash.hpp"

namespace nvfs {

uint64_t NameHash(const NameHashKey& key, std::string_view name) {
  return SipHash24(key.k0, key.k1, name.data(), name.size());
}

}  // namespace nvfs
