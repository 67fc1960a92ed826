// Directory leaves (format.hpp, "Directories") built in a DRAM buffer before
// they are written to the media: mkfs uses it for the root and lost+found, the
// core for new leaves made aside and then published.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "nvfs/format.hpp"

namespace nvfs {

class DirLeafBuilder {
 public:
  // Starts an empty leaf covering the hashes whose first `prefix_bits` bits
  // are `prefix`: a header and one free record spanning the rest of `block`.
  // REQUIRES: block.size() is a block size.
  DirLeafBuilder(std::span<std::byte> block, uint16_t prefix_bits, uint64_t prefix);

  // Appends an entry in the free tail. Returns false, changing nothing, when
  // it does not fit. REQUIRES: 1 <= name.size() <= kNameMax, ino != 0.
  bool Add(uint64_t ino, uint64_t key, uint8_t file_type, std::string_view name);

 private:
  std::span<std::byte> block_;
  uint32_t tail_ = 0;  // offset of the free record at the end
};

}  // namespace nvfs
