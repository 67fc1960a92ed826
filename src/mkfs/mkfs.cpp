#include "nvfs/mkfs.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "nvfs/bitmap.hpp"
#include "nvfs/dir_block.hpp"
#include "nvfs/fresh_inode.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/superblock.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

namespace {

using format::GroupDesc;
using format::Inode;
using format::SuperDynamic;
using format::SuperStatic;

constexpr uint64_t kLostFoundIno = 2;
constexpr const char* kLostFoundName = "lost+found";

// Blocks of group 0 that mkfs fills beyond the metadata.
uint64_t RootLeafBlock(const Geometry& g) { return g.FirstDataBlock(0); }
uint64_t LostFoundLeafBlock(const Geometry& g) { return g.FirstDataBlock(0) + 1; }

void SetBits(std::vector<std::byte>& bitmap, uint64_t first, uint64_t count) {
  SetBitsInBuffer(bitmap.data(), first, count);
}

uint64_t CountBits(const std::vector<std::byte>& bitmap, uint64_t bits) {
  return CountSetBits(bitmap.data(), bits);
}

// The in-use bits of group `group`'s block bitmap: its metadata, bits past the
// end of a short last group, the backup superblock block, and in group 0 the
// two directory leaves.
void BuildBlockBitmap(const Geometry& g, uint32_t group, std::vector<std::byte>& bitmap) {
  std::fill(bitmap.begin(), bitmap.end(), std::byte{0});
  SetBits(bitmap, 0, g.GroupMetaBlocks(group));
  const uint64_t blocks = g.GroupBlocks(group);
  if (blocks < g.blocks_per_group()) SetBits(bitmap, blocks, g.blocks_per_group() - blocks);
  if (group == 0) {
    SetBits(bitmap, RootLeafBlock(g), 1);
    SetBits(bitmap, LostFoundLeafBlock(g), 1);
  }
  if (group == g.group_count() - 1) {
    SetBits(bitmap, g.BackupBlock() - g.GroupFirstBlock(group), 1);
  }
}

// Inode bits: inode 0 (reserved), root and lost+found in group 0; bits past
// inodes_per_group in every group.
void BuildInodeBitmap(const Geometry& g, uint32_t group, std::vector<std::byte>& bitmap) {
  std::fill(bitmap.begin(), bitmap.end(), std::byte{0});
  SetBits(bitmap, g.inodes_per_group(), g.blocks_per_group() - g.inodes_per_group());
  if (group == 0) SetBits(bitmap, 0, kLostFoundIno + 1);
}

Inode MakeDirInode(uint16_t perm, uint32_t nlink, const MkfsPlan& plan, int64_t now,
                   uint32_t generation, uint64_t leaf_block, uint64_t entries,
                   uint32_t block_size) {
  Inode inode = FreshInode(S_IFDIR | perm, plan.root_uid, plan.root_gid, format::kRootIno,
                           timespec{.tv_sec = now, .tv_nsec = 0}, generation);
  inode.nlink = nlink;
  inode.size = block_size;
  inode.blocks = 1;
  inode.map.dir.root = leaf_block;  // a leaf: the index bit is clear
  inode.map.dir.entries = entries;
  return inode;
}

}  // namespace

