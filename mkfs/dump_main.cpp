// nvfs-dump: prints what an nvfs namespace holds (like dumpe2fs): the
// superblock, the groups, the journal slots and the root directory. Read-only.
#include <getopt.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <span>
#include <string>
#include <string_view>

#include "nvfs/bitmap.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/media.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/superblock.hpp"
#include "nvfs/validate.hpp"

namespace {

constexpr const char* kUsage =
    "Usage: nvfs-dump [-g] [-V] DEVICE\n"
    "Prints the superblock, journal slots and root directory of an nvfs namespace.\n"
    "\n"
    "  -g             also print one line per group\n"
    "  -V, --version  print the version and exit\n"
    "  -h, --help     print this help and exit\n";

std::string Time(int64_t seconds) {
  if (seconds == 0) return "never";
  char buf[64];
  const time_t t = static_cast<time_t>(seconds);
  struct tm tm;
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The directory hash key is a secret: only whether it is set, and a 32-bit
// fingerprint to tell keys apart (SipHash of an input that no name can be,
// so it equals no name's hash and tells nothing about other hashes).
std::string HashKeyNote(const nvfs::format::SuperStatic& sb) {
  const nvfs::NameHashKey key = nvfs::NameHashKey::FromSuper(sb);
  if (key.k0 == 0 && key.k1 == 0) return "SipHash-2-4, key NOT SET (all zero)";
  static constexpr char kInput[] = "\0nvfs-dump/fingerprint";
  const uint64_t print = nvfs::SipHash24(key.k0, key.k1, kInput, sizeof kInput - 1);
  char buf[80];
  std::snprintf(buf, sizeof buf, "SipHash-2-4, 128-bit key set (fingerprint %08" PRIx32 ")",
                static_cast<uint32_t>(print >> 32));
  return buf;
}

void PrintRootLeaf(const std::byte* base, const nvfs::Geometry& g, uint64_t block) {
  if (block == 0 || (block & nvfs::format::kDirNodeIndexBit) != 0 ||
      block >= g.block_count()) {
    std::printf("  (root is not a single leaf; not listed)\n");
    return;
  }
  const std::byte* leaf = base + g.BlockOffset(block);
  nvfs::format::DirLeafHeader header;
  std::memcpy(&header, leaf, sizeof header);
  if (header.magic != nvfs::format::kDirLeafMagic) {
    std::printf("  (bad leaf magic)\n");
    return;
  }
  // The records as the core and fsck walk them (WalkDirLeaf).
  uint32_t stop = 0;
  const nvfs::DirRecordFault fault = nvfs::WalkDirLeaf(
      std::span<const std::byte>(leaf, g.block_size()),
      [](uint32_t, const nvfs::format::DirEntry& record) {
        if (record.ino != 0 && nvfs::DirNameLengthValid(record)) {
          const std::string_view name = nvfs::DirRecordName(record);
          std::printf("  %-24.*s ino %-8" PRIu64 " type %u key 0x%016" PRIx64 "\n",
                      static_cast<int>(name.size()), name.data(), record.ino,
                      record.file_type, record.key);
        }
        return true;
      },
      &stop);
  if (fault != nvfs::DirRecordFault::kNone) std::printf("  (bad record at offset %u)\n", stop);
}

}  // namespace

int main(int argc, char** argv) {
  bool groups = false;
  static const option kLong[] = {{"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {nullptr, 0, nullptr, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "gVh", kLong, nullptr)) != -1) {
    switch (opt) {
      case 'g': groups = true; break;
      case 'V': std::printf("nvfs-dump %s\n", NVFS_VERSION); return 0;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: std::fputs(kUsage, stderr); return 1;
    }
  }
  if (optind + 1 != argc) {
    std::fprintf(stderr, "nvfs-dump: %s\n%s", optind >= argc ? "no DEVICE given" : "too many arguments", kUsage);
    return 1;
  }
  nvfs::MediaOptions options;
  options.read_only = true;
  options.lock = false;  // a look only; works beside a mounted filesystem
  auto media = nvfs::OpenMedia(argv[optind], options);
  if (!media.ok()) {
    std::fprintf(stderr, "nvfs-dump: %s\n", media.error().message.c_str());
    return 1;
  }
  if (const std::string exposure = nvfs::NamespaceExposure(argv[optind]); !exposure.empty()) {
    std::fprintf(stderr, "nvfs-dump: warning: %s\n", exposure.c_str());
  }
  const std::byte* base = (*media)->base();
  auto found = nvfs::FindSuper(base, (*media)->size());
  if (!found.ok()) {
    std::fprintf(stderr, "nvfs-dump: %s: %s\n", argv[optind], found.error().message.c_str());
    return 1;
  }
  const nvfs::format::SuperStatic& sb = found->sb;
  const nvfs::Geometry& g = found->geometry;
  if (found->from_backup) {
    std::printf("WARNING: primary superblock damaged (%s); showing the backup copy\n",
                found->primary_error.c_str());
  }
  nvfs::Uuid uuid;
  std::memcpy(uuid.data(), sb.uuid, uuid.size());
  std::printf("Filesystem:          nvfs %u.%u\n", sb.version_major, sb.version_minor);
  std::printf("UUID:                %s\n", nvfs::FormatUuid(uuid).c_str());
  std::printf("Label:               \"%.*s\"\n", static_cast<int>(strnlen(sb.label, sizeof sb.label)), sb.label);
  std::printf("Features:            compat 0x%" PRIx64 ", incompat 0x%" PRIx64 "%s, ro_compat 0x%" PRIx64 "\n",
              sb.feature_compat, sb.feature_incompat,
              (sb.feature_incompat & nvfs::format::kIncompatXattrChain) ? " (xattr_chain)" : "",
              sb.feature_ro_compat);
  std::printf("Created:             %s\n", Time(sb.mkfs_time).c_str());
  std::printf("Directory hash:      %s\n", HashKeyNote(sb).c_str());
  std::printf("Size:                %s (%" PRIu64 " blocks of %u bytes)\n",
              nvfs::FormatSize(g.bytes()).c_str(), g.block_count(), g.block_size());
  std::printf("Groups:              %u of %u blocks, %u inodes each (%u inode-table blocks)\n",
              g.group_count(), g.blocks_per_group(), g.inodes_per_group(), g.itable_blocks());
  std::printf("Inodes:              %" PRIu64 "\n", g.inode_count());
  std::printf("Journal:             %u slots of %u bytes at block %" PRIu64 " (%u blocks)\n",
              g.journal_slots(), g.journal_slot_size(), g.journal_block(), g.journal_blocks());
  std::printf("Backup superblock:   byte %" PRIu64 "\n", g.BackupSuperOffset());
  std::printf("Store granularity:   %s\n", nvfs::GranularityName((*media)->granularity()));

  nvfs::format::SuperDynamic dyn;
  std::memcpy(&dyn, base + nvfs::format::kSuperDynamicOffset, sizeof dyn);
  nvfs::Status dyn_ok = nvfs::CheckSuperDynamic(dyn);
  if (!dyn_ok.ok()) {
    std::printf("Dynamic superblock:  %s\n", dyn_ok.error().message.c_str());
  } else {
    std::printf("State:               %s%s\n",
                dyn.state == static_cast<uint32_t>(nvfs::format::FsState::kClean) ? "clean"
                                                                                   : "not clean",
                dyn.errors ? ", errors recorded" : "");
    std::printf("Mounts:              %" PRIu64 " (last %s)\n", dyn.mount_count, Time(dyn.mount_time).c_str());
    std::printf("Free (at last write):%" PRIu64 " blocks, %" PRIu64 " inodes\n", dyn.free_blocks, dyn.free_inodes);
    std::printf("Orphan list head:    %" PRIu64 "\n", dyn.orphan_head);
  }

  uint64_t free_blocks = 0, free_inodes = 0;
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    const uint64_t used_b = nvfs::CountSetBits(base + g.BlockOffset(g.BlockBitmapBlock(group)), g.GroupBlocks(group));
    const uint64_t used_i = nvfs::CountSetBits(base + g.BlockOffset(g.InodeBitmapBlock(group)), g.inodes_per_group());
    free_blocks += g.GroupBlocks(group) - used_b;
    free_inodes += g.inodes_per_group() - used_i;
    if (groups) {
      std::printf("Group %u: blocks %" PRIu64 "-%" PRIu64 ", bitmap %" PRIu64 ", descriptor %" PRIu64
                  ", inode bitmap %" PRIu64 ", inode table %" PRIu64 "-%" PRIu64 ", %" PRIu64
                  " free blocks, %" PRIu64 " free inodes\n",
                  group, g.GroupFirstBlock(group), g.GroupFirstBlock(group) + g.GroupBlocks(group) - 1,
                  g.BlockBitmapBlock(group), g.GroupDescBlock(group), g.InodeBitmapBlock(group),
                  g.InodeTableBlock(group), g.InodeTableBlock(group) + g.itable_blocks() - 1,
                  g.GroupBlocks(group) - used_b, g.inodes_per_group() - used_i);
    }
  }
  std::printf("Free (bitmaps):      %" PRIu64 " blocks (%s), %" PRIu64 " inodes\n", free_blocks,
              nvfs::FormatSize(free_blocks * g.block_size()).c_str(), free_inodes);
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    nvfs::format::JournalSlotHeader header;
    std::memcpy(&header, base + g.JournalSlotOffset(slot), sizeof header);
    if (header.state != 0) {
      std::printf("Journal slot %u:      state %u, tx %" PRIu64 "\n", slot, header.state, header.tx_seq);
    }
  }
  nvfs::format::Inode root;
  std::memcpy(&root, base + g.InodeOffset(nvfs::format::kRootIno), sizeof root);
  // The root inode checked as the core and fsck check every inode.
  const nvfs::InodeFaults faults =
      nvfs::ValidateInode(root, nvfs::FileMapLayout(g.block_shift()).max_size());
  if (faults != 0) {
    std::printf("Root directory:      inode damaged (%s)\n", nvfs::InodeFaultName(faults));
  } else if (!S_ISDIR(root.mode)) {
    std::printf("Root directory:      inode is not a directory (mode 0%o)\n", root.mode);
  } else {
    std::printf("Root directory (%" PRIu64 " entries):\n", root.map.dir.entries);
    PrintRootLeaf(base, g, root.map.dir.root);
  }
  return 0;
}
