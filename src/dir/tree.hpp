// Internals shared by the directory code (dir.cpp: lookup and changes;
// readdir.cpp: listing): the tree's geometry and checked node access (Tree),
// the builder of new nodes (Builder), and finding a name (Locate). Nothing
// outside src/dir includes this; the contracts are in dir.hpp, the shape of
// the tree is described at the top of dir.cpp.
#pragma once

#include "dir/dir.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cinttypes>
#include <cstring>
#include <span>
#include <vector>

#include "nvfs/dir_block.hpp"
#include "nvfs/name_hash.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::dir_tree {


using format::DirEntry;
using format::DirLeafHeader;
using format::Inode;
using format::kDirHashBits;
using format::kDirNodeBlockMask;
using format::kDirNodeIndexBit;

constexpr uint32_t kRecordHeader = sizeof(DirEntry);
constexpr uint32_t kLeafHeader = sizeof(DirLeafHeader);
// Names sharing one hash in a directory: one per sequence number. Reaching
// that takes 2^22 names agreeing in 40 bits of a keyed PRF, so no user can,
// even knowing the key (each such name costs about 2^40 hashes).
constexpr uint32_t kMaxSeq = 1u << format::kDirSeqBits;
// The smallest block (4 KiB) has the smallest fan-out (2^9), hence the most
// index levels.
constexpr uint32_t kMinFanoutBits = 9;
constexpr int kMaxLevels = static_cast<int>((kDirHashBits + kMinFanoutBits - 1) / kMinFanoutBits);
// Slot ranges up to this many bytes are rewritten in place by one logged
// store; wider ranges (blocks of 64 KiB and more) are published by copying the
// index node, so no change logs more than this for its slots.
constexpr uint64_t kMaxLoggedSlotBytes = 4096;
constexpr uint32_t kMaxLoggedSlotsLog2 = 9;
static_assert(uint64_t{8} << kMaxLoggedSlotsLog2 == kMaxLoggedSlotBytes);
// Journal room FreeTree leaves for its own last stores and for its caller
// (and that Insert leaves when it chooses how to publish).
constexpr size_t kFreeTreeReserve = 1024;
// Journal bytes of a record without payload, and of an undo record's header.
constexpr size_t kRecordCost = sizeof(format::JournalRecord);

inline bool IsIndex(uint64_t ptr) { return (ptr & kDirNodeIndexBit) != 0; }
inline uint64_t PointerBlock(uint64_t ptr) { return ptr & kDirNodeBlockMask; }
inline uint64_t IndexPointer(uint64_t block) { return block | kDirNodeIndexBit; }
inline uint64_t HashOfKey(uint64_t key) { return key >> format::kDirSeqBits; }
inline uint32_t SeqOfKey(uint64_t key) { return static_cast<uint32_t>(key & (kMaxSeq - 1)); }
// The first `bits` bits of a hash, right-aligned.
inline uint64_t HashPrefix(uint64_t hash, uint32_t bits) { return hash >> (kDirHashBits - bits); }

inline Error Corrupt(uint64_t block, const char* what) {
  return MakeError(EUCLEAN, "directory block %" PRIu64 ": %s; run fsck.nvfs", block, what);
}

// An entry of a leaf being built. `name` points into the mapping (an old leaf,
// untouched until it is freed after commit) or at the caller's name.
struct LeafItem {
  uint64_t key = 0;
  uint64_t ino = 0;
  uint8_t file_type = 0;
  std::string_view name;
};

// The leaves of one node: the head, then its overflow leaves.
struct Chain {
  std::vector<uint64_t> blocks;
};

// Where a hash leads from dir.root.
struct Path {
  struct Step {
    uint64_t block = 0;        // an index node
    uint64_t link_offset = 0;  // media offset of the pointer to it
  };
  std::array<Step, kMaxLevels> index{};  // index[k]: the depth-k index node passed
  int depth = -1;            // depth of the index node holding the final pointer; -1: dir.root
  uint32_t slot = 0;         // the final pointer's slot in index[depth]
  uint64_t link_offset = 0;  // media offset of the final pointer
  uint64_t node = 0;         // the final pointer: 0 or a checked leaf
};

// Read-side view of one directory's tree: geometry of the levels, and checked
// access to nodes. Every pointer is checked before it is followed and every
// record before it is used (dir.hpp: nothing here trusts the media), by the
// checks fsck makes too (nvfs/validate.hpp).
class Tree {
 public:
  explicit Tree(const FsContext& ctx)
      : ctx_(ctx), block_size_(ctx.geometry.block_size()), shape_(ctx.geometry.block_shift()) {}

