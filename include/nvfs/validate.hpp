// The checks of on-media objects, one decoder or validator per kind of
// object, written once and used by mount, the core and fsck alike (STYLE
// 12a; doc/integrity.md section 9 says who calls what). Each answers with a
// typed fault saying what is wrong; the caller decides what that means: the
// core turns it into EIO or EUCLEAN and a damage report, fsck into its
// message and repair. What needs the whole namespace — a block or an inode
// reached twice, reachability, link counts, the bitmaps against what is in
// use — is fsck's own (src/fsck), as is every repair.
//
// Everything here reads only the object it is given (and the geometry): no
// bitmap, no other inode, no lock. The map path's cost is not here: the
// bmap copies FileMapLayout's numbers once, and checks each pointer with
// Geometry::IsDataBlock (geometry.hpp), the pointer check of this layer.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/name_hash.hpp"

namespace nvfs {

// ---------------------------------------------------------------------------
// Inodes
// ---------------------------------------------------------------------------

// The file type an inode's mode names; kInvalid for none the format has.
enum class InodeType : uint8_t { kInvalid, kRegular, kDirectory, kSymlink, kSpecial };
inline InodeType InodeTypeOf(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return InodeType::kRegular;
    case S_IFDIR: return InodeType::kDirectory;
    case S_IFLNK: return InodeType::kSymlink;
    case S_IFCHR: case S_IFBLK: case S_IFIFO: case S_IFSOCK: return InodeType::kSpecial;
    default: return InodeType::kInvalid;
  }
}

// A symlink's size (its target's length) as the format allows it.
inline bool SymlinkSizeValid(uint64_t size) {
  return size != 0 && size <= format::kSymlinkMax;
}

// Whether an inode flagged as an orphan may be one: unlinked, or a regular
// file whose truncation was cut short (nothing else is ever truncated).
inline bool OrphanMayBe(const format::Inode& inode) {
  return inode.nlink == 0 || InodeTypeOf(inode.mode) == InodeType::kRegular;
}

// What ValidateInode finds wrong with an inode in use, one bit each.
enum InodeFault : uint32_t {
  kInodeFaultType = 1u << 0,      // the mode names no file type
  kInodeFaultReserved = 1u << 1,  // reserved0 is not zero, or an append word is not valid
  kInodeFaultFlags = 1u << 2,     // a flag bit the format does not define
  kInodeFaultSize = 1u << 3,      // the size is past its type's bound (below)
};
using InodeFaults = uint32_t;

// The one validator of an inode's own fields, for an inode in use (its
// bitmap bit set), used by the core wherever it loads one (FsImpl::CheckIno,
// so also orphan processing), by fsck and by nvfs-dump. The size bound by
// type: a regular file at most `max_file_size` (FileMapLayout::max_size for
// the block size: a damaged size near 2^64 would wrap every rounding up to
// a block); a symlink SymlinkSizeValid; a special file 0; a directory's
// (block_size * nodes) is checked with its tree, by fsck. Every field it
// reads is stored whole by every change, so a copy taken without the
// inode's lock (CopyRacing) never shows a fault the media does not have.
// What it leaves to the callers: the orphan flag against the list
// (OrphanMayBe), the map, links, and everything that needs other objects.
// Returns 0 when the inode passes; kInodeFaultType alone when the mode
// names no type (nothing else of such an inode means anything).
inline InodeFaults ValidateInode(const format::Inode& inode, uint64_t max_file_size) {
  const InodeType type = InodeTypeOf(inode.mode);
  if (type == InodeType::kInvalid) return kInodeFaultType;
  InodeFaults faults = 0;
  if (inode.reserved0 != 0) faults |= kInodeFaultReserved;
  // An append word: a regular file's, tagged, its end within the largest
  // file (read once: a direct writer may be moving it).
  if (const uint64_t word = std::atomic_ref(const_cast<uint64_t&>(inode.append_end))
                                .load(std::memory_order_acquire);
      word != 0 && (type != InodeType::kRegular || format::AppendTag(word) == 0 ||
                    format::AppendEnd(word) > max_file_size)) {
    faults |= kInodeFaultReserved;
  }
  if ((inode.flags & ~format::kInodeFlagsKnown) != 0) faults |= kInodeFaultFlags;
  switch (type) {
    case InodeType::kRegular:
      if (inode.size > max_file_size) faults |= kInodeFaultSize;
      break;
    case InodeType::kSymlink:
      if (!SymlinkSizeValid(inode.size)) faults |= kInodeFaultSize;
      break;
    case InodeType::kSpecial:
      if (inode.size != 0) faults |= kInodeFaultSize;
      break;
    case InodeType::kDirectory:
    case InodeType::kInvalid:
      break;
  }
  return faults;
}

