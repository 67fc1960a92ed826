// The filesystem core through its C++ API (meson test 'fs'): direct writers'
// calls (src/fs/direct.cpp) — here appends by word: a client moves the
// file's append word by compare-and-swap, and every change of the file
// closes the word first, so a client's compare-and-swap with the value it
// read before fails.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "fs_image.hpp"
#include "nvfs/direct_abi.hpp"
#include "nvfs/epoch.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/media.hpp"
#include "test_fs.hpp"

namespace nvfs::test {
namespace {

// No direct writer runs outside the test's own calls: every grace period is
// over as soon as it begins.
struct ImmediateGrace final : epoch::ExternalGrace {
  uint64_t n = 0;
  uint64_t Start() override { return ++n; }
  uint64_t Completed() override { return n; }
};

// A filesystem whose commits open append words: a slot table and a grace
// period (both outlive it: declared first), as the daemon's direct server
// gives them.
struct WordsImage {
  std::unique_ptr<DirectSlot[]> table{new DirectSlot[64]()};
  ImmediateGrace grace;
  FsImage img;
  WordsImage() {
    img.fs().SetDirectTable(table.get(), 64);
    img.fs().SetExternalGrace(&grace);
    img.fs().SetAppendWords(true);
  }
};

std::string Pattern(size_t len, char seed) {
  std::string out(len, '\0');
  for (size_t i = 0; i < len; ++i) out[i] = static_cast<char>('a' + (seed + i * 7 + i / 13) % 26);
  return out;
}

// The client's store: `data` at file offset `offset` into the runs of `m`
// (from file offset m.start), flushed.
void StoreIntoRuns(Filesystem& fs, const Filesystem::DirectMapping& m, const DirectRun* runs,
                   uint64_t offset, const std::string& data) {
  uint64_t file_off = m.start;
  size_t done = 0;
  for (size_t i = 0; i < m.run_count && done < data.size(); ++i) {
    const uint64_t end = file_off + runs[i].len;
    if (offset + done >= file_off && offset + done < end) {
      REQUIRE(runs[i].offset != kDirectHole);
      const uint64_t within = offset + done - file_off;
      const size_t k = static_cast<size_t>(std::min<uint64_t>(runs[i].len - within, data.size() - done));
      fs.media().StoreFlush(runs[i].offset + within, data.data() + done, k);
      done += k;
    }
    file_off = end;
  }
  REQUIRE(done == data.size());
  fs.media().Drain();
}

// The word as the client sees it in its mapping of the namespace.
std::atomic_ref<uint64_t> WordAt(Filesystem& fs, uint64_t append_at) {
  return std::atomic_ref<uint64_t>(
      *reinterpret_cast<uint64_t*>(const_cast<std::byte*>(fs.media().base()) + append_at));
}

TEST_CASE("appends by word: a client's stale compare-and-swap fails after a truncation closed the word",
          "[fs]") {
  WordsImage words;
  FsImage& img = words.img;
  Filesystem& fs = img.fs();
  const uint64_t ino = MustCreate(fs, kRoot, "f");
  auto file = fs.Open(ino, O_RDWR);
  REQUIRE(file.ok());
  constexpr uint64_t kReserveEnd = 1ull << 20;

  // A first direct write of [0, 4096) with a reserve to 1 MiB: its commit
  // leaves blocks past the new end, so it opens the word at 4096.
  DirectRun runs[64];
  auto alloc = fs.DirectAllocate(ino, 0, 4096, kReserveEnd, runs, 64);
  REQUIRE(alloc.ok());
  CHECK(alloc->append_word == 0);
  const std::string first = Pattern(4096, 1);
  StoreIntoRuns(fs, *alloc, runs, 0, first);
  auto commit = fs.DirectCommit(ino, 0, 4096, alloc->seq, kReserveEnd, runs, 64);
  REQUIRE(commit.ok());
  REQUIRE(commit->append_opened);
  REQUIRE(commit->append_word != 0);
  REQUIRE(format::AppendEnd(commit->append_word) == 4096);
  const uint64_t tag = format::AppendTag(commit->append_word);
  REQUIRE(tag != 0);
  std::atomic_ref<uint64_t> word = WordAt(fs, commit->append_at);
  REQUIRE(word.load() == commit->append_word);

  // The client's append at the word's end: the bytes into the reserve,
  // flushed, then the word moved; no call of the core.
  const std::string second = Pattern(4096, 2);
  StoreIntoRuns(fs, *commit, runs, 4096, second);
  uint64_t expected = format::AppendWord(tag, 4096);
  REQUIRE(word.compare_exchange_strong(expected, format::AppendWord(tag, 8192)));
  {
    auto attr = fs.GetAttr(ino);
    REQUIRE(attr.ok());
    REQUIRE(attr->size == 8192);
    REQUIRE(attr->size_moving);
    std::string back(8192, '\0');
    auto n = fs.Read(*file, 0, back.data(), back.size());
    REQUIRE(n.ok());
    REQUIRE(*n == 8192);
    REQUIRE(back == first + second);
  }

  // A truncation folds the word into the size and closes it first.
  SetAttrRequest truncate;
  truncate.valid = kSetSize;
  truncate.size = 100;
  REQUIRE(fs.SetAttr(ino, truncate).ok());
  REQUIRE(word.load() == 0);
  {
    auto attr = fs.GetAttr(ino);
    REQUIRE(attr.ok());
    REQUIRE(attr->size == 100);
    REQUIRE_FALSE(attr->size_moving);
  }

  // A client that read the word before the close appends again: its
  // compare-and-swap from the value it knew must fail, and nothing moves.
  expected = format::AppendWord(tag, 8192);
  REQUIRE_FALSE(word.compare_exchange_strong(expected, format::AppendWord(tag, 12288)));
  REQUIRE(expected == 0);
  {
    auto attr = fs.GetAttr(ino);
    REQUIRE(attr.ok());
    REQUIRE(attr->size == 100);
    REQUIRE_FALSE(attr->size_moving);
    std::string back(8192, '\0');
    auto n = fs.Read(*file, 0, back.data(), back.size());
    REQUIRE(n.ok());
    REQUIRE(*n == 100);
    REQUIRE(back.substr(0, 100) == first.substr(0, 100));
  }

  // The close's grace is over at once (ImmediateGrace): the next commit
  // that leaves a reserve past its end opens a word again.
  auto again = fs.DirectAllocate(ino, 100, 4000, kReserveEnd, runs, 64);
  REQUIRE(again.ok());
  REQUIRE(again->append_word == 0);
  const std::string third = Pattern(4000, 3);
  StoreIntoRuns(fs, *again, runs, 100, third);
  auto reopened = fs.DirectCommit(ino, 100, 4100, again->seq, kReserveEnd, runs, 64);
  REQUIRE(reopened.ok());
  REQUIRE(reopened->append_opened);
  REQUIRE(format::AppendEnd(reopened->append_word) == 4100);
  REQUIRE(word.load() == reopened->append_word);

  fs.Release(*file);
  REQUIRE(ReadAll(fs, ino) == first.substr(0, 100) + third);
  RequireFsckClean(img, "appends by word, a truncation, a word opened again");
}

TEST_CASE("appends by word: a word closed by a chmod leaves the orphan list; fallocated blocks "
          "survive the next mount", "[fs]") {
  WordsImage words;
  FsImage& img = words.img;
  Filesystem& fs = img.fs();
  const uint64_t ino = MustCreate(fs, kRoot, "f");
  {
    auto file = fs.Open(ino, O_RDWR);
    REQUIRE(file.ok());
    DirectRun runs[64];
    auto alloc = fs.DirectAllocate(ino, 0, 4096, 1ull << 20, runs, 64);
    REQUIRE(alloc.ok());
    StoreIntoRuns(fs, *alloc, runs, 0, Pattern(4096, 3));
    auto commit = fs.DirectCommit(ino, 0, 4096, alloc->seq, 1ull << 20, runs, 64);
    REQUIRE(commit.ok());
    REQUIRE(commit->append_opened);
    REQUIRE(fs.DirectTrim(ino).ok());
    // Blocks kept past the size on purpose, after a change of mode closed
    // the word (not a truncation, not DirectTrim).
    auto again = fs.DirectAllocate(ino, 4096, 4096, 1ull << 20, runs, 64);
    REQUIRE(again.ok());
    StoreIntoRuns(fs, *again, runs, 4096, Pattern(4096, 4));
    auto reopened = fs.DirectCommit(ino, 4096, 8192, again->seq, 1ull << 20, runs, 64);
    REQUIRE(reopened.ok());
    REQUIRE(reopened->append_opened);
    SetAttrRequest chmod;
    chmod.valid = kSetMode;
    chmod.mode = S_IFREG | 0600;
    REQUIRE(fs.SetAttr(ino, chmod).ok());
    REQUIRE(fs.Fallocate(*file, FALLOC_FL_KEEP_SIZE, 8192, 3 << 20).ok());
    fs.Release(*file);
  }
  auto before = fs.GetAttr(ino);
  REQUIRE(before.ok());
  REQUIRE(before->size == 8192);
  img.Remount();
  auto after = img.fs().GetAttr(ino);
  REQUIRE(after.ok());
  CHECK(after->size == 8192);
  CHECK(after->blocks == before->blocks);
}

// The real mapping, with a writer that always wins the race: every
// compare-and-swap of the daemon's finds the word moved by one just before
// it (up to kCap times, so that a close with no bound ends too).
class MovingWordMedia final : public Media {
 public:
  static constexpr int kCap = 100000;
  explicit MovingWordMedia(std::unique_ptr<Media> target) : target_(std::move(target)) {
    base_ = const_cast<std::byte*>(target_->base());
    size_ = target_->size();
    read_only_ = target_->read_only();
    granularity_ = target_->granularity();
    path_ = target_->path();
  }
  std::atomic<int> swaps{0};
  void Store(uint64_t offset, const void* src, size_t len) override {
    target_->Store(offset, src, len);
  }
  void Store64(uint64_t offset, uint64_t value) override { target_->Store64(offset, value); }
  bool CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) override {
    if (swaps.fetch_add(1) < kCap) {
      auto* word = reinterpret_cast<uint64_t*>(base_ + offset);
      const uint64_t now = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      if (now != 0) target_->Store64(offset, now + 1);
    }
    return target_->CompareExchange64(offset, expected, desired);
  }
  void Fill(uint64_t offset, int byte, size_t len) override { target_->Fill(offset, byte, len); }
  void Flush(uint64_t offset, size_t len) override { target_->Flush(offset, len); }
  void Drain() override { target_->Drain(); }
  void StoreFlush(uint64_t offset, const void* src, size_t len) override {
    target_->StoreFlush(offset, src, len);
  }

