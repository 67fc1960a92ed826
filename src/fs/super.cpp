// Mount, unmount, the orphan list and the inode helpers every operation uses.
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <unordered_set>

#include "fs/damage.hpp"
#include "fs/fs_impl.hpp"
#include "util/races.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/media.hpp"
#include "nvfs/superblock.hpp"
#include "nvfs/epoch.hpp"
#include "nvfs/fresh_inode.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::Inode;
using format::SuperDynamic;

Filesystem::Filesystem() = default;

Filesystem::~Filesystem() {
  if (mounted_) (void)Unmount();
  // Extent maps replaced while mounted and not yet freed: none outlives the
  // filesystem (they hold addresses in its mapping).
  epoch::Barrier();
}

uint32_t Filesystem::block_size() const { return geometry_->block_size(); }
const Geometry& Filesystem::geometry() const { return *geometry_; }
size_t Filesystem::cached_inodes() const { return cache_->size(); }

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
  std::unique_ptr<Filesystem> fs(new Filesystem());
  const std::string path = media->path();
  fs->media_ = std::move(media);
  Status st = fs->MountInternal(options);
  if (!st.ok()) return Error(st.code(), path + ": " + st.error().Describe());
  return fs;
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

bool Filesystem::damage_found() const { return damage_ != nullptr && damage_->seen(); }

Error FsOps::BadMap(Filesystem& fs, uint64_t ino) {
  return fs.ctx_->Damaged(MakeError(EIO, "inode %" PRIu64 ": a block pointer names no data "
                                    "block; run fsck.nvfs", ino));
}

