// A formatted image mounted through the filesystem core, for tests above the
// module level.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/media.hpp"
#include "nvfs/mkfs.hpp"

namespace nvfs::test {

class FsImage {
 public:
  explicit FsImage(uint64_t size = 128ull << 20, uint32_t block_size = 4096,
                   uint64_t inodes = 0, uint64_t feature_incompat = format::kIncompatKnown)
      : path_("fsimage") {
    MakeFile(path_.path(), size);
    {
      auto media = OpenMedia(path_.path(), MediaOptions{});
      if (!media.ok()) throw std::runtime_error(media.error().message);
      MkfsOptions options;
      options.block_size = block_size;
      options.inode_count = inodes;
      options.feature_incompat = feature_incompat;
      auto plan = PlanMkfs((*media)->size(), options);
      if (!plan.ok()) throw std::runtime_error(plan.error().message);
      if (!WriteMkfs(**media, *plan).ok()) throw std::runtime_error("mkfs");
    }
    Mount();
  }

  void Mount() {
    auto fs = Filesystem::Mount(path_.path(), mount_options);
    if (!fs.ok()) throw std::runtime_error(fs.error().Describe());
    fs_ = std::move(fs.value());
  }
  void Unmount() {
    if (fs_) {
      Status st = fs_->Unmount();
      if (!st.ok()) throw std::runtime_error("unmount: " + st.error().Describe());
    }
    fs_.reset();
  }
  void Remount() {
    Unmount();
    Mount();
  }
  // Mounts the image as a crash at this instant would leave it: every
  // completed operation is durable, no clean unmount happened.
  // `last_words` runs after the crash state is taken (e.g. to give back
  // handles the crash would have dropped); what it writes is undone.
  void CrashAndMount(const std::function<void(Filesystem&)>& last_words = {}) {
    const std::vector<char> bytes = ReadFile(path_.path());
    if (last_words) last_words(*fs_);
    fs_.reset();  // unmounts cleanly; undone just below
    WriteAt(path_.path(), 0, bytes.data(), bytes.size());
    Mount();
  }

  // Used by every later Mount (and Remount, CrashAndMount).
  MountOptions mount_options;

  Filesystem& fs() { return *fs_; }
  Filesystem* operator->() { return fs_.get(); }
  const std::string& path() const { return path_.path(); }

 private:
  TempPath path_;
  std::unique_ptr<Filesystem> fs_;
};

// The blocks a mounted filesystem keeps back from ordinary allocations
// (Allocator::reserve_blocks: 5 % of them, at most 32 MiB): free, but
// never available to a write.
inline uint64_t ReserveBlocks(const StatFs& s) {
  return std::min<uint64_t>(s.blocks / 20, (uint64_t{32} << 20) / s.block_size);
}

}  // namespace nvfs::test
