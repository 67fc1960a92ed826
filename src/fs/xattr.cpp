// Extended attributes (doc/format.md, "Extended attributes"; the order of
// stores: doc/integrity.md, setxattr / removexattr).
//
// With format::kIncompatXattrChain (every namespace mkfs 2.1 makes), the
// inode's xattr_block heads a chain of blocks of records, changed in place
// through the journal: a set writes its record into free space (a free
// record, logged; or the block's unused tail, fresh, then `used` logged; or
// a new block, fresh, linked at the head by one logged store of
// xattr_block), with a value past kInlineRecordMax in runs of blocks of its
// own, written fresh before the record that names them; a remove turns the
// record free (one logged 8-byte store), defers the free of its runs and of
// a block left with no live record (unlinked by one logged pointer store),
// and so allocates nothing: it works on a full filesystem.
//
// Without the feature (a namespace an older mkfs made), xattr_block names one
// block replaced whole on every change, as before (the Legacy* functions):
// older code reads those namespaces, so nothing else is written there.
//
// Every block is checked before it is read or followed (a data block, in
// use, decoded by DecodeXattrBlock, the validator fsck uses too), and a walk
// reads at most inode.blocks blocks, so a damaged `next` cannot loop it.
#include <sys/stat.h>
#include <sys/xattr.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fs/fs_impl.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::Inode;
using format::XattrBlockHeader;
using format::XattrEntry;
using format::XattrHeader;
using format::XattrValueRun;

