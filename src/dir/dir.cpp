// Hashed directories: the contracts are in dir.hpp, the layout in
// doc/format.md ("Directories").
//
// Shape of the tree (extendible hashing on a radix tree). An index node at
// depth k consumes hash bits [Start(k), End(k)): F = log2(block_size / 8) bits,
// the deepest level only what is left of the 40. A leaf hanging from a depth-k
// index node has Start(k) <= prefix_bits <= End(k) and fills the
// 2^(End(k) - prefix_bits) consecutive, aligned slots of its prefix, so a split
// costs one new block per half instead of a whole index level. dir.root is
// treated as "depth -1" with End = 0: a root leaf has prefix_bits 0. A null
// slot means no name has that prefix. Only leaves with all 40 bits
// (prefix_bits == 40) chain through `next`; a chain holds names of one hash,
// as many as there are (each with its own sequence number): a leaf is
// appended when none of the chain has room (AppendLeaf), and one left empty
// is unlinked. Names of one hash cannot be split apart, so past a leaf's
// capacity they cost a longer walk, never a refusal.
//
// Changing a leaf above the last level that has no room: its live entries plus the new one are
// rebuilt aside (Builder::Build): compacted into one fresh leaf when they fit,
// else split at the next hash bit, recursively, an empty half leaving null
// slots; a leaf filling exactly one slot is pushed down under a fresh index
// node. The result is published by rewriting the old leaf's slots with logged
// stores (or, when that range is wider than kMaxLoggedSlotBytes, by publishing
// a fresh copy of the index node through its parent pointer), and the old
// blocks are freed through deferred-free records.
#include "dir/tree.hpp"

