// Mount, unmount and statfs: the filesystem's life as a whole. The inode
// helpers every operation uses are in inode_access.cpp, inode allocation in
// ialloc.cpp, the orphan list in orphan.cpp, truncation in truncate.cpp and
// the freeing of unlinked inodes in reclaim.cpp.
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "fs/damage.hpp"
#include "fs/fs_impl.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/media.hpp"
#include "nvfs/superblock.hpp"
#include "nvfs/epoch.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::Inode;
using format::SuperDynamic;

FsImpl::FsImpl() = default;

FsImpl::~FsImpl() {
  if (mounted_) (void)Unmount();
  // Extent maps replaced while mounted and not yet freed: none outlives the
  // filesystem (they hold addresses in its mapping).
  epoch::Barrier();
}

uint32_t FsImpl::block_size() const { return geometry_->block_size(); }
const Geometry& FsImpl::geometry() const { return *geometry_; }
size_t FsImpl::cached_inodes() const { return cache_->size(); }

Result<std::unique_ptr<Filesystem>> Filesystem::Mount(const std::string& path,
                                                      const MountOptions& options) {
  MediaOptions media_options;
  media_options.read_only = options.read_only;
  media_options.min_size = Geometry::MinNamespaceSize(format::kMinBlockSize);
  media_options.reserve = options.grow_reserve;
  auto media = OpenMedia(path, media_options);
  if (!media.ok()) return media.take_error();
  return Mount(std::move(media.value()), options);
}

Result<std::unique_ptr<Filesystem>> Filesystem::Mount(std::unique_ptr<Media> media,
                                                      const MountOptions& options) {
  auto fs = std::make_unique<FsImpl>();
  const std::string path = media->path();
  Status st = fs->MountInternal(std::move(media), options);
  if (!st.ok()) return Error(st.code(), path + ": " + st.error().Describe());
  return std::unique_ptr<Filesystem>(std::move(fs));
}

// The dynamic superblock as journal recovery will leave it, computed on a
// copy before anything is written. Its fields and its checksum are separate
// logged stores (the orphan list changes them inside operations), so a crash
// between them leaves a checksum that only recovery makes right again.
static Result<SuperDynamic> RecoveredDynamic(const Journal& journal, const std::byte* base) {
  SuperDynamic dyn;
  std::memcpy(&dyn, base + format::kSuperDynamicOffset, sizeof dyn);
  auto* bytes = reinterpret_cast<std::byte*>(&dyn);
  const uint64_t start = format::kSuperDynamicOffset;
  const uint64_t end = start + sizeof dyn;
  Status planned = journal.PlanRecovery([&](uint32_t, const Journal::RecoveryStep& step) {
    if (step.type != format::JournalRecordType::kUndo) return;
    const uint64_t from = std::max(step.target, start);
    const uint64_t to = std::min(step.target + step.length, end);
    if (from < to) std::memcpy(bytes + (from - start), step.payload + (from - step.target), to - from);
  });
  if (!planned.ok()) return planned.take_error();
  return dyn;
}

bool FsImpl::damage_found() const { return damage_ != nullptr && damage_->seen(); }

Error FsImpl::BadMap(uint64_t ino) {
  return ctx_->Damaged(
      MakeError(EIO, "inode %" PRIu64 ": a block pointer names no data block; run fsck.nvfs", ino));
}

