// Extended attributes: one block per inode, replaced whole (copy on write):
// the new block is written aside and published by one logged store of
// xattr_block; the old block is freed after commit. So set and remove are
// atomic without logging any attribute bytes.
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
using format::XattrEntry;
using format::XattrHeader;

namespace {

using format::kXattrNameMax;
using format::kXattrValueMax;
using format::XattrNamespace;

struct Attribute {
  std::string name;
  std::string value;
};

uint32_t EntrySize(size_t name_len, size_t value_len) {
  return static_cast<uint32_t>(format::XattrEntryLength(name_len, value_len));
}

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
  }
  return "?";
}

// Parses the inode's xattr block (DecodeXattrBlock, the check fsck makes
// too); EIO if it is damaged (reported as damage: the block is read under
// the inode lock, so nothing races with it).
Result<std::vector<Attribute>> Load(const FsContext& ctx, const Inode& inode) {
  std::vector<Attribute> attrs;
  if (inode.xattr_block == 0) return attrs;
  const auto damaged = [&](const char* what) {
    return ctx.Damaged(MakeError(EIO, "xattr block %" PRIu64 ": %s; run fsck.nvfs",
                                 inode.xattr_block, what));
  };
  if (!ctx.ValidBlock(inode.xattr_block)) return damaged("not a data block");
  const XattrFault fault = DecodeXattrBlock(
      {ctx.Block(inode.xattr_block), ctx.geometry.block_size()},
      [&](std::string_view name, std::string_view value) {
        attrs.push_back({std::string(name), std::string(value)});
      });
  if (fault != XattrFault::kNone) return damaged(XattrFaultName(fault));
  return attrs;
}

constexpr std::string_view kCapability = "security.capability";

