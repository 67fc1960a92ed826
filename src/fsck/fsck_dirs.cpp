// Pass 2: every directory, in inode order — its tree (node pointers, index
// slots, leaf headers and prefixes, overflow chains), its records (the
// rec_len chain, names, keys against the name hash), and its entries' targets
// (in use, of the type the entry says, a directory named once). Pass 3: every
// directory reaches the root through the entries that name them.
//
// The tree rules are doc/format.md's ("Directories"), checked node by node
// by nvfs/validate.hpp, which src/dir uses too: what this pass accepts, the
// core can use.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_set>

#include "fsck/checker.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fsck {

using format::DirEntry;
using format::DirLeafHeader;
using format::Inode;
using format::kDirHashBits;

namespace {

constexpr uint32_t kLeafHeader = sizeof(DirLeafHeader);
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

// One directory's walk. Every pointer is checked before it is followed, and
// every block claimed before it is read as a node, so a loop in the tree is a
// block met twice.
class Checker::DirWalker {
 public:
  // `entries` is scratch space, reused from one directory to the next. With
  // `targets` (a pass on threads), the inodes entries name are logged there,
  // to be counted once the threads are joined, instead of counted at once.
  DirWalker(Checker& checker, DirInfo& dir, std::vector<ChainEntry>& entries,
            std::vector<uint32_t>* targets)
      : c_(checker),
        dir_(dir),
        inode_(checker.InodeAt(dir.ino)),
        shape_(checker.block_shift_),
        live_(!checker.DeadDir(dir)),
        hash_key_(NameHashKey::FromSuper(checker.super_)),
        entries_(entries),
        targets_(targets) {}

  // Returns the entries found.
  uint64_t Run() {
    if (dir_.empty_root) return 0;
    const uint64_t root_at = c_.InodeOffset(dir_.ino) + offsetof(Inode, map) +
                             offsetof(format::InodeDirMap, root);
    const uint64_t ptr = inode_.map.dir.root;
    if (ptr != 0) {
      uint64_t block = 0;
      const char* fault = PointerFault(ptr, &block);
      if (fault == nullptr && (ptr & format::kDirNodeIndexBit)) {
        c_.Claim(block);
        VisitIndex(block, 0, 0);
      } else {
        if (fault == nullptr) fault = LeafHeaderFault(block, -1, 0);
        if (fault != nullptr) {
          ClearSlots(root_at, 1, ptr, fault);
        } else {
          c_.Claim(block);
          VisitChain(block);
        }
      }
    }
    // Counted aside and stored once: neighbouring DirInfos belong to other
    // threads.
    dir_.entries = entries_found_;
    dir_.subdirs = subdirs_found_;
    if (c_.halted_) return dir_.entries;
    const uint64_t size = nodes_ << c_.block_shift_;
    if (inode_.size != size &&
        c_.Problem(Repair::kSafe, "directory %" PRIu64 ": size %" PRIu64 ", should be %" PRIu64
                   " (%" PRIu64 " nodes)", dir_.ino, inode_.size, size, nodes_)) {
      c_.WriteField(dir_.ino, inode_.size, size);
      c_.Fixed();
    }
    const uint64_t blocks = nodes_ + dir_.xattr;
    if (inode_.blocks != blocks &&
        c_.Problem(Repair::kSafe, "directory %" PRIu64 ": i_blocks is %" PRIu64 ", counted %"
                   PRIu64, dir_.ino, inode_.blocks, blocks)) {
      c_.WriteField(dir_.ino, inode_.blocks, blocks);
      c_.Fixed();
    }
    return dir_.entries;
  }

 private:
  uint32_t End(int depth) const { return shape_.End(depth); }
  uint32_t Width(int depth) const { return shape_.Width(depth); }
  const DirLeafHeader& Leaf(uint64_t block) const {
    return *reinterpret_cast<const DirLeafHeader*>(c_.Block(block));
  }

  // The pointer's own check, then the block's against what the check has
  // met so far (a block claimed: metadata, or reached before).
  const char* PointerFault(uint64_t ptr, uint64_t* block) const {
    if (CheckDirNodePointer(ptr, c_.geometry_) == DirNodeFault::kReservedBits) {
      return "has reserved bits set";
    }
    *block = ptr & format::kDirNodeBlockMask;
    const BlockFault fault = c_.CheckBlock(*block);
    return fault == BlockFault::kNone ? nullptr : FaultName(fault);
  }

