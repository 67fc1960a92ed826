// The inode a maker first writes: the core's create, mkdir, symlink and
// mknod (src/fs), mkfs's root and lost+found, fsck's new root and
// lost+found. What a fresh inode holds is said here once.
#pragma once

#include <cstdint>
#include <ctime>

#include "nvfs/format.hpp"

namespace nvfs {

// A fresh inode of type and permissions `mode` (S_IFMT bits and up to
// 07777), owned by uid:gid, its four times `now`, of `generation`. A
// directory has two links (its entry and its own) and `parent`; anything
// else one link and no parent (0). The rest is zero: size, blocks, flags, no
// extended attributes, no device number, not on the orphan list, an empty
// map. A maker that writes more (a device's rdev, a set-group-ID
// directory's group, mkfs's first leaf) sets it on the result.
format::Inode FreshInode(uint32_t mode, uint32_t uid, uint32_t gid, uint64_t parent,
                         timespec now, uint32_t generation);

}  // namespace nvfs
