// Pass 2, a directory's tree: the pointer in its inode, its index nodes
// (slots used and unused, the range each leaf fills) and the leaf headers
// and overflow chains they lead to, and its size and blocks against the
// nodes met. The tree rules are doc/format.md's ("Directories"), checked node
// by node by nvfs/validate.hpp, which src/dir uses too: what this pass
// accepts, the core can use. The records of each leaf are
// fsck_dir_entries.cpp's.
#include <algorithm>
#include <cinttypes>
#include <vector>

#include "fsck/dir_walker.hpp"

namespace nvfs::fsck {

using format::DirLeafHeader;
using format::Inode;
using format::kDirHashBits;

uint64_t Checker::DirWalker::Run() {
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

const char* Checker::DirWalker::PointerFault(uint64_t ptr, uint64_t* block) const {
  if (CheckDirNodePointer(ptr, c_.geometry_) == DirNodeFault::kReservedBits) {
    return "has reserved bits set";
  }
  *block = ptr & format::kDirNodeBlockMask;
  const BlockFault fault = c_.CheckBlock(*block);
  return fault == BlockFault::kNone ? nullptr : FaultName(fault);
}

const char* Checker::DirWalker::LeafHeaderFault(uint64_t block, int depth,
                                                uint64_t path_bits) const {
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

void Checker::DirWalker::ClearSlots(uint64_t at, uint64_t count, uint64_t ptr, const char* why) {
  if (!c_.Problem(Repair::kDecision, "directory %" PRIu64 ": node pointer %#" PRIx64
                  " %s; clearing it (what it held goes to /lost+found)", dir_.ino, ptr, why)) {
    return;
  }
  const std::vector<uint64_t> zeros(count, 0);
  c_.Write(at, zeros.data(), count * 8);
  c_.Fixed();
}

void Checker::DirWalker::VisitIndex(uint64_t block, int depth, uint64_t high_bits) {
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

void Checker::DirWalker::VisitChain(uint64_t head) {
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

}  // namespace nvfs::fsck
