// The mount suite (test_mount, tests/mount/test_mount_*.cpp): file handles as NFS
// servers use them — across a remount, stale once an inode number is
// reused, and directory handles reconnected to the root.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

// (nodeid, generation) handles as NFS uses them: after a remount the kernel
// knows no inode, so open_by_handle_at makes it ask the daemon (LOOKUP of
// "." on the node id, and ".." to reconnect a directory).
TEST_CASE("mount: file handles survive a remount (NFS export)", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  REQUIRE(mkdir(m.path("d").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("d/sub").c_str(), 0755) == 0);
  WriteFile(m.path("d/sub/kept"), "kept");
  WriteFile(m.path("gone"), "gone");
  auto handle_of = [](const std::string& path) {
    std::vector<char> buf(sizeof(file_handle) + MAX_HANDLE_SZ);
    auto* fh = reinterpret_cast<file_handle*>(buf.data());
    fh->handle_bytes = MAX_HANDLE_SZ;
    int mount_id = 0;
    INFO(path << ": " << std::strerror(errno));
    REQUIRE(name_to_handle_at(AT_FDCWD, path.c_str(), fh, &mount_id, 0) == 0);
    return buf;
  };
  std::vector<char> kept = handle_of(m.path("d/sub/kept"));
  std::vector<char> sub = handle_of(m.path("d/sub"));
  std::vector<char> gone = handle_of(m.path("gone"));
  REQUIRE(unlink(m.path("gone").c_str()) == 0);
  CHECK(m.Stop() == 0);
  m.Start();
  Fd mount_fd(m.dir(), O_RDONLY | O_DIRECTORY);
  REQUIRE(mount_fd.ok());
  auto open_handle = [&](std::vector<char>& h, int flags) {
    return open_by_handle_at(mount_fd.get(), reinterpret_cast<file_handle*>(h.data()), flags);
  };
  int fd = open_handle(kept, O_RDONLY);
  REQUIRE(fd >= 0);
  char buf[8];
  CHECK(read(fd, buf, sizeof buf) == 4);
  CHECK(std::string(buf, 4) == "kept");
  close(fd);
  fd = open_handle(sub, O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  struct stat st {};
  REQUIRE(fstat(fd, &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK(st.st_ino == Stat(m.path("d/sub")).st_ino);
  close(fd);
  CHECK(Err(open_handle(gone, O_RDONLY)) == ESTALE);
  // A new file may reuse the freed inode number, never its generation.
  for (int i = 0; i < 20; ++i) WriteFile(m.path("new" + std::to_string(i)), "new");
  CHECK(Err(open_handle(gone, O_RDONLY)) == ESTALE);
  mount_fd.Close();
  StopAndCheck(m);
}

// The cases NFS servers (ganesha's FSAL_VFS, the kernel's nfsd) meet after
// a remount, with the daemon asked about node ids it has never handed out:
// a freed inode's number taken by a new file (LOOKUP of "." answers the
// new inode, whose generation differs: ESTALE), a directory handle the
// kernel must reconnect to the root (LOOKUP of ".." up the tree, then the
// name found by READDIR), a handle of a non-directory (LOOKUP of "." on a
// file), and of a file kept open after its unlink.
TEST_CASE("mount: a handle is stale once its inode number is reused; directory handles reconnect",
          "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  // FUSE's handle (fs/fuse/inode.c, fuse_encode_fh): the node id's high and
  // low 32 bits, then the generation.
  struct Handle {
    std::vector<char> buf;
    file_handle* fh() { return reinterpret_cast<file_handle*>(buf.data()); }
    uint64_t ino() {
      uint32_t w[2];
      std::memcpy(w, fh()->f_handle, sizeof w);
      return (uint64_t{w[0]} << 32) | w[1];
    }
  };
  auto handle_of = [](const std::string& path) {
    Handle h{std::vector<char>(sizeof(file_handle) + MAX_HANDLE_SZ)};
    h.fh()->handle_bytes = MAX_HANDLE_SZ;
    int mount_id = 0;
    INFO(path << ": " << std::strerror(errno));
    REQUIRE(name_to_handle_at(AT_FDCWD, path.c_str(), h.fh(), &mount_id, 0) == 0);
    return h;
  };
  REQUIRE(mkdir(m.path("a").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("a/b").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("a/b/c").c_str(), 0755) == 0);
  WriteFile(m.path("a/b/c/file"), "file");
  WriteFile(m.path("gone"), "gone");
  WriteFile(m.path("open-unlinked"), "open");
  Handle deep = handle_of(m.path("a/b/c"));
  Handle file = handle_of(m.path("a/b/c/file"));
  Handle gone = handle_of(m.path("gone"));
  Handle unlinked = handle_of(m.path("open-unlinked"));
  CHECK(gone.ino() == Stat(m.path("gone")).st_ino);
  {
    Fd mount_fd(m.dir(), O_RDONLY | O_DIRECTORY);
    Fd held(m.path("open-unlinked"), O_RDONLY);
    REQUIRE(held.ok());
    REQUIRE(unlink(m.path("open-unlinked").c_str()) == 0);
    // Still open: the kernel knows the inode, and so does the daemon.
    const int fd = open_by_handle_at(mount_fd.get(), unlinked.fh(), O_RDONLY);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
  }
  REQUIRE(unlink(m.path("gone").c_str()) == 0);
  CHECK(m.Stop() == 0);
  m.Start();
  // A new file takes the freed number (the lowest free inode).
  bool reused = false;
  for (int i = 0; i < 64 && !reused; ++i) {
    const std::string path = m.path("new" + std::to_string(i));
    WriteFile(path, "new");
    reused = Stat(path).st_ino == gone.ino();
  }
  CHECK(reused);
  CHECK(m.Stop() == 0);
  m.Start();  // the kernel knows none of the inodes again
  Fd mount_fd(m.dir(), O_RDONLY | O_DIRECTORY);
  REQUIRE(mount_fd.ok());
  CHECK(Err(open_by_handle_at(mount_fd.get(), gone.fh(), O_RDONLY)) == ESTALE);
  // Freed at the remount (the orphan list), the open-unlinked file's too.
  CHECK(Err(open_by_handle_at(mount_fd.get(), unlinked.fh(), O_RDONLY)) == ESTALE);
  // The file first: its dentry stays disconnected (no path needed to read).
  int fd = open_by_handle_at(mount_fd.get(), file.fh(), O_RDONLY);
  REQUIRE(fd >= 0);
  char buf[8];
  CHECK(read(fd, buf, sizeof buf) == 4);
  close(fd);
  // A directory is always reconnected: its path is whole again.
  fd = open_by_handle_at(mount_fd.get(), deep.fh(), O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  char link[PATH_MAX] = {};
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  REQUIRE(readlink(proc.c_str(), link, sizeof link - 1) > 0);
  CHECK(std::string(link) == m.path("a/b/c"));
  struct stat parent {};
  REQUIRE(fstatat(fd, "..", &parent, 0) == 0);
  CHECK(parent.st_ino == Stat(m.path("a/b")).st_ino);
  close(fd);
  mount_fd.Close();
  StopAndCheck(m);
}

}  // namespace
}  // namespace nvfs::test
