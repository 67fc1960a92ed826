// A stand-in for the daemon's direct-read socket (src/direct/protocol.hpp),
// for tests of libnvfs-direct without a mount: a plain file plays the
// namespace (its superblock region holds mount_count and the uuid), a memfd
// the slot table, and "files on the mount" are ordinary files whose runs
// the test chooses. What the namespace holds for a file may differ from the
// file's own bytes on purpose: a read that returns the namespace's bytes
// was served directly, one that returns the file's went to the kernel.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "direct/protocol.hpp"
#include "nvfs/direct_abi.hpp"

namespace nvfs::test {

class FakeDirectDaemon {
 public:
  // Under `root` (an existing directory): ns.img of `ns_size` bytes (0600),
  // the socket directory (0755; `socket_dir`, or root/run) and in it the
  // socket of the file system `root` lies on, serving until destroyed.
  FakeDirectDaemon(const std::string& root, uint64_t ns_size, uint32_t slot_count,
                   const std::string& socket_dir = "");
  ~FakeDirectDaemon();
  FakeDirectDaemon(const FakeDirectDaemon&) = delete;
  FakeDirectDaemon& operator=(const FakeDirectDaemon&) = delete;

  const std::string& socket_dir() const { return socket_dir_; }
  const std::string& ns_path() const { return ns_path_; }
  uint64_t ns_size() const { return ns_size_; }

  // Serves the file at `path` (by its st_dev and st_ino) with `size` and
  // `runs` (consecutive from file offset 0); its slot.
  uint32_t Serve(const std::string& path, uint64_t size, const std::vector<DirectRun>& runs);
  // Changes a file's layout as the daemon does: the slot's seq made odd,
  // the change, the seq even again.
  void Change(uint32_t slot, uint64_t size, const std::vector<DirectRun>& runs);
  uint64_t Seq(uint32_t slot) const;

  void WriteNamespace(uint64_t offset, const void* data, size_t len);
  void FillNamespace(uint64_t offset, uint8_t byte, size_t len);
  // A new mount of the namespace: mount_count moves in the image itself.
  void SetMountCount(uint64_t mount_count);
  // Writes the uuid and mount_count again (after the image was cut short).
  void WriteIdentity(uint64_t mount_count);
  uint64_t MountCount() const;

  // Runs in one Map reply at most (kMaxRuns by default).
  void set_max_runs(uint32_t n) { max_runs_ = n; }

  uint64_t connections() const { return connections_.load(); }
  uint64_t proves() const { return proves_.load(); }
  uint64_t maps() const { return maps_.load(); }

 private:
  struct File {
    uint32_t slot;
    uint64_t size;
    std::vector<DirectRun> runs;
  };

  void AcceptLoop();
  void Serve(int conn);

  std::string socket_dir_, socket_path_, ns_path_;
  uint64_t ns_size_;
  uint32_t slot_count_;
  int ns_fd_ = -1;
  int table_fd_ = -1;
  DirectSlot* table_ = nullptr;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> max_runs_{direct::kMaxRuns};
  std::atomic<uint64_t> connections_{0}, proves_{0}, maps_{0};

  mutable std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, File> files_;  // protected by mu_; by (dev, ino)
  uint32_t next_slot_ = 1;                                 // protected by mu_
  std::vector<std::thread> threads_;                       // protected by mu_
  std::thread acceptor_;
};

}  // namespace nvfs::test
