// The daemon's side of direct writers' grace periods (direct_abi.hpp,
// doc/integrity.md section 11): the writers' file, shared with every
// process that writes the namespace from its own mapping, and the external
// grace the allocator waits out before it reuses a block a file gave up.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nvfs/direct_abi.hpp"
#include "nvfs/epoch.hpp"

namespace nvfs::direct {

// The namespace's uuid and this mount's mount_count, read from the mapped
// superblock at `base`.
struct NamespaceIdentity {
  uint8_t uuid[16];
  uint64_t mount_count;
};
NamespaceIdentity IdentityAt(const std::byte* base);

// DIR/writers-UUID (hex), where DIR is the sockets' directory.
std::string WritersPath(const uint8_t uuid[16]);

// Whether process `pid`, started at `start_time` (clock ticks after boot),
// is still running (a pid reused by a later process is not it).
bool ProcessAlive(uint64_t pid, uint64_t start_time);
// Process `pid`'s start time, 0 if it is gone.
uint64_t ProcessStartTime(uint64_t pid);

struct OwnersFile;  // direct_writers.cpp

class Writers final : public epoch::ExternalGrace {
 public:
  // Opens the namespace's writers' file (made, 0600, if there is none) and
  // maps it. `mount_count` is this mount's. Null and why on failure.
  static std::unique_ptr<Writers> Open(const uint8_t uuid[16], uint64_t mount_count,
                                       std::string* why);
  ~Writers() override;
  Writers(const Writers&) = delete;
  Writers& operator=(const Writers&) = delete;

  // A page for the process `pid`, marked with this mount: its byte offset
  // in the file, or 0 when every page belongs to a live process.
  uint64_t Assign(uint64_t pid);
  // The file, opened for reading and writing: what a writer maps.
  int fd() const { return fd_; }
  // Removes the file if no process that was given a page lives any more
  // (after the unmount: a writer alive still needs the next mount's guard).
  void RemoveIfIdle();

  // Calls fn(page, ino) for every inode a writer of this mount listed as
  // written since its times were set, taking the entry; `page` is the
  // writer's page (its offset, as Assign gave it). The entry is the
  // process's word: fn checks it against what the process's connection
  // was given before it acts on it.
  template <class Fn>
  void TakeDirty(Fn&& fn) {
    for (uint32_t p = 0; p < kDirectWriterPages; ++p) {
      {
        std::lock_guard lock(mu_);
        if (!OfThisMount(p)) continue;
      }
      for (auto& entry : pages_[p].dirty) {
        if (entry.load(std::memory_order_relaxed) == 0) continue;
        const uint64_t ino = entry.exchange(0, std::memory_order_acq_rel);
        if (ino != 0) fn(uint64_t{p + 1} * sizeof(DirectWriterPage), ino);
      }
    }
  }

  // Tickets go on from `ticket` (every one before it is over for writers,
  // none having been given): the direct maps' grace, whose tickets these
  // become (direct_maps.hpp). Before the first Start.
  void SkipTo(uint64_t ticket);

  // epoch::ExternalGrace: called by any thread that frees blocks.
  uint64_t Start() override;
  uint64_t Completed() override;

 private:
  Writers() = default;

  struct Inside {  // a thread seen inside a store
    uint32_t page;
    uint32_t thread;
    uint64_t gen;
  };
  // One scan, for the tickets first..last (taken since the scan before).
  struct Pending {
    uint64_t first;
    uint64_t last;
    std::vector<Inside> inside;
  };
  // Whether what `i` saw is over: the thread's gen moved, or its process
  // is gone. REQUIRES: mu_ held.
  bool Over(const Inside& i);

  int fd_ = -1;
  std::string path_;
  DirectWriterPage* pages_ = nullptr;  // kDirectWriterPages, after the header page
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint64_t mount_count_ = 0;

  std::mutex mu_;                 // a leaf lock (taken under the allocator's)
  // Who each page was given to, by which mount (direct_writers.cpp): the
  // daemons' own file, never a page's words. Protected by mu_.
  OwnersFile* owners_ = nullptr;
  void* owners_map_ = nullptr;
  // Page p was given by this mount. REQUIRES: mu_ held.
  bool OfThisMount(uint32_t p) const;
  // Whether a process that owns a page of this mount lives (mu_ held).
  bool AnyLiveWriter() const;
  uint64_t last_ticket_ = 0;      // protected by mu_
  uint64_t scanned_ = 0;          // protected by mu_; tickets up to this have a scan
  std::deque<Pending> pending_;   // protected by mu_; tickets ascending
};

// The daemon's side of the fence pair with writers: on every CPU running a
// thread of a writer that registered for it (the library does, at its
// proof for writing), a full barrier, and one here
// (MEMBARRIER_CMD_GLOBAL_EXPEDITED); a writer that could not register
// fences on its own. False when the kernel refuses: then no writer's store
// is known ordered, and nothing that waits for writers may go on (a grace
// makes no progress; a new mount waits for every live writer of the
// earlier one). A plain fence here would order nothing in their threads.
// The environment variable NVFS_TEST_MEMBARRIER_FAILS=1 makes it fail
// (the tests' way to see that rule; it can only hold frees back).
[[nodiscard]] bool BarrierWithWriters();

// Removes the writers' files of namespaces no daemon has open (each daemon
// holds a shared lock on its own) whose every page's process is gone: what
// writers that outlived their daemon left, once they are gone too. At a
// daemon's start; a bounded scan of the sockets' directory.
void RemoveIdleWriterFiles();

// The guard of a new mount (doc/integrity.md section 11): a daemon killed
// under direct writers leaves them running, and their stores must end
// before this mount gives any block to another file. This mount moved
// mount_count first, so a writer that begins a store from now on sees the
// namespace's identity changed and stores nothing; those already inside
// one are waited for, at most `seconds`. False, and why (the pid), if one
// is still inside (a stopped process): the mount must not go on.
bool WaitForEarlierWriters(const uint8_t uuid[16], uint64_t mount_count, int seconds,
                           std::string* why);

}  // namespace nvfs::direct
