// The mount suite (test_mount, tests/mount/test_mount_*.cpp): the namespace through
// the kernel — the errno of each misuse, hard links and link counts,
// symlinks, rename in every form, and a 10,000-entry directory listed while
// it changes.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdint>
#include <set>
#include <string>

#include "helpers.hpp"
#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

TEST_CASE("mount: errno table for misuse", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  const std::string f = m.path("file"), d = m.path("dir"), missing = m.path("missing");
  WriteFile(f, "x");
  REQUIRE(mkdir(d.c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("dir/sub").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("empty").c_str(), 0755) == 0);
  WriteFile(m.path("dir/inner"), "y");

  // ENOENT
  CHECK(Err(open(missing.c_str(), O_RDONLY)) == ENOENT);
  CHECK(Err(access(missing.c_str(), F_OK)) == ENOENT);
  CHECK(Err(unlink(missing.c_str())) == ENOENT);
  CHECK(Err(rmdir(missing.c_str())) == ENOENT);
  CHECK(Err(rename(missing.c_str(), m.path("other").c_str())) == ENOENT);
  CHECK(Err(open(m.path("missing/x").c_str(), O_CREAT | O_WRONLY, 0644)) == ENOENT);
  CHECK(Err(link(missing.c_str(), m.path("l").c_str())) == ENOENT);
  char buf[64];
  CHECK(Err(readlink(missing.c_str(), buf, sizeof buf)) == ENOENT);
  // EEXIST
  CHECK(Err(mkdir(d.c_str(), 0755)) == EEXIST);
  CHECK(Err(mkdir(f.c_str(), 0755)) == EEXIST);
  CHECK(Err(open(f.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644)) == EEXIST);
  CHECK(Err(link(f.c_str(), m.path("dir/inner").c_str())) == EEXIST);
  CHECK(Err(symlink("t", f.c_str())) == EEXIST);
  CHECK(Err(mknod(f.c_str(), S_IFIFO | 0644, 0)) == EEXIST);
  // ENOTDIR
  CHECK(Err(open(m.path("file/x").c_str(), O_RDONLY)) == ENOTDIR);
  CHECK(Err(mkdir(m.path("file/x").c_str(), 0755)) == ENOTDIR);
  CHECK(Err(rmdir(f.c_str())) == ENOTDIR);
  CHECK(Err(open(f.c_str(), O_RDONLY | O_DIRECTORY)) == ENOTDIR);
  CHECK(Err(rename(m.path("empty").c_str(), f.c_str())) == ENOTDIR);
  // EISDIR
  CHECK(Err(open(d.c_str(), O_WRONLY)) == EISDIR);
  CHECK(Err(open(d.c_str(), O_RDWR)) == EISDIR);
  CHECK(Err(unlink(d.c_str())) == EISDIR);
  CHECK(Err(rename(f.c_str(), m.path("empty").c_str())) == EISDIR);
  // ENOTEMPTY
  CHECK(Err(rmdir(d.c_str())) == ENOTEMPTY);
  CHECK(Err(rename(m.path("empty").c_str(), d.c_str())) == ENOTEMPTY);
  // ENAMETOOLONG: 255 bytes is the limit.
  const std::string name255(255, 'n'), name256(256, 'n');
  WriteFile(m.path(name255), "ok");
  CHECK(ReadAll(m.path(name255)) == "ok");
  CHECK(Err(open(m.path(name256).c_str(), O_CREAT | O_WRONLY, 0644)) == ENAMETOOLONG);
  CHECK(Err(mkdir(m.path(name256).c_str(), 0755)) == ENAMETOOLONG);
  CHECK(Err(access(m.path(name256).c_str(), F_OK)) == ENAMETOOLONG);
  CHECK(Err(rename(f.c_str(), m.path(name256).c_str())) == ENAMETOOLONG);
  // EINVAL: a directory into its own subtree; readlink of a non-symlink.
  CHECK(Err(rename(d.c_str(), m.path("dir/sub/d").c_str())) == EINVAL);
  CHECK(Err(rename(d.c_str(), m.path("dir/d").c_str())) == EINVAL);
  CHECK(Err(readlink(f.c_str(), buf, sizeof buf)) == EINVAL);
  CHECK(Err(rmdir(m.path("dir/.").c_str())) == EINVAL);
  // EPERM: hard links to directories.
  CHECK(Err(link(d.c_str(), m.path("dlink").c_str())) == EPERM);
  // EXDEV: across filesystems (decided by the kernel, not the daemon).
  const std::string outside = "/dev/shm/nvfs-mt-xdev-" + std::to_string(getpid());
  CHECK(Err(rename(f.c_str(), outside.c_str())) == EXDEV);
  CHECK(Err(link(f.c_str(), outside.c_str())) == EXDEV);
  // ELOOP
  REQUIRE(symlink("loop2", m.path("loop1").c_str()) == 0);
  REQUIRE(symlink("loop1", m.path("loop2").c_str()) == 0);
  CHECK(Err(open(m.path("loop1").c_str(), O_RDONLY)) == ELOOP);
  REQUIRE(symlink("file", m.path("tofile").c_str()) == 0);
  CHECK(Err(open(m.path("tofile").c_str(), O_RDONLY | O_NOFOLLOW)) == ELOOP);
  // EBADF: the access mode of the descriptor.
  {
    Fd ro(f, O_RDONLY), wo(f, O_WRONLY);
    REQUIRE(ro.ok());
    REQUIRE(wo.ok());
    CHECK(Err(write(ro.get(), "z", 1)) == EBADF);
    CHECK(Err(read(wo.get(), buf, 1)) == EBADF);
    // ENXIO: SEEK_DATA and SEEK_HOLE at or past the end.
    CHECK(Err(lseek(ro.get(), 100, SEEK_DATA)) == ENXIO);
    CHECK(Err(lseek(ro.get(), 1, SEEK_HOLE)) == ENXIO);
    CHECK(Err(ftruncate(wo.get(), -1)) == EINVAL);
    // fallocate modes nvfs does not have; a read-only descriptor.
    CHECK(Err(fallocate(wo.get(), FALLOC_FL_COLLAPSE_RANGE, 0, 4096)) == EOPNOTSUPP);
    CHECK(Err(fallocate(wo.get(), FALLOC_FL_INSERT_RANGE, 0, 4096)) == EOPNOTSUPP);
    CHECK(Err(fallocate(ro.get(), 0, 0, 4096)) == EBADF);
  }
  // An unknown xattr namespace.
  CHECK(Err(setxattr(f.c_str(), "bogus.name", "v", 1, 0)) == EOPNOTSUPP);
  StopAndCheck(m);
}

