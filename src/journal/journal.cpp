#include "journal/journal.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "nvfs/bitmap.hpp"
#include "nvfs/crc32c.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

namespace {

using format::JournalRecord;
using format::JournalRecordType;
using format::JournalSlotHeader;
using format::JournalState;

constexpr uint32_t kHeaderSize = sizeof(JournalSlotHeader);
constexpr uint64_t kStateWordOffset = offsetof(JournalSlotHeader, state);
constexpr uint64_t kSeqOffset = offsetof(JournalSlotHeader, tx_seq);
static_assert(kStateWordOffset % 8 == 0 && kSeqOffset % 8 == 0);

constexpr uint32_t RecordSize(uint32_t payload) {
  return static_cast<uint32_t>(sizeof(JournalRecord)) + ((payload + 7u) & ~7u);
}

uint32_t RecordChecksum(const JournalRecord& header, const std::byte* payload,
                        uint32_t payload_len) {
  return JournalRecordChecksum(header, payload, payload_len);
}

uint64_t StateWord(JournalState state, uint32_t slot) {
  return static_cast<uint64_t>(state) | (uint64_t{slot} << 32);
}

// A record read back from a slot.
struct ReadRecord {
  JournalRecord header;
  const std::byte* payload;  // in the mapping
};

}  // namespace

void ClearMediaBits(Media& media, const Geometry& g, BitmapKind kind, uint64_t first,
                    uint64_t count) {
  const uint64_t per_group =
      kind == BitmapKind::kBlocks ? g.blocks_per_group() : g.inodes_per_group();
  uint64_t unit = first;
  const uint64_t end = first + count;
  while (unit < end) {
    const uint32_t group = static_cast<uint32_t>(unit / per_group);
    const uint64_t bit = unit % per_group;
    const uint64_t bitmap = g.BlockOffset(kind == BitmapKind::kBlocks ? g.BlockBitmapBlock(group)
                                                                      : g.InodeBitmapBlock(group));
    const uint64_t word_offset = bitmap + bit / 64 * 8;
    const uint64_t first_bit = bit % 64;
    const uint64_t n = std::min<uint64_t>({64 - first_bit, end - unit, per_group - bit});
    const uint64_t mask = BitRunMask(first_bit, n);
    uint64_t word;
    std::memcpy(&word, media.base() + word_offset, 8);
    if ((word & mask) != 0) {
      media.Store64(word_offset, word & ~mask);
      media.Flush(word_offset, 8);
    }
    unit += n;
  }
}

// ---------------------------------------------------------------------------
// Journal
// ---------------------------------------------------------------------------

Journal::Journal(Media& media, const Geometry& geometry) : media_(media), geometry_(geometry) {
  for (uint32_t slot = geometry_.journal_slots(); slot-- > 0;) free_slots_.push_back(slot);
}

