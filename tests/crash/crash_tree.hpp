// What a crash test compares: the whole visible tree of a mounted filesystem,
// read through the core API only (so it sees what a user would), and the
// helpers that walk or empty it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "nvfs/fs.hpp"
#include "nvfs/result.hpp"

namespace nvfs::test {

// One reachable inode, as seen at one path. Times are left out: they are the
// one thing an operation may change that a crash state need not reproduce.
struct TreeNode {
  uint64_t ino = 0;
  uint32_t mode = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t nlink = 0;
  uint64_t size = 0;
  uint64_t blocks = 0;   // 512-byte units
  uint64_t rdev = 0;
  uint64_t parent = 0;   // directories: what ".." names
  std::string content;   // regular files: every byte; symlinks: the target
  std::map<std::string, std::string> xattrs;
  uint32_t attr_flags = 0;  // regular files and directories: chattr's (FS_*_FL)
  bool operator==(const TreeNode&) const = default;
};

// Path ("/", "/d1", "/d1/f1", ...) to node.
using Tree = std::map<std::string, TreeNode>;

// Walks every directory from the root. Fails (with the path) on any error the
// core reports, on a "." or ".." that names the wrong inode, or on a directory
// reached twice (a cycle or a second link to a directory).
Result<Tree> SnapshotTree(Filesystem& fs);

// Link counts the tree itself implies: a directory has 2 + its
// subdirectories, any other inode as many links as names. "" when they hold.
std::string CheckLinkCounts(const Tree& tree);

// The first difference between two trees, "" when they are equal.
std::string TreeDiff(const Tree& expected, const Tree& actual);

// What a crash may leave of an operation that is durable but not atomic.
struct MixedRange {
  enum Kind {
    // Bytes [offset, offset + len) of the file may each hold their old or
    // their new value (an overwrite).
    kBytes,
    // The file may hold any number of blocks between its old and its new
    // count, the rest as before (a fallocate in several transactions).
    kAllocation,
    // The file's privileges (mode, xattrs) go first, in a transaction of
    // their own; then bytes [offset, offset + len) are overwritten as with
    // kBytes. A state may hold the new privileges with the old bytes, but
    // never a new byte under the old privileges.
    kPrivilegesFirst,
    // The file keeps blocks past its size that a mount after a crash may
    // have freed (it is on the orphan list: an open append word's): its
    // block count may be anything down to the data blocks its size needs,
    // the file having no hole (`block_size` is the filesystem's); its size
    // and bytes, and everything else, are the tree before or after.
    kReserveFreed,
  };
  Kind kind = kBytes;
  std::string path;
  uint64_t offset = 0;
  uint64_t len = 0;
  uint32_t block_size = 0;  // kReserveFreed
};

// True if `actual` is `before`, `after`, or in between as `mixed` allows.
bool TreeMatches(const Tree& actual, const Tree& before, const Tree& after,
                 const MixedRange* mixed);

// The inode at `path`, resolved with Lookup (its reference is forgotten).
Result<uint64_t> ResolvePath(Filesystem& fs, std::string_view path);

// Extends every regular file of `tree` by `extra` bytes (truncate up) and
// checks the new bytes read as zero: whatever a crash left past the end of a
// file (in its last block, or in blocks fallocate kept past the end) must
// never become visible. Changes the files' sizes.
Status CheckExtensionsRead0(Filesystem& fs, const Tree& tree, uint64_t extra);

// Removes every name but lost+found (whose contents go too).
Status DeleteAll(Filesystem& fs);

}  // namespace nvfs::test