TEST_CASE("mount: hard links and link counts", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  WriteFile(m.path("a"), "abc");
  const struct stat a0 = Stat(m.path("a"));
  CHECK(a0.st_nlink == 1);
  REQUIRE(link(m.path("a").c_str(), m.path("b").c_str()) == 0);
  REQUIRE(link(m.path("a").c_str(), m.path("d/c").c_str()) == 0);
  for (const char* name : {"a", "b", "d/c"}) {
    const struct stat st = Stat(m.path(name));
    CHECK(st.st_ino == a0.st_ino);
    CHECK(st.st_nlink == 3);
  }
  {
    Fd fd(m.path("d/c"), O_WRONLY | O_APPEND);
    REQUIRE(fd.ok());
    REQUIRE(write(fd.get(), "def", 3) == 3);
  }
  CHECK(ReadAll(m.path("a")) == "abcdef");
  REQUIRE(unlink(m.path("b").c_str()) == 0);
  CHECK(Stat(m.path("a")).st_nlink == 2);
  CHECK(Stat(m.path("d/c")).st_nlink == 2);
  REQUIRE(unlink(m.path("a").c_str()) == 0);
  CHECK(Stat(m.path("d/c")).st_nlink == 1);
  CHECK(ReadAll(m.path("d/c")) == "abcdef");
  // Many links to one inode.
  for (int i = 0; i < 100; ++i) {
    REQUIRE(link(m.path("d/c").c_str(), m.path("d/l" + std::to_string(i)).c_str()) == 0);
  }
  CHECK(Stat(m.path("d/c")).st_nlink == 101);
  for (int i = 0; i < 100; ++i) REQUIRE(unlink(m.path("d/l" + std::to_string(i)).c_str()) == 0);
  CHECK(Stat(m.path("d/c")).st_nlink == 1);

  // Directory link counts: 2 + subdirectories.
  REQUIRE(mkdir(m.path("p").c_str(), 0755) == 0);
  CHECK(Stat(m.path("p")).st_nlink == 2);
  const nlink_t root_links = Stat(m.dir()).st_nlink;
  REQUIRE(mkdir(m.path("p/s1").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("p/s2").c_str(), 0755) == 0);
  CHECK(Stat(m.path("p")).st_nlink == 4);
  REQUIRE(rmdir(m.path("p/s1").c_str()) == 0);
  CHECK(Stat(m.path("p")).st_nlink == 3);
  REQUIRE(mkdir(m.path("q").c_str(), 0755) == 0);
  CHECK(Stat(m.dir()).st_nlink == root_links + 1);
  REQUIRE(rmdir(m.path("q").c_str()) == 0);
  CHECK(Stat(m.dir()).st_nlink == root_links);
  StopAndCheck(m);
}