uint32_t Journal::AcquireSlot() {
  std::unique_lock lock(mu_);
  slot_freed_.wait(lock, [&] { return !free_slots_.empty(); });
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void Journal::ReleaseSlot(uint32_t slot) {
  {
    std::lock_guard lock(mu_);
    free_slots_.push_back(slot);
  }
  slot_freed_.notify_one();
}

bool Journal::ValidRecord(const JournalRecord& record) const {
  const Geometry& g = geometry_;
  switch (static_cast<JournalRecordType>(record.type)) {
    case JournalRecordType::kUndo: {
      const uint64_t end = record.target + record.length;
      // Only a grow logs the static halves and what lies past the
      // filesystem's end (src/resize/grow.cpp, format.md "Growing"): the
      // primary's geometry fields, and the new backup copy where the grown
      // geometry keeps it (its own backup block, or bytes past the end of
      // the geometry that has not grown yet). Restoring either changes no
      // byte any file or metadata block of this geometry holds.
      if (record.length != 0 && end >= record.target && end <= format::kSuperHalfSize) {
        return true;
      }
      if (record.length != 0 && end >= record.target && record.target >= g.BackupSuperOffset() &&
          end <= media_.size() &&
          record.target >> g.block_shift() == (end - 1) >> g.block_shift()) {
        return true;
      }
      const uint64_t journal_start = g.BlockOffset(g.journal_block());
      const uint64_t journal_end = journal_start + g.BlockOffset(g.journal_blocks());
      // Every logged store lies inside one block (Tx::Store): a length
      // damaged with its checksum recomputed must not let recovery write past
      // its target into a neighbouring block, someone's data.
      return record.length != 0 && record.target >= format::kSuperDynamicOffset &&
             end >= record.target && end <= g.BackupSuperOffset() &&
             (end <= journal_start || record.target >= journal_end) &&
             record.target >> g.block_shift() == (end - 1) >> g.block_shift();
    }
    case JournalRecordType::kBitmapSet:
    case JournalRecordType::kDeferredFree:
      return record.length != 0 && record.target < g.block_count() &&
             record.length <= g.block_count() - record.target;
    case JournalRecordType::kInodeSet:
    case JournalRecordType::kInodeFree:
      return record.length != 0 && record.target < g.inode_count() &&
             record.length <= g.inode_count() - record.target;
  }
  return false;
}

namespace {

// The valid records of `slot` for sequence number `seq`, in log order.
std::vector<ReadRecord> ReadRecords(const Media& media, uint64_t slot_offset,
                                    uint32_t slot_size, uint64_t seq,
                                    const std::function<bool(const JournalRecord&)>& valid) {
  std::vector<ReadRecord> records;
  uint32_t pos = kHeaderSize;
  while (pos + sizeof(JournalRecord) <= slot_size) {
    ReadRecord r;
    std::memcpy(&r.header, media.base() + slot_offset + pos, sizeof r.header);
    if (r.header.tx_seq != seq) break;
    const uint32_t payload_len =
        r.header.type == static_cast<uint16_t>(JournalRecordType::kUndo) ? r.header.length : 0;
    if (payload_len > slot_size - pos - sizeof(JournalRecord)) break;
    r.payload = media.base() + slot_offset + pos + sizeof(JournalRecord);
    if (r.header.checksum != RecordChecksum(r.header, r.payload, payload_len)) break;
    if (!valid(r.header)) break;
    records.push_back(r);
    pos += RecordSize(payload_len);
  }
  return records;
}

}  // namespace

Status Journal::CheckSlotHeaders() const {
  for (uint32_t slot = 0; slot < geometry_.journal_slots(); ++slot) {
    JournalSlotHeader header;
    std::memcpy(&header, media_.base() + geometry_.JournalSlotOffset(slot), sizeof header);
    if (!JournalSlotHeaderValid(header, slot)) {
      return MakeError(EUCLEAN, "journal slot %u is damaged; run fsck.nvfs", slot);
    }
  }
  return Status::Ok();
}

void Journal::ForEachStep(uint32_t slot,
                          const std::function<void(const RecoveryStep& step)>& fn) const {
  const uint64_t slot_offset = geometry_.JournalSlotOffset(slot);
  JournalSlotHeader header;
  std::memcpy(&header, media_.base() + slot_offset, sizeof header);
  const auto state = static_cast<JournalState>(header.state);
  if (state == JournalState::kIdle) return;
  const auto valid = [this](const JournalRecord& r) { return ValidRecord(r); };
  const std::vector<ReadRecord> records = ReadRecords(
      media_, slot_offset, geometry_.journal_slot_size(), header.tx_seq, valid);
  const auto is_free = [](const ReadRecord& r) {
    const auto type = static_cast<JournalRecordType>(r.header.type);
    return type == JournalRecordType::kDeferredFree || type == JournalRecordType::kInodeFree;
  };
  const auto step = [&](const ReadRecord& r) {
    fn(RecoveryStep{static_cast<JournalRecordType>(r.header.type), r.header.target,
                    r.header.length, r.payload});
  };
  if (state == JournalState::kActive) {
    // Undone in reverse; its frees were never committed, so nothing was freed.
    for (auto it = records.rbegin(); it != records.rend(); ++it) {
      if (!is_free(*it)) step(*it);
    }
  } else {
    for (const ReadRecord& record : records) {
      if (is_free(record)) step(record);
    }
  }
}

Status Journal::PlanRecovery(
    const std::function<void(uint32_t slot, const RecoveryStep& step)>& fn) const {
  NVFS_TRY(CheckSlotHeaders());
  for (uint32_t slot = 0; slot < geometry_.journal_slots(); ++slot) {
    ForEachStep(slot, [&](const RecoveryStep& step) { fn(slot, step); });
  }
  return Status::Ok();
}

// Every header is checked before anything is written, so a damaged journal
// fails the mount with the namespace untouched.
Result<Journal::RecoveryStats> Journal::Recover() {
  NVFS_TRY(CheckSlotHeaders());
  RecoveryStats stats;
  uint64_t max_seq = 0;
  for (uint32_t slot = 0; slot < geometry_.journal_slots(); ++slot) {
    const uint64_t slot_offset = geometry_.JournalSlotOffset(slot);
    JournalSlotHeader header;
    std::memcpy(&header, media_.base() + slot_offset, sizeof header);
    max_seq = std::max(max_seq, header.tx_seq);
    const auto state = static_cast<JournalState>(header.state);
    if (state == JournalState::kIdle) continue;
    ForEachStep(slot, [&](const RecoveryStep& step) {
      switch (step.type) {
        case JournalRecordType::kUndo:
          media_.Store(step.target, step.payload, step.length);
          media_.Flush(step.target, step.length);
          break;
        case JournalRecordType::kBitmapSet:
        case JournalRecordType::kDeferredFree:
          ClearMediaBits(media_, geometry_, BitmapKind::kBlocks, step.target, step.length);
          break;
        case JournalRecordType::kInodeSet:
        case JournalRecordType::kInodeFree:
          ClearMediaBits(media_, geometry_, BitmapKind::kInodes, step.target, step.length);
          break;
      }
      ++stats.records;
    });
    if (state == JournalState::kActive) {
      ++stats.undone;
    } else {
      ++stats.completed;
    }
    media_.Drain();
    media_.Store64(slot_offset + kStateWordOffset, StateWord(JournalState::kIdle, slot));
    media_.Persist(slot_offset + kStateWordOffset, 8);
  }
  next_seq_ = max_seq + 1;
  return stats;
}

// ---------------------------------------------------------------------------
// Tx
// ---------------------------------------------------------------------------

Tx::Tx(Journal& journal, const char* op_name) : journal_(journal) {
  slot_ = journal_.AcquireSlot();
  {
    std::lock_guard lock(journal_.mu_);
    seq_ = journal_.next_seq_++;
  }
  slot_offset_ = journal_.geometry_.JournalSlotOffset(slot_);
  Media& media = journal_.media_;
  media.BeginOp(op_name);
  // Sequence number before state, in one cache line: they persist in this
  // order, so an active slot never pairs with a stale sequence number. The
  // fence comes with the first record, before any in-place store.
  media.Store64(slot_offset_ + kSeqOffset, seq_);
  media.Store64(slot_offset_ + kStateWordOffset, StateWord(JournalState::kActive, slot_));
  media.Flush(slot_offset_, kHeaderSize);
}

Tx::~Tx() {
  if (open_) Abort();
}

Media& Tx::media() const { return journal_.media_; }

uint64_t Tx::OffsetOf(const void* in_mapping) const {
  return static_cast<uint64_t>(static_cast<const std::byte*>(in_mapping) -
                               journal_.media_.base());
}

size_t Tx::room() const {
  return journal_.geometry_.journal_slot_size() - kHeaderSize - used_;
}

bool Tx::AppendRecord(JournalRecordType type, uint64_t target, uint32_t length,
                      const void* payload) {
  if (!ok_) return false;
  const uint32_t payload_len = type == JournalRecordType::kUndo ? length : 0;
  const uint32_t size = RecordSize(payload_len);
  if (size > room()) {
    ok_ = false;
    return false;
  }
  std::byte buffer[sizeof(JournalRecord) + 512];
  std::vector<std::byte> large;
  std::byte* record = buffer;
  if (size > sizeof buffer) {
    large.resize(size);
    record = large.data();
  }
  JournalRecord header{};
  header.tx_seq = seq_;
  header.target = target;
  header.length = length;
  header.type = static_cast<uint16_t>(type);
  std::memset(record, 0, size);
  if (payload_len != 0) std::memcpy(record + sizeof header, payload, payload_len);  // payload may be null
  header.checksum = RecordChecksum(header, record + sizeof header, payload_len);
  std::memcpy(record, &header, sizeof header);
  Media& media = journal_.media_;
  const uint64_t at = slot_offset_ + kHeaderSize + used_;
  media.Store(at, record, size);
  media.Persist(at, size);
  used_ += size;
  return true;
}

void Tx::NoteDirty(uint64_t offset, size_t len) { dirty_.push_back({offset, len}); }

void Tx::FlushDirty() {
  std::sort(dirty_.begin(), dirty_.end(),
            [](const Extent& a, const Extent& b) { return a.first < b.first; });
  Media& media = journal_.media_;
  size_t i = 0;
  while (i < dirty_.size()) {
    uint64_t start = dirty_[i].first;
    uint64_t end = start + dirty_[i].count;
    for (++i; i < dirty_.size() && dirty_[i].first <= end; ++i) {
      end = std::max(end, dirty_[i].first + dirty_[i].count);
    }
    media.Flush(start, end - start);
  }
  dirty_.clear();
}

void Tx::CheckRange(uint64_t offset, size_t len) const {
  const uint64_t size = journal_.media_.size();
  if (offset > size || len > size - offset) {
    std::fprintf(stderr, "nvfs: BUG: logged store of %zu bytes at %" PRIu64 " outside the namespace\n",
                 len, offset);
    std::abort();
  }
}

void Tx::CheckOpen(const char* what) const {
  if (!open_) [[unlikely]] {
    std::fprintf(stderr, "nvfs: BUG: %s through a transaction already finished\n", what);
    std::abort();
  }
}

void Tx::Store(uint64_t offset, const void* src, size_t len) {
  CheckOpen("logged store");
  if (len == 0) return;
  CheckRange(offset, len);
  if (offset >> journal_.geometry().block_shift() !=
      (offset + len - 1) >> journal_.geometry().block_shift()) {
    // Recovery refuses such a record (Journal::ValidRecord).
    std::fprintf(stderr, "nvfs: BUG: logged store of %zu bytes at %" PRIu64 " crosses a block\n",
                 len, offset);
    std::abort();
  }
  if (!AppendRecord(JournalRecordType::kUndo, offset, static_cast<uint32_t>(len),
                    journal_.media_.base() + offset)) {
    return;
  }
  journal_.media_.Store(offset, src, len);
  NoteDirty(offset, len);
}

void Tx::Store64(uint64_t offset, uint64_t value) {
  CheckOpen("logged store");
  CheckRange(offset, 8);
  if (!AppendRecord(JournalRecordType::kUndo, offset, 8, journal_.media_.base() + offset)) return;
  journal_.media_.Store64(offset, value);
  NoteDirty(offset, 8);
}

void Tx::StoreFresh(uint64_t offset, const void* src, size_t len) {
  CheckOpen("fresh store");
  if (len == 0) return;
  journal_.media_.Store(offset, src, len);
  NoteDirty(offset, len);
}

void Tx::FillFresh(uint64_t offset, int byte, size_t len) {
  CheckOpen("fresh store");
  if (len == 0) return;
  journal_.media_.Fill(offset, byte, len);
  NoteDirty(offset, len);
}

// One logical record per run of at most UINT32_MAX (a record's length is 32
// bits: longer runs take several records), each noted in `noted` once it is
// in the slot.
bool Tx::LogRuns(JournalRecordType type, BitmapKind kind, uint64_t first, uint64_t count,
                 std::vector<Allocation>* noted) {
  CheckOpen("record");
  for (uint64_t done = 0; done < count;) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(count - done, UINT32_MAX));
    if (!AppendRecord(type, first + done, n, nullptr)) return false;
    noted->push_back({kind, {first + done, n}});
    done += n;
  }
  return true;
}

