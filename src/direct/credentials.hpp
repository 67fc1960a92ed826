// Credentials are part of the proof (doc/integrity.md section 10): a
// session's mappings (the namespace, the slot table) were given to the
// process as it was when it proved that it may read the namespace. When it
// changes what it may open (setuid and the rest of the set*id family,
// setgroups, initgroups, setfsuid, setfsgid, capset, a new user namespace
// through unshare or setns), the library takes every such mapping out of
// the process before the change takes effect, and the process proves
// itself again, as what it now is, when it next needs a session.
//
// Taking a mapping out means mapping zeros over it (MAP_FIXED, private,
// anonymous, read-only): one system call, atomic for every other thread,
// and the address range stays the session's. A read another thread is
// copying from the mapping at that instant copies zeros from then on and
// fails its check after the copy (the namespace's identity, read again
// from the mapping, is gone), so it is thrown away; no reader ever faults,
// none is waited for. The range itself is unmapped only when the session
// is freed, which the library's epoch (epoch.hpp) orders after every read
// that could still use it. A session whose mappings were taken asks the
// daemon for a new proof on a new connection before it serves again; if
// the proof holds (the same namespace, opened by the process as it is now)
// the namespace and the table are mapped again at the same addresses, so
// what the handles know of their files stays valid; if not, the session
// ends and its files are read through the kernel.
//
// Everything here is async-signal-safe (atomics, mmap): setuid may be
// called from a signal handler, and libpsx calls it from one in every
// thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace nvfs::direct {

// A range of the process's address space holding what a proof gave.
struct Revocable {
  std::atomic<bool> claimed{false};
  std::atomic<uintptr_t> base{0};  // 0: not registered (or being released)
  std::atomic<uint64_t> size{0};
  // Zeros stand in for the range since a change of credentials (or since
  // its session ended); cleared when a new proof maps it again.
  std::atomic<bool> revoked{false};
  // Moved before every time zeros are mapped over it: a reader that finds
  // the range's bytes gone and the mark cleared (a new proof mapped it
  // again after its copy) tells the zeros from a remount by this.
  std::atomic<uint64_t> revocations{0};
  // The file the range maps (st_dev, st_ino; 0: none known): a change of
  // credentials also takes every other mapping of that file out of the
  // process (a direct map is the namespace's pages, and mremap can grow it
  // over any of them).
  std::atomic<uint64_t> file_dev{0};
  std::atomic<uint64_t> file_ino{0};
};

// Registers `size` bytes at `base`, a mapping of `fd` (or of no file, -1):
// from now on a change of credentials maps zeros over them, and takes
// every mapping of that file out of the process. Null when every entry is
// taken.
Revocable* RevocableRegister(const void* base, uint64_t size, int fd);
// Gives the range back to its owner, which may then unmap it: no change
// of credentials touches it once this returns.
void RevocableUnregister(Revocable* r);
// Maps zeros over the range and marks it revoked (a session that ends).
// Aborts the process if the kernel refuses: a range it cannot replace is
// a namespace it cannot take out.
void RevocableZero(Revocable* r);

// Moved (twice) by every change of credentials: once before the mappings
// are taken, once after the change.
uint64_t CredentialsGeneration();
// A change is under way (between the two moves).
bool CredentialsChanging();
// No change began since `generation` was read, and none is under way. A
// session that made or registered a mapping from a proof begun at
// `generation` calls this after registering it: if false, a change may
// have missed the new mapping, and the session takes it out itself.
bool CredentialsUnchangedSince(uint64_t generation);

// Around a change of credentials (the interposed calls, credentials.cpp):
// the constructor takes out of the process everything a proof gave it —
// the direct maps (handed to the kernel when `tidy`), every registered
// mapping (zeros), every other mapping of a registered file (copied into
// anonymous memory), and the proof's descriptors (proof_fds.hpp);
// the destructor, after the change, forgets what the preload's descriptor
// table had found the process could not read directly (fd_table.hpp), so
// that each descriptor is looked at again as what the process now is.
// `tidy`: the direct maps become the kernel's maps of the same files, and
// the sessions' connections are closed now, which takes the library's
// locks; false where the calling thread may hold them (a signal handler
// that interrupted the library on this thread), where the direct maps are
// copied into anonymous memory instead (a shared map's later stores then
// reach no file) and their mapper ends. errno is kept.
class CredentialChange {
 public:
  explicit CredentialChange(bool tidy);
  ~CredentialChange();
  CredentialChange(const CredentialChange&) = delete;
  CredentialChange& operator=(const CredentialChange&) = delete;

 private:
  const bool tidy_;
};

// In a child of fork(): the mappings are taken out before the child runs
// any of its own code, and the child proves itself on its own (its
// sessions reconnect, session.cpp). No lock is needed: only the calling
// thread lives on.
void CredentialsChildAfterFork();

// Waits until no other thread of this process is inside a direct write's
// store that began before the namespace's ranges were marked revoked
// (write.cpp). Lock-free, async-signal-safe; returns at once if the
// process never wrote directly.
void WritersWaitOutOthers();
// In a child of fork: the parent's pages are not looked at (its threads are
// not the child's).
void WritersChildAfterFork();

}  // namespace nvfs::direct