  // The header of a leaf reached through a slot of a depth-`depth` index node
  // whose hashes begin with `path_bits` (End(depth) bits).
  // An overflow link above the last level is no fault here: VisitChain
  // cuts it and keeps the leaf.
  const char* LeafHeaderFault(uint64_t block, int depth, uint64_t path_bits) const {
    switch (CheckDirLeaf(Leaf(block), shape_, depth, path_bits)) {
      case DirLeafFault::kNone:
      case DirLeafFault::kOverflowLink: return nullptr;
      case DirLeafFault::kNoMagic: return "to a block that is no directory leaf";
      case DirLeafFault::kPrefixLength: return "to a leaf of the wrong prefix length";
      case DirLeafFault::kPrefix:
      case DirLeafFault::kOtherPrefix: return "to a leaf of another prefix";
    }
    return nullptr;
  }

  void ClearSlots(uint64_t at, uint64_t count, uint64_t ptr, const char* why) {
    if (!c_.Problem(Repair::kDecision, "directory %" PRIu64 ": node pointer %#" PRIx64
                    " %s; clearing it (what it held goes to /lost+found)", dir_.ino, ptr, why)) {
      return;
    }
    const std::vector<uint64_t> zeros(count, 0);
    c_.Write(at, zeros.data(), count * 8);
    c_.Fixed();
  }

  void VisitIndex(uint64_t block, int depth, uint64_t high_bits) {
    ++nodes_;
    const uint32_t width = Width(depth);
    const uint32_t used = uint32_t{1} << width;
    const uint32_t ptrs = c_.block_size_ / 8;
    const auto* slots = reinterpret_cast<const uint64_t*>(c_.Block(block));
    const uint64_t block_at = block << c_.block_shift_;
    // The deepest level uses only the hash bits left; its other slots stay null.
    if (std::any_of(slots + used, slots + ptrs, [](uint64_t p) { return p != 0; }) &&
        c_.Problem(Repair::kDecision, "directory %" PRIu64 ": index block %" PRIu64
                   " has slots set past the hash bits; clearing them", dir_.ino, block)) {
      const std::vector<uint64_t> zeros(ptrs - used, 0);
      c_.Write(block_at + 8 * uint64_t{used}, zeros.data(), (ptrs - used) * 8);
      c_.Fixed();
    }
    uint32_t s = 0;
    while (s < used && !c_.halted_) {
      const uint64_t ptr = slots[s];
      if (ptr == 0) {
        ++s;
        continue;
      }
      const uint64_t bits = (high_bits << width) | s;
      uint64_t child = 0;
      const char* fault = PointerFault(ptr, &child);
      if (fault == nullptr && (ptr & format::kDirNodeIndexBit)) {
        if (depth + 1 > shape_.max_depth()) {
          fault = "to an index node deeper than the hash";
        } else {
          c_.Claim(child);
          VisitIndex(child, depth + 1, bits);
          ++s;
          continue;
        }
      }
      uint32_t run_end = s + 1;
      while (run_end < used && slots[run_end] == ptr) ++run_end;
      if (fault == nullptr) fault = LeafHeaderFault(child, depth, bits);
      uint32_t first = s, end = s + 1;
      if (fault == nullptr) {
        const uint32_t span = uint32_t{1} << (End(depth) - Leaf(child).prefix_bits);
        first = s & ~(span - 1);
        end = first + span;
        if (std::any_of(slots + first, slots + s, [](uint64_t p) { return p != 0; })) {
          fault = "to a leaf overlapping another node";
        }
      }
      if (fault != nullptr) {
        ClearSlots(block_at + 8 * uint64_t{s}, run_end - s, ptr, fault);
        s = run_end;
        continue;
      }
      c_.Claim(child);
      VisitChain(child);
      // The rest of the leaf's range: the same pointer, or (in a directory
      // being freed, where FreeTree unlinks a wide leaf piecewise) null.
      uint32_t holes = 0;
      for (uint32_t t = first; t < end && !c_.halted_; ++t) {
        if (slots[t] == ptr) continue;
        if (slots[t] != 0) {
          ClearSlots(block_at + 8 * uint64_t{t}, 1, slots[t],
                     "lies inside another leaf's range");
          if (c_.halted_ || slots[t] != 0) continue;
        }
        ++holes;
      }
      if (holes != 0 && live_ && !c_.halted_ &&
          c_.Problem(Repair::kDecision, "directory %" PRIu64 ": index block %" PRIu64
                     ": leaf %" PRIu64 " fills %u of its %u slots; completing its range",
                     dir_.ino, block, child, end - first - holes, end - first)) {
        for (uint32_t t = first; t < end; ++t) {
          if (slots[t] == 0) c_.Write64(block_at + 8 * uint64_t{t}, ptr);
        }
        c_.Fixed();
      }
      s = end;
    }
  }

