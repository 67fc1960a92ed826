#include "alloc/allocator.hpp"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstring>
#include <optional>

#include "nvfs/bitmap.hpp"

#include "nvfs/epoch.hpp"

namespace nvfs {

namespace {

// The DRAM bitmaps are word arrays (nvfs/bitmap.hpp).
bool Bit(const std::vector<uint64_t>& map, uint64_t bit) { return TestWordBit(map.data(), bit); }

void SetRange(std::vector<uint64_t>& map, uint64_t first, uint64_t count, bool value) {
  if (value) {
    SetWordBits(map.data(), first, count);
  } else {
    ClearWordBits(map.data(), first, count);
  }
}

// First clear bit at or after `from`, below `limit`; `limit` if none.
uint64_t FindClear(const std::vector<uint64_t>& map, uint64_t from, uint64_t limit) {
  uint64_t bit = from;
  while (bit < limit) {
    const uint64_t word = ~map[bit / 64] >> (bit % 64);
    if (word != 0) {
      bit += static_cast<uint64_t>(std::countr_zero(word));
      return std::min(bit, limit);
    }
    bit = (bit / 64 + 1) * 64;
  }
  return limit;
}

// First set bit at or after `from`, below `limit`; `limit` if none.
// The highest clear bit below `limit`, or `limit` if none.
uint64_t FindLastClear(const std::vector<uint64_t>& map, uint64_t limit) {
  uint64_t end = limit;  // bits [0, end) are left to search
  while (end > 0) {
    const uint64_t word_index = (end - 1) / 64;
    const uint64_t valid = end - word_index * 64;  // 1..64 low bits of the word
    uint64_t clear = ~map[word_index];
    if (valid < 64) clear &= (uint64_t{1} << valid) - 1;
    if (clear != 0) return word_index * 64 + 63 - static_cast<uint64_t>(std::countl_zero(clear));
    end = word_index * 64;
  }
  return limit;
}

uint64_t FindSet(const std::vector<uint64_t>& map, uint64_t from, uint64_t limit) {
  uint64_t bit = from;
  while (bit < limit) {
    const uint64_t word = map[bit / 64] >> (bit % 64);
    if (word != 0) return std::min(limit, bit + static_cast<uint64_t>(std::countr_zero(word)));
    bit = (bit / 64 + 1) * 64;
  }
  return limit;
}

}  // namespace

Allocator::Allocator(Media& media, const Geometry& geometry, uint32_t group_capacity)
    : media_(media),
      geometry_(geometry),
      group_capacity_(std::max(group_capacity, geometry.group_count())),
      groups_(new Group[group_capacity_]),
      align_blocks_(geometry.block_size() < (2u << 20) ? (2u << 20) / geometry.block_size() : 1) {}

void Allocator::CountFree(Group& group, BitmapKind kind, int64_t delta) {
  if (kind == BitmapKind::kBlocks) {
    group.free_blocks = static_cast<uint32_t>(group.free_blocks + delta);
    free_blocks_ += static_cast<uint64_t>(delta);
  } else {
    group.free_inodes = static_cast<uint32_t>(group.free_inodes + delta);
    free_inodes_ += static_cast<uint64_t>(delta);
  }
}

uint64_t Allocator::PerGroup(BitmapKind kind) const {
  return kind == BitmapKind::kBlocks ? geometry_.blocks_per_group()
                                     : geometry_.inodes_per_group();
}

std::pair<uint64_t, uint64_t> Allocator::LoadGroup(const Geometry& g, uint32_t index) {
  const size_t words = g.blocks_per_group() / 64;
  Group& group = groups_[index];
  std::lock_guard lock(group.mu);
  group.blocks.resize(words);
  group.inodes.resize(words);
  std::memcpy(group.blocks.data(), media_.base() + g.BlockOffset(g.BlockBitmapBlock(index)),
              words * 8);
  std::memcpy(group.inodes.data(), media_.base() + g.BlockOffset(g.InodeBitmapBlock(index)),
              words * 8);
  // Never hand out what is not there, whatever the media bitmaps say.
  const uint64_t blocks = g.GroupBlocks(index);
  SetRange(group.blocks, blocks, g.blocks_per_group() - blocks, true);
  SetRange(group.blocks, 0, g.GroupMetaBlocks(index), true);
  SetRange(group.inodes, g.inodes_per_group(), g.blocks_per_group() - g.inodes_per_group(),
           true);
  if (index == 0) SetRange(group.inodes, 0, 1, true);
  if (index == g.group_count() - 1) {
    SetRange(group.blocks, g.BackupBlock() - g.GroupFirstBlock(index), 1, true);
  }
  const uint64_t used_blocks = CountSetWordBits(group.blocks.data(), g.blocks_per_group());
  const uint64_t used_inodes = CountSetWordBits(group.inodes.data(), g.blocks_per_group());
  group.free_blocks = static_cast<uint32_t>(g.blocks_per_group() - used_blocks);
  group.free_inodes = static_cast<uint32_t>(g.blocks_per_group() - used_inodes);
  return {group.free_blocks, group.free_inodes};
}

void Allocator::Load() {
  const Geometry& g = geometry_;
  uint64_t free_blocks = 0, free_inodes = 0;
  for (uint32_t index = 0; index < g.group_count(); ++index) {
    const auto [blocks, inodes] = LoadGroup(g, index);
    free_blocks += blocks;
    free_inodes += inodes;
  }
  free_blocks_ = free_blocks;
  free_inodes_ = free_inodes;
}

uint32_t Allocator::group_free_blocks(uint32_t group) const {
  std::lock_guard lock(groups_[group].mu);
  return groups_[group].free_blocks;
}

uint32_t Allocator::group_free_inodes(uint32_t group) const {
  std::lock_guard lock(groups_[group].mu);
  return groups_[group].free_inodes;
}

bool Allocator::InUse(BitmapKind kind, uint64_t unit) const {
  const uint64_t per = PerGroup(kind);
  const Group& group = groups_[unit / per];
  std::lock_guard lock(group.mu);
  return Bit(kind == BitmapKind::kBlocks ? group.blocks : group.inodes, unit % per);
}

bool Allocator::Reserve(BitmapKind kind, uint64_t unit) {
  const uint64_t per = PerGroup(kind);
  Group& group = groups_[unit / per];
  std::lock_guard lock(group.mu);
  std::vector<uint64_t>& map = kind == BitmapKind::kBlocks ? group.blocks : group.inodes;
  if (Bit(map, unit % per)) return false;
  SetRange(map, unit % per, 1, true);
  CountFree(group, kind, -1);
  return true;
}

Extent Allocator::ReserveRun(Group& group, uint32_t index, BitmapKind kind, uint64_t from,
                             uint64_t want, Search search) {
  std::vector<uint64_t>& map = kind == BitmapKind::kBlocks ? group.blocks : group.inodes;
  const uint64_t limit = PerGroup(kind);
  uint64_t start = limit;
  if (search == Search::kTop) {
    start = FindLastClear(map, limit);
    want = 1;
  }
  // A large request that cannot continue at its goal starts on a 2 MiB
  // boundary when a whole aligned 2 MiB run is free (huge-page friendly for
  // DAX mappings, and it keeps large files in few runs).
  const uint64_t align = kind == BitmapKind::kBlocks ? align_blocks_ : 0;
  if (start == limit && align > 1 && want >= align && (from >= limit || Bit(map, from))) {
    for (uint64_t at = (from + align - 1) / align * align; at + align <= limit; at += align) {
      if (FindSet(map, at, at + align) == at + align) {
        start = at;
        break;
      }
    }
  }
  if (start == limit) start = FindClear(map, from, limit);
  if (start == limit && from != 0) start = FindClear(map, 0, from);
  if (start >= limit) return {};
  uint64_t end = start;
  while (end < limit && end - start < want && !Bit(map, end)) ++end;
  SetRange(map, start, end - start, true);
  const uint32_t n = static_cast<uint32_t>(end - start);
  CountFree(group, kind, -int64_t{n});
  return {uint64_t{index} * limit + start, end - start};
}

Result<Extent> Allocator::AllocateIn(Tx& tx, BitmapKind kind, uint32_t first_group,
                                     uint64_t from, uint64_t want, Search search) {
  const uint32_t groups = geometry_.group_count();
  const uint64_t total_free = kind == BitmapKind::kBlocks ? free_blocks() : free_inodes();
  if (kind == BitmapKind::kBlocks && !tx.reserve_allowed()) {
    // The reserve is left alone (reserve_blocks): what may be taken is
    // what can be handed out now beyond it; blocks still waiting for their
    // grace period count once they are released (they may never be, while
    // a direct writer holds them), so the reserve is not taken in their
    // place.
    if (const uint64_t reserve = reserve_blocks(); reserve != 0) {
      uint64_t now = free_blocks_.load(std::memory_order_relaxed);
      if (now <= reserve && deferred_blocks() != 0) {
        ReleaseDeferred(/*wait=*/!epoch::InGuard());
        now = free_blocks_.load(std::memory_order_relaxed);
      }
      if (now <= reserve) return Error(ENOSPC);
      want = std::min(want, now - reserve);
    }
  }
  const uint64_t average = total_free / groups;
  // First pass: the preferred group (or, when spreading, groups with at least
  // the average free count); second pass: any group with room; a third,
  // after waiting for the blocks freed but not yet past their grace period.
  std::optional<Error> host_full;
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 2) {
      if (kind != BitmapKind::kBlocks || deferred_blocks() == 0) break;
      ReleaseDeferred(/*wait=*/!epoch::InGuard());
    }
    for (uint32_t i = 0; i < groups; ++i) {
      const uint32_t index = (first_group + i) % groups;
      Group& group = groups_[index];
      std::lock_guard lock(group.mu);
      const uint32_t free_here =
          kind == BitmapKind::kBlocks ? group.free_blocks : group.free_inodes;
      if (free_here == 0) continue;
      if (pass == 0 && (search == Search::kSpread ? free_here < average : i != 0)) continue;
      const Extent run = ReserveRun(group, index, kind, i == 0 ? from : 0, want, search);
      if (run.count == 0) continue;
      // The host must be able to back what is handed out before anything
      // is logged: a store into a page it cannot supply is a SIGBUS. A
      // failure leaves the namespace as it was (the caller aborts its Tx).
      Status backed = BackRun(kind, run);
      const bool logged = backed.ok() && tx.LogAllocated(kind, run.first, run.count);
      if (!logged) {
        // The host is full, or the slot is: give the run back untouched.
        SetRange(kind == BitmapKind::kBlocks ? group.blocks : group.inodes,
                 run.first - uint64_t{index} * PerGroup(kind), run.count, false);
        CountFree(group, kind, static_cast<int64_t>(run.count));
        if (!backed.ok()) {
          host_full.emplace(backed.take_error());
          break;
        }
        return MakeError(ENOSPC, "journal slot full");
      }
      SetOnMedia(kind, run.first, run.count);
      return run;
    }
    if (host_full) break;
  }
  if (host_full) {
    // The host is full: what it backs already may still be free. (Searched
    // with no group lock held: it takes them, and waits for deferred frees.)
    Result<Extent> in_backed = AllocateBacked(tx, kind, want);
    if (in_backed.ok() || in_backed.code() != ENOSPC) return in_backed;
    return std::move(*host_full);
  }
  return Error(ENOSPC);
}

