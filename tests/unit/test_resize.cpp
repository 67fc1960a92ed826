// Growing a filesystem offline (include/nvfs/resize.hpp, nvfs-resize): the
// grown filesystem keeps every file, checks clean, and its new groups take
// data like any other; the program refuses what it cannot do in one line,
// writing nothing. Crashes during a grow: the crash suite's [grow] workloads.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fs/fs_impl.hpp"
#include "helpers.hpp"
#include "journal/journal.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/media.hpp"
#include "nvfs/mkfs.hpp"
#include "nvfs/resize.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs {
namespace {

using test::DigestFile;
using test::FileSize;
using test::LetterPattern;
using test::MakeFile;
using test::RunInChild;
using test::Run;
using test::RunResult;
using test::TempPath;

constexpr uint64_t kMiB = 1024 * 1024;
const Cred kRoot{0, 0};

RunResult Resize(const std::vector<std::string>& args) { return Run("NVFS_RESIZE", args); }

void Format(const std::string& path, uint64_t fs_size, uint64_t file_size,
            uint32_t block_size = 4096) {
  MakeFile(path, file_size);
  MkfsOptions options;
  options.block_size = block_size;
  Result<MkfsPlan> plan = PlanMkfs(fs_size, options);
  REQUIRE(plan.ok());
  auto media = OpenMedia(path, {});
  REQUIRE(media.ok());
  REQUIRE(WriteMkfs(**media, *plan).ok());
}

std::unique_ptr<Filesystem> MountOk(const std::string& path) {
  auto fs = Filesystem::Mount(path, {});
  INFO((fs.ok() ? std::string() : fs.error().Describe()));
  REQUIRE(fs.ok());
  return std::move(fs).value();
}

void WriteFile(Filesystem& fs, const std::string& name, const std::string& data) {
  Attr attr;
  auto file = fs.Create(format::kRootIno, name, 0644, O_RDWR, kRoot, &attr);
  REQUIRE(file.ok());
  auto n = fs.Write(*file, 0, data.data(), data.size());
  REQUIRE(n.ok());
  REQUIRE(*n == data.size());
  fs.Release(*file);
  fs.Forget(attr.ino, 1);
}

std::string ReadFileAll(Filesystem& fs, const std::string& name) {
  auto attr = fs.Lookup(format::kRootIno, name);
  REQUIRE(attr.ok());
  auto file = fs.Open(attr->ino, O_RDONLY);
  REQUIRE(file.ok());
  std::string out(attr->size, '\0');
  auto n = fs.Read(*file, 0, out.data(), out.size());
  REQUIRE(n.ok());
  out.resize(*n);
  fs.Release(*file);
  fs.Forget(attr->ino, 1);
  return out;
}

void CheckClean(const std::string& path) {
  auto media = OpenMedia(path, {});
  REQUIRE(media.ok());
  std::string said;
  const FsckReport report =
      CheckNamespace(**media, RepairMode::kNone, [&](const std::string& l) { said += l + "\n"; });
  INFO(said);
  CHECK(report.exit_code == kFsckClean);
}

TEST_CASE("a grown filesystem keeps its files, checks clean and fills its new groups",
          "[resize]") {
  for (const uint32_t block_size : {4096u, 65536u}) {
    INFO("block size " << block_size);
    TempPath image("grow");
    // 20 MiB: a last group shorter than a whole one (4 KiB blocks: 128 MiB
    // groups), so the old last group grows as well as new groups being added.
    const uint64_t old_size = 20 * kMiB;
    const uint64_t new_size = block_size == 4096 ? 300 * kMiB : 1200 * kMiB;
    Format(image.path(), old_size, old_size, block_size);
    const std::string a = LetterPattern(3 * kMiB + 123, 1), b = LetterPattern(5000, 2);
    {
      auto fs = MountOk(image.path());
      WriteFile(*fs, "a", a);
      WriteFile(*fs, "b", b);
      REQUIRE(fs->Unmount().ok());
    }
    uint64_t old_blocks = 0, old_free = 0, old_inodes = 0;
    {
      auto fs = MountOk(image.path());
      const StatFs st = fs->GetStatFs().value();
      old_blocks = st.blocks;
      old_free = st.blocks_free;
      old_inodes = st.inodes;
      REQUIRE(fs->Unmount().ok());
    }
    const RunResult grown = Resize({image.path(), std::to_string(new_size)});
    INFO(grown.out);
    REQUIRE(grown.exit_code == 0);
    CHECK(FileSize(image.path()) == new_size);
    CheckClean(image.path());
    {
      auto fs = MountOk(image.path());
      const StatFs st = fs->GetStatFs().value();
      CHECK(st.blocks == fs->geometry().block_count());
      CHECK(st.blocks > old_blocks);
      CHECK(st.blocks <= new_size / block_size);
      // 64 KiB blocks make 32 GiB groups: the one group grows, no group is added.
      CHECK(st.inodes >= old_inodes);
      if (block_size == 4096) CHECK(st.inodes > old_inodes);
      // Every new block is free: the free count grew by exactly as many
      // blocks as the filesystem did, less the new groups' metadata.
      uint64_t meta = 0;
      const Geometry& g = fs->geometry();
      const uint32_t old_groups =
          static_cast<uint32_t>((old_blocks + g.blocks_per_group() - 1) / g.blocks_per_group());
      for (uint32_t group = old_groups; group < g.group_count(); ++group) {
        meta += g.GroupMetaBlocks(group);
      }
      CHECK(st.blocks_free == old_free + (st.blocks - old_blocks) - meta);
      CHECK(ReadFileAll(*fs, "a") == a);
      CHECK(ReadFileAll(*fs, "b") == b);
      // Past the old end: a file larger than the whole old filesystem.
      const std::string c = LetterPattern(old_size + 7 * kMiB, 3);
      WriteFile(*fs, "c", c);
      CHECK(ReadFileAll(*fs, "c") == c);
      REQUIRE(fs->Unmount().ok());
    }
    CheckClean(image.path());
    // Without SIZE: the file's own size, already the filesystem's: nothing to do.
    const RunResult again = Resize({image.path()});
    INFO(again.out);
    CHECK(again.exit_code == 0);
    CHECK(again.out.find("nothing to do") != std::string::npos);
  }
}

TEST_CASE("a grow takes the size of a file already extended, block by block", "[resize]") {
  TempPath image("grow-small");
  Format(image.path(), 8 * kMiB, 8 * kMiB);
  uint64_t blocks = 0;
  {
    auto fs = MountOk(image.path());
    WriteFile(*fs, "x", LetterPattern(100000, 4));
    blocks = fs->GetStatFs()->blocks;
    REQUIRE(fs->Unmount().ok());
  }
  // One block more, then a few: the backup block moves inside the last group.
  for (const uint64_t extra : {1, 3, 100}) {
    INFO("+" << extra << " blocks");
    {
      auto media = OpenMedia(image.path(), {});
      REQUIRE(media.ok());
    }
    const uint64_t size = (blocks + extra) * 4096;
    REQUIRE(truncate(image.path().c_str(), static_cast<off_t>(size)) == 0);
    const RunResult grown = Resize({image.path()});
    INFO(grown.out);
    REQUIRE(grown.exit_code == 0);
    CheckClean(image.path());
    auto fs = MountOk(image.path());
    CHECK(fs->GetStatFs()->blocks == blocks + extra);
    CHECK(ReadFileAll(*fs, "x") == LetterPattern(100000, 4));
    REQUIRE(fs->Unmount().ok());
    blocks += extra;
  }
}

TEST_CASE("GrowOffline: a new last group too short for its metadata is left out", "[resize]") {
  TempPath image("grow-short");
  // 128 MiB: one whole group of 4 KiB blocks; 64 KiB more cannot hold a group.
  Format(image.path(), 128 * kMiB, 128 * kMiB + 64 * 1024);
  auto media = OpenMedia(image.path(), {});
  REQUIRE(media.ok());
  Result<GrowPlan> plan = GrowOffline(**media, (*media)->size());
  REQUIRE(plan.ok());
  CHECK_FALSE(plan->grows());
  const uint64_t grown = 128 * kMiB + 64 * 1024 * 1024;
  media->reset();
  REQUIRE(truncate(image.path().c_str(), static_cast<off_t>(grown)) == 0);
  media = OpenMedia(image.path(), {});
  REQUIRE(media.ok());
  plan = GrowOffline(**media, (*media)->size());
  REQUIRE(plan.ok());
  CHECK(plan->grows());
  CHECK(plan->to.group_count() == 2);
  media->reset();
  CheckClean(image.path());
}

TEST_CASE("nvfs-resize refuses in one line and writes nothing", "[resize][cli]") {
  TempPath image("grow-refuse");
  Format(image.path(), 16 * kMiB, 16 * kMiB);
  const auto before = DigestFile(image.path());
  const auto one_line_failure = [&](const RunResult& r, const char* words) {
    INFO(r.out);
    CHECK(r.exit_code != 0);
    CHECK(test::Lines(r.out).size() == 1);
    CHECK(r.out.find(words) != std::string::npos);
    CHECK(DigestFile(image.path()) == before);
  };
  one_line_failure(Resize({image.path(), "8M"}), "cannot shrink");
  one_line_failure(Resize({image.path(), "12x"}), "invalid size");
  one_line_failure(Resize({image.path() + ".missing"}), "No such file");
  {
    // The namespace in use (a mount holds its lock).
    auto fs = MountOk(image.path());
    const RunResult busy = Resize({image.path(), "32M"});
    INFO(busy.out);
    CHECK(busy.exit_code != 0);
    CHECK(busy.out.find("in use") != std::string::npos);
    CHECK(FileSize(image.path()) == 16 * kMiB);
    REQUIRE(fs->Unmount().ok());
  }
  const auto clean = DigestFile(image.path());
  {
    // Not cleanly unmounted: fsck first.
    auto fs = MountOk(image.path());
    auto file = fs->Create(format::kRootIno, "f", 0644, O_RDWR, kRoot, nullptr);
    REQUIRE(file.ok());
    fs->Release(*file);
    // Dropped without an unmount (its state stays "mounted").
    auto copy = test::ReadFile(image.path());
    TempPath dirty("grow-dirty");
    test::MakeFile(dirty.path(), copy.size());
    test::WriteAt(dirty.path(), 0, copy.data(), copy.size());
    const auto dirty_before = DigestFile(dirty.path());
    const RunResult r = Resize({dirty.path(), "32M"});
    INFO(r.out);
    CHECK(r.exit_code != 0);
    CHECK(r.out.find("run fsck.nvfs") != std::string::npos);
    CHECK(DigestFile(dirty.path()) == dirty_before);
    REQUIRE(fs->Unmount().ok());
  }
  (void)clean;
  // Not nvfs at all.
  TempPath zeros("grow-zeros");
  MakeFile(zeros.path(), 16 * kMiB);
  const RunResult r = Resize({zeros.path(), "32M"});
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK(FileSize(zeros.path()) == 16 * kMiB);
  // -n: says what it would do, writes nothing (the file is not extended).
  const auto now = DigestFile(image.path());
  const RunResult dry = Resize({"-n", image.path(), "64M"});
  INFO(dry.out);
  CHECK(dry.exit_code == 0);
  CHECK(dry.out.find("would grow") != std::string::npos);
  CHECK(DigestFile(image.path()) == now);
  const RunResult version = Resize({"--version"});
  CHECK(version.exit_code == 0);
  CHECK(version.out.rfind("nvfs-resize ", 0) == 0);
  const RunResult help = Resize({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("Usage: nvfs-resize") != std::string::npos);
}

TEST_CASE("Filesystem::Grow: a mounted filesystem grows 8x in steps while threads write and "
          "read back files", "[resize][mounted]") {
  TempPath image("grow-mounted");
  Format(image.path(), 24 * kMiB, 24 * kMiB);
  MountOptions options;
  options.grow_reserve = 1ull << 30;
  auto mounted = Filesystem::Mount(image.path(), options);
  REQUIRE(mounted.ok());
  Filesystem& fs = **mounted;
  const char* base_before = reinterpret_cast<const char*>(fs.media().base());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> written{0}, wrong{0}, errors{0}, short_writes{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; !stop.load(); ++i) {
        const std::string name = "t" + std::to_string(t) + "-" + std::to_string(i % 64);
        const std::string data = LetterPattern(256 * 1024 + i, t * 1000 + i);
        (void)fs.Unlink(format::kRootIno, name);
        Attr attr;
        auto file = fs.Create(format::kRootIno, name, 0644, O_RDWR, kRoot, &attr);
        if (!file.ok()) {
          if (file.code() != ENOSPC) ++errors;
          continue;
        }
        auto n = fs.Write(*file, 0, data.data(), data.size());
        if (!n.ok()) {
          if (n.code() != ENOSPC) ++errors;
        } else {
          // Short when the space ran out part way (before a grow): what was
          // written must read back.
          const size_t len = *n;
          std::string back(len, '\0');
          auto r = fs.Read(*file, 0, back.data(), len);
          if (!r.ok() || *r != len || back.compare(0, len, data, 0, len) != 0) ++wrong;
          if (len < data.size()) ++short_writes;
          written += len;
        }
        fs.Release(*file);
        fs.Forget(attr.ino, 1);
      }
    });
  }
  for (uint64_t size = 48 * kMiB; size <= 192 * kMiB; size += 48 * kMiB) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    auto grown = fs.Grow(size);
    INFO((grown.ok() ? std::string() : grown.error().Describe()));
    REQUIRE(grown.ok());
    CHECK(fs.GetStatFs()->blocks == size / 4096);
    CHECK(FileSize(image.path()) == size);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : threads) t.join();
  INFO("written " << written << " bytes, " << short_writes << " short writes");
  CHECK(errors == 0);
  CHECK(wrong == 0);
  CHECK(written > 0);
  // The mapping never moved.
  CHECK(reinterpret_cast<const char*>(fs.media().base()) == base_before);
  // A file larger than the filesystem once was.
  WriteFile(fs, "large", LetterPattern(100 * kMiB, 9));
  CHECK(ReadFileAll(fs, "large") == LetterPattern(100 * kMiB, 9));
  // Past the reservation: refused, nothing changed.
  auto too_far = fs.Grow(2ull << 30);
  CHECK_FALSE(too_far.ok());
  CHECK(fs.GetStatFs()->blocks == 192 * kMiB / 4096);
  REQUIRE(fs.Unmount().ok());
  mounted->reset();
  CheckClean(image.path());
}

