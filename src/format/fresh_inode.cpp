// FreshInode (include/nvfs/fresh_inode.hpp): the bytes of a new inode.
#include "nvfs/fresh_inode.hpp"

#include <sys/stat.h>

namespace nvfs {

format::Inode FreshInode(uint32_t mode, uint32_t uid, uint32_t gid, uint64_t parent,
                         timespec now, uint32_t generation) {
  format::Inode inode{};
  inode.mode = static_cast<uint16_t>(mode);
  inode.nlink = S_ISDIR(mode) ? 2 : 1;
  inode.uid = uid;
  inode.gid = gid;
  inode.atime_sec = inode.mtime_sec = inode.ctime_sec = inode.btime_sec = now.tv_sec;
  inode.atime_nsec = inode.mtime_nsec = inode.ctime_nsec = inode.btime_nsec =
      static_cast<uint32_t>(now.tv_nsec);
  inode.generation = generation;
  inode.parent = S_ISDIR(mode) ? parent : 0;
  return inode;
}

}  // namespace nvfs