Result<Extent> Allocator::AllocateBacked(Tx& tx, BitmapKind kind, uint64_t want) {
  // Blocks waiting for their grace period are backed (they were in use):
  // wait for them first, then look only where the host backs already.
  if (kind == BitmapKind::kBlocks) ReleaseDeferred(/*wait=*/!epoch::InGuard());
  const Geometry& g = geometry_;
  const uint64_t per = PerGroup(kind);
  const uint64_t unit_bytes = kind == BitmapKind::kBlocks ? g.block_size() : format::kInodeSize;
  const uint64_t step = std::max<uint64_t>(1, Media::kBackChunk / unit_bytes);
  const uint64_t units = kind == BitmapKind::kBlocks ? per : g.inodes_per_group();
  for (uint32_t index = 0; index < g.group_count(); ++index) {
    Group& group = groups_[index];
    std::lock_guard lock(group.mu);
    std::vector<uint64_t>& map = kind == BitmapKind::kBlocks ? group.blocks : group.inodes;
    for (uint64_t lo = 0; lo < units; lo += step) {
      const uint64_t hi = std::min(units, lo + step);
      const uint64_t start = FindClear(map, lo, hi);
      if (start == hi) continue;
      const uint64_t first = uint64_t{index} * per;
      const uint64_t at = kind == BitmapKind::kBlocks ? g.BlockOffset(first + lo)
                                                      : g.InodeOffset(first + lo);
      if (!media_.Backed(at, (hi - lo) * unit_bytes)) continue;
      uint64_t end = start;
      while (end < hi && end - start < want && !Bit(map, end)) ++end;
      const Extent run{first + start, end - start};
      if (!tx.LogAllocated(kind, run.first, run.count)) {
        return MakeError(ENOSPC, "journal slot full");
      }
      SetRange(map, start, run.count, true);
      const uint32_t n = static_cast<uint32_t>(run.count);
      CountFree(group, kind, -int64_t{n});
      SetOnMedia(kind, run.first, run.count);
      return run;
    }
  }
  return MakeError(ENOSPC, "the host filesystem is full");
}