 private:
  std::unique_ptr<Media> target_;
};

TEST_CASE("direct commit: a map end near 2^64 gives the runs up to the file's last block",
          "[fs]") {
  WordsImage words;
  Filesystem& fs = words.img.fs();
  const uint64_t ino = MustCreate(fs, kRoot, "f");
  auto file = fs.Open(ino, O_RDWR);
  REQUIRE(file.ok());
  DirectRun runs[64];
  auto alloc = fs.DirectAllocate(ino, 0, 8192, 8192, runs, 64);
  REQUIRE(alloc.ok());
  StoreIntoRuns(fs, *alloc, runs, 0, Pattern(8192, 3));
  // The client names the end of its map: any value, the largest included.
  uint64_t seq = alloc->seq;
  for (const uint64_t map_end : {~uint64_t{0}, ~uint64_t{0} - 100, uint64_t{1} << 63}) {
    auto commit = fs.DirectCommit(ino, 0, 8192, seq, map_end, runs, 64);
    REQUIRE(commit.ok());
    seq = commit->seq;
    // From the block holding the last byte written: it is there, mapped.
    REQUIRE(commit->run_count >= 1);
    CHECK(commit->start == 4096);
    CHECK(runs[0].offset != kDirectHole);
    CHECK(runs[0].len >= 4096);
  }
  fs.Release(*file);
}

TEST_CASE("appends by word: a process that keeps moving the word holds no close", "[fs]") {
  std::unique_ptr<DirectSlot[]> table(new DirectSlot[64]());
  ImmediateGrace grace;
  FsImage img;
  img.Unmount();
  auto opened = OpenMedia(img.path(), MediaOptions{});
  REQUIRE(opened.ok());
  auto moving = std::make_unique<MovingWordMedia>(std::move(*opened));
  MovingWordMedia& media = *moving;
  auto mounted = Filesystem::Mount(std::move(moving), MountOptions{});
  REQUIRE(mounted.ok());
  Filesystem& fs = **mounted;
  fs.SetDirectTable(table.get(), 64);
  fs.SetExternalGrace(&grace);
  fs.SetAppendWords(true);
  const uint64_t ino = MustCreate(fs, kRoot, "f");
  auto file = fs.Open(ino, O_RDWR);
  REQUIRE(file.ok());
  DirectRun runs[64];
  auto alloc = fs.DirectAllocate(ino, 0, 4096, 1ull << 20, runs, 64);
  REQUIRE(alloc.ok());
  StoreIntoRuns(fs, *alloc, runs, 0, Pattern(4096, 5));
  auto commit = fs.DirectCommit(ino, 0, 4096, alloc->seq, 1ull << 20, runs, 64);
  REQUIRE(commit.ok());
  REQUIRE(commit->append_opened);
  media.swaps = 0;
  SetAttrRequest truncate;
  truncate.valid = kSetSize;
  truncate.size = 0;
  REQUIRE(fs.SetAttr(ino, truncate).ok());
  // The close gave up after its bound, and closed the word anyway.
  CHECK(media.swaps.load() <= 1100);
  CHECK(WordAt(fs, commit->append_at).load() == 0);
  auto attr = fs.GetAttr(ino);
  REQUIRE(attr.ok());
  CHECK(attr->size == 0);
  fs.Release(*file);
  REQUIRE(fs.Unmount().ok());
}

}  // namespace
}  // namespace nvfs::test
