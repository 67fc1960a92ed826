#include "nvfs/superblock.hpp"

#include <cinttypes>
#include <cstring>

#include "nvfs/crc32c.hpp"

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

Result<FoundSuper> FindSuper(const std::byte* base, uint64_t size) {
  FoundSuper found;
  if (size < format::kMinBlockSize) {
    return MakeError(EUCLEAN, "namespace too small to hold an nvfs superblock");
  }
  std::memcpy(&found.sb, base + format::kSuperStaticOffset, sizeof found.sb);
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
