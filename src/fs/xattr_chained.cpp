// The chained xattr format. With format::kIncompatXattrChain (every
// namespace mkfs 2.1 makes), the inode's xattr_block heads a chain of blocks of records, changed in place
// through the journal: a set writes its record into free space (a free
// record, logged; or the block's unused tail, fresh, then `used` logged; or
// a new block, fresh, linked at the head by one logged store of
// xattr_block), with a value past kInlineRecordMax in runs of blocks of its
// own, written fresh before the record that names them; a remove turns the
// record free (one logged 8-byte store), defers the free of its runs and of
// a block left with no live record (unlinked by one logged pointer store),
// and so allocates nothing: it works on a full filesystem.
#include <sys/xattr.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include "fs/inode_rules.hpp"
#include "fs/xattr.hpp"

namespace nvfs::xattr {

using format::Inode;
using format::XattrBlockHeader;
using format::XattrEntry;
using format::XattrValueRun;

namespace {

uint64_t ValueBlocks(const FsContext& ctx, uint32_t value_len) {
  return (uint64_t{value_len} + ctx.geometry.block_size() - 1) >> ctx.geometry.block_shift();
}

// Writes a free record over [offset, offset + length) of `block_no`: its
// 8-byte header, logged (the bytes after it keep what they held, for an
// undo of an earlier step of the same transaction).
void StoreFreeRecord(const FsContext& ctx, Tx& tx, uint64_t block_no, uint32_t offset,
                     uint32_t length) {
  XattrEntry entry{};
  entry.value_len = length - static_cast<uint32_t>(sizeof entry);
  tx.Store(ctx.geometry.BlockOffset(block_no) + offset, &entry, sizeof entry);
}

}  // namespace

// Removes the found record in `tx`: it becomes free, its runs are freed after
// commit, and a block left with no live record is unlinked and freed.
// Allocates nothing. REQUIRES: inode lock held exclusively.
Status RemoveFound(FsContext& ctx, Tx& tx, const Inode& inode, const Found& found) {
  uint64_t freed = 0;
  for (uint32_t r = 0; r < found.record.runs; ++r) {
    const XattrValueRun run = found.record.Run(r);
    NVFS_TRY(ctx.Checked(ctx.alloc.FreeBlocks(tx, run.first, run.count)));
    freed += run.count;
  }
  StoreFreeRecord(ctx, tx, found.block.block_no, found.record.offset, found.record.length);
  if (found.live_in_block == 1) {
    NVFS_TRY(ctx.Checked(ctx.alloc.FreeBlocks(tx, found.block.block_no, 1)));
    tx.Store64(found.block.link_at, found.block.view.next);
    ++freed;
  }
  if (freed != 0) tx.Set(inode.blocks, inode.blocks - freed);
  return Status::Ok();
}

namespace {

// The record `name` = value would be, built in DRAM (runs: already
// allocated and written).
std::vector<std::byte> BuildRecord(std::string_view name, const void* value, size_t size,
                                   const std::vector<XattrValueRun>& runs) {
  XattrEntry entry{};
  entry.name_len = static_cast<uint8_t>(name.size());
  entry.value_len = static_cast<uint32_t>(size);
  uint64_t length;
  if (runs.empty()) {
    length = format::XattrEntryLength(name.size(), size);
  } else {
    entry.flags = format::kXattrValueInRuns;
    entry.runs = static_cast<uint16_t>(runs.size());
    length = format::XattrRunEntryLength(name.size(), runs.size());
  }
  std::vector<std::byte> bytes(length);
  std::memcpy(bytes.data(), &entry, sizeof entry);
  std::memcpy(bytes.data() + sizeof entry, name.data(), name.size());
  if (runs.empty()) {
    if (size != 0) std::memcpy(bytes.data() + sizeof entry + name.size(), value, size);
  } else {
    std::memcpy(bytes.data() + sizeof entry + ((name.size() + 7) & ~size_t{7}), runs.data(),
                runs.size() * sizeof(XattrValueRun));
  }
  return bytes;
}

// Free space for a record: a free record (reused: logged) or a block's tail
// (fresh).
struct Space {
  uint64_t block_no;
  uint32_t offset;
  uint32_t length;
  bool tail;
  uint32_t count, used;  // the block's header fields (tail)
};

}  // namespace

// Sets `name` on a chained namespace. Order (doc/integrity.md): the value's
// runs A + F; the old record, if any, made free (L) with its runs D; the
// new record into the old one's place or a free record (L, the remainder a
// free record, L, and `count` L), or the tail of a block (F, then `count`
// and `used` L), or a new block (A + F, linked at the chain's head by L of
// xattr_block); `blocks` L; ctime L; all in `tx` (which a caller may share
// with other changes of the same inode: each walk sees the stores of the
// ones before). REQUIRES: inode lock held exclusively until tx commits.
Status SetChainedIn(FsContext& ctx, Tx& tx, uint64_t ino, const Inode& inode,
                    std::string_view name, const void* value, size_t size, int flags,
                    timespec now) {
  const Geometry& g = ctx.geometry;
  const uint32_t bs = g.block_size();
  Found found;
  uint64_t list_bytes = 0;
  std::vector<Space> spaces;
  {
    uint64_t current = 0;
    uint32_t live_in_block = 0;
    NVFS_TRY(Walk(ctx, inode, [&](const ChainBlock& block, const XattrRecord& record) {
      if (block.block_no != current) {
        current = block.block_no;
        live_in_block = 0;
        const uint32_t end = block.view.header_size + block.view.used;
        if (end < bs) {
          spaces.push_back({block.block_no, end, bs - end, true, block.view.count,
                            block.view.used});
        }
      }
      if (record.free) {
        spaces.push_back({block.block_no, record.offset, record.length, false, block.view.count,
                          block.view.used});
        return true;
      }
      ++live_in_block;
      list_bytes += record.name.size() + 1;
      if (!found.found && record.name == name) {
        found.found = true;
        found.block = block;
        found.record = record;
      }
      if (found.found && block.block_no == found.block.block_no) {
        found.live_in_block = live_in_block;
      }
      return true;
    }));
  }
  if (found.found && (flags & XATTR_CREATE)) return Error(EEXIST);
  if (!found.found && (flags & XATTR_REPLACE)) return Error(ENODATA);
  if (!found.found && list_bytes + name.size() + 1 > format::kXattrListMax) {
    return Error(ENOSPC);  // listxattr could not return every name
  }

  const uint64_t goal = g.FirstDataBlock(g.InodeGroup(ino));
  std::vector<XattrValueRun> runs;
  uint64_t added = 0;
  if (format::XattrEntryLength(name.size(), size) > kInlineRecordMax) {
    // The value goes to runs of its own, written before anything names them.
    const uint64_t want = ValueBlocks(ctx, static_cast<uint32_t>(size));
    uint64_t got = 0;
    while (got < want) {
      Result<Extent> run = ctx.alloc.AllocateBlocks(tx, goal, want - got);
      if (!run.ok()) return run.take_error();
      const uint64_t at = got << g.block_shift();
      const uint64_t bytes = std::min<uint64_t>(size - at, run->count << g.block_shift());
      tx.StoreFresh(g.BlockOffset(run->first), static_cast<const std::byte*>(value) + at, bytes);
      runs.push_back({run->first, run->count});
      got += run->count;
    }
    added += got;
  }
  const std::vector<std::byte> record = BuildRecord(name, value, size, runs);
  const uint32_t need = static_cast<uint32_t>(record.size());

  // The old record first: its place may take the new one.
  const Space* place = nullptr;
  Space own{};
  uint64_t freed = 0;
  if (found.found) {
    for (uint32_t r = 0; r < found.record.runs; ++r) {
      const XattrValueRun run = found.record.Run(r);
      NVFS_TRY(ctx.Checked(ctx.alloc.FreeBlocks(tx, run.first, run.count)));
      freed += run.count;
    }
    own = {found.block.block_no, found.record.offset, found.record.length, false,
           found.block.view.count, found.block.view.used};
    if (found.record.length >= need) {
      place = &own;
    } else {
      StoreFreeRecord(ctx, tx, own.block_no, own.offset, own.length);
    }
  }
  if (place == nullptr) {
    for (const Space& space : spaces) {
      if (space.length >= need) {
        place = &space;
        break;
      }
    }
  }
  if (place != nullptr && !place->tail) {
    // Into a free record (or the old one's place): logged, the remainder
    // a free record of its own.
    std::vector<std::byte> bytes = record;
    const uint32_t rest = place->length - need;
    if (rest != 0) {
      XattrEntry free_entry{};
      free_entry.value_len = rest - static_cast<uint32_t>(sizeof free_entry);
      bytes.resize(need + sizeof free_entry);
      std::memcpy(bytes.data() + need, &free_entry, sizeof free_entry);
    }
    tx.Store(g.BlockOffset(place->block_no) + place->offset, bytes.data(), bytes.size());
    if (rest != 0) {
      const auto& header = *reinterpret_cast<const XattrBlockHeader*>(ctx.Block(place->block_no));
      tx.Set(header.count, header.count + 1);
    }
  } else if (place != nullptr) {
    // Into the block's unused tail: fresh, then published by `used`.
    tx.StoreFresh(g.BlockOffset(place->block_no) + place->offset, record.data(), need);
    const auto& header = *reinterpret_cast<const XattrBlockHeader*>(ctx.Block(place->block_no));
    const uint32_t fields[2] = {header.count + 1, header.used + need};
    tx.Store(tx.OffsetOf(&header.count), fields, sizeof fields);
  } else {
    // A new block at the chain's head.
    Result<Extent> run = ctx.alloc.AllocateBlocks(tx, goal, 1);
    if (!run.ok()) return run.take_error();
    XattrBlockHeader header{};
    header.magic = format::kXattrChainMagic;
    header.count = 1;
    header.used = need;
    header.next = inode.xattr_block;
    std::vector<std::byte> bytes(sizeof header + need);
    std::memcpy(bytes.data(), &header, sizeof header);
    std::memcpy(bytes.data() + sizeof header, record.data(), need);
    tx.StoreFresh(g.BlockOffset(run->first), bytes.data(), bytes.size());
    tx.Set(inode.xattr_block, run->first);
    ++added;
  }
  if (added != freed) tx.Set(inode.blocks, inode.blocks + added - freed);
  Touch(tx, inode, false, true, now);
  return Status::Ok();
}

// The same as one transaction of its own.
Status SetChained(FsContext& ctx, uint64_t ino, const Inode& inode, std::string_view name,
                  const void* value, size_t size, int flags) {
  Tx tx(ctx.journal, "xattr");
  NVFS_TRY(SetChainedIn(ctx, tx, ino, inode, name, value, size, flags, Now()));
  return tx.Commit();
}

Status RemoveChained(FsContext& ctx, const Inode& inode, std::string_view name, Tx* in_tx) {
  Found found;
  NVFS_TRY(Find(ctx, inode, name, &found));
  if (!found.found) return Error(ENODATA);
  if (in_tx != nullptr) return RemoveFound(ctx, *in_tx, inode, found);
  Tx tx(ctx.journal, "xattr");
  NVFS_TRY(RemoveFound(ctx, tx, inode, found));
  Touch(tx, inode, false, true, Now());
  return tx.Commit();
}

}  // namespace nvfs::xattr
