// Media errors under a direct read: a SIGBUS while the library copies out of
// one of its namespace mappings (a poisoned page of persistent memory, or a
// namespace file truncated under the mapping) fails that read with EIO and
// the process lives, without a sigsetjmp on the path of every read.
//
// The library's SIGBUS handler, seeing the fault address inside one of the
// mappings registered here while the faulting thread is in a library copy
// (tls.in_copy), records the page as poisoned and then maps a page of zeros
// over it (MAP_FIXED, private, anonymous, writable, so that a direct
// write's store into it lands there harmlessly; where the mapping
// cannot be split there, as on a device-dax namespace, the 2 MiB around
// it), and returns: the copy runs again on the zeros and completes. Every
// read checks its mapping's poison counter after its copy (one load) and
// fails with EIO if any page it copied from is recorded. Recording comes
// before the replacement, so a thread that copies the zeros of a page
// another thread's fault replaced also finds the record.
//
// Every other SIGBUS is the program's: the handler chains to the action
// that was installed before the library's, and the library's sigaction()
// and signal() (interposed: the library defines them) record an action the
// program installs for SIGBUS afterwards as the one to chain to, and report
// it back as the current action, instead of replacing the library's. A
// default action is carried out by restoring SIG_DFL and raising the
// signal again. Actions installed by raw system calls, or by code that
// resolves sigaction past the library (a library dlopen'ed RTLD_LOCAL that
// sits before it in no search order), are not seen.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace nvfs::direct {

// One registered namespace mapping, as the read path sees it.
struct FaultMapping {
  std::atomic<uintptr_t> base{0};      // 0: the entry is free
  std::atomic<uint64_t> size{0};
  std::atomic<uint64_t> poisoned{0};   // pages recorded poisoned in this mapping
  std::atomic<bool> overflow{false};   // a poisoned page could not be recorded
};

// Registers `size` bytes at `base` and installs the handler (once). Null
// when every entry is taken (the session then serves no reads).
FaultMapping* FaultRegisterMapping(const std::byte* base, uint64_t size);
// Before the mapping is unmapped; no read may use it any more.
void FaultUnregisterMapping(FaultMapping* m);

// Whether [offset, offset + len) of the mapping touches a recorded page.
// Called only when m->poisoned is nonzero.
bool FaultTouchesPoison(const FaultMapping* m, uint64_t offset, uint64_t len);

// pthread_atfork (client.cpp): the lock behind registration and sigaction.
void FaultPrepareFork();
void FaultAfterFork();

}  // namespace nvfs::direct
