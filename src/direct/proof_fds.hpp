// The descriptors a proof gave the library: the sessions' and mappers'
// connections to their daemons (proven as the process was) and the
// namespace opened for private maps. Each is access the process had as it
// was when it proved, so a change of credentials takes every one out of the
// process before the change takes effect (credentials.hpp), on every path:
// the interposed libc calls, a raw syscall(), a signal handler (libpsx).
//
// Taking a descriptor out needs no lock: a socket is shut down (its daemon
// sees the proof end; a thread waiting on it wakes with an error), then the
// number is pointed at /dev/null (dup3: atomic for every other thread; the
// number stays its owner's, which closes it as before, so no close of a
// number the program reused can happen). In a child of fork the socket is
// the parent's too, and is only pointed at /dev/null.
//
// A program may free one of these numbers behind the library's back
// (closefrom, a dup2 onto it): the close calls tell the registry
// (ProofFdsNoteClosed), and an entry whose number was freed is never
// touched again. Everything here is async-signal-safe.
#pragma once

namespace nvfs::direct {

// Registers `fd`, open now. Its slot, or -1 when every slot is taken (the
// caller must then not use `fd` for a proof) or no stand-in for a
// descriptor taken out can be opened.
int ProofFdAdd(int fd);
// Whether the program freed the slot's number since it was added.
bool ProofFdStolen(int slot);
void ProofFdMarkStolen(int slot);
// Forgets the slot. True if the number is still the library's to close
// (not freed by the program): the caller closes it after this returns, when
// no take-out can reach it any more.
bool ProofFdRemove(int slot);
// The program is about to free numbers first..last.
void ProofFdsNoteClosed(unsigned first, unsigned last);
// Takes every registered descriptor out (above). `in_child`: in a child of
// fork or clone, whose sockets its parent shares.
void ProofFdsTakeOut(bool in_child);
// In a child of fork: a take-out another thread of the parent was making
// did not come along.
void ProofFdsChildAfterFork();
// How many descriptors were taken out since the library started (tests).
unsigned long ProofFdsTakenOut();

}  // namespace nvfs::direct
