// What the daemon shares with direct readers (libnvfs-direct, src/direct/):
// the table of per-inode sequence counters, mapped read-only by every
// client, and the runs a file's bytes lie in. Plain layout, no dependency:
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
  uint64_t reserved[5];
};
static_assert(sizeof(DirectSlot) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Slot 0 of the table is this header; slots 1 .. slot_count - 1 serve inodes.
struct DirectTableHeader {
  uint64_t magic;  // kDirectTableMagic
  uint32_t version;
  uint32_t slot_count;
  uint64_t reserved[6];
};
static_assert(sizeof(DirectTableHeader) == sizeof(DirectSlot));
inline constexpr uint64_t kDirectTableMagic = 0x656c6261742d766eULL;  // "nv-table"
inline constexpr uint32_t kDirectTableVersion = 1;

// A piece of a file: `len` bytes at byte `offset` of the namespace, or a
// hole (offset kDirectHole: zeros).
struct DirectRun {
  uint64_t offset;
  uint64_t len;
};
inline constexpr uint64_t kDirectHole = ~uint64_t{0};

}  // namespace nvfs