// Words for the lowest fault in `faults` ("size past its type's bound").
inline const char* InodeFaultName(InodeFaults faults) {
  if (faults & kInodeFaultType) return "invalid mode";
  if (faults & kInodeFaultReserved) return "reserved field not zero";
  if (faults & kInodeFaultFlags) return "unknown flags";
  if (faults & kInodeFaultSize) return "size past its type's bound";
  return "no fault";
}

// ---------------------------------------------------------------------------
// File maps (format.hpp, InodeFileMap)
// ---------------------------------------------------------------------------

// File block arithmetic saturates at 2^64 - 1 (no range of file blocks wraps).
inline constexpr uint64_t kSaturated = ~uint64_t{0};
inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > kSaturated - b ? kSaturated : a + b;
}
inline uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  return b != 0 && a > kSaturated / b ? kSaturated : a * b;
}

// Where each tree of a file map begins, for one block size: the direct
// pointers map file blocks [0, 11), the depth-d tree [start(d), start(d+1)).
// The arithmetic saturates at 2^64 - 1 (a depth-5 tree of 1 MiB blocks
// addresses 2^85 blocks), and files end at 2^63 - 1 bytes.
class FileMapLayout {
 public:
  explicit FileMapLayout(uint32_t block_shift);

  // First file block of the depth-`depth` tree, 1 <= depth <= 6 (6: the end
  // of the depth-5 range), saturated.
  uint64_t start(uint32_t depth) const { return start_[depth]; }
  // File blocks a map can address: below both start(6) and 2^63 bytes.
  uint64_t max_blocks() const { return max_blocks_; }
  // The deepest tree holding a block below max_blocks(); p^depth < 2^60 for
  // every depth up to it, so no shift of a file block index overflows.
  uint32_t max_depth() const { return max_depth_; }
  // The largest size a file of this block size may have.
  uint64_t max_size() const;

 private:
  uint32_t block_shift_;
  uint64_t start_[format::kIndirectPointers + 2] = {};
  uint64_t max_blocks_ = 0;
  uint32_t max_depth_ = 0;
};

// ---------------------------------------------------------------------------
// Extended-attribute blocks (format.hpp, XattrHeader and XattrEntry)
// ---------------------------------------------------------------------------

enum class XattrFault : uint8_t {
  kNone,
  kNoMagic,       // the magic is not the one the namespace's format uses
  kOverfull,      // header.used runs past the block
  kShortEntries,  // fewer records in `used` bytes than header.count
  kBadEntry,      // a name of 0 bytes (one-block format), a value past kXattrValueMax, or past `used`
  kNoNamespace,   // a name of no known namespace (XattrNamespaceOf: kNone)
  kTrailingBytes, // bytes in `used` after the last record
  kReserved,      // a reserved field or unknown flag set
  kBadRuns,       // a value in runs: no runs, too many, or not adding up to its blocks
};