  const FsContext& ctx() const { return ctx_; }
  uint32_t block_size() const { return block_size_; }
  uint32_t leaf_capacity() const { return block_size_ - kLeafHeader; }
  int max_depth() const { return shape_.max_depth(); }

  // Hash bits consumed above and by an index node at `depth` (-1: dir.root).
  uint32_t Start(int depth) const { return shape_.Start(depth); }
  uint32_t End(int depth) const { return shape_.End(depth); }
  uint32_t Width(int depth) const { return shape_.Width(depth); }
  // Slots a leaf of `prefix_bits` fills in a depth-`depth` index node.
  uint32_t Span(int depth, uint32_t prefix_bits) const { return shape_.Span(depth, prefix_bits); }

  uint64_t Hash(std::string_view name) const { return DirHash(NameHash(ctx_.hash_key, name)); }
  uint64_t Offset(const void* in_mapping) const {
    return static_cast<uint64_t>(static_cast<const std::byte*>(in_mapping) - ctx_.base());
  }
  uint64_t BlockOffset(uint64_t block) const { return ctx_.geometry.BlockOffset(block); }
  uint64_t SlotOffset(uint64_t block, uint32_t slot) const {
    return BlockOffset(block) + uint64_t{slot} * 8;
  }
  const uint64_t* Slots(uint64_t block) const {
    return reinterpret_cast<const uint64_t*>(ctx_.Block(block));
  }
  const DirLeafHeader& Leaf(uint64_t block) const {
    return *reinterpret_cast<const DirLeafHeader*>(ctx_.Block(block));
  }
  const DirEntry& Record(uint64_t block, uint32_t offset) const {
    return *reinterpret_cast<const DirEntry*>(ctx_.Block(block) + offset);
  }
  std::string_view Name(const DirEntry& record) const { return DirRecordName(record); }

  Status CheckPointer(uint64_t ptr) const {
    if (CheckDirNodePointer(ptr, ctx_.geometry) != DirNodeFault::kNone) {
      return MakeError(EUCLEAN, "directory node pointer %#" PRIx64 " is invalid; run fsck.nvfs",
                       ptr);
    }
    return Status::Ok();
  }

  // Checks the header of leaf `block`, reached through a slot of a
  // depth-`depth` index node whose hashes begin with `path_bits` (End(depth)
  // bits).
  Status CheckLeaf(uint64_t block, int depth, uint64_t path_bits) const {
    switch (CheckDirLeaf(Leaf(block), shape_, depth, path_bits)) {
      case DirLeafFault::kNone: return Status::Ok();
      case DirLeafFault::kNoMagic: return Corrupt(block, "bad leaf magic");
      case DirLeafFault::kPrefixLength: return Corrupt(block, "prefix length");
      case DirLeafFault::kPrefix:
      case DirLeafFault::kOtherPrefix: return Corrupt(block, "prefix");
      case DirLeafFault::kOverflowLink: return Corrupt(block, "overflow link");
    }
    return Corrupt(block, "?");
  }

  // The most leaves a chain of `dir` may have: no more than its nodes (nor
  // than the filesystem's blocks, should dir.blocks be damaged).
  uint64_t ChainLimit(const Inode& dir) const {
    return std::min<uint64_t>(dir.blocks, ctx_.geometry.block_count());
  }

  // Calls fn(block, prev) -> Result<bool> for the checked leaf `head` (prev
  // 0), then for each overflow leaf after it (prev: the leaf linking to it),
  // checking each before; stops when fn returns false or fails. A chain of
  // more than `limit` leaves is corruption, and so is a loop, found (Brent's
  // method) within about twice the chain's length: a damaged chain is never
  // followed for long.
  template <class Fn>
  Status WalkChain(uint64_t head, uint64_t limit, Fn&& fn) const {
    const DirLeafHeader& first = Leaf(head);
    uint64_t block = head;
    uint64_t prev = 0;
    uint64_t leaves = 1;
    uint64_t tortoise = head;
    uint64_t lap = 1;
    uint64_t steps = 0;
    for (;;) {
      Result<bool> more = fn(block, prev);
      if (!more.ok()) return more.take_error();
      if (!*more) return Status::Ok();
      const uint64_t next = Leaf(block).next;
      if (next == 0) return Status::Ok();
      if (first.prefix_bits != kDirHashBits) return Corrupt(block, "overflow link");
      if (!ctx_.ValidBlock(next)) return Corrupt(block, "overflow link out of range");
      if (next == tortoise) return Corrupt(head, "overflow chain loops");
      if (++leaves > limit) return Corrupt(head, "overflow chain longer than the directory");
      if (++steps == lap) {
        tortoise = next;
        lap *= 2;
        steps = 0;
      }
      if (CheckDirOverflowLeaf(Leaf(next), first) != DirLeafFault::kNone) {
        return Corrupt(next, "bad overflow leaf");
      }
      prev = block;
      block = next;
    }
  }