// Regression: a mounted grow took orphan_mu_ and then waited for a journal
// slot, the reverse of every other transaction that stores under it (a slot,
// then orphan_mu_). With every slot held by an operation waiting for
// orphan_mu_, the grow waited for a slot forever and they for it. Here the
// slots are taken first, one operation per slot (a chattr: it stores the
// flags word, which holds the orphan bit, under orphan_mu_) waits for one,
// then the grow; when the slots come free the operations, waiting longest,
// get them all. In a child: a deadlock leaves threads that cannot be joined.
TEST_CASE("regression: a grow that waited for a journal slot holding orphan_mu_ deadlocked "
          "operations holding every slot", "[resize][mounted][lock]") {
  TempPath image("grow-order");
  Format(image.path(), 24 * kMiB, 24 * kMiB);
  const int code = RunInChild([&] {
    MountOptions options;
    options.grow_reserve = 1ull << 30;
    auto mounted = Filesystem::Mount(image.path(), options);
    if (!mounted.ok()) return 2;
    Filesystem& fs = **mounted;
    const uint32_t slots = fs.geometry().journal_slots();
    std::vector<uint64_t> files;
    for (uint32_t i = 0; i < slots; ++i) {
      Attr attr;
      auto file = fs.Create(format::kRootIno, "f" + std::to_string(i), 0644, O_RDWR, kRoot,
                            &attr);
      if (!file.ok()) return 3;
      fs.Release(*file);
      files.push_back(attr.ino);
    }
    Journal& journal = FsImpl::Of(fs).context().journal;
    std::vector<std::unique_ptr<Tx>> held;
    for (uint32_t i = 0; i < slots; ++i) held.push_back(std::make_unique<Tx>(journal, "held"));
    std::atomic<uint32_t> finished{0};
    std::atomic<bool> grown{false};
    std::vector<std::thread> threads;
    for (uint64_t ino : files) {
      threads.emplace_back([&, ino] {
        (void)fs.SetInodeFlags(ino, FS_NODUMP_FL, kRoot);
        ++finished;
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    threads.emplace_back([&] {
      grown = fs.Grow(48 * kMiB).ok();
      ++finished;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    held.clear();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (finished < slots + 1) {
      // Deadlocked: the threads can be neither joined nor left to
      // destructors.
      if (std::chrono::steady_clock::now() > deadline) _exit(4);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (auto& t : threads) t.join();
    if (!grown) return 5;
    for (uint64_t ino : files) fs.Forget(ino, 1);
    return fs.Unmount().ok() ? 0 : 6;
  }, 60);
  CHECK(code == 0);
}

}  // namespace
}  // namespace nvfs