// One record of an xattr block, as DecodeXattrBlock hands it out. Views
// point into the block.
struct XattrRecord {
  uint32_t offset = 0;         // of the record's header in the block
  uint32_t length = 0;         // bytes of the record
  bool free = false;           // a free record (chains only): no name, no value
  std::string_view name;       // the full name
  uint32_t value_len = 0;
  std::string_view value;      // an inline value (empty when in runs)
  uint16_t runs = 0;           // value runs; 0: the value is inline
  const std::byte* run_at = nullptr;  // the XattrValueRun array (8-aligned in the block)

  format::XattrValueRun Run(uint32_t i) const {
    format::XattrValueRun run;
    std::memcpy(&run, run_at + i * sizeof run, sizeof run);
    return run;
  }
};

// The header of an xattr block in either format: `chain` is the namespace's
// format (Geometry::xattr_chain); only a chain block has a `next`.
struct XattrBlockView {
  uint32_t header_size = 0;  // where the records begin
  uint32_t count = 0;
  uint32_t used = 0;         // bytes of records
  uint64_t next = 0;         // the chain's next block (not yet checked)
};

// Decodes an xattr block: checks the header, then each record in order
// before it calls fn(const XattrRecord&) (free ones included); returns the
// first fault, the records before it having been passed to fn. `view`, if
// given, receives the header (valid once the header checks passed). Value
// runs are checked for shape here (at most XattrMaxRuns, each of one block
// or more, adding up to the value's blocks); whether their blocks are data
// blocks in use is the caller's check (Geometry::IsDataRun and a bitmap).
// REQUIRES: block.size() is the block size.
template <class Fn>
XattrFault DecodeXattrBlock(std::span<const std::byte> block, bool chain, Fn&& fn,
                            XattrBlockView* view = nullptr) {
  XattrBlockView v;
  if (chain) {
    format::XattrBlockHeader header;
    std::memcpy(&header, block.data(), sizeof header);
    if (header.magic != format::kXattrChainMagic) return XattrFault::kNoMagic;
    if (header.reserved0 != 0 || header.reserved1 != 0) return XattrFault::kReserved;
    v = {sizeof header, header.count, header.used, header.next};
  } else {
    format::XattrHeader header;
    std::memcpy(&header, block.data(), sizeof header);
    if (header.magic != format::kXattrMagic) return XattrFault::kNoMagic;
    v = {sizeof header, header.count, header.used, 0};
  }
  if (v.used > block.size() - v.header_size) return XattrFault::kOverfull;
  if (view != nullptr) *view = v;
  const uint64_t block_size = block.size();
  uint64_t pos = v.header_size;
  const uint64_t end = v.header_size + uint64_t{v.used};
  for (uint32_t i = 0; i < v.count; ++i) {
    format::XattrEntry entry;
    if (end - pos < sizeof entry) return XattrFault::kShortEntries;
    std::memcpy(&entry, block.data() + pos, sizeof entry);
    XattrRecord record;
    record.offset = static_cast<uint32_t>(pos);
    if (entry.name_len == 0) {
      // A free record: chains only, nothing in it but its length.
      if (!chain) return XattrFault::kBadEntry;
      if (entry.flags != 0 || entry.runs != 0) return XattrFault::kReserved;
      if (entry.value_len % 8 != 0 || entry.value_len > end - pos - sizeof entry) {
        return XattrFault::kBadEntry;
      }
      record.length = static_cast<uint32_t>(sizeof entry + entry.value_len);
      record.free = true;
      fn(static_cast<const XattrRecord&>(record));
      pos += record.length;
      continue;
    }
    if (entry.value_len > format::kXattrValueMax) return XattrFault::kBadEntry;
    const bool in_runs = (entry.flags & format::kXattrValueInRuns) != 0;
    if ((entry.flags & ~format::kXattrValueInRuns) != 0 || (!chain && entry.flags != 0)) {
      return XattrFault::kReserved;
    }
    if (!in_runs && entry.runs != 0) return XattrFault::kReserved;
    const uint64_t size = in_runs ? format::XattrRunEntryLength(entry.name_len, entry.runs)
                                  : format::XattrEntryLength(entry.name_len, entry.value_len);
    if (size > end - pos) return XattrFault::kBadEntry;
    const char* name = reinterpret_cast<const char*>(block.data() + pos + sizeof entry);
    record.name = std::string_view(name, entry.name_len);
    // Any system.* name is well-formed on the media, even those the
    // filesystem does not serve (doc/format.md).
    if (format::XattrNamespaceOf(record.name) == format::XattrNamespace::kNone) {
      return XattrFault::kNoNamespace;
    }
    record.length = static_cast<uint32_t>(size);
    record.value_len = entry.value_len;
    if (in_runs) {
      const uint64_t blocks = (uint64_t{entry.value_len} + block_size - 1) / block_size;
      if (entry.runs == 0 || entry.value_len == 0 ||
          entry.runs > format::XattrMaxRuns(static_cast<uint32_t>(block_size))) {
        return XattrFault::kBadRuns;
      }
      record.runs = entry.runs;
      record.run_at = block.data() + pos + sizeof entry + ((entry.name_len + 7u) & ~7u);
      uint64_t total = 0;
      for (uint32_t r = 0; r < entry.runs; ++r) {
        const format::XattrValueRun run = record.Run(r);
        if (run.count == 0 || run.count > blocks - total) return XattrFault::kBadRuns;
        total += run.count;
      }
      if (total != blocks) return XattrFault::kBadRuns;
    } else {
      record.value = std::string_view(name + entry.name_len, entry.value_len);
    }
    fn(static_cast<const XattrRecord&>(record));
    pos += size;
  }
  return pos == end ? XattrFault::kNone : XattrFault::kTrailingBytes;
}

