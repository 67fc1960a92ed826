// The daemon's control socket (doc/integrity.md section 12, "Mounted"): how
// nvfs-resize asks a running daemon to grow the filesystem it serves.
//
// The daemon (root only, as the direct socket) listens on
// /run/nvfs/control-MAJOR:MINOR (the mount's device number), mode 0600: only
// root connects. nvfs-resize learns that number from the namespace itself
// (FindServingMount, include/nvfs/media.hpp: the daemon's mark on it names
// its mount), never from a mount's source, which fsname= lets any user who
// may mount FUSE set to the namespace's path. A request carries a
// descriptor of the namespace opened for reading and writing (SCM_RIGHTS):
// the daemon checks it is the very file or device it serves and that it is
// open O_RDWR. Whoever holds that descriptor can already rewrite every byte
// of the filesystem; a grow gives them less. One request, one reply, then
// the connection closes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "nvfs/result.hpp"

namespace nvfs::control {

inline constexpr uint32_t kMagic = 0x4C43564E;  // "NVCL"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kOpGrow = 1;

struct Request {
  uint32_t magic;    // kMagic
  uint32_t version;  // kVersion
  uint32_t op;       // kOpGrow
  uint32_t reserved;
  uint64_t size;     // the namespace's new size in bytes
};

struct Reply {
  uint32_t magic;
  int32_t error;  // 0 or an errno; `message` says why in one line
  uint64_t old_blocks;
  uint64_t new_blocks;
  uint64_t added_free_blocks;
  uint64_t added_free_inodes;
  uint32_t block_size;
  uint32_t reserved;
  char message[256];
};

// Asks the daemon of the mount `mount_dev` to grow to `size` bytes, passing
// `namespace_fd` (opened O_RDWR) as proof. The reply, or an error with one
// line (no daemon socket, refused, no reply).
Result<Reply> AskGrow(dev_t mount_dev, int namespace_fd, uint64_t size);

}  // namespace nvfs::control