Status Filesystem::MountInternal(const MountOptions& options) {
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
    FsOps::CrossCheck(*this);
    // Damage met while finishing the orphans (a damaged list, or a damaged
    // map in an orphan) leaves the rest of them to fsck: the mount goes on with
    // the superblock's error flag set, rather than fail having written (and,
    // unless errors=continue, read-only from then on).
    Status orphans = FsOps::ProcessOrphans(*this);
    if (!orphans.ok() && orphans.code() == EUCLEAN) damage_->Damaged(orphans.error());
    const bool damaged = damage_->seen();
    if (!orphans.ok() && !damaged) return orphans;
    std::lock_guard lock(orphan_mu_);
    Tx tx(*journal_, "mount");
    const int64_t now = FsOps::Now().tv_sec;
    FsOps::UpdateDynamic(*this, tx, [&](SuperDynamic& d) {
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

void Filesystem::EndService() { media_->EndService(); }

void Filesystem::ServeThroughMount() { media_->ServeThroughMount(); }

// Clean unmount: exact counters in every group descriptor and in the dynamic
// superblock, then state = clean, each batch in a transaction so a crash
// here leaves either the old or the new descriptors, never a torn one.
Status Filesystem::Unmount() {
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
  alloc_->ReleaseDeferred(/*wait=*/true);
  const Geometry& g = *geometry_;
  std::lock_guard lock(orphan_mu_);
  uint32_t group = 0;
  while (group < g.group_count()) {
    Tx tx(*journal_, "unmount");
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
  Tx tx(*journal_, "unmount");
  const int64_t now = FsOps::Now().tv_sec;
  FsOps::UpdateDynamic(*this, tx, [&](SuperDynamic& d) {
    d.state = static_cast<uint32_t>(format::FsState::kClean);
    d.free_blocks = alloc_->free_blocks();
    d.free_inodes = alloc_->free_inodes();
    d.write_time = now;
  });
  return tx.Commit();
}

Result<StatFs> Filesystem::GetStatFs() {
  StatFs st;
  st.block_size = geometry_->block_size();
  st.blocks = geometry_->block_count();
  st.blocks_free = alloc_->free_blocks();
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
  st.blocks_avail = st.blocks_free > overhead ? st.blocks_free - overhead : 0;
  st.inodes = geometry_->inode_count();
  st.inodes_free = alloc_->free_inodes();
  st.name_max = format::kNameMax;
  return st;
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

timespec FsOps::Now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts;
}

Status FsOps::CheckIno(const Filesystem& fs, uint64_t ino, bool wait_reclaim) {
  const Geometry& g = *fs.geometry_;
  if (ino == 0 || ino >= g.inode_count()) return Error(ESTALE);
  const uint32_t group = g.InodeGroup(ino);
  const std::byte* bitmap = fs.media_->base() + g.BlockOffset(g.InodeBitmapBlock(group));
  if (!TestBitShared(bitmap, ino % g.inodes_per_group())) return Error(ESTALE);
  if (InodeTypeOf(LoadRacing(InodeAt(fs, ino).mode)) == InodeType::kInvalid) {
    // Reclaim stores mode 0 in the transaction whose commit then clears
    // the bitmap bit, with the entry marked reclaiming from before the
    // store until after the bit is clear: a number read in that window is
    // an inode going away, not damage. Get waits it out and looks again
    // (EAGAIN). (mode is read without the inode's lock: only its type bits
    // are used, which nothing but a reclaim and a new inode change.) The
    // other callers walk the orphan list under orphan_mu_, which a reclaim
    // holds from before that store to its commit, so they never see it.
    if (!wait_reclaim) {
      return fs.ctx_->Damaged(MakeError(EUCLEAN, "inode %" PRIu64 " has an invalid mode", ino));
    }
    if (fs.cache_->WaitReclaimed(ino) || !TestBitShared(bitmap, ino % g.inodes_per_group()) ||
        InodeTypeOf(LoadRacing(InodeAt(fs, ino).mode)) != InodeType::kInvalid) {
      return Error(EAGAIN);
    }
    return fs.ctx_->Damaged(MakeError(EUCLEAN, "inode %" PRIu64 " has an invalid mode", ino));
  }
  return Status::Ok();
}

Result<InodeRef> FsOps::Get(Filesystem& fs, uint64_t ino) {
  for (;;) {
    // Checked again after waiting out a reclaim (InodeCache::Pin): the
    // number may now be free (an error here) or a new inode's.
    Status checked = CheckIno(fs, ino, /*wait_reclaim=*/true);
    if (checked.code() == EAGAIN) continue;  // a reclaim went by
    NVFS_TRY(std::move(checked));
    if (CachedInode* inode = fs.cache_->Pin(ino, &InodeAt(fs, ino))) return InodeRef(fs, inode);
  }
}

Attr FsOps::MakeAttr(const Filesystem& fs, uint64_t ino, const Inode& inode) {
  Attr a;
  a.ino = ino;
  a.mode = inode.mode;
  a.nlink = inode.nlink;
  a.uid = inode.uid;
  a.gid = inode.gid;
  a.rdev = inode.rdev;
  a.size = inode.size;
  a.blocks = inode.blocks << (fs.geometry_->block_shift() - 9);
  a.blksize = fs.geometry_->block_size();
  a.generation = inode.generation;
  a.atime = ToTimespec(inode.atime_sec, inode.atime_nsec);
  a.mtime = ToTimespec(inode.mtime_sec, inode.mtime_nsec);
  a.ctime = ToTimespec(inode.ctime_sec, inode.ctime_nsec);
  a.btime = ToTimespec(inode.btime_sec, inode.btime_nsec);
  return a;
}

// One logged store covering both times (they sit within 36 bytes), so a
// touch costs one journal record.
void FsOps::Touch(Tx& tx, const Inode& inode, bool mtime, bool ctime, timespec now) {
  if (!mtime && !ctime) return;
  Inode updated;
  CopyRacing(&updated, &inode, sizeof updated);  // orphan_next may be moving: never stored
  if (mtime) {
    updated.mtime_sec = now.tv_sec;
    updated.mtime_nsec = static_cast<uint32_t>(now.tv_nsec);
  }
  if (ctime) {
    updated.ctime_sec = now.tv_sec;
    updated.ctime_nsec = static_cast<uint32_t>(now.tv_nsec);
  }
  StoreInodeDiff(tx, inode, updated);
}

// Inode::orphan_next is the one field of an inode written without the
// inode's lock: OrphanRemove rewrites the predecessor's under orphan_mu_
// alone. A diff is therefore cut around it and never stores it, whatever
// `updated` holds there: a copy taken before a concurrent removal would put
// the removed (and soon freed) inode back on the list.
void FsOps::StoreInodeDiff(Tx& tx, const Inode& on_media, const Inode& updated) {
  const auto* old_bytes = reinterpret_cast<const std::byte*>(&on_media);
  const auto* new_bytes = reinterpret_cast<const std::byte*>(&updated);
  const auto store_range = [&](size_t first, size_t last) {
    while (first < last && old_bytes[first] == new_bytes[first]) ++first;
    while (last > first && old_bytes[last - 1] == new_bytes[last - 1]) --last;
    if (first < last) tx.Store(tx.OffsetOf(old_bytes + first), new_bytes + first, last - first);
  };
  constexpr size_t kListFirst = offsetof(Inode, orphan_next);
  constexpr size_t kListLast = kListFirst + sizeof(Inode::orphan_next);
  store_range(0, kListFirst);
  store_range(kListLast, sizeof(Inode));
}

uint64_t FsOps::NextGeneration(Filesystem& fs) {
  // splitmix64 over an atomic counter: cheap, lock-free, never repeats within
  // 2^64 draws; random across mounts (as ext4's i_generation).
  uint64_t x = fs.generation_state_.fetch_add(0x9E3779B97F4A7C15ull) + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Result<uint64_t> FsOps::NewInode(Filesystem& fs, Tx& tx, const Inode& parent_inode,
                                 uint64_t parent, uint32_t mode, uint64_t rdev,
                                 const Cred& cred, timespec now) {
  Result<uint64_t> ino = fs.alloc_->AllocateInode(tx, parent, S_ISDIR(mode));
  if (!ino.ok()) return ino;
  Inode inode = FreshInode(mode, cred.uid, cred.gid, parent, now,
                           static_cast<uint32_t>(NextGeneration(fs)));
  // BSD group semantics under a set-group-ID directory.
  if (parent_inode.mode & S_ISGID) {
    inode.gid = parent_inode.gid;
    if (S_ISDIR(mode)) inode.mode = static_cast<uint16_t>(inode.mode | S_ISGID);
  }
  inode.rdev = (S_ISCHR(mode) || S_ISBLK(mode)) ? rdev : 0;
  tx.StoreFresh(fs.geometry_->InodeOffset(*ino), &inode, sizeof inode);
  return ino;
}

void FsOps::OrphanAdd(Filesystem& fs, Tx& tx, uint64_t ino) {
  const Inode& inode = InodeAt(fs, ino);
  if (inode.flags & format::kInodeFlagOrphan) return;
  const auto& dyn = *reinterpret_cast<const SuperDynamic*>(fs.media_->base() +
                                                           format::kSuperDynamicOffset);
  const uint64_t old_head = dyn.orphan_head;
  tx.Set(inode.orphan_next, old_head);
  tx.Set(inode.flags, inode.flags | format::kInodeFlagOrphan);
  UpdateDynamic(fs, tx, [&](SuperDynamic& d) { d.orphan_head = ino; });
  // The index (DRAM only; checked before use, so an abort of `tx` leaving
  // it wrong costs a walk, never a wrong store).
  fs.orphan_prev_[ino] = 0;
  if (old_head != 0) fs.orphan_prev_[old_head] = ino;
}

// Every link is checked (an inode in use) before it is followed or stored:
// a damaged link is reported and fails the operation with EIO, the list left
// as it was for fsck.nvfs.
Status FsOps::OrphanRemove(Filesystem& fs, Tx& tx, uint64_t ino) {
  const Inode& inode = InodeAt(fs, ino);
  if (!(inode.flags & format::kInodeFlagOrphan)) return Status::Ok();
  const auto& dyn = *reinterpret_cast<const SuperDynamic*>(fs.media_->base() +
                                                           format::kSuperDynamicOffset);
  const auto damaged = [&](uint64_t at) {
    return fs.ctx_->Damaged(MakeError(EIO, "orphan list is damaged (a link to inode %" PRIu64
                                      "); run fsck.nvfs", at));
  };
  if (inode.orphan_next != 0 && !CheckIno(fs, inode.orphan_next).ok()) {
    return damaged(inode.orphan_next);
  }
  const uint64_t next = inode.orphan_next;
  uint64_t prev = 0;
  if (dyn.orphan_head == ino) {
    UpdateDynamic(fs, tx, [&](SuperDynamic& d) { d.orphan_head = next; });
  } else {
    // A singly linked list: the predecessor from the index if the media
    // agrees (an inode in use whose link is `ino`: in a list without
    // cycles only the predecessor has it), else found by a walk from the
    // head. Without the index, n removals in the order of their adds
    // walked O(n^2) links (generic/531: 15,000 O_TMPFILE files took 17 s
    // to reclaim).
    const auto hint = fs.orphan_prev_.find(ino);
    if (hint != fs.orphan_prev_.end() && hint->second != 0 &&
        CheckIno(fs, hint->second).ok() && InodeAt(fs, hint->second).orphan_next == ino) {
      prev = hint->second;
    } else {
      prev = dyn.orphan_head;
      uint64_t steps = 0;
      for (;;) {
        if (prev == 0) return damaged(ino);  // missing from the list
        if (!CheckIno(fs, prev).ok() || ++steps > fs.geometry_->inode_count()) {
          return damaged(prev);
        }
        if (InodeAt(fs, prev).orphan_next == ino) break;
        prev = InodeAt(fs, prev).orphan_next;
      }
    }
    tx.Set(InodeAt(fs, prev).orphan_next, next);
  }
  fs.orphan_prev_.erase(ino);
  if (next != 0) fs.orphan_prev_[next] = prev;
  tx.Set(inode.orphan_next, uint64_t{0});
  tx.Set(inode.flags, inode.flags & ~format::kInodeFlagOrphan);
  return Status::Ok();
}

Status FsOps::FreeBlocksFrom(Filesystem& fs, uint64_t ino, uint64_t from) {
  const Inode& inode = InodeAt(fs, ino);
  for (;;) {
    std::unique_lock lock(fs.orphan_mu_, std::defer_lock);  // before the Tx (fs.hpp)
    Tx tx(*fs.journal_, "truncate-more");
    Result<bool> done = fs.bmap_->Truncate(tx, inode, from);
    if (!done.ok()) return done.take_error();
    if (*done) {
      // An unlinked inode (still open) was on the list before the truncation
      // and stays there until reclaim frees it: taking it off here would
      // leak it, and its blocks, if the machine crashed before the release.
      if (inode.nlink != 0) {
        lock.lock();
        NVFS_TRY(OrphanRemove(fs, tx, ino));
      }
      return tx.Commit();
    }
    NVFS_TRY(tx.Commit());
  }
}

Status FsOps::Resize(Filesystem& fs, uint64_t ino, uint64_t new_size, Tx* first_tx,
                     std::unique_lock<std::mutex>& orphan_lock) {
  const Inode& inode = InodeAt(fs, ino);
  const Geometry& g = *fs.geometry_;
  if (new_size > fs.bmap_->max_size()) return Error(EFBIG);
  const uint64_t old_size = inode.size;
  Tx& tx = *first_tx;
  if (new_size >= old_size) {
    // Every byte past the old end is undefined, in the old last block and in
    // any block fallocate kept past the end: a write that extended the file
    // stores its data there before the transaction publishing the new size,
    // so a crash leaves them holding bytes the file never got. Zero what the
    // new size exposes in every mapped block (fresh stores: unreachable until
    // the size is published). Holes read as zeros already.
    const uint32_t shift = g.block_shift();
    const uint64_t mask = g.block_size() - 1;
    uint64_t pos = old_size;
    while (pos < new_size) {
      const uint64_t index = pos >> shift;
      uint64_t run;
      const uint64_t phys =
          fs.bmap_->Lookup(inode, index, ((new_size - 1) >> shift) - index + 1, &run);
      if (phys == Bmap::kCorrupt) return BadMap(fs, ino);
      const uint64_t run_end = std::min(new_size, (index + run) << shift);
      // File data, under a recovery point (ZeroMapped says why).
      if (phys != 0 && !RunFaultGuarded([&] {
            tx.FillFresh(g.BlockOffset(phys) + (pos & mask), 0, run_end - pos);
          })) {
        ReportMediaError("zeroing", ino);
        return Error(EIO);
      }
      pos = run_end;
    }
    if (new_size != old_size) tx.Set(inode.size, new_size);
    return Status::Ok();
  }
  tx.Set(inode.size, new_size);
  const uint64_t from = (new_size + g.block_size() - 1) >> g.block_shift();
  Result<bool> done = fs.bmap_->Truncate(tx, inode, from);
  if (!done.ok()) return done.take_error();
  if (*done) return Status::Ok();
  // Too much for one transaction: the rest happens in further ones, and the
  // orphan list makes a crash in between finish the job at mount. The bytes
  // past the new size are invisible from this first commit on.
  orphan_lock.lock();
  OrphanAdd(fs, tx, ino);
  NVFS_TRY(tx.Commit());
  orphan_lock.unlock();
  return FreeBlocksFrom(fs, ino, from);
}

Status FsOps::Reclaim(Filesystem& fs, uint64_t ino) {
  // Turned read-only by damage: the inode stays on the orphan list.
  if (fs.read_only()) return Error(EROFS);
  const Inode& inode = InodeAt(fs, ino);
  // Free the contents in as many transactions as needed; the inode stays on
  // the orphan list until the last one, which frees the inode itself.
  for (;;) {
    std::unique_lock lock(fs.orphan_mu_, std::defer_lock);  // before the Tx (fs.hpp)
    Tx tx(*fs.journal_, "reclaim");
    Result<bool> done = true;
    if (S_ISDIR(inode.mode)) {
      done = fs.dir_->FreeTree(tx, inode);
    } else if (S_ISREG(inode.mode) ||
               (S_ISLNK(inode.mode) && inode.size > format::kInlineSymlinkMax)) {
      done = fs.bmap_->Truncate(tx, inode, 0);
    }
    if (!done.ok()) return done.take_error();
    // Then the extended attributes, as many transactions as they take. A
    // damaged block or run is not followed, and the inode is not freed
    // either: it stays on the orphan list for fsck.nvfs.
    if (*done && inode.xattr_block != 0) done = FreeXattrs(fs, tx, inode);
    if (!done.ok()) return done.take_error();
    if (!*done) {
      NVFS_TRY(tx.Commit());
      continue;
    }
    lock.lock();
    NVFS_TRY(OrphanRemove(fs, tx, ino));
    tx.Set(inode.mode, uint16_t{0});
    NVFS_TRY(fs.alloc_->FreeInode(tx, ino));
    return tx.Commit();
  }
}

// Order: L `size` = 0 and the bmap truncate from block 0 (D every block),
// one transaction while the slot has room, then further ones for the rest
// (FreeBlocksFrom). The inode is on the orphan list from the commit that
// dropped its last link, before this, and stays there: a crash at any
// point leaves an unlinked orphan with fewer blocks, which mount reclaims.
// The size goes first so that no state shows a size past freed blocks; a
// file reopened afterwards (through /proc/self/fd of an O_PATH descriptor)
// reads as the empty file it now is.
Status FsOps::FreeUnlinkedData(Filesystem& fs, CachedInode* cached) {
  const Inode& inode = *cached->media;
  if (fs.read_only() || !S_ISREG(inode.mode) || inode.nlink != 0 || cached->linkable ||
      !(inode.flags & format::kInodeFlagOrphan)) {
    return Status::Ok();
  }
  if (inode.size == 0 && inode.blocks == 0) return Status::Ok();
  // Under the inode lock held exclusively no open is added (Open), so a
  // count of 0 stays 0 until the lock is dropped.
  if (fs.cache_->Opens(cached) != 0) return Status::Ok();
  const MappingChange change(cached);  // before the Tx: an abort's undo is under it
  {
    Tx tx(*fs.journal_, "free-unlinked");
    if (inode.size != 0) tx.Set(inode.size, uint64_t{0});
    Result<bool> done = fs.bmap_->Truncate(tx, inode, 0);
    if (!done.ok()) return done.take_error();
    NVFS_TRY(tx.Commit());
    if (*done) return Status::Ok();
  }
  return FreeBlocksFrom(fs, cached->ino, 0);
}

void FsOps::ReclaimIdle(Filesystem& fs, CachedInode* inode) {
  // The entry goes on every path, a throw from Reclaim (an allocation
  // failure) included: until it goes, `reclaiming` stays set and every pin
  // of the number waits for it (InodeCache::Pin). Erased after the inode
  // lock is dropped, as the lock lives in the entry.
  struct EraseOnExit {
    Filesystem& fs;
    CachedInode* inode;
    ~EraseOnExit() { fs.cache_->Erase(inode); }
  } erase_on_exit{fs, inode};
  std::unique_lock lock(inode->lock);
  // No reader holds the inode any more, but a direct client may still
  // hold its runs (a descriptor closed without detaching): its slot moves
  // before the blocks are freed.
  const MappingChange change(inode);
  if (fs.reclaim_fault_) fs.reclaim_fault_(inode->ino);
  // A failure here, an error or a throw, leaves the inode on the orphan
  // list: the next mount finishes it.
  (void)Reclaim(fs, inode->ino);
}

void FsOps::UnpinNoThrow(Filesystem& fs, CachedInode* inode) noexcept {
  const uint64_t ino = inode->ino;
  const char* what = nullptr;
  try {
    Unpin(fs, inode);
  } catch (const std::bad_alloc&) {
    what = "out of memory";
  } catch (...) {
    what = "unexpected exception";
  }
  if (what != nullptr) {
    std::fprintf(stderr,
                 "nvfs: reclaim of unlinked inode %" PRIu64 " failed (%s); it stays on the orphan "
                 "list until its next use or the next mount\n",
                 ino, what);
  }
}

Status FsOps::ProcessOrphans(Filesystem& fs) {
  const auto& dyn = *reinterpret_cast<const SuperDynamic*>(fs.media_->base() +
                                                           format::kSuperDynamicOffset);
  // The whole list is checked before the first orphan is touched: each inode
  // in use, flagged, listed once, and either unlinked or a regular file whose
  // truncation was cut short (nothing else is ever truncated).
  {
    std::unordered_set<uint64_t> listed;
    for (uint64_t ino = dyn.orphan_head; ino != 0; ino = InodeAt(fs, ino).orphan_next) {
      if (!CheckIno(fs, ino).ok() || !(InodeAt(fs, ino).flags & format::kInodeFlagOrphan) ||
          !listed.insert(ino).second ||
          !OrphanMayBe(InodeAt(fs, ino))) {
        return MakeError(EUCLEAN, "orphan list is damaged (inode %" PRIu64 "); run fsck.nvfs",
                         ino);
      }
    }
  }
  uint64_t steps = 0;
  while (dyn.orphan_head != 0) {
    const uint64_t ino = dyn.orphan_head;
    if (!CheckIno(fs, ino).ok() || !(InodeAt(fs, ino).flags & format::kInodeFlagOrphan) ||
        ++steps > fs.geometry_->inode_count()) {
      return MakeError(EUCLEAN, "orphan list is damaged (inode %" PRIu64 "); run fsck.nvfs", ino);
    }
    const Inode& inode = InodeAt(fs, ino);
    if (inode.nlink == 0) {
      NVFS_TRY(Reclaim(fs, ino));
    } else {
      const uint64_t from = (inode.size + fs.geometry_->block_size() - 1) >>
                            fs.geometry_->block_shift();
      NVFS_TRY(FreeBlocksFrom(fs, ino, from));
    }
  }
  return Status::Ok();
}

}  // namespace nvfs