inline XattrFault CheckXattrBlock(std::span<const std::byte> block, bool chain) {
  return DecodeXattrBlock(block, chain, [](const XattrRecord&) {});
}

// ---------------------------------------------------------------------------
// POSIX ACL values (format.hpp, AclXattrHeader and AclXattrEntry)
// ---------------------------------------------------------------------------

enum class AclFault : uint8_t {
  kNone,
  kSize,     // not a header and 1..kAclEntriesMax whole entries
  kVersion,  // the header's version is not kAclXattrVersion
  kPerm,     // permission bits other than read, write and execute
  kTag,      // a tag the format does not name
  kOrder,    // not owner, named users, owning group, named groups, mask, other,
             // each base entry once, a mask where there is a named entry
  kId,       // a named user or group of id kAclUndefinedId
};

// Checks an ACL value with the kernel's rules (posix_acl_from_xattr, then
// posix_acl_valid): what the kernel would refuse to read is a fault. The
// ids of the base entries are not looked at (the kernel ignores them).
// With `entries`, appends the decoded entries to it when there is no fault.
AclFault DecodeAcl(std::string_view value, std::vector<format::AclXattrEntry>* entries);
const char* AclFaultName(AclFault fault);

// ---------------------------------------------------------------------------
// Directories (format.hpp, "Directories")
// ---------------------------------------------------------------------------

// The levels of a directory tree for one block size: index level k uses
// hash bits [Start(k), End(k)); depth -1 stands for dir.root, which uses none.
class DirTreeShape {
 public:
  explicit DirTreeShape(uint32_t block_shift)
      : fanout_bits_(block_shift - 3),
        max_depth_(static_cast<int>((format::kDirHashBits + fanout_bits_ - 1) / fanout_bits_) -
                   1) {}

  uint32_t fanout_bits() const { return fanout_bits_; }
  // The deepest index level: the one that uses the last hash bits.
  int max_depth() const { return max_depth_; }
  uint32_t Start(int depth) const { return depth < 0 ? 0 : depth * fanout_bits_; }
  uint32_t End(int depth) const {
    return depth < 0 ? 0 : std::min<uint32_t>((depth + 1) * fanout_bits_, format::kDirHashBits);
  }
  uint32_t Width(int depth) const { return End(depth) - Start(depth); }
  // Slots a leaf of `prefix_bits` fills in a depth-`depth` index node.
  uint32_t Span(int depth, uint32_t prefix_bits) const {
    return uint32_t{1} << (End(depth) - prefix_bits);
  }