Status FsImpl::MountInternal(std::unique_ptr<Media> media, const MountOptions& options) {
  media_ = std::move(media);
  read_only_ = options.read_only;
  extent_map_runs_ = options.extent_map_runs;
  privs_dropped_ = options.privs_dropped;
  data_freed_ = options.data_freed;
  caller_in_group_ = options.caller_in_group;
  reclaim_fault_ = options.reclaim_fault;
  Result<FoundSuper> found = FindSuper(media_->base(), media_->size());
  if (!found.ok()) return found.take_error();
  if (found->from_backup) {
    return MakeError(EUCLEAN, "primary superblock is damaged (%s); run fsck.nvfs to restore "
                     "it from the backup", found->primary_error.c_str());
  }
  if (UnknownRoCompat(found->sb) != 0 && !read_only_) {
    return MakeError(EROFS, "unknown read-only-compatible features 0x%" PRIx64
                     "; mount read-only (-o ro)", UnknownRoCompat(found->sb));
  }
  geometry_ = std::make_unique<Geometry>(found->geometry);
  hash_key_ = NameHashKey::FromSuper(found->sb);
  const Geometry& g = *geometry_;
  journal_ = std::make_unique<Journal>(*media_, g);
  Result<SuperDynamic> dyn = RecoveredDynamic(*journal_, media_->base());
  if (!dyn.ok()) return dyn.take_error();
  Status dyn_ok = CheckSuperDynamic(*dyn);
  if (!dyn_ok.ok()) {
    return MakeError(EUCLEAN, "%s; run fsck.nvfs", dyn_ok.error().message.c_str());
  }
  // Errors recorded by an earlier mount: read-only (after recovery, which
  // only finishes or undoes what the journal holds), unless errors=continue.
  recorded_errors_ = dyn->errors != 0;
  const bool keep_read_only =
      recorded_errors_ && options.errors == ErrorBehavior::kRemountReadOnly;
  const std::byte* inode_bitmap = media_->base() + g.BlockOffset(g.InodeBitmapBlock(0));
  const auto& root = *reinterpret_cast<const Inode*>(media_->base() +
                                                     g.InodeOffset(format::kRootIno));
  if (!TestBit(inode_bitmap, format::kRootIno) || !S_ISDIR(root.mode)) {
    return MakeError(EUCLEAN, "root directory is damaged; run fsck.nvfs");
  }

  // Known bad blocks (a DAX namespace): said at mount in one line; data on
  // them fails as media errors (EIO for the request); metadata on them
  // would fail whole operations half-way, so a read-write mount is refused.
  if (!media_->bad_ranges().empty()) {
    uint64_t bytes = 0;
    for (const Media::BadRange& bad : media_->bad_ranges()) bytes += bad.length;
    char line[256];
    std::snprintf(line, sizeof line,
                  "nvfs: %s: %zu known bad block range(s), %" PRIu64 " bytes from offset %" PRIu64
                  "; reads of data on them fail with EIO",
                  media_->path().c_str(), media_->bad_ranges().size(), bytes,
                  media_->bad_ranges().front().offset);
    if (options.log) {
      options.log(line);
    } else {
      std::fprintf(stderr, "%s\n", line);
    }
  }
  for (const Media::BadRange& bad : media_->bad_ranges()) {
    if (read_only_) break;
    const auto hits = [&](uint64_t from, uint64_t len) {
      return bad.offset < from + len && from < bad.offset + bad.length;
    };
    bool meta = hits(g.BlockOffset(g.BackupBlock()), g.block_size());
    for (uint32_t group = 0; group < g.group_count() && !meta; ++group) {
      meta = hits(g.BlockOffset(g.GroupFirstBlock(group)),
                  g.GroupMetaBlocks(group) << g.block_shift());
    }
    if (meta) {
      return MakeError(EIO, "metadata lies on a known bad block (%" PRIu64 " bytes at offset %"
                       PRIu64 "); mount read-only (-o ro) and copy the data out",
                       bad.length, bad.offset);
    }
  }
  if (!read_only_) {
    // Recovery and every later operation store into the metadata regions:
    // the host must back them first (an image copied sparse, or made by an
    // older mkfs, may not be).
    Status backed = BackMetadata(*media_, g);
    if (!backed.ok()) {
      return MakeError(backed.code(), "%s; free space on the host, or mount read-only",
                       backed.error().message.c_str());
    }
    Result<Journal::RecoveryStats> recovered = journal_->Recover();
    if (!recovered.ok()) return recovered.take_error();
  } else {
    for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
      format::JournalSlotHeader header;
      std::memcpy(&header, media_->base() + g.JournalSlotOffset(slot), sizeof header);
      if (header.state != static_cast<uint32_t>(format::JournalState::kIdle)) {
        return MakeError(EROFS, "the filesystem needs recovery; mount it read-write once");
      }
    }
  }
  // Room for every group a grow into the reserved address space can add.
  const uint64_t group_bytes = uint64_t{g.blocks_per_group()} << g.block_shift();
  const uint64_t capacity = media_->reserved() / group_bytes + 1;
  alloc_ = std::make_unique<Allocator>(
      *media_, g, static_cast<uint32_t>(std::min<uint64_t>(capacity, UINT32_MAX)));
  alloc_->Load();
  alloc_->KeepReserve();
  journal_->set_sink(alloc_.get());
  damage_ = std::make_unique<DamageRecorder>(*this, media_->path(), options);
  journal_->set_loss_listener([recorder = damage_.get()](const Error& e) { recorder->Damaged(e); });
  ctx_ = std::make_unique<FsContext>(
      FsContext{*media_, g, *alloc_, *journal_, hash_key_, damage_.get()});
  bmap_ = std::make_unique<Bmap>(*ctx_);
  dir_ = std::make_unique<Directory>(*ctx_);
  cache_ = std::make_unique<InodeCache>();
  generation_state_ = RandomU64();

  if (keep_read_only) read_only_ = true;
  if (!read_only_) {
    // Before anything is allocated: blocks and inodes the bitmaps show free
    // but the inodes use are never handed out (damage, then read-only).
    CrossCheck();
    // Damage met while finishing the orphans (a damaged list, or a damaged
    // map in an orphan) leaves the rest of them to fsck: the mount goes on with
    // the superblock's error flag set, rather than fail having written (and,
    // unless errors=continue, read-only from then on).
    Status orphans = ProcessOrphans();
    if (!orphans.ok() && orphans.code() == EUCLEAN) damage_->Damaged(orphans.error());
    const bool damaged = damage_->seen();
    if (!orphans.ok() && !damaged) return orphans;
    OrphanTx tx(*this, "mount");
    const int64_t now = Now().tv_sec;
    UpdateDynamic(tx, [&](SuperDynamic& d) {
      if (damaged) d.errors = 1;
      d.state = static_cast<uint32_t>(format::FsState::kMounted);
      d.mount_count += 1;
      d.mount_time = now;
      d.write_time = now;
    });
    NVFS_TRY(tx.Commit());
    damage_->Arm();
  }
  mounted_ = true;
  cache_->set_reclaim_unlinked(!read_only_);
  return Status::Ok();
}

