// The directory name hash and the readdir keys built from it (format.hpp,
// "Directories"). Part of the on-media format: changing it breaks namespaces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "nvfs/format.hpp"

namespace nvfs {

// SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
// 2012) of `len` bytes under the 128-bit key k0 || k1 (k0 = key bytes 0..7 read
// little-endian, k1 = bytes 8..15).
uint64_t SipHash24(uint64_t k0, uint64_t k1, const void* data, size_t len);

// The filesystem's directory hash key (SuperStatic::dir_hash_key), decoded.
// A secret: never logged, printed or handed to users.
struct NameHashKey {
  uint64_t k0 = 0;
  uint64_t k1 = 0;

  static NameHashKey FromSuper(const format::SuperStatic& sb);
};

// 64-bit keyed hash of a name: SipHash24 of its bytes under the key. Without
// the key its values, and so the readdir cookies built from them, say nothing
// a user could steer names with.
uint64_t NameHash(const NameHashKey& key, std::string_view name);

// The kDirHashBits (leading) bits of the hash the directory tree and keys use.
inline uint64_t DirHash(uint64_t hash) { return hash >> (64 - format::kDirHashBits); }

// REQUIRES: hash < 2^kDirHashBits, seq < 2^kDirSeqBits.
inline uint64_t DirKey(uint64_t dir_hash, uint32_t seq) {
  return (dir_hash << format::kDirSeqBits) | seq;
}

}  // namespace nvfs