 private:
  uint32_t fanout_bits_;
  int max_depth_;
};

inline constexpr uint64_t kDirNodeReservedBits =
    ~(format::kDirNodeIndexBit | format::kDirNodeBlockMask);

enum class DirNodeFault : uint8_t {
  kNone,
  kReservedBits,  // bits other than the index bit and the block number
  kNotData,       // the block is no data block (Geometry::IsDataBlock)
};

// A DirNodePtr read from the media, before it is followed.
inline DirNodeFault CheckDirNodePointer(uint64_t ptr, const Geometry& geometry) {
  if ((ptr & kDirNodeReservedBits) != 0) return DirNodeFault::kReservedBits;
  if (!geometry.IsDataBlock(ptr & format::kDirNodeBlockMask)) return DirNodeFault::kNotData;
  return DirNodeFault::kNone;
}

enum class DirLeafFault : uint8_t {
  kNone,
  kNoMagic,       // magic is not kDirLeafMagic
  kPrefixLength,  // prefix_bits outside the level that points to it
  kPrefix,        // prefix is not the path's
  kOverflowLink,  // a `next` link on a leaf above the last level
  kOtherPrefix,   // an overflow leaf whose prefix is not its head's
};

// The header of a leaf reached through a slot of a depth-`depth` index node
// (-1: dir.root) whose hashes begin with `path_bits` (shape.End(depth) bits).
inline DirLeafFault CheckDirLeaf(const format::DirLeafHeader& leaf, const DirTreeShape& shape,
                                 int depth, uint64_t path_bits) {
  if (leaf.magic != format::kDirLeafMagic) return DirLeafFault::kNoMagic;
  const uint32_t bits = leaf.prefix_bits;
  if (bits < shape.Start(depth) || bits > shape.End(depth)) return DirLeafFault::kPrefixLength;
  if (leaf.prefix != path_bits >> (shape.End(depth) - bits)) return DirLeafFault::kPrefix;
  if (leaf.next != 0 && bits != format::kDirHashBits) return DirLeafFault::kOverflowLink;
  return DirLeafFault::kNone;
}

// An overflow leaf of the chain headed by the checked leaf `head`.
inline DirLeafFault CheckDirOverflowLeaf(const format::DirLeafHeader& leaf,
                                         const format::DirLeafHeader& head) {
  if (leaf.magic != format::kDirLeafMagic) return DirLeafFault::kNoMagic;
  if (leaf.prefix_bits != head.prefix_bits || leaf.prefix != head.prefix) {
    return DirLeafFault::kOtherPrefix;
  }
  return DirLeafFault::kNone;
}

// A record's length, for the record `remaining` bytes before the end of its
// leaf: the records must chain exactly to the end of the block.
enum class DirRecordFault : uint8_t {
  kNone,
  kPastBlock,  // fewer than sizeof(DirEntry) bytes left: no record fits
  kBadLength,  // rec_len below the header, not a multiple of 8, or past the block
};

inline DirRecordFault CheckDirRecordLength(uint32_t rec_len, uint32_t remaining) {
  constexpr uint32_t kHeader = sizeof(format::DirEntry);
  if (remaining < kHeader) return DirRecordFault::kPastBlock;
  if (rec_len < kHeader || rec_len % 8 != 0 || rec_len > remaining) {
    return DirRecordFault::kBadLength;
  }
  return DirRecordFault::kNone;
}

