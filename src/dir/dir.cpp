// Hashed directories: the contracts are in dir.hpp, the layout in
// doc/format.md ("Directories").
//
// Shape of the tree (extendible hashing on a radix tree). An index node at
// depth k consumes hash bits [Start(k), End(k)): F = log2(block_size / 8) bits,
// the deepest level only what is left of the 56. A leaf hanging from a depth-k
// index node has Start(k) <= prefix_bits <= End(k) and fills the
// 2^(End(k) - prefix_bits) consecutive, aligned slots of its prefix, so a split
// costs one new block per half instead of a whole index level. dir.root is
// treated as "depth -1" with End = 0: a root leaf has prefix_bits 0. A null
// slot means no name has that prefix. Only leaves with all 56 bits
// (prefix_bits == 56) chain through `next`; a chain holds names of one hash,
// so at most 64 names and never more than 64 leaves.
//
// Changing a leaf that has no room: its live entries plus the new one are
// rebuilt aside (Builder::Build): compacted into one fresh leaf when they fit,
// else split at the next hash bit, recursively, an empty half leaving null
// slots; a leaf filling exactly one slot is pushed down under a fresh index
// node. The result is published by rewriting the old leaf's slots with logged
// stores (or, when that range is wider than kMaxLoggedSlotBytes, by publishing
// a fresh copy of the index node through its parent pointer), and the old
// blocks are freed through deferred-free records.
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

