// Reading an inode's extended attributes, in either format: the names of
// the faults a walk reports (Walk itself is in xattr.hpp), the check of a
// block or run, a lookup by name, and the copy of a value.
#include <algorithm>
#include <cstring>

#include "fs/xattr.hpp"

namespace nvfs::xattr {

using format::Inode;
using format::XattrValueRun;

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

// A block or run read from an xattr structure: data blocks, in use.
bool UsableRun(const FsContext& ctx, uint64_t first, uint64_t count) {
  if (!ctx.geometry.IsDataRun(first, count)) return false;
  for (uint64_t b = first; b < first + count; ++b) {
    if (!ctx.alloc.InUse(BitmapKind::kBlocks, b)) return false;
  }
  return true;
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

// Looks `name` up and counts the bytes the listing of every name takes.
Status Find(const FsContext& ctx, const Inode& inode, std::string_view name, Found* found,
            uint64_t* list_bytes) {
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

}  // namespace nvfs::xattr