namespace nvfs {

using namespace dir_tree;

Directory::Directory(const FsContext& ctx) : ctx_(ctx) {}

Result<DirEntryRef> Directory::LookupBody(const Inode& dir, std::string_view name) const {
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

// Rebuilds the leaf `path` leads to (one with prefix_bits < 40, so no
// overflow leaves) with its live entries and `item`: compacted or split into
// fresh blocks, published by logged pointer stores; the old leaf is freed
// after commit.
Status RebuildWith(const Tree& tree, Builder& builder, const Path& path, const LeafItem& item) {
  const uint64_t block = PointerBlock(path.node);
  std::vector<LeafItem> items;
  NVFS_TRY(tree.ScanLeaf(block, [&](uint32_t, const DirEntry& record) {
    if (record.ino != 0) {
      items.push_back({record.key, record.ino, record.file_type, tree.Name(record)});
    }
    return true;
  }));
  items.push_back(item);
  std::sort(items.begin(), items.end(),
            [](const LeafItem& a, const LeafItem& b) { return a.key < b.key; });
  const DirLeafHeader& leaf = tree.Leaf(block);
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
  return builder.FreeNodes({block});
}

// Adds a fresh leaf holding `item` after `last`, the last leaf of a chain of
// names of one hash (prefix_bits == 40: nothing left to split on). Store
// order: the new leaf, whole, into a fresh block (Builder::WriteLeaves); then
// one logged store of last's `next`, which publishes it.
Status AppendLeaf(const Tree& tree, Builder& builder, Tx& tx, uint64_t last,
                  const LeafItem& item) {
  const DirLeafHeader& tail = tree.Leaf(last);
  Result<uint64_t> block = builder.WriteLeaves({&item, 1}, tail.prefix_bits, tail.prefix);
  if (!block.ok()) return block.take_error();
  tx.Store64(tree.Offset(&tail.next), *block);
  return Status::Ok();
}

// The lowest sequence number not in `used` (the numbers taken by one hash).
uint32_t LowestFreeSeq(std::vector<uint32_t>& used) {
  std::sort(used.begin(), used.end());
  uint32_t seq = 0;
  for (uint32_t taken : used) {
    if (taken > seq) break;
    if (taken == seq) ++seq;
  }
  return seq;
}

}  // namespace

// Store order: a new entry goes into a free record of its leaf chain with
// logged stores (FillFreeRecord); when none is big enough, a leaf above the
// last level is rebuilt aside (RebuildWith), and a chain of one hash gets a
// new leaf at its end (AppendLeaf); into a null slot, a new leaf
// (AddLeafInHole). Then logged:
// dir.entries, and dir.size and dir.blocks when nodes were added. Nothing is
// logged before every block needed is allocated, so ENOSPC changes nothing
// but the allocations, which the caller's Abort undoes. A crash before commit
// is undone whole by the journal.
Status Directory::InsertBody(Tx& tx, const Inode& dir, std::string_view name, uint64_t ino,
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
    // already uses, the first free record big enough, the last leaf.
    const uint32_t need = format::DirRecordLength(static_cast<uint32_t>(name.size()));
    std::vector<uint32_t> used_seqs;
    bool exists = false;
    Found fit;
    uint32_t fit_len = 0;
    uint64_t last = 0;
    NVFS_TRY(tree.WalkChain(
        PointerBlock(path.node), tree.ChainLimit(dir), [&](uint64_t block, uint64_t) -> Result<bool> {
          last = block;
          NVFS_TRY(tree.ScanLeaf(block, [&](uint32_t offset, const DirEntry& record) {
            if (record.ino == 0) {
              if (fit_len == 0 && record.rec_len >= need) {
                fit = {block, offset, 0};
                fit_len = record.rec_len;
              }
            } else if (HashOfKey(record.key) == hash) {
              if (tree.Name(record) == name) {
                exists = true;
                return false;
              }
              used_seqs.push_back(SeqOfKey(record.key));
            }
            return true;
          }));
          return !exists;
        }));
    if (exists) return Error(EEXIST);
    const uint32_t seq = LowestFreeSeq(used_seqs);
    if (seq >= kMaxSeq) {
      return MakeError(ENOSPC, "%u names share one hash value in this directory", kMaxSeq);
    }
    const LeafItem item{DirKey(hash, seq), ino, file_type, name};
    Status added;
    if (fit_len != 0) {
      FillFreeRecord(tree, tx, fit.block, fit.offset, fit_len, item);
    } else if (tree.Leaf(last).prefix_bits == kDirHashBits) {
      added = AppendLeaf(tree, builder, tx, last, item);
    } else {
      added = RebuildWith(tree, builder, path, item);
    }
    if (!added.ok()) {
      builder.Cancel();
      return added;
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
Status Directory::RemoveBody(Tx& tx, const Inode& dir, std::string_view name) {
  const Tree tree(ctx_);
  Result<Located> at = Locate(tree, dir, name);
  if (!at.ok()) return at.take_error();
  const Path& path = at->path;
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
    const uint64_t next = tree.Leaf(block).next;
    if (found.prev != 0 || next != 0) {
      // Unlink it from its chain: a leaf of the last level, filling one slot.
      const uint64_t link =
          found.prev == 0 ? path.link_offset : tree.Offset(&tree.Leaf(found.prev).next);
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
Status Directory::ReplaceBody(Tx& tx, const Inode& dir, std::string_view name, uint64_t ino,
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

// Frees the tree bottom-up, one index node at a time: the leaves below an
// index node that has no index children, then the node itself, unlinked by
// one logged store of the pointer to it. When the slot cannot take a whole
// node, leaves are unlinked one slot range at a time (logged stores of null
// slots) and freed once no slot points to them, and a chain too long for the
// slot is cut from its end (a logged store of a `next`, then the frees).
// Every intermediate state is a valid tree, so the caller may commit and
// continue in a new transaction.
Result<bool> Directory::FreeTreeBody(Tx& tx, const Inode& dir) {
  const Tree tree(ctx_);
  Builder builder(tree, tx, 0);
  const uint64_t root_offset = tree.Offset(&dir.map.dir.root);
  bool done = false;
  // Room for this function's last stores (size, blocks, entries).
  const auto room = [&]() -> size_t {
    return tx.room() > kFreeTreeReserve ? tx.room() - kFreeTreeReserve : 0;
  };
  const uint64_t limit = tree.ChainLimit(dir);
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
      NVFS_TRY(tree.ReadChain(PointerBlock(root), limit, &chain));
      if (room() < (chain.blocks.size() + 1) * kRecordCost + 8) break;
      NVFS_TRY(builder.FreeNodes(chain.blocks));
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
      NVFS_TRY(tree.ReadChain(leaf, limit, &chain));
      leaf_blocks += chain.blocks.size();
      runs.push_back({slot, end - slot, std::move(chain.blocks)});
      slot = end;
    }
    // A leaf in two runs (or two chains) would be freed twice: the tree is
    // damaged.
    std::vector<uint64_t> leaves;
    leaves.reserve(leaf_blocks);
    for (const Run& run : runs) leaves.insert(leaves.end(), run.blocks.begin(), run.blocks.end());
    std::sort(leaves.begin(), leaves.end());
    if (std::adjacent_find(leaves.begin(), leaves.end()) != leaves.end()) {
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
      if (run.blocks.size() > 1 && room() < free_cost + kRecordCost + 8) {
        // A chain too long for this transaction: cut leaves off its end (one
        // logged store of a `next`, then their deferred frees).
        const size_t cut = std::min<size_t>(
            run.blocks.size() - 1,
            room() > 2 * kRecordCost + 8 ? (room() - kRecordCost - 8) / kRecordCost - 1 : 0);
        if (cut == 0) break;
        const uint64_t new_last = run.blocks[run.blocks.size() - 1 - cut];
        tx.Store64(tree.Offset(&tree.Leaf(new_last).next), 0);
        NVFS_TRY(builder.FreeNodes({run.blocks.end() - static_cast<ptrdiff_t>(cut), run.blocks.end()}));
        break;
      }
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

// The public functions report the damage their bodies find (EUCLEAN) to
// ctx.damage: the directory is stable under the caller's lock, so every
// EUCLEAN here is damage on the media, never a race.
Result<DirEntryRef> Directory::Lookup(const Inode& dir, std::string_view name) const {
  return ctx_.Checked(LookupBody(dir, name));
}

Status Directory::Insert(Tx& tx, const Inode& dir, std::string_view name, uint64_t ino,
                         uint8_t file_type) {
  return ctx_.Checked(InsertBody(tx, dir, name, ino, file_type));
}

Status Directory::Remove(Tx& tx, const Inode& dir, std::string_view name) {
  return ctx_.Checked(RemoveBody(tx, dir, name));
}

Status Directory::Replace(Tx& tx, const Inode& dir, std::string_view name, uint64_t ino,
                          uint8_t file_type) {
  return ctx_.Checked(ReplaceBody(tx, dir, name, ino, file_type));
}

Result<bool> Directory::FreeTree(Tx& tx, const Inode& dir) {
  return ctx_.Checked(FreeTreeBody(tx, dir));
}

}  // namespace nvfs
