// The extended-attribute module's insides (doc/format.md, "Extended
// attributes"; the order of stores: doc/integrity.md, setxattr /
// removexattr), each usable on its own over an FsContext, without a mounted
// Filesystem:
//
//   xattr_policy.cpp   which names the filesystem serves and lists to whom;
//   xattr_walk.cpp     reading either format: the checked walk of an inode's
//                      blocks (Walk, below), a lookup by name, a value's copy;
//   xattr_chained.cpp  the chained format (format::kIncompatXattrChain, every
//                      namespace mkfs 2.1 makes): records changed in place;
//   xattr_legacy.cpp   the one-block format of older namespaces, replaced
//                      whole on every change;
//   xattr.cpp          the Filesystem entry points and FsImpl's own calls
//                      (fs_impl.hpp), which check the name (policy) and
//                      pick the format.
//
// Every block is checked before it is read or followed (a data block, in
// use, decoded by DecodeXattrBlock, the validator fsck uses too), and a walk
// reads at most inode.blocks blocks, so a damaged `next` cannot loop it.
#pragma once

#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ctx/context.hpp"
#include "journal/journal.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/result.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::xattr {

// --- Policy (xattr_policy.cpp) ---------------------------------------------

// The two POSIX ACL names (acl.cpp serves them).
bool IsAclName(std::string_view name);
// Whether the filesystem serves `name`: ERANGE for an empty name or one
// longer than kXattrNameMax, EOPNOTSUPP for a name of no namespace or a
// system.* name other than the ACL names.
Status CheckXattrName(std::string_view name);
// Whether ListXattr shows `name` to `cred`.
bool Listed(std::string_view name, const Cred& cred);

// --- Reading either format (xattr_walk.cpp) --------------------------------

// What a fault DecodeXattrBlock found is called in the damage report.
const char* XattrFaultName(XattrFault fault);

// One block of an inode's chain, checked.
struct ChainBlock {
  uint64_t block_no = 0;
  uint64_t link_at = 0;  // media offset of the pointer naming it
  XattrBlockView view;
};

// A block or run read from an xattr structure: data blocks, in use.
bool UsableRun(const FsContext& ctx, uint64_t first, uint64_t count);

// Walks the inode's xattr blocks: each is checked (UsableRun, then decoded)
// before fn(const ChainBlock&, const XattrRecord&) sees its records (free
// ones too) and before its `next` is followed; the runs of each live record
// are checked too. fn returns false to stop. At most inode.blocks blocks are
// read: a longer chain (a loop) is damage. EIO, reported as damage, for any
// fault. Either format (the one-block format is a chain of one block).
// REQUIRES: the inode lock (shared at least).
template <class Fn>
Status Walk(const FsContext& ctx, const format::Inode& inode, Fn&& fn) {
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
            const format::XattrValueRun run = record.Run(r);
            if (!UsableRun(ctx, run.first, run.count)) bad_run = true;
          }
          if (!bad_run) go_on = fn(static_cast<const ChainBlock&>(block), record);
        },
        &block.view);
    if (bad_run) return damaged("a value run names no data block in use");
    if (fault != XattrFault::kNone) return damaged(XattrFaultName(fault));
    if (!go_on) return Status::Ok();
    block.link_at =
        ctx.geometry.BlockOffset(block.block_no) + offsetof(format::XattrBlockHeader, next);
    block.block_no = block.view.next;
  }
  return Status::Ok();
}

// Copies a record's value (inline or from its runs) to `out`.
void CopyValue(const FsContext& ctx, const XattrRecord& record, void* out);

// A live record found by name: where it is.
struct Found {
  bool found = false;
  ChainBlock block;
  XattrRecord record;
  uint32_t live_in_block = 0;  // live records of its block, itself included
};

// Looks `name` up and counts the bytes the listing of every name takes.
Status Find(const FsContext& ctx, const format::Inode& inode, std::string_view name, Found* found,
            uint64_t* list_bytes = nullptr);

// --- The chained format (xattr_chained.cpp) --------------------------------

// Records up to this many bytes keep their value inline; longer values go
// to runs of their own. Policy, not format: it bounds what one set logs
// (the record's old bytes) well inside the smallest journal slot.
inline constexpr uint32_t kInlineRecordMax = 1024;

// Removes the found record in `tx`: it becomes free, its runs are freed after
// commit, and a block left with no live record is unlinked and freed.
// Allocates nothing. REQUIRES: inode lock held exclusively.
Status RemoveFound(FsContext& ctx, Tx& tx, const format::Inode& inode, const Found& found);

// Sets `name` on a chained namespace, in `tx` (which a caller may share with
// other changes of the same inode: each walk sees the stores of the ones
// before); the order of stores is above its definition. `flags`:
// XATTR_CREATE (EEXIST if present), XATTR_REPLACE (ENODATA if absent).
// ENOSPC if the list of names would outgrow kXattrListMax, or no block is
// left. ctime becomes `now`. REQUIRES: inode lock held exclusively until tx
// commits.
Status SetChainedIn(FsContext& ctx, Tx& tx, uint64_t ino, const format::Inode& inode,
                    std::string_view name, const void* value, size_t size, int flags,
                    timespec now);
// The same as one transaction of its own.
Status SetChained(FsContext& ctx, uint64_t ino, const format::Inode& inode, std::string_view name,
                  const void* value, size_t size, int flags);
// Removes `name` (ENODATA if absent): in *in_tx if given (ctime left to the
// caller), else in a transaction of its own that also sets ctime.
// REQUIRES: inode lock held exclusively.
Status RemoveChained(FsContext& ctx, const format::Inode& inode, std::string_view name,
                     Tx* in_tx);

// --- The one-block format (xattr_legacy.cpp) -------------------------------

struct Attribute {
  std::string name;
  std::string value;
};

// Every attribute of the inode, in the order of its block.
Result<std::vector<Attribute>> LegacyLoad(const FsContext& ctx, const format::Inode& inode);
// Replaces the inode's xattr block with one holding `attrs` (or none), in
// `tx`; ENOSPC if they do not fit one block. REQUIRES: inode lock held
// exclusively.
Status LegacyStore(FsContext& ctx, Tx& tx, uint64_t ino, const format::Inode& inode,
                   const std::vector<Attribute>& attrs, timespec now);
// Runs `change` on the attributes and stores them back (one transaction);
// nothing is stored if `change` fails.
Status LegacyChange(FsContext& ctx, uint64_t ino, const format::Inode& inode,
                    const std::function<Status(std::vector<Attribute>&)>& change);
// The attribute named `name`, or attrs.end().
std::vector<Attribute>::iterator FindIn(std::vector<Attribute>& attrs, std::string_view name);

}  // namespace nvfs::xattr
