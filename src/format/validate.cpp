#include "nvfs/validate.hpp"

#include "nvfs/crc32c.hpp"

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
  if (!DirNameLengthValid(record)) return DirEntryFault::kNameLength;
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

namespace nvfs {

AclFault DecodeAcl(std::string_view value, std::vector<format::AclXattrEntry>* entries) {
  using format::AclXattrEntry;
  constexpr size_t kHeader = sizeof(format::AclXattrHeader);
  if (value.size() < kHeader + sizeof(AclXattrEntry) ||
      (value.size() - kHeader) % sizeof(AclXattrEntry) != 0 ||
      (value.size() - kHeader) / sizeof(AclXattrEntry) > format::kAclEntriesMax) {
    return AclFault::kSize;
  }
  format::AclXattrHeader header;
  std::memcpy(&header, value.data(), sizeof header);
  if (header.version != format::kAclXattrVersion) return AclFault::kVersion;
  const size_t count = (value.size() - kHeader) / sizeof(AclXattrEntry);
  // The order posix_acl_valid requires: entries in non-decreasing stage —
  // 0 the owner, 1 named users, 2 the owning group, 3 named groups, 4 the
  // mask, 5 other —, stages 0, 2 and 5 exactly once, 4 at most once and
  // required by any entry of stages 1 and 3.
  int last = -1;
  unsigned seen = 0;
  const size_t first = entries != nullptr ? entries->size() : 0;
  const auto fail = [&](AclFault fault) {
    if (entries != nullptr) entries->resize(first);
    return fault;
  };
  for (size_t i = 0; i < count; ++i) {
    AclXattrEntry e;
    std::memcpy(&e, value.data() + kHeader + i * sizeof e, sizeof e);
    if (e.perm & ~(format::kAclRead | format::kAclWrite | format::kAclExecute)) {
      return fail(AclFault::kPerm);
    }
    int stage;
    switch (e.tag) {
      case format::kAclUserObj: stage = 0; break;
      case format::kAclUser: stage = 1; break;
      case format::kAclGroupObj: stage = 2; break;
      case format::kAclGroup: stage = 3; break;
      case format::kAclMask: stage = 4; break;
      case format::kAclOther: stage = 5; break;
      default: return fail(AclFault::kTag);
    }
    const bool named = stage == 1 || stage == 3;
    if (stage < last || (stage == last && !named)) return fail(AclFault::kOrder);
    if (named && e.id == format::kAclUndefinedId) return fail(AclFault::kId);
    last = stage;
    seen |= 1u << stage;
    if (entries != nullptr) entries->push_back(e);
  }
  constexpr unsigned kBase = 1u << 0 | 1u << 2 | 1u << 5;
  const bool needs_mask = seen & (1u << 1 | 1u << 3);
  if ((seen & kBase) != kBase || (needs_mask && !(seen & (1u << 4)))) {
    return fail(AclFault::kOrder);
  }
  return AclFault::kNone;
}

const char* AclFaultName(AclFault fault) {
  switch (fault) {
    case AclFault::kNone: return "valid";
    case AclFault::kSize: return "not a whole number of entries";
    case AclFault::kVersion: return "of an unknown version";
    case AclFault::kPerm: return "granting unknown permissions";
    case AclFault::kTag: return "holding an entry of unknown type";
    case AclFault::kOrder: return "holding entries out of order, or missing one";
    case AclFault::kId: return "naming an undefined user or group";
  }
  return "?";
}

uint32_t JournalRecordChecksum(const format::JournalRecord& header, const std::byte* payload,
                               uint32_t payload_len) {
  format::JournalRecord copy = header;
  copy.checksum = 0;
  const uint32_t crc = Crc32c(0, &copy, sizeof copy);
  return Crc32c(crc, payload, payload_len);
}

}  // namespace nvfs
