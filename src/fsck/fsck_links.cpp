// Pass 4: link counts against the entries found, and inodes no entry names.
// Pass 5: the block and inode bitmaps against what passes 1 and 2 reached.
// Then what is in no directory is connected to /lost+found.
#include <dirent.h>
#include <sys/stat.h>

#include <bit>
#include <cinttypes>
#include <cstring>
#include <ctime>
#include <string>

#include "alloc/allocator.hpp"
#include "ctx/context.hpp"
#include "dir/dir.hpp"
#include "fsck/checker.hpp"
#include "journal/journal.hpp"
#include "nvfs/bitmap.hpp"
#include "nvfs/cli.hpp"
#include "nvfs/fresh_inode.hpp"

namespace nvfs::fsck {

using format::Inode;

namespace {

const char* KindName(uint8_t kind) {
  switch (kind) {
    case kRegular: return "file";
    case kDirectory: return "directory";
    case kSymlink: return "symlink";
    default: return "special file";
  }
}

// The bits where `have` and `want` differ, as "-a-b +c ..." (- set but not
// wanted, + wanted but clear), units numbered from `first`; at most a few
// ranges.
std::string Differences(const uint64_t* have, const uint64_t* want, size_t words,
                        uint64_t first) {
  std::string out;
  int ranges = 0;
  uint64_t run_start = 0, run_end = 0;
  char run_sign = 0;
  const auto flush = [&] {
    if (run_sign == 0) return;
    if (ranges++ < 6) {
      char buf[64];
      if (run_end - run_start == 1) {
        std::snprintf(buf, sizeof buf, " %c%" PRIu64, run_sign, first + run_start);
      } else {
        std::snprintf(buf, sizeof buf, " %c%" PRIu64 "-%" PRIu64, run_sign, first + run_start,
                      first + run_end - 1);
      }
      out += buf;
    }
    run_sign = 0;
  };
  for (size_t w = 0; w < words; ++w) {
    uint64_t diff = have[w] ^ want[w];
    while (diff != 0) {
      const uint64_t bit = w * 64 + static_cast<uint64_t>(std::countr_zero(diff));
      diff &= diff - 1;
      const char sign = (want[w] >> (bit % 64)) & 1 ? '+' : '-';
      if (sign == run_sign && bit == run_end) {
        ++run_end;
      } else {
        flush();
        run_sign = sign;
        run_start = bit;
        run_end = bit + 1;
      }
    }
  }
  flush();
  if (ranges > 6) out += " ...";
  return out;
}

}  // namespace

void Checker::CheckLinkCounts() {
  for (const DirInfo& dir : dirs_) {
    if (DeadDir(dir) || dir.empty_root) continue;
    const Inode& inode = InodeAt(dir.ino);
    const uint32_t want = 2 + dir.subdirs;
    if (inode.nlink != want &&
        Problem(Repair::kSafe, "directory %" PRIu64 ": link count %u, should be %u", dir.ino,
                inode.nlink, want)) {
      WriteField(dir.ino, inode.nlink, want);
      Fixed();
    }
    if (inode.map.dir.entries != dir.entries &&
        Problem(Repair::kSafe, "directory %" PRIu64 ": entry count %" PRIu64 ", should be %"
                PRIu64, dir.ino, inode.map.dir.entries, dir.entries)) {
      WriteField(dir.ino, inode.map.dir.entries, dir.entries);
      Fixed();
    }
  }
  for (uint64_t ino = 1; ino < geometry_.inode_count() && !halted_; ++ino) {
    const uint8_t state = state_[ino];
    const uint8_t kind = state & kKindMask;
    if (kind == kFree || kind == kDirectory) continue;
    if (!(state & kReferenced)) {
      // An unlinked inode still open at a crash: the next mount frees it.
      if ((state & kOnOrphanList) && InodeAt(ino).nlink == 0) continue;
      Problem(Repair::kSafe, "inode %" PRIu64 " (%s) is in no directory; connecting it to "
              "/lost+found", ino, KindName(kind));
      unattached_.push_back(ino);
      continue;
    }
    if (links_[ino] != 0) {
      const Inode& inode = InodeAt(ino);
      const uint32_t refs = inode.nlink - links_[ino];
      if (Problem(Repair::kSafe, "inode %" PRIu64 ": link count %u, should be %u", ino,
                  inode.nlink, refs)) {
        WriteField(ino, inode.nlink, refs);
        Fixed();
      }
      // Linked again, it may stay an orphan only as a regular file (mount
      // truncates those; CheckOrphans).
      if ((state & kOnOrphanList) && kind != kRegular) LeaveOrphanList(ino);
    }
  }
}

// The bitmaps each group should hold: blocks claimed (metadata included,
// bits past a short last group set), inodes in use (inode 0 and bits past
// inodes_per_group set). A difference is fixed by writing the whole bitmap
// block; leaked units are freed that way, referenced ones marked in use.
void Checker::CheckBitmaps() {
  const Geometry& g = geometry_;
  const size_t words = g.blocks_per_group() / 64;
  std::vector<uint64_t> want(words), have(words);
  // Reports and rewrites bitmap block `bitmap_block` (of the units from
  // `first` on) when it is not `want`: `extra` says what a bit set that
  // should be clear means, `missing` the reverse.
  const auto fix = [&](uint32_t group, const char* kind, uint64_t bitmap_block, uint64_t first,
                       const char* extra, const char* missing) {
    std::memcpy(have.data(), Block(bitmap_block), words * 8);
    if (have == want) return;
    uint64_t extra_bits = 0, missing_bits = 0;
    for (size_t w = 0; w < words; ++w) {
      extra_bits += static_cast<uint64_t>(std::popcount(have[w] & ~want[w]));
      missing_bits += static_cast<uint64_t>(std::popcount(want[w] & ~have[w]));
    }
    if (Problem(Repair::kSafe, "group %u: %s bitmap: %" PRIu64 " %s, %" PRIu64 " %s:%s", group,
                kind, extra_bits, extra, missing_bits, missing,
                Differences(have.data(), want.data(), words, first).c_str())) {
      Write(g.BlockOffset(bitmap_block), want.data(), words * 8);
      Fixed();
    }
  };
  group_free_blocks_.assign(g.group_count(), 0);
  group_free_inodes_.assign(g.group_count(), 0);
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    const uint64_t first = g.GroupFirstBlock(group);
    const uint64_t blocks = g.GroupBlocks(group);
    for (size_t w = 0; w < words; ++w) {
      if (w * 64 >= blocks) {
        want[w] = ~uint64_t{0};
        continue;
      }
      want[w] = claimed_[first / 64 + w];
      if (blocks - w * 64 < 64) want[w] |= ~uint64_t{0} << (blocks - w * 64);
    }
    fix(group, "block", g.BlockBitmapBlock(group), first,
        "blocks in use but not referenced (leaked)", "referenced but free");
    group_free_blocks_[group] = static_cast<uint32_t>(blocks - CountSetWordBits(want.data(), blocks));

    const uint32_t ipg = g.inodes_per_group();
    const uint64_t first_ino = uint64_t{group} * ipg;
    std::fill(want.begin(), want.end(), ~uint64_t{0});
    for (uint32_t i = 0; i < ipg; ++i) {
      const uint64_t ino = first_ino + i;
      if (ino != 0 && (state_[ino] & kKindMask) == kFree) {
        want[i / 64] &= ~(uint64_t{1} << (i % 64));
      }
    }
    fix(group, "inode", g.InodeBitmapBlock(group), first_ino,
        "inodes allocated but not in use", "in use but free");
    group_free_inodes_[group] = static_cast<uint32_t>(ipg - CountSetWordBits(want.data(), ipg));
  }
}