namespace {

using format::kXattrNameMax;
using format::kXattrValueMax;
using format::XattrNamespace;

// Records up to this many bytes keep their value inline; longer values go
// to runs of their own. Policy, not format: it bounds what one set logs
// (the record's old bytes) well inside the smallest journal slot.
constexpr uint32_t kInlineRecordMax = 1024;

// Which names the filesystem serves: ext4's rules. user.*, trusted.* and
// security.* names are stored as given (the kernel has already checked the
// caller may: CAP_SYS_ADMIN for trusted.*, user.* only on regular files and
// directories). system.* names are the filesystem's own, each served only if
// the filesystem implements it: the two POSIX ACL names (acl.cpp, which
// SetXattr and GetXattr hand them to); every other system.* name is
// EOPNOTSUPP to set, get and remove. Such names already on the media from
// before this rule stay there, hidden (doc/format.md).
bool IsAclName(std::string_view name) {
  return name == format::kAclAccessName || name == format::kAclDefaultName;
}

Status CheckXattrName(std::string_view name) {
  if (name.empty() || name.size() > kXattrNameMax) return Error(ERANGE);
  switch (format::XattrNamespaceOf(name)) {
    case XattrNamespace::kUser:
    case XattrNamespace::kTrusted:
    case XattrNamespace::kSecurity:
      return Status::Ok();
    case XattrNamespace::kSystem:
      if (IsAclName(name)) return Status::Ok();
      break;
    case XattrNamespace::kNone:
      break;
  }
  return Error(EOPNOTSUPP);
}

// Whether ListXattr shows `name` to `cred`. The kernel filters nothing a
// FUSE daemon lists, so the rules are ours: of system.* names only the ACL
// names (to everyone, as ext4 lists them), and trusted.* names only to
// root, as ext4 lists them only to CAP_SYS_ADMIN. A FUSE request carries the caller's uid, gid and pid but
// not its capabilities (reading /proc/<pid>/status would race with pid reuse
// and misread callers in other pid namespaces), so uid 0 stands for
// CAP_SYS_ADMIN here, while the kernel's own check of trusted.* get and set
// is the capability: a root without it sees names it cannot read, a non-root
// with it can read names it is not shown.
bool Listed(std::string_view name, const Cred& cred) {
  switch (format::XattrNamespaceOf(name)) {
    case XattrNamespace::kUser:
    case XattrNamespace::kSecurity:
      return true;
    case XattrNamespace::kTrusted:
      return cred.uid == 0;
    case XattrNamespace::kSystem:
      return IsAclName(name);
    case XattrNamespace::kNone:
      break;
  }
  return false;
}

const char* XattrFaultName(XattrFault fault) {
  switch (fault) {
    case XattrFault::kNone: break;
    case XattrFault::kNoMagic:
    case XattrFault::kOverfull: return "bad header";
    case XattrFault::kShortEntries: return "entry past the end";
    case XattrFault::kBadEntry: return "bad entry";
    case XattrFault::kNoNamespace: return "a name of no namespace";
    case XattrFault::kTrailingBytes: return "bytes past the last entry";
    case XattrFault::kReserved: return "reserved bits set";
    case XattrFault::kBadRuns: return "bad value runs";
  }
  return "?";
}

constexpr std::string_view kCapability = "security.capability";

// One block of an inode's chain, checked.
struct ChainBlock {
  uint64_t block_no = 0;
  uint64_t link_at = 0;  // media offset of the pointer naming it
  XattrBlockView view;
};

uint64_t ValueBlocks(const FsContext& ctx, uint32_t value_len) {
  return (uint64_t{value_len} + ctx.geometry.block_size() - 1) >> ctx.geometry.block_shift();
}

// A block or run read from an xattr structure: data blocks, in use.
bool UsableRun(const FsContext& ctx, uint64_t first, uint64_t count) {
  if (!ctx.geometry.IsDataRun(first, count)) return false;
  for (uint64_t b = first; b < first + count; ++b) {
    if (!ctx.alloc.InUse(BitmapKind::kBlocks, b)) return false;
  }
  return true;
}

// Walks the inode's xattr blocks: each is checked (UsableRun, then decoded)
// before fn(const ChainBlock&, const XattrRecord&) sees its records (free
// ones too) and before its `next` is followed; the runs of each live record
// are checked too. fn returns false to stop. At most inode.blocks blocks are
// read: a longer chain (a loop) is damage. EIO, reported as damage, for any
// fault. REQUIRES: the inode lock (shared at least).
template <class Fn>
Status Walk(const FsContext& ctx, const Inode& inode, Fn&& fn) {
  const bool chain = ctx.geometry.xattr_chain();
  ChainBlock block;
  block.block_no = inode.xattr_block;
  block.link_at =
      static_cast<uint64_t>(reinterpret_cast<const std::byte*>(&inode.xattr_block) - ctx.base());
  const auto damaged = [&](const char* what) {
    return ctx.Damaged(MakeError(EIO, "xattr block %" PRIu64 ": %s; run fsck.nvfs",
                                 block.block_no, what));
  };
  for (uint64_t seen = 0; block.block_no != 0; ++seen) {
    if (seen >= inode.blocks) return damaged("a chain longer than the inode's blocks");
    if (!UsableRun(ctx, block.block_no, 1)) return damaged("not a data block in use");
    bool go_on = true;
    bool bad_run = false;
    const XattrFault fault = DecodeXattrBlock(
        {ctx.Block(block.block_no), ctx.geometry.block_size()}, chain,
        [&](const XattrRecord& record) {
          if (!go_on || bad_run) return;
          for (uint32_t r = 0; r < record.runs; ++r) {
            const XattrValueRun run = record.Run(r);
            if (!UsableRun(ctx, run.first, run.count)) bad_run = true;
          }
          if (!bad_run) go_on = fn(static_cast<const ChainBlock&>(block), record);
        },
        &block.view);
    if (bad_run) return damaged("a value run names no data block in use");
    if (fault != XattrFault::kNone) return damaged(XattrFaultName(fault));
    if (!go_on) return Status::Ok();
    block.link_at = ctx.geometry.BlockOffset(block.block_no) + offsetof(XattrBlockHeader, next);
    block.block_no = block.view.next;
  }
  return Status::Ok();
}

// Copies a record's value (inline or from its runs) to `out`.
void CopyValue(const FsContext& ctx, const XattrRecord& record, void* out) {
  if (record.runs == 0) {
    std::memcpy(out, record.value.data(), record.value_len);
    return;
  }
  auto* dst = static_cast<std::byte*>(out);
  uint64_t left = record.value_len;
  for (uint32_t r = 0; r < record.runs && left != 0; ++r) {
    const XattrValueRun run = record.Run(r);
    const uint64_t n = std::min<uint64_t>(left, run.count << ctx.geometry.block_shift());
    std::memcpy(dst, ctx.Block(run.first), n);
    dst += n;
    left -= n;
  }
}

// A live record found by name: where it is.
struct Found {
  bool found = false;
  ChainBlock block;
  XattrRecord record;
  uint32_t live_in_block = 0;  // live records of its block, itself included
};

// Looks `name` up and counts the bytes the listing of every name takes.
Status Find(const FsContext& ctx, const Inode& inode, std::string_view name, Found* found,
            uint64_t* list_bytes = nullptr) {
  uint64_t live_in_block = 0;
  uint64_t current = 0;
  Status st = Walk(ctx, inode, [&](const ChainBlock& block, const XattrRecord& record) {
    if (block.block_no != current) {
      current = block.block_no;
      live_in_block = 0;
    }
    if (record.free) return true;
    ++live_in_block;
    if (list_bytes != nullptr) *list_bytes += record.name.size() + 1;
    if (!found->found && record.name == name) {
      found->found = true;
      found->block = block;
      found->record = record;
    }
    if (found->found && block.block_no == found->block.block_no) {
      found->live_in_block = static_cast<uint32_t>(live_in_block);
    }
    // The whole chain when counting; else up to the end of the found block.
    return list_bytes != nullptr || !found->found || block.block_no == found->block.block_no;
  });
  return st;
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

// Removes the found record in `tx`: it becomes free, its runs are freed after
// commit, and a block left with no live record is unlinked and freed.
// Allocates nothing. REQUIRES: inode lock held exclusively.
Status RemoveFound(FsImpl& fs, Tx& tx, const Inode& inode, const Found& found) {
  FsContext& ctx = FsOps::Ctx(fs);
  uint64_t freed = 0;
  for (uint32_t r = 0; r < found.record.runs; ++r) {
    const XattrValueRun run = found.record.Run(r);
    NVFS_TRY(ctx.Checked(FsOps::Alloc(fs).FreeBlocks(tx, run.first, run.count)));
    freed += run.count;
  }
  StoreFreeRecord(ctx, tx, found.block.block_no, found.record.offset, found.record.length);
  if (found.live_in_block == 1) {
    NVFS_TRY(ctx.Checked(FsOps::Alloc(fs).FreeBlocks(tx, found.block.block_no, 1)));
    tx.Store64(found.block.link_at, found.block.view.next);
    ++freed;
  }
  if (freed != 0) tx.Set(inode.blocks, inode.blocks - freed);
  return Status::Ok();
}

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

// Sets `name` on a chained namespace. Order (doc/integrity.md): the value's
// runs A + F; the old record, if any, made free (L) with its runs D; the
// new record into the old one's place or a free record (L, the remainder a
// free record, L, and `count` L), or the tail of a block (F, then `count`
// and `used` L), or a new block (A + F, linked at the chain's head by L of
// xattr_block); `blocks` L; ctime L; all in `tx` (which a caller may share
// with other changes of the same inode: each walk sees the stores of the
// ones before). REQUIRES: inode lock held exclusively until tx commits.
Status SetChainedIn(FsImpl& fs, Tx& tx, uint64_t ino, const Inode& inode,
                    std::string_view name, const void* value, size_t size, int flags,
                    timespec now) {
  FsContext& ctx = FsOps::Ctx(fs);
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
      Result<Extent> run = FsOps::Alloc(fs).AllocateBlocks(tx, goal, want - got);
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
      NVFS_TRY(ctx.Checked(FsOps::Alloc(fs).FreeBlocks(tx, run.first, run.count)));
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
    Result<Extent> run = FsOps::Alloc(fs).AllocateBlocks(tx, goal, 1);
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
  FsOps::Touch(tx, inode, false, true, now);
  return Status::Ok();
}

// The same as one transaction of its own.
Status SetChained(FsImpl& fs, uint64_t ino, const Inode& inode, std::string_view name,
                  const void* value, size_t size, int flags) {
  Tx tx(FsOps::Jnl(fs), "xattr");
  NVFS_TRY(SetChainedIn(fs, tx, ino, inode, name, value, size, flags, FsOps::Now()));
  return tx.Commit();
}

Status RemoveChained(FsImpl& fs, const Inode& inode, std::string_view name, Tx* in_tx) {
  FsContext& ctx = FsOps::Ctx(fs);
  Found found;
  NVFS_TRY(Find(ctx, inode, name, &found));
  if (!found.found) return Error(ENODATA);
  if (in_tx != nullptr) return RemoveFound(fs, *in_tx, inode, found);
  Tx tx(FsOps::Jnl(fs), "xattr");
  NVFS_TRY(RemoveFound(fs, tx, inode, found));
  FsOps::Touch(tx, inode, false, true, FsOps::Now());
  return tx.Commit();
}

// --- The one-block format (namespaces without kIncompatXattrChain) -------

struct Attribute {
  std::string name;
  std::string value;
};

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
Status LegacyStore(FsImpl& fs, Tx& tx, uint64_t ino, const Inode& inode,
                   const std::vector<Attribute>& attrs, timespec now) {
  FsContext& ctx = FsOps::Ctx(fs);
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
    Result<Extent> run = FsOps::Alloc(fs).AllocateBlocks(tx, goal, 1);
    if (!run.ok()) return run.take_error();
    new_block = run->first;
    tx.StoreFresh(ctx.geometry.BlockOffset(new_block), block.data(), bs);
  }
  tx.Set(inode.xattr_block, new_block);
  if (old_block != 0) NVFS_TRY(ctx.Checked(FsOps::Alloc(fs).FreeBlocks(tx, old_block, 1)));
  const uint64_t blocks = inode.blocks + (new_block != 0) - (old_block != 0);
  if (blocks != inode.blocks) tx.Set(inode.blocks, blocks);
  FsOps::Touch(tx, inode, false, true, now);
  return Status::Ok();
}

// Runs `change` on the attributes and stores them back (one transaction).
template <class Change>
Status LegacyChange(FsImpl& fs, uint64_t ino, const Inode& inode, Change&& change) {
  Result<std::vector<Attribute>> attrs = LegacyLoad(FsOps::Ctx(fs), inode);
  if (!attrs.ok()) return attrs.take_error();
  NVFS_TRY(change(*attrs));
  Tx tx(FsOps::Jnl(fs), "xattr");
  NVFS_TRY(LegacyStore(fs, tx, ino, inode, *attrs, FsOps::Now()));
  return tx.Commit();
}

std::vector<Attribute>::iterator FindIn(std::vector<Attribute>& attrs, std::string_view name) {
  return std::find_if(attrs.begin(), attrs.end(), [&](const Attribute& a) { return a.name == name; });
}

}  // namespace