  // The chain of leaves starting at the checked leaf `head` (WalkChain).
  Status ReadChain(uint64_t head, uint64_t limit, Chain* chain) const {
    chain->blocks.clear();
    return WalkChain(head, limit, [&](uint64_t block, uint64_t) -> Result<bool> {
      chain->blocks.push_back(block);
      return true;
    });
  }

  // Walks the records of the checked leaf `block` (WalkDirLeaf), checking
  // each live one too before calling fn(offset, record); stops when fn
  // returns false.
  template <class Fn>
  Status ScanLeaf(uint64_t block, Fn&& fn) const {
    const DirLeafHeader& leaf = Leaf(block);
    const uint32_t prefix_bits = leaf.prefix_bits;
    const uint64_t prefix = leaf.prefix;
    bool bad_entry = false;
    const DirRecordFault fault = WalkDirLeaf(
        {ctx_.Block(block), block_size_}, [&](uint32_t offset, const DirEntry& record) {
          if (record.ino != 0 && CheckDirEntry(record, Name(record).data(), prefix_bits,
                                               prefix) != DirEntryFault::kNone) {
            bad_entry = true;
            return false;
          }
          return static_cast<bool>(fn(offset, record));
        });
    switch (fault) {
      case DirRecordFault::kNone: break;
      case DirRecordFault::kPastBlock: return Corrupt(block, "record past the block");
      case DirRecordFault::kBadLength: return Corrupt(block, "bad record length");
    }
    if (bad_entry) return Corrupt(block, "bad entry");
    return Status::Ok();
  }

  // Follows `hash` from dir.root down to a leaf or a null pointer.
  Result<Path> Descend(const Inode& dir, uint64_t hash) const {
    Path path;
    path.link_offset = Offset(&dir.map.dir.root);
    uint64_t ptr = dir.map.dir.root;
    for (;;) {
      if (ptr == 0) return path;
      NVFS_TRY(CheckPointer(ptr));
      if (!IsIndex(ptr)) {
        NVFS_TRY(CheckLeaf(PointerBlock(ptr), path.depth, HashPrefix(hash, End(path.depth))));
        path.node = ptr;
        return path;
      }
      const int depth = path.depth + 1;
      if (depth > max_depth()) return Corrupt(PointerBlock(ptr), "tree deeper than the hash");
      const uint64_t block = PointerBlock(ptr);
      path.index[depth] = {block, path.link_offset};
      path.depth = depth;
      path.slot =
          static_cast<uint32_t>(HashPrefix(hash, End(depth)) & ((uint64_t{1} << Width(depth)) - 1));
      path.link_offset = SlotOffset(block, path.slot);
      ptr = Slots(block)[path.slot];
    }
  }

  // Group of the directory's inode, where its nodes are first placed.
  uint64_t Goal(const Inode& dir) const {
    const uint64_t block = Offset(&dir) >> ctx_.geometry.block_shift();
    return ctx_.geometry.GroupFirstBlock(
        static_cast<uint32_t>(block / ctx_.geometry.blocks_per_group()));
  }

 private:
  const FsContext& ctx_;
  const uint32_t block_size_;
  const DirTreeShape shape_;
};

// Keeps dir.size and dir.blocks right for a change of `delta` nodes.
inline void AdjustNodes(Tx& tx, const Tree& tree, const Inode& dir, int64_t delta) {
  if (delta == 0) return;
  const uint64_t d = static_cast<uint64_t>(delta);  // two's complement wraps as wanted
  tx.Set(dir.size, dir.size + d * tree.block_size());
  tx.Set(dir.blocks, dir.blocks + d);
}

// Makes the nodes of one change aside (fresh blocks, fresh stores), then
// publishes them. Counts the nodes it allocates and frees. If the change fails
// before it is published, Cancel() frees what was allocated (deferred), so the
// transaction is consistent whether the caller commits or aborts it.
class Builder {
 public:
  Builder(const Tree& tree, Tx& tx, uint64_t goal) : tree_(tree), tx_(tx), goal_(goal) {}

  int64_t nodes_delta() const { return nodes_delta_; }

