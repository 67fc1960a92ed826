// The filesystem core through its C++ API (meson test 'fs'): a file's bytes
// (src/fs/write.cpp, read.cpp, fallocate.cpp, truncate.cpp) — writes and the
// three read paths, sparse files, truncation, fallocate, punch and zero
// range, a full filesystem, the largest file.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "fs/fs_impl.hpp"
#include "fs_image.hpp"
#include "journal/journal.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/validate.hpp"
#include "test_fs.hpp"

namespace nvfs::test {
namespace {

TEST_CASE("write, read paths, sparse files and truncate", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t ino = MustCreate(fs, kRoot, "f");
  auto h = fs.Open(ino, O_RDWR);
  REQUIRE(h.ok());
  std::string data(3 * 4096 + 100, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>('a' + i % 26);
  REQUIRE(*fs.Write(*h, 5000, data.data(), data.size()) == data.size());
  auto attr = fs.GetAttr(ino);
  CHECK(attr->size == 5000 + data.size());
  std::string out(attr->size + 10, 'X');
  REQUIRE(*fs.Read(*h, 0, out.data(), out.size()) == attr->size);
  CHECK(out.substr(0, 5000) == std::string(5000, '\0'));
  CHECK(out.substr(5000, data.size()) == data);
  // read_iter with uneven segments gives the same bytes.
  std::string a(777, 'Y'), b(5000, 'Y'), c(20000, 'Y');
  iovec iov[3] = {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  auto n = fs.ReadIter(*h, 0, iov, 3);
  REQUIRE(n.ok());
  CHECK(*n == attr->size);
  CHECK((a + b + c).substr(0, *n) == out.substr(0, *n));
  // map: the runs cover the same bytes.
  {
    ReadRun runs[16];
    size_t count = 0;
    const MapGuard held;
    auto m = fs.Map(*h, 100, 20000, runs, 16, &count, held);
    REQUIRE(m.ok());
    std::string mapped;
    for (size_t i = 0; i < count; ++i) mapped.append(static_cast<const char*>(runs[i].data), runs[i].len);
    CHECK(mapped == out.substr(100, *m));
  }
  // Past EOF: nothing.
  CHECK(*fs.Read(*h, attr->size, out.data(), 10) == 0);
  // Truncate down then up: the cut bytes read back as zeros.
  SetAttrRequest req;
  req.valid = kSetSize;
  req.size = 6000;
  REQUIRE(fs.SetAttr(ino, req).ok());
  req.size = 9000;
  REQUIRE(fs.SetAttr(ino, req).ok());
  std::string after(9000, 'X');
  REQUIRE(*fs.Read(*h, 0, after.data(), after.size()) == 9000);
  CHECK(after.substr(5000, 1000) == data.substr(0, 1000));
  CHECK(after.substr(6000) == std::string(3000, '\0'));
  fs.Release(*h);
}

TEST_CASE("a write at 1 TiB on a small namespace costs a few blocks", "[fs]") {
  FsImage img(64ull << 20);
  Filesystem& fs = img.fs();
  const uint64_t ino = MustCreate(fs, kRoot, "sparse");
  const uint64_t free_before = fs.GetStatFs()->blocks_free;
  auto h = fs.Open(ino, O_RDWR);
  const uint64_t tib = 1ull << 40;
  REQUIRE(*fs.Write(*h, tib, "end", 3) == 3);
  CHECK(fs.GetAttr(ino)->size == tib + 3);
  CHECK(free_before - fs.GetStatFs()->blocks_free <= 6);
  char buf[8] = {};
  CHECK(*fs.Read(*h, tib - 2, buf, 8) == 5);
  CHECK(std::string(buf, 5) == std::string("\0\0end", 5));
  auto data = fs.Lseek(*h, 0, SEEK_DATA);
  REQUIRE(data.ok());
  CHECK(*data == tib);
  CHECK(*fs.Lseek(*h, 0, SEEK_HOLE) == 0);
  fs.Release(*h);
  img.Remount();
  CHECK(img->GetAttr(ino)->size == tib + 3);
}

TEST_CASE("a full filesystem keeps its reserve for a mapping's pages and their write-back",
          "[fs]") {
  FsImage img(16ull << 20);
  Filesystem& fs = img.fs();
  const uint64_t sparse = MustCreate(fs, kRoot, "sparse");
  auto map = fs.Open(sparse, O_RDWR);
  REQUIRE(map.ok());
  SetAttrRequest grow;
  grow.valid = kSetSize;
  grow.size = 256 * 1024;  // a hole
  REQUIRE(fs.SetAttr(sparse, grow).ok());
  // Nothing to do without a hole; a read-only handle is refused.
  const uint64_t plain = MustCreate(fs, kRoot, "plain", std::string(8192, 'p'));
  auto plain_h = fs.Open(plain, O_RDONLY);
  REQUIRE(plain_h.ok());
  CHECK(fs.BackMappedRange(*plain_h, 0, 8192).code() == EBADF);
  fs.Release(*plain_h);
  // Ordinary writes stop where the reserve begins.
  const uint64_t fill = MustCreate(fs, kRoot, "fill");
  auto h = fs.Open(fill, O_RDWR);
  REQUIRE(h.ok());
  const std::string chunk(64 * 1024, 'f');
  uint64_t at = 0;
  for (;;) {
    auto n = fs.Write(*h, at, chunk.data(), chunk.size());
    if (!n.ok()) {
      CHECK(n.code() == ENOSPC);
      break;
    }
    at += *n;
    if (*n < chunk.size()) break;
  }
  const StatFs full = *fs.GetStatFs();
  CHECK(full.blocks_avail == 0);
  const uint64_t reserve = ReserveBlocks(full);
  INFO("free " << full.blocks_free << ", reserve " << reserve);
  CHECK(full.blocks_free + 16 >= reserve);
  CHECK(full.blocks_free <= reserve + 16);
  // A page fill's blocks come out of the reserve: zeros still, no time moved.
  const Attr before = *fs.GetAttr(sparse);
  REQUIRE(fs.BackMappedRange(*map, 4096, 128 * 1024).ok());
  const Attr after = *fs.GetAttr(sparse);
  // 32 blocks of data (and a pointer block, maybe).
  CHECK(after.blocks >= before.blocks + 128 * 1024 / 512);
  CHECK(after.blocks <= before.blocks + 128 * 1024 / 512 + 8);
  CHECK(after.size == before.size);
  CHECK(after.mtime.tv_sec == before.mtime.tv_sec);
  CHECK(after.mtime.tv_nsec == before.mtime.tv_nsec);
  CHECK(after.ctime.tv_nsec == before.ctime.tv_nsec);
  std::string back(256 * 1024, 'x');
  REQUIRE(*fs.Read(*map, 0, back.data(), back.size()) == back.size());
  CHECK(back == std::string(256 * 1024, '\0'));
  CHECK(*fs.Lseek(*map, 0, SEEK_DATA) == 4096);
  // The rest of the file past the size is left alone.
  REQUIRE(fs.BackMappedRange(*map, 200 * 1024, 1 << 20).ok());
  CHECK(fs.GetAttr(sparse)->blocks >= after.blocks + (256 - 200) * 1024 / 512);
  CHECK(fs.GetAttr(sparse)->blocks <= after.blocks + (256 - 200) * 1024 / 512 + 8);
  // A write-back (kAtOffset) may take the reserve; an ordinary write may not.
  CHECK(fs.Write(*h, at + (1 << 20), "x", 1).code() == ENOSPC);
  const uint64_t other = MustCreate(fs, kRoot, "other");
  auto o = fs.Open(other, O_RDWR);
  REQUIRE(o.ok());
  auto wb = fs.Write(*o, 0, chunk.data(), 8192, kAtOffset);
  REQUIRE(wb.ok());
  CHECK(*wb == 8192);
  fs.Release(*o);
  fs.Release(*h);
  fs.Release(*map);
  img.Remount();
  CHECK(img->GetAttr(sparse)->size == 256 * 1024);
}

TEST_CASE("with every journal slot taken, what changes nothing goes on and an unlink waits",
          "[fs]") {
  FsImage img(16ull << 20);
  Filesystem& fs = img.fs();
  const std::string data(20000, 'j');
  const uint64_t ino = MustCreate(fs, kRoot, "f", data);
  (void)MustCreate(fs, kRoot, "gone", "x");
  Journal& journal = FsImpl::Of(fs).context().journal;
  std::vector<std::unique_ptr<Tx>> held;
  for (uint32_t i = 0; i < fs.geometry().journal_slots(); ++i) {
    held.push_back(std::make_unique<Tx>(journal, "held"));
  }
  // None of these takes a slot: done at once (a thread, so a wait fails
  // the test instead of hanging it).
  auto reads = std::async(std::launch::async, [&] {
    auto h = fs.Open(ino, O_RDONLY);
    if (!h.ok()) return 1;
    std::string back(data.size(), '\0');
    auto n = fs.Read(*h, 0, back.data(), back.size());
    if (!n.ok() || back != data) return 2;
    if (!fs.Fsync(*h).ok()) return 3;
    fs.Release(*h);
    if (!fs.GetAttr(ino).ok() || !fs.GetStatFs().ok()) return 4;
    char value[8];
    if (fs.GetXattr(ino, "user.none", value, sizeof value).code() != ENODATA) return 5;
    int names = 0;
    if (!fs.ReadDir(kRoot, 0, [&](const Filesystem::DirEntry&, uint64_t) {
               ++names;
               return true;
             }).ok() ||
        names < 4) {
      return 6;
    }
    if (!fs.Lookup(kRoot, "f").ok()) return 7;
    return 0;
  });
  const bool at_once = reads.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!at_once) held.clear();  // so the waiting call ends, and the test with it
  REQUIRE(at_once);
  CHECK(reads.get() == 0);
  // An unlink needs a slot: it waits for one, then succeeds.
  auto removal = std::async(std::launch::async, [&] { return fs.Unlink(kRoot, "gone").ok(); });
  CHECK(removal.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
  held.clear();  // each aborts, its slot free
  REQUIRE(removal.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(removal.get());
  CHECK(fs.Lookup(kRoot, "gone").code() == ENOENT);
}

TEST_CASE("ENOSPC leaves the filesystem consistent and recoverable", "[fs]") {
  FsImage img(16ull << 20);
  Filesystem& fs = img.fs();
  const uint64_t keep = MustCreate(fs, kRoot, "keep", "precious");
  const uint64_t free_before = fs.GetStatFs()->blocks_free;
  std::vector<uint64_t> files;
  std::string chunk(256 * 1024, 'f');
  bool full = false;
  for (int i = 0; i < 200 && !full; ++i) {
    Attr attr;
    auto h = fs.Create(kRoot, "fill" + std::to_string(i), 0644, O_RDWR, kCred, &attr);
    if (!h.ok()) {
      CHECK(h.code() == ENOSPC);
      break;
    }
    files.push_back(attr.ino);
    fs.Forget(attr.ino, 1);
    auto n = fs.Write(*h, 0, chunk.data(), chunk.size());
    if (!n.ok() || *n < chunk.size()) {
      full = true;
      if (!n.ok()) CHECK(n.code() == ENOSPC);
    }
    fs.Release(*h);
  }
  REQUIRE(full);
  CHECK(ReadAll(fs, keep) == "precious");
  for (size_t i = 0; i < files.size(); ++i) {
    REQUIRE(fs.Unlink(kRoot, "fill" + std::to_string(i)).ok());
  }
  CHECK(fs.GetStatFs()->blocks_free == free_before);
  const uint64_t again = MustCreate(fs, kRoot, "again", chunk);
  CHECK(ReadAll(fs, again) == chunk);
  img.Remount();
  CHECK(ReadAll(img.fs(), keep) == "precious");
}

TEST_CASE("fallocate and punch hole", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t ino = MustCreate(fs, kRoot, "f", std::string(40000, 'p'));
  auto h = fs.Open(ino, O_RDWR);
  REQUIRE(fs.Fallocate(*h, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, 20000).ok());
  std::string out(40000, 'X');
  REQUIRE(*fs.Read(*h, 0, out.data(), out.size()) == 40000);
  CHECK(out.substr(0, 1000) == std::string(1000, 'p'));
  CHECK(out.substr(1000, 20000) == std::string(20000, '\0'));
  CHECK(out.substr(21000) == std::string(19000, 'p'));
  REQUIRE(fs.Fallocate(*h, 0, 0, 100000).ok());
  CHECK(fs.GetAttr(ino)->size == 100000);
  REQUIRE(fs.Fallocate(*h, FALLOC_FL_KEEP_SIZE, 0, 200000).ok());
  CHECK(fs.GetAttr(ino)->size == 100000);
  CHECK(fs.Fallocate(*h, FALLOC_FL_PUNCH_HOLE, 0, 10).code() == EOPNOTSUPP);
  fs.Release(*h);
}

TEST_CASE("fallocate zero range", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  // 40000 bytes of data, then a hole up to 60000 (the size), so the range
  // zeroed below covers partial blocks, whole mapped blocks and a hole.
  const uint64_t ino = MustCreate(fs, kRoot, "f", std::string(40000, 'z'));
  auto h = fs.Open(ino, O_RDWR);
  REQUIRE(fs.SetAttr(ino, [] {
                SetAttrRequest r;
                r.valid = kSetSize;
                r.size = 60000;
                return r;
              }()).ok());
  const uint64_t blocks_before = fs.GetAttr(ino)->blocks;
  REQUIRE(fs.Fallocate(*h, FALLOC_FL_ZERO_RANGE, 1000, 55000).ok());
  std::string out(60000, 'X');
  REQUIRE(*fs.Read(*h, 0, out.data(), out.size()) == 60000);
  CHECK(out.substr(0, 1000) == std::string(1000, 'z'));
  CHECK(out.substr(1000) == std::string(59000, '\0'));
  CHECK(fs.GetAttr(ino)->size == 60000);
  // The hole inside the range got blocks, as with a plain fallocate.
  CHECK(fs.GetAttr(ino)->blocks > blocks_before);
  // Past the end: the size grows, unless KEEP_SIZE.
  REQUIRE(fs.Fallocate(*h, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 50000, 30000).ok());
  CHECK(fs.GetAttr(ino)->size == 60000);
  REQUIRE(fs.Fallocate(*h, FALLOC_FL_ZERO_RANGE, 59000, 11000).ok());
  CHECK(fs.GetAttr(ino)->size == 70000);
  out.assign(70000, 'X');
  REQUIRE(*fs.Read(*h, 0, out.data(), out.size()) == 70000);
  CHECK(out.substr(1000) == std::string(69000, '\0'));
  CHECK(fs.Fallocate(*h, FALLOC_FL_ZERO_RANGE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 10)
            .code() == EOPNOTSUPP);
  fs.Release(*h);
  img.Remount();
  CHECK(ReadAll(img.fs(), ino) == std::string(1000, 'z') + std::string(69000, '\0'));
}

TEST_CASE("regression: a file of 64 KiB blocks could reach 2^63 bytes (a negative st_size)",
          "[fs]") {
  // The core capped a file at max_blocks() << block_shift, 2^63 with
  // blocks of 8 KiB and more, while fsck and doc/format.md say 2^63 - 1:
  // every size and offset now stops at FileMapLayout::max_size().
  for (uint32_t bs = format::kMinBlockSize; bs <= format::kMaxBlockSize; bs <<= 1) {
    INFO("block size " << bs);
    uint32_t shift = 0;
    while ((uint32_t{1} << shift) < bs) ++shift;
    const uint64_t max = FileMapLayout(shift).max_size();
    CHECK(max <= uint64_t{INT64_MAX});
    FsImage img(64ull << 20, bs);
    Filesystem& fs = img.fs();
    const uint64_t ino = MustCreate(fs, kRoot, "big");
    auto h = fs.Open(ino, O_RDWR);
    REQUIRE(h.ok());
    SetAttrRequest req;
    req.valid = kSetSize;
    req.size = max + 1;
    CHECK(fs.SetAttr(ino, req).code() == EFBIG);
    req.size = max;
    REQUIRE(fs.SetAttr(ino, req).ok());
    CHECK(fs.GetAttr(ino)->size == max);
    CHECK(static_cast<int64_t>(fs.GetAttr(ino)->size) >= 0);
    req.size = 0;
    REQUIRE(fs.SetAttr(ino, req).ok());

    const char two[2] = {'a', 'b'};
    CHECK(fs.Write(*h, max, two, 1).code() == EFBIG);
    auto n = fs.Write(*h, max - 1, two, 2);  // cut short at the limit
    REQUIRE(n.ok());
    CHECK(*n == 1);
    CHECK(fs.GetAttr(ino)->size == max);
    CHECK(fs.Fallocate(*h, 0, max - 1, 2).code() == EFBIG);
    CHECK(fs.Fallocate(*h, 0, max, 1).code() == EFBIG);
    CHECK(fs.Fallocate(*h, 0, max - bs, bs).ok());
    CHECK(fs.GetAttr(ino)->size == max);
    CHECK(static_cast<int64_t>(fs.GetAttr(ino)->size) >= 0);
    fs.Release(*h);
    RequireFsckClean(img, "a file of the largest size");
    CHECK(img->GetAttr(ino)->size == max);
  }
}

}  // namespace
}  // namespace nvfs::test