Result<bool> FsOps::HasCapability(FsImpl& fs, const Inode& inode) {
  if (inode.xattr_block == 0) return false;
  Found found;
  NVFS_TRY(Find(FsOps::Ctx(fs), inode, kCapability, &found));
  return found.found;
}

Status FsOps::RemoveCapability(FsImpl& fs, uint64_t ino, const Inode& inode, Tx& tx) {
  if (inode.xattr_block == 0) return Status::Ok();
  FsContext& ctx = FsOps::Ctx(fs);
  if (ctx.geometry.xattr_chain()) {
    Status st = RemoveChained(fs, inode, kCapability, &tx);
    return !st.ok() && st.code() == ENODATA ? Status::Ok() : st;
  }
  Result<std::vector<Attribute>> attrs = LegacyLoad(ctx, inode);
  if (!attrs.ok()) return attrs.take_error();
  auto it = FindIn(*attrs, kCapability);
  if (it == attrs->end()) return Status::Ok();
  attrs->erase(it);
  return LegacyStore(fs, tx, ino, inode, *attrs, FsOps::Now());
}

Result<bool> FsOps::FreeXattrs(FsImpl& fs, Tx& tx, const Inode& inode) {
  FsContext& ctx = FsOps::Ctx(fs);
  // Each step frees one record's runs or one empty block: a few records.
  constexpr size_t kStepRoom = 1024;
  while (inode.xattr_block != 0) {
    if (tx.room() < kStepRoom) return false;
    // The head block: its first record with runs, else the block itself.
    Found head;
    uint64_t live = 0;
    NVFS_TRY(Walk(ctx, inode, [&](const ChainBlock& block, const XattrRecord& record) {
      if (block.block_no != inode.xattr_block) return false;
      if (!record.free) ++live;
      if (!head.found && !record.free && record.runs != 0) {
        head.found = true;
        head.block = block;
        head.record = record;
      }
      return true;
    }));
    if (head.found) {
      head.live_in_block = 2;  // the block is freed whole below, not here
      NVFS_TRY(RemoveFound(fs, tx, inode, head));
      continue;
    }
    // No runs left in it: the block goes, the chain's head moves on. Its
    // header was checked by the walk above (or it holds no record at all).
    const uint64_t block_no = inode.xattr_block;
    uint64_t next = 0;
    if (ctx.geometry.xattr_chain()) {
      const auto& header = *reinterpret_cast<const XattrBlockHeader*>(ctx.Block(block_no));
      next = header.next;
    }
    (void)live;
    NVFS_TRY(ctx.Checked(FsOps::Alloc(fs).FreeBlocks(tx, block_no, 1)));
    tx.Set(inode.xattr_block, next);
    tx.Set(inode.blocks, inode.blocks - 1);
  }
  return true;
}

