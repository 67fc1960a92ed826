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