Status Allocator::BackRun(BitmapKind kind, const Extent& run) {
  const Geometry& g = geometry_;
  if (kind == BitmapKind::kBlocks) {
    return media_.Back(g.BlockOffset(run.first), run.count << g.block_shift());
  }
  // An inode's bytes lie in its group's inode table, which mkfs leaves
  // sparse (an inode is defined only while its bit is set).
  return media_.Back(g.InodeOffset(run.first), run.count * uint64_t{format::kInodeSize});
}

void Allocator::ReleaseFreed(BitmapKind kind, uint64_t first, uint64_t count) {
  if (kind == BitmapKind::kInodes) {
    Release(kind, first, count);
    return;
  }
  size_t waiting;
  {
    std::lock_guard lock(deferred_mu_);
    // Both tickets under the lock: the list stays ordered by each.
    epoch::ExternalGrace* external = external_.load(std::memory_order_acquire);
    const uint64_t ticket = epoch::StartGrace();
    deferred_.push_back({ticket, external != nullptr ? external->Start() : 0, {first, count}});
    deferred_blocks_.fetch_add(count, std::memory_order_relaxed);
    waiting = deferred_.size();
  }
  if (waiting % kDeferredBatch == 0) {
    // A thread inside a guard cannot wait (it would wait for itself): only
    // in process, never in the daemon, whose guards free nothing.
    ReleaseDeferred(/*wait=*/waiting >= kDeferredMax && !epoch::InGuard());
  }
}