void FsImpl::EndService() { media_->EndService(); }

void FsImpl::ServeThroughMount(const MountName& mount) { media_->ServeThroughMount(mount); }

// Clean unmount: exact counters in every group descriptor and in the dynamic
// superblock, then state = clean, each batch in a transaction so a crash
// here leaves either the old or the new descriptors, never a torn one.
Status FsImpl::Unmount() {
  if (!mounted_) return Status::Ok();
  mounted_ = false;
  EndService();
  cache_->set_reclaim_unlinked(false);
  // The errors flag first, if damage is being recorded; a filesystem turned
  // read-only by damage then writes nothing more (its state stays mounted,
  // as after a crash).
  damage_->Flush();
  if (!media_->Intact()) {
    // A backing file cut short under the mount, or pages lost to media
    // errors: the descriptors and the superblock may lie in the lost part.
    // Nothing is written; the state stays "mounted", so fsck.nvfs runs.
    // (Said also of a read-only mount, which writes nothing anyway: the
    // namespace lost bytes, and its owner must know.)
    return MakeError(EIO, "%s while mounted (%" PRIu64 " media errors met); not marked clean: "
                     "run fsck.nvfs",
                     media_->LostPages() != 0 ? "pages of the namespace were lost"
                                              : "the namespace was cut shorter than its mapping",
                     MediaErrorCount());
  }
  if (read_only_) return Status::Ok();
  // Blocks freed while mounted and still waiting for their grace period
  // count as free in the group descriptors: nothing reads them any more.
  alloc_->ReleaseDeferred(/*wait=*/true, /*outside_too=*/true);
  const Geometry& g = *geometry_;
  uint32_t group = 0;
  while (group < g.group_count()) {
    OrphanTx tx(*this, "unmount");
    tx.LockOrphans();  // the counters, as the dynamic superblock's
    for (; group < g.group_count() && tx.room() > 1024; ++group) {
      const uint64_t offset = g.BlockOffset(g.GroupDescBlock(group));
      format::GroupDesc desc;
      std::memcpy(&desc, media_->base() + offset, sizeof desc);
      desc.magic = format::kGroupDescMagic;
      desc.group = group;
      desc.free_blocks = alloc_->group_free_blocks(group);
      desc.free_inodes = alloc_->group_free_inodes(group);
      desc.checksum = GroupDescChecksum(desc);
      if (std::memcmp(&desc, media_->base() + offset, sizeof desc) != 0) {
        tx.Store(offset, &desc, sizeof desc);
      }
    }
    NVFS_TRY(tx.Commit());
  }
  OrphanTx tx(*this, "unmount");
  const int64_t now = Now().tv_sec;
  UpdateDynamic(tx, [&](SuperDynamic& d) {
    d.state = static_cast<uint32_t>(format::FsState::kClean);
    d.free_blocks = alloc_->free_blocks();
    d.free_inodes = alloc_->free_inodes();
    d.write_time = now;
  });
  return tx.Commit();
}

