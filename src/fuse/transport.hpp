// The connection to the kernel below libfuse. Through
// fuse_session_custom_io the daemon reads every request and writes every
// reply itself, for the parts of the protocol libfuse 3.14 does not speak;
// libfuse still decodes, dispatches and builds every message.
//
//   INIT   the one place where the daemon negotiates beyond libfuse. The
//          kernel's offer is read from the INIT request as it arrives
//          (FuseAdapter::protocol().kernel_flags: flags, and flags2 as bits
//          32-63 when the request carries FUSE_INIT_EXT), OpInit puts what
//          it wants beyond libfuse in protocol().extra_flags (same layout),
//          and libfuse's reply is amended as it leaves: every wanted bit the
//          kernel offered, bits 32-63 into flags2 with FUSE_INIT_EXT set in
//          flags (the kernel ignores flags2 without it). What the reply
//          carried is protocol().agreed_flags. Asked for today:
//            FUSE_HANDLE_KILLPRIV_V2 (bit 28, kernel 5.11+): the kernel
//              marks the requests whose caller lacks CAP_FSETID, and the
//              daemon drops the privileges;
//            FUSE_DIRECT_IO_ALLOW_MMAP (bit 36, kernel 6.6+): shared mmap
//              of cache=none (FOPEN_DIRECT_IO) files;
//            FUSE_SETXATTR_EXT (bit 29, kernel 5.15+): SETXATTR carries
//              setxattr_flags (FUSE_SETXATTR_ACL_KILL_SGID).
//          The bits libfuse 3.14's <linux/fuse.h> lacks are in
//          kernel_abi.hpp. A new bit is one line in OpInit (adapter.cpp).
//   each   the marks themselves, which libfuse 3.14 drops: WRITE's
//   request FUSE_WRITE_KILL_SUIDGID (the kernel sets it on every direct
//          write by a caller without CAP_FSETID, and with KILLPRIV_V2 on
//          cached ones too) and FUSE_WRITE_CACHE (a page written back
//          from the page cache: a shared mapping's, or cache=page's), and
//          OPEN's FUSE_OPEN_KILL_SUIDGID (O_TRUNC), and SETXATTR's
//          FUSE_SETXATTR_ACL_KILL_SGID (with FUSE_SETXATTR_EXT agreed, whose
//          longer request is cut back to the one libfuse 3.14 reads).
//          Read from the request as it arrives and kept for the thread that
//          serves it: libfuse's loops receive and process a request on one
//          thread. (SETATTR's FATTR_KILL_SUIDGID reaches the setattr
//          handler: libfuse passes it as FUSE_SET_ATTR_KILL_SUID, the same
//          bit.)
//   opcodes libfuse 3.14 does not know (it answers ENOSYS, and the
//          kernel stops sending them for the connection): each is handed
//          to libfuse as the older request whose arguments it begins with
//          and marked for the handler, which replies in the newer form:
//          FUSE_TMPFILE as CREATE, FUSE_STATX as GETATTR (below). The
//          kernel sends both whatever minor version INIT's reply names
//          (libfuse 3.14 answers 7.31): no reply libfuse builds changes.
#pragma once

#include <string>

#include "fuse/adapter.hpp"

