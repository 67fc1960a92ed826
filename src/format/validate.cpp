#include "nvfs/validate.hpp"

namespace nvfs {

FileMapLayout::FileMapLayout(uint32_t block_shift) : block_shift_(block_shift) {
  const uint64_t ptrs = uint64_t{1} << (block_shift - 3);
  uint64_t total = format::kDirectPointers;
  uint64_t range = 1;
  for (uint32_t depth = 1; depth <= format::kIndirectPointers; ++depth) {
    range = SaturatingMul(range, ptrs);
    start_[depth] = total;
    total = SaturatingAdd(total, range);
  }
  start_[format::kIndirectPointers + 1] = total;
  // Files end at 2^63 - 1 bytes: the last block starts below 2^63.
  max_blocks_ = std::min(total, (uint64_t{1} << 63) >> block_shift);
  for (uint32_t depth = 1; depth <= format::kIndirectPointers && start_[depth] < max_blocks_;
       ++depth) {
    max_depth_ = depth;
  }
}

uint64_t FileMapLayout::max_size() const {
  return std::min<uint64_t>(max_blocks_ << block_shift_, (uint64_t{1} << 63) - 1);
}

DirEntryFault CheckDirEntry(const format::DirEntry& record, const char* name,
                            uint32_t prefix_bits, uint64_t prefix, const NameHashKey* hash_key) {
  const uint32_t len = record.name_len;
  if (len == 0 || len > record.rec_len - sizeof(format::DirEntry)) {
    return DirEntryFault::kNameLength;
  }
  if (hash_key != nullptr &&
      (std::memchr(name, '/', len) != nullptr || std::memchr(name, 0, len) != nullptr ||
       (len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))) {
    return DirEntryFault::kName;
  }
  if (record.key > format::kDirKeyMax) return DirEntryFault::kKey;
  const uint64_t hash = record.key >> format::kDirSeqBits;
  if (hash_key != nullptr && hash != DirHash(NameHash(*hash_key, {name, len}))) {
    return DirEntryFault::kKeyNotHash;
  }
  if ((hash >> (format::kDirHashBits - prefix_bits)) != prefix) return DirEntryFault::kPrefix;
  return DirEntryFault::kNone;
}

}  // namespace nvfs
