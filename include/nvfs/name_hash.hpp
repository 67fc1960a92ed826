// The directory name hash and the readdir keys built from it (format.hpp,
// "Directories"). Part of the on-media format: changing it breaks namespaces.
#pragma once

#include <cstdint>
#include <string_view>

#include "nvfs/format.hpp"

namespace nvfs {

// 64-bit hash of a name under the filesystem's seed (SuperStatic::hash_seed).
uint64_t NameHash(uint64_t seed, std::string_view name);

// The 56 bits of the hash the directory tree and keys use.
inline uint64_t DirHash56(uint64_t hash) { return hash >> (64 - format::kDirHashBits); }

inline uint64_t DirKey(uint64_t hash56, uint32_t seq) {
  return (hash56 << format::kDirSeqBits) | seq;
}

}  // namespace nvfs
