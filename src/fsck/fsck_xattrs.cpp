// Pass 1, extended attributes: an inode's xattr block or chain of blocks,
// decoded with the core's validator, and the value runs they name; a POSIX
// ACL value the core would refuse to read is dropped (in the chain at once,
// in the one-block format after pass 2: DropBadAcls).
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fsck/checker.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

using format::Inode;

namespace {

bool IsAclName(std::string_view name) {
  return name == format::kAclAccessName || name == format::kAclDefaultName;
}

// Whether a valid xattr block holds a POSIX ACL value that fails the
// check the core makes where it reads one (a version before ACLs stored
// any value under these names). The one-block format's (a chain's are
// checked record by record in CheckXattrBlock).
bool HoldsBadAcl(std::span<const std::byte> block) {
  bool bad = false;
  DecodeXattrBlock(block, false, [&](const XattrRecord& record) {
    if (IsAclName(record.name) && DecodeAcl(record.value, nullptr) != AclFault::kNone) bad = true;
  });
  return bad;
}

const char* XattrFaultName(XattrFault fault) {
  switch (fault) {
    case XattrFault::kNone: break;
    case XattrFault::kNoMagic: return "without its magic";
    case XattrFault::kOverfull: return "overfull";
    case XattrFault::kShortEntries: return "holding fewer entries than it counts";
    case XattrFault::kBadEntry: return "holding a damaged entry";
    case XattrFault::kNoNamespace: return "holding an attribute of no known namespace";
    case XattrFault::kTrailingBytes: return "holding bytes past its last entry";
    case XattrFault::kReserved: return "holding reserved bits";
    case XattrFault::kBadRuns: return "holding a value of damaged runs";
  }
  return nullptr;
}

}  // namespace

// The inode's xattr blocks, following the chain (one block without
// kIncompatXattrChain): each block is checked (range, metadata, claimed
// before: a loop ends there) and decoded with the core's validator before
// it is claimed and its `next` followed; each value run's blocks are checked
// and claimed. A damaged block is dropped with the rest of the chain after
// it (the pointer naming it cleared); a damaged value run drops its
// attribute only (the record made free). Returns the blocks counted.
uint64_t Checker::CheckXattrBlock(uint64_t ino, const Inode& inode) {
  const bool chain = geometry_.xattr_chain();
  uint64_t blocks = 0;
  uint64_t link_at = InodeOffset(ino) + offsetof(Inode, xattr_block);
  uint64_t block_no = inode.xattr_block;
  while (block_no != 0) {
    const BlockFault fault = CheckBlock(block_no);
    const char* what = nullptr;
    XattrBlockView view;
    // Records whose runs are damaged: dropped below, after the decode.
    struct BadRecord {
      uint32_t offset, length;
      const char* acl_fault;  // null: its runs name blocks not its own
      std::string_view name;
      std::vector<format::XattrValueRun> runs;  // a malformed ACL's: claimed if it is kept
    };
    std::vector<BadRecord> bad;
    std::vector<format::XattrValueRun> good_runs;
    if (fault != BlockFault::kNone) {
      what = FaultName(fault);
    } else {
      what = XattrFaultName(DecodeXattrBlock(
          {Block(block_no), block_size_}, chain,
          [&](const XattrRecord& record) {
            bool ok = true;
            const size_t first_run = good_runs.size();
            for (uint32_t r = 0; r < record.runs && ok; ++r) {
              const format::XattrValueRun run = record.Run(r);
              if (!geometry_.IsDataRun(run.first, run.count)) {
                ok = false;
                break;
              }
              for (uint64_t b = run.first; b < run.first + run.count; ++b) {
                // A block of an earlier run of this same record counts too.
                bool mine = false;
                for (size_t i = first_run; i < good_runs.size(); ++i) {
                  mine |= b >= good_runs[i].first && b - good_runs[i].first < good_runs[i].count;
                }
                if (mine || CheckBlock(b) != BlockFault::kNone) ok = false;
              }
              if (ok) good_runs.push_back(run);
            }
            if (!ok) {
              good_runs.resize(first_run);
              bad.push_back({record.offset, record.length, nullptr, {}, {}});
              return;
            }
            // On a chain a malformed ACL is dropped in place, as a value of
            // bad runs (one free record header), inline or in runs (over
            // 1 KiB, some 125 entries: read from its blocks, now checked).
            if (chain && !record.free && IsAclName(record.name)) {
              std::string gathered;
              std::string_view value = record.value;
              if (record.runs != 0) {
                gathered.reserve(record.value_len);
                for (size_t i = first_run; i < good_runs.size(); ++i) {
                  const uint64_t n = std::min<uint64_t>(record.value_len - gathered.size(),
                                                        good_runs[i].count * block_size_);
                  gathered.append(reinterpret_cast<const char*>(Block(good_runs[i].first)), n);
                }
                value = gathered;
              }
              const AclFault acl = DecodeAcl(value, nullptr);
              if (acl != AclFault::kNone) {
                bad.push_back({record.offset, record.length, AclFaultName(acl), record.name,
                               {good_runs.begin() + static_cast<std::ptrdiff_t>(first_run),
                                good_runs.end()}});
                good_runs.resize(first_run);
              }
            }
          },
          &view));
    }
    if (what != nullptr) {
      if (Problem(Repair::kDecision, "inode %" PRIu64 ": extended attribute block %" PRIu64
                  " %s%s; dropping it%s", ino, block_no,
                  fault != BlockFault::kNone ? "points " : "is ", what,
                  chain ? " and the blocks after it" : "")) {
        Write64(link_at, 0);
        Fixed();
      }
      return blocks;
    }
    Claim(block_no);
    if (!chain && HoldsBadAcl({Block(block_no), block_size_})) {
      // Reported and dropped once every claim is known (DropBadAcls: the
      // block copied without them); a pass on several threads is run again
      // on one.
      if (parallel_) {
        trouble_.store(true, std::memory_order_relaxed);
      } else {
        bad_acls_.push_back({ino, block_no});
      }
    }
    ++blocks;
    for (const format::XattrValueRun& run : good_runs) {
      for (uint64_t b = run.first; b < run.first + run.count; ++b) Claim(b);
      blocks += run.count;
    }
    for (const BadRecord& record : bad) {
      const bool dropped =
          record.acl_fault != nullptr
              ? Problem(Repair::kDecision, "inode %" PRIu64 ": extended attribute %.*s is not a "
                        "valid POSIX ACL (%s); dropping it", ino,
                        static_cast<int>(record.name.size()), record.name.data(),
                        record.acl_fault)
              : Problem(Repair::kDecision, "inode %" PRIu64 ": extended attribute block %" PRIu64
                        ": the value at offset %u names blocks not its own; dropping that "
                        "attribute", ino, block_no, record.offset);
      if (dropped) {
        format::XattrEntry entry{};
        entry.value_len = record.length - static_cast<uint32_t>(sizeof entry);
        Write(OffsetIn(block_no, Block(block_no) + record.offset), &entry, sizeof entry);
        Fixed();
      } else {
        // Kept (-n, or the decision declined): its blocks are still its own.
        for (const format::XattrValueRun& run : record.runs) {
          for (uint64_t b = run.first; b < run.first + run.count; ++b) Claim(b);
          blocks += run.count;
        }
      }
    }
    link_at = OffsetIn(block_no, Block(block_no) + offsetof(format::XattrBlockHeader, next));
    block_no = view.next;
  }
  return blocks;
}

