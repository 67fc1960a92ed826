#include "nvfs/name_hash.hpp"

#include <cstring>

namespace nvfs {

namespace {

// The splitmix64 finalizer: a bijection on 64 bits with full avalanche.
constexpr uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

}  // namespace

// h = seed ^ (len * golden ratio); for each 8-byte little-endian chunk of the
// name (the last zero-padded): h = Mix(h ^ chunk); result Mix(h).
uint64_t NameHash(uint64_t seed, std::string_view name) {
  uint64_t h = seed ^ (uint64_t{name.size()} * 0x9E3779B97F4A7C15ull);
  size_t pos = 0;
  while (pos < name.size()) {
    uint64_t chunk = 0;
    const size_t n = name.size() - pos < 8 ? name.size() - pos : 8;
    std::memcpy(&chunk, name.data() + pos, n);
    h = Mix(h ^ chunk);
    pos += n;
  }
  return Mix(h);
}

}  // namespace nvfs