Result<MkfsPlan> PlanMkfs(uint64_t namespace_size, const MkfsOptions& options) {
  GeometryRequest request;
  request.namespace_size = namespace_size;
  request.block_size = options.block_size;
  request.inode_count = options.inode_count;
  request.bytes_per_inode = options.bytes_per_inode;
  request.journal_slots = options.journal_slots;
  request.journal_slot_size = options.journal_slot_size;
  request.feature_incompat = options.feature_incompat;
  Result<Geometry> geometry = Geometry::Compute(request);
  if (!geometry.ok()) return geometry.take_error();
  if (options.label.size() >= sizeof(SuperStatic::label)) {
    return MakeError(EINVAL, "label too long: %zu bytes, at most %zu", options.label.size(),
                     sizeof(SuperStatic::label) - 1);
  }

  MkfsPlan plan;
  plan.geometry = geometry.value();
  const Geometry& g = plan.geometry;
  SuperStatic& sb = plan.super;
  std::memcpy(sb.magic, format::kSuperStaticMagic, sizeof sb.magic);
  sb.version_major = format::kVersionMajor;
  sb.version_minor = format::kVersionMinor;
  g.FillSuper(&sb);
  const Uuid uuid = options.uuid ? *options.uuid : RandomUuid();
  std::memcpy(sb.uuid, uuid.data(), sizeof sb.uuid);
  std::memcpy(sb.label, options.label.data(), options.label.size());
  if (options.dir_hash_key) {
    std::memcpy(sb.dir_hash_key, options.dir_hash_key->data(), sizeof sb.dir_hash_key);
  } else if (!FillSecret(sb.dir_hash_key, sizeof sb.dir_hash_key)) {
    return MakeError(EIO, "cannot draw the directory hash key: getrandom: %s",
                     std::strerror(errno));
  }
  sb.mkfs_time = options.now ? options.now : static_cast<int64_t>(std::time(nullptr));
  sb.checksum = SuperStaticChecksum(sb);
  plan.first_generation = static_cast<uint32_t>(RandomU64());
  plan.root_uid = options.root_uid;
  plan.root_gid = options.root_gid;
  plan.preallocate = options.preallocate;

  std::vector<std::byte> bitmap(g.block_size());
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    BuildBlockBitmap(g, group, bitmap);
    plan.free_blocks += g.GroupBlocks(group) - CountBits(bitmap, g.GroupBlocks(group));
  }
  plan.free_inodes = g.inode_count() - (kLostFoundIno + 1);
  return plan;
}

