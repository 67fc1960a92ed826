/* libnvfs-direct: reads and writes of files on an nvfs mount straight
 * from and to the namespace, without a kernel crossing, for processes that
 * may read (for writes: write) the namespace (doc/direct.md;
 * doc/integrity.md sections 10 and 11).
 *
 * A process that can read the namespace (the image file or DAX device)
 * can read every byte of every file in it already; this library only makes
 * such reads fast and correct. It maps the namespace read-only itself,
 * asks the mount's daemon (over its socket, /run/nvfs/direct-MAJ:MIN) where
 * a file's bytes lie, copies them, and then checks the file's sequence
 * counter in a table the daemon shares read-only: if the file's mapping or
 * size changed meanwhile, or the daemon is not the one that answered, the
 * copy is thrown away and the read is done again (or by the kernel). No
 * lock and no system call on the path of a read whose runs are known.
 * Writes (nvfs_direct_pwrite below) are stored from the process's own
 * shared mapping when the process may write the namespace; a store cannot
 * be checked after the fact, so the daemon reuses no block a file gave up
 * until every such store that might reach it has ended (section 11).
 *
 * Anything the library cannot serve falls back to the kernel: every call
 * below behaves as its system call on the descriptor would (same bytes,
 * same errno), and nvfs_direct_why() says why a file is not read directly.
 *
 * Loaded with LD_PRELOAD=libnvfs-direct.so, the same library serves
 * pread, pread64, preadv, preadv64, preadv2 and preadv64v2 (flags 0) of
 * unmodified programs for regular files on nvfs mounts opened for reading
 * (not O_DIRECT), pwrite, pwrite64, pwritev, pwritev64, pwritev2 and
 * pwritev64v2 (flags 0, RWF_DSYNC, RWF_SYNC) of those opened for writing
 * (O_RDWR or O_WRONLY, not O_APPEND), fsync and fdatasync (which set the times of what was written
 * directly), mmap, mmap64, munmap, mremap and madvise (direct maps, as
 * nvfs_direct_mmap below), and hands every other call to the kernel.
 *
 * A session is bound to the namespace and to the credentials that proved
 * it. Linked or preloaded, the library also defines setuid, seteuid,
 * setreuid, setresuid, their gid twins, setgroups, initgroups, setfsuid,
 * setfsgid, capset, unshare and setns (into a user namespace) and
 * syscall() (for those numbers): before libc makes the change, the
 * namespace is taken out of the process (zeros are mapped over it), and the
 * next read proves the process again, as what it now is; a process that
 * may no longer open the namespace reads through the kernel
 * (NVFS_DIRECT_NO_NAMESPACE). A child of fork() proves itself on its own.
 * A change the library cannot see (a system call made without libc, a
 * child of clone() or of a raw fork) leaves the mapping in the process
 * until its next proof: doc/integrity.md section 10 lists these limits.
 *
 * Thread-safe: a handle may be read through from many threads at once.
 */
#ifndef NVFS_DIRECT_H
#define NVFS_DIRECT_H

#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nvfs_direct nvfs_direct;

/* Why a handle is not read directly (nvfs_direct_why). */
enum nvfs_direct_why {
  NVFS_DIRECT_ACTIVE = 0,       /* reads are served from the namespace */
  NVFS_DIRECT_NOT_NVFS = 1,     /* not a regular file on an nvfs mount */
  NVFS_DIRECT_NO_SERVER = 2,    /* the mount serves no direct sessions (direct=off,
                                   a daemon not run as root, an older daemon) */
  NVFS_DIRECT_NO_NAMESPACE = 3, /* this process may not read the namespace */
  NVFS_DIRECT_NOT_READABLE = 4, /* the descriptor is not open for reading */
  NVFS_DIRECT_O_DIRECT = 5,     /* opened with O_DIRECT: the kernel serves it */
  NVFS_DIRECT_REFUSED = 6,      /* the daemon refused (limits, a full table) */
  NVFS_DIRECT_GONE = 7,         /* the daemon that served it went away (unmount,
                                   restart): the kernel answers from now on */
  NVFS_DIRECT_NO_MEMORY = 8,
  /* Why a handle is not written directly (nvfs_direct_write_why). */
  NVFS_DIRECT_NOT_WRITABLE = 9,        /* not open for writing, or O_APPEND */
  NVFS_DIRECT_NO_WRITE_NAMESPACE = 10, /* this process may not write the namespace */
  NVFS_DIRECT_NO_WRITES = 11,          /* the mount serves no direct writes (read-only,
                                          cache=page, an older daemon) */
  NVFS_DIRECT_PRIVILEGED = 12,         /* set-user-ID, set-group-ID, a capability, immutable
                                          or append-only: a write must go by the kernel */
  /* Why a map is the kernel's (nvfs_direct_mmap_why). */
  NVFS_DIRECT_MAP_FLAGS = 13           /* flags or a protection direct maps do not serve
                                          (PROT_EXEC, MAP_HUGETLB, MAP_LOCKED, MAP_SYNC
                                          where stores are made durable by msync, ...) */
};

