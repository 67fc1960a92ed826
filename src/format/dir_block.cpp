#include "nvfs/dir_block.hpp"

#include <cstring>

namespace nvfs {

using format::DirEntry;
using format::DirLeafHeader;

DirLeafBuilder::DirLeafBuilder(std::span<std::byte> block, uint16_t prefix_bits,
                               uint64_t prefix)
    : block_(block), tail_(sizeof(DirLeafHeader)) {
  std::memset(block_.data(), 0, block_.size());
  DirLeafHeader header{};
  header.magic = format::kDirLeafMagic;
  header.prefix_bits = prefix_bits;
  header.prefix = prefix;
  std::memcpy(block_.data(), &header, sizeof header);
  DirEntry free_record{};
  free_record.rec_len = static_cast<uint32_t>(block_.size()) - tail_;
  std::memcpy(block_.data() + tail_, &free_record, sizeof free_record);
}

bool DirLeafBuilder::Add(uint64_t ino, uint64_t key, uint8_t file_type, std::string_view name) {
  const uint32_t free_len = static_cast<uint32_t>(block_.size()) - tail_;
  const uint32_t need = format::DirRecordLength(static_cast<uint32_t>(name.size()));
  if (need > free_len) return false;
  // A remainder too short for a record header goes to the new entry.
  const uint32_t rest = free_len - need;
  const uint32_t rec_len = rest < sizeof(DirEntry) ? free_len : need;
  DirEntry entry{};
  entry.ino = ino;
  entry.key = key;
  entry.rec_len = rec_len;
  entry.name_len = static_cast<uint8_t>(name.size());
  entry.file_type = file_type;
  std::memcpy(block_.data() + tail_, &entry, sizeof entry);
  std::memcpy(block_.data() + tail_ + sizeof entry, name.data(), name.size());
  tail_ += rec_len;
  if (tail_ < block_.size()) {
    DirEntry free_record{};
    free_record.rec_len = static_cast<uint32_t>(block_.size()) - tail_;
    std::memcpy(block_.data() + tail_, &free_record, sizeof free_record);
  }
  return true;
}

}  // namespace nvfs
