// The client's side of the socket (protocol.hpp): connect, and one request
// answered by one reply, descriptors passed with SCM_RIGHTS. Every call
// returns 0 or an errno; a failed call leaves the connection unusable (the
// caller closes it): replies are answered in order, and one half read
// would put the next reply out of step.
#pragma once

#include <sys/types.h>

#include <cstddef>

#include "direct/protocol.hpp"

namespace nvfs::direct {

// Seconds a request may wait for its reply before the connection is given
// up (the read then goes to the kernel).
inline constexpr int kReplyTimeoutSeconds = 5;

// Connects to the socket at `path`, close-on-exec, and checks that the
// process at the other end runs as `peer_uid` or as root.
int TransportConnect(const char* path, uid_t peer_uid, int* sock_out);

// Reads exactly `len` bytes however long they take to come (a listener's
// read: the receive timeout only delays); descriptors that come along are
// closed. 0 or an errno (ECONNRESET at the end of the connection).
int TransportRecvAll(int sock, void* data, size_t len);

// Sends `req` (with `send_fd` unless it is -1) and reads one reply of at
// most `reply_max` bytes into `reply` (the rest of it zeroed), which must
// begin with a ReplyHeader for the same op; `min_ok` bytes at least when
// the reply carries no error. A descriptor that came with it is stored in
// `*recv_fd` (close-on-exec) when recv_fd is not null, closed otherwise; -1
// when none came.
int TransportCall(int sock, const Request& req, int send_fd, void* reply, size_t reply_max,
                  size_t min_ok, int* recv_fd);

}  // namespace nvfs::direct