// Walks the records of a directory leaf (`leaf`: the whole block, its header
// first) in order, checking each record's length (CheckDirRecordLength)
// before it calls fn(offset, record) -> bool with it, `record` being a view
// into `leaf`. Stops when fn returns false (returning kNone), or at the first
// record whose length is bad, returning that fault; with `stop`, *stop
// receives the offset of the record it stopped at. kNone after the last
// record: the records chain exactly to the end of the block. What a record
// holds (DirNameLengthValid, CheckDirEntry) is the caller's to check.
template <class Fn>
DirRecordFault WalkDirLeaf(std::span<const std::byte> leaf, Fn&& fn, uint32_t* stop = nullptr) {
  const uint32_t size = static_cast<uint32_t>(leaf.size());
  uint32_t offset = sizeof(format::DirLeafHeader);
  DirRecordFault fault = DirRecordFault::kNone;
  while (offset < size) {
    const uint32_t remaining = size - offset;
    const auto* record = remaining >= sizeof(format::DirEntry)
                             ? reinterpret_cast<const format::DirEntry*>(leaf.data() + offset)
                             : nullptr;
    const uint32_t rec_len = record != nullptr ? uint32_t{record->rec_len} : 0;
    fault = CheckDirRecordLength(rec_len, remaining);
    if (fault != DirRecordFault::kNone || !fn(offset, *record)) break;
    offset += rec_len;
  }
  if (stop != nullptr) *stop = offset;
  return fault;
}

// A live record's name length: at least one byte, and inside the record.
// REQUIRES: CheckDirRecordLength passed.
inline bool DirNameLengthValid(const format::DirEntry& record) {
  return record.name_len != 0 && record.name_len <= record.rec_len - sizeof(format::DirEntry);
}

// The name of a record met by WalkDirLeaf: record.name_len bytes after its
// header. REQUIRES: DirNameLengthValid(record).
inline std::string_view DirRecordName(const format::DirEntry& record) {
  return {reinterpret_cast<const char*>(&record) + sizeof(format::DirEntry), record.name_len};
}

enum class DirEntryFault : uint8_t {
  kNone,
  kNameLength,  // 0, or past the record
  kName,        // holds '/' or NUL, or is "." or ".."
  kKey,         // above kDirKeyMax
  kKeyNotHash,  // the key's hash is not the name's
  kPrefix,      // the key's hash does not begin with the leaf's prefix
};

// A live record (ino != 0) of a leaf whose hashes begin with the
// `prefix_bits`-bit `prefix`; `name` is the record's name bytes as stored
// (record.name_len of them, once kNameLength is ruled out). The structural
// checks — what the core needs to use a record — always; with `hash_key`
// also the name's bytes and its hash against the key (fsck: a SipHash per
// record, too dear for every lookup).
DirEntryFault CheckDirEntry(const format::DirEntry& record, const char* name,
                            uint32_t prefix_bits, uint64_t prefix,
                            const NameHashKey* hash_key = nullptr);

// ---------------------------------------------------------------------------
// Journal slot headers (format.hpp, JournalSlotHeader)
// ---------------------------------------------------------------------------

// The header of slot `slot`: its magic, its own index and a known state.
inline bool JournalSlotHeaderValid(const format::JournalSlotHeader& header, uint32_t slot) {
  return std::memcmp(header.magic, format::kJournalMagic, sizeof header.magic) == 0 &&
         header.slot == slot &&
         header.state <= static_cast<uint32_t>(format::JournalState::kCommitted);
}

// The checksum of a journal record: CRC32C of its header with the checksum
// field zero, then of its payload (format.md, "Journal"). The journal writes
// and reads records with it; FindSuper reads a grow's records before any
// geometry is known (superblock.hpp).
uint32_t JournalRecordChecksum(const format::JournalRecord& header, const std::byte* payload,
                               uint32_t payload_len);

// The header of an idle slot holding no record of any sequence (mkfs, and
// fsck over a cleared damaged slot).
inline format::JournalSlotHeader IdleJournalSlotHeader(uint32_t slot) {
  format::JournalSlotHeader header{};
  std::memcpy(header.magic, format::kJournalMagic, sizeof header.magic);
  header.state = static_cast<uint32_t>(format::JournalState::kIdle);
  header.slot = slot;
  header.tx_seq = 0;
  return header;
}

}  // namespace nvfs