TEST_CASE("mount: symlinks", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  char buf[5000];
  REQUIRE(symlink("target", m.path("s").c_str()) == 0);
  ssize_t n = readlink(m.path("s").c_str(), buf, sizeof buf);
  REQUIRE(n == 6);
  CHECK(std::string(buf, 6) == "target");
  struct stat st = Stat(m.path("s"));
  CHECK(S_ISLNK(st.st_mode));
  CHECK(st.st_size == 6);
  CHECK(Err(stat(m.path("s").c_str(), &st)) == ENOENT);  // dangling
  WriteFile(m.path("target"), "through the link");
  CHECK(ReadAll(m.path("s")) == "through the link");
  // Targets past the inline limit, up to the maximum.
  for (size_t len : {129, 1000, 4095}) {
    std::string target(len, 'x');
    for (size_t i = 0; i < len; i += 50) target[i] = '/';
    const std::string name = m.path("long" + std::to_string(len));
    REQUIRE(symlink(target.c_str(), name.c_str()) == 0);
    n = readlink(name.c_str(), buf, sizeof buf);
    REQUIRE(n == static_cast<ssize_t>(len));
    CHECK(std::string(buf, len) == target);
    CHECK(Stat(name).st_size == static_cast<off_t>(len));
  }
  CHECK(Err(symlink(std::string(4096, 'y').c_str(), m.path("toolong").c_str())) == ENAMETOOLONG);
  // Through a directory symlink, and to an absolute path outside.
  REQUIRE(mkdir(m.path("dir").c_str(), 0755) == 0);
  WriteFile(m.path("dir/f"), "inside");
  REQUIRE(symlink("dir", m.path("sd").c_str()) == 0);
  CHECK(ReadAll(m.path("sd/f")) == "inside");
  REQUIRE(symlink("/proc/self/exe", m.path("abs").c_str()) == 0);
  CHECK(Stat(m.path("abs")).st_size == 14);
  // Removing the link leaves the target.
  REQUIRE(unlink(m.path("s").c_str()) == 0);
  CHECK(ReadAll(m.path("target")) == "through the link");
  // lchown on the link itself.
  REQUIRE(lchown(m.path("sd").c_str(), 123, 456) == 0);
  CHECK(Stat(m.path("sd")).st_uid == 123);
  CHECK(Stat(m.path("dir")).st_uid == 0);
  CHECK(m.Stop() == 0);
  m.Start();
  n = readlink(m.path("long4095").c_str(), buf, sizeof buf);
  CHECK(n == 4095);
  CHECK(ReadAll(m.path("sd/f")) == "inside");
  StopAndCheck(m);
}

