// The nvfs on-media format: every structure that lives on the persistent-memory
// namespace, and nothing else. doc/format.md describes the same layout in prose;
// the two must agree.
//
// Conventions (checked below at compile time):
//  - all integers are little-endian, fixed width, naturally aligned;
//  - every struct is trivially copyable and standard-layout, with its size and
//    key offsets pinned by static_assert;
//  - reserved fields must be zero when written and are ignored when read, unless
//    a feature bit gives them a meaning;
//  - a block number of 0 means "none" (block 0 holds the superblock and is never
//    pointed to), an inode number of 0 means "none".
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace nvfs::format {

static_assert(std::endian::native == std::endian::little,
              "nvfs stores integers little-endian and maps them in place");

// ---------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------
inline constexpr uint32_t kMinBlockSize = 4096;      // at least the page size
inline constexpr uint32_t kMaxBlockSize = 1u << 20;  // 1 MiB
inline constexpr uint32_t kInodeSize = 256;
inline constexpr uint32_t kNameMax = 255;            // bytes in one name
inline constexpr uint32_t kSymlinkMax = 4095;        // bytes in a symlink target
inline constexpr uint32_t kInlineSymlinkMax = 128;   // targets up to this live in the inode
inline constexpr uint32_t kDirectPointers = 11;
inline constexpr uint32_t kIndirectPointers = 5;     // depths 1..5
inline constexpr uint64_t kRootIno = 1;              // also FUSE_ROOT_ID
inline constexpr uint64_t kFirstIno = 1;             // inode 0 is reserved in group 0
// Block numbers must fit the 56-bit field of a directory node pointer.
inline constexpr uint64_t kMaxBlockCount = uint64_t{1} << 56;

// ---------------------------------------------------------------------------
// Superblock: block 0, bytes 0..4095, in two 2048-byte halves.
// ---------------------------------------------------------------------------
inline constexpr uint64_t kSuperStaticOffset = 0;
inline constexpr uint64_t kSuperDynamicOffset = 2048;
inline constexpr uint32_t kSuperHalfSize = 2048;
inline constexpr char kSuperStaticMagic[8] = {'n', 'v', 'f', 's', '-', 'p', 'm', '\0'};
inline constexpr char kSuperDynamicMagic[8] = {'n', 'v', 'f', 's', '-', 'd', 'y', 'n'};
// Version 2 keyed the directory hash (SipHash-2-4 under dir_hash_key) and
// widened the collision sequence numbers; version 1 images are refused.
inline constexpr uint32_t kVersionMajor = 2;  // a different major is refused
inline constexpr uint32_t kVersionMinor = 1;  // informational (2.1: chained xattrs)

// Feature masks. A set bit the code does not know:
//  - in incompat: refuse to open at all;
//  - in ro_compat: open read-only only;
//  - in compat: ignore (none is defined).
// Chained extended attributes (version 2.1, set by mkfs): xattr_block names
// a chain of XattrBlockHeader blocks whose records may be free or keep their
// value in runs of blocks of its own. Without it (a namespace made before),
// xattr_block names one XattrHeader block, replaced whole on each change.
inline constexpr uint64_t kIncompatXattrChain = uint64_t{1} << 0;
inline constexpr uint64_t kIncompatKnown = kIncompatXattrChain;
inline constexpr uint64_t kRoCompatKnown = 0;

// The static half: written by mkfs (and by a future grow), never by the running
// filesystem. Copied verbatim to the last 2048 bytes of the last block.
struct SuperStatic {
  char magic[8];               // kSuperStaticMagic
  uint32_t version_major;      // kVersionMajor
  uint32_t version_minor;      // kVersionMinor
  uint64_t feature_compat;
  uint64_t feature_incompat;
  uint64_t feature_ro_compat;
  uint32_t block_size;         // bytes, power of two, kMinBlockSize..kMaxBlockSize
  uint32_t block_shift;        // log2(block_size)
  uint64_t block_count;        // blocks in the filesystem, including the backup block
  uint32_t blocks_per_group;   // block_size * 8: one bitmap block per group
  uint32_t inodes_per_group;   // multiple of block_size / kInodeSize, <= blocks_per_group
  uint32_t group_count;        // ceil(block_count / blocks_per_group)
  uint32_t inode_size;         // kInodeSize
  uint64_t inode_count;        // group_count * inodes_per_group
  uint32_t itable_blocks;      // inode-table blocks per group
  uint32_t journal_slots;      // number of journal slots
  uint64_t journal_block;      // first block of the journal area (in group 0)
  uint32_t journal_slot_size;  // bytes per slot, multiple of 64
  uint32_t journal_blocks;     // blocks of the journal area
  uint64_t root_ino;           // kRootIno
  uint8_t uuid[16];
  char label[64];              // NUL-padded, not necessarily NUL-terminated
  uint64_t reserved0;          // must be zero (version 1's hash seed)
  int64_t mkfs_time;           // seconds since the epoch
  uint8_t dir_hash_key[16];    // secret SipHash-2-4 key of the directory name hash
  uint8_t reserved[1820];      // must be zero
  uint32_t checksum;           // CRC32C of bytes 0..2043
};

enum class FsState : uint32_t {
  kClean = 1,    // unmounted cleanly; counters in the group descriptors are exact
  kMounted = 2,  // in use, or the last user did not unmount
};

// The dynamic half: written by the running filesystem.
struct SuperDynamic {
  char magic[8];           // kSuperDynamicMagic
  uint32_t state;          // FsState
  uint32_t errors;         // nonzero: an error was detected; fsck should run
  uint64_t mount_count;    // mounts since mkfs
  int64_t mount_time;      // seconds, last mount
  int64_t write_time;      // seconds, last update of this half
  uint64_t free_blocks;    // exact when state == kClean
  uint64_t free_inodes;    // exact when state == kClean
  uint64_t orphan_head;    // first inode of the orphan list (unlinked, still open); 0 none
  uint64_t next_generation;  // reserved: inode generations are drawn at random
  int64_t check_time;      // seconds, last fsck
  uint8_t reserved[1964];  // must be zero
  uint32_t checksum;       // CRC32C of bytes 0..2043 of this half
};

// ---------------------------------------------------------------------------
// Groups. Group g covers blocks [g * blocks_per_group, (g+1) * blocks_per_group),
// the last group possibly fewer. In order, each group holds:
//   (group 0 only) the superblock block,
//   the free-block bitmap (1 block; bit i = block g*bpg+i is in use),
//   the group descriptor block (counters),
//   the free-inode bitmap (1 block; bit i = inode g*ipg+i is in use),
//   the inode table (itable_blocks blocks),
//   (group 0 only) the journal area,
//   data blocks.
// Bits past the end of the last group, inode 0 and the backup superblock block
// are marked in use.
// ---------------------------------------------------------------------------
inline constexpr uint32_t kGroupDescMagic = 0x44475653;  // "SVGD"

struct GroupDesc {
  uint32_t magic;         // kGroupDescMagic
  uint32_t group;         // this group's number
  uint32_t free_blocks;   // exact when the superblock state is kClean
  uint32_t free_inodes;   // exact when the superblock state is kClean
  uint32_t used_dirs;     // directories as mkfs made them; advisory
  uint32_t flags;         // must be zero
  uint8_t reserved[36];   // must be zero
  uint32_t checksum;      // CRC32C of bytes 0..59
};

// ---------------------------------------------------------------------------
// Inodes: kInodeSize bytes each, in the inode tables. Inode number n lives in
// group n / inodes_per_group at index n % inodes_per_group. An inode is live iff
// its bit in the free-inode bitmap is set; the contents of a free inode are
// undefined (mkfs does not clear inode tables).
// ---------------------------------------------------------------------------

// File mapping ("bmap"): kDirectPointers direct blocks, then indirect[d-1] is the
// root of a tree of depth d (d = 1..5) of pointer blocks, each holding
// block_size / 8 block numbers. 0 is a hole.
struct InodeFileMap {
  uint64_t direct[kDirectPointers];
  uint64_t indirect[kIndirectPointers];
};

// Directories: a radix tree over the name hash; see DirNodePtr below.
struct InodeDirMap {
  uint64_t root;          // DirNodePtr of the root node; 0 for an empty directory
  uint64_t entries;       // live entries, excluding "." and ".."
  uint64_t reserved[14];  // must be zero
};

struct Inode {
  uint16_t mode;          // S_IFMT type bits and permission bits
  uint16_t reserved0;     // must be zero
  uint32_t nlink;
  uint32_t uid;
  uint32_t gid;
  uint64_t size;          // bytes (directories: block_size * nodes)
  uint64_t blocks;        // blocks held by this inode: data, pointer, directory, xattr
  int64_t atime_sec;
  int64_t mtime_sec;
  int64_t ctime_sec;
  int64_t btime_sec;      // creation time
  uint32_t atime_nsec;
  uint32_t mtime_nsec;
  uint32_t ctime_nsec;
  uint32_t btime_nsec;
  uint32_t generation;    // with the inode number: a stable NFS file handle
  uint32_t flags;         // kInodeFlag*
  uint64_t parent;        // directories: the parent's inode number (root: itself)
  uint64_t rdev;          // character and block devices
  uint64_t xattr_block;   // first block of the extended attributes (a chain); 0 none
  uint64_t orphan_next;   // next inode on the orphan list; 0 at its end
  // Regular files: an append word (AppendEnd, below; doc/format.md), else 0.
  // Never logged by a transaction: changed only by compare-and-swap.
  uint64_t append_end;
  union {
    InodeFileMap file;    // regular files, and symlinks longer than kInlineSymlinkMax
    InodeDirMap dir;      // directories
    char symlink[kInlineSymlinkMax];  // symlinks up to kInlineSymlinkMax bytes (size)
  } map;
};

inline constexpr uint32_t kInodeFlagOrphan = 1u << 0;  // on the orphan list

// Inode::append_end: 0 (closed), or a tag (the high 16 bits, never 0) and
// an end (the low 48): the file's size is then max(size, end). Direct
// writers move the end by compare-and-swap after their bytes are durable
// (doc/integrity.md section 11, "Appends by word"); the daemon folds it into
// the size and closes it before any other change of the file.
inline constexpr unsigned kAppendTagShift = 48;
inline constexpr uint64_t kAppendEndMask = (uint64_t{1} << kAppendTagShift) - 1;
inline constexpr uint64_t AppendEnd(uint64_t word) { return word & kAppendEndMask; }
inline constexpr uint64_t AppendTag(uint64_t word) { return word >> kAppendTagShift; }
inline constexpr uint64_t AppendWord(uint64_t tag, uint64_t end) {
  return (tag << kAppendTagShift) | (end & kAppendEndMask);
}
// The attributes chattr(1) sets (FS_IOC_SETFLAGS), each the filesystem's
// rule, not the format's: fsck accepts them on any inode. Bits 1-15 are
// left for the format's own marks.
inline constexpr uint32_t kInodeFlagImmutable = 1u << 16;  // 'i': no change at all
inline constexpr uint32_t kInodeFlagAppend = 1u << 17;     // 'a': bytes only added at the end
inline constexpr uint32_t kInodeFlagNoDump = 1u << 18;     // 'd': dump(8) skips it
inline constexpr uint32_t kInodeFlagNoAtime = 1u << 19;    // 'A': no atime updates
inline constexpr uint32_t kInodeFlagSync = 1u << 20;       // 'S': synchronous updates
inline constexpr uint32_t kInodeAttrFlags = kInodeFlagImmutable | kInodeFlagAppend |
                                            kInodeFlagNoDump | kInodeFlagNoAtime |
                                            kInodeFlagSync;
inline constexpr uint32_t kInodeFlagsKnown = kInodeFlagOrphan | kInodeAttrFlags;

// ---------------------------------------------------------------------------
// Directories.
//
// Every name gets a 62-bit key: the top kDirHashBits (40) bits of
// NameHash(dir_hash_key, name), the name's "hash" below, shifted left by
// kDirSeqBits (22), plus a sequence number that tells apart the names of one
// directory whose hashes are equal (the lowest number unused by that hash at
// insertion). The key is also the readdir cookie (plus 3, past "." and ".."),
// so a cookie stays valid however the directory changes, and names one
// position even inside a run of equal hashes.
//
// The tree: a DirNodePtr names either an index node or a leaf. An index node is
// a whole block of block_size / 8 DirNodePtrs, selected by the next
// log2(block_size / 8) bits of the hash, most significant first; a null slot
// means no entry has that prefix. A leaf holds the entries whose hashes start
// with its prefix; leaves that cannot be split further (all kDirHashBits bits
// used) chain through `next`, as many as the names of that hash need.
//
// Index level k uses hash bits [k*F, min((k+1)*F, 40)), F = log2(block_size / 8).
// An index node fills one slot of its parent. A leaf in a level-k node has
// k*F <= prefix_bits <= min((k+1)*F, 40) and fills the 2^(level end - prefix_bits)
// aligned slots of its prefix; a leaf in dir.root has prefix_bits 0. Overflow
// leaves only at prefix_bits 40, with the head's prefix; a chain is no longer
// than the directory's node count.
// In a free record (ino 0) only rec_len means anything.
// ---------------------------------------------------------------------------
inline constexpr uint64_t kDirNodeIndexBit = uint64_t{1} << 63;
inline constexpr uint64_t kDirNodeBlockMask = kMaxBlockCount - 1;
inline constexpr uint32_t kDirHashBits = 40;
inline constexpr uint32_t kDirSeqBits = 22;
inline constexpr uint64_t kDirKeyMax = (uint64_t{1} << (kDirHashBits + kDirSeqBits)) - 1;

inline constexpr uint32_t kDirLeafMagic = 0x4C445653;  // "SVDL"

struct DirLeafHeader {
  uint32_t magic;         // kDirLeafMagic
  uint16_t prefix_bits;   // how many leading bits of the 40-bit hash this leaf covers
  uint16_t reserved0;     // must be zero
  uint64_t prefix;        // those bits, right-aligned
  uint64_t next;          // overflow leaf block, only at the deepest level; else 0
  uint64_t reserved1;     // must be zero
};

// Records fill the leaf after the header, back to back, each rec_len bytes
// (a multiple of 8). A record with ino == 0 is free space.
struct DirEntry {
  uint64_t ino;           // 0: free record
  uint64_t key;           // readdir cookie, <= kDirKeyMax
  uint32_t rec_len;       // bytes of this record, >= sizeof(DirEntry), multiple of 8
  uint8_t name_len;       // 1..kNameMax
  uint8_t file_type;      // DT_* value of the target
  uint16_t reserved;      // must be zero
  // char name[name_len] follows, not NUL-terminated
};

inline constexpr uint32_t DirRecordLength(uint32_t name_len) {
  return (static_cast<uint32_t>(sizeof(DirEntry)) + name_len + 7u) & ~7u;
}

// ---------------------------------------------------------------------------
// Extended attributes. With kIncompatXattrChain, xattr_block heads a chain
// of blocks (XattrBlockHeader, linked by `next`), each holding records back
// to back: live ones (a name and its value, inline or in runs of blocks of
// its own) and free ones (name_len 0), changed in place through the journal.
// Without it, xattr_block names one block (XattrHeader) of live inline
// records, replaced whole (copy on write) on every change.
// ---------------------------------------------------------------------------
inline constexpr uint32_t kXattrMagic = 0x41585653;       // "SVXA": the one block, no chain
inline constexpr uint32_t kXattrChainMagic = 0x43585653;  // "SVXC": a block of a chain

struct XattrHeader {
  uint32_t magic;         // kXattrMagic
  uint32_t count;         // entries
  uint32_t used;          // bytes of entries after the header
  uint32_t reserved;      // must be zero
};

struct XattrBlockHeader {
  uint32_t magic;         // kXattrChainMagic
  uint32_t count;         // records, live and free
  uint32_t used;          // bytes of records after the header
  uint32_t reserved0;     // must be zero
  uint64_t next;          // the chain's next block; 0 at its end
  uint64_t reserved1;     // must be zero
};

// A record. Live: name_len 1..255, then the name; the value follows the name
// directly (inline), or, with kXattrValueInRuns, after the name padded to 8
// bytes as `runs` XattrValueRun (block runs holding value_len bytes from the
// first block's start on). Free (chains only): name_len 0, flags and runs 0,
// value_len the bytes after this 8-byte header (a multiple of 8).
struct XattrEntry {
  uint8_t name_len;       // 1..kXattrNameMax, full name including its namespace prefix; 0 free
  uint8_t flags;          // kXattrValueInRuns; must be zero in an XattrHeader block
  uint16_t runs;          // value runs (kXattrValueInRuns), else zero
  uint32_t value_len;     // bytes, at most kXattrValueMax
  // char name[name_len], then the value; the entry is padded to 8 bytes
};

inline constexpr uint8_t kXattrValueInRuns = 1u << 0;

struct XattrValueRun {
  uint64_t first;         // first block
  uint64_t count;         // blocks, >= 1
};

inline constexpr uint32_t kXattrNameMax = 255;     // XATTR_NAME_MAX
inline constexpr uint32_t kXattrValueMax = 65536;  // XATTR_SIZE_MAX

inline constexpr uint64_t XattrEntryLength(uint64_t name_len, uint64_t value_len) {
  return (sizeof(XattrEntry) + name_len + value_len + 7) & ~uint64_t{7};
}
// A record whose value lies in `runs` runs: header, name padded, the runs.
inline constexpr uint64_t XattrRunEntryLength(uint64_t name_len, uint64_t runs) {
  return sizeof(XattrEntry) + ((name_len + 7) & ~uint64_t{7}) + runs * sizeof(XattrValueRun);
}
// Runs a value may take: at most one per block of the largest value.
inline constexpr uint32_t XattrMaxRuns(uint32_t block_size) {
  return (kXattrValueMax + block_size - 1) / block_size;
}
// The names of one inode, each with its NUL, fit in this (the kernel's
// XATTR_LIST_MAX): a set that would list more is refused (ENOSPC).
inline constexpr uint32_t kXattrListMax = 65536;

// The namespace an attribute's name begins with. A name on the media is one
// of the four prefixes followed by at least one byte; which names the
// filesystem serves to callers is a rule of the filesystem, not of the
// format (src/fs/xattr_policy.cpp: of system.* only the two POSIX ACL names).
enum class XattrNamespace : uint8_t { kNone, kUser, kTrusted, kSecurity, kSystem };

inline constexpr XattrNamespace XattrNamespaceOf(std::string_view name) {
  constexpr struct {
    std::string_view prefix;
    XattrNamespace ns;
  } kNamespaces[] = {
      {"user.", XattrNamespace::kUser},
      {"trusted.", XattrNamespace::kTrusted},
      {"security.", XattrNamespace::kSecurity},
      {"system.", XattrNamespace::kSystem},
  };
  for (const auto& [prefix, ns] : kNamespaces) {
    if (name.size() > prefix.size() && name.starts_with(prefix)) return ns;
  }
  return XattrNamespace::kNone;
}

// ---------------------------------------------------------------------------
// POSIX ACLs: the values of the attributes system.posix_acl_access and
// system.posix_acl_default, in the kernel's xattr ACL format
// (include/uapi/linux/posix_acl_xattr.h): a header, then 1..kAclEntriesMax
// entries, little-endian. The filesystem stores them as the kernel sends
// them and checks them where it stores and where it reads them
// (validate.hpp, DecodeAcl).
// ---------------------------------------------------------------------------
inline constexpr std::string_view kAclAccessName = "system.posix_acl_access";
inline constexpr std::string_view kAclDefaultName = "system.posix_acl_default";
inline constexpr uint32_t kAclXattrVersion = 2;  // POSIX_ACL_XATTR_VERSION

struct AclXattrHeader {
  uint32_t version;  // kAclXattrVersion
};

struct AclXattrEntry {
  uint16_t tag;   // AclTag
  uint16_t perm;  // kAclRead | kAclWrite | kAclExecute
  uint32_t id;    // uid (kAclUser) or gid (kAclGroup); kAclUndefinedId otherwise
};

enum AclTag : uint16_t {
  kAclUserObj = 0x01,   // the owner: the mode's user bits
  kAclUser = 0x02,      // a named user
  kAclGroupObj = 0x04,  // the owning group
  kAclGroup = 0x08,     // a named group
  kAclMask = 0x10,      // the most any named entry or the owning group grants: the mode's group bits
  kAclOther = 0x20,     // everyone else: the mode's other bits
};
inline constexpr uint16_t kAclRead = 4, kAclWrite = 2, kAclExecute = 1;
inline constexpr uint32_t kAclUndefinedId = 0xffffffff;
// The kernel moves an ACL through FUSE in one page (fs/fuse/acl.c: larger
// values are E2BIG), so no longer one is ever stored.
inline constexpr uint32_t kAclEntriesMax = (4096 - sizeof(AclXattrHeader)) / sizeof(AclXattrEntry);

// ---------------------------------------------------------------------------
// Journal: journal_slots slots of journal_slot_size bytes each, starting at
// journal_block. A slot is an undo log for one operation at a time.
// ---------------------------------------------------------------------------
inline constexpr char kJournalMagic[8] = {'n', 'v', 'f', 's', '-', 'j', 'n', 'l'};

enum class JournalState : uint32_t {
  kIdle = 0,       // nothing to do at recovery
  kActive = 1,     // operation in progress: recovery undoes its records
  kCommitted = 2,  // operation done: recovery applies its deferred frees
};

struct JournalSlotHeader {
  char magic[8];          // kJournalMagic
  uint32_t state;         // JournalState
  uint32_t slot;          // this slot's index
  uint64_t tx_seq;        // sequence number of the current or last operation
  uint8_t reserved[40];   // must be zero
};

enum class JournalRecordType : uint16_t {
  kUndo = 1,          // `length` bytes that stood at byte offset `target`
  kBitmapSet = 2,     // bits set by this operation: target = first, length = count
                      // (block bitmap); undone by clearing them
  kInodeSet = 3,      // the same for the inode bitmap
  kDeferredFree = 4,  // blocks to free once committed: target = first, length = count
  kInodeFree = 5,     // the same for inodes
};

// Records follow the slot header back to back; each is valid only if its
// tx_seq equals the header's and its checksum matches.
struct JournalRecord {
  uint64_t tx_seq;
  uint64_t target;
  uint32_t length;
  uint16_t type;          // JournalRecordType
  uint16_t reserved0;     // must be zero
  uint32_t checksum;      // CRC32C of this header (checksum = 0) and the payload
  uint32_t reserved1;     // must be zero
  // kUndo: `length` payload bytes, padded to 8
};

// ---------------------------------------------------------------------------
// Compile-time checks of the layout.
// ---------------------------------------------------------------------------
template <class T>
inline constexpr bool kIsMediaStruct =
    std::is_trivially_copyable_v<T> && std::is_standard_layout_v<T>;

static_assert(kIsMediaStruct<SuperStatic> && sizeof(SuperStatic) == kSuperHalfSize);
static_assert(kIsMediaStruct<SuperDynamic> && sizeof(SuperDynamic) == kSuperHalfSize);
static_assert(offsetof(SuperStatic, block_size) == 40);
static_assert(offsetof(SuperStatic, block_count) == 48);
static_assert(offsetof(SuperStatic, inode_count) == 72);
static_assert(offsetof(SuperStatic, journal_block) == 88);
static_assert(offsetof(SuperStatic, uuid) == 112);
static_assert(offsetof(SuperStatic, label) == 128);
static_assert(offsetof(SuperStatic, reserved0) == 192);
static_assert(offsetof(SuperStatic, mkfs_time) == 200);
static_assert(offsetof(SuperStatic, dir_hash_key) == 208);
static_assert(offsetof(SuperStatic, checksum) == 2044);
static_assert(offsetof(SuperDynamic, orphan_head) == 56);
static_assert(offsetof(SuperDynamic, checksum) == 2044);
static_assert(kIsMediaStruct<GroupDesc> && sizeof(GroupDesc) == 64);
static_assert(offsetof(GroupDesc, checksum) == 60);
static_assert(kIsMediaStruct<Inode> && sizeof(Inode) == kInodeSize);
static_assert(offsetof(Inode, size) == 16);
static_assert(offsetof(Inode, generation) == 80);
static_assert(offsetof(Inode, parent) == 88);
static_assert(offsetof(Inode, orphan_next) == 112);
static_assert(offsetof(Inode, map) == 128);
static_assert(sizeof(InodeFileMap) == 128 && sizeof(InodeDirMap) == 128);
static_assert(kIsMediaStruct<DirLeafHeader> && sizeof(DirLeafHeader) == 32);
static_assert(kIsMediaStruct<DirEntry> && sizeof(DirEntry) == 24);
static_assert(offsetof(DirEntry, rec_len) == 16);
static_assert(kIsMediaStruct<XattrHeader> && sizeof(XattrHeader) == 16);
static_assert(kIsMediaStruct<XattrEntry> && sizeof(XattrEntry) == 8);
static_assert(kIsMediaStruct<AclXattrHeader> && sizeof(AclXattrHeader) == 4);
static_assert(kIsMediaStruct<AclXattrEntry> && sizeof(AclXattrEntry) == 8);
static_assert(offsetof(AclXattrEntry, id) == 4);
static_assert(kIsMediaStruct<XattrBlockHeader> && sizeof(XattrBlockHeader) == 32);
static_assert(offsetof(XattrBlockHeader, next) == 16);
static_assert(kIsMediaStruct<XattrValueRun> && sizeof(XattrValueRun) == 16);
static_assert(kIsMediaStruct<JournalSlotHeader> && sizeof(JournalSlotHeader) == 64);
static_assert(kIsMediaStruct<JournalRecord> && sizeof(JournalRecord) == 32);
static_assert(DirRecordLength(kNameMax) == 280);
// Cookies are key + 3 and must stay positive in a 64-bit off_t.
static_assert(kDirHashBits + kDirSeqBits == 62);

}  // namespace nvfs::format
