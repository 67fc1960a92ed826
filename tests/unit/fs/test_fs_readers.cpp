// The filesystem core through its C++ API (meson test 'fs'): what readers
// see while the file changes under them (src/fs/read.cpp, extent_map.cpp) —
// extent maps against a model through every kind of change, maps replaced
// under readers, lock-free reads of reused blocks, runs held by a MapGuard.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fs_image.hpp"
#include "nvfs/fs.hpp"
#include "test_fs.hpp"

namespace nvfs::test {
namespace {

// The read paths use a file's extent map once reads have paid for it, and
// the map must never outlive the mapping it describes. Every kind of change
// (writes into holes and past the end, punch, zero range, fallocate,
// truncation both ways) is followed by enough reads to rebuild the map, and
// every read is checked against a model through all three paths. With a
// map limited to 3 runs, reads past its coverage go through the bmap.
TEST_CASE("extent maps: every read path agrees with a model through every kind of change",
          "[fs]") {
  const uint32_t block_size = GENERATE(4096u, 65536u);
  const uint32_t map_runs = GENERATE(1u << 16, 3u);
  CAPTURE(block_size, map_runs);
  FsImage img(256ull << 20, block_size);
  img.mount_options.extent_map_runs = map_runs;
  img.Remount();
  Filesystem& fs = img.fs();
  Attr attr, other_attr;
  auto f = fs.Create(1, "f", 0644, O_RDWR, kCred, &attr);
  auto other = fs.Create(1, "other", 0644, O_RDWR, kCred, &other_attr);
  REQUIRE(f.ok());
  REQUIRE(other.ok());
  std::string model;
  std::mt19937_64 rng(block_size + map_runs);
  const auto pick = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  const uint64_t span = 64ull * block_size;

  const auto check_reads = [&](int round) {
    for (int i = 0; i < 48; ++i) {
      const uint64_t offset = pick(model.size() + block_size);
      const size_t len = 1 + pick(i % 3 == 0 ? 16 * block_size : 2 * block_size);
      std::string expect;
      if (offset < model.size()) expect = model.substr(offset, len);
      CAPTURE(round, i, offset, len, model.size());
      std::string got(len, '\x55');
      auto n = fs.Read(*f, offset, got.data(), len);
      REQUIRE(n.ok());
      got.resize(*n);
      REQUIRE(got == expect);
      // read_iter: three uneven segments.
      std::string iter(len, '\x55');
      const size_t a = len / 3, b = len / 2;
      iovec iov[3] = {{iter.data(), a}, {iter.data() + a, b - a}, {iter.data() + b, len - b}};
      auto m = fs.ReadIter(*f, offset, iov, 3);
      REQUIRE(m.ok());
      iter.resize(*m);
      REQUIRE(iter == expect);
      // map: the runs, concatenated.
      ReadRun runs[64];
      size_t count = 0;
      const MapGuard held;
      auto k = fs.Map(*f, offset, len, runs, 64, &count, held);
      REQUIRE(k.ok());
      std::string mapped;
      for (size_t r = 0; r < count; ++r) {
        mapped.append(reinterpret_cast<const char*>(runs[r].data), runs[r].len);
      }
      REQUIRE(*k == mapped.size());
      REQUIRE(mapped == expect.substr(0, mapped.size()));
    }
  };

  const uint64_t built_before = fs.extent_maps_built();
  for (int round = 0; round < 60; ++round) {
    const uint64_t offset = pick(span);
    const uint64_t len = 1 + pick(8 * block_size);
    switch (round % 6) {
      case 0:
      case 1: {  // a write; the other file's writes interleave, so runs break
        std::string data(len, '\0');
        for (auto& c : data) c = static_cast<char>('a' + pick(26));
        REQUIRE(*fs.Write(*f, offset, data.data(), len) == len);
        if (model.size() < offset + len) model.resize(offset + len, '\0');
        model.replace(offset, len, data);
        REQUIRE(fs.Write(*other, pick(span), data.data(), std::min<uint64_t>(len, block_size)).ok());
        break;
      }
      case 2:  // punch
        REQUIRE(fs.Fallocate(*f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, len).ok());
        if (offset < model.size()) {
          const uint64_t end = std::min<uint64_t>(model.size(), offset + len);
          std::fill(model.begin() + offset, model.begin() + end, '\0');
        }
        break;
      case 3:  // zero range, sometimes growing the file
        REQUIRE(fs.Fallocate(*f, FALLOC_FL_ZERO_RANGE | (round % 12 == 3 ? FALLOC_FL_KEEP_SIZE : 0),
                             offset, len).ok());
        if (round % 12 != 3 && model.size() < offset + len) model.resize(offset + len, '\0');
        if (offset < model.size()) {
          const uint64_t end = std::min<uint64_t>(model.size(), offset + len);
          std::fill(model.begin() + offset, model.begin() + end, '\0');
        }
        break;
      case 4:  // fallocate: blocks for holes, the same bytes
        REQUIRE(fs.Fallocate(*f, 0, offset, len).ok());
        if (model.size() < offset + len) model.resize(offset + len, '\0');
        break;
      case 5: {  // truncate down or up
        SetAttrRequest req;
        req.valid = kSetSize;
        req.size = pick(span + span / 2);
        REQUIRE(fs.SetAttr(attr.ino, req).ok());
        model.resize(req.size, '\0');
        break;
      }
    }
    check_reads(round);
  }
  // The reads paid for a map after most changes (not after all: a change
  // that left the file empty, or one read off its end, adds little work).
  CHECK(fs.extent_maps_built() - built_before >= 30);
  fs.Release(*f);
  fs.Release(*other);
}

// Readers rebuild a file's extent map after every change and replace the
// old one while other readers may still be using it: the old map is freed
// only once they are done (epoch-based reclamation). Under ASan (check.sh
// runs this suite there too) a map freed under a reader is a
// use-after-free. Each byte of the file is its pattern byte or, where
// punched, zero; readers check that too.
TEST_CASE("extent maps: replaced while other threads read through them", "[fs]") {
  FsImage img(64ull << 20);
  Filesystem& fs = img.fs();
  Attr attr;
  auto f = fs.Create(1, "f", 0644, O_RDWR, kCred, &attr);
  REQUIRE(f.ok());
  constexpr uint64_t kSize = 1 << 20;
  const auto pattern = [](uint64_t at) { return static_cast<char>('A' + at % 23); };
  std::string data(kSize, '\0');
  for (uint64_t i = 0; i < kSize; ++i) data[i] = pattern(i);
  REQUIRE(*fs.Write(*f, 0, data.data(), kSize) == kSize);
  const uint64_t built_before = fs.extent_maps_built();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, reads{0};
  std::thread writer([&] {
    std::mt19937_64 rng(7);
    for (int i = 0; i < 200; ++i) {
      const uint64_t at = (rng() % 256) * 4096, len = (1 + rng() % 8) * 4096;
      const uint64_t n = std::min(len, kSize - at);
      if (i % 2 == 0) {
        (void)fs.Fallocate(*f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, n);
      } else {
        (void)fs.Write(*f, at, data.data() + at, n);
      }
      // Enough reads for a rebuild (about 10 of these) before the next change.
      const uint64_t until = reads + 32;
      while (reads < until && bad == 0) std::this_thread::yield();
    }
    stop = true;
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::string buf(64 * 1024, '\0');
      while (!stop) {
        const uint64_t at = rng() % (kSize - buf.size());
        auto n = t == 0 ? fs.Read(*f, at, buf.data(), buf.size())
                        : [&] {
                            iovec iov[2] = {{buf.data(), 100}, {buf.data() + 100, buf.size() - 100}};
                            return fs.ReadIter(*f, at, iov, 2);
                          }();
        if (!n.ok() || *n != buf.size()) {
          ++bad;
          continue;
        }
        for (size_t i = 0; i < *n; ++i) {
          if (buf[i] != 0 && buf[i] != pattern(at + i)) {
            ++bad;
            break;
          }
        }
        ++reads;
      }
    });
  }
  writer.join();
  for (auto& r : readers) r.join();
  CHECK(bad == 0);
  CHECK(reads > 0);
  // Most changes were followed by a rebuild that retired the map before.
  CHECK(fs.extent_maps_built() - built_before > 100);
  fs.Release(*f);
}

// Readers take no lock (a sequence lock): while one thread truncates and
// rewrites file A and another fills file B (reusing A's freed blocks), a
// reader of A must only ever see A's bytes.
TEST_CASE("lock-free readers never see bytes of a block reused by another file", "[fs]") {
  FsImage img(64ull << 20);
  Filesystem& fs = img.fs();
  Attr a_attr, b_attr;
  auto a = fs.Create(1, "a", 0644, O_RDWR, {0, 0}, &a_attr);
  auto b = fs.Create(1, "b", 0644, O_RDWR, {0, 0}, &b_attr);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::string a_data(256 * 1024, 'A');
  const std::string b_data(64 * 1024, 'B');
  REQUIRE(*fs.Write(*a, 0, a_data.data(), a_data.size()) == a_data.size());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, reads{0};
  std::thread writer([&] {
    // Not before the reader runs (under load it could miss every change).
    while (reads.load() == 0) std::this_thread::yield();
    SetAttrRequest req;
    req.valid = kSetSize;
    for (int i = 0; i < 200; ++i) {
      req.size = 0;
      (void)fs.SetAttr(a_attr.ino, req);
      (void)fs.Write(*b, uint64_t(i % 8) * b_data.size(), b_data.data(), b_data.size());
      req.size = 0;
      (void)fs.SetAttr(b_attr.ino, req);
      (void)fs.Write(*a, 0, a_data.data(), a_data.size());
    }
    stop = true;
  });
  std::thread reader([&] {
    std::string buf(a_data.size(), '\0');
    while (!stop) {
      auto n = fs.Read(*a, 0, buf.data(), buf.size());
      if (!n.ok()) { ++bad; continue; }
      for (size_t i = 0; i < *n; ++i) {
        if (buf[i] != 'A') { ++bad; break; }
      }
      ++reads;
    }
  });
  writer.join();
  reader.join();
  CHECK(bad == 0);
  CHECK(reads > 0);
  fs.Release(*a);
  fs.Release(*b);
}

// The `map` path hands out pointers into the mapping that the FUSE adapter's
// reply (the kernel's copy) reads after Map returned. Blocks the file frees
// meanwhile must not go to another file until the reply is written.
TEST_CASE("map: runs held under a MapGuard keep their bytes while the file is truncated and "
          "another file needs its blocks", "[fs]") {
  FsImage img(16ull << 20);
  Filesystem& fs = img.fs();
  constexpr size_t kSize = 1 << 20;
  const std::string victim(kSize, 'V');
  const uint64_t victim_ino = MustCreate(fs, kRoot, "victim", victim);
  // Fill the rest, so the victim's blocks are the only ones a new file can get.
  {
    Attr attr;
    auto h = fs.Create(kRoot, "filler", 0644, O_RDWR, kCred, &attr);
    REQUIRE(h.ok());
    fs.Forget(attr.ino, 1);
    const std::string chunk(4096, 'f');
    for (uint64_t off = 0;; off += chunk.size()) {
      auto n = fs.Write(*h, off, chunk.data(), chunk.size());
      if (!n.ok() || *n < chunk.size()) break;
    }
    fs.Release(*h);
  }
  auto f = fs.Open(victim_ino, O_RDONLY);
  REQUIRE(f.ok());
  std::vector<ReadRun> runs(64);
  size_t count = 0;
  std::atomic<bool> other_done{false};
  std::atomic<size_t> other_written{0};
  std::thread other;
  {
    const MapGuard held;
    auto n = fs.Map(*f, 0, kSize, runs.data(), runs.size(), &count, held);
    REQUIRE(n.ok());
    REQUIRE(*n == kSize);
    std::thread truncater([&] {
      SetAttrRequest req;
      req.valid = kSetSize;
      req.size = 0;
      CHECK(fs.SetAttr(victim_ino, req).ok());
    });
    truncater.join();
    // Freed, the blocks count as free at once.
    CHECK(fs.GetStatFs()->blocks_free >= kSize / fs.block_size());
    other = std::thread([&] {
      Attr attr;
      auto h = fs.Create(kRoot, "other", 0644, O_RDWR, Cred{65534, 65534}, &attr);
      if (h.ok()) {
        fs.Forget(attr.ino, 1);
        const std::string marker(kSize, 'X');
        auto w = fs.Write(*h, 0, marker.data(), marker.size());
        other_written = w.ok() ? *w : 0;
        fs.Release(*h);
      }
      other_done = true;
    });
    // Give the other file every chance to take the blocks and fill them.
    for (int i = 0; i < 30 && !other_done; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // The new file cannot have the victim's blocks while the guard lives:
    // its write waits for them (it never fails with ENOSPC for them).
    CHECK_FALSE(other_done);
    size_t wrong = 0;
    for (size_t r = 0; r < count; ++r) {
      const char* p = static_cast<const char*>(runs[r].data);
      for (size_t i = 0; i < runs[r].len; ++i) wrong += p[i] != 'V';
    }
    CHECK(wrong == 0);
  }
  other.join();
  // Once the guard is gone, the blocks are the other file's.
  CHECK(other_written > 0);
  fs.Release(*f);
  auto other_attr = fs.Lookup(kRoot, "other");
  REQUIRE(other_attr.ok());
  CHECK(ReadAll(fs, other_attr->ino) == std::string(other_written, 'X'));
  fs.Forget(other_attr->ino, 1);
}

}  // namespace
}  // namespace nvfs::test