// The ACL code's view (acl.cpp), on either format.
Result<std::optional<std::string>> FsOps::FindXattr(FsImpl& fs, const Inode& inode,
                                                    std::string_view name) {
  if (inode.xattr_block == 0) return std::optional<std::string>();
  FsContext& ctx = FsOps::Ctx(fs);
  Found found;
  NVFS_TRY(Find(ctx, inode, name, &found));
  if (!found.found) return std::optional<std::string>();
  std::string value(found.record.value_len, '\0');
  CopyValue(ctx, found.record, value.data());
  return std::optional<std::string>(std::move(value));
}

Status FsOps::ChangeXattrs(FsImpl& fs, Tx& tx, uint64_t ino, const Inode& inode,
                           std::span<const XattrChange> changes, timespec now) {
  if (FsOps::Pinned(inode)) return Error(EPERM);  // chattr +i or +a
  FsContext& ctx = FsOps::Ctx(fs);
  if (ctx.geometry.xattr_chain()) {
    bool changed = false;
    for (const XattrChange& c : changes) {
      if (c.value == nullptr) {
        Status st = RemoveChained(fs, inode, c.name, &tx);
        if (!st.ok() && st.code() == ENODATA) continue;
        NVFS_TRY(st);
      } else {
        NVFS_TRY(SetChainedIn(fs, tx, ino, inode, c.name, c.value->data(), c.value->size(), 0,
                              now));
      }
      changed = true;
    }
    if (changed) FsOps::Touch(tx, inode, false, true, now);
    return Status::Ok();
  }
  Result<std::vector<Attribute>> attrs = LegacyLoad(ctx, inode);
  if (!attrs.ok()) return attrs.take_error();
  bool changed = false;
  for (const XattrChange& c : changes) {
    auto it = FindIn(*attrs, c.name);
    if (c.value == nullptr) {
      if (it == attrs->end()) continue;
      attrs->erase(it);
    } else if (it != attrs->end()) {
      if (it->value == *c.value) continue;
      it->value = *c.value;
    } else {
      attrs->push_back({std::string(c.name), *c.value});
    }
    changed = true;
  }
  if (!changed) return Status::Ok();
  return LegacyStore(fs, tx, ino, inode, *attrs, now);
}

