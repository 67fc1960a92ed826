// The filesystem core through its C++ API (meson test 'fs'): unlinked files
// and the orphan list (src/fs/orphan.cpp) — open files that outlive their
// names, blocks freed at the unlink and inodes at the last reference, the
// reclaim at the next mount after a crash, and the list's lock.
#include <catch2/catch.hpp>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fs/fs_impl.hpp"
#include "fs_image.hpp"
#include "nvfs/format.hpp"
#include "nvfs/media.hpp"
#include "test_fs.hpp"

// An allocation failure injected where a test wants it: armed on one thread,
// the replaced operator new below fails that thread's first allocation made
// once *fail_watch no longer holds fail_unless (a value on the media). It is
// the operator new of the whole 'fs' executable; unarmed, it is malloc's.
namespace {
thread_local const volatile uint64_t* fail_watch = nullptr;
thread_local uint64_t fail_unless = 0;
std::atomic<bool> fail_fired{false};
}  // namespace

void* operator new(std::size_t size) {
  if (fail_watch != nullptr && *fail_watch != fail_unless) {
    fail_watch = nullptr;
    fail_fired.store(true);
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// The nothrow form too (ExtentMap's, the direct table's callers): otherwise
// a sanitizer's own would allocate what the delete below frees with free().
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  if (fail_watch != nullptr && *fail_watch != fail_unless) {
    fail_watch = nullptr;
    fail_fired.store(true);
    return nullptr;
  }
  return std::malloc(size == 0 ? 1 : size);
}
// The pair matches (operator new above takes from malloc); GCC, inlining
// these, cannot tell and warns.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace nvfs::test {
namespace {

TEST_CASE("unlinked but open files live until the last release", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t free_before = fs.GetStatFs()->blocks_free;
  const uint64_t ino = MustCreate(fs, kRoot, "tmp", std::string(100000, 'z'));
  auto h = fs.Open(ino, O_RDWR);
  REQUIRE(h.ok());
  REQUIRE(fs.Unlink(kRoot, "tmp").ok());
  CHECK(fs.Lookup(kRoot, "tmp").code() == ENOENT);
  char c = 0;
  REQUIRE(*fs.Read(*h, 99999, &c, 1) == 1);
  CHECK(c == 'z');
  fs.Release(*h);
  CHECK(fs.GetStatFs()->blocks_free == free_before);
}

TEST_CASE("ForgetAll frees unlinked inodes only lookups still held", "[fs]") {
  // What the daemon does when its FUSE session ends before the kernel's
  // FORGETs: the references die with the session.
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t blocks_before = fs.GetStatFs()->blocks_free;
  const uint64_t inodes_before = fs.GetStatFs()->inodes_free;
  Attr attr;
  auto h = fs.Create(kRoot, "held", 0644, O_RDWR, kCred, &attr);  // one lookup
  REQUIRE(h.ok());
  const std::string data(100000, 'h');
  REQUIRE(*fs.Write(*h, 0, data.data(), data.size()) == data.size());
  REQUIRE(fs.Lookup(kRoot, "held").ok());  // a second one
  const uint64_t kept = MustCreate(fs, kRoot, "kept", "k");
  REQUIRE(fs.LookupInode(kept).ok());
  REQUIRE(fs.Unlink(kRoot, "held").ok());
  fs.Release(*h);
  // Still referenced: the inode stays, its data went with the last release.
  CHECK(fs.GetStatFs()->inodes_free == inodes_before - 2);
  CHECK(fs.GetStatFs()->blocks_free + 2 >= blocks_before);
  fs.ForgetAll();
  CHECK(fs.GetStatFs()->inodes_free == inodes_before - 1);  // only "kept" remains
  CHECK(fs.GetStatFs()->blocks_free + 2 >= blocks_before);
  CHECK(fs.Lookup(kRoot, "kept").ok());  // still there, and usable
  fs.Forget(kept, 1);
  img.Remount();
  CHECK(img->GetStatFs()->inodes_free == inodes_before - 1);
}

TEST_CASE("an unlinked open file is reclaimed at the next mount after a crash", "[fs]") {
  FsImage img;
  const uint64_t free_before = img->GetStatFs()->blocks_free;
  const uint64_t inodes_before = img->GetStatFs()->inodes_free;
  const uint64_t ino = MustCreate(img.fs(), kRoot, "tmp", std::string(50000, 'q'));
  auto h = img->Open(ino, O_RDWR);
  REQUIRE(img->Unlink(kRoot, "tmp").ok());
  // The handle dies with the crash (released only after the crash state is taken).
  img.CrashAndMount([&](Filesystem& fs) { fs.Release(*h); });
  CHECK(img->GetStatFs()->blocks_free == free_before);
  CHECK(img->GetStatFs()->inodes_free == inodes_before);
}

// generic/511: the blocks of a removed file that no one has open are free
// when the unlink returns, not when the kernel forgets the inode (an O_PATH
// descriptor or a cached dentry can hold that off for as long as it likes);
// the inode, now an empty file, stays on the orphan list until then. Each
// state in between (and a crash in it) is a valid orphan: fsck accepts it,
// mount reclaims it.
TEST_CASE("unlink frees an unopened file's blocks at once, its inode at the forget", "[fs]") {
  FsImage img;
  const uint64_t blocks_before = img->GetStatFs()->blocks_free;
  const uint64_t inodes_before = img->GetStatFs()->inodes_free;
  const std::string data(300000, 'd');
  Attr attr;
  {
    auto f = img->Create(kRoot, "f", 0644, O_RDWR, kCred, &attr);  // one lookup, kept
    REQUIRE(f.ok());
    REQUIRE(*img->Write(*f, 0, data.data(), data.size()) == data.size());
    img->Release(*f);
  }
  REQUIRE(img->GetStatFs()->blocks_free < blocks_before);
  REQUIRE(img->Unlink(kRoot, "f").ok());
  CHECK(img->GetStatFs()->blocks_free == blocks_before);
  CHECK(img->GetStatFs()->inodes_free == inodes_before - 1);  // the inode waits
  // Opened again (as through /proc/self/fd of an O_PATH descriptor): empty.
  auto a = img->GetAttr(attr.ino);
  REQUIRE(a.ok());
  CHECK(a->size == 0);
  CHECK(a->nlink == 0);
  {
    auto h = img->Open(attr.ino, O_RDWR);
    REQUIRE(h.ok());
    char c;
    CHECK(*img->Read(*h, 0, &c, 1) == 0);
    // Written while open, the data lives until this last release.
    REQUIRE(*img->Write(*h, 0, data.data(), data.size()) == data.size());
    CHECK(img->GetStatFs()->blocks_free < blocks_before);
    img->Release(*h);
  }
  CHECK(img->GetStatFs()->blocks_free == blocks_before);
  // The orphan with no blocks is what fsck and the next mount expect.
  RequireFsckClean(img, "an unlinked, emptied orphan");  // the mount reclaimed it
  CHECK(img->GetStatFs()->inodes_free == inodes_before);
  CHECK(img->GetStatFs()->blocks_free == blocks_before);
}

TEST_CASE("unlink of an open file and rename over an unopened one: data goes at the last close",
          "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t blocks_before = fs.GetStatFs()->blocks_free;
  const uint64_t inodes_before = fs.GetStatFs()->inodes_free;
  const std::string data(200000, 'o');
  const uint64_t open_ino = MustCreate(fs, kRoot, "open", data);
  REQUIRE(fs.LookupInode(open_ino).ok());
  auto h1 = fs.Open(open_ino, O_RDONLY);
  auto h2 = fs.Open(open_ino, O_RDWR);
  REQUIRE(h1.ok());
  REQUIRE(h2.ok());
  REQUIRE(fs.Unlink(kRoot, "open").ok());
  fs.Release(*h1);
  std::string back(data.size(), '\0');
  REQUIRE(*fs.Read(*h2, 0, back.data(), back.size()) == data.size());
  CHECK(back == data);
  const uint64_t with_open = fs.GetStatFs()->blocks_free;
  CHECK(with_open < blocks_before);
  fs.Release(*h2);  // the last: the data goes, the lookup keeps the inode
  const uint64_t after_close = fs.GetStatFs()->blocks_free;
  CHECK(after_close > with_open);
  // A rename over a file the kernel still holds (a lookup).
  const uint64_t victim = MustCreate(fs, kRoot, "victim", data);
  REQUIRE(fs.LookupInode(victim).ok());
  MustCreate(fs, kRoot, "new", "n");
  const uint64_t before_rename = fs.GetStatFs()->blocks_free;
  REQUIRE(fs.Rename(kRoot, "new", kRoot, "victim", 0, kCred).ok());
  CHECK(fs.GetStatFs()->blocks_free > before_rename);
  CHECK(fs.GetAttr(victim)->size == 0);
  fs.Forget(open_ino, 1);
  fs.Forget(victim, 1);
  CHECK(fs.GetStatFs()->inodes_free == inodes_before - 1);  // "victim" (the new one)
  REQUIRE(fs.Unlink(kRoot, "victim").ok());
  CHECK(fs.GetStatFs()->blocks_free == blocks_before);
  CHECK(fs.GetStatFs()->inodes_free == inodes_before);
}

// generic/531's slow unmount: O_TMPFILE files are added at the orphan list's
// head and, closed in the order opened, removed from its tail; a walk to
// each one's predecessor made n removals O(n^2). The in-memory index of
// predecessors is checked against the list on every use: any order of
// removals leaves a sound list (fsck) and frees every inode.
TEST_CASE("orphan list: many tmpfiles released in the order made, in reverse and at random",
          "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t inodes_before = fs.GetStatFs()->inodes_free;
  constexpr int kFiles = 300;
  std::vector<std::pair<uint64_t, FileHandle>> files;
  for (int i = 0; i < kFiles; ++i) {
    Attr attr;
    auto t = fs.Tmpfile(kRoot, 0600, O_RDWR, kCred, &attr);
    REQUIRE(t.ok());
    REQUIRE(*fs.Write(*t, 0, "t", 1) == 1);
    files.emplace_back(attr.ino, *t);
  }
  // A third in the order made (each the list's tail), a third in reverse
  // (each its head), the rest at random (the middle).
  std::vector<size_t> order;
  for (size_t i = 0; i < kFiles / 3; ++i) order.push_back(i);
  for (size_t i = 2 * kFiles / 3; i-- > kFiles / 3;) order.push_back(i);
  std::vector<size_t> rest;
  for (size_t i = 2 * kFiles / 3; i < kFiles; ++i) rest.push_back(i);
  std::shuffle(rest.begin(), rest.end(), std::mt19937(531));
  order.insert(order.end(), rest.begin(), rest.end());
  for (size_t n : order) {
    auto& [ino, handle] = files[n];
    fs.Release(handle);
    fs.Forget(ino, 1);
  }
  CHECK(img->GetStatFs()->inodes_free == inodes_before);
  RequireFsckClean(img, "every tmpfile released");
}

TEST_CASE("regression: a timestamp update of an orphan raced the removal of its successor",
          "[fs]") {
  // Inode::orphan_next of the predecessor is written by OrphanRemove under
  // orphan_mu_ alone, without that inode's lock. A write to the predecessor
  // (an open, unlinked file) copied its inode, set the times and stored the
  // byte range from the first to the last difference with the media: when
  // the successor had been taken off the list in between, the range reached
  // orphan_next and put the freed successor back (check.sh's stress step,
  // once: "orphan list is damaged (a link to inode 11)").
  FsImage img;
  Filesystem& fs = img.fs();
  constexpr int kRounds = 16;
  constexpr int kSuccessors = 1000;
  for (int round = 0; round < kRounds && !fs.damage_found(); ++round) {
    CAPTURE(round);
    std::vector<std::pair<uint64_t, FileHandle>> successors;
    for (int i = 0; i < kSuccessors; ++i) {
      Attr attr;
      auto f = fs.Create(kRoot, "s" + std::to_string(i), 0644, O_RDWR, kCred, &attr);
      REQUIRE(f.ok());
      REQUIRE(fs.Unlink(kRoot, "s" + std::to_string(i)).ok());
      successors.emplace_back(attr.ino, *f);
    }
    // Last onto the list: the predecessor of every successor.
    Attr head_attr;
    auto head = fs.Create(kRoot, "head", 0644, O_RDWR, kCred, &head_attr);
    REQUIRE(head.ok());
    REQUIRE(fs.Unlink(kRoot, "head").ok());
    std::atomic<bool> done{false};
    std::atomic<int> writes{0};
    std::atomic<int> failures{0};
    std::thread writer([&] {
      char byte = 0;
      while (!done.load()) {
        ++byte;
        if (!fs.Write(*head, 0, &byte, 1).ok()) ++failures;
        ++writes;
      }
    });
    while (writes.load() == 0) std::this_thread::yield();
    // Oldest last: each one taken off is the head's successor then.
    for (auto it = successors.rbegin(); it != successors.rend(); ++it) {
      fs.Release(it->second);
      fs.Forget(it->first, 1);
    }
    done = true;
    writer.join();
    CHECK(failures.load() == 0);
    fs.Release(*head);
    fs.Forget(head_attr.ino, 1);
  }
  CHECK_FALSE(fs.damage_found());
  RequireFsckClean(img, "the orphans' reclaim");
}

// Wraps the real mapping; on the thread that armed it, the first store
// over `watch` (an abort's undo, once the injected allocation failure has
// fired) first waits, up to a bound, for another thread to take orphan_mu_.
class UndoPauseMedia final : public Media {
 public:
  explicit UndoPauseMedia(std::unique_ptr<Media> target) : target_(std::move(target)) {
    base_ = const_cast<std::byte*>(target_->base());
    size_ = target_->size();
    read_only_ = target_->read_only();
    granularity_ = target_->granularity();
    path_ = target_->path();
  }
  // The calling thread's next store over [offset, offset + 8) after the
  // failure fired waits until *taken or 300 ms. Other threads store
  // meanwhile (the adder): they read taken_, so it is atomic, and stored
  // last (release) so that a thread that sees it sees the rest.
  void Arm(uint64_t offset, const std::atomic<bool>* taken) {
    watch_ = offset;
    armed_thread_ = std::this_thread::get_id();
    taken_.store(taken, std::memory_order_release);
  }
  void Disarm() { taken_.store(nullptr); }
  void Store(uint64_t offset, const void* src, size_t len) override {
    MaybePause(offset, len);
    target_->Store(offset, src, len);
  }
  void Store64(uint64_t offset, uint64_t value) override {
    MaybePause(offset, 8);
    target_->Store64(offset, value);
  }
  bool CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) override {
    MaybePause(offset, 8);
    return target_->CompareExchange64(offset, expected, desired);
  }
  void Fill(uint64_t offset, int byte, size_t len) override { target_->Fill(offset, byte, len); }
  void Flush(uint64_t offset, size_t len) override { target_->Flush(offset, len); }
  void Drain() override { target_->Drain(); }
  void StoreFlush(uint64_t offset, const void* src, size_t len) override {
    MaybePause(offset, len);
    target_->StoreFlush(offset, src, len);
  }

 private:
  void MaybePause(uint64_t offset, size_t len) {
    const std::atomic<bool>* taken = taken_.load(std::memory_order_acquire);
    if (taken == nullptr || !fail_fired.load() || std::this_thread::get_id() != armed_thread_ ||
        offset > watch_ || offset + len < watch_ + 8) {
      return;
    }
    taken_.store(nullptr);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (!taken->load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  }

  std::unique_ptr<Media> target_;
  uint64_t watch_ = 0;
  std::atomic<const std::atomic<bool>*> taken_{nullptr};
  std::thread::id armed_thread_;
};

TEST_CASE("regression: an orphan add that failed after storing orphan_head was undone without "
          "orphan_mu_", "[fs]") {
  // Tmpfile (and SetInodeFlags, a long truncation, the damage recorder) took
  // orphan_mu_ after their Tx and so released it first: an allocation
  // failure in OrphanAdd after orphan_head was stored (its orphan_prev_
  // entry) undid that store without the lock, over another thread's orphan
  // change made in between. Here that thread waits, spinning, for the lock
  // from the moment the allocation fails, and puts a linked file on the list
  // (as a long truncation does); the list must then be that file, then what
  // was there before.
  // The undo waits (UndoPauseMedia) for the adder to take the lock, which
  // it can only while the lock is wrongly free.
  FsImage img;
  const uint64_t other = MustCreate(img.fs(), kRoot, "other");
  img.Unmount();
  auto opened = OpenMedia(img.path(), MediaOptions{});
  REQUIRE(opened.ok());
  auto pausing = std::make_unique<UndoPauseMedia>(std::move(*opened));
  UndoPauseMedia& media = *pausing;
  auto mounted = Filesystem::Mount(std::move(pausing), MountOptions{});
  REQUIRE(mounted.ok());
  FsImpl& fs = FsImpl::Of(**mounted);
  const auto& dyn = *reinterpret_cast<const format::SuperDynamic*>(
      fs.media().base() + format::kSuperDynamicOffset);
  const format::Inode& other_inode = fs.context().InodeAt(other);
  constexpr int kRounds = 4;
  int wrong = 0;
  for (int round = 0; round < kRounds && wrong == 0; ++round) {
    CAPTURE(round);
    fail_fired = false;
    std::atomic<bool> taken{false};
    std::atomic<bool> added{false};
    std::thread adder([&] {
      OrphanTx tx(fs, "test-orphan-add");
      while (!fail_fired.load()) std::this_thread::yield();
      tx.LockOrphans();
      taken = true;
      fs.OrphanAdd(tx, other);
      added = tx.Commit().ok();
    });
    const uint64_t head = dyn.orphan_head;
    media.Arm(format::kSuperDynamicOffset + offsetof(format::SuperDynamic, orphan_head), &taken);
    fail_unless = head;
    fail_watch = &dyn.orphan_head;
    Attr attr;
    CHECK_THROWS_AS(fs.Tmpfile(kRoot, 0644, O_RDWR, kCred, &attr), std::bad_alloc);
    fail_watch = nullptr;
    media.Disarm();
    fail_fired = true;  // the adder goes on even if nothing failed
    adder.join();
    REQUIRE(added);
    OrphanTx tx(fs, "test-orphan-remove");
    tx.LockOrphans();
    if (dyn.orphan_head != other || other_inode.orphan_next != head ||
        !(other_inode.flags & format::kInodeFlagOrphan)) {
      FAIL_CHECK("orphan_head " << dyn.orphan_head << " (want " << other << "), its next "
                                << other_inode.orphan_next << " (want " << head << "), flags "
                                << other_inode.flags);
      ++wrong;
      break;
    }
    REQUIRE(fs.OrphanRemove(tx, other).ok());
    REQUIRE(tx.Commit().ok());
  }
  CHECK(wrong == 0);
  CHECK_FALSE(fs.damage_found());
  REQUIRE(fs.Unmount().ok());
  mounted->reset();
  if (wrong == 0) RequireFsckClean(img, "the failed tmpfiles");
}

}  // namespace
}  // namespace nvfs::test
