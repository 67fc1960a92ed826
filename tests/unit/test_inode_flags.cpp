// chattr's attributes (Filesystem::GetInodeFlags/SetInodeFlags and the
// rules of immutable and append-only files), RENAME_WHITEOUT and Tmpfile,
// in the core.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdio.h>
#include <sys/stat.h>

#include <string>

#include "fs_image.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fsck.hpp"

namespace nvfs::test {
namespace {

const Cred kRoot{0, 0};
const Cred kOwner{1000, 1000};
const Cred kOther{1001, 1001};

uint64_t MakeFile(Filesystem& fs, uint64_t parent, const std::string& name,
                  const std::string& content = "", const Cred& cred = kOwner) {
  Attr attr;
  auto f = fs.Create(parent, name, 0644, O_RDWR, cred, &attr);
  REQUIRE(f.ok());
  if (!content.empty()) REQUIRE(fs.Write(*f, 0, content.data(), content.size()).ok());
  fs.Release(*f);
  fs.Forget(attr.ino, 1);
  return attr.ino;
}

uint64_t MakeDir(Filesystem& fs, uint64_t parent, const std::string& name) {
  auto attr = fs.Mkdir(parent, name, 0755, kOwner);
  REQUIRE(attr.ok());
  fs.Forget(attr->ino, 1);
  return attr->ino;
}

// fsck.nvfs -n (the library) finds nothing to say about the unmounted image.
void RequireFsckClean(FsImage& img) {
  img.Unmount();
  MediaOptions options;
  options.read_only = true;
  auto media = OpenMedia(img.path(), options);
  REQUIRE(media.ok());
  std::string first;
  const FsckReport report = CheckNamespace(**media, RepairMode::kNone, [&](const std::string& l) {
    if (first.empty()) first = l;
  });
  INFO("fsck: " << first);
  CHECK(report.exit_code == kFsckClean);
}

int Code(const Status& st) { return st.ok() ? 0 : st.code(); }
template <class T>
int Code(const Result<T>& r) {
  return r.ok() ? 0 : r.code();
}

}  // namespace

TEST_CASE("inode flags: who may set which, and what GETFLAGS shows", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t f = MakeFile(fs, 1, "f", "x");
  CHECK(*fs.GetInodeFlags(f) == 0);
  // The owner may set the plain flags, not i or a; another user nothing.
  CHECK(Code(fs.SetInodeFlags(f, FS_NODUMP_FL | FS_NOATIME_FL | FS_SYNC_FL, kOwner)) == 0);
  CHECK(*fs.GetInodeFlags(f) == (FS_NODUMP_FL | FS_NOATIME_FL | FS_SYNC_FL));
  CHECK(Code(fs.SetInodeFlags(f, FS_IMMUTABLE_FL, kOwner)) == EPERM);
  CHECK(Code(fs.SetInodeFlags(f, FS_APPEND_FL, kOwner)) == EPERM);
  CHECK(Code(fs.SetInodeFlags(f, 0, kOther)) == EPERM);
  // Bits nvfs does not keep.
  CHECK(Code(fs.SetInodeFlags(f, FS_COMPR_FL, kRoot)) == EOPNOTSUPP);
  CHECK(Code(fs.SetInodeFlags(f, FS_EXTENT_FL, kRoot)) == EOPNOTSUPP);
  // Root sets i; while immutable only i may change.
  CHECK(Code(fs.SetInodeFlags(f, FS_IMMUTABLE_FL | FS_NODUMP_FL, kRoot)) == 0);
  CHECK(Code(fs.SetInodeFlags(f, FS_IMMUTABLE_FL, kRoot)) == EPERM);
  CHECK(Code(fs.SetInodeFlags(f, FS_NODUMP_FL, kRoot)) == 0);
  CHECK(*fs.GetInodeFlags(f) == FS_NODUMP_FL);
  // Only files and directories.
  auto fifo = fs.Mknod(1, "fifo", S_IFIFO | 0644, 0, kOwner);
  REQUIRE(fifo.ok());
  CHECK(Code(fs.GetInodeFlags(fifo->ino)) == ENOTTY);
  CHECK(Code(fs.SetInodeFlags(fifo->ino, 0, kRoot)) == ENOTTY);
  // Kept on the media beside the orphan mark, across a remount; fsck is content.
  REQUIRE(fs.SetInodeFlags(f, FS_APPEND_FL | FS_NODUMP_FL, kRoot).ok());
  img.Remount();
  CHECK(*img->GetInodeFlags(f) == (FS_APPEND_FL | FS_NODUMP_FL));
  RequireFsckClean(img);
}

TEST_CASE("inode flags: an immutable file changes in nothing", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t d = MakeDir(fs, 1, "d");
  const uint64_t f = MakeFile(fs, d, "f", "frozen");
  auto open_before = fs.Open(f, O_RDWR);  // opened before the flag
  REQUIRE(open_before.ok());
  REQUIRE(fs.SetInodeFlags(f, FS_IMMUTABLE_FL, kRoot).ok());

  CHECK(Code(fs.Open(f, O_WRONLY)) == EPERM);
  CHECK(Code(fs.Write(*open_before, 0, "y", 1)) == EPERM);
  CHECK(Code(fs.Fallocate(*open_before, 0, 0, 4096)) == EPERM);
  CHECK(Code(fs.Fallocate(*open_before, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 1)) == EPERM);
  SetAttrRequest size;
  size.valid = kSetSize;
  CHECK(Code(fs.SetAttr(f, size)) == EPERM);
  SetAttrRequest mode;
  mode.valid = kSetMode;
  mode.mode = 0600;
  CHECK(Code(fs.SetAttr(f, mode)) == EPERM);
  SetAttrRequest now;
  now.valid = kSetAtimeNow | kSetMtimeNow;
  CHECK(Code(fs.SetAttr(f, now)) == EPERM);
  CHECK(Code(fs.SetXattr(f, "user.a", "1", 1, 0)) == EPERM);
  CHECK(Code(fs.RemoveXattr(f, "user.a")) == EPERM);
  CHECK(Code(fs.Unlink(d, "f")) == EPERM);
  CHECK(Code(fs.Rename(d, "f", 1, "g", 0)) == EPERM);
  CHECK(Code(fs.Link(f, 1, "g")) == EPERM);
  const uint64_t other = MakeFile(fs, 1, "other", "o");
  CHECK(Code(fs.Rename(1, "other", d, "f", 0)) == EPERM);  // over it
  CHECK(Code(fs.Rename(1, "other", d, "f", RENAME_EXCHANGE)) == EPERM);
  (void)other;
  fs.Release(*open_before);

  // An immutable directory: no name added or removed.
  REQUIRE(fs.SetInodeFlags(f, 0, kRoot).ok());
  REQUIRE(fs.SetInodeFlags(d, FS_IMMUTABLE_FL, kRoot).ok());
  Attr attr;
  CHECK(Code(fs.Create(d, "new", 0644, O_RDWR, kOwner, &attr)) == EPERM);
  CHECK(Code(fs.Mkdir(d, "sub", 0755, kOwner)) == EPERM);
  CHECK(Code(fs.Unlink(d, "f")) == EPERM);
  CHECK(Code(fs.Rename(d, "f", 1, "moved", 0)) == EPERM);
  CHECK(Code(fs.Rename(1, "other", d, "other", 0)) == EPERM);
  CHECK(Code(fs.Tmpfile(d, 0600, O_RDWR, kOwner, &attr)) == EPERM);
  // Reads go on.
  auto ro = fs.Open(f, O_RDONLY);
  REQUIRE(ro.ok());
  char buf[8] = {};
  CHECK(*fs.Read(*ro, 0, buf, sizeof buf) == 6);
  fs.Release(*ro);
  REQUIRE(fs.SetInodeFlags(d, 0, kRoot).ok());
  CHECK(fs.Unlink(d, "f").ok());
}

TEST_CASE("inode flags: an append-only file takes bytes only at its end", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t f = MakeFile(fs, 1, "log", "one\n");
  REQUIRE(fs.SetInodeFlags(f, FS_APPEND_FL, kRoot).ok());
  CHECK(Code(fs.Open(f, O_WRONLY)) == EPERM);
  CHECK(Code(fs.Open(f, O_WRONLY | O_APPEND | O_TRUNC)) == EPERM);
  // O_APPEND left out of the core's flags by a cache=page adapter still counts.
  auto quiet = fs.Open(f, O_WRONLY, kOpenAppend);
  REQUIRE(quiet.ok());
  fs.Release(*quiet);
  auto app = fs.Open(f, O_WRONLY | O_APPEND);
  REQUIRE(app.ok());
  CHECK(*fs.Write(*app, 0, "two\n", 4) == 4);  // lands at the end
  // A page written back at its own offset (kAtOffset) must be at the end.
  CHECK(Code(fs.Write(*app, 0, "X", 1, kAtOffset)) == EPERM);
  CHECK(*fs.Write(*app, 8, "3\n", 2, kAtOffset) == 2);
  CHECK(Code(fs.Fallocate(*app, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4)) == EPERM);
  CHECK(fs.Fallocate(*app, FALLOC_FL_KEEP_SIZE, 0, 8192).ok());
  CHECK(fs.GetAttr(f)->size == 10);
  // Plain allocation may grow it (vfs_fallocate refuses only other modes).
  CHECK(fs.Fallocate(*app, 0, 0, 8192).ok());
  fs.Release(*app);
  SetAttrRequest size;
  size.valid = kSetSize;
  CHECK(Code(fs.SetAttr(f, size)) == EPERM);
  SetAttrRequest times;
  times.valid = kSetAtime | kSetMtime;
  CHECK(Code(fs.SetAttr(f, times)) == EPERM);
  SetAttrRequest now;
  now.valid = kSetAtimeNow | kSetMtimeNow;
  CHECK(fs.SetAttr(f, now).ok());  // touch: allowed, as on ext4
  CHECK(Code(fs.SetXattr(f, "user.a", "1", 1, 0)) == EPERM);
  CHECK(Code(fs.Unlink(1, "log")) == EPERM);
  CHECK(Code(fs.Rename(1, "log", 1, "log2", 0)) == EPERM);
  CHECK(Code(fs.Link(f, 1, "log2")) == EPERM);
  CHECK(fs.GetAttr(f)->size == 8192);

  // An append-only directory takes new names and keeps the old.
  const uint64_t d = MakeDir(fs, 1, "d");
  MakeFile(fs, d, "old");
  REQUIRE(fs.SetInodeFlags(d, FS_APPEND_FL, kRoot).ok());
  MakeFile(fs, d, "new");
  CHECK(Code(fs.Unlink(d, "old")) == EPERM);
  CHECK(Code(fs.Rename(d, "old", 1, "out", 0)) == EPERM);
  MakeFile(fs, 1, "in");
  CHECK(fs.Rename(1, "in", d, "in", 0).ok());
  MakeFile(fs, 1, "over");
  CHECK(Code(fs.Rename(1, "over", d, "in", 0)) == EPERM);  // would drop "in"
  // EPERM before ENOTEMPTY, as the kernel's may_delete (fstests generic/079).
  const uint64_t full = MakeDir(fs, d, "full");
  MakeFile(fs, full, "x");
  CHECK(Code(fs.Rmdir(d, "full")) == EPERM);
}

TEST_CASE("rename whiteout: the old name becomes a 0:0 character device in one step", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t d = MakeDir(fs, 1, "d");
  const uint64_t f = MakeFile(fs, 1, "f", "bytes");
  const uint64_t target = MakeFile(fs, d, "t", "old");
  (void)target;
  const auto free_inodes = fs.GetStatFs()->inodes_free;
  REQUIRE(fs.Rename(1, "f", d, "t", RENAME_WHITEOUT, kOther).ok());
  auto wh = fs.Lookup(1, "f");
  REQUIRE(wh.ok());
  CHECK(wh->mode == S_IFCHR);
  CHECK(wh->rdev == 0);
  CHECK(wh->uid == kOther.uid);
  CHECK(wh->nlink == 1);
  fs.Forget(wh->ino, 1);
  auto moved = fs.Lookup(d, "t");
  REQUIRE(moved.ok());
  CHECK(moved->ino == f);
  fs.Forget(moved->ino, 1);
  // The replaced target is gone and the whiteout took an inode: even.
  CHECK(fs.GetStatFs()->inodes_free == free_inodes);
  // A directory, with NOREPLACE; its parent's link count follows.
  const uint64_t sub = MakeDir(fs, 1, "sub");
  (void)sub;
  const uint32_t root_links = fs.GetAttr(1)->nlink;
  CHECK(Code(fs.Rename(1, "sub", d, "t", RENAME_WHITEOUT | RENAME_NOREPLACE)) == EEXIST);
  REQUIRE(fs.Rename(1, "sub", d, "sub", RENAME_WHITEOUT | RENAME_NOREPLACE).ok());
  CHECK(fs.GetAttr(1)->nlink == root_links - 1);
  CHECK(fs.GetAttr(d)->nlink == 3);
  // EXCHANGE goes with neither.
  CHECK(Code(fs.Rename(1, "f", d, "t", RENAME_WHITEOUT | RENAME_EXCHANGE)) == EINVAL);
  CHECK(Code(fs.Rename(1, "f", d, "t", 1u << 3)) == EINVAL);
  RequireFsckClean(img);
}

TEST_CASE("tmpfile: unnamed until linked, freed if never linked, also after a crash", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const auto free_blocks = fs.GetStatFs()->blocks_free;
  const auto free_inodes = fs.GetStatFs()->inodes_free;
  Attr attr;
  auto t = fs.Tmpfile(1, 0640, O_RDWR, kOwner, &attr);
  REQUIRE(t.ok());
  CHECK(attr.nlink == 0);
  CHECK(attr.mode == (S_IFREG | 0640));
  REQUIRE(*fs.Write(*t, 0, "anonymous", 9) == 9);
  CHECK(fs.ReadDir(1, 0, [&](const Filesystem::DirEntry& e, uint64_t) {
    CHECK(e.ino != attr.ino);
    return true;
  }).ok());
  // Linked: a name, off the orphan list; survives its release and a crash.
  auto linked = fs.Link(attr.ino, 1, "named");
  REQUIRE(linked.ok());
  CHECK(linked->nlink == 1);
  fs.Forget(attr.ino, 2);
  fs.Release(*t);
  // A second one, never linked, written and released: freed at once.
  Attr gone;
  auto u = fs.Tmpfile(1, 0600, O_RDWR, kOwner, &gone);
  REQUIRE(u.ok());
  const std::string big(1 << 20, 'x');
  REQUIRE(*fs.Write(*u, 0, big.data(), big.size()) == big.size());
  fs.Forget(gone.ino, 1);
  fs.Release(*u);
  // A third, left open at a crash: the mount reclaims it.
  Attr open_at_crash;
  auto v = fs.Tmpfile(1, 0600, O_RDWR, kOwner, &open_at_crash);
  REQUIRE(v.ok());
  REQUIRE(*fs.Write(*v, 0, big.data(), big.size()) == big.size());
  // An unlinked file that was not made by Tmpfile gets no name back.
  const uint64_t plain = MakeFile(fs, 1, "plain");
  auto held = fs.Open(plain, O_RDONLY);
  REQUIRE(held.ok());
  REQUIRE(fs.Unlink(1, "plain").ok());
  CHECK(Code(fs.Link(plain, 1, "back")) == ENOENT);
  // The handles a crash drops (given back after the crash state is taken).
  img.CrashAndMount([&](Filesystem& crashed) {
    crashed.Release(*v);
    crashed.Release(*held);
  });
  auto named = img->Lookup(1, "named");
  REQUIRE(named.ok());
  CHECK(named->nlink == 1);
  img->Forget(named->ino, 1);
  auto f = img->Open(named->ino, O_RDONLY);
  REQUIRE(f.ok());
  char buf[16] = {};
  CHECK(*img->Read(*f, 0, buf, sizeof buf) == 9);
  CHECK(std::string(buf) == "anonymous");
  img->Release(*f);
  // Only "named" (one inode, one block) is left of the three.
  CHECK(img->GetStatFs()->inodes_free == free_inodes - 1);
  CHECK(img->GetStatFs()->blocks_free == free_blocks - 1);
  RequireFsckClean(img);
}

}  // namespace nvfs::test
