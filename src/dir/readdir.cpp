// Directory::ReadDir: the tree walked in hash order (dir.hpp says what the
// cookies promise; tree.hpp is the shared machinery).
#include <algorithm>
#include <functional>
#include <vector>

#include "dir/tree.hpp"

namespace nvfs {

using namespace dir_tree;

namespace {

// ReadDir's walk: the tree in slot order (hash order), each leaf once, its
// entries (and its overflow leaves') sorted by key in a DRAM buffer. Keys are
// (hash, sequence number), so a listing resumed at a key inside a chain of
// one hash goes on at the next sequence number.
class Lister {
 public:
  Lister(const Tree& tree, uint64_t from_key, const std::function<bool(const DirEntryRef&)>& fn)
      : tree_(tree), from_key_(from_key), from_hash_(HashOfKey(from_key)), fn_(fn) {}

  Status Run(const Inode& dir) {
    chain_limit_ = tree_.ChainLimit(dir);
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
    batch_.clear();
    NVFS_TRY(tree_.WalkChain(block, chain_limit_, [&](uint64_t leaf, uint64_t) -> Result<bool> {
      NVFS_TRY(tree_.ScanLeaf(leaf, [&](uint32_t, const DirEntry& record) {
        if (record.ino != 0 && record.key >= from_key_) {
          batch_.push_back({record.ino, record.file_type, record.key, tree_.Name(record)});
        }
        return true;
      }));
      return true;
    }));
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
  uint64_t chain_limit_ = 0;
  std::vector<DirEntryRef> batch_;
  bool stopped_ = false;
};

}  // namespace

Status Directory::ReadDirBody(const Inode& dir, uint64_t from_key,
                          const std::function<bool(const DirEntryRef&)>& fn) const {
  if (from_key > format::kDirKeyMax) return Status::Ok();
  const Tree tree(ctx_);
  Lister lister(tree, from_key, fn);
  return lister.Run(dir);
}

Status Directory::ReadDir(const Inode& dir, uint64_t from_key,
                          const std::function<bool(const DirEntryRef&)>& fn) const {
  return ctx_.Checked(ReadDirBody(dir, from_key, fn));
}

}  // namespace nvfs
