// The FUSE kernel protocol beyond what the system's <linux/fuse.h> names.
// Debian 12 ships protocol 7.38; the kernels nvfs runs on speak more. The
// values are the kernel's (include/uapi/linux/fuse.h, "bits 32..63 get
// shifted down 32 bits into the flags2 field"); checked against the
// kernel's header of protocol 7.41+ (FUSE_ALLOW_IDMAP 40 before
// FUSE_OVER_IO_URING 41). Each is defined only where the system header
// lacks it, so a newer header takes over without a clash.
//
// INIT flags are 64-bit here as in the kernel: bits 0-31 travel in
// fuse_init_in/out.flags, bits 32-63 in flags2, which the kernel reads
// only when the reply's flags carry FUSE_INIT_EXT (fs/fuse/inode.c,
// process_init_reply). transport.cpp splits and joins them; OpInit
// (adapter.cpp) decides which to ask for (FuseAdapter::Protocol).
#pragma once

#include <linux/fuse.h>

#include <cstddef>
#include <cstdint>

// Kernel 6.6+: a shared mmap of a FOPEN_DIRECT_IO file is allowed (the
// kernel keeps its pages coherent with direct I/O: fs/fuse/file.c,
// fuse_file_mmap and fuse_direct_io).
#ifndef FUSE_DIRECT_IO_ALLOW_MMAP
#define FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36)
#endif

// Kernel 6.14+: requests may be served over io_uring (fs/fuse/dev_uring.c).
#ifndef FUSE_OVER_IO_URING
#define FUSE_OVER_IO_URING (1ULL << 41)
#endif

static_assert(FUSE_INIT_EXT == (1 << 30), "flags2 is read only with FUSE_INIT_EXT");

// Kernel 6.6+ (protocol 7.39): FUSE_STATX, sent by statx(2) for more than
// the basic stats (STATX_BTIME) while the kernel holds none valid
// (fs/fuse/dir.c, fuse_update_get_attr -> fuse_do_statx); the first ENOSYS
// stops it for the connection (fc->no_statx). libfuse 3.14 has neither the
// opcode nor the structures, so they are here under names of their own
// (the kernel's layout, include/uapi/linux/fuse.h) and the transport serves
// the request (transport.hpp).
namespace nvfs::kernel_abi {

inline constexpr uint32_t kOpStatx = 52;

struct SxTime {
  int64_t tv_sec;
  uint32_t tv_nsec;
  int32_t reserved;
};

// struct fuse_statx: struct statx's fields, in its order but for mode.
struct Statx {
  uint32_t mask;  // STATX_* that are filled
  uint32_t blksize;
  uint64_t attributes;  // STATX_ATTR_*
  uint32_t nlink;
  uint32_t uid;
  uint32_t gid;
  uint16_t mode;
  uint16_t spare0;
  uint64_t ino;
  uint64_t size;
  uint64_t blocks;
  uint64_t attributes_mask;  // the STATX_ATTR_* the filesystem knows
  SxTime atime, btime, ctime, mtime;
  uint32_t rdev_major, rdev_minor;
  uint32_t dev_major, dev_minor;
  uint64_t spare2[14];
};
static_assert(sizeof(Statx) == 256);
static_assert(offsetof(Statx, attributes_mask) == 56 && offsetof(Statx, btime) == 80);

// struct fuse_statx_in: fuse_getattr_in's 16 bytes, then the statx(2)
// flags and mask.
struct StatxIn {
  uint32_t getattr_flags;  // FUSE_GETATTR_FH: fh names an open handle
  uint32_t reserved;
  uint64_t fh;
  uint32_t sx_flags;  // AT_STATX_*
  uint32_t sx_mask;   // STATX_* asked for
};
static_assert(sizeof(StatxIn) == 24 && sizeof(fuse_getattr_in) == 16);
static_assert(offsetof(StatxIn, fh) == offsetof(fuse_getattr_in, fh));

// struct fuse_statx_out. The kernel takes exactly this size.
struct StatxOut {
  uint64_t attr_valid;  // seconds the attributes stay valid
  uint32_t attr_valid_nsec;
  uint32_t flags;  // FUSE_ATTR_* (none here)
  uint64_t spare[2];
  Statx stat;
};
static_assert(sizeof(StatxOut) == 288);

}  // namespace nvfs::kernel_abi