Status WriteMkfs(Media& media, const MkfsPlan& plan,
                 const std::function<void(uint64_t, uint64_t)>& progress) {
  const Geometry& g = plan.geometry;
  if (g.bytes() > media.size()) {
    return MakeError(ENOSPC, "%s: namespace shrank under mkfs", media.path().c_str());
  }
  const SuperStatic& sb = plan.super;
  const int64_t now = sb.mkfs_time;
  const uint64_t bs = g.block_size();

  // (0) The host backs every byte written below (the image may be sparse,
  // and a store into a page the host cannot supply is a SIGBUS); with
  // `preallocate`, the whole namespace. Nothing is written before.
  if (plan.preallocate) {
    NVFS_TRY(media.Back(0, g.bytes()));
  } else {
    NVFS_TRY(BackMetadata(media, g));
    NVFS_TRY(media.Back(g.BlockOffset(RootLeafBlock(g)), 2 * bs));
    NVFS_TRY(media.Back(g.InodeOffset(format::kRootIno), 2 * sizeof(Inode)));
  }

  // (1) Nothing may look like a filesystem while we work. An nvfs static
  // superblock is wiped whole, and so are the places the new copies go
  // (where a crashed mkfs may have left an old copy without its magic): with
  // only the magic cleared, an old copy came back to life when a torn write
  // of the new one put the same magic back over the old fields and checksum,
  // pairing the old superblock with the new metadata.
  for (const Signature& sig : DetectSignatures(media.base(), media.size())) {
    const bool nvfs_super = sig.name.rfind("nvfs", 0) == 0;
    const uint64_t len =
        nvfs_super ? std::min<uint64_t>(sizeof(SuperStatic), media.size() - sig.offset) : sig.length;
    media.Fill(sig.offset, 0, len);
    media.Flush(sig.offset, len);
  }
  for (const uint64_t offset : {uint64_t{format::kSuperStaticOffset}, g.BackupSuperOffset()}) {
    media.Fill(offset, 0, sizeof(SuperStatic));
    media.Flush(offset, sizeof(SuperStatic));
  }
  media.Drain();

  // (2) Group metadata. Inode tables are not cleared: an inode is defined only
  // while its bitmap bit is set, and allocation initialises it whole.
  std::vector<std::byte> block(bs);
  const uint64_t total = g.group_count();
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    BuildBlockBitmap(g, group, block);
    const uint64_t used_blocks = CountBits(block, g.GroupBlocks(group));
    media.Store(g.BlockOffset(g.BlockBitmapBlock(group)), block.data(), bs);
    media.Flush(g.BlockOffset(g.BlockBitmapBlock(group)), bs);

    BuildInodeBitmap(g, group, block);
    const uint64_t used_inodes = CountBits(block, g.inodes_per_group());
    media.Store(g.BlockOffset(g.InodeBitmapBlock(group)), block.data(), bs);
    media.Flush(g.BlockOffset(g.InodeBitmapBlock(group)), bs);

    std::fill(block.begin(), block.end(), std::byte{0});
    GroupDesc desc{};
    desc.magic = format::kGroupDescMagic;
    desc.group = group;
    desc.free_blocks = static_cast<uint32_t>(g.GroupBlocks(group) - used_blocks);
    desc.free_inodes = static_cast<uint32_t>(g.inodes_per_group() - used_inodes);
    desc.used_dirs = group == 0 ? 2 : 0;
    desc.checksum = GroupDescChecksum(desc);
    std::memcpy(block.data(), &desc, sizeof desc);
    media.Store(g.BlockOffset(g.GroupDescBlock(group)), block.data(), bs);
    media.Flush(g.BlockOffset(g.GroupDescBlock(group)), bs);
    if (progress) progress(group + 1, total);
  }

  // The journal: every slot idle, record areas cleared so no stale record can
  // ever pass for a current one.
  const uint64_t journal = g.BlockOffset(g.journal_block());
  const uint64_t journal_bytes = uint64_t{g.journal_blocks()} * bs;
  media.Fill(journal, 0, journal_bytes);
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    const format::JournalSlotHeader header = IdleJournalSlotHeader(slot);
    media.Store(g.JournalSlotOffset(slot), &header, sizeof header);
  }
  media.Flush(journal, journal_bytes);

  // Root and lost+found.
  DirLeafBuilder root_leaf(block, 0, 0);
  const uint64_t key = DirKey(DirHash(NameHash(NameHashKey::FromSuper(sb), kLostFoundName)), 0);
  root_leaf.Add(kLostFoundIno, key, DT_DIR, kLostFoundName);
  media.Store(g.BlockOffset(RootLeafBlock(g)), block.data(), bs);
  media.Flush(g.BlockOffset(RootLeafBlock(g)), bs);
  DirLeafBuilder lost_found_leaf(block, 0, 0);
  media.Store(g.BlockOffset(LostFoundLeafBlock(g)), block.data(), bs);
  media.Flush(g.BlockOffset(LostFoundLeafBlock(g)), bs);

  const Inode root = MakeDirInode(0755, 3, plan, now, plan.first_generation, RootLeafBlock(g), 1,
                                  g.block_size());
  const Inode lost_found = MakeDirInode(0700, 2, plan, now, plan.first_generation + 1,
                                        LostFoundLeafBlock(g), 0, g.block_size());
  media.Store(g.InodeOffset(format::kRootIno), &root, sizeof root);
  media.Store(g.InodeOffset(kLostFoundIno), &lost_found, sizeof lost_found);
  media.Flush(g.InodeOffset(format::kRootIno), 2 * sizeof(Inode));
  media.Drain();

  // (3) Dynamic half and the backup copy of the static half.
  SuperDynamic dyn{};
  std::memcpy(dyn.magic, format::kSuperDynamicMagic, sizeof dyn.magic);
  dyn.state = static_cast<uint32_t>(format::FsState::kClean);
  dyn.write_time = now;
  dyn.free_blocks = plan.free_blocks;
  dyn.free_inodes = plan.free_inodes;
  dyn.next_generation = uint64_t{plan.first_generation} + 2;
  dyn.checksum = SuperDynamicChecksum(dyn);
  media.Store(format::kSuperDynamicOffset, &dyn, sizeof dyn);
  media.Flush(format::kSuperDynamicOffset, sizeof dyn);
  media.Store(g.BackupSuperOffset(), &sb, sizeof sb);
  media.Flush(g.BackupSuperOffset(), sizeof sb);
  media.Drain();

  // (4) The primary static half makes it an nvfs namespace.
  media.Store(format::kSuperStaticOffset, &sb, sizeof sb);
  media.Persist(format::kSuperStaticOffset, sizeof sb);
  return Status::Ok();
}

}  // namespace nvfs
