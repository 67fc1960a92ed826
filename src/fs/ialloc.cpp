// Inode allocation: a new inode near its parent, written whole, with its
// generation number.
#include <sys/stat.h>

#include "fs/fs_impl.hpp"
#include "nvfs/fresh_inode.hpp"

namespace nvfs {

using format::Inode;

uint64_t FsImpl::NextGeneration() {
  // splitmix64 over an atomic counter: cheap, lock-free, never repeats within
  // 2^64 draws; random across mounts (as ext4's i_generation).
  uint64_t x = generation_state_.fetch_add(0x9E3779B97F4A7C15ull) + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Result<uint64_t> FsImpl::NewInode(Tx& tx, const Inode& parent_inode, uint64_t parent, uint32_t mode,
                                  uint64_t rdev, const Cred& cred, timespec now) {
  Result<uint64_t> ino = alloc_->AllocateInode(tx, parent, S_ISDIR(mode));
  if (!ino.ok()) return ino;
  Inode inode =
      FreshInode(mode, cred.uid, cred.gid, parent, now, static_cast<uint32_t>(NextGeneration()));
  // BSD group semantics under a set-group-ID directory.
  if (parent_inode.mode & S_ISGID) {
    inode.gid = parent_inode.gid;
    if (S_ISDIR(mode)) inode.mode = static_cast<uint16_t>(inode.mode | S_ISGID);
  }
  inode.rdev = (S_ISCHR(mode) || S_ISBLK(mode)) ? rdev : 0;
  tx.StoreFresh(geometry_->InodeOffset(*ino), &inode, sizeof inode);
  return ino;
}

}  // namespace nvfs