TEST_CASE("mount: rename in every form", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  auto p = [&](const std::string& rel) { return m.path(rel); };

  // A new name in the same directory.
  WriteFile(p("a"), "A");
  const ino_t a_ino = Stat(p("a")).st_ino;
  REQUIRE(rename(p("a").c_str(), p("b").c_str()) == 0);
  CHECK_FALSE(PathExists(p("a")));
  CHECK(Stat(p("b")).st_ino == a_ino);
  CHECK(ReadAll(p("b")) == "A");

  // Over an existing file, which lives on while open.
  WriteFile(p("x"), "X");
  WriteFile(p("y"), "Y");
  {
    Fd old_y(p("y"), O_RDONLY);
    REQUIRE(old_y.ok());
    REQUIRE(rename(p("x").c_str(), p("y").c_str()) == 0);
    CHECK_FALSE(PathExists(p("x")));
    CHECK(ReadAll(p("y")) == "X");
    char c = 0;
    CHECK(pread(old_y.get(), &c, 1, 0) == 1);
    CHECK(c == 'Y');
    struct stat st {};
    REQUIRE(fstat(old_y.get(), &st) == 0);
    CHECK(st.st_nlink == 0);
  }

  // Over an empty directory.
  REQUIRE(mkdir(p("d1").c_str(), 0755) == 0);
  REQUIRE(mkdir(p("d2").c_str(), 0755) == 0);
  WriteFile(p("d1/f"), "in d1");
  const ino_t d1_ino = Stat(p("d1")).st_ino;
  const nlink_t root_links = Stat(m.dir()).st_nlink;
  REQUIRE(rename(p("d1").c_str(), p("d2").c_str()) == 0);
  CHECK(Stat(p("d2")).st_ino == d1_ino);
  CHECK_FALSE(PathExists(p("d1")));
  CHECK(ReadAll(p("d2/f")) == "in d1");
  CHECK(Stat(m.dir()).st_nlink == root_links - 1);

  // Across directories: a file and a directory (whose ".." follows).
  REQUIRE(mkdir(p("A").c_str(), 0755) == 0);
  REQUIRE(mkdir(p("B").c_str(), 0755) == 0);
  REQUIRE(mkdir(p("A/sub").c_str(), 0755) == 0);
  WriteFile(p("A/f"), "moved");
  REQUIRE(rename(p("A/f").c_str(), p("B/g").c_str()) == 0);
  CHECK(ReadAll(p("B/g")) == "moved");
  CHECK(Stat(p("A")).st_nlink == 3);
  REQUIRE(rename(p("A/sub").c_str(), p("B/sub2").c_str()) == 0);
  CHECK(Stat(p("A")).st_nlink == 2);
  CHECK(Stat(p("B")).st_nlink == 3);
  CHECK(Stat(p("B/sub2/..")).st_ino == Stat(p("B")).st_ino);
  CHECK(ListDir(p("A")) == std::set<std::string>{".", ".."});
  CHECK(ListDir(p("B")) == std::set<std::string>{".", "..", "g", "sub2"});

  // RENAME_NOREPLACE
  WriteFile(p("n1"), "1");
  WriteFile(p("n2"), "2");
  CHECK(Err(RenameAt2(p("n1"), p("n2"), RENAME_NOREPLACE)) == EEXIST);
  CHECK(ReadAll(p("n2")) == "2");
  REQUIRE(RenameAt2(p("n1"), p("n3"), RENAME_NOREPLACE) == 0);
  CHECK(ReadAll(p("n3")) == "1");

  // RENAME_EXCHANGE: a file and a directory, then two directories across
  // parents (each ".." follows, the parents' link counts stay).
  WriteFile(p("e1"), "one");
  REQUIRE(mkdir(p("e2").c_str(), 0755) == 0);
  WriteFile(p("e2/child"), "c");
  REQUIRE(RenameAt2(p("e1"), p("e2"), RENAME_EXCHANGE) == 0);
  CHECK(S_ISDIR(Stat(p("e1")).st_mode));
  CHECK(ReadAll(p("e1/child")) == "c");
  CHECK(ReadAll(p("e2")) == "one");
  CHECK(Err(RenameAt2(p("e2"), p("nothing"), RENAME_EXCHANGE)) == ENOENT);
  CHECK(Err(RenameAt2(p("e2"), p("e1"), RENAME_EXCHANGE | RENAME_NOREPLACE)) == EINVAL);
  REQUIRE(mkdir(p("A/x").c_str(), 0755) == 0);
  REQUIRE(mkdir(p("B/y").c_str(), 0755) == 0);
  const nlink_t a_links = Stat(p("A")).st_nlink, b_links = Stat(p("B")).st_nlink;
  REQUIRE(RenameAt2(p("A/x"), p("B/y"), RENAME_EXCHANGE) == 0);
  CHECK(Stat(p("A/x/..")).st_ino == Stat(p("A")).st_ino);
  CHECK(Stat(p("B/y/..")).st_ino == Stat(p("B")).st_ino);
  CHECK(Stat(p("A")).st_nlink == a_links);
  CHECK(Stat(p("B")).st_nlink == b_links);

  // Onto itself, and onto another name of the same inode: nothing happens.
  REQUIRE(rename(p("b").c_str(), p("b").c_str()) == 0);
  REQUIRE(link(p("b").c_str(), p("b2").c_str()) == 0);
  REQUIRE(rename(p("b").c_str(), p("b2").c_str()) == 0);
  CHECK(PathExists(p("b")));
  CHECK(PathExists(p("b2")));
  CHECK(Stat(p("b")).st_nlink == 2);

  // Refusals.
  WriteFile(p("file"), "f");
  REQUIRE(mkdir(p("full").c_str(), 0755) == 0);
  WriteFile(p("full/x"), "x");
  CHECK(Err(rename(p("A").c_str(), p("file").c_str())) == ENOTDIR);
  CHECK(Err(rename(p("file").c_str(), p("A").c_str())) == EISDIR);
  CHECK(Err(rename(p("A").c_str(), p("full").c_str())) == ENOTEMPTY);
  CHECK(Err(rename(p("B").c_str(), p("B/y/inside").c_str())) == EINVAL);

  CHECK(m.Stop() == 0);
  m.Start();
  CHECK(ReadAll(p("B/g")) == "moved");
  CHECK(ReadAll(p("e2")) == "one");
  CHECK(Stat(p("B/sub2/..")).st_ino == Stat(p("B")).st_ino);
  StopAndCheck(m);
}

