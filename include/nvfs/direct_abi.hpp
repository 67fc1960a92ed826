// What the daemon shares with direct readers and writers (libnvfs-direct,
// src/direct/): the table of per-inode sequence counters, mapped read-only
// by every client, the runs a file's bytes lie in, and the writers' pages. Plain layout, no dependency:
// the core (which keeps the table current), the daemon's socket server and
// the client library all include it. doc/integrity.md section 10 argues
// why a read checked against these returns only bytes of its own file.
#pragma once

#include <atomic>
#include <cstdint>

namespace nvfs {

// One slot per inode that a direct client asked about, while the inode is
// cached (a client's open descriptor keeps it so). 64 bytes, one cache
// line, so that a writer bumping one slot does not disturb readers of
// another.
struct DirectSlot {
  // Even: stable. Made odd before, and even again after, every change of
  // the file's mapping or size (the core's MappingChange, beside
  // CachedInode::data_seq); moved by 2 when the slot is given up, so a value
  // a client saw never comes back for another inode or another state.
  std::atomic<uint64_t> seq;
  // The file's size as of the last even `seq`.
  std::atomic<uint64_t> size;
  // The inode the slot serves; 0 while free.
  std::atomic<uint64_t> ino;
  // The daemon's: how many clients map the file (direct maps). While it is
  // not zero, the core tells the daemon of each change of the file's
  // mapping or size (Filesystem::SetDirectWatch), which tells them.
  std::atomic<uint64_t> watchers;
  uint64_t reserved[4];
};
static_assert(sizeof(DirectSlot) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Slot 0 of the table is this header; slots 1 .. slot_count - 1 serve inodes.
struct DirectTableHeader {
  uint64_t magic;  // kDirectTableMagic
  uint32_t version;
  uint32_t slot_count;
  // 0 while direct writers may store; kDirectWritesStopped once the
  // filesystem turned read-only (damage): a writer looks at it inside each
  // store, as at its file's slot.
  std::atomic<uint64_t> write_state;
  uint64_t reserved[5];
};
static_assert(sizeof(DirectTableHeader) == sizeof(DirectSlot));
inline constexpr uint64_t kDirectTableMagic = 0x656c6261742d766eULL;  // "nv-table"
inline constexpr uint32_t kDirectTableVersion = 2;
inline constexpr uint64_t kDirectWritesStopped = 1;

// Direct writers (doc/integrity.md section 11). Every process that may
// write the namespace and writes files from its own mapping of it has a
// page of the writers' file (DIR/writers-UUID beside the sockets, root's,
// 0600; it outlives the daemon, so that the next mount of the namespace
// finds the writers of this one). Each thread that stores has a slot of
// its page, whose `gen` it makes odd before it looks at its file's slot
// and the namespace's identity, and even again after its store and flush;
// the daemon reuses a block a file gave up only after every slot it saw
// odd once the file's slot seq had moved has moved on (or its process is
// gone).
struct DirectWriterThread {
  std::atomic<uint64_t> gen;    // odd: inside a store
  std::atomic<uint64_t> owner;  // the thread's id in its process, 0: free
  uint64_t reserved[6];
};
static_assert(sizeof(DirectWriterThread) == 64);

inline constexpr uint32_t kDirectWriterThreads = 56;
inline constexpr uint32_t kDirectWriterDirty = 56;

struct DirectWriterPage {
  // The daemon's, set when it gives the page to a process.
  uint64_t pid;            // 0: free
  uint64_t start_time;     // the process's, in clock ticks after boot (/proc/PID/stat)
  uint64_t mount_count;    // of the mount whose daemon gave it
  // The process's: writable direct maps it holds (or is being given) of
  // this mount's files. A new mount waits until it is 0 (the process's
  // listener takes the maps' pages off the file's blocks when its daemon
  // goes), as it waits for stores (doc/integrity.md section 13).
  std::atomic<uint64_t> maps;
  uint64_t reserved[4];
  // Inodes the process wrote whose mtime and ctime are not yet set (0:
  // free): the daemon sets them within a second, and takes the entry.
  std::atomic<uint64_t> dirty[kDirectWriterDirty];
  DirectWriterThread threads[kDirectWriterThreads];
};
static_assert(sizeof(DirectWriterPage) == 4096);

// Page 0 of the writers' file.
struct DirectWritersHeader {
  uint64_t magic;  // kDirectWritersMagic
  uint32_t version;
  uint32_t page_count;  // pages after this one
};
inline constexpr uint64_t kDirectWritersMagic = 0x7372746972772d76ULL;  // "v-writrs"
inline constexpr uint32_t kDirectWritersVersion = 1;
inline constexpr uint32_t kDirectWriterPages = 128;

// How a writer makes its stores durable: the namespace's own flush, as the
// daemon's mapping has it (nvfs::Media's granularity).
enum DirectFlush : uint32_t {
  kDirectFlushNone = 0,       // memory (tmpfs): a store is all there is
  kDirectFlushFence = 1,      // byte granularity (eADR): a store fence
  kDirectFlushCacheLine = 2,  // CPU cache flushes, then a store fence
  kDirectFlushPage = 3,       // msync of the pages
};

// A piece of a file: `len` bytes at byte `offset` of the namespace, or a
// hole (offset kDirectHole: zeros).
struct DirectRun {
  uint64_t offset;
  uint64_t len;
};
inline constexpr uint64_t kDirectHole = ~uint64_t{0};

}  // namespace nvfs
