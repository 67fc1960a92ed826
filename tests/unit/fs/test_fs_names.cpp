// The filesystem core through its C++ API (meson test 'fs'): the namespace
// (src/fs/namei.cpp) — lookups, creates of every file type, the errors users
// expect, hard and symbolic links, rename in every form, the link limit.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "fs_image.hpp"
#include "test_fs.hpp"

namespace nvfs::test {
namespace {

TEST_CASE("mkfs root holds lost+found; mkdir, create, lookup, readdir", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  auto lf = fs.Lookup(kRoot, "lost+found");
  REQUIRE(lf.ok());
  CHECK(S_ISDIR(lf->mode));
  const uint64_t d = MustMkdir(fs, kRoot, "dir");
  const uint64_t f = MustCreate(fs, d, "file", "hello world");
  auto attr = fs.Lookup(d, "file");
  REQUIRE(attr.ok());
  CHECK(attr->ino == f);
  CHECK(attr->size == 11);
  CHECK(attr->uid == 1000);
  CHECK(ReadAll(fs, f) == "hello world");
  CHECK(List(fs, d) == std::set<std::string>{".", "..", "file"});
  auto root = fs.GetAttr(kRoot);
  REQUIRE(root.ok());
  CHECK(root->nlink == 4);  // ., .., lost+found/.., dir/..
  auto dotdot = fs.Lookup(d, "..");
  REQUIRE(dotdot.ok());
  CHECK(dotdot->ino == kRoot);
}

TEST_CASE("errors users expect", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t d = MustMkdir(fs, kRoot, "d");
  const uint64_t f = MustCreate(fs, d, "f", "x");
  CHECK(fs.Lookup(d, "missing").code() == ENOENT);
  CHECK(fs.Mkdir(kRoot, "d", 0755, kCred).code() == EEXIST);
  CHECK(fs.Lookup(f, "x").code() == ENOTDIR);
  CHECK(fs.Mkdir(f, "x", 0755, kCred).code() == ENOTDIR);
  CHECK(fs.Unlink(kRoot, "d").code() == EISDIR);
  CHECK(fs.Rmdir(d, "f").code() == ENOTDIR);
  CHECK(fs.Rmdir(kRoot, "d").code() == ENOTEMPTY);
  CHECK(fs.Mkdir(kRoot, std::string(256, 'n'), 0755, kCred).code() == ENAMETOOLONG);
  CHECK(fs.Mkdir(kRoot, std::string(255, 'n'), 0755, kCred).ok());
  CHECK(fs.Link(d, kRoot, "dlink").code() == EPERM);
  const uint64_t sub = MustMkdir(fs, d, "sub");
  CHECK(fs.Rename(kRoot, "d", sub, "moved", 0).code() == EINVAL);
  CHECK(fs.Rename(kRoot, "d", kRoot, "d", RENAME_NOREPLACE | RENAME_EXCHANGE).code() == EINVAL);
  CHECK(fs.Readlink(f).code() == EINVAL);
  CHECK(fs.Symlink(kRoot, "s", std::string(5000, 't'), kCred).code() == ENAMETOOLONG);
}

TEST_CASE("hard links, symlinks and nlink", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t f = MustCreate(fs, kRoot, "f", "data");
  REQUIRE(fs.Link(f, kRoot, "g").ok());
  CHECK(fs.GetAttr(f)->nlink == 2);
  REQUIRE(fs.Unlink(kRoot, "f").ok());
  CHECK(fs.GetAttr(f)->nlink == 1);
  CHECK(ReadAll(fs, fs.Lookup(kRoot, "g")->ino) == "data");
  auto s = fs.Symlink(kRoot, "short", "target/path", kCred);
  REQUIRE(s.ok());
  CHECK(*fs.Readlink(s->ino) == "target/path");
  const std::string long_target(3000, 'L');
  auto l = fs.Symlink(kRoot, "long", long_target, kCred);
  REQUIRE(l.ok());
  CHECK(*fs.Readlink(l->ino) == long_target);
  img.Remount();
  CHECK(*img->Readlink(s->ino) == "target/path");
  CHECK(*img->Readlink(l->ino) == long_target);
}

TEST_CASE("rename in every form", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t a = MustMkdir(fs, kRoot, "a");
  const uint64_t b = MustMkdir(fs, kRoot, "b");
  MustCreate(fs, a, "x", "X");
  MustCreate(fs, b, "y", "Y");
  SECTION("new name across directories") {
    REQUIRE(fs.Rename(a, "x", b, "x2", 0).ok());
    CHECK(fs.Lookup(a, "x").code() == ENOENT);
    CHECK(ReadAll(fs, fs.Lookup(b, "x2")->ino) == "X");
  }
  SECTION("over an existing file") {
    const uint64_t y = fs.Lookup(b, "y")->ino;
    REQUIRE(fs.Rename(a, "x", b, "y", 0).ok());
    CHECK(ReadAll(fs, fs.Lookup(b, "y")->ino) == "X");
    CHECK(fs.GetAttr(y)->nlink == 0);  // still referenced by our lookup
  }
  SECTION("noreplace") {
    CHECK(fs.Rename(a, "x", b, "y", RENAME_NOREPLACE).code() == EEXIST);
  }
  SECTION("exchange") {
    REQUIRE(fs.Rename(a, "x", b, "y", RENAME_EXCHANGE).ok());
    CHECK(ReadAll(fs, fs.Lookup(a, "x")->ino) == "Y");
    CHECK(ReadAll(fs, fs.Lookup(b, "y")->ino) == "X");
  }
  SECTION("directory over an empty directory, parent links and ..") {
    const uint64_t c = MustMkdir(fs, a, "c");
    MustMkdir(fs, b, "empty");
    REQUIRE(fs.Rename(a, "c", b, "empty", 0).ok());
    CHECK(fs.Lookup(b, "empty")->ino == c);
    CHECK(fs.Lookup(c, "..")->ino == b);
    CHECK(fs.GetAttr(a)->nlink == 2);
    CHECK(fs.GetAttr(b)->nlink == 3);
  }
  SECTION("directory over a non-empty directory") {
    MustMkdir(fs, a, "c");
    const uint64_t full = MustMkdir(fs, b, "full");
    MustCreate(fs, full, "z");
    CHECK(fs.Rename(a, "c", b, "full", 0).code() == ENOTEMPTY);
    CHECK(fs.Rename(a, "x", b, "full", 0).code() == EISDIR);
    CHECK(fs.Rename(b, "full", a, "x", 0).code() == ENOTDIR);
  }
}

TEST_CASE("mknod makes every special file type; rdev kept", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const std::pair<const char*, uint32_t> kinds[] = {
      {"fifo", S_IFIFO}, {"sock", S_IFSOCK}, {"chr", S_IFCHR}, {"blk", S_IFBLK}, {"reg", S_IFREG}};
  for (auto [name, type] : kinds) {
    auto a = fs.Mknod(1, name, type | 0600, 0x0801, {0, 0});
    REQUIRE(a.ok());
    CHECK((a->mode & S_IFMT) == type);
    CHECK(a->rdev == ((type == S_IFCHR || type == S_IFBLK) ? 0x0801u : 0u));
  }
  CHECK(fs.Mknod(1, "dir", S_IFDIR | 0755, 0, {0, 0}).code() == EINVAL);
  img.Remount();
  CHECK((img->Lookup(1, "blk")->mode & S_IFMT) == S_IFBLK);
  CHECK(img->Lookup(1, "chr")->rdev == 0x0801u);
}

TEST_CASE("EMLINK at the link limit, EFBIG past the largest file", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  auto f = fs.Mknod(1, "f", S_IFREG | 0644, 0, {0, 0});
  REQUIRE(f.ok());
  const uint64_t dir = fs.Mkdir(1, "links", 0755, {0, 0})->ino;
  uint32_t nlink = 1;
  Status last;
  for (int i = 0; i < 70000; ++i) {
    auto l = fs.Link(f->ino, dir, "l" + std::to_string(i));
    if (!l.ok()) {
      last = Status(l.take_error());
      break;
    }
    fs.Forget(f->ino, 1);
    ++nlink;
  }
  CHECK(last.code() == EMLINK);
  CHECK(nlink == 65000);
  CHECK(fs.GetAttr(f->ino)->nlink == 65000);
  Attr attr;
  auto h = fs.Create(1, "big", 0644, O_RDWR, {0, 0}, &attr);
  REQUIRE(h.ok());
  CHECK(fs.Write(*h, uint64_t{1} << 62, "x", 1).code() == EFBIG);
  SetAttrRequest req;
  req.valid = kSetSize;
  req.size = uint64_t{1} << 62;
  CHECK(fs.SetAttr(attr.ino, req).code() == EFBIG);
  fs.Release(*h);
}

}  // namespace
}  // namespace nvfs::test
