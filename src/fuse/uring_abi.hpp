// The FUSE-over-io_uring protocol (kernel 6.14+), as the kernel's uapi
// defines it in include/uapi/linux/fuse.h (protocol 7.42: "Add
// FUSE_OVER_IO_URING and all other io-uring related flags and data
// structures") and serves it in fs/fuse/dev_uring.c. Debian 12's
// linux/fuse.h (7.38) has none of it, so the names the daemon needs are
// spelled here, with the kernel's layout; the static_asserts pin the sizes
// the kernel checks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nvfs::uring_abi {

// The INIT bit itself, FUSE_OVER_IO_URING (flags2 bit 9), is in
// kernel_abi.hpp with the other bits libfuse 3.14 has no name for; the
// kernel offers it only while /sys/module/fuse/parameters/enable_uring is Y.

inline constexpr size_t kInOutHeaderSize = 128;  // FUSE_URING_IN_OUT_HEADER_SZ
inline constexpr size_t kOpInOutSize = 128;      // FUSE_URING_OP_IN_OUT_SZ

// struct fuse_uring_ent_in_out
struct EntInOut {
  uint64_t flags;
  uint64_t commit_id;   // the request's unique, to name it in the commit
  uint32_t payload_sz;  // bytes used in the payload buffer, each way
  uint32_t padding;
  uint64_t reserved;
};

// struct fuse_uring_req_header: iov[0] of FUSE_IO_URING_CMD_REGISTER.
struct ReqHeader {
  unsigned char in_out[kInOutHeaderSize];  // fuse_in_header / fuse_out_header
  unsigned char op_in[kOpInOutSize];       // the request's first argument
  EntInOut ring_ent_in_out;
};

// enum fuse_uring_cmd: sqe->cmd_op of IORING_OP_URING_CMD on /dev/fuse.
inline constexpr uint32_t kCmdRegister = 1;        // FUSE_IO_URING_CMD_REGISTER
inline constexpr uint32_t kCmdCommitAndFetch = 2;  // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

// struct fuse_uring_cmd_req: in the SQE's command area (IORING_SETUP_SQE128
// gives it 80 bytes).
struct CmdReq {
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};

static_assert(sizeof(EntInOut) == 32);
static_assert(sizeof(ReqHeader) == 288);
static_assert(sizeof(CmdReq) == 24 && sizeof(CmdReq) <= 80);

}  // namespace nvfs::uring_abi
