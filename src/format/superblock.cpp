#include "nvfs/superblock.hpp"

#include <cinttypes>
#include <cstring>
#include <vector>

#include "nvfs/crc32c.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

namespace {

template <class T>
uint32_t ChecksumBefore(const T& object, size_t checksum_offset) {
  return Crc32c(0, &object, checksum_offset);
}

}  // namespace

uint32_t SuperStaticChecksum(const format::SuperStatic& sb) {
  return ChecksumBefore(sb, offsetof(format::SuperStatic, checksum));
}

uint32_t SuperDynamicChecksum(const format::SuperDynamic& sb) {
  return ChecksumBefore(sb, offsetof(format::SuperDynamic, checksum));
}

uint32_t GroupDescChecksum(const format::GroupDesc& desc) {
  return ChecksumBefore(desc, offsetof(format::GroupDesc, checksum));
}

Result<Geometry> CheckSuperStatic(const format::SuperStatic& sb, uint64_t namespace_size) {
  if (std::memcmp(sb.magic, format::kSuperStaticMagic, sizeof sb.magic) != 0) {
    return MakeError(EUCLEAN, "no nvfs superblock (bad magic)");
  }
  if (sb.checksum != SuperStaticChecksum(sb)) {
    return MakeError(EUCLEAN, "superblock checksum mismatch (stored 0x%08x, computed 0x%08x)",
                     sb.checksum, SuperStaticChecksum(sb));
  }
  if (sb.version_major == 1) {
    return MakeError(EPROTONOSUPPORT,
                     "nvfs format 1.%u is no longer supported (its directory hash can be "
                     "steered by users): copy the files off with an older nvfs and re-create "
                     "the filesystem with this mkfs.nvfs",
                     sb.version_minor);
  }
  if (sb.version_major != format::kVersionMajor) {
    return MakeError(EPROTONOSUPPORT, "unsupported nvfs format version %u.%u (this is %u.%u)",
                     sb.version_major, sb.version_minor, format::kVersionMajor,
                     format::kVersionMinor);
  }
  const uint64_t unknown = sb.feature_incompat & ~format::kIncompatKnown;
  if (unknown != 0) {
    return MakeError(EPROTONOSUPPORT,
                     "unknown incompatible features 0x%" PRIx64 ": this nvfs is too old for "
                     "the namespace",
                     unknown);
  }
  return Geometry::FromSuper(sb, namespace_size);
}

Status CheckSuperDynamic(const format::SuperDynamic& sb) {
  if (std::memcmp(sb.magic, format::kSuperDynamicMagic, sizeof sb.magic) != 0) {
    return MakeError(EUCLEAN, "dynamic superblock: bad magic");
  }
  if (sb.checksum != SuperDynamicChecksum(sb)) {
    return MakeError(EUCLEAN, "dynamic superblock: checksum mismatch");
  }
  if (sb.state != static_cast<uint32_t>(format::FsState::kClean) &&
      sb.state != static_cast<uint32_t>(format::FsState::kMounted)) {
    return MakeError(EUCLEAN, "dynamic superblock: unknown state %u", sb.state);
  }
  return Status::Ok();
}

bool UndoInterruptedGrow(const std::byte* base, uint64_t size, format::SuperStatic* sb) {
  using format::JournalRecord;
  using format::JournalSlotHeader;
  // The journal's place, from fields a grow leaves alone; any doubt about
  // them and there is nothing to undo (the primary is then checked as it is).
  const uint64_t bs = sb->block_size;
  if (bs < format::kMinBlockSize || bs > format::kMaxBlockSize || (bs & (bs - 1)) != 0) {
    return false;
  }
  if (sb->journal_slots == 0 || sb->journal_slots > kMaxJournalSlots ||
      sb->journal_slot_size % 64 != 0 || sb->journal_slot_size < 4096 ||
      sb->journal_slot_size > kMaxJournalSlotSize) {
    return false;
  }
  if (sb->journal_block == 0 || sb->journal_block >= size / bs) return false;
  const uint64_t journal = sb->journal_block * bs;
  const uint64_t journal_bytes = uint64_t{sb->journal_slots} * sb->journal_slot_size;
  if (journal_bytes > size - journal) return false;
  struct Undo {
    uint64_t target;
    uint32_t length;
    const std::byte* payload;
  };
  std::vector<Undo> undo;
  for (uint32_t slot = 0; slot < sb->journal_slots; ++slot) {
    const uint64_t slot_offset = journal + uint64_t{slot} * sb->journal_slot_size;
    JournalSlotHeader header;
    std::memcpy(&header, base + slot_offset, sizeof header);
    if (!JournalSlotHeaderValid(header, slot) ||
        header.state != static_cast<uint32_t>(format::JournalState::kActive)) {
      continue;
    }
    // The grow's records for the primary come first in its slot; the first
    // record that is not one ends them (as the first invalid record ends a log).
    uint64_t pos = sizeof(JournalSlotHeader);
    while (pos + sizeof(JournalRecord) <= sb->journal_slot_size) {
      JournalRecord record;
      std::memcpy(&record, base + slot_offset + pos, sizeof record);
      if (record.tx_seq != header.tx_seq ||
          record.type != static_cast<uint16_t>(format::JournalRecordType::kUndo) ||
          record.length == 0 || record.target >= format::kSuperHalfSize ||
          record.length > format::kSuperHalfSize - record.target ||
          record.length > sb->journal_slot_size - pos - sizeof record) {
        break;
      }
      const std::byte* payload = base + slot_offset + pos + sizeof record;
      if (record.checksum != JournalRecordChecksum(record, payload, record.length)) break;
      undo.push_back({record.target, record.length, payload});
      pos += sizeof record + ((uint64_t{record.length} + 7) & ~uint64_t{7});
    }
  }
  // In reverse, as recovery applies them.
  for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
    std::memcpy(reinterpret_cast<std::byte*>(sb) + it->target, it->payload, it->length);
  }
  return !undo.empty();
}

Result<FoundSuper> FindSuper(const std::byte* base, uint64_t size) {
  FoundSuper found;
  if (size < format::kMinBlockSize) {
    return MakeError(EUCLEAN, "namespace too small to hold an nvfs superblock");
  }
  std::memcpy(&found.sb, base + format::kSuperStaticOffset, sizeof found.sb);
  found.grow_undone = UndoInterruptedGrow(base, size, &found.sb);
  Result<Geometry> primary = CheckSuperStatic(found.sb, size);
  if (primary.ok()) {
    found.geometry = primary.value();
    return found;
  }
  // Version and feature refusals are not damage: do not go looking elsewhere.
  if (primary.error().code != EUCLEAN) return primary.take_error();
  Error primary_error = primary.take_error();
  Result<FoundSuper> backup = primary_error;
  ForEachBackupCandidate(size, [&](uint64_t offset, uint32_t block_size) {
    if (backup.ok()) return;
    format::SuperStatic copy;
    std::memcpy(&copy, base + offset, sizeof copy);
    if (copy.block_size != block_size) return;
    Result<Geometry> geometry = CheckSuperStatic(copy, size);
    if (!geometry.ok() || geometry->BackupSuperOffset() != offset) return;
    FoundSuper b;
    b.geometry = geometry.value();
    b.sb = copy;
    b.from_backup = true;
    b.primary_error = primary_error.message;
    backup = std::move(b);
  });
  return backup;
}

}  // namespace nvfs
