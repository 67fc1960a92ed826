// The read-write mount's cross-check of the bitmaps against what the inodes
// hold (doc/integrity.md, section 9): the allocator does not trust a bitmap
// that a look at the inodes contradicts.
//
// One pass over every inode table, and over the pointer blocks, directory
// nodes and xattr blocks the in-use inodes name (data blocks, and xattr
// value runs, are marked but not read):
//  - a block named twice (two files, or one file twice), or named but free in
//    the block bitmap, is damage: reported (the mount turns read-only unless
//    errors=continue) and, if free, reserved in DRAM so it is never handed
//    out;
//  - an entry (in the leaves walked) naming an inode whose bit is clear, and
//    a root whose bit is clear, is damage: the inode number is reserved in
//    DRAM so it is never handed out, and the inode's blocks are walked.
// An inode whose bit is clear is not looked at otherwise: mkfs does not
// clear the inode tables, so a free inode's bytes mean nothing; an entry
// naming it is the evidence that it lives (doc/integrity.md, section 9).
// Pointers that name no data block are skipped here: the core refuses them
// when it follows them. Each block is visited once (a DRAM bit per block),
// so damaged pointer blocks or directory nodes cannot make the walk loop.
// Cost: the modes of the marked inodes (the inode bitmaps say which) plus the metadata blocks
// the files name, and one bit per block of DRAM while it runs.
#include <sys/stat.h>

#include <cinttypes>
#include <vector>

#include "fs/fs_impl.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::Inode;

namespace {

class CrossChecker {
 public:
  CrossChecker(const FsContext& ctx, Allocator& alloc)
      : ctx_(ctx),
        g_(ctx.geometry),
        shape_(g_.block_shift()),
        alloc_(alloc),
        seen_((g_.block_count() + 63) / 64, 0) {}

  void Run() {
    // The root is named by the format: a clear bit is damage, and its number
    // is kept from the allocator (its tree is walked below, by its entries'
    // evidence, like any directory's: the bitmap loop skips it).
    const std::byte* bitmap0 = ctx_.Block(g_.InodeBitmapBlock(0));
    if (!TestBit(bitmap0, format::kRootIno)) {
      Report(MakeError(EUCLEAN, "the root inode is free in the inode bitmap; run fsck.nvfs"));
      if (alloc_.Reserve(BitmapKind::kInodes, format::kRootIno)) {
        const Inode& root =
            *reinterpret_cast<const Inode*>(ctx_.base() + g_.InodeOffset(format::kRootIno));
        if (root.mode != 0) revived_.push_back(format::kRootIno);
      }
    }
    for (uint32_t group = 0; group < g_.group_count(); ++group) {
      const std::byte* bitmap = ctx_.Block(g_.InodeBitmapBlock(group));
      const uint64_t first = uint64_t{group} * g_.inodes_per_group();
      for (uint32_t i = 0; i < g_.inodes_per_group(); ++i) {
        const uint64_t ino = first + i;
        if (ino == 0) continue;
        // A free inode's bytes mean nothing (mkfs does not clear the
        // tables), so only the inodes the bitmap marks are walked.
        if (!TestBit(bitmap, i)) continue;
        const Inode& inode = *reinterpret_cast<const Inode*>(ctx_.base() + g_.InodeOffset(ino));
        if (inode.mode == 0) continue;
        Walk(ino, inode);
      }
    }
    // Inodes revived by an entry's evidence, walked from a list rather than
    // from inside the leaf that names them: a chain of revived directories
    // as long as the damage makes it costs no stack.
    while (!revived_.empty()) {
      const uint64_t ino = revived_.back();
      revived_.pop_back();
      Walk(ino, *reinterpret_cast<const Inode*>(ctx_.base() + g_.InodeOffset(ino)));
    }
  }

 private:
  void Walk(uint64_t ino, const Inode& inode) {
    if (inode.xattr_block != 0) WalkXattrs(ino, inode.xattr_block);
    if (S_ISREG(inode.mode) || (S_ISLNK(inode.mode) && inode.size > format::kInlineSymlinkMax)) {
      const format::InodeFileMap& map = inode.map.file;
      for (uint32_t i = 0; i < format::kDirectPointers; ++i) {
        if (map.direct[i] != 0) Use(ino, map.direct[i]);
      }
      for (uint32_t depth = 1; depth <= format::kIndirectPointers; ++depth) {
        if (map.indirect[depth - 1] != 0) WalkPointers(ino, map.indirect[depth - 1], depth);
      }
    } else if (S_ISDIR(inode.mode) && inode.map.dir.root != 0) {
      WalkDirNode(ino, inode.map.dir.root, 0);
    }
  }

  void WalkPointers(uint64_t ino, uint64_t block_no, uint32_t height) {
    if (!Use(ino, block_no)) return;
    const auto* slots = reinterpret_cast<const uint64_t*>(ctx_.Block(block_no));
    for (uint64_t i = 0; i < g_.block_size() / 8; ++i) {
      const uint64_t ptr = slots[i];
      if (ptr == 0) continue;
      if (height == 1) {
        Use(ino, ptr);
      } else {
        WalkPointers(ino, ptr, height - 1);
      }
    }
  }

