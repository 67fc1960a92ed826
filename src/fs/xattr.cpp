// Extended attributes: the Filesystem entry points and FsImpl's own calls
// (fs_impl.hpp). They check the name against the namespace policy
// (xattr_policy.cpp), hand the ACL names to acl.cpp, and pick the format
// the namespace uses: chained (xattr_chained.cpp) or one block
// (xattr_legacy.cpp). xattr.hpp says which file holds what.
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fs/fs_impl.hpp"
#include "fs/xattr.hpp"

namespace nvfs {

using format::Inode;
using format::XattrBlockHeader;
using format::kXattrValueMax;
using xattr::Attribute;
using xattr::ChainBlock;
using xattr::CheckXattrName;
using xattr::CopyValue;
using xattr::Find;
using xattr::FindIn;
using xattr::Found;
using xattr::IsAclName;
using xattr::LegacyChange;
using xattr::LegacyLoad;
using xattr::LegacyStore;
using xattr::Listed;
using xattr::RemoveChained;
using xattr::RemoveFound;
using xattr::SetChained;
using xattr::SetChainedIn;
using xattr::Walk;

namespace {

constexpr std::string_view kCapability = "security.capability";

}  // namespace

Result<bool> FsImpl::HasCapability(const Inode& inode) {
  if (inode.xattr_block == 0) return false;
  Found found;
  NVFS_TRY(Find(*ctx_, inode, kCapability, &found));
  return found.found;
}

Status FsImpl::RemoveCapability(uint64_t ino, const Inode& inode, Tx& tx) {
  if (inode.xattr_block == 0) return Status::Ok();
  FsContext& ctx = *ctx_;
  if (ctx.geometry.xattr_chain()) {
    Status st = RemoveChained(ctx, inode, kCapability, &tx);
    return !st.ok() && st.code() == ENODATA ? Status::Ok() : st;
  }
  Result<std::vector<Attribute>> attrs = LegacyLoad(ctx, inode);
  if (!attrs.ok()) return attrs.take_error();
  auto it = FindIn(*attrs, kCapability);
  if (it == attrs->end()) return Status::Ok();
  attrs->erase(it);
  return LegacyStore(ctx, tx, ino, inode, *attrs, Now());
}

Result<bool> FsImpl::FreeXattrs(Tx& tx, const Inode& inode) {
  FsContext& ctx = *ctx_;
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
      NVFS_TRY(RemoveFound(ctx, tx, inode, head));
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
    NVFS_TRY(ctx.Checked(alloc_->FreeBlocks(tx, block_no, 1)));
    tx.Set(inode.xattr_block, next);
    tx.Set(inode.blocks, inode.blocks - 1);
  }
  return true;
}

// The ACL code's view (acl.cpp), on either format.
Result<std::optional<std::string>> FsImpl::FindXattr(const Inode& inode, std::string_view name) {
  if (inode.xattr_block == 0) return std::optional<std::string>();
  FsContext& ctx = *ctx_;
  Found found;
  NVFS_TRY(Find(ctx, inode, name, &found));
  if (!found.found) return std::optional<std::string>();
  std::string value(found.record.value_len, '\0');
  CopyValue(ctx, found.record, value.data());
  return std::optional<std::string>(std::move(value));
}

Status FsImpl::ChangeXattrs(Tx& tx, uint64_t ino, const Inode& inode,
                            std::span<const XattrChange> changes, timespec now) {
  if (Pinned(inode)) return Error(EPERM);  // chattr +i or +a
  FsContext& ctx = *ctx_;
  if (ctx.geometry.xattr_chain()) {
    bool changed = false;
    for (const XattrChange& c : changes) {
      if (c.value == nullptr) {
        Status st = RemoveChained(ctx, inode, c.name, &tx);
        if (!st.ok() && st.code() == ENODATA) continue;
        NVFS_TRY(st);
      } else {
        NVFS_TRY(SetChainedIn(ctx, tx, ino, inode, c.name, c.value->data(), c.value->size(), 0,
                              now));
      }
      changed = true;
    }
    if (changed) Touch(tx, inode, false, true, now);
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
  return LegacyStore(ctx, tx, ino, inode, *attrs, now);
}

Status FsImpl::SetXattr(uint64_t ino, std::string_view name, const void* value, size_t size,
                        int flags, unsigned xattr_flags) {
  if (read_only_) return Error(EROFS);
  NVFS_TRY(CheckXattrName(name));
  if (size > kXattrValueMax) return Error(E2BIG);
  if (flags & ~(XATTR_CREATE | XATTR_REPLACE)) return Error(EINVAL);
  if (IsAclName(name)) {
    return SetAcl(ino, name == format::kAclDefaultName,
                  std::string_view(static_cast<const char*>(value), size), xattr_flags);
  }
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (Pinned(inode)) return Error(EPERM);  // chattr +i or +a
  if (ctx_->geometry.xattr_chain()) return SetChained(*ctx_, ino, inode, name, value, size, flags);
  return LegacyChange(*ctx_, ino, inode, [&](std::vector<Attribute>& attrs) -> Status {
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
  if (IsAclName(name)) return GetAcl(ino, name == format::kAclDefaultName, value, size);
  Result<InodeRef> ref = Get(ino);
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
  Result<InodeRef> ref = Get(ino);
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
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (Pinned(inode)) return Error(EPERM);  // chattr +i or +a
  if (ctx_->geometry.xattr_chain()) return RemoveChained(*ctx_, inode, name, nullptr);
  return LegacyChange(*ctx_, ino, inode, [&](std::vector<Attribute>& attrs) -> Status {
    auto it = FindIn(attrs, name);
    if (it == attrs.end()) return Error(ENODATA);
    attrs.erase(it);
    return Status::Ok();
  });
}

}  // namespace nvfs