uint64_t Allocator::ExternalDone() {
  epoch::ExternalGrace* external = external_.load(std::memory_order_acquire);
  return external != nullptr ? external->Completed() : UINT64_MAX;
}

uint64_t Allocator::held_blocks() {
  if (external_.load(std::memory_order_acquire) == nullptr) return 0;
  const uint64_t done = ExternalDone();
  std::lock_guard lock(deferred_mu_);
  uint64_t held = 0;
  for (const DeferredFree& f : deferred_) {
    if (f.external > done) held += f.extent.count;
  }
  return held;
}

std::vector<Allocator::DeferredFree> Allocator::TakeDeferred(uint64_t done, uint64_t external_done) {
  std::lock_guard lock(deferred_mu_);
  const auto end = std::find_if(deferred_.begin(), deferred_.end(), [&](const DeferredFree& f) {
    return f.ticket > done || f.external > external_done;
  });
  std::vector<DeferredFree> ready(deferred_.begin(), end);
  deferred_.erase(deferred_.begin(), end);
  return ready;
}

void Allocator::ReleaseAll(const std::vector<DeferredFree>& frees) {
  for (const DeferredFree& f : frees) {
    Release(BitmapKind::kBlocks, f.extent.first, f.extent.count);
    deferred_blocks_.fetch_sub(f.extent.count, std::memory_order_relaxed);
  }
}

void Allocator::ReleaseDeferred(bool wait, bool outside_too) {
  uint64_t newest = 0;
  {
    std::lock_guard lock(deferred_mu_);
    if (deferred_.empty()) return;
    newest = deferred_.back().ticket;
  }
  // Asked before this process's grace: a store that ended by now ended
  // before the frees it lets go were made allocatable.
  const uint64_t external_done = outside_too ? UINT64_MAX : ExternalDone();
  if (wait) {
    epoch::WaitForGrace(newest);
    ReleaseAll(TakeDeferred(newest, external_done));
  } else {
    ReleaseAll(TakeDeferred(epoch::CompletedGrace(), external_done));
  }
}