// Replaces the inode's xattr block with one holding `attrs` (or none),
// logged in `tx`. REQUIRES: inode lock held exclusively.
Status StoreIn(Filesystem& fs, Tx& tx, uint64_t ino, const Inode& inode,
               const std::vector<Attribute>& attrs, timespec now) {
  FsContext& ctx = FsOps::Ctx(fs);
  const uint32_t bs = ctx.geometry.block_size();
  std::vector<std::byte> block(bs);
  XattrHeader header{};
  header.magic = format::kXattrMagic;
  uint32_t pos = sizeof header;
  for (const Attribute& a : attrs) {
    const uint32_t size = EntrySize(a.name.size(), a.value.size());
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

// The same as one transaction of its own.
Status Store(Filesystem& fs, uint64_t ino, const Inode& inode,
             const std::vector<Attribute>& attrs) {
  Tx tx(FsOps::Jnl(fs), "xattr");
  NVFS_TRY(StoreIn(fs, tx, ino, inode, attrs, FsOps::Now()));
  return tx.Commit();
}

}  // namespace

Result<bool> FsOps::HasCapability(Filesystem& fs, const Inode& inode) {
  if (inode.xattr_block == 0) return false;
  Result<std::vector<Attribute>> attrs = Load(FsOps::Ctx(fs), inode);
  if (!attrs.ok()) return attrs.take_error();
  return std::any_of(attrs->begin(), attrs->end(),
                     [](const Attribute& a) { return a.name == kCapability; });
}

Status FsOps::RemoveCapability(Filesystem& fs, uint64_t ino, const Inode& inode, Tx& tx) {
  if (inode.xattr_block == 0) return Status::Ok();
  Result<std::vector<Attribute>> attrs = Load(FsOps::Ctx(fs), inode);
  if (!attrs.ok()) return attrs.take_error();
  const auto kept = std::remove_if(attrs->begin(), attrs->end(),
                                   [](const Attribute& a) { return a.name == kCapability; });
  if (kept == attrs->end()) return Status::Ok();
  attrs->erase(kept, attrs->end());
  return StoreIn(fs, tx, ino, inode, *attrs, FsOps::Now());
}

Result<std::optional<std::string>> FsOps::FindXattr(Filesystem& fs, const Inode& inode,
                                                    std::string_view name) {
  if (inode.xattr_block == 0) return std::optional<std::string>();
  Result<std::vector<Attribute>> attrs = Load(FsOps::Ctx(fs), inode);
  if (!attrs.ok()) return attrs.take_error();
  for (Attribute& a : *attrs) {
    if (a.name == name) return std::optional<std::string>(std::move(a.value));
  }
  return std::optional<std::string>();
}

Status FsOps::ChangeXattrs(Filesystem& fs, Tx& tx, uint64_t ino, const Inode& inode,
                           std::span<const XattrChange> changes, timespec now) {
  Result<std::vector<Attribute>> attrs = Load(FsOps::Ctx(fs), inode);
  if (!attrs.ok()) return attrs.take_error();
  bool changed = false;
  for (const XattrChange& c : changes) {
    auto it = std::find_if(attrs->begin(), attrs->end(),
                           [&](const Attribute& a) { return a.name == c.name; });
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
  return StoreIn(fs, tx, ino, inode, *attrs, now);
}

// Runs `change` on inode `ino`'s attributes, loaded under its exclusive
// lock, and stores them back (one transaction) if it succeeds.
template <class Change>
static Status ChangeAttributes(Filesystem& fs, uint64_t ino, Change&& change) {
  Result<InodeRef> ref = FsOps::Get(fs, ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  if (FsOps::Pinned(ref->media())) return Error(EPERM);  // chattr +i or +a
  Result<std::vector<Attribute>> attrs = Load(FsOps::Ctx(fs), ref->media());
  if (!attrs.ok()) return attrs.take_error();
  NVFS_TRY(change(*attrs));
  return Store(fs, ino, ref->media(), *attrs);
}

// Runs `read` on inode `ino`'s attributes, loaded under its shared lock.
template <class Read>
static Result<size_t> ReadAttributes(Filesystem& fs, uint64_t ino, Read&& read) {
  Result<InodeRef> ref = FsOps::Get(fs, ino);
  if (!ref.ok()) return ref.take_error();
  std::shared_lock lock(ref.value()->lock);
  Result<std::vector<Attribute>> attrs = Load(FsOps::Ctx(fs), ref->media());
  if (!attrs.ok()) return attrs.take_error();
  return read(*attrs);
}

static std::vector<Attribute>::iterator Find(std::vector<Attribute>& attrs, std::string_view name) {
  return std::find_if(attrs.begin(), attrs.end(), [&](const Attribute& a) { return a.name == name; });
}

Status Filesystem::SetXattr(uint64_t ino, std::string_view name, const void* value, size_t size,
                            int flags, unsigned xattr_flags) {
  if (read_only_) return Error(EROFS);
  NVFS_TRY(CheckXattrName(name));
  if (size > kXattrValueMax) return Error(E2BIG);
  if (flags & ~(XATTR_CREATE | XATTR_REPLACE)) return Error(EINVAL);
  if (IsAclName(name)) {
    return FsOps::SetAcl(*this, ino, name == format::kAclDefaultName,
                         std::string_view(static_cast<const char*>(value), size), xattr_flags);
  }
  return ChangeAttributes(*this, ino, [&](std::vector<Attribute>& attrs) -> Status {
    auto it = Find(attrs, name);
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

Result<size_t> Filesystem::GetXattr(uint64_t ino, std::string_view name, void* value,
                                    size_t size) {
  NVFS_TRY(CheckXattrName(name));
  if (IsAclName(name)) return FsOps::GetAcl(*this, ino, name == format::kAclDefaultName, value, size);
  return ReadAttributes(*this, ino, [&](std::vector<Attribute>& attrs) -> Result<size_t> {
    auto it = Find(attrs, name);
    if (it == attrs.end()) return Error(ENODATA);
    if (size == 0) return it->value.size();
    if (size < it->value.size()) return Error(ERANGE);
    std::memcpy(value, it->value.data(), it->value.size());
    return it->value.size();
  });
}

Result<size_t> Filesystem::ListXattr(uint64_t ino, char* list, size_t size, const Cred& cred) {
  return ReadAttributes(*this, ino, [&](std::vector<Attribute>& attrs) -> Result<size_t> {
    size_t total = 0;
    for (const Attribute& a : attrs) {
      if (Listed(a.name, cred)) total += a.name.size() + 1;
    }
    if (size == 0) return total;
    if (size < total) return Error(ERANGE);
    for (const Attribute& a : attrs) {
      if (!Listed(a.name, cred)) continue;
      std::memcpy(list, a.name.c_str(), a.name.size() + 1);
      list += a.name.size() + 1;
    }
    return total;
  });
}

Status Filesystem::RemoveXattr(uint64_t ino, std::string_view name) {
  if (read_only_) return Error(EROFS);
  NVFS_TRY(CheckXattrName(name));
  return ChangeAttributes(*this, ino, [&](std::vector<Attribute>& attrs) -> Status {
    auto it = Find(attrs, name);
    if (it == attrs.end()) return Error(ENODATA);
    attrs.erase(it);
    return Status::Ok();
  });
}

}  // namespace nvfs