  // The leaf chain headed by the checked and claimed leaf `head`.
  void VisitChain(uint64_t head) {
    ++nodes_;
    entries_.clear();
    const DirLeafHeader& first = Leaf(head);
    const uint32_t prefix_bits = first.prefix_bits;
    const uint64_t prefix = first.prefix;
    ScanLeaf(head, prefix_bits, prefix);
    uint64_t prev = head;
    uint64_t next = first.next;
    if (next != 0 && prefix_bits != kDirHashBits) {
      if (c_.Problem(Repair::kDecision, "directory %" PRIu64 ": leaf %" PRIu64 " has an overflow "
                     "link above the last level; clearing it", dir_.ino, head)) {
        c_.Write64(c_.OffsetIn(head, &first.next), 0);
        c_.Fixed();
      }
      next = 0;
    }
    // Every leaf is claimed, so a loop ends at a block met twice.
    while (next != 0 && !c_.halted_) {
      const char* fault = nullptr;
      const BlockFault block_fault = c_.CheckBlock(next);
      if (block_fault != BlockFault::kNone) {
        fault = FaultName(block_fault);
      } else {
        switch (CheckDirOverflowLeaf(Leaf(next), first)) {
          case DirLeafFault::kNone: break;
          case DirLeafFault::kNoMagic: fault = "is no directory leaf"; break;
          default: fault = "is a leaf of another prefix"; break;
        }
      }
      if (fault != nullptr) {
        if (c_.Problem(Repair::kDecision, "directory %" PRIu64 ": leaf %" PRIu64 ": overflow "
                       "link %" PRIu64 " %s; cutting the chain there", dir_.ino, prev, next,
                       fault)) {
          c_.Write64(c_.OffsetIn(prev, &Leaf(prev).next), 0);
          c_.Fixed();
        }
        break;
      }
      c_.Claim(next);
      ++nodes_;
      ScanLeaf(next, prefix_bits, prefix);
      prev = next;
      next = Leaf(next).next;
    }
    if (!c_.halted_) CheckChainEntries();
  }

  // The records of one leaf: the rec_len chain must end exactly at the end of
  // the block; a broken chain loses the rest of the leaf.
  void ScanLeaf(uint64_t block, uint32_t prefix_bits, uint64_t prefix) {
    const std::byte* leaf = c_.Block(block);
    const uint64_t leaf_at = block << c_.block_shift_;
    const uint32_t bs = c_.block_size_;
    uint32_t offset = kLeafHeader;
    uint32_t prev = 0;
    while (offset < bs && !c_.halted_) {
      const uint32_t remaining = bs - offset;
      DirEntry record{};
      if (remaining >= kRecordHeader) std::memcpy(&record, leaf + offset, sizeof record);
      const uint32_t rec_len = record.rec_len;
      if (CheckDirRecordLength(rec_len, remaining) != DirRecordFault::kNone) {
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
        return;
      }
      if (record.ino != 0) CheckRecord(leaf_at + offset, leaf + offset, record, prefix_bits, prefix);
      prev = offset;
      offset += rec_len;
    }
  }