/* Attaches to `fd` (not taken over: the caller still closes it, after
 * nvfs_direct_detach). Never fails but for memory (NULL, errno ENOMEM): a
 * file that cannot be read directly gets a handle whose reads go to the
 * kernel, with the reason in nvfs_direct_why(). */
nvfs_direct *nvfs_direct_attach(int fd);

/* As pread(2) and preadv(2) on the attached descriptor. A media error in
 * the namespace fails the read with EIO; the process lives. */
ssize_t nvfs_direct_pread(nvfs_direct *f, void *buf, size_t count, off_t offset);
ssize_t nvfs_direct_preadv(nvfs_direct *f, const struct iovec *iov, int iovcnt, off_t offset);

/* As pwrite(2) and pwritev(2) on the attached descriptor. A process that
 * may write the namespace (it can open the image or device for reading
 * and writing) writes a file opened O_RDWR or O_WRONLY (not O_APPEND) from its own
 * mapping: an overwrite of bytes the file has is a copy and a flush, with
 * no system call; a write that extends the file or fills a hole costs one
 * request to the daemon, never a FUSE round trip. Durable when it returns,
 * as every write to nvfs. Everything else goes to the kernel. A media
 * error fails the write with EIO; the process lives. */
ssize_t nvfs_direct_pwrite(nvfs_direct *f, const void *buf, size_t count, off_t offset);
ssize_t nvfs_direct_pwritev(nvfs_direct *f, const struct iovec *iov, int iovcnt, off_t offset);
/* As fsync(2): the file's mtime and ctime are set for the direct writes
 * before it (a stat that starts after it returns sees them; without it,
 * within a second), then the kernel's fsync. */
int nvfs_direct_fsync(nvfs_direct *f);

/* NVFS_DIRECT_ACTIVE, or why reads go to the kernel. */
int nvfs_direct_why(const nvfs_direct *f);
/* NVFS_DIRECT_ACTIVE while writes may be stored directly (as far as is
 * known before the first one), or why they go to the kernel. */
int nvfs_direct_write_why(const nvfs_direct *f);
/* A one-line description of a reason. */
const char *nvfs_direct_strwhy(int why);

/* Frees the handle (after setting the times of a file written directly,
 * and giving back blocks kept past its end); the descriptor stays open. */
void nvfs_direct_detach(nvfs_direct *f);

/* As mmap(2) of the attached descriptor: for a process that may read the
 * namespace, the map's pages are the file's own blocks in the namespace
 * (direct maps: loads and stores reach the media with no system call and no
 * page cache, as on a DAX file system; holes read as zeros, a page past the
 * end of the file gives SIGBUS). PROT_READ maps, MAP_SHARED or MAP_PRIVATE
 * (copy-on-write), for a descriptor open for reading; MAP_SHARED writable
 * maps for a process that may write the namespace and a descriptor open
 * for reading and writing, whose holes get blocks first (committed before
 * the map is handed out: MAP_SYNC's promise, so CPU flushes make stores
 * durable; MAP_SHARED_VALIDATE|MAP_SYNC is accepted where the namespace's
 * stores are made durable so). When the file is truncated or punched, the
 * map's pages follow (zeros, SIGBUS past the new end) before its blocks
 * can go to another file. Everything else is the kernel's map, and
 * nvfs_direct_mmap_why() says why. Unmap with nvfs_direct_munmap (or,
 * preloaded, munmap). */
void *nvfs_direct_mmap(nvfs_direct *f, void *addr, size_t length, int prot, int flags,
                       off_t offset);
int nvfs_direct_munmap(void *addr, size_t length);
/* NVFS_DIRECT_ACTIVE if the handle's last nvfs_direct_mmap was direct, else why not. */
int nvfs_direct_mmap_why(const nvfs_direct *f);
/* NVFS_DIRECT_ACTIVE if `addr` lies in a direct map, else NVFS_DIRECT_NOT_NVFS. */
int nvfs_direct_addr_why(const void *addr);

/* Loaded as LD_PRELOAD: what the preload does with pread and preadv of
 * `fd`: NVFS_DIRECT_ACTIVE if it serves them from the namespace, else why
 * the kernel does (the descriptor is looked at now if no read did yet).
 * -1 with errno ENOSYS when the library was not preloaded. */
int nvfs_direct_fd_why(int fd);
/* The same for pwrite, pwritev and pwritev2 of `fd`. */
int nvfs_direct_fd_write_why(int fd);

#ifdef __cplusplus
}
#endif

#endif /* NVFS_DIRECT_H */
