// A direct session: one per nvfs mount (keyed by the mount's st_dev), made
// at the first attach of a file on it. It owns the connection to the
// mount's daemon, the process's own read-only mapping of the namespace and
// the mapping of the daemon's slot table (protocol.hpp describes the
// exchange that sets them up).
//
// A session is bound to the namespace and to the credentials that proved
// it (credentials.hpp): after a change of credentials, or in a child of
// fork(), its mappings hold zeros, and it proves itself again on a new
// connection before it serves; a proof that fails ends it.
//
// Lock order: the registry's lock, then a session's mu, then epoch.cpp's
// and fault.cpp's locks. Nothing takes the registry's lock while holding a
// session's.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "direct/credentials.hpp"
#include "direct/fault.hpp"
#include "direct/protocol.hpp"
#include "nvfs/direct_abi.hpp"

namespace nvfs::direct {

class Session {
 public:
  // What a refresh of runs got (MapLocked).
  enum MapStatus : int {
    kMapOk = 0,
    kMapGone = -1,         // the daemon went away or the namespace was mounted anew
    kMapUnavailable = -2,  // no answer this time (timeout, a reconnect that failed)
    kMapEnded = -3,        // the process may no longer read the namespace (a new
                           // proof failed after a change of credentials)
    kMapNoWrites = -4,     // a write request, and no proof for writing
                           // (write_why() says why)
    // > 0: the daemon refused the file with this errno, or a local errno
    // about the descriptor (EBADF)
  };

  // Set at creation, immutable while the session is usable: what the read
  // path uses without a lock.
  const std::byte* ns_base = nullptr;  // the namespace, mapped PROT_READ
  // Bytes of it mapped: grows (never shrinks) under mu when the namespace
  // grows while mounted; only the replies checked under mu rely on it.
  uint64_t ns_size = 0;
  const DirectSlot* table = nullptr;   // slot 0 is the header
  uint32_t slot_count = 0;
  FaultMapping* fault = nullptr;
  Revocable* ns_range = nullptr;       // the namespace mapping's; zeros while revoked
  uint64_t mount_count = 0;            // the namespace's identity at this mount
  uint64_t uuid_words[2] = {0, 0};

  // Set once when the session is found gone; never cleared.
  std::atomic<bool> gone{false};

  // Direct writes (WriteProveLocked): set while the namespace's mapping is
  // shared and writable, from the proof for writing of this process as it
  // is now, and `writer_page` is its page of the writers' file. Cleared by
  // a new proof (which maps it read-only again) and in a child of fork().
  std::atomic<bool> writable{false};
  // Mapped while the library lives. Set under mu, read without it (the
  // write path, the maps' count of writable ranges).
  std::atomic<DirectWriterPage*> writer_page{nullptr};
  uint32_t flush = kDirectFlushPage;        // DirectFlush, the daemon's
  // Bytes of the namespace mapped writable (a grow maps more read-only).
  std::atomic<uint64_t> writable_size{0};
  // Moved whenever writer_page changes: a thread's slot (write.cpp) is
  // claimed again after it moved.
  std::atomic<uint64_t> writer_generation{0};

  // Proves the process may write the namespace and maps it writable:
  // NVFS_DIRECT_ACTIVE, or why writes go through the kernel. A refusal is
  // remembered until the credentials change. REQUIRES: mu held.
  int WriteProveLocked();
  // WriteProveLocked unless this connection proved itself for writing and
  // the mapping is writable. REQUIRES: mu held.
  int EnsureWriterLocked();
  // Why the last request refused with kMapNoWrites was. REQUIRES: mu held.
  int write_why() const { return no_writes_why_; }
  // A request about `fd` (kOpMap with flags, kOpAllocate, kOpCommit,
  // kOpTrim) answered by a MapReply (kOpTrim: its header), checked as
  // MapLocked's. REQUIRES: mu held.
  int CallLocked(const Request& req, int fd, MapReply* reply);