  // The xattr chain: each block, and the blocks of each value run (not
  // read). A block that does not decode ends the chain (the core refuses
  // it when it reads it); a block seen before ends it too, so a loop ends.
  void WalkXattrs(uint64_t ino, uint64_t block_no) {
    const bool chain = g_.xattr_chain();
    while (block_no != 0 && Use(ino, block_no)) {
      XattrBlockView view;
      std::vector<format::XattrValueRun> runs;
      const XattrFault fault = DecodeXattrBlock(
          {ctx_.Block(block_no), g_.block_size()}, chain,
          [&](const XattrRecord& record) {
            for (uint32_t r = 0; r < record.runs; ++r) runs.push_back(record.Run(r));
          },
          &view);
      for (const format::XattrValueRun& run : runs) {
        if (!g_.IsDataRun(run.first, run.count)) continue;
        for (uint64_t b = run.first; b < run.first + run.count; ++b) Use(ino, b);
      }
      if (fault != XattrFault::kNone) return;
      block_no = view.next;
    }
  }

  // `depth`: of the node `ptr` names (0: dir.root's). Index nodes deeper
  // than the tree's shape allows are not followed, so a damaged chain of
  // index nodes cannot run the recursion deep.
  void WalkDirNode(uint64_t ino, uint64_t ptr, int depth) {
    if (CheckDirNodePointer(ptr, g_) != DirNodeFault::kNone) return;
    uint64_t block_no = ptr & format::kDirNodeBlockMask;
    if (!Use(ino, block_no)) return;
    if (ptr & format::kDirNodeIndexBit) {
      if (depth > shape_.max_depth()) return;
      const auto* slots = reinterpret_cast<const uint64_t*>(ctx_.Block(block_no));
      uint64_t prev = 0;
      for (uint64_t i = 0; i < g_.block_size() / 8; ++i) {
        // A leaf fills the aligned slots of its prefix: one node, many slots.
        if (slots[i] != 0 && slots[i] != prev) WalkDirNode(ino, slots[i], depth + 1);
        prev = slots[i];
      }
      return;
    }
    // A leaf and its overflow chain.
    for (;;) {
      format::DirLeafHeader header;
      std::memcpy(&header, ctx_.Block(block_no), sizeof header);
      if (header.magic != format::kDirLeafMagic) return;
      ScanEntries(ino, block_no);
      if (header.next == 0) return;
      block_no = header.next;
      if (!Use(ino, block_no)) return;
    }
  }

  // The records of a leaf of directory `dir`: an entry naming an inode whose
  // bit is clear names a live inode (the entry is the evidence, as for
  // fsck's ReviveInode): damage, and the inode number is reserved so that no
  // new file is given it; its blocks are walked like any file's (later, by
  // Run). A broken
  // rec_len chain ends the leaf (the directory code refuses it when read).
  void ScanEntries(uint64_t dir, uint64_t block_no) {
    const auto entry = [&](uint32_t, const format::DirEntry& record) {
      const uint64_t ino = record.ino;
      if (ino == 0 || ino >= g_.inode_count()) return true;
      const uint32_t ipg = g_.inodes_per_group();
      const std::byte* bitmap = ctx_.Block(g_.InodeBitmapBlock(static_cast<uint32_t>(ino / ipg)));
      if (TestBit(bitmap, ino % ipg)) return true;
      Report(MakeError(EUCLEAN, "inode %" PRIu64 " is named by directory %" PRIu64 " but free "
                       "in the inode bitmap; run fsck.nvfs", ino, dir));
      // Once per inode: a second entry finds it reserved.
      if (!alloc_.Reserve(BitmapKind::kInodes, ino)) return true;
      const Inode& inode = *reinterpret_cast<const Inode*>(ctx_.base() + g_.InodeOffset(ino));
      if (inode.mode != 0) revived_.push_back(ino);
      return true;
    };
    WalkDirLeaf({ctx_.Block(block_no), g_.block_size()}, entry);
  }

  // Marks a block named by `ino`; false if it is not to be followed (no
  // data block, or seen already).
  bool Use(uint64_t ino, uint64_t block_no) {
    if (!ctx_.ValidBlock(block_no)) return false;
    uint64_t& word = seen_[block_no / 64];
    const uint64_t bit = uint64_t{1} << (block_no % 64);
    if (word & bit) {
      Report(MakeError(EUCLEAN, "block %" PRIu64 " is named twice (inode %" PRIu64 " and another "
                       "or the same); run fsck.nvfs", block_no, ino));
      return false;
    }
    word |= bit;
    const uint32_t group = static_cast<uint32_t>(block_no / g_.blocks_per_group());
    if (!TestBit(ctx_.Block(g_.BlockBitmapBlock(group)), block_no % g_.blocks_per_group())) {
      Report(MakeError(EUCLEAN, "block %" PRIu64 " of inode %" PRIu64 " is free in the block "
                       "bitmap; run fsck.nvfs", block_no, ino));
      alloc_.Reserve(BitmapKind::kBlocks, block_no);
    }
    return true;
  }

  void Report(Error error) { ctx_.Damaged(std::move(error)); }

  const FsContext& ctx_;
  const Geometry& g_;
  const DirTreeShape shape_;
  Allocator& alloc_;
  std::vector<uint64_t> seen_;
  std::vector<uint64_t> revived_;  // reserved, named by an entry, not yet walked
};

}  // namespace

void FsImpl::CrossCheck() { CrossChecker(*ctx_, *alloc_).Run(); }

}  // namespace nvfs
