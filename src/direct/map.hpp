// Direct maps (doc/direct.md, doc/integrity.md section 13): a file's blocks
// mapped into the caller at the addresses mmap(2) gives, from the
// process's own mapping of the namespace, so that loads and stores reach the
// media with no system call and no page cache, as on a DAX file system.
//
// The pages of a direct map are the file's blocks (mremap of the session's
// namespace mapping for MAP_SHARED, the namespace opened again for
// MAP_PRIVATE, which the kernel makes copy-on-write), anonymous zeros over
// holes, and a page of an empty memfd past the end of the file (SIGBUS, as
// the kernel's mapping gives). A writable shared map is given only to a
// process that proved it may write the namespace (write.cpp's proof); its
// holes get their blocks at the first store into them (lazy.hpp).
//
// Each mount's maps go through one connection of their own to the daemon
// (a "mapper"), read by one thread of the library (the listener): the
// daemon records which files the connection maps and, when one of them
// changes (truncate, punch, a hole filled, the file extended), says so
// (kOpNotify). The listener then maps again the files whose slot seq moved,
// from runs asked for anew, and acknowledges; the daemon gives a block the
// file gave up to no other file until then (daemon/direct_maps.hpp). So no
// page of a direct map is ever another file's block.
//
// Lock order: a session's mu, released, then the maps' lock; a thread that
// holds the maps' lock waits only for a reply its mapper's listener reads,
// and the listener takes the maps' lock only with try_lock.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

struct nvfs_direct;

namespace nvfs::direct {

// mmap(2) of the handle's file, direct: true with the result (or
// MAP_FAILED and errno) in *result. False, and why in *why, when the kernel
// must map it (the caller does).
bool MapFile(nvfs_direct* f, void* addr, size_t length, int prot, int flags, off_t offset,
             void** result, int* why);
// munmap(2): the direct maps in the range are forgotten (the daemon told of
// files no longer mapped) and the kernel unmaps the range.
int UnmapRange(void* addr, size_t length);
// mremap(2) of a range holding direct maps: false if it holds none (the
// kernel's). A shrink unmaps the tail; a shared map grows or moves (with
// MREMAP_MAYMOVE) as a new direct map of the larger range; anything else
// fails with ENOMEM, as mremap may.
bool RemapRange(void* old_addr, size_t old_len, size_t new_len, int flags, void* new_addr,
                void** result);
// madvise(MADV_REMOVE) over direct maps: the file's range is punched
// through the kernel (the listener then maps the holes); false if the
// range holds no direct map or the advice is another.
bool AdviseRange(void* addr, size_t len, int advice, int* result);
// NVFS_DIRECT_ACTIVE if `addr` lies in a direct map, else NVFS_DIRECT_NOT_NVFS.
int MapWhy(const void* addr);

// Whether the process has a direct map (one load).
bool MapsAny();
// After a write of the handle's file by this process (direct or through
// the kernel): its maps of the file are mapped again now if the file's
// mapping or size changed (a hole filled, the end moved), so that the
// writer's next load through them sees what it wrote.
void MapsAfterWrite(nvfs_direct* h);
// After a change of file `ino` of the mount `dev` (st_dev) by this process
// through the kernel that may take blocks or size from it (truncate,
// ftruncate, fallocate, an open with O_TRUNC): its maps of the file are
// mapped again before the call returns, so a load past the new end faults
// at once. Nothing if the process has no direct map.
void MapsAfterChange(dev_t dev, uint64_t ino);

// A handle that mapped its file is closed (or freed): the file is
// unregistered once no open handle mapped it and no map of it is left.
void MapsRelease(nvfs_direct* h);

// Before a change of credentials takes effect: every direct map becomes
// the kernel's map of the same file (mmap of the library's duplicate of
// the descriptor), the mappers' connections end. Not from a signal handler
// inside the library (tls.depth != 0): then nothing is done.
void MapsToKernel();
// fork(2): the maps' lock is held across it; in the child every direct map
// becomes the kernel's map of the same file (the child has no listener,
// and its parent's acknowledgements do not cover it).
void MapsPrepareFork();
void MapsParentAfterFork();
void MapsChildAfterFork();

}  // namespace nvfs::direct