// Links what pass 3 and 4 found in no directory into /lost+found as "#ino",
// one journal transaction each (the core's own directory code, so the result
// is what the filesystem itself would have written, and crash-atomic).
// /lost+found is made first if it is missing.
void Checker::Reconnect() {
  std::vector<uint64_t> targets;
  for (const DirInfo& dir : dirs_) {
    if (dir.reconnect) targets.push_back(dir.ino);
  }
  targets.insert(targets.end(), unattached_.begin(), unattached_.end());
  if (targets.empty()) return;
  // (-n stops here, after saying what it would do.)
  if (lost_found_ == 0 && !Problem(Repair::kSafe, "/lost+found not found; creating it")) return;
  if (!CanWrite()) return;

  Journal journal(media_, geometry_);
  Result<Journal::RecoveryStats> idle = journal.Recover();  // sequence numbers past the slots'
  if (!idle.ok()) {
    Say("cannot connect to /lost+found: %s", idle.error().message.c_str());
    return;
  }
  Allocator alloc(media_, geometry_);
  alloc.Load();
  journal.set_sink(&alloc);
  FsContext ctx{media_, geometry_, alloc, journal, NameHashKey::FromSuper(super_)};
  Directory directory(ctx);
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);

  if (lost_found_ == 0) {
    Tx tx(journal, "fsck-lost+found");
    Result<uint64_t> ino = alloc.AllocateInode(tx, format::kRootIno, false);
    if (!ino.ok()) {
      Say("cannot create /lost+found: %s", ino.error().Describe().c_str());
      return;
    }
    // Whole seconds, as fsck has always written them.
    const Inode lf = FreshInode(S_IFDIR | 0700, 0, 0, format::kRootIno,
                                timespec{.tv_sec = now.tv_sec, .tv_nsec = 0},
                                static_cast<uint32_t>(RandomU64()));
    tx.StoreFresh(InodeOffset(*ino), &lf, sizeof lf);
    const Inode& root = InodeAt(format::kRootIno);
    Status inserted = directory.Insert(tx, root, "lost+found", *ino, DT_DIR);
    if (inserted.ok()) {
      tx.Set(root.nlink, root.nlink + 1);
      inserted = tx.Commit();
    }
    if (!inserted.ok()) {
      Say("cannot create /lost+found: %s", inserted.error().Describe().c_str());
      return;
    }
    lost_found_ = *ino;
    Fixed();
  }

  const Inode& lf = InodeAt(lost_found_);
  for (uint64_t ino : targets) {
    const Inode& inode = InodeAt(ino);
    char name[32];
    std::snprintf(name, sizeof name, "#%" PRIu64, ino);
    Tx tx(journal, "fsck-reconnect");
    Status st = directory.Insert(tx, lf, name, ino,
                                 static_cast<uint8_t>((inode.mode & S_IFMT) >> 12));
    if (st.ok()) {
      if (S_ISDIR(inode.mode)) {
        tx.Set(inode.parent, lost_found_);
        tx.Set(lf.nlink, lf.nlink + 1);
      } else {
        tx.Set(inode.nlink, uint32_t{1});
      }
      st = tx.Commit();
    }
    if (!st.ok()) {
      Say("inode %" PRIu64 ": cannot connect it to /lost+found: %s", ino,
          st.error().Describe().c_str());
      continue;
    }
    Say("inode %" PRIu64 " connected as /lost+found/%s", ino, name);
    Fixed();
  }
  // Blocks these transactions freed (a directory leaf replaced) wait in
  // DRAM for a grace period; nothing reads them here, and the counts below
  // must include them.
  alloc.ReleaseDeferred(/*wait=*/true);
  for (uint32_t group = 0; group < geometry_.group_count(); ++group) {
    group_free_blocks_[group] = alloc.group_free_blocks(group);
    group_free_inodes_[group] = alloc.group_free_inodes(group);
  }
}

}  // namespace nvfs::fsck
