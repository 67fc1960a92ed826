// The connection to the kernel below libfuse. Through
// fuse_session_custom_io the daemon reads every request and writes every
// reply itself, for the parts of the protocol libfuse 3.14 does not speak;
// libfuse still decodes, dispatches and builds every message.
//
//   INIT   the one place where the daemon negotiates beyond libfuse. The
//          kernel's offer is read from the INIT request as it arrives
//          (FuseAdapter::protocol().kernel_flags, seen by OpInit), and
//          libfuse's reply is amended as it leaves with what OpInit agreed
//          to that libfuse cannot ask for: FUSE_HANDLE_KILLPRIV_V2 (kernel
//          5.11+: the kernel marks the requests whose caller lacks
//          CAP_FSETID, and the daemon drops the privileges).
//   each   the marks themselves, which libfuse 3.14 drops: WRITE's
//   request FUSE_WRITE_KILL_SUIDGID (the kernel sets it on every direct
//          write by a caller without CAP_FSETID, and with KILLPRIV_V2 on
//          cached ones too) and OPEN's FUSE_OPEN_KILL_SUIDGID (O_TRUNC).
//          Read from the request as it arrives and kept for the thread that
//          serves it: libfuse's loops receive and process a request on one
//          thread. (SETATTR's FATTR_KILL_SUIDGID reaches the setattr
//          handler: libfuse passes it as FUSE_SET_ATTR_KILL_SUID, the same
//          bit.)
#pragma once

#include "fuse/adapter.hpp"

namespace nvfs {

// Makes `se` (mounted, INIT not yet served) read and write through the
// transport. 0, or a negative errno. REQUIRES: the session's userdata is
// a FuseAdapter.
int InstallTransport(fuse_session* se);

// True if the request the calling thread is serving carries the kernel's
// mark that its caller may not keep set-user-ID, set-group-ID or file
// capabilities (FUSE_WRITE_KILL_SUIDGID, FUSE_OPEN_KILL_SUIDGID).
bool RequestKillsPrivs();

// What the transport notes of each request as it arrives (the marks above,
// INIT's offer), for a request of `n` bytes in `buf` that did not come
// through the session's read (a ring entry, uring.hpp). Returns `n`.
ssize_t ObserveRequest(const void* buf, ssize_t n, void* userdata);

}  // namespace nvfs