namespace nvfs {

// The one libfuse the rewriting above was written for and tested with:
// 3.14 (Debian 12 ships 3.14.0). The daemon checks the library it runs
// with, not the headers it was built with (meson.build requires those
// too): libfuse 3.0 to 3.16 share the soname libfuse3.so.3, so a library
// upgrade reaches a built daemon without a rebuild, and what parses the
// messages is the library. What the others do differently:
//   3.12      no fuse_session_custom_io;
//   3.13      drops SETATTR's FATTR_KILL_SUIDGID (3.14 passes it on as
//             FUSE_SET_ATTR_KILL_SUID): a truncate by a caller without
//             CAP_FSETID would keep set-user-ID;
//   3.15-3.16 read SETXATTR's long form when FUSE_CAP_SETXATTR_EXT is
//             wanted through libfuse, and the cut-back above assumes
//             they never do; untested;
//   3.17+     soname libfuse3.so.4 (a daemon built against 3.14 does not
//             load it), 64-bit want_ext beside want, its own TMPFILE,
//             STATX (3.18) and FUSE over io_uring (3.18), which would meet
//             the rewriting and uring.cpp's rings.
// A new libfuse is taken in by reading its fuse_lowlevel.c for the
// messages above and running the mount suite over it, then widening this.
inline constexpr int kLibfuseWrittenFor = 314;  // FUSE_MAKE_VERSION(3, 14)

// Why the daemon cannot serve with the libfuse of `version` (fuse_version():
// major * 100 + minor; `package_version` is fuse_pkgversion()), in one
// line, or "" if it can.
std::string LibfuseUnsupported(int version, const char* package_version);

// Makes `se` (mounted, INIT not yet served) read and write through the
// transport. 0, or a negative errno. REQUIRES: the session's userdata is
// a FuseAdapter.
int InstallTransport(fuse_session* se);

// True if the request the calling thread is serving carries the kernel's
// mark that its caller may not keep set-user-ID, set-group-ID or file
// capabilities (FUSE_WRITE_KILL_SUIDGID, FUSE_OPEN_KILL_SUIDGID).
bool RequestKillsPrivs();

// True if the request the calling thread is serving is a FUSE_WRITE of the
// kernel's page cache (FUSE_WRITE_CACHE): a write-back of dirty pages,
// through whichever writable handle of the inode the kernel picked (maybe
// an O_APPEND one, or one other than the mapping's). Its offset is the
// pages' own, never the end of the file.
bool RequestWritesBack();

// True if the request the calling thread is serving is a FUSE_READ that
// fills the kernel's page cache (a mapping's fault, readahead): the kernel
// marks every read(2)-like read, the direct ones, with the caller's lock
// owner (FUSE_READ_LOCKOWNER), and no page fill.
bool RequestFillsPages();

// True if the request the calling thread is serving is a SETXATTR the
// kernel marked FUSE_SETXATTR_ACL_KILL_SGID: its caller is not in the
// file's group and lacks CAP_FSETID, so setting an access ACL clears
// set-group-ID (posix_acl_update_mode).
bool RequestKillsSgid();

// True if the request the calling thread is serving is the kernel's
// FUSE_TMPFILE (O_TMPFILE; kernel 6.1+), which libfuse 3.14 cannot
// dispatch (its table ends before opcode 51: ENOSYS, and the kernel would
// stop asking). Its arguments are CREATE's (fuse_create_in, then the name
// "/") and so is its reply (entry and open), so the transport hands it to
// libfuse as a FUSE_CREATE, and OpCreate, seeing this, makes an unnamed
// file (Filesystem::Tmpfile) instead.
bool RequestIsTmpfile();

// True if the request the calling thread is serving is the kernel's
// FUSE_STATX (kernel 6.6+; kernel_abi.hpp), which libfuse 3.14 answers
// ENOSYS, after which the kernel never asks again. Its argument begins
// with GETATTR's (getattr flags, handle), so the transport hands it to
// libfuse as a FUSE_GETATTR, and OpGetattr, seeing this, replies with a
// fuse_statx_out (fuse_reply_buf: libfuse builds only the header).
bool RequestIsStatx();

// What the transport notes of each request as it arrives (the marks above,
// INIT's offer), for a request of `n` bytes in `buf` that did not come
// through the session's read (a ring entry, uring.hpp). It changes two
// requests in place for libfuse: SETXATTR (above), and FUSE_TMPFILE's and
// FUSE_STATX's opcodes. Returns the request's length, which is less than `n` where it
// rewrote SETXATTR.
ssize_t ObserveRequest(void* buf, ssize_t n, void* userdata);

}  // namespace nvfs
