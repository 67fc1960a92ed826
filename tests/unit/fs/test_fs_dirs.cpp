// The filesystem core through its C++ API (meson test 'fs'): directories
// (src/fs/readdir.cpp, src/dir/ through the core) — listings of large
// directories and their cookies, a thousand names on one hash value, and
// directories changed by several threads at once.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "forced_name_hash.hpp"
#include "fs_image.hpp"
#include "nvfs/format.hpp"
#include "nvfs/name_hash.hpp"
#include "test_fs.hpp"

namespace nvfs::test {
namespace {

TEST_CASE("readdir lists a large directory completely, cookies survive changes", "[fs]") {
  FsImage img(256ull << 20);
  Filesystem& fs = img.fs();
  const uint64_t d = MustMkdir(fs, kRoot, "big");
  for (int i = 0; i < 5000; ++i) {
    auto a = fs.Mknod(d, "n" + std::to_string(i), S_IFREG | 0644, 0, kCred);
    REQUIRE(a.ok());
  }
  std::set<std::string> seen;
  uint64_t cookie = 0;
  int taken = 0;
  REQUIRE(fs.ReadDir(d, 0, [&](const Filesystem::DirEntry& e, uint64_t next) {
    seen.insert(std::string(e.name));
    cookie = next;
    return ++taken < 2500;
  }).ok());
  // Change the directory between the two halves of the listing.
  for (int i = 0; i < 500; ++i) REQUIRE(fs.Mknod(d, "late" + std::to_string(i), S_IFREG, 0, kCred).ok());
  size_t duplicates = 0;
  REQUIRE(fs.ReadDir(d, cookie, [&](const Filesystem::DirEntry& e, uint64_t) {
    if (!seen.insert(std::string(e.name)).second) ++duplicates;
    return true;
  }).ok());
  CHECK(duplicates == 0);
  for (int i = 0; i < 5000; ++i) CHECK(seen.count("n" + std::to_string(i)) == 1);
}

// Lists `dir` in calls of at most `batch(call)` entries each, each call
// resuming at the cookie of the last entry the one before took. Returns name
// -> times listed, and checks that "." and ".." come once and every cookie is
// new.
std::map<std::string, int> ListInCalls(Filesystem& fs, uint64_t dir,
                                       const std::function<size_t(int)>& batch,
                                       uint64_t cookie = 0, int* calls_made = nullptr) {
  std::map<std::string, int> seen;
  std::set<uint64_t> cookies;
  for (int call = 0;; ++call) {
    const size_t limit = batch(call);
    size_t taken = 0;
    uint64_t next = cookie;
    REQUIRE(fs.ReadDir(dir, cookie, [&](const Filesystem::DirEntry& e, uint64_t next_cookie) {
      if (taken == limit) return false;
      ++taken;
      ++seen[std::string(e.name)];
      CHECK(next_cookie != 0);
      CHECK(next_cookie < (uint64_t{1} << 63));  // a positive off_t
      CHECK(cookies.insert(next_cookie).second);
      next = next_cookie;
      return true;
    }).ok());
    if (taken == 0) {
      if (calls_made != nullptr) *calls_made = call;
      return seen;
    }
    cookie = next;
  }
}

TEST_CASE("a thousand names forced onto one hash value: created, found, listed once across "
          "split readdirs, renamed, removed; fsck clean at each stage", "[fs][collisions]") {
  // Every name, from mkfs's lost+found on, gets this hash: one collision
  // chain per directory. Version 1 refused the 65th name with ENOSPC.
  ForcedNameHash forced;
  forced.ForceAll(0x0123456789ABCDEFull);
  FsImage img;
  const uint64_t dir = MustMkdir(img.fs(), kRoot, "collisions");
  constexpr int kNames = 1000;
  // Names of 6..205 bytes, so the chain holds leaves of many fillings.
  auto name_of = [](const char* stem, int i) {
    return stem + std::to_string(i) + std::string(static_cast<size_t>(i % 200), 'x');
  };
  std::vector<uint64_t> inos;
  for (int i = 0; i < kNames; ++i) inos.push_back(MustCreate(img.fs(), dir, name_of("n", i)));
  for (int i = 0; i < kNames; ++i) {
    auto a = img->Lookup(dir, name_of("n", i));
    REQUIRE(a.ok());
    CHECK(a->ino == inos[i]);
    img->Forget(a->ino, 1);
  }
  CHECK(img->Lookup(dir, name_of("absent", 1)).code() == ENOENT);
  Attr attr;
  CHECK(img->Create(dir, name_of("n", 500), 0644, O_RDWR, kCred, &attr).code() == EEXIST);
  // One chain indeed: every cookie (key + 3) carries the same hash bits, the
  // sequence numbers 0..999 tell the names apart, and the leaves are many.
  std::set<uint64_t> seqs;
  REQUIRE(img->ReadDir(dir, 2, [&](const Filesystem::DirEntry&, uint64_t next_cookie) {
    CHECK((next_cookie - 3) >> format::kDirSeqBits == DirHash(0x0123456789ABCDEFull));
    seqs.insert((next_cookie - 3) & ((uint64_t{1} << format::kDirSeqBits) - 1));
    return true;
  }).ok());
  CHECK(seqs.size() == kNames);
  CHECK(*seqs.rbegin() == kNames - 1);
  auto dir_attr = img->GetAttr(dir);
  REQUIRE(dir_attr.ok());
  CHECK(dir_attr->size / 4096 >= 25);
  RequireFsckClean(img, "1000 creates");

  // Listed once each, in one call and split into calls of 1..97 entries that
  // resume inside the chain.
  for (int pattern = 0; pattern < 3; ++pattern) {
    INFO("pattern " << pattern);
    int calls = 0;
    const std::map<std::string, int> seen = ListInCalls(
        img.fs(), dir,
        [&](int call) -> size_t {
          if (pattern == 0) return SIZE_MAX;
          if (pattern == 1) return 1 + static_cast<size_t>(call * 37 % 97);
          return 7;
        },
        0, &calls);
    CHECK(seen.size() == kNames + 2);
    for (const auto& [name, times] : seen) CHECK(times == 1);
    CHECK(seen.count(".") == 1);
    CHECK(seen.count("..") == 1);
    if (pattern == 2) CHECK(calls >= kNames / 7);
  }
  // A cookie taken in the middle of the chain resumes there after a remount.
  uint64_t middle = 0;
  std::set<std::string> before;
  size_t count = 0;
  REQUIRE(img->ReadDir(dir, 0, [&](const Filesystem::DirEntry& e, uint64_t next_cookie) {
    if (count++ == 400) return false;
    before.insert(std::string(e.name));
    middle = next_cookie;
    return true;
  }).ok());
  img.Remount();
  const std::map<std::string, int> after = ListInCalls(img.fs(), dir, [](int) { return 13; },
                                                       middle);
  CHECK(after.size() + before.size() == kNames + 2);
  for (const auto& [name, times] : after) {
    CHECK(times == 1);
    CHECK(before.count(name) == 0);
  }

  // Renames: within the chain (every third name to a new name), onto an
  // existing name of the chain (replacing it), exchanges, and out to the root
  // (another chain of the same hash).
  std::map<std::string, uint64_t> want;  // name in dir -> ino
  for (int i = 0; i < kNames; ++i) want[name_of("n", i)] = inos[i];
  std::map<std::string, uint64_t> want_root;
  for (int i = 0; i < kNames; i += 3) {
    const std::string from = name_of("n", i), to = name_of("r", i);
    REQUIRE(img->Rename(dir, from, dir, to, 0).ok());
    want[to] = want[from];
    want.erase(from);
  }
  for (int i = 1; i < 200; i += 3) {  // n1 -> n2 replaces n2, n4 -> n5, ...
    const std::string from = name_of("n", i), to = name_of("n", i + 1);
    REQUIRE(img->Rename(dir, from, dir, to, 0).ok());
    want[to] = want[from];
    want.erase(from);
  }
  for (int i = 201; i < 261; i += 3) {  // n202 <-> n203, ...
    const std::string a = name_of("n", i + 1), b = name_of("n", i + 2);
    REQUIRE(img->Rename(dir, a, dir, b, RENAME_EXCHANGE).ok());
    std::swap(want[a], want[b]);
  }
  for (int i = 900; i < kNames; ++i) {
    const std::string name = name_of("n", i);
    if (want.count(name) == 0) continue;
    REQUIRE(img->Rename(dir, name, kRoot, name, RENAME_NOREPLACE).ok());
    want_root[name] = want[name];
    want.erase(name);
  }
  for (const auto& [name, ino] : want) {
    auto a = img->Lookup(dir, name);
    REQUIRE(a.ok());
    CHECK(a->ino == ino);
    img->Forget(a->ino, 1);
  }
  for (const auto& [name, ino] : want_root) {
    auto a = img->Lookup(kRoot, name);
    REQUIRE(a.ok());
    CHECK(a->ino == ino);
    img->Forget(a->ino, 1);
  }
  CHECK(img->Lookup(dir, name_of("n", 0)).code() == ENOENT);
  CHECK(img->Lookup(dir, name_of("n", 1)).code() == ENOENT);
  {
    const std::map<std::string, int> seen = ListInCalls(img.fs(), dir, [](int) { return 29; });
    CHECK(seen.size() == want.size() + 2);
    for (const auto& [name, times] : seen) {
      CHECK(times == 1);
      if (name != "." && name != "..") CHECK(want.count(name) == 1);
    }
  }
  RequireFsckClean(img, "renames");

  // Removed, from both ends of the chain and its middle; then the directory.
  std::vector<std::string> names;
  for (const auto& [name, ino] : want) names.push_back(name);
  std::mt19937_64 rng(1000);
  std::shuffle(names.begin(), names.end(), rng);
  for (size_t i = 0; i < names.size(); ++i) {
    REQUIRE(img->Unlink(dir, names[i]).ok());
    if (i == names.size() / 2) {
      RequireFsckClean(img, "half the unlinks");
      CHECK(ListInCalls(img.fs(), dir, [](int) { return 50; }).size() ==
            names.size() - i - 1 + 2);
    }
  }
  for (const auto& [name, ino] : want_root) REQUIRE(img->Unlink(kRoot, name).ok());
  CHECK(ListInCalls(img.fs(), dir, [](int) { return 5; }).size() == 2);
  REQUIRE(img->Rmdir(kRoot, "collisions").ok());
  RequireFsckClean(img, "the unlinks and rmdir");
}

TEST_CASE("threads on shared and separate directories", "[fs]") {
  FsImage img(256ull << 20);
  Filesystem& fs = img.fs();
  const uint64_t shared = MustMkdir(fs, kRoot, "shared");
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto own = fs.Mkdir(kRoot, "own" + std::to_string(t), 0755, kCred);
      if (!own.ok()) { ++failures; return; }
      for (int i = 0; i < 300; ++i) {
        const std::string name = "t" + std::to_string(t) + "_" + std::to_string(i);
        for (uint64_t dir : {shared, own->ino}) {
          Attr attr;
          auto h = fs.Create(dir, name, 0644, O_RDWR, kCred, &attr);
          if (!h.ok()) { ++failures; continue; }
          if (!fs.Write(*h, 0, name.data(), name.size()).ok()) ++failures;
          fs.Release(*h);
        }
        if (i % 3 == 0 && !fs.Unlink(shared, name).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(List(fs, shared).size() == 2 + 4 * 200);
  img.Remount();
  for (int t = 0; t < 4; ++t) {
    auto own = img->Lookup(kRoot, "own" + std::to_string(t));
    REQUIRE(own.ok());
    CHECK(List(img.fs(), own->ino).size() == 302);
    const std::string name = "t" + std::to_string(t) + "_7";
    CHECK(ReadAll(img.fs(), img->Lookup(own->ino, name)->ino) == name);
  }
}

TEST_CASE("creates in one directory while other threads write large files", "[fs]") {
  // What the mount test "concurrent writers" does, in process: block
  // allocation for file data racing with directory growth and unlinks.
  FsImage img(256ull << 20);
  Filesystem& fs = img.fs();
  const uint64_t shared = MustMkdir(fs, kRoot, "shared");
  std::vector<std::thread> threads;
  ThreadErrors errors;
  constexpr uint64_t kFileSize = 4ull << 20;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      const std::string data(kFileSize, static_cast<char>('a' + t));
      Attr attr;
      auto h = fs.Create(kRoot, "w" + std::to_string(t), 0644, O_RDWR, kCred, &attr);
      if (!h.ok()) return errors.Add("create writer file", h.code());
      std::mt19937 rng(t);
      for (uint64_t at = 0; at < kFileSize;) {
        const uint64_t n = std::min<uint64_t>(kFileSize - at, 1 + rng() % (256 << 10));
        auto w = fs.Write(*h, at, data.data() + at, n);
        if (!w.ok()) return errors.Add("write", w.code());
        at += n;
      }
      fs.Release(*h);
      fs.Forget(attr.ino, 1);
    });
  }
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 250; ++i) {
        const std::string name = "t" + std::to_string(t) + "-" + std::to_string(i);
        Attr attr;
        auto h = fs.Create(shared, name, 0644, O_WRONLY | O_EXCL, kCred, &attr);
        if (!h.ok()) {
          errors.Add("create " + name, h.code());
          continue;
        }
        if (!fs.Write(*h, 0, name.data(), name.size()).ok()) errors.Add("write " + name, EIO);
        fs.Release(*h);
        fs.Forget(attr.ino, 1);
        if (i % 5 == 4) {
          if (Status st = fs.Unlink(shared, name); !st.ok()) errors.Add("unlink " + name, st.code());
        }
        if (i % 50 == 0) {
          auto d = fs.Mkdir(shared, "dir" + name, 0755, kCred);
          if (!d.ok()) {
            errors.Add("mkdir " + name, d.code());
          } else {
            fs.Forget(d->ino, 1);
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  errors.Check();
  CHECK(List(fs, shared).size() == 2 + 3 * 200 + 3 * 5);
  for (int t = 0; t < 3; ++t) {
    auto w = fs.Lookup(kRoot, "w" + std::to_string(t));
    REQUIRE(w.ok());
    CHECK(ReadAll(fs, w->ino) == std::string(kFileSize, static_cast<char>('a' + t)));
    fs.Forget(w->ino, 1);
  }
}

}  // namespace
}  // namespace nvfs::test
