// The errors flag, as ext4 keeps it (doc/integrity.md, "Damage and faults"):
// the first damage the modules report on a mounted filesystem is logged in
// one line, turns the filesystem read-only (unless errors=continue) and is
// recorded in the dynamic superblock's `errors`, which fsck.nvfs -y clears.
#pragma once

#include <atomic>
#include <mutex>
#include <functional>
#include <string>
#include <thread>

#include "ctx/context.hpp"
#include "nvfs/fs.hpp"

namespace nvfs {

class FsImpl;

class DamageRecorder final : public DamageSink {
 public:
  DamageRecorder(FsImpl& fs, std::string path, const MountOptions& options);
  ~DamageRecorder() override;  // Flush()

  // The first call logs the error in one line on stderr and, with
  // kRemountReadOnly, makes the filesystem read-only (every later change
  // fails with EROFS); once armed, it also starts the transaction that sets
  // `errors` on the media. Later calls do nothing. Safe anywhere (the
  // DamageSink contract): the transaction runs on a thread of its own,
  // which takes a journal slot and then orphan_mu_, as every operation
  // does, while the reporter may hold inode locks, a slot and an epoch
  // guard.
  void Damaged(const Error& error) override;

  // From now on the first damage is also written to the media. Mount arms
  // a read-write filesystem after its own transaction, which records what
  // mount itself found.
  void Arm() { armed_.store(true, std::memory_order_release); }
  // True once damage was reported on this mount.
  bool seen() const { return seen_.load(std::memory_order_acquire); }
  // Waits until the flag is on the media, if it is being written.
  // REQUIRES: not called by a thread holding orphan_mu_ or a journal slot.
  void Flush();

 private:
  void Record();

  FsImpl& fs_;
  const std::string path_;
  const ErrorBehavior behavior_;
  const std::function<void(const std::string&)> log_;  // empty: stderr
  std::atomic<bool> armed_{false};
  std::atomic<bool> seen_{false};
  std::mutex mu_;
  std::thread writer_;  // protected by mu_
};

}  // namespace nvfs
