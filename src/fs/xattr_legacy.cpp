// The one-block xattr format. Without format::kIncompatXattrChain (a
// namespace an older mkfs made), xattr_block names one block replaced whole
// on every change, as before (the Legacy* functions): older code reads
// those namespaces, so nothing else is written there. Read through the same
// checked walk as a chain (xattr.hpp), a chain of one block.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fs/inode_rules.hpp"
#include "fs/xattr.hpp"

namespace nvfs::xattr {

using format::Inode;
using format::XattrEntry;
using format::XattrHeader;

Result<std::vector<Attribute>> LegacyLoad(const FsContext& ctx, const Inode& inode) {
  std::vector<Attribute> attrs;
  NVFS_TRY(Walk(ctx, inode, [&](const ChainBlock&, const XattrRecord& record) {
    attrs.push_back({std::string(record.name), std::string(record.value)});
    return true;
  }));
  return attrs;
}

// Replaces the inode's xattr block with one holding `attrs` (or none),
// logged in `tx`: A + F the new block, L xattr_block, D the old one, L
// blocks, L ctime. REQUIRES: inode lock held exclusively.
Status LegacyStore(FsContext& ctx, Tx& tx, uint64_t ino, const Inode& inode,
                   const std::vector<Attribute>& attrs, timespec now) {
  const uint32_t bs = ctx.geometry.block_size();
  std::vector<std::byte> block(bs);
  XattrHeader header{};
  header.magic = format::kXattrMagic;
  uint32_t pos = sizeof header;
  for (const Attribute& a : attrs) {
    const auto size = static_cast<uint32_t>(format::XattrEntryLength(a.name.size(), a.value.size()));
    if (size > bs - pos) return Error(ENOSPC);
    XattrEntry entry{};
    entry.name_len = static_cast<uint8_t>(a.name.size());
    entry.value_len = static_cast<uint32_t>(a.value.size());
    std::memcpy(block.data() + pos, &entry, sizeof entry);
    std::memcpy(block.data() + pos + sizeof entry, a.name.data(), a.name.size());
    std::memcpy(block.data() + pos + sizeof entry + a.name.size(), a.value.data(),
                a.value.size());
    pos += size;
    ++header.count;
  }
  header.used = pos - static_cast<uint32_t>(sizeof header);
  std::memcpy(block.data(), &header, sizeof header);

  const uint64_t old_block = inode.xattr_block;
  uint64_t new_block = 0;
  if (!attrs.empty()) {
    const uint64_t goal = ctx.geometry.FirstDataBlock(ctx.geometry.InodeGroup(ino));
    Result<Extent> run = ctx.alloc.AllocateBlocks(tx, goal, 1);
    if (!run.ok()) return run.take_error();
    new_block = run->first;
    tx.StoreFresh(ctx.geometry.BlockOffset(new_block), block.data(), bs);
  }
  tx.Set(inode.xattr_block, new_block);
  if (old_block != 0) NVFS_TRY(ctx.Checked(ctx.alloc.FreeBlocks(tx, old_block, 1)));
  const uint64_t blocks = inode.blocks + (new_block != 0) - (old_block != 0);
  if (blocks != inode.blocks) tx.Set(inode.blocks, blocks);
  Touch(tx, inode, false, true, now);
  return Status::Ok();
}

// Runs `change` on the attributes and stores them back (one transaction).
Status LegacyChange(FsContext& ctx, uint64_t ino, const Inode& inode,
                    const std::function<Status(std::vector<Attribute>&)>& change) {
  Result<std::vector<Attribute>> attrs = LegacyLoad(ctx, inode);
  if (!attrs.ok()) return attrs.take_error();
  NVFS_TRY(change(*attrs));
  Tx tx(ctx.journal, "xattr");
  NVFS_TRY(LegacyStore(ctx, tx, ino, inode, *attrs, Now()));
  return tx.Commit();
}

std::vector<Attribute>::iterator FindIn(std::vector<Attribute>& attrs, std::string_view name) {
  return std::find_if(attrs.begin(), attrs.end(), [&](const Attribute& a) { return a.name == name; });
}

}  // namespace nvfs::xattr
