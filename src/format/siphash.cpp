// SipHash-2-4 and the directory hash key read from the superblock. NameHash
// itself is alone in name_hash.cpp (that file's opening comment says why).
#include "nvfs/name_hash.hpp"

#include <bit>
#include <cstring>

namespace nvfs {

namespace {

uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);  // little-endian (format.hpp)
  return v;
}

struct SipState {
  uint64_t v0, v1, v2, v3;

  void Round() {
    v0 += v1;
    v1 = std::rotl(v1, 13);
    v1 ^= v0;
    v0 = std::rotl(v0, 32);
    v2 += v3;
    v3 = std::rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = std::rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = std::rotl(v1, 17);
    v1 ^= v2;
    v2 = std::rotl(v2, 32);
  }

  // c = 2 compression rounds per message word.
  void Compress(uint64_t m) {
    v3 ^= m;
    Round();
    Round();
    v0 ^= m;
  }
};

}  // namespace

// The paper's definition: the state is the key XORed with the constants
// "somepseudorandomlygeneratedbytes"; each 8-byte little-endian word of the
// message is compressed with 2 rounds; the last word holds the 0..7 bytes left
// and, in its top byte, the message length mod 256; then v2 ^= 0xff and 4
// finalization rounds; the result is v0 ^ v1 ^ v2 ^ v3.
uint64_t SipHash24(uint64_t k0, uint64_t k1, const void* data, size_t len) {
  SipState s{k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull,
             k0 ^ 0x6c7967656e657261ull, k1 ^ 0x7465646279746573ull};
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t whole = len & ~size_t{7};
  for (size_t i = 0; i < whole; i += 8) s.Compress(Load64(p + i));
  uint64_t last = uint64_t{len & 0xff} << 56;
  for (size_t i = whole; i < len; ++i) last |= uint64_t{p[i]} << (8 * (i - whole));
  s.Compress(last);
  s.v2 ^= 0xff;
  for (int r = 0; r < 4; ++r) s.Round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

NameHashKey NameHashKey::FromSuper(const format::SuperStatic& sb) {
  NameHashKey key;
  key.k0 = Load64(sb.dir_hash_key);
  key.k1 = Load64(sb.dir_hash_key + 8);
  return key;
}

}  // namespace nvfs