void Checker::DropBadAcls() {
  for (const BadAcl& bad : bad_acls_) {
    if (halted_) return;
    const std::byte* block = Block(bad.block_no);
    format::XattrHeader header;
    std::memcpy(&header, block, sizeof header);
    // The block without the bad values: the other entries' bytes as they
    // are, one after the other.
    std::vector<std::byte> copy(block_size_);
    uint64_t pos = sizeof header;
    uint32_t count = 0;
    bool drop = false;
    DecodeXattrBlock({block, block_size_}, false, [&](const XattrRecord& record) {
      const std::string_view name = record.name;
      const std::string_view value = record.value;
      const AclFault fault = IsAclName(name) ? DecodeAcl(value, nullptr) : AclFault::kNone;
      if (fault != AclFault::kNone) {
        if (Problem(Repair::kDecision, "inode %" PRIu64 ": extended attribute %.*s is not a "
                    "valid POSIX ACL (%s); dropping it", bad.ino, static_cast<int>(name.size()),
                    name.data(), AclFaultName(fault))) {
          drop = true;
          return;
        }
      }
      const uint64_t len = format::XattrEntryLength(name.size(), value.size());
      std::memcpy(copy.data() + pos,
                  reinterpret_cast<const std::byte*>(name.data()) - sizeof(format::XattrEntry),
                  len);
      pos += len;
      ++count;
    });
    if (!drop) continue;
    header.count = count;
    header.used = static_cast<uint32_t>(pos - sizeof header);
    std::memcpy(copy.data(), &header, sizeof header);
    const uint64_t aside = FreeBlockForCopy();
    if (aside != 0) {
      Claim(aside);
      Write(geometry_.BlockOffset(aside), copy.data(), block_size_);
      WriteField(bad.ino, InodeAt(bad.ino).xattr_block, aside);
      claimed_[bad.block_no / 64] &= ~(uint64_t{1} << (bad.block_no % 64));
    } else {
      Write(geometry_.BlockOffset(bad.block_no), copy.data(), block_size_);
    }
    Fixed();
  }
  bad_acls_.clear();
}

}  // namespace nvfs::fsck