Result<StatFs> FsImpl::GetStatFs() {
  StatFs st;
  st.block_size = geometry_->block_size();
  st.blocks = geometry_->block_count();
  // Blocks a direct writer inside a store holds back are in use until it
  // leaves it (nvfs/epoch.hpp, ExternalGrace).
  st.blocks_free = alloc_->free_blocks() - std::min(alloc_->free_blocks(), alloc_->held_blocks());
  // Never promise what the host cannot back: free blocks already backed
  // (every block in use is backed, so at least BackedBytes minus those in
  // use) plus what the host filesystem has left.
  const uint64_t host = media_->HostAvailable();
  if (host != Media::kBackedWhole) {
    const uint32_t shift = geometry_->block_shift();
    const uint64_t used = st.blocks - std::min(st.blocks, st.blocks_free);
    const uint64_t backed = media_->BackedBytes() >> shift;
    const uint64_t backed_free = backed > used ? backed - used : 0;
    st.blocks_free = std::min(st.blocks_free, (host >> shift) + backed_free);
  }
  // Mapping n data blocks in one file takes at most ceil(n / P) pointer
  // blocks at the lowest level, ceil(n / P^2) above, ... (P pointers a
  // block), and the root of each tree it reaches (depths 1 to 5, below):
  // a bound, as the direct pointers need none.
  const uint64_t per_block = geometry_->block_size() / sizeof(uint64_t);
  uint64_t overhead = 0;
  for (uint64_t level = st.blocks_free; level > 1;) {
    level = (level + per_block - 1) / per_block;
    overhead += level;
  }
  if (st.blocks_free > 0) overhead += 5;
  // The reserve (Allocator::reserve_blocks) is free but not available,
  // as ext4's blocks reserved for root are.
  const uint64_t reserve = alloc_->reserve_blocks();
  st.blocks_reserved = std::min(reserve, st.blocks_free);
  const uint64_t usable = st.blocks_free - st.blocks_reserved;
  st.blocks_avail = usable > overhead ? usable - overhead : 0;
  st.inodes = geometry_->inode_count();
  st.inodes_free = alloc_->free_inodes();
  st.name_max = format::kNameMax;
  return st;
}

}  // namespace nvfs
