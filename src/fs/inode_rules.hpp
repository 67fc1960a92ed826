// What the files of src/fs/ apply to an inode without any state of the
// filesystem's: the current time, chattr's attributes, the privileges a
// change takes away, logged time and inode stores. Plain functions over an
// inode and a transaction (inode_access.cpp, read.cpp).
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ctime>

#include "journal/journal.hpp"
#include "nvfs/format.hpp"

namespace nvfs {

// Current time for timestamps.
timespec Now();

// chattr's attributes (format.hpp kInodeFlag*, enforced as ext4 does;
// doc/format.md): an immutable inode changes in nothing — bytes, size,
// attributes, xattrs, names (no link, unlink or rename of it, no entry
// added to or removed from it as a directory); an append-only one takes
// bytes only at its end and keeps its names and attributes likewise, but
// as a directory takes new entries. Both EPERM. REQUIRES: inode lock held.
inline bool Immutable(const format::Inode& inode) {
  return inode.flags & format::kInodeFlagImmutable;
}
inline bool AppendOnly(const format::Inode& inode) {
  return inode.flags & format::kInodeFlagAppend;
}
// Neither its names nor its attributes may change (either flag).
inline bool Pinned(const format::Inode& inode) {
  return inode.flags & (format::kInodeFlagImmutable | format::kInodeFlagAppend);
}

// A regular file's append word (format.hpp Inode::append_end), 0 when
// closed; read once, as direct writers move it.
inline uint64_t AppendWordOf(const format::Inode& inode) {
  return std::atomic_ref(const_cast<uint64_t&>(inode.append_end)).load(std::memory_order_acquire);
}
// The size of a regular file with an open append word: max(size, end),
// the end bounded by the largest file (`max_size`).
inline uint64_t SizeWithWord(const format::Inode& inode, uint64_t word, uint64_t max_size) {
  const uint64_t end = format::AppendEnd(word);
  return std::max(inode.size, end < max_size ? end : max_size);
}

// Sets mtime and/or ctime to `now`, logged. REQUIRES: inode lock held.
void Touch(Tx& tx, const format::Inode& inode, bool mtime, bool ctime, timespec now);
// Logs and stores the bytes where `updated` differs from the on-media inode,
// as one record (two if they lie on both sides of orphan_next and the
// append word after it, which are never stored here: OrphanAdd and
// OrphanRemove own the one, under orphan_mu_; compare-and-swap the other).
void StoreInodeDiff(Tx& tx, const format::Inode& on_media, const format::Inode& updated);

// What a change of a file takes away (fs.hpp, "Privileges"): the
// security.capability attribute always; with `suidgid`, set-user-ID and
// set-group-ID where group execution is on (without it the bit marks
// mandatory locking and stays, as on every Linux filesystem).
inline uint32_t KilledMode(uint32_t mode) {
  uint32_t kill = mode & S_ISUID;
  if ((mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP)) kill |= S_ISGID;
  return mode & ~kill;
}

// A media error (SIGBUS) met under a recovery point by `what` on inode
// `ino`: says so on stderr (the first 16, then every 1024th); the caller
// fails the request with EIO.
[[gnu::cold]] void ReportMediaError(const char* what, uint64_t ino);

inline uint8_t DirType(uint32_t mode) { return static_cast<uint8_t>((mode & S_IFMT) >> 12); }

inline timespec ToTimespec(int64_t sec, uint32_t nsec) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(sec);
  ts.tv_nsec = static_cast<long>(nsec);
  return ts;
}

}  // namespace nvfs