bool Tx::LogAllocated(BitmapKind kind, uint64_t first, uint64_t count) {
  const auto type = kind == BitmapKind::kBlocks ? JournalRecordType::kBitmapSet
                                                : JournalRecordType::kInodeSet;
  return LogRuns(type, kind, first, count, &allocated_);
}

bool Tx::LogDeferredFree(BitmapKind kind, uint64_t first, uint64_t count) {
  const auto type = kind == BitmapKind::kBlocks ? JournalRecordType::kDeferredFree
                                                : JournalRecordType::kInodeFree;
  return LogRuns(type, kind, first, count, &frees_);
}

bool Tx::Frees(BitmapKind kind, uint64_t first, uint64_t count) const {
  // Linear: a slot holds at most slot_size / 32 records.
  for (const Allocation& f : frees_) {
    if (f.kind == kind && first < f.extent.first + f.extent.count &&
        f.extent.first < first + count) {
      return true;
    }
  }
  return false;
}

void Tx::SetState(JournalState state) {
  Media& media = journal_.media_;
  media.Store64(slot_offset_ + kStateWordOffset, StateWord(state, slot_));
  media.Persist(slot_offset_ + kStateWordOffset, 8);
}

void Tx::Finish() {
  open_ = false;
  journal_.media_.EndOp();
  journal_.ReleaseSlot(slot_);
}

