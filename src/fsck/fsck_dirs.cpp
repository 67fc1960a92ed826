// Pass 2: every directory, in inode order, on several threads when there
// are many (the walk of one directory is Checker::DirWalker, dir_walker.hpp).
// Pass 3: every directory reaches the root through the entries that name
// them.
#include <algorithm>
#include <cinttypes>
#include <vector>

#include "fsck/dir_walker.hpp"

namespace nvfs::fsck {

using format::DirEntry;
using format::Inode;

void Checker::CheckDirectories() {
  const uint64_t groups = geometry_.group_count();
  report_.directories = dirs_.size();
  // Threads log the inodes entries name as 32-bit numbers.
  const unsigned workers =
      geometry_.inode_count() > UINT32_MAX
          ? 1
          : static_cast<unsigned>(std::min<uint64_t>(threads_, dirs_.size() / 16));
  if (workers > 1) {
    // The threads claim directory nodes and set parent entries; kept to
    // start again from, should they meet a problem.
    const std::vector<uint64_t> claimed = claimed_;
    std::vector<std::vector<ChainEntry>> scratch(workers);
    std::vector<std::vector<uint32_t>> targets(workers);
    uint64_t expected = 0;  // what the directories say they hold: a hint
    for (const DirInfo& dir : dirs_) {
      expected += std::min<uint64_t>(InodeAt(dir.ino).map.dir.entries, geometry_.inode_count());
    }
    for (std::vector<uint32_t>& log : targets) {
      log.reserve(std::min<uint64_t>(expected, geometry_.inode_count()) / workers + 1024);
    }
    parallel_ = true;
    const uint64_t entries =
        RunWorkers(workers, dirs_.size(), groups, groups, [&](uint64_t i, unsigned worker) {
          return DirWalker(*this, dirs_[i], scratch[worker], &targets[worker]).Run();
        });
    parallel_ = false;
    if (!trouble_.load()) {
      for (const std::vector<uint32_t>& logged : targets) {
        for (uint32_t target : logged) CountReference(target);
      }
      report_.entries += entries;
      Progress(2 * groups);
      return;
    }
    trouble_.store(false);
    claimed_ = claimed;
    revived_dirs_.clear();  // (none: a revival on a thread is trouble)
    for (DirInfo& dir : dirs_) {
      dir.parent_entry = dir.entry_at = dir.entries = 0;
      dir.subdirs = 0;
    }
    lost_found_ = 0;
  }
  std::vector<ChainEntry> scratch;
  for (DirInfo& dir : dirs_) {
    if (halted_) return;
    report_.entries += DirWalker(*this, dir, scratch, nullptr).Run();
    Progress(groups + geometry_.InodeGroup(dir.ino));
  }
  // Directories revived on the way (an entry names them, their bit is
  // clear: ReviveInode), and those their entries revive in turn, until none
  // is left. Each is revived once (its state is no longer free), so this ends.
  for (size_t i = 0; i < revived_dirs_.size() && !halted_; ++i) {
    report_.entries += DirWalker(*this, revived_dirs_[i], scratch, nullptr).Run();
  }
  if (!revived_dirs_.empty()) {
    report_.directories += revived_dirs_.size();
    dirs_.insert(dirs_.end(), revived_dirs_.begin(), revived_dirs_.end());
    revived_dirs_.clear();
    std::sort(dirs_.begin(), dirs_.end(),
              [](const DirInfo& a, const DirInfo& b) { return a.ino < b.ino; });
  }
  Progress(2 * groups);
}

// Pass 3. Following the entry that names it, every directory must reach the
// root. One that no entry names, or that sits in a loop of directories naming
// each other, is connected to /lost+found (the loop broken by dropping the
// entry that closes it). An unlinked directory being freed (on the orphan
// list, no links) needs no parent.
void Checker::CheckConnectivity() {
  DirInfo* root = FindDir(format::kRootIno);
  root->connected = true;
  uint32_t walk = 0;
  const auto dead = [this](const DirInfo& d) { return DeadDir(d); };
  for (DirInfo& dir : dirs_) {
    if (dir.connected || dead(dir)) continue;
    ++walk;
    DirInfo* x = &dir;
    for (;;) {
      x->walk = walk;
      if (x->parent_entry == 0) {
        Problem(Repair::kSafe, "directory %" PRIu64 " is in no directory; connecting it to "
                "/lost+found", x->ino);
        x->reconnect = true;  // -n: as if connected
        break;
      }
      DirInfo* parent = FindDir(x->parent_entry);
      if (parent->connected) break;
      if (parent->walk == walk || dead(*parent)) {
        // A loop (or a parent being freed): cut x out of it.
        if (Problem(Repair::kSafe, "directory %" PRIu64 " is in %s unreachable from the root; "
                    "connecting it to /lost+found", x->ino,
                    dead(*parent) ? "a directory being deleted" : "a loop of directories")) {
          Write64(x->entry_at + offsetof(DirEntry, ino), 0);
        }
        --parent->subdirs;
        --parent->entries;
        x->parent_entry = 0;
        x->reconnect = true;
        break;
      }
      x = parent;
    }
    for (x = &dir; x != nullptr && x->walk == walk && !x->connected;) {
      x->connected = true;
      x = x->parent_entry != 0 ? FindDir(x->parent_entry) : nullptr;
    }
  }
  // The parent field ("..") of every directory in place.
  for (DirInfo& dir : dirs_) {
    if (dir.reconnect || dead(dir) || dir.empty_root) continue;
    const uint64_t want = dir.ino == format::kRootIno ? format::kRootIno : dir.parent_entry;
    const Inode& inode = InodeAt(dir.ino);
    if (inode.parent != want &&
        Problem(Repair::kSafe, "directory %" PRIu64 ": parent is %" PRIu64 ", should be %" PRIu64,
                dir.ino, inode.parent, want)) {
      WriteField(dir.ino, inode.parent, want);
      Fixed();
    }
  }
}

}  // namespace nvfs::fsck