Result<Extent> Allocator::AllocateBlocks(Tx& tx, uint64_t goal, uint64_t want) {
  if (goal >= geometry_.block_count()) goal = 0;
  const uint32_t group = static_cast<uint32_t>(goal / geometry_.blocks_per_group());
  return AllocateIn(tx, BitmapKind::kBlocks, group, goal % geometry_.blocks_per_group(),
                    std::max<uint64_t>(want, 1), Search::kFromGoal);
}

Result<uint64_t> Allocator::AllocatePointerBlock(Tx& tx, uint64_t near) {
  if (near >= geometry_.block_count()) near = 0;
  const uint32_t group = static_cast<uint32_t>(near / geometry_.blocks_per_group());
  Result<Extent> run = AllocateIn(tx, BitmapKind::kBlocks, group, 0, 1, Search::kTop);
  if (!run.ok()) return run.take_error();
  return run->first;
}

Result<uint64_t> Allocator::AllocateInode(Tx& tx, uint64_t near_ino, bool directory) {
  uint32_t group = static_cast<uint32_t>(near_ino / geometry_.inodes_per_group());
  if (group >= geometry_.group_count()) group = 0;
  if (directory) group = rotor_.fetch_add(1, std::memory_order_relaxed) % geometry_.group_count();
  Result<Extent> run = AllocateIn(tx, BitmapKind::kInodes, group, 0, 1,
                                  directory ? Search::kSpread : Search::kFromGoal);
  if (!run.ok()) return run.take_error();
  return run->first;
}

// Refuses, before anything is logged, a free that would hand out what is
// not a free-able block: a run that is not all data blocks (a pointer into
// group metadata), a block not in use (its bit clear in DRAM or on the media:
// already freed by a committed transaction, or never allocated), or one this
// transaction already frees (a node reached twice). Each would later give a
// block to two owners.
Status Allocator::FreeBlocks(Tx& tx, uint64_t first, uint64_t count) {
  if (!geometry_.IsDataRun(first, count)) {
    return MakeError(EUCLEAN, "refusing to free blocks %" PRIu64 "..%" PRIu64
                     ": not data blocks; run fsck.nvfs", first, first + count - 1);
  }
  {
    const uint64_t per = geometry_.blocks_per_group();
    const uint32_t index = static_cast<uint32_t>(first / per);
    const std::byte* bitmap = media_.base() + geometry_.BlockOffset(geometry_.BlockBitmapBlock(index));
    const Group& group = groups_[index];
    std::lock_guard lock(group.mu);
    for (uint64_t bit = first % per; bit < first % per + count; ++bit) {
      if (!Bit(group.blocks, bit) || !TestBit(bitmap, bit)) {
        return MakeError(EUCLEAN, "refusing to free block %" PRIu64
                         ": not in use; run fsck.nvfs", index * per + bit);
      }
    }
  }
  if (tx.Frees(BitmapKind::kBlocks, first, count)) {
    return MakeError(EUCLEAN, "refusing to free blocks %" PRIu64 "..%" PRIu64
                     " twice in one operation; run fsck.nvfs", first, first + count - 1);
  }
  if (!tx.LogDeferredFree(BitmapKind::kBlocks, first, count)) {
    return MakeError(ENOSPC, "journal slot full");
  }
  return Status::Ok();
}

Status Allocator::FreeInode(Tx& tx, uint64_t ino) {
  if (!tx.LogDeferredFree(BitmapKind::kInodes, ino, 1)) {
    return MakeError(ENOSPC, "journal slot full");
  }
  return Status::Ok();
}

