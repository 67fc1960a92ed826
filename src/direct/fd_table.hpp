// The preload's descriptor table (preload.cpp calls it around the
// program's calls): one entry per descriptor number (chunks of 1024, made
// at the first read of a number in them, never freed), holding the
// number's handle, a NotDirect(why) marker (read through the kernel: a negative result
// cached, so a descriptor that is not an nvfs file costs no system call
// after its first read), or null (not looked at yet, including descriptors
// opened before the library was loaded). A handle is reached without a
// lock, inside a read section (epoch.hpp), and retired when its number is
// freed or reused.
//
// A number is forgotten (its entry cleared, its generation moved) before
// and after every call that frees it (close, close_range, closefrom, dup2
// and dup3 onto it, fclose, fcloseall, freopen and closedir, which close
// inside libc, fcntl F_SETFL, which may set O_DIRECT) and after every call
// that returns a new one (open and its kin, fopen, freopen, dup, fcntl
// F_DUPFD, socket, socketpair, accept, pipe, eventfd, epoll_create,
// memfd_create, opendir, recvmsg's SCM_RIGHTS), so a number reused for
// another file never reads the old file's bytes when either its close or
// its reuse was seen. Both unseen (a raw system call, io_uring, a libc
// internal close such as pclose's, followed by, say, signalfd) is the one
// way left for a stale entry. A read that classifies a number installs its
// handle only if the generation did not move meanwhile.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

namespace nvfs::direct {

// Numbers past this go to the kernel.
inline constexpr unsigned kMaxFd = (1u << 20) - 1;

// Whether the preload serves reads (set by PreloadInit, before the
// program runs); every call below does nothing (FdServe: false) otherwise.
void SetPreloaded();
bool Preloaded();

// Serves a pread or preadv of `fd` from its handle (classifying the number
// at its first read): true with the result (and errno) in *result; false:
// the caller reads through the kernel.
bool FdServe(int fd, const struct iovec* iov, int iovcnt, off_t offset, ssize_t* result);
// The same for a pwrite, pwritev or pwritev2 (`flags`) of `fd` (write.cpp:
// what is not stored directly goes to the kernel from there).
bool FdServeWrite(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags,
                  ssize_t* result);
// After a write of `fd` the kernel made: the process's direct maps of its
// file follow at once (map.hpp, MapsAfterWrite).
void FdAfterKernelWrite(int fd);
// The same for an mmap of `fd` (map.hpp): true with the result in
// *result (MAP_FAILED and errno included); false: the kernel maps it.
bool FdServeMap(int fd, void* addr, size_t length, int prot, int flags, off_t offset,
                void** result);
// Before `fd` is closed (closing) or fsync'ed: Settle (file.hpp) on its
// handle, if it has one. Nothing from a signal handler inside the library.
void FdSettle(int fd, bool closing);

// What the preload does with reads of `fd` (classifying it now if it was
// not yet): NVFS_DIRECT_ACTIVE, or why the kernel serves them; -1 (ENOSYS)
// when the library was not preloaded.
int FdWhy(int fd, bool write);

// Forgets a number freed or made anew. errno is kept: these run around
// the program's own calls. Async-signal-safe (a handle forgotten in a
// signal handler that interrupted the library is retired later).
void FdForget(int fd);
void FdForgetRange(unsigned first, unsigned last);
// Before a call that may free `fd`: a session socket of the library's, or
// the program's.
void FdClosing(int fd);
void FdClosingRange(unsigned first, unsigned last);
// After a call that returned `fd` (if >= 0); returns it.
int FdFresh(int fd);

// After a change of credentials (credentials.hpp): forgets every number
// read through the kernel (a NotDirect marker, or a handle no longer
// served directly), so that it is looked at again as what the process now
// is; handles served directly stay (their sessions prove themselves again).
// Does nothing from a signal handler that interrupted the library.
void FdForgetNotDirect();

}  // namespace nvfs::direct