  void CheckRecord(uint64_t at, const std::byte* in_leaf, const DirEntry& record,
                   uint32_t prefix_bits, uint64_t prefix) {
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

  void Drop(uint64_t at, const char* name, size_t len, uint64_t ino, const char* why) {
    if (c_.Problem(Repair::kDecision, "directory %" PRIu64 ": entry '%s' (inode %" PRIu64
                   ") %s; dropping it", dir_.ino, Printable(name, len).c_str(), ino, why)) {
      c_.Write64(at + offsetof(DirEntry, ino), 0);
      c_.Fixed();
    }
  }

  // The chain's entries, each key once and each name once; then their targets.
  // Entries are taken in key order; one repeating the key or the name of an
  // earlier entry still kept is dropped. Names are compared within a run of
  // one hash only (a set of them when the run is long: a chain may hold any
  // number of names of one hash).
  void CheckChainEntries() {
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

  // An entry that passed every check of its own: its target.
  void Target(ChainEntry& e) {
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

  Checker& c_;
  DirInfo& dir_;
  const Inode& inode_;
  const DirTreeShape shape_;
  const bool live_;  // not an unlinked directory being freed
  const NameHashKey hash_key_;
  std::vector<ChainEntry>& entries_;  // of the leaf chain being checked
  std::vector<uint32_t>* const targets_;
  uint64_t nodes_ = 0;
  uint64_t entries_found_ = 0;
  uint32_t subdirs_found_ = 0;
};

void Checker::CheckDirectories() {
  const uint64_t groups = geometry_.group_count();
  report_.directories = dirs_.size();
  // Threads log the inodes entries name as 32-bit numbers.
  const unsigned workers =
      geometry_.inode_count() > UINT32_MAX
          ? 1
          : static_cast<unsigned>(std::min<uint64_t>(threads_, dirs_.size() / 16));
  if (workers > 1) {
    // The threads claim directory nodes and set parent entries; kept to
    // start again from, should they meet a problem.
    const std::vector<uint64_t> claimed = claimed_;
    std::vector<std::vector<ChainEntry>> scratch(workers);
    std::vector<std::vector<uint32_t>> targets(workers);
    uint64_t expected = 0;  // what the directories say they hold: a hint
    for (const DirInfo& dir : dirs_) {
      expected += std::min<uint64_t>(InodeAt(dir.ino).map.dir.entries, geometry_.inode_count());
    }
    for (std::vector<uint32_t>& log : targets) {
      log.reserve(std::min<uint64_t>(expected, geometry_.inode_count()) / workers + 1024);
    }
    parallel_ = true;
    const uint64_t entries =
        RunWorkers(workers, dirs_.size(), groups, groups, [&](uint64_t i, unsigned worker) {
          return DirWalker(*this, dirs_[i], scratch[worker], &targets[worker]).Run();
        });
    parallel_ = false;
    if (!trouble_.load()) {
      for (const std::vector<uint32_t>& logged : targets) {
        for (uint32_t target : logged) CountReference(target);
      }
      report_.entries += entries;
      Progress(2 * groups);
      return;
    }
    trouble_.store(false);
    claimed_ = claimed;
    revived_dirs_.clear();  // (none: a revival on a thread is trouble)
    for (DirInfo& dir : dirs_) {
      dir.parent_entry = dir.entry_at = dir.entries = 0;
      dir.subdirs = 0;
    }
    lost_found_ = 0;
  }
  std::vector<ChainEntry> scratch;
  for (DirInfo& dir : dirs_) {
    if (halted_) return;
    report_.entries += DirWalker(*this, dir, scratch, nullptr).Run();
    Progress(groups + geometry_.InodeGroup(dir.ino));
  }
  // Directories revived on the way (an entry names them, their bit is
  // clear: ReviveInode), and those their entries revive in turn, until none
  // is left. Each is revived once (its state is no longer free), so this ends.
  for (size_t i = 0; i < revived_dirs_.size() && !halted_; ++i) {
    report_.entries += DirWalker(*this, revived_dirs_[i], scratch, nullptr).Run();
  }
  if (!revived_dirs_.empty()) {
    report_.directories += revived_dirs_.size();
    dirs_.insert(dirs_.end(), revived_dirs_.begin(), revived_dirs_.end());
    revived_dirs_.clear();
    std::sort(dirs_.begin(), dirs_.end(),
              [](const DirInfo& a, const DirInfo& b) { return a.ino < b.ino; });
  }
  Progress(2 * groups);
}

// Pass 3. Following the entry that names it, every directory must reach the
// root. One that no entry names, or that sits in a loop of directories naming
// each other, is connected to /lost+found (the loop broken by dropping the
// entry that closes it). An unlinked directory being freed (on the orphan
// list, no links) needs no parent.
void Checker::CheckConnectivity() {
  DirInfo* root = FindDir(format::kRootIno);
  root->connected = true;
  uint32_t walk = 0;
  const auto dead = [this](const DirInfo& d) { return DeadDir(d); };
  for (DirInfo& dir : dirs_) {
    if (dir.connected || dead(dir)) continue;
    ++walk;
    DirInfo* x = &dir;
    for (;;) {
      x->walk = walk;
      if (x->parent_entry == 0) {
        Problem(Repair::kSafe, "directory %" PRIu64 " is in no directory; connecting it to "
                "/lost+found", x->ino);
        x->reconnect = true;  // -n: as if connected
        break;
      }
      DirInfo* parent = FindDir(x->parent_entry);
      if (parent->connected) break;
      if (parent->walk == walk || dead(*parent)) {
        // A loop (or a parent being freed): cut x out of it.
        if (Problem(Repair::kSafe, "directory %" PRIu64 " is in %s unreachable from the root; "
                    "connecting it to /lost+found", x->ino,
                    dead(*parent) ? "a directory being deleted" : "a loop of directories")) {
          Write64(x->entry_at + offsetof(DirEntry, ino), 0);
        }
        --parent->subdirs;
        --parent->entries;
        x->parent_entry = 0;
        x->reconnect = true;
        break;
      }
      x = parent;
    }
    for (x = &dir; x != nullptr && x->walk == walk && !x->connected;) {
      x->connected = true;
      x = x->parent_entry != 0 ? FindDir(x->parent_entry) : nullptr;
    }
  }
  // The parent field ("..") of every directory in place.
  for (DirInfo& dir : dirs_) {
    if (dir.reconnect || dead(dir) || dir.empty_root) continue;
    const uint64_t want = dir.ino == format::kRootIno ? format::kRootIno : dir.parent_entry;
    const Inode& inode = InodeAt(dir.ino);
    if (inode.parent != want &&
        Problem(Repair::kSafe, "directory %" PRIu64 ": parent is %" PRIu64 ", should be %" PRIu64,
                dir.ino, inode.parent, want)) {
      WriteField(dir.ino, inode.parent, want);
      Fixed();
    }
  }
}

}  // namespace nvfs::fsck