void Allocator::SetOnMedia(BitmapKind kind, uint64_t first, uint64_t count) {
  // REQUIRES: the group's mutex is held (AllocateIn), so no other store races
  // on these bitmap words.
  const Geometry& g = geometry_;
  const uint64_t per = PerGroup(kind);
  const uint32_t index = static_cast<uint32_t>(first / per);
  const uint64_t bitmap = g.BlockOffset(kind == BitmapKind::kBlocks ? g.BlockBitmapBlock(index)
                                                                    : g.InodeBitmapBlock(index));
  uint64_t bit = first % per;
  const uint64_t end = bit + count;
  while (bit < end) {
    const uint64_t n = std::min<uint64_t>(64 - bit % 64, end - bit);
    const uint64_t mask = BitRunMask(bit % 64, n);
    const uint64_t word_offset = bitmap + bit / 64 * 8;
    uint64_t word;
    std::memcpy(&word, media_.base() + word_offset, 8);
    media_.Store64(word_offset, word | mask);
    media_.Flush(word_offset, 8);
    bit += n;
  }
}

void Allocator::ClearOnMedia(BitmapKind kind, uint64_t first, uint64_t count) {
  const uint64_t per = PerGroup(kind);
  uint64_t unit = first;
  while (unit < first + count) {
    const uint32_t index = static_cast<uint32_t>(unit / per);
    const uint64_t n = std::min(first + count - unit, (uint64_t{index} + 1) * per - unit);
    std::lock_guard lock(groups_[index].mu);
    ClearMediaBits(media_, geometry_, kind, unit, n);
    unit += n;
  }
}

Status Allocator::BeginGrow(const Geometry& grown) {
  if (grown.group_count() > group_capacity_) {
    return MakeError(EINVAL, "the mount has room for %u groups, the grown filesystem has %u",
                     group_capacity_, grown.group_count());
  }
  growing_.store(&grown, std::memory_order_release);
  return Status::Ok();
}

void Allocator::AddGroups(const Geometry& grown) {
  for (uint32_t index = geometry_.group_count(); index < grown.group_count(); ++index) {
    const auto [blocks, inodes] = LoadGroup(grown, index);
    free_blocks_ += blocks;
    free_inodes_ += inodes;
  }
}

void Allocator::EndGrow() {
  std::vector<Extent> held;
  {
    std::lock_guard lock(grow_mu_);
    growing_.store(nullptr, std::memory_order_release);
    held.swap(grow_held_);
  }
  // Data blocks now, if the grown geometry was published; dropped (never
  // allocatable) if the grow failed.
  for (const Extent& e : held) Release(BitmapKind::kBlocks, e.first, e.count);
}

void Allocator::Release(BitmapKind kind, uint64_t first, uint64_t count) {
  // Metadata blocks are never allocatable, whatever a caller asks (every
  // block freed passed FreeBlocks, every one released by an abort was
  // allocated here: this is the last line, not the check). During a grow,
  // its own free is of blocks that are data only in the grown geometry.
  if (kind == BitmapKind::kBlocks && !geometry_.IsDataRun(first, count)) {
    // A grow's own free (its old backup block, the old last group's tail):
    // data blocks only in the grown geometry, so not allocatable before it
    // is published (EndGrow releases them): a pointer to one read with the
    // geometry of now names no data block, which is damage. (Released at
    // once, as before, a writer that got one between the grow's commit and
    // its publication made test_resize's mounted grow, and mount_grow.sh,
    // report "a block pointer names no data block".)
    std::lock_guard lock(grow_mu_);
    const Geometry* growing = growing_.load(std::memory_order_acquire);
    if (growing != nullptr && growing->IsDataRun(first, count)) {
      grow_held_.push_back({first, count});
      return;
    }
    if (!geometry_.IsDataRun(first, count)) return;  // (published meanwhile: released)
  }
  const uint64_t per = PerGroup(kind);
  uint64_t unit = first;
  while (unit < first + count) {
    const uint32_t index = static_cast<uint32_t>(unit / per);
    const uint64_t n = std::min(first + count - unit, (uint64_t{index} + 1) * per - unit);
    Group& group = groups_[index];
    std::lock_guard lock(group.mu);
    std::vector<uint64_t>& map = kind == BitmapKind::kBlocks ? group.blocks : group.inodes;
    // Count only bits that were set, so a repeated release cannot inflate the
    // free counts.
    uint32_t released = 0;
    for (uint64_t bit = unit % per; bit < unit % per + n; ++bit) released += Bit(map, bit);
    SetRange(map, unit % per, n, false);
    CountFree(group, kind, int64_t{released});
    unit += n;
  }
}

}  // namespace nvfs
