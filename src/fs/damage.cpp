#include "fs/damage.hpp"

#include <cstdio>

#include "fs/fs_impl.hpp"

namespace nvfs {

DamageRecorder::DamageRecorder(FsImpl& fs, std::string path, const MountOptions& options)
    : fs_(fs), path_(std::move(path)), behavior_(options.errors), log_(options.log) {}

DamageRecorder::~DamageRecorder() { Flush(); }

void DamageRecorder::Damaged(const Error& error) {
  if (seen_.exchange(true, std::memory_order_acq_rel)) return;
  const bool stop = behavior_ == ErrorBehavior::kRemountReadOnly && !fs_.read_only();
  const std::string line =
      path_ + ": damage found: " + error.Describe() + "; " +
      (stop ? "the filesystem is read-only from now on"
            : fs_.read_only() ? "the filesystem is read-only" : "continuing (errors=continue)");
  if (log_) {
    log_(line);
  } else {
    std::fprintf(stderr, "nvfs: %s\n", line.c_str());
  }
  if (stop) fs_.SetReadOnly();
  if (armed_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mu_);
    writer_ = std::thread([this] { Record(); });
  }
}

// One transaction on the dynamic superblock: errors = 1 and its checksum.
void DamageRecorder::Record() {
  OrphanTx tx(fs_, "errors");
  tx.CommitAfterMediaLoss();
  fs_.UpdateDynamic(tx, [](format::SuperDynamic& d) { d.errors = 1; });
  Status st = tx.Commit();
  if (!st.ok()) {
    std::fprintf(stderr, "nvfs: %s: cannot record the error in the superblock: %s\n",
                 path_.c_str(), st.error().Describe().c_str());
  }
}

void DamageRecorder::Flush() {
  std::thread writer;
  {
    std::lock_guard lock(mu_);
    writer = std::move(writer_);
  }
  if (writer.joinable()) writer.join();
}

}  // namespace nvfs