namespace nvfs {

namespace {

using format::DirEntry;
using format::DirLeafHeader;
using format::Inode;
using format::kDirHashBits;
using format::kDirNodeBlockMask;
using format::kDirNodeIndexBit;

constexpr uint32_t kRecordHeader = sizeof(DirEntry);
constexpr uint32_t kLeafHeader = sizeof(DirLeafHeader);
// Names sharing one 56-bit hash in a directory: one per sequence number.
constexpr uint32_t kMaxSeq = 1u << format::kDirSeqBits;
// An overflow chain holds names of a single hash; a leaf is added only when
// no leaf of the chain has room, so each holds at least one name.
constexpr uint32_t kMaxChainLeaves = kMaxSeq;
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
constexpr uint64_t kPointerReservedBits = ~(kDirNodeIndexBit | kDirNodeBlockMask);

bool IsIndex(uint64_t ptr) { return (ptr & kDirNodeIndexBit) != 0; }
uint64_t PointerBlock(uint64_t ptr) { return ptr & kDirNodeBlockMask; }
uint64_t IndexPointer(uint64_t block) { return block | kDirNodeIndexBit; }
uint64_t HashOfKey(uint64_t key) { return key >> format::kDirSeqBits; }
uint32_t SeqOfKey(uint64_t key) { return static_cast<uint32_t>(key & (kMaxSeq - 1)); }
// The first `bits` bits of a 56-bit hash, right-aligned.
uint64_t HashPrefix(uint64_t hash56, uint32_t bits) { return hash56 >> (kDirHashBits - bits); }

Error Corrupt(uint64_t block, const char* what) {
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
  std::array<uint64_t, kMaxChainLeaves> blocks{};
  uint32_t count = 0;

  std::vector<uint64_t> ToVector() const { return {blocks.begin(), blocks.begin() + count}; }
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
// record before it is used (dir.hpp: nothing here trusts the media).
class Tree {
 public:
  explicit Tree(const FsContext& ctx)
      : ctx_(ctx),
        block_size_(ctx.geometry.block_size()),
        fanout_bits_(ctx.geometry.block_shift() - 3),
        max_depth_(static_cast<int>((kDirHashBits + fanout_bits_ - 1) / fanout_bits_) - 1) {}

  const FsContext& ctx() const { return ctx_; }
  uint32_t block_size() const { return block_size_; }
  uint32_t leaf_capacity() const { return block_size_ - kLeafHeader; }
  int max_depth() const { return max_depth_; }

  // Hash bits consumed above and by an index node at `depth` (-1: dir.root).
  uint32_t Start(int depth) const { return depth < 0 ? 0 : depth * fanout_bits_; }
  uint32_t End(int depth) const {
    return depth < 0 ? 0 : std::min((depth + 1) * fanout_bits_, kDirHashBits);
  }
  uint32_t Width(int depth) const { return End(depth) - Start(depth); }
  // Slots a leaf of `prefix_bits` fills in a depth-`depth` index node.
  uint32_t Span(int depth, uint32_t prefix_bits) const {
    return uint32_t{1} << (End(depth) - prefix_bits);
  }

  uint64_t Hash(std::string_view name) const { return DirHash56(NameHash(ctx_.hash_seed, name)); }
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
  std::string_view Name(const DirEntry& record) const {
    return {reinterpret_cast<const char*>(&record) + kRecordHeader, record.name_len};
  }

  Status CheckPointer(uint64_t ptr) const {
    if ((ptr & kPointerReservedBits) != 0 || !ctx_.ValidBlock(PointerBlock(ptr))) {
      return MakeError(EUCLEAN, "directory node pointer %#" PRIx64 " is invalid; run fsck.nvfs",
                       ptr);
    }
    return Status::Ok();
  }

  // Checks the header of leaf `block`, reached through a slot of a
  // depth-`depth` index node whose hashes begin with `path_bits` (End(depth)
  // bits).
  Status CheckLeaf(uint64_t block, int depth, uint64_t path_bits) const {
    const DirLeafHeader& leaf = Leaf(block);
    if (leaf.magic != format::kDirLeafMagic) return Corrupt(block, "bad leaf magic");
    const uint32_t bits = leaf.prefix_bits;
    if (bits < Start(depth) || bits > End(depth)) return Corrupt(block, "prefix length");
    if (leaf.prefix != path_bits >> (End(depth) - bits)) return Corrupt(block, "prefix");
    if (leaf.next != 0 && bits != kDirHashBits) return Corrupt(block, "overflow link");
    return Status::Ok();
  }

  // The chain of leaves starting at the checked leaf `head`.
  Status ReadChain(uint64_t head, Chain* chain) const {
    const DirLeafHeader& first = Leaf(head);
    chain->count = 0;
    uint64_t block = head;
    for (;;) {
      if (chain->count == kMaxChainLeaves) return Corrupt(head, "overflow chain too long");
      const DirLeafHeader& leaf = Leaf(block);
      if (chain->count > 0 &&
          (leaf.magic != format::kDirLeafMagic || leaf.prefix_bits != first.prefix_bits ||
           leaf.prefix != first.prefix)) {
        return Corrupt(block, "bad overflow leaf");
      }
      chain->blocks[chain->count++] = block;
      if (leaf.next == 0) return Status::Ok();
      if (first.prefix_bits != kDirHashBits) return Corrupt(block, "overflow link");
      if (!ctx_.ValidBlock(leaf.next)) return Corrupt(block, "overflow link out of range");
      block = leaf.next;
    }
  }

  // Walks the records of the checked leaf `block`, checking each before
  // calling fn(offset, record); stops when fn returns false.
  template <class Fn>
  Status ScanLeaf(uint64_t block, Fn&& fn) const {
    const DirLeafHeader& leaf = Leaf(block);
    const uint32_t prefix_bits = leaf.prefix_bits;
    const uint64_t prefix = leaf.prefix;
    uint32_t offset = kLeafHeader;
    while (offset < block_size_) {
      if (block_size_ - offset < kRecordHeader) return Corrupt(block, "record past the block");
      const DirEntry& record = Record(block, offset);
      const uint32_t rec_len = record.rec_len;
      if (rec_len < kRecordHeader || rec_len % 8 != 0 || rec_len > block_size_ - offset) {
        return Corrupt(block, "bad record length");
      }
      if (record.ino != 0 && (record.name_len == 0 || record.name_len > rec_len - kRecordHeader ||
                              record.key > format::kDirKeyMax ||
                              HashPrefix(HashOfKey(record.key), prefix_bits) != prefix)) {
        return Corrupt(block, "bad entry");
      }
      if (!fn(offset, record)) break;
      offset += rec_len;
    }
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
      if (depth > max_depth_) return Corrupt(PointerBlock(ptr), "tree deeper than the hash");
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
  const uint32_t fanout_bits_;
  const int max_depth_;
};

// Keeps dir.size and dir.blocks right for a change of `delta` nodes.
void AdjustNodes(Tx& tx, const Tree& tree, const Inode& dir, int64_t delta) {
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
  // `prefix_bits`-bit `prefix`) to fresh blocks: one leaf, or with all 56 bits
  // an overflow chain. Returns the head block.
  // REQUIRES: the items fit one leaf unless prefix_bits == 56.
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
  uint32_t chain_index = 0;
};

// Looks for `name` (of 56-bit hash `hash`) in the chain.
Result<Found> FindInChain(const Tree& tree, const Chain& chain, uint64_t hash,
                          std::string_view name) {
  for (uint32_t n = 0; n < chain.count; ++n) {
    bool found = false;
    Found where;
    NVFS_TRY(tree.ScanLeaf(chain.blocks[n], [&](uint32_t offset, const DirEntry& record) {
      if (record.ino != 0 && HashOfKey(record.key) == hash && tree.Name(record) == name) {
        found = true;
        where = {chain.blocks[n], offset, n};
        return false;
      }
      return true;
    }));
    if (found) return where;
  }
  return Error(ENOENT);
}

// Where `name` is in directory `dir`: the path down the tree to its leaf
// chain, the chain, and the record in it. ENOENT if it is not there.
struct Located {
  Path path;
  Chain chain;
  Found found;
};

Result<Located> Locate(const Tree& tree, const Inode& dir, std::string_view name) {
  if (name.empty() || name.size() > format::kNameMax) return Error(ENOENT);
  const uint64_t hash = tree.Hash(name);
  Result<Path> path = tree.Descend(dir, hash);
  if (!path.ok()) return path.take_error();
  if (path->node == 0) return Error(ENOENT);
  Located at{*path, {}, {}};
  NVFS_TRY(tree.ReadChain(PointerBlock(at.path.node), &at.chain));
  Result<Found> found = FindInChain(tree, at.chain, hash, name);
  if (!found.ok()) return found.take_error();
  at.found = *found;
  return at;
}

}  // namespace

Directory::Directory(const FsContext& ctx) : ctx_(ctx) {}

Result<DirEntryRef> Directory::Lookup(const Inode& dir, std::string_view name) const {
  const Tree tree(ctx_);
  Result<Located> at = Locate(tree, dir, name);
  if (!at.ok()) return at.take_error();
  const DirEntry& record = tree.Record(at->found.block, at->found.offset);
  return DirEntryRef{record.ino, record.file_type, record.key, tree.Name(record)};
}

namespace {

// Insert into a null slot (or an empty directory): one new leaf, over the
// widest aligned run of null slots around the hash that one logged store may
// rewrite, published by that store.
Status AddLeafInHole(const Tree& tree, Builder& builder, const Path& path, const LeafItem& item) {
  uint32_t run_log2 = 0;
  uint32_t first = 0;
  if (path.depth >= 0) {
    const uint64_t* slots = tree.Slots(path.index[path.depth].block);
    const uint32_t max_log2 = std::min(tree.Width(path.depth), kMaxLoggedSlotsLog2);
    first = path.slot;
    while (run_log2 < max_log2) {
      const uint32_t wider = path.slot & ~((uint32_t{2} << run_log2) - 1);
      if (!std::all_of(slots + wider, slots + wider + (uint32_t{2} << run_log2),
                       [](uint64_t p) { return p == 0; })) {
        break;
      }
      ++run_log2;
      first = wider;
    }
  }
  const uint32_t prefix_bits = tree.End(path.depth) - run_log2;
  std::vector<uint64_t> ptrs(size_t{1} << run_log2);
  NVFS_TRY(builder.Build({&item, 1}, prefix_bits, HashPrefix(HashOfKey(item.key), prefix_bits),
                         path.depth, ptrs));
  return builder.Publish(path, first, ptrs);
}

// Writes `item` into the free record at `offset` of leaf `block` (`rec_len`
// bytes, enough for it). Store order, both logged: the record past its ino
// (key, rec_len, name_len, file_type, name and padding, then, when the record
// is split, the header of the free record after it) in one store; then its
// ino, which makes the entry live.
// The body is logged, not stored fresh, although nothing reads a free record
// past its rec_len: the record may have been freed earlier in this same
// transaction (a rename removes, then inserts), and an abort or a crash must
// bring that entry back whole.
void FillFreeRecord(const Tree& tree, Tx& tx, uint64_t block, uint32_t offset, uint32_t rec_len,
                    const LeafItem& item) {
  const uint32_t name_len = static_cast<uint32_t>(item.name.size());
  const uint32_t need = format::DirRecordLength(name_len);
  const uint32_t rest = rec_len - need;
  const uint32_t new_len = rest >= kRecordHeader ? need : rec_len;
  std::array<std::byte, format::DirRecordLength(format::kNameMax) + kRecordHeader> bytes{};
  DirEntry header{};
  header.key = item.key;
  header.rec_len = new_len;
  header.name_len = static_cast<uint8_t>(name_len);
  header.file_type = item.file_type;
  std::memcpy(bytes.data(), &header, sizeof header);
  std::memcpy(bytes.data() + kRecordHeader, item.name.data(), name_len);
  uint32_t len = need;
  if (new_len != rec_len) {
    DirEntry free_record{};
    free_record.rec_len = rest;
    std::memcpy(bytes.data() + need, &free_record, sizeof free_record);
    len += kRecordHeader;
  }
  const uint64_t at = tree.BlockOffset(block) + offset;
  constexpr uint32_t kBody = offsetof(DirEntry, key);
  tx.Store(at + kBody, bytes.data() + kBody, len - kBody);
  tx.Store64(at + offsetof(DirEntry, ino), item.ino);
}

// Rebuilds the node `path` leads to (a leaf and its overflow leaves) with its
// live entries and `item`: compacted or split into fresh blocks, published by
// logged pointer stores; the old leaves are freed after commit.
Status RebuildWith(const Tree& tree, Builder& builder, const Path& path, const Chain& chain,
                   const LeafItem& item) {
  std::vector<LeafItem> items;
  for (uint32_t n = 0; n < chain.count; ++n) {
    NVFS_TRY(tree.ScanLeaf(chain.blocks[n], [&](uint32_t, const DirEntry& record) {
      if (record.ino != 0) {
        items.push_back({record.key, record.ino, record.file_type, tree.Name(record)});
      }
      return true;
    }));
  }
  items.push_back(item);
  std::sort(items.begin(), items.end(),
            [](const LeafItem& a, const LeafItem& b) { return a.key < b.key; });
  const DirLeafHeader& leaf = tree.Leaf(chain.blocks[0]);
  const uint32_t span = tree.Span(path.depth, leaf.prefix_bits);
  const uint32_t first = path.slot & ~(span - 1);
  if (path.depth >= 0) {
    const uint64_t* slots = tree.Slots(path.index[path.depth].block);
    if (!std::all_of(slots + first, slots + first + span,
                     [&](uint64_t p) { return p == path.node; })) {
      return Corrupt(path.index[path.depth].block, "leaf slots disagree with its prefix");
    }
  }
  std::vector<uint64_t> ptrs(span);
  NVFS_TRY(builder.Build(items, leaf.prefix_bits, leaf.prefix, path.depth, ptrs));
  NVFS_TRY(builder.Publish(path, first, ptrs));
  return builder.FreeNodes(chain.ToVector());
}

}  // namespace

// Store order: a new entry goes into a free record of its leaf with logged
// stores (FillFreeRecord); when none is big enough, the leaf is rebuilt aside
// (RebuildWith); into a null slot, a new leaf (AddLeafInHole). Then logged:
// dir.entries, and dir.size and dir.blocks when nodes were added. Nothing is
// logged before every block needed is allocated, so ENOSPC changes nothing
// but the allocations, which the caller's Abort undoes. A crash before commit
// is undone whole by the journal.
Status Directory::Insert(Tx& tx, const Inode& dir, std::string_view name, uint64_t ino,
                         uint8_t file_type) {
  if (name.empty()) return Error(EINVAL);
  if (name.size() > format::kNameMax) return Error(ENAMETOOLONG);
  const Tree tree(ctx_);
  const uint64_t hash = tree.Hash(name);
  Result<Path> descended = tree.Descend(dir, hash);
  if (!descended.ok()) return descended.take_error();
  const Path& path = *descended;
  Builder builder(tree, tx, tree.Goal(dir));

  if (path.node == 0) {
    Status added = AddLeafInHole(tree, builder, path, {DirKey(hash, 0), ino, file_type, name});
    if (!added.ok()) {
      builder.Cancel();
      return added;
    }
  } else {
    // One pass over the leaves: the name, the sequence numbers its hash
    // already uses, the first free record big enough.
    Chain chain;
    NVFS_TRY(tree.ReadChain(PointerBlock(path.node), &chain));
    const uint32_t need = format::DirRecordLength(static_cast<uint32_t>(name.size()));
    uint64_t used_seqs = 0;
    bool exists = false;
    Found fit;
    uint32_t fit_len = 0;
    for (uint32_t n = 0; n < chain.count && !exists; ++n) {
      NVFS_TRY(tree.ScanLeaf(chain.blocks[n], [&](uint32_t offset, const DirEntry& record) {
        if (record.ino == 0) {
          if (fit_len == 0 && record.rec_len >= need) {
            fit = {chain.blocks[n], offset, n};
            fit_len = record.rec_len;
          }
        } else if (HashOfKey(record.key) == hash) {
          if (tree.Name(record) == name) {
            exists = true;
            return false;
          }
          used_seqs |= uint64_t{1} << SeqOfKey(record.key);
        }
        return true;
      }));
    }
    if (exists) return Error(EEXIST);
    const uint32_t seq = static_cast<uint32_t>(std::countr_one(used_seqs));
    if (seq >= kMaxSeq) {
      return MakeError(ENOSPC, "%u names share one hash in this directory", kMaxSeq);
    }
    const LeafItem item{DirKey(hash, seq), ino, file_type, name};
    if (fit_len != 0) {
      FillFreeRecord(tree, tx, fit.block, fit.offset, fit_len, item);
    } else {
      Status rebuilt = RebuildWith(tree, builder, path, chain, item);
      if (!rebuilt.ok()) {
        builder.Cancel();
        return rebuilt;
      }
    }
  }
  tx.Set(dir.map.dir.entries, dir.map.dir.entries + 1);
  AdjustNodes(tx, tree, dir, builder.nodes_delta());
  if (!tx.ok()) return MakeError(ENOSPC, "journal slot full");
  return Status::Ok();
}

// Store order, all logged: the record's ino = 0; its rec_len grown over a free
// record after it; the rec_len of a free record before it grown over it;
// dir.entries. A leaf left empty (not the root leaf, which is kept like
// lost+found's) is then unlinked by one logged store of the pointer(s) to it
// and freed after commit.
Status Directory::Remove(Tx& tx, const Inode& dir, std::string_view name) {
  const Tree tree(ctx_);
  Result<Located> at = Locate(tree, dir, name);
  if (!at.ok()) return at.take_error();
  const Path& path = at->path;
  const Chain& chain = at->chain;
  const Found& found = at->found;

  // The neighbours of the record and whether it is the leaf's last entry.
  const uint64_t block = found.block;
  uint32_t prev_offset = 0;
  uint32_t live = 0;
  NVFS_TRY(tree.ScanLeaf(block, [&](uint32_t offset, const DirEntry& record) {
    if (offset < found.offset) prev_offset = offset;
    live += record.ino != 0;
    return true;
  }));
  const DirEntry& record = tree.Record(block, found.offset);
  tx.Store64(tree.Offset(&record.ino), 0);
  uint32_t rec_len = record.rec_len;
  const uint32_t next_offset = found.offset + rec_len;
  if (next_offset < tree.block_size() && tree.Record(block, next_offset).ino == 0) {
    rec_len += tree.Record(block, next_offset).rec_len;
    tx.Set(record.rec_len, rec_len);
  }
  if (prev_offset != 0 && tree.Record(block, prev_offset).ino == 0) {
    const DirEntry& prev = tree.Record(block, prev_offset);
    tx.Set(prev.rec_len, prev.rec_len + rec_len);
  }
  if (dir.map.dir.entries != 0) tx.Set(dir.map.dir.entries, dir.map.dir.entries - 1);

  if (live == 1) {
    Builder builder(tree, tx, 0);
    if (chain.count > 1) {
      // Unlink it from its chain.
      const uint64_t next = tree.Leaf(block).next;
      const uint64_t link =
          found.chain_index == 0
              ? path.link_offset
              : tree.Offset(&tree.Leaf(chain.blocks[found.chain_index - 1]).next);
      tx.Store64(link, next);
      NVFS_TRY(builder.FreeNodes({block}));
    } else if (path.depth >= 0) {
      const uint32_t span = tree.Span(path.depth, tree.Leaf(block).prefix_bits);
      const uint32_t first = path.slot & ~(span - 1);
      const uint64_t* slots = tree.Slots(path.index[path.depth].block);
      if (uint64_t{span} * 8 <= kMaxLoggedSlotBytes &&
          uint64_t{span} * 8 + kFreeTreeReserve <= tx.room() &&
          std::all_of(slots + first, slots + first + span,
                      [&](uint64_t p) { return p == path.node; })) {
        const std::vector<uint64_t> nulls(span, 0);
        tx.Store(tree.SlotOffset(path.index[path.depth].block, first), nulls.data(), span * 8);
        NVFS_TRY(builder.FreeNodes({block}));
      }
    }
    AdjustNodes(tx, tree, dir, builder.nodes_delta());
  }
  if (!tx.ok()) return MakeError(ENOSPC, "journal slot full");
  return Status::Ok();
}

// Store order, logged: the record's ino, then its file_type. Both or neither
// survive a crash (the journal).
Status Directory::Replace(Tx& tx, const Inode& dir, std::string_view name, uint64_t ino,
                          uint8_t file_type) {
  const Tree tree(ctx_);
  Result<Located> at = Locate(tree, dir, name);
  if (!at.ok()) return at.take_error();
  const DirEntry& record = tree.Record(at->found.block, at->found.offset);
  tx.Store64(tree.Offset(&record.ino), ino);
  tx.Set(record.file_type, file_type);
  if (!tx.ok()) return MakeError(ENOSPC, "journal slot full");
  return Status::Ok();
}

namespace {

// ReadDir's walk: the tree in slot order (hash order), each leaf once, its
// entries (and its overflow leaves') sorted by key in a DRAM buffer.
class Lister {
 public:
  Lister(const Tree& tree, uint64_t from_key, const std::function<bool(const DirEntryRef&)>& fn)
      : tree_(tree), from_key_(from_key), from_hash_(HashOfKey(from_key)), fn_(fn) {}

  Status Run(const Inode& dir) {
    const uint64_t root = dir.map.dir.root;
    if (root == 0) return Status::Ok();
    NVFS_TRY(tree_.CheckPointer(root));
    if (IsIndex(root)) return VisitIndex(PointerBlock(root), 0, 0, true);
    uint32_t span = 1;
    return VisitLeaf(PointerBlock(root), -1, 0, &span);
  }

 private:
  // Index node `block` at `depth`, whose hashes begin with `high_bits`
  // (Start(depth) bits). On the path of from_key (`bounded`) it starts at
  // from_key's slot: everything before it is below from_key.
  Status VisitIndex(uint64_t block, int depth, uint64_t high_bits, bool bounded) {
    if (depth > tree_.max_depth()) return Corrupt(block, "tree deeper than the hash");
    const uint32_t width = tree_.Width(depth);
    const uint32_t slots_used = uint32_t{1} << width;
    const uint64_t* slots = tree_.Slots(block);
    uint32_t slot = 0;
    if (bounded) {
      slot = static_cast<uint32_t>(HashPrefix(from_hash_, tree_.End(depth)) & (slots_used - 1));
    }
    bool first = true;
    while (slot < slots_used && !stopped_) {
      const uint64_t ptr = slots[slot];
      const uint64_t bits = (high_bits << width) | slot;
      if (ptr == 0) {
        ++slot;
      } else {
        NVFS_TRY(tree_.CheckPointer(ptr));
        if (IsIndex(ptr)) {
          NVFS_TRY(VisitIndex(PointerBlock(ptr), depth + 1, bits, bounded && first));
          ++slot;
        } else {
          uint32_t span = 1;
          NVFS_TRY(VisitLeaf(PointerBlock(ptr), depth, bits, &span));
          // Each leaf once, however many slots it fills; they must agree
          // (null ones are what FreeTree leaves while it unlinks a wide leaf
          // over several transactions).
          const uint32_t end = (slot & ~(span - 1)) + span;
          if (!std::all_of(slots + slot + 1, slots + end,
                           [&](uint64_t p) { return p == ptr || p == 0; })) {
            return Corrupt(block, "leaf slots disagree with its prefix");
          }
          slot = end;
        }
      }
      first = false;
    }
    return Status::Ok();
  }

  Status VisitLeaf(uint64_t block, int depth, uint64_t path_bits, uint32_t* span) {
    NVFS_TRY(tree_.CheckLeaf(block, depth, path_bits));
    *span = tree_.Span(depth, tree_.Leaf(block).prefix_bits);
    Chain chain;
    NVFS_TRY(tree_.ReadChain(block, &chain));
    batch_.clear();
    for (uint32_t n = 0; n < chain.count; ++n) {
      NVFS_TRY(tree_.ScanLeaf(chain.blocks[n], [&](uint32_t, const DirEntry& record) {
        if (record.ino != 0 && record.key >= from_key_) {
          batch_.push_back({record.ino, record.file_type, record.key, tree_.Name(record)});
        }
        return true;
      }));
    }
    std::sort(batch_.begin(), batch_.end(),
              [](const DirEntryRef& a, const DirEntryRef& b) { return a.key < b.key; });
    for (size_t i = 1; i < batch_.size(); ++i) {
      if (batch_[i].key == batch_[i - 1].key) return Corrupt(block, "two entries with one key");
    }
    for (const DirEntryRef& entry : batch_) {
      if (!fn_(entry)) {
        stopped_ = true;
        break;
      }
    }
    return Status::Ok();
  }

  const Tree& tree_;
  const uint64_t from_key_;
  const uint64_t from_hash_;
  const std::function<bool(const DirEntryRef&)>& fn_;
  std::vector<DirEntryRef> batch_;
  bool stopped_ = false;
};

}  // namespace

Status Directory::ReadDir(const Inode& dir, uint64_t from_key,
                          const std::function<bool(const DirEntryRef&)>& fn) const {
  if (from_key > format::kDirKeyMax) return Status::Ok();
  const Tree tree(ctx_);
  Lister lister(tree, from_key, fn);
  return lister.Run(dir);
}

// Frees the tree bottom-up, one index node at a time: the leaves below an
// index node that has no index children, then the node itself, unlinked by
// one logged store of the pointer to it. When the slot cannot take a whole
// node, leaves are unlinked one slot range at a time (logged stores of null
// slots) and freed once no slot points to them. Every intermediate state is a
// valid tree, so the caller may commit and continue in a new transaction.
Result<bool> Directory::FreeTree(Tx& tx, const Inode& dir) {
  const Tree tree(ctx_);
  Builder builder(tree, tx, 0);
  const uint64_t root_offset = tree.Offset(&dir.map.dir.root);
  bool done = false;
  // Room for this function's last stores (size, blocks, entries).
  const auto room = [&]() -> size_t {
    return tx.room() > kFreeTreeReserve ? tx.room() - kFreeTreeReserve : 0;
  };
  while (!done && tx.ok()) {
    const uint64_t root = dir.map.dir.root;
    if (root == 0) {
      done = true;
      break;
    }
    NVFS_TRY(tree.CheckPointer(root));
    Chain chain;
    if (!IsIndex(root)) {
      NVFS_TRY(tree.CheckLeaf(PointerBlock(root), -1, 0));
      NVFS_TRY(tree.ReadChain(PointerBlock(root), &chain));
      if (room() < (chain.count + 1) * kRecordCost + 8) break;
      NVFS_TRY(builder.FreeNodes(chain.ToVector()));
      tx.Store64(root_offset, 0);
      continue;
    }

    // Find an index node without index children.
    uint64_t block = PointerBlock(root);
    uint64_t link = root_offset;
    uint64_t high_bits = 0;
    int depth = 0;
    for (;;) {
      if (depth > tree.max_depth()) return Corrupt(block, "tree deeper than the hash");
      const uint64_t* slots = tree.Slots(block);
      const uint32_t used = uint32_t{1} << tree.Width(depth);
      uint32_t slot = 0;
      while (slot < used && !IsIndex(slots[slot])) ++slot;
      if (slot == used) break;
      NVFS_TRY(tree.CheckPointer(slots[slot]));
      link = tree.SlotOffset(block, slot);
      high_bits = (high_bits << tree.Width(depth)) | slot;
      block = PointerBlock(slots[slot]);
      ++depth;
    }

    // Its leaves, as runs of slots pointing to the same leaf.
    struct Run {
      uint32_t first;
      uint32_t count;
      std::vector<uint64_t> blocks;  // the leaf's chain
    };
    std::vector<Run> runs;
    size_t leaf_blocks = 0;
    const uint64_t* slots = tree.Slots(block);
    const uint32_t used = uint32_t{1} << tree.Width(depth);
    for (uint32_t slot = 0; slot < used;) {
      const uint64_t ptr = slots[slot];
      if (ptr == 0) {
        ++slot;
        continue;
      }
      NVFS_TRY(tree.CheckPointer(ptr));
      const uint64_t leaf = PointerBlock(ptr);
      NVFS_TRY(tree.CheckLeaf(leaf, depth, (high_bits << tree.Width(depth)) | slot));
      const uint32_t span = tree.Span(depth, tree.Leaf(leaf).prefix_bits);
      const uint32_t span_end = (slot & ~(span - 1)) + span;
      uint32_t end = slot + 1;
      while (end < span_end && slots[end] == ptr) ++end;
      NVFS_TRY(tree.ReadChain(leaf, &chain));
      runs.push_back({slot, end - slot, chain.ToVector()});
      leaf_blocks += chain.count;
      slot = end;
    }
    // A leaf in two runs would be freed twice: the tree is damaged.
    std::vector<uint64_t> heads;
    for (const Run& run : runs) heads.push_back(run.blocks.front());
    std::sort(heads.begin(), heads.end());
    if (std::adjacent_find(heads.begin(), heads.end()) != heads.end()) {
      return Corrupt(block, "a leaf in two places");
    }

    if ((leaf_blocks + 2) * kRecordCost + 8 <= room()) {
      std::vector<uint64_t> blocks{block};
      for (const Run& run : runs) blocks.insert(blocks.end(), run.blocks.begin(), run.blocks.end());
      NVFS_TRY(builder.FreeNodes(std::move(blocks)));
      tx.Store64(link, 0);
      continue;
    }
    // Not all at once: unlink leaves slot range by slot range.
    for (const Run& run : runs) {
      const size_t free_cost = run.blocks.size() * kRecordCost;
      if (room() < free_cost + kRecordCost + 8) break;
      const uint32_t count = static_cast<uint32_t>(
          std::min<size_t>(run.count, (room() - free_cost - kRecordCost) / 8));
      const std::vector<uint64_t> nulls(count, 0);
      tx.Store(tree.SlotOffset(block, run.first), nulls.data(), uint64_t{count} * 8);
      if (count < run.count) break;
      NVFS_TRY(builder.FreeNodes(run.blocks));
    }
    break;
  }
  if (done && dir.map.dir.entries != 0) tx.Set(dir.map.dir.entries, uint64_t{0});
  AdjustNodes(tx, tree, dir, builder.nodes_delta());
  if (!tx.ok()) return MakeError(ENOSPC, "journal slot full");
  return done;
}

}  // namespace nvfs
