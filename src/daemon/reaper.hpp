// Releasing descriptors that another process chose, where a close cannot
// make a server thread wait.
//
// A close(2) can wait without bound on what the descriptor refers to: on a
// file of a FUSE mount, close sends FLUSH and, once the mount's server has
// read it, waits for the answer uninterruptibly; a socket with SO_LINGER
// and unsent data lingers at its last close; the last close of a FUSE file
// of a writeback-cache mount waits for its pages to be written back. A unix
// socket that still holds messages with descriptors releases them at its
// last close, in the closing thread, with the same effects. Whoever passes
// a server such a descriptor owns the wait, unless the server hands it to a
// Reaper: its own thread closes descriptors one at a time, so a close that
// never returns holds that thread and what is queued behind it, and no
// server thread.
//
// The thread is detached, never joined: nothing waits for it, not even a
// process that stops. (The kernel cannot end a thread stuck in an
// uninterruptible wait, so a process whose reaper is stuck in one lingers
// after its exit until the wait ends; doc/integrity.md section 10 says who
// can bring that about.)
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

namespace nvfs::daemon {

class Reaper {
 public:
  // The queue, without its thread: nullptr with one line in *why if there
  // is no memory for it.
  static std::unique_ptr<Reaper> Create(std::string* why);
  // Starts the thread. A process that forks (the daemon detaching) calls it
  // after the fork: a thread does not survive one, and a mutex it held at
  // that instant would stay locked in the child for good (a daemon hung in
  // this destructor at its exit that way). False with one line in *why.
  bool Run(std::string* why);
  // The thread ends once it has closed what is queued; it is not waited for.
  ~Reaper();
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  // Queues `fd` to be closed on the reaper's thread, counted against
  // `owner` (the uid that passed it) until it is closed. Never waits on a
  // close; never fails: if the queue cannot grow (no memory), `fd` stays
  // open for good rather than be closed here.
  void Release(int fd, uid_t owner) noexcept;

  // Descriptors of `owner` queued or being closed. A server stops taking
  // descriptors from an owner with too many pending: that owner's closes
  // are stuck, and only that owner waits for them.
  unsigned Pending(uid_t owner) const noexcept;

  struct Shared;

 private:
  explicit Reaper(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
  bool running_ = false;
};

}  // namespace nvfs::daemon