Status Tx::Commit() {
  if (!open_) return Status::Ok();
  if (!ok_) {
    Abort();
    return MakeError(ENOSPC, "operation too large for one journal slot");
  }
  Media& media = journal_.media_;
  if (!after_loss_ && media.LostPages() != 0) [[unlikely]] {
    // Undoes what it can read back: records in a lost page read as ones
    // and fail ValidRecord, so Abort stops before them.
    Abort();
    Error error = MakeError(EIO, "a page of the namespace was lost to a media error; "
                            "changes are refused");
    if (journal_.loss_listener_ && !journal_.loss_told_.exchange(true)) {
      journal_.loss_listener_(error);
    }
    return error;
  }
  FlushDirty();
  media.Drain();
  if (!frees_.empty()) {
    SetState(JournalState::kCommitted);
    ClearOnMedia(frees_);
    media.Drain();
  }
  SetState(JournalState::kIdle);
  for (const Allocation& f : frees_) {
    journal_.sink_->ReleaseFreed(f.kind, f.extent.first, f.extent.count);
  }
  Finish();
  return Status::Ok();
}

void Tx::ClearOnMedia(const std::vector<Allocation>& runs) {
  for (const Allocation& a : runs) journal_.sink_->ClearOnMedia(a.kind, a.extent.first, a.extent.count);
}

void Tx::Abort() {
  if (!open_) return;
  Media& media = journal_.media_;
  FlushDirty();
  const auto valid = [this](const JournalRecord& r) { return journal_.ValidRecord(r); };
  const std::vector<ReadRecord> records = ReadRecords(
      media, slot_offset_, journal_.geometry_.journal_slot_size(), seq_, valid);
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (it->header.type == static_cast<uint16_t>(JournalRecordType::kUndo)) {
      media.Store(it->header.target, it->payload, it->header.length);
      media.Flush(it->header.target, it->header.length);
    }
  }
  ClearOnMedia(allocated_);
  media.Drain();
  SetState(JournalState::kIdle);
  for (const Allocation& a : allocated_) {
    journal_.sink_->Release(a.kind, a.extent.first, a.extent.count);
  }
  Finish();
}

}  // namespace nvfs