TEST_CASE("mount: a 10,000-entry directory lists completely", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  const std::string d = m.path("big");
  REQUIRE(mkdir(d.c_str(), 0755) == 0);
  constexpr int kEntries = 10000;
  auto name = [](int i) {
    return "entry-" + std::to_string(i) + "-" + std::string(static_cast<size_t>(i % 40), 'p');
  };
  std::set<std::string> expected{".", ".."};
  for (int i = 0; i < kEntries; ++i) {
    const std::string n = name(i);
    REQUIRE(mknod((d + "/" + n).c_str(), S_IFREG | 0644, 0) == 0);
    expected.insert(n);
  }
  CHECK(ListDir(d) == expected);
  CHECK(Stat(m.path("big/" + name(1234))).st_size == 0);

  // A listing that runs while entries come and go: every entry present
  // throughout shows exactly once, none that never existed shows.
  std::set<std::string> stable = expected, ever = expected;
  DIR* dir = opendir(d.c_str());
  REQUIRE(dir != nullptr);
  std::multiset<std::string> seen;
  for (int i = 0; i < 300; ++i) {
    dirent* e = readdir(dir);
    REQUIRE(e != nullptr);
    seen.insert(e->d_name);
  }
  for (int i = 0; i < kEntries; i += 3) {
    REQUIRE(unlink((d + "/" + name(i)).c_str()) == 0);
    stable.erase(name(i));
    expected.erase(name(i));
  }
  for (int i = kEntries; i < kEntries + 2000; ++i) {
    REQUIRE(mknod((d + "/" + name(i)).c_str(), S_IFREG | 0644, 0) == 0);
    ever.insert(name(i));
    expected.insert(name(i));
  }
  while (dirent* e = readdir(dir)) seen.insert(e->d_name);
  closedir(dir);
  for (const std::string& n : stable) {
    INFO(n);
    CHECK(seen.count(n) == 1);
  }
  for (const std::string& n : seen) {
    INFO(n);
    CHECK(ever.count(n) == 1);
    CHECK(seen.count(n) == 1);
  }
  CHECK(ListDir(d) == expected);
  CHECK(m.Stop() == 0);
  m.Start();
  const uint64_t inodes_free = StatFs(m.dir()).f_ffree;
  CHECK(ListDir(d) == expected);  // readdirplus: a reference per entry
  // Every reference readdirplus handed out comes back (FORGET): removed
  // entries' inodes are freed while mounted.
  for (const std::string& n : expected) {
    if (n != "." && n != "..") REQUIRE(unlink((d + "/" + n).c_str()) == 0);
  }
  CHECK(ListDir(d) == std::set<std::string>{".", ".."});
  CHECK(Eventually([&] { return StatFs(m.dir()).f_ffree == inodes_free + expected.size() - 2; }));
  StopAndCheck(m);
}

}  // namespace
}  // namespace nvfs::test