  // The identity in the mapping is still the one the session was made for
  // (a remount or a daemon restart moves mount_count first).
  // REQUIRES: tls.in_copy set (a lost superblock page faults), or use
  // GuardedIdentityHolds.
  [[gnu::always_inline]] bool IdentityHolds() const {
    return MappedWord(kMountCountOffset) == mount_count &&
           MappedWord(kUuidOffset) == uuid_words[0] && MappedWord(kUuidOffset + 8) == uuid_words[1];
  }

  bool GuardedIdentityHolds() const;

  // The mappings hold zeros (a change of credentials, a fork): a read that
  // finds the identity gone asks for its runs again, which proves the
  // session anew, instead of ending it.
  bool Revoked() const { return ns_range->revoked.load(std::memory_order_seq_cst); }
  uint64_t Revocations() const { return ns_range->revocations.load(std::memory_order_seq_cst); }

  // Asks the daemon where `fd`'s bytes from `offset` on lie. The reply is
  // checked (slot in the table, runs inside the namespace, seq even).
  // REQUIRES: mu held.
  int MapLocked(int fd, uint64_t offset, MapReply* reply);
  // Takes mu.
  int Map(int fd, uint64_t offset, MapReply* reply, bool for_write = false);

  // Whether `st` is the file or device this session mapped.
  bool IsNamespace(const struct stat& st) const {
    return static_cast<uint64_t>(st.st_dev) == ns_dev_ &&
           static_cast<uint64_t>(st.st_ino) == ns_ino_ &&
           static_cast<uint64_t>(st.st_rdev) == ns_rdev_;
  }
  dev_t dev() const { return dev_; }

  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  // With the last reference, the session is freed (unmapped) at the next
  // SessionFor, where no session's lock is held; no read may still use it
  // then (epoch.hpp makes sure).
  void Unref();

  // Serializes the connection and refreshes of runs of this session's
  // files (client.cpp publishes snapshots under it).
  std::mutex mu;

  // Offsets in the namespace of the identity words (format.hpp).
  static const uint64_t kMountCountOffset;
  static const uint64_t kUuidOffset;

 private:
  friend Session* SessionFor(dev_t dev, int* why);
  friend void SessionsPrepareFork();
  friend void SessionsParentAfterFork();
  friend void SessionsChildAfterFork();
  friend void SessionsDropConnections();
  friend void FreeDeadSessions();

  explicit Session(dev_t dev) : dev_(dev) {}
  ~Session();