  Result<uint64_t> AllocateNode() {
    Result<Extent> run = tree_.ctx().alloc.AllocateBlocks(tx_, goal_, 1);
    if (!run.ok()) return run.take_error();
    allocated_.push_back(run->first);
    goal_ = run->first + 1;
    ++nodes_delta_;
    return run->first;
  }

  // Frees `blocks` after commit, in as few records as they allow.
  Status FreeNodes(std::vector<uint64_t> blocks) {
    std::sort(blocks.begin(), blocks.end());
    size_t i = 0;
    while (i < blocks.size()) {
      size_t j = i + 1;
      while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
      NVFS_TRY(tree_.ctx().alloc.FreeBlocks(tx_, blocks[i], j - i));
      nodes_delta_ -= static_cast<int64_t>(j - i);
      i = j;
    }
    return Status::Ok();
  }

  void Cancel() {
    for (uint64_t block : allocated_) (void)tree_.ctx().alloc.FreeBlocks(tx_, block, 1);
    nodes_delta_ -= static_cast<int64_t>(allocated_.size());
    allocated_.clear();
  }

  // Writes the leaves holding `items` (sorted by key, all beginning with the
  // `prefix_bits`-bit `prefix`) to fresh blocks: one leaf, or with all
  // kDirHashBits bits an overflow chain. Returns the head block.
  // REQUIRES: the items fit one leaf unless prefix_bits == kDirHashBits.
  Result<uint64_t> WriteLeaves(std::span<const LeafItem> items, uint32_t prefix_bits,
                               uint64_t prefix) {
    // Split the items into leaves, greedily in key order.
    std::vector<size_t> starts{0};
    uint32_t used = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const uint32_t need = format::DirRecordLength(static_cast<uint32_t>(items[i].name.size()));
      if (used + need > tree_.leaf_capacity()) {
        starts.push_back(i);
        used = 0;
      }
      used += need;
    }
    std::vector<uint64_t> blocks;
    for (size_t n = 0; n < starts.size(); ++n) {
      Result<uint64_t> block = AllocateNode();
      if (!block.ok()) return block.take_error();
      blocks.push_back(*block);
    }
    for (size_t n = 0; n < starts.size(); ++n) {
      const size_t end = n + 1 < starts.size() ? starts[n + 1] : items.size();
      DirLeafBuilder leaf(Buffer(), static_cast<uint16_t>(prefix_bits), prefix);
      for (size_t i = starts[n]; i < end; ++i) {
        leaf.Add(items[i].ino, items[i].key, items[i].file_type, items[i].name);
      }
      const uint64_t next = n + 1 < blocks.size() ? blocks[n + 1] : 0;
      std::memcpy(buffer_.data() + offsetof(DirLeafHeader, next), &next, sizeof next);
      tx_.StoreFresh(tree_.BlockOffset(blocks[n]), buffer_.data(), buffer_.size());
    }
    return blocks.front();
  }

  // Makes the nodes holding `items` (sorted by key, all beginning with the
  // `prefix_bits`-bit `prefix`) below a depth-`depth` index node and writes
  // the pointers for the Span(depth, prefix_bits) slots they fill to `slots`.
  Status Build(std::span<const LeafItem> items, uint32_t prefix_bits, uint64_t prefix, int depth,
               std::span<uint64_t> slots) {
    if (items.empty()) {
      std::fill(slots.begin(), slots.end(), 0);
      return Status::Ok();
    }
    uint64_t bytes = 0;
    for (const LeafItem& item : items) {
      bytes += format::DirRecordLength(static_cast<uint32_t>(item.name.size()));
    }
    if (bytes <= tree_.leaf_capacity() || prefix_bits == kDirHashBits) {
      Result<uint64_t> leaf = WriteLeaves(items, prefix_bits, prefix);
      if (!leaf.ok()) return leaf.take_error();
      std::fill(slots.begin(), slots.end(), *leaf);
      return Status::Ok();
    }
    if (prefix_bits < tree_.End(depth)) {
      // Split at the next bit; items are in hash order, so the halves are
      // contiguous.
      const uint32_t shift = kDirHashBits - 1 - prefix_bits;
      const auto upper = std::partition_point(items.begin(), items.end(), [&](const LeafItem& i) {
        return ((HashOfKey(i.key) >> shift) & 1) == 0;
      });
      const size_t lower_count = static_cast<size_t>(upper - items.begin());
      const size_t half = slots.size() / 2;
      NVFS_TRY(
          Build(items.first(lower_count), prefix_bits + 1, prefix << 1, depth, slots.first(half)));
      return Build(items.subspan(lower_count), prefix_bits + 1, (prefix << 1) | 1, depth,
                   slots.subspan(half));
    }
    // The items fill exactly one slot: push them down under a new index node.
    std::vector<uint64_t> child(tree_.block_size() / 8, 0);
    const uint32_t width = tree_.Width(depth + 1);
    NVFS_TRY(Build(items, prefix_bits, prefix, depth + 1,
                   std::span<uint64_t>(child).first(size_t{1} << width)));
    Result<uint64_t> block = AllocateNode();
    if (!block.ok()) return block.take_error();
    tx_.StoreFresh(tree_.BlockOffset(*block), child.data(), tree_.block_size());
    slots[0] = IndexPointer(*block);
    return Status::Ok();
  }

  // Replaces the pointers of slots [first, first + ptrs.size()) of the node
  // holding path.link_offset (dir.root when path.depth < 0).
  // Store order: any fresh copy of the index node is written and allocated
  // first, so a failure leaves nothing logged; then one logged store: the
  // slot range in place, or the parent's pointer to the copy.
  Status Publish(const Path& path, uint32_t first, std::span<const uint64_t> ptrs) {
    if (path.depth < 0) {
      tx_.Store64(path.link_offset, ptrs[0]);
      return Status::Ok();
    }
    const Path::Step& parent = path.index[path.depth];
    const uint64_t bytes = ptrs.size() * 8;
    // A small journal slot (they may be 4 KiB) takes the copy even for a
    // narrow range, keeping room for the caller's other records.
    if (bytes <= kMaxLoggedSlotBytes && bytes + kRecordCost + kFreeTreeReserve <= tx_.room()) {
      tx_.Store(tree_.SlotOffset(parent.block, first), ptrs.data(), bytes);
      return Status::Ok();
    }
    Result<uint64_t> copy = AllocateNode();
    if (!copy.ok()) return copy.take_error();
    Buffer();
    std::memcpy(buffer_.data(), tree_.ctx().Block(parent.block), buffer_.size());
    std::memcpy(buffer_.data() + uint64_t{first} * 8, ptrs.data(), bytes);
    tx_.StoreFresh(tree_.BlockOffset(*copy), buffer_.data(), buffer_.size());
    tx_.Store64(parent.link_offset, IndexPointer(*copy));
    return FreeNodes({parent.block});
  }

 private:
  // A block-sized scratch buffer, made on first use (blocks may be 1 MiB).
  std::span<std::byte> Buffer() {
    if (buffer_.empty()) buffer_.resize(tree_.block_size());
    return buffer_;
  }

  const Tree& tree_;
  Tx& tx_;
  uint64_t goal_;
  std::vector<std::byte> buffer_;
  std::vector<uint64_t> allocated_;
  int64_t nodes_delta_ = 0;
};

