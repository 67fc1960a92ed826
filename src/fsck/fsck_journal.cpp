// The journal as fsck sees it: slot headers first; then, when operations were
// left unfinished, -p and -y run recovery itself (the same Journal::Recover
// mount runs), and -n, which may not write, lays what recovery would write
// over the blocks it reads (Checker::Block), so the rest of the check sees the
// namespace as the next mount will leave it.
#include <cinttypes>
#include <cstring>

#include "fsck/checker.hpp"
#include "journal/journal.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

using format::JournalSlotHeader;
using format::JournalState;

// Returns true when some slot holds an unfinished operation (and every header
// is valid, so recovery can run). A damaged header is rewritten idle with -y,
// over a cleared slot: stale records must not pass for a later transaction's.
bool Checker::CheckJournalHeaders() {
  const Geometry& g = geometry_;
  uint32_t busy = 0;
  bool damaged = false;
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    const uint64_t offset = g.JournalSlotOffset(slot);
    JournalSlotHeader header;
    std::memcpy(&header, media_.base() + offset, sizeof header);
    if (!JournalSlotHeaderValid(header, slot)) {
      if (Problem(Repair::kDecision, "journal slot %u: header damaged", slot)) {
        media_.Fill(offset, 0, g.journal_slot_size());
        // The cleared slot holds no record of any sequence.
        const JournalSlotHeader fresh = IdleJournalSlotHeader(slot);
        media_.Store(offset, &fresh, sizeof fresh);
        media_.Persist(offset, g.journal_slot_size());
        Fixed();
      } else {
        damaged = true;
      }
      continue;
    }
    if (header.state != static_cast<uint32_t>(JournalState::kIdle)) ++busy;
  }
  if (busy == 0) return false;
  if (damaged) {
    Say("journal: %u unfinished operations, not recovered because a slot is damaged", busy);
    return false;
  }
  return true;
}

// -p and -y: the recovery mount would run, done now so that the check sees
// what the namespace really holds.
void Checker::RecoverJournal() {
  Journal journal(media_, geometry_);
  if (!Problem(Repair::kSafe, "journal holds unfinished operations; recovering")) return;
  Result<Journal::RecoveryStats> stats = journal.Recover();
  if (!stats.ok()) {
    Unrepairable("journal recovery failed: %s", stats.error().message.c_str());
    return;
  }
  Say("journal: %u operations undone, %u completed (%" PRIu64 " records)", stats->undone,
      stats->completed, stats->records);
  recovered_ = true;
  Fixed();
}

// -n: copies of the blocks recovery would change, changed as it would.
void Checker::BuildOverlay() {
  Journal journal(media_, geometry_);
  const Geometry& g = geometry_;
  uint32_t last_slot = UINT32_MAX;
  uint32_t slots = 0;
  Status planned = journal.PlanRecovery([&](uint32_t slot, const Journal::RecoveryStep& step) {
    if (slot != last_slot) ++slots;
    last_slot = slot;
    if (step.type == format::JournalRecordType::kUndo) {
      uint64_t at = step.target;
      uint64_t done = 0;
      while (done < step.length) {
        const uint64_t block_no = at >> block_shift_;
        const uint64_t in_block = at & (block_size_ - 1);
        const uint64_t n = std::min<uint64_t>(block_size_ - in_block, step.length - done);
        std::memcpy(PatchBlock(block_no) + in_block, step.payload + done, n);
        done += n;
        at += n;
      }
      return;
    }
    const bool blocks = step.type == format::JournalRecordType::kBitmapSet ||
                        step.type == format::JournalRecordType::kDeferredFree;
    const uint64_t per_group = blocks ? g.blocks_per_group() : g.inodes_per_group();
    for (uint64_t unit = step.target; unit < step.target + step.length; ++unit) {
      const uint32_t group = static_cast<uint32_t>(unit / per_group);
      const uint64_t bit = unit % per_group;
      std::byte* bitmap =
          PatchBlock(blocks ? g.BlockBitmapBlock(group) : g.InodeBitmapBlock(group));
      ClearBitsInBuffer(bitmap, bit, 1);
    }
  });
  if (!planned.ok()) {
    Say("journal: %s", planned.error().message.c_str());
    return;
  }
  recovered_ = true;
  Say("journal holds unfinished operations; checking the namespace as recovery will leave it "
      "(the next mount, or fsck.nvfs -p, recovers it)");
}

const std::byte* Checker::OverlayBlock(uint64_t block_no) const {
  auto it = overlay_.find(block_no);
  if (it != overlay_.end()) return it->second.get();
  return base_ + (block_no << block_shift_);
}

std::byte* Checker::PatchBlock(uint64_t block_no) {
  std::unique_ptr<std::byte[]>& copy = overlay_[block_no];
  if (!copy) {
    copy = std::make_unique<std::byte[]>(block_size_);
    std::memcpy(copy.get(), base_ + (block_no << block_shift_), block_size_);
  }
  return copy.get();
}

}  // namespace nvfs::fsck