Status FsImpl::SetXattr(uint64_t ino, std::string_view name, const void* value, size_t size,
                            int flags, unsigned xattr_flags) {
  if (read_only_) return Error(EROFS);
  NVFS_TRY(CheckXattrName(name));
  if (size > kXattrValueMax) return Error(E2BIG);
  if (flags & ~(XATTR_CREATE | XATTR_REPLACE)) return Error(EINVAL);
  if (IsAclName(name)) {
    return FsOps::SetAcl(*this, ino, name == format::kAclDefaultName,
                         std::string_view(static_cast<const char*>(value), size), xattr_flags);
  }
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (FsOps::Pinned(inode)) return Error(EPERM);  // chattr +i or +a
  if (ctx_->geometry.xattr_chain()) return SetChained(*this, ino, inode, name, value, size, flags);
  return LegacyChange(*this, ino, inode, [&](std::vector<Attribute>& attrs) -> Status {
    auto it = FindIn(attrs, name);
    if (it != attrs.end() && (flags & XATTR_CREATE)) return Error(EEXIST);
    if (it == attrs.end() && (flags & XATTR_REPLACE)) return Error(ENODATA);
    std::string v(static_cast<const char*>(value), size);
    if (it != attrs.end()) {
      it->value = std::move(v);
    } else {
      attrs.push_back({std::string(name), std::move(v)});
    }
    return Status::Ok();
  });
}

