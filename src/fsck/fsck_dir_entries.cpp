// Pass 2, a directory's records and entries: the rec_len chain of each leaf,
// each record's name and key against the name hash, each key and name once
// in a chain, and each entry's target (in use, of the type the entry says,
// a directory named once).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_set>

#include "fsck/dir_walker.hpp"

namespace nvfs::fsck {

using format::DirEntry;

namespace {

constexpr uint32_t kRecordHeader = sizeof(DirEntry);

// A name as it may be printed: at most 64 bytes, unprintable bytes as '?'.
std::string Printable(const char* name, size_t len) {
  std::string out;
  for (size_t i = 0; i < len && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (len > 64) out += "...";
  return out;
}

uint8_t DirTypeOf(uint8_t kind, uint32_t mode) {
  switch (kind) {
    case kRegular: return DT_REG;
    case kDirectory: return DT_DIR;
    case kSymlink: return DT_LNK;
    default: return static_cast<uint8_t>((mode & S_IFMT) >> 12);
  }
}

}  // namespace

void Checker::DirWalker::ScanLeaf(uint64_t block, uint32_t prefix_bits, uint64_t prefix) {
  if (c_.halted_) return;
  const std::byte* leaf = c_.Block(block);
  const uint64_t leaf_at = block << c_.block_shift_;
  const uint32_t bs = c_.block_size_;
  uint32_t offset = 0;  // where the walk stopped
  uint32_t prev = 0;
  const DirRecordFault fault = WalkDirLeaf(
      {leaf, bs},
      [&](uint32_t at, const DirEntry& in_leaf) {
        DirEntry record;
        std::memcpy(&record, &in_leaf, sizeof record);
        if (record.ino != 0) CheckRecord(leaf_at + at, leaf + at, record, prefix_bits, prefix);
        prev = at;
        return !c_.halted_;
      },
      &offset);
  if (fault == DirRecordFault::kNone) return;
  const uint32_t remaining = bs - offset;
  DirEntry record{};
  if (remaining >= kRecordHeader) std::memcpy(&record, leaf + offset, sizeof record);
  const uint32_t rec_len = record.rec_len;
  if (c_.Problem(Repair::kDecision, "directory %" PRIu64 ": leaf %" PRIu64 ": record at "
                 "offset %u has a bad length (%u); the rest of the leaf is lost",
                 dir_.ino, block, offset, rec_len)) {
    if (remaining >= kRecordHeader) {
      DirEntry free_record{};
      free_record.rec_len = remaining;
      c_.Write(leaf_at + offset, &free_record, sizeof free_record);
    } else {
      // Too short for a record: the previous one takes it.
      DirEntry before;
      std::memcpy(&before, leaf + prev, sizeof before);
      const uint32_t grown = before.rec_len + remaining;
      c_.Write(leaf_at + prev + offsetof(DirEntry, rec_len), &grown, sizeof grown);
    }
    c_.Fixed();
  }
}

void Checker::DirWalker::CheckRecord(uint64_t at, const std::byte* in_leaf,
                                     const DirEntry& record, uint32_t prefix_bits,
                                     uint64_t prefix) {
  const char* name = reinterpret_cast<const char*>(in_leaf + kRecordHeader);
  const uint32_t len = record.name_len;
  const char* why = nullptr;
  switch (CheckDirEntry(record, name, prefix_bits, prefix, &hash_key_)) {
    case DirEntryFault::kNone:
      if (record.ino >= c_.geometry_.inode_count()) {
        why = "names an inode out of range";
      } else if (c_.Kind(record.ino) == kFree && !c_.ReviveInode(record.ino)) {
        why = "names an inode not in use";
      }
      break;
    case DirEntryFault::kNameLength: why = "has a bad name length"; break;
    case DirEntryFault::kName: why = "has an invalid name"; break;
    case DirEntryFault::kKey: why = "has a bad key"; break;
    case DirEntryFault::kKeyNotHash: why = "has a key that is not its name's hash"; break;
    case DirEntryFault::kPrefix: why = "lies in a leaf of another prefix"; break;
  }
  if (why != nullptr) {
    Drop(at, name, std::min<uint32_t>(len, record.rec_len - kRecordHeader), record.ino, why);
    return;
  }
  entries_.push_back(
      {record.key, record.ino, at, name, static_cast<uint8_t>(len), record.file_type});
}

void Checker::DirWalker::Drop(uint64_t at, const char* name, size_t len, uint64_t ino,
                              const char* why) {
  if (c_.Problem(Repair::kDecision, "directory %" PRIu64 ": entry '%s' (inode %" PRIu64
                 ") %s; dropping it", dir_.ino, Printable(name, len).c_str(), ino, why)) {
    c_.Write64(at + offsetof(DirEntry, ino), 0);
    c_.Fixed();
  }
}

void Checker::DirWalker::CheckChainEntries() {
  std::vector<ChainEntry>& entries = entries_;
  std::stable_sort(entries.begin(), entries.end(),
                   [](const ChainEntry& a, const ChainEntry& b) { return a.key < b.key; });
  constexpr size_t kLinearRun = 16;
  std::unordered_set<std::string_view> kept_names;
  std::vector<size_t> kept;  // of the current run, in key order
  size_t run_end = 0;
  for (size_t i = 0; i < entries.size() && !c_.halted_; ++i) {
    ChainEntry& e = entries[i];
    if (i == run_end) {
      run_end = i + 1;
      while (run_end < entries.size() &&
             (entries[run_end].key >> format::kDirSeqBits) == (e.key >> format::kDirSeqBits)) {
        ++run_end;
      }
      kept.clear();
      kept_names.clear();
    }
    const bool long_run = kept.size() >= kLinearRun;
    const std::string_view name(e.name, e.name_len);
    const char* why = nullptr;
    if (!kept.empty() && entries[kept.back()].key == e.key) {
      why = "has the key of another entry";  // keys are sorted: only the last can equal
    } else if (long_run ? kept_names.count(name) != 0
                        : std::any_of(kept.begin(), kept.end(), [&](size_t j) {
                            return std::string_view(entries[j].name, entries[j].name_len) ==
                                   name;
                          })) {
      why = "repeats the name of another entry";
    }
    if (why != nullptr) {
      Drop(e.at, e.name, e.name_len, e.ino, why);
      e.ino = 0;
      continue;
    }
    Target(e);
    if (e.ino == 0) continue;
    kept.push_back(i);
    if (kept.size() == kLinearRun) {
      for (size_t j : kept) kept_names.insert({entries[j].name, entries[j].name_len});
    } else if (kept.size() > kLinearRun) {
      kept_names.insert(name);
    }
  }
}

void Checker::DirWalker::Target(ChainEntry& e) {
  const uint64_t target = e.ino;
  const uint8_t kind = c_.Kind(target);
  const char* why = nullptr;
  DirInfo* child = nullptr;
  if (target == format::kRootIno) {
    why = "names the root directory";
  } else if (target == dir_.ino) {
    why = "names its own directory";
  } else if (kind == kDirectory) {
    child = c_.FindDir(target);
    uint64_t none = 0;
    if (c_.DeadDir(*child)) {
      why = "names a deleted directory";
    } else if (!std::atomic_ref<uint64_t>(child->parent_entry)
                    .compare_exchange_strong(none, dir_.ino, std::memory_order_relaxed)) {
      why = "is a second name of a directory";
    }
  }
  if (why != nullptr) {
    Drop(e.at, e.name, e.name_len, target, why);
    e.ino = 0;
    return;
  }
  if (child != nullptr) {
    child->entry_at = e.at;  // read by pass 3, after the threads are joined
    ++subdirs_found_;
  }
  const uint8_t type =
      DirTypeOf(kind, kind == kSpecial ? c_.InodeAt(target).mode : 0);
  if (e.file_type != type &&
      c_.Problem(Repair::kSafe, "directory %" PRIu64 ": entry '%s' (inode %" PRIu64 ") has "
                 "file type %u, its inode type %u", dir_.ino,
                 Printable(e.name, e.name_len).c_str(), target, e.file_type, type)) {
    c_.Write(e.at + offsetof(DirEntry, file_type), &type, 1);
    c_.Fixed();
  }
  if (targets_ != nullptr) {
    targets_->push_back(static_cast<uint32_t>(target));
  } else {
    c_.CountReference(target);
  }
  ++entries_found_;
  if (dir_.ino == format::kRootIno && kind == kDirectory &&
      std::string_view(e.name, e.name_len) == "lost+found") {
    c_.lost_found_ = target;
  }
}

}  // namespace nvfs::fsck