  uint64_t MappedWord(uint64_t offset) const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(ns_base + offset), __ATOMIC_RELAXED);
  }

  // Connects, says hello, proves with the namespace and, the first time,
  // maps it: NVFS_DIRECT_ACTIVE or why not. REQUIRES: mu held.
  int ConnectLocked();
  int CallOnceLocked(const Request& req, int fd, MapReply* reply);
  // Maps the namespace on to `new_size` bytes, in the room kept after it,
  // from `ns_fd` (or the namespace opened again), if it is still the file
  // mapped. False if it cannot. REQUIRES: mu held.
  bool ExtendLocked(int ns_fd, uint64_t new_size);
  bool ExtendLocked(uint64_t new_size);
  void DropSocketLocked();
  int CheckReply(const MapReply& reply, uint64_t offset) const;
  // Maps the namespace and the table again over the zeros, from a new
  // proof's descriptors. False (zeros still there) if the kernel refused.
  bool RemapLocked(int ns_fd, int table_fd);
  // The session ends for good: zeros over its mappings, and gone.
  void EndLocked();

  const dev_t dev_;
  std::atomic<int> refs_{1};  // the registry's, while listed

  // protected by mu:
  int sock_ = -1;
  int proof_fd_ = -1;  // its entry among the proof's descriptors (proof_fds.hpp)
  // Registers sock_ among them once its proof of `generation` is made;
  // false (the connection dropped) if a change of credentials came since.
  bool RegisterSocketLocked(uint64_t generation);
  dev_t sock_dev_ = 0;       // the socket's identity, checked before each use
  ino_t sock_ino_ = 0;
  uint64_t ns_dev_ = 0, ns_ino_ = 0, ns_rdev_ = 0;  // what was mapped
  uint64_t table_dev_ = 0, table_ino_ = 0;
  size_t table_bytes_ = 0;
  uint64_t ns_reserved_ = 0;  // bytes of address space from ns_base: the mapping and its room
  Revocable* table_range_ = nullptr;
  uint64_t proved_generation_ = 0;     // CredentialsGeneration() when the connection proved itself
  int why_ = 0;                        // why the last connection attempt failed
  uint64_t why_generation_ = 0;        // ... as the process was then
  int64_t retry_after_ = 0;            // CLOCK_MONOTONIC seconds
  uint64_t socket_ino_ = 0;            // the socket file that refused us
  int64_t socket_mtime_ = 0;
  bool mapped_ = false;
  bool write_connection_ = false;   // this connection made a proof for writing
  uint64_t writer_page_offset_ = 0;  // writer_page's, in the writers' file
  uint64_t writers_dev_ = 0, writers_ino_ = 0;  // that file
  // writer_page's entry among the ranges a change of credentials takes out
  // (zeros in its place: a process that dropped its credentials, or a child
  // of fork, keeps no page it could mark).
  Revocable* writer_page_range_ = nullptr;
  int write_why_ = 0;               // why the last proof for writing failed
  int no_writes_why_ = 0;           // why the last kMapNoWrites
  uint64_t write_why_generation_ = 0;  // ... as the process was then

  Session* prev_ = nullptr;  // the list of all sessions; protected by the registry's lock
  Session* next_ = nullptr;
  Session* dead_next_ = nullptr;  // the list of sessions to free (Unref)
};

// The directory of the daemons' sockets (NVFS_DIRECT_SOCKET_DIR in tests),
// and whether only root (or, in tests, this user) can put a socket there.
const char* SocketDir();
bool SocketDirTrusted(const char* dir);
// The namespace the mount `dev` serves: its source in this process's
// /proc/self/mountinfo. Allocates nothing.
bool NamespacePath(dev_t dev, char* out, size_t size);
// Opens the namespace at `path` (`access`: O_RDONLY or O_RDWR) without
// following a symbolic link or blocking, and only if it is a regular file
// or a character device: -1 otherwise. Whether it is the very namespace
// the daemon serves, the proof tells.
int OpenNamespace(const char* path, struct stat* st, int access = O_RDONLY);

// Whether this process registered for the daemon's barriers
// (MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, at its first proof for
// writing): its writers then need no fence of their own (write.cpp).
bool WritersAsymmetric();

// The session of the mount `dev` with a reference for the caller, ready to
// map files; null and the reason in *why (an nvfs_direct_why) when the
// mount serves this process no direct reads. A failure is remembered for
// some seconds, or until the mount's socket is made anew.
Session* SessionFor(dev_t dev, int* why);

// Test-only (tests/mount/test_direct.cpp): the socket directory given by
// NVFS_DIRECT_SOCKET_DIR (secure_getenv: ignored for setuid programs) is
// used instead of /run/nvfs; it may then belong to this process's user, the
// daemon may run as that user, and any file system counts as nvfs.
bool TestMode();

void SessionsPrepareFork();
void SessionsParentAfterFork();
// The child drops its copies of the sockets (a child must not share a
// connection with its parent); its mappings hold zeros
// (CredentialsChildAfterFork), and it proves itself on a connection of its
// own when it next needs to.
void SessionsChildAfterFork();

// Before a change of credentials: closes every session's connection that
// no other thread is using (that one is closed at its next use). Takes the
// registry's lock. REQUIRES: no library lock held by the caller.
void SessionsDropConnections();

}  // namespace nvfs::direct