Result<size_t> FsImpl::GetXattr(uint64_t ino, std::string_view name, void* value,
                                    size_t size) {
  NVFS_TRY(CheckXattrName(name));
  if (IsAclName(name)) return FsOps::GetAcl(*this, ino, name == format::kAclDefaultName, value, size);
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  std::shared_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (inode.xattr_block == 0) return Error(ENODATA);
  Found found;
  NVFS_TRY(Find(*ctx_, inode, name, &found));
  if (!found.found) return Error(ENODATA);
  const size_t len = found.record.value_len;
  if (size == 0) return len;
  if (size < len) return Error(ERANGE);
  CopyValue(*ctx_, found.record, value);
  return len;
}

// ext4's answers: size 0 asks for the list's size; a buffer too small for
// the whole list is ERANGE. A set never lets the list grow past
// kXattrListMax, the kernel's own limit, so every list can be returned.
Result<size_t> FsImpl::ListXattr(uint64_t ino, char* list, size_t size, const Cred& cred) {
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  std::shared_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  size_t total = 0;
  NVFS_TRY(Walk(*ctx_, inode, [&](const ChainBlock&, const XattrRecord& record) {
    if (record.free || !Listed(record.name, cred)) return true;
    const size_t n = record.name.size() + 1;
    if (size != 0 && total + n <= size) {
      std::memcpy(list + total, record.name.data(), record.name.size());
      list[total + record.name.size()] = '\0';
    }
    total += n;
    return true;
  }));
  if (size != 0 && size < total) return Error(ERANGE);
  return total;
}

Status FsImpl::RemoveXattr(uint64_t ino, std::string_view name) {
  if (read_only_) return Error(EROFS);
  NVFS_TRY(CheckXattrName(name));
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (FsOps::Pinned(inode)) return Error(EPERM);  // chattr +i or +a
  if (ctx_->geometry.xattr_chain()) return RemoveChained(*this, inode, name, nullptr);
  return LegacyChange(*this, ino, inode, [&](std::vector<Attribute>& attrs) -> Status {
    auto it = FindIn(attrs, name);
    if (it == attrs.end()) return Error(ENODATA);
    attrs.erase(it);
    return Status::Ok();
  });
}

}  // namespace nvfs