// Where a name was found.
struct Found {
  uint64_t block = 0;   // the leaf
  uint32_t offset = 0;  // the record
  uint64_t prev = 0;    // the leaf of its chain linking to `block`; 0: the head
};

// Looks for `name` (of hash `hash`) in the chain headed by the checked leaf
// `head`.
inline Result<Found> FindInChain(const Tree& tree, uint64_t head, uint64_t limit, uint64_t hash,
                                 std::string_view name) {
  bool found = false;
  Found where;
  NVFS_TRY(tree.WalkChain(head, limit, [&](uint64_t block, uint64_t prev) -> Result<bool> {
    NVFS_TRY(tree.ScanLeaf(block, [&](uint32_t offset, const DirEntry& record) {
      if (record.ino != 0 && HashOfKey(record.key) == hash && tree.Name(record) == name) {
        found = true;
        where = {block, offset, prev};
        return false;
      }
      return true;
    }));
    return !found;
  }));
  if (!found) return Error(ENOENT);
  return where;
}

// Where `name` is in directory `dir`: the path down the tree to its leaf
// chain, and the record in the chain. ENOENT if it is not there.
struct Located {
  Path path;
  Found found;
};

inline Result<Located> Locate(const Tree& tree, const Inode& dir, std::string_view name) {
  if (name.empty() || name.size() > format::kNameMax) return Error(ENOENT);
  const uint64_t hash = tree.Hash(name);
  Result<Path> path = tree.Descend(dir, hash);
  if (!path.ok()) return path.take_error();
  if (path->node == 0) return Error(ENOENT);
  Result<Found> found =
      FindInChain(tree, PointerBlock(path->node), tree.ChainLimit(dir), hash, name);
  if (!found.ok()) return found.take_error();
  return Located{*path, *found};
}

}  // namespace nvfs::dir_tree
