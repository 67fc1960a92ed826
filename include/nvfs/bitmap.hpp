// Bit operations on the on-media bitmaps: bit i lives in byte i / 8 at bit
// position i % 8 (little-endian bit order), as format.hpp defines them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace nvfs {

inline bool TestBit(const std::byte* bitmap, uint64_t bit) {
  return ((std::to_integer<unsigned>(bitmap[bit / 8]) >> (bit % 8)) & 1u) != 0;
}

// TestBit on a live bitmap whose other bits other threads may be changing
// meanwhile (atomic stores under the allocator's lock): the byte is read
// atomically, so the read is not a data race.
inline bool TestBitShared(const std::byte* bitmap, uint64_t bit) {
  const auto byte = __atomic_load_n(reinterpret_cast<const uint8_t*>(bitmap) + bit / 8,
                                    __ATOMIC_RELAXED);
  return ((byte >> (bit % 8)) & 1u) != 0;
}

inline void SetBitsInBuffer(std::byte* bitmap, uint64_t first, uint64_t count) {
  for (uint64_t bit = first; bit < first + count; ++bit) {
    bitmap[bit / 8] |= static_cast<std::byte>(1u << (bit % 8));
  }
}

inline void ClearBitsInBuffer(std::byte* bitmap, uint64_t first, uint64_t count) {
  for (uint64_t bit = first; bit < first + count; ++bit) {
    bitmap[bit / 8] &= ~static_cast<std::byte>(1u << (bit % 8));
  }
}

// Set bits among the first `bits` bits.
inline uint64_t CountSetBits(const std::byte* bitmap, uint64_t bits) {
  uint64_t n = 0;
  uint64_t i = 0;
  for (; i + 64 <= bits; i += 64) {
    uint64_t word;
    std::memcpy(&word, bitmap + i / 8, 8);
    n += static_cast<uint64_t>(std::popcount(word));
  }
  for (; i < bits; ++i) n += TestBit(bitmap, i) ? 1 : 0;
  return n;
}

// The same bitmaps as arrays of 64-bit words (the media's byte order is
// little-endian, so word w holds bits 64w .. 64w + 63, bit i of the word
// being bit 64w + i): DRAM copies (the allocator, fsck) and the word-wide
// stores to the media bitmaps.

// `n` bits set from bit `first_bit` of a word. REQUIRES: 1 <= n and
// first_bit + n <= 64.
inline uint64_t BitRunMask(uint64_t first_bit, uint64_t n) {
  return (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << first_bit;
}

inline bool TestWordBit(const uint64_t* words, uint64_t bit) {
  return ((words[bit / 64] >> (bit % 64)) & 1u) != 0;
}

inline void SetWordBits(uint64_t* words, uint64_t first, uint64_t count) {
  for (uint64_t bit = first; bit < first + count; ++bit) {
    words[bit / 64] |= uint64_t{1} << (bit % 64);
  }
}

inline void ClearWordBits(uint64_t* words, uint64_t first, uint64_t count) {
  for (uint64_t bit = first; bit < first + count; ++bit) {
    words[bit / 64] &= ~(uint64_t{1} << (bit % 64));
  }
}

// Set bits among the first `bits` bits of `words`.
inline uint64_t CountSetWordBits(const uint64_t* words, uint64_t bits) {
  uint64_t n = 0;
  for (uint64_t w = 0; w * 64 < bits; ++w) {
    uint64_t v = words[w];
    if (bits - w * 64 < 64) v &= (uint64_t{1} << (bits - w * 64)) - 1;
    n += static_cast<uint64_t>(std::popcount(v));
  }
  return n;
}

}  // namespace nvfs
