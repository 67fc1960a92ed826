// FUSE over io_uring (kernel 6.14+, -o io_uring=auto|on|off): the kernel
// hands each request to a ring entry of the queue of the CPU its caller runs
// on, and the daemon's thread for that CPU (pinned to it while requests
// come one at a time: Queue::Spread) serves it and commits the reply into
// the same entry (FUSE_IO_URING_CMD_COMMIT_AND_FETCH), which in
// the same system call waits for the next request: no cross-CPU wake-up and
// one system call per request, where /dev/fuse costs a read and a writev on
// whichever worker thread the scheduler wakes.
//
// The protocol (fs/fuse/dev_uring.c, Documentation/filesystems/
// fuse-io-uring.rst; the structs in uring_abi.hpp):
//   - INIT still comes over /dev/fuse; the daemon adds FUSE_OVER_IO_URING
//     to libfuse's reply (OpInit, through FuseAdapter::Protocol) when the
//     kernel offers it. From then on the kernel holds every new request back
//     until each of its queues (one per possible CPU) has an entry
//     registered, so a daemon that agrees must register all of them, or
//     make the kernel give up (Start: a REGISTER it refuses turns io_uring
//     off for the connection, and requests flow over /dev/fuse again);
//   - each entry is a header buffer (fuse_uring_req_header: the in/out
//     header, the request's first argument, the payload size and commit id)
//     and a payload buffer at least as large as the largest request, both
//     registered with FUSE_IO_URING_CMD_REGISTER after INIT's reply;
//   - a completion of an entry's command carries one request; its reply
//     goes into the same buffers and the next COMMIT_AND_FETCH hands it to
//     the kernel and waits for the next;
//   - FORGET, INTERRUPT and NOTIFY replies keep coming over /dev/fuse, and
//     notifications leave by it: the /dev/fuse loop keeps running.
// Requests are dispatched through libfuse (fuse_session_process_buf) like
// those read from /dev/fuse: the entry's header, first argument and payload
// are laid out contiguously (the payload buffer has room in front for the
// two), and libfuse's reply, which leaves through the transport's writev
// (transport.cpp), is copied into the entry instead (TakeRingReply): the
// thread knows which entry it serves.
//
// Data copies. The kernel of this machine (6.18) copies every request and
// reply between the caller's pages and the entry's registered user buffers
// (dev_uring.c: import_ubuf of the payload, fuse_copy_args); there is no
// zero-copy (registered/fixed buffer) path for FUSE rings, and FUSE
// passthrough needs a backing file per open file, which nvfs's files (extents
// inside one namespace image) do not have. So the `map` read path's runs are
// copied once into the payload buffer, where over /dev/fuse the kernel
// copies them straight from the mapping.
#pragma once

#include <sys/uio.h>
#include <sys/types.h>

#include <memory>
#include <string>

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

namespace nvfs {

enum class UringMode {
  kAuto,  // io_uring when the kernel offers it, else /dev/fuse (default)
  kOn,    // io_uring or no mount
  kOff,   // /dev/fuse
};

// Why FUSE over io_uring cannot serve a mount from this process, or "" if
// it can: the kernel's switch (/sys/module/fuse/parameters/enable_uring)
// and an io_uring of the kind the protocol needs (IORING_SETUP_SQE128).
// Whether the kernel offers it is known only from INIT.
std::string UringUnavailable();

// The rings of one session, one queue per possible CPU.
class UringTransport {
 public:
  // Entries per queue. A queue's thread serves its entries one after
  // another, so more entries do not add parallelism; they let requests from
  // one CPU that are in flight together (asynchronous direct I/O, the
  // kernel's background requests) be handed over in one wake-up instead of
  // waiting in the kernel's queue for a commit. Each costs a payload buffer
  // of the largest request (1 MiB).
  static constexpr unsigned kQueueDepth = 4;

  // `se`: mounted, INIT served with FUSE_OVER_IO_URING agreed; `userdata`:
  // the session's.
  UringTransport(fuse_session* se, void* userdata);
  ~UringTransport();  // Stop()
  UringTransport(const UringTransport&) = delete;
  UringTransport& operator=(const UringTransport&) = delete;

  // Starts a thread per queue and registers every entry. 0, or a
  // negative errno: then no thread runs and the kernel was told to give up
  // io_uring for this connection (requests go over /dev/fuse).
  int Start();
  // Ends the threads (each finishes the request it serves) and closes the
  // rings; the kernel cancels the entries still waiting. Idempotent.
  void Stop();

  unsigned queues() const;

  struct Queue;

 private:
  fuse_session* se_;
  std::unique_ptr<Queue[]> queues_;
  unsigned nr_queues_ = 0;
  bool started_ = false;
};

// Called by the transport's writev for every message libfuse sends: if the
// calling thread serves a ring entry and this is the reply to its request,
// copies the reply (header and payload) into the entry, sets `*written` to
// its length and returns true; otherwise false (the message goes to
// /dev/fuse).
bool TakeRingReply(const iovec* iov, int count, ssize_t* written);

}  // namespace nvfs
