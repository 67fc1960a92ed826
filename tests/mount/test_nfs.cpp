// The NFS export suite: an nvfs mount exported by nfs-ganesha (FSAL_VFS,
// the sample doc/ganesha.conf) on 127.0.0.1, with libnfs as the client
// (tests/mount/nfs_fixture.hpp). Skipped, loudly, where ganesha or /dev/fuse is
// absent. The daemon's side on its own (handles through the kernel, no
// ganesha) is test_mount's "file handles" cases.
//
// NVFS_NFS_FILE_MIB sets the size of the checksummed file (default 1024).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
// libnfs.h first: the raw headers use its EXTERN.
#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-nfs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "mount_fixture.hpp"
#include "nfs_fixture.hpp"

namespace nvfs::test {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;
// The client's user: ganesha squashes root (doc/ganesha.conf), so the
// tests write as this uid into a directory it owns.
constexpr int kUser = 4242;
constexpr const char* kUserDir = "u";

// An nvfs mount exported by ganesha, torn down in reverse order (ganesha,
// then rpcbind if it was started here, then the mount).
struct Export {
  explicit Export(uint64_t image_size = 256 * kMiB, const std::string& options = "")
      : mount(image_size),
        mount_options(options.empty() ? "allow_other" : "allow_other," + options) {
    mount.Start(mount_options);
    const std::string user_dir = mount.path(kUserDir);
    REQUIRE(mkdir(user_dir.c_str(), 0755) == 0);
    REQUIRE(chown(user_dir.c_str(), kUser, kUser) == 0);
    rpcbind = std::make_unique<Rpcbind>();
    ganesha = std::make_unique<Ganesha>(mount.dir());
    ganesha->Start();
  }
  ~Export() {
    ganesha.reset();
    rpcbind.reset();
  }
  // Stops ganesha (its open descriptors keep the mount busy), remounts
  // nvfs, starts ganesha again.
  void Remount() {
    CHECK(ganesha->Stop() == 0);
    CHECK(mount.Stop() == 0);
    mount.Start(mount_options);
    ganesha->Start();
  }
  MountedFs mount;
  const std::string mount_options;  // allow_other, and the case's own
  std::unique_ptr<Rpcbind> rpcbind;
  std::unique_ptr<Ganesha> ganesha;
};

struct stat Stat(const std::string& path) {
  struct stat st {};
  INFO(path << ": " << std::strerror(errno));
  REQUIRE(stat(path.c_str(), &st) == 0);
  return st;
}

std::string UserPath(const std::string& name) { return std::string("/") + kUserDir + "/" + name; }

// The bytes at [offset, offset + len) of a file of test data: 8-byte words
// from a counter through splitmix64, so every block differs.
void Pattern(uint64_t offset, char* out, size_t len) {
  for (size_t i = 0; i < len; i += 8) {
    uint64_t z = (offset + i) / 8 + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out + i, &z, std::min<size_t>(8, len - i));
  }
}

// A running 64-bit checksum of a byte stream, fed in pieces of multiples
// of 8 bytes.
struct Checksum {
  uint64_t h = 0xCBF29CE484222325ull;
  void Add(const char* p, size_t len) {
    for (size_t i = 0; i + 8 <= len; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0x100000001B3ull;
      h ^= h >> 29;
    }
  }
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::string NfsReadAll(NfsClient& c, const std::string& path) {
  nfsfh* fh = nullptr;
  INFO("open " << path << ": " << c.error());
  REQUIRE(nfs_open(c.get(), path.c_str(), O_RDONLY, &fh) == 0);
  std::string out;
  char buf[65536];
  for (uint64_t off = 0;; off += sizeof buf) {
    const int n = nfs_pread(c.get(), fh, off, sizeof buf, buf);
    REQUIRE(n >= 0);
    out.append(buf, static_cast<size_t>(n));
    if (n == 0) break;
  }
  nfs_close(c.get(), fh);
  return out;
}

void NfsWriteNew(NfsClient& c, const std::string& path, const std::string& data) {
  nfsfh* fh = nullptr;
  INFO("creat " << path << ": " << c.error());
  REQUIRE(nfs_creat(c.get(), path.c_str(), 0644, &fh) == 0);
  INFO("write " << path << ": " << c.error());
  REQUIRE(nfs_pwrite(c.get(), fh, 0, data.size(), data.data()) == static_cast<int>(data.size()));
  REQUIRE(nfs_close(c.get(), fh) == 0);
}

void LocalWrite(const std::string& path, const std::string& data) {
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  INFO(path << ": " << std::strerror(errno));
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()));
  close(fd);
}

std::string LocalRead(const std::string& path) {
  const std::vector<char> bytes = ReadFile(path);
  return std::string(bytes.begin(), bytes.end());
}

// Every name of `dir` as the NFS client lists it (READDIRPLUS, in as
// many replies as it takes), "." and ".." left out; inode numbers beside.
std::map<std::string, uint64_t> NfsList(NfsClient& c, const std::string& dir) {
  nfsdir* d = nullptr;
  INFO("opendir " << dir << ": " << c.error());
  REQUIRE(nfs_opendir(c.get(), dir.c_str(), &d) == 0);
  std::map<std::string, uint64_t> names;
  for (nfsdirent* e = nfs_readdir(c.get(), d); e != nullptr; e = nfs_readdir(c.get(), d)) {
    const std::string name = e->name;
    if (name == "." || name == "..") continue;
    INFO("listed twice: " << name);
    CHECK(names.emplace(name, e->inode).second);
  }
  nfs_closedir(c.get(), d);
  return names;
}

}  // namespace

TEST_CASE("nfs: create, write, read back, rename and hard links through ganesha", "[nfs]") {
  NVFS_REQUIRE_FUSE();
  NVFS_REQUIRE_GANESHA();
  const std::string cache = GENERATE(as<std::string>(), "cache=none", "cache=page");
  INFO(cache);
  Export ex(256 * kMiB, cache);
  NfsClient c(ex.mount.dir(), kUser, kUser);
  // Nothing listens beyond loopback: ganesha's NFS and MOUNT ports
  // (doc/ganesha.conf), and rpcbind's if the suite started it.
  CHECK(NonLoopbackSockets(2049).empty());
  CHECK(NonLoopbackSockets(20048).empty());
  if (ex.rpcbind->started_here()) CHECK(NonLoopbackSockets(111).empty());

  // Create and write through NFS; read back through NFS and the mount.
  std::string data(3 * kMiB + 123, '\0');
  Pattern(0, data.data(), data.size());
  NfsWriteNew(c, UserPath("f"), data);
  CHECK(NfsReadAll(c, UserPath("f")) == data);
  CHECK(LocalRead(ex.mount.path("u/f")) == data);
  struct stat st {};
  REQUIRE(stat(ex.mount.path("u/f").c_str(), &st) == 0);
  CHECK(st.st_uid == static_cast<uid_t>(kUser));  // the client's uid, not root's
  CHECK(st.st_size == static_cast<off_t>(data.size()));

  // An overwrite in the middle, seen by both sides.
  nfsfh* fh = nullptr;
  REQUIRE(nfs_open(c.get(), UserPath("f").c_str(), O_RDWR, &fh) == 0);
  REQUIRE(nfs_pwrite(c.get(), fh, kMiB, 5, "hello") == 5);
  REQUIRE(nfs_close(c.get(), fh) == 0);
  data.replace(kMiB, 5, "hello");
  CHECK(LocalRead(ex.mount.path("u/f")) == data);
  CHECK(NfsReadAll(c, UserPath("f")) == data);

  // Written on the mount, read over NFS.
  LocalWrite(ex.mount.path("u/local"), "from the mount");
  REQUIRE(chown(ex.mount.path("u/local").c_str(), kUser, kUser) == 0);
  CHECK(NfsReadAll(c, UserPath("local")) == "from the mount");

  // Rename, within a directory and across directories, and over a file.
  REQUIRE(nfs_mkdir(c.get(), UserPath("sub").c_str()) == 0);
  REQUIRE(nfs_rename(c.get(), UserPath("f").c_str(), UserPath("g").c_str()) == 0);
  nfs_stat_64 nst{};
  CHECK(nfs_stat64(c.get(), UserPath("f").c_str(), &nst) == -ENOENT);
  CHECK_FALSE(PathExists(ex.mount.path("u/f")));
  REQUIRE(nfs_rename(c.get(), UserPath("g").c_str(), UserPath("sub/g").c_str()) == 0);
  CHECK(LocalRead(ex.mount.path("u/sub/g")) == data);
  REQUIRE(nfs_rename(c.get(), UserPath("local").c_str(), UserPath("sub/g").c_str()) == 0);
  CHECK(LocalRead(ex.mount.path("u/sub/g")) == "from the mount");

  // Hard links: one inode under two names, a write through one seen
  // through the other, the count right after an unlink.
  REQUIRE(nfs_link(c.get(), UserPath("sub/g").c_str(), UserPath("h").c_str()) == 0);
  REQUIRE(nfs_stat64(c.get(), UserPath("h").c_str(), &nst) == 0);
  CHECK(nst.nfs_nlink == 2);
  struct stat g {}, h {};
  REQUIRE(stat(ex.mount.path("u/sub/g").c_str(), &g) == 0);
  REQUIRE(stat(ex.mount.path("u/h").c_str(), &h) == 0);
  CHECK(g.st_ino == h.st_ino);
  CHECK(g.st_nlink == 2);
  CHECK(nst.nfs_ino == h.st_ino);  // ganesha reports nvfs's inode numbers
  REQUIRE(nfs_open(c.get(), UserPath("h").c_str(), O_RDWR, &fh) == 0);
  REQUIRE(nfs_pwrite(c.get(), fh, 0, 4, "FROM") == 4);
  REQUIRE(nfs_close(c.get(), fh) == 0);
  CHECK(NfsReadAll(c, UserPath("sub/g")) == "FROM the mount");
  REQUIRE(nfs_unlink(c.get(), UserPath("sub/g").c_str()) == 0);
  REQUIRE(nfs_stat64(c.get(), UserPath("h").c_str(), &nst) == 0);
  CHECK(nst.nfs_nlink == 1);
  CHECK(LocalRead(ex.mount.path("u/h")) == "FROM the mount");

  // The client's root is squashed to nobody: it may not write into the
  // root directory (root's, 0755) nor into the user's directory.
  NfsClient root(ex.mount.dir(), 0, 0);
  nfsfh* denied = nullptr;
  CHECK(nfs_creat(root.get(), "/by-root", 0644, &denied) == -EACCES);
  CHECK(nfs_creat(root.get(), UserPath("by-root").c_str(), 0644, &denied) == -EACCES);
  CHECK_FALSE(PathExists(ex.mount.path("by-root")));
  // And another user may read what the mode lets it read, and no more.
  NfsClient other(ex.mount.dir(), kUser + 1, kUser + 1);
  CHECK(NfsReadAll(other, UserPath("h")) == "FROM the mount");  // 0644
  // A mode changed through NFS (by the owner) applies at once.
  REQUIRE(nfs_chmod(c.get(), UserPath("h").c_str(), 0600) == 0);
  CHECK((Stat(ex.mount.path("u/h")).st_mode & 0777) == 0600);
  nfsfh* refused = nullptr;
  CHECK(nfs_open(other.get(), UserPath("h").c_str(), O_RDONLY, &refused) == -EACCES);
  // So does one made on the mount, behind ganesha's back
  // (Attr_Expiration_Time = 0 in doc/ganesha.conf; with ganesha's default
  // of 60 s the other user went on reading for up to a minute, through a
  // descriptor ganesha keeps open), also for a READ with a handle the
  // other user already holds.
  REQUIRE(nfs_chmod(c.get(), UserPath("h").c_str(), 0644) == 0);
  CHECK(NfsReadAll(other, UserPath("h")) == "FROM the mount");
  const NfsHandle h_handle = HandleOf(other, UserPath("h"));
  CHECK(Read3(other, h_handle, 0, 4).data == "FROM");
  REQUIRE(chmod(ex.mount.path("u/h").c_str(), 0600) == 0);
  CHECK(nfs_open(other.get(), UserPath("h").c_str(), O_RDONLY, &refused) == -EACCES);
  CHECK(Read3(other, h_handle, 0, 4).status == NFS3ERR_ACCES);
  CHECK(Read3(c, h_handle, 0, 4).data == "FROM");  // the owner still reads

  CHECK(ex.ganesha->Stop() == 0);
  StopAndCheck(ex.mount);
}

TEST_CASE("nfs: a directory of 10,000 names is listed completely", "[nfs]") {
  NVFS_REQUIRE_FUSE();
  NVFS_REQUIRE_GANESHA();
  constexpr int kNames = 10000;
  Export ex;
  // Made on the mount (fast); the listing is what goes through NFS.
  const std::string dir = ex.mount.path("u/many");
  REQUIRE(mkdir(dir.c_str(), 0755) == 0);
  REQUIRE(chown(dir.c_str(), kUser, kUser) == 0);
  // Names of varied length, so entries straddle READDIR reply boundaries
  // at different places.
  auto name_of = [](int i) {
    return "n" + std::to_string(i) + std::string(static_cast<size_t>(i % 37), 'x');
  };
  std::map<std::string, uint64_t> expected;
  for (int i = 0; i < kNames; ++i) {
    const std::string name = name_of(i);
    const std::string path = dir + "/" + name;
    const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    struct stat st {};
    REQUIRE(fstat(fd, &st) == 0);
    close(fd);
    expected.emplace(name, st.st_ino);
  }
  NfsClient c(ex.mount.dir(), kUser, kUser);
  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, uint64_t> listed = NfsList(c, UserPath("many"));
  std::printf("nfs: listed %zu names in %.2f s\n", listed.size(), Seconds(t0));
  CHECK(listed.size() == expected.size());
  CHECK(listed == expected);  // every name, with its inode number

  // 100 removed through NFS: a fresh listing has exactly the rest.
  int removed = 0;
  for (int i = 0; i < kNames; i += 100, ++removed) {
    const std::string name = name_of(i);
    INFO(name << ": " << c.error());
    REQUIRE(nfs_unlink(c.get(), UserPath("many/" + name).c_str()) == 0);
    expected.erase(name);
  }
  CHECK(removed == 100);
  listed = NfsList(c, UserPath("many"));
  CHECK(listed == expected);
}

TEST_CASE("nfs: a 1 GiB file's checksum is the same written and read over NFS and on the mount",
          "[nfs]") {
  NVFS_REQUIRE_FUSE();
  NVFS_REQUIRE_GANESHA();
  uint64_t mib = 1024;
  if (const char* env = std::getenv("NVFS_NFS_FILE_MIB")) mib = std::strtoull(env, nullptr, 10);
  REQUIRE(mib > 0);
  const uint64_t size = mib * kMiB;
  Export ex(size + 256 * kMiB);  // a sparse /dev/shm image
  NfsClient c(ex.mount.dir(), kUser, kUser);
  std::vector<char> buf(kMiB);

  Checksum written;
  nfsfh* fh = nullptr;
  REQUIRE(nfs_creat(c.get(), UserPath("big").c_str(), 0644, &fh) == 0);
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t off = 0; off < size; off += kMiB) {
    Pattern(off, buf.data(), kMiB);
    written.Add(buf.data(), kMiB);
    INFO("write at " << off << ": " << c.error());
    REQUIRE(nfs_pwrite(c.get(), fh, off, kMiB, buf.data()) == static_cast<int>(kMiB));
  }
  REQUIRE(nfs_close(c.get(), fh) == 0);
  const double write_s = Seconds(t0);

  Checksum read_nfs;
  REQUIRE(nfs_open(c.get(), UserPath("big").c_str(), O_RDONLY, &fh) == 0);
  t0 = std::chrono::steady_clock::now();
  for (uint64_t off = 0; off < size; off += kMiB) {
    INFO("read at " << off << ": " << c.error());
    REQUIRE(nfs_pread(c.get(), fh, off, kMiB, buf.data()) == static_cast<int>(kMiB));
    read_nfs.Add(buf.data(), kMiB);
  }
  REQUIRE(nfs_close(c.get(), fh) == 0);
  const double read_s = Seconds(t0);

  Checksum read_local;
  const int fd = open(ex.mount.path("u/big").c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = read(fd, buf.data(), kMiB);
    REQUIRE(n >= 0);
    if (n == 0) break;
    REQUIRE(n % 8 == 0);
    read_local.Add(buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  close(fd);
  std::printf("nfs: %llu MiB written in %.2f s (%.0f MB/s), read back in %.2f s (%.0f MB/s)\n",
              static_cast<unsigned long long>(mib), write_s, size / write_s / 1e6, read_s,
              size / read_s / 1e6);
  CHECK(total == size);
  CHECK(read_nfs.h == written.h);
  CHECK(read_local.h == written.h);
}

TEST_CASE("nfs: handles survive a ganesha restart and an nvfs remount; a removed file's is stale",
          "[nfs]") {
  NVFS_REQUIRE_FUSE();
  NVFS_REQUIRE_GANESHA();
  Export ex;
  NfsHandle kept, dir, gone, moved, linked;
  uint64_t kept_ino = 0, gone_ino = 0;
  {
    NfsClient c(ex.mount.dir(), kUser, kUser);
    REQUIRE(nfs_mkdir(c.get(), UserPath("d").c_str()) == 0);
    REQUIRE(nfs_mkdir(c.get(), UserPath("d/sub").c_str()) == 0);
    NfsWriteNew(c, UserPath("d/sub/kept"), "kept");
    NfsWriteNew(c, UserPath("gone"), "gone");
    kept = HandleOf(c, UserPath("d/sub/kept"));
    dir = HandleOf(c, UserPath("d/sub"));
    gone = HandleOf(c, UserPath("gone"));
    kept_ino = Getattr3(c, kept).fileid;
    gone_ino = Getattr3(c, gone).fileid;
    CHECK(kept_ino == Stat(ex.mount.path("u/d/sub/kept")).st_ino);
    REQUIRE(nfs_unlink(c.get(), UserPath("gone").c_str()) == 0);
    CHECK(Getattr3(c, gone).status == NFS3ERR_STALE);
    CHECK(Getattr3(c, kept).status == NFS3_OK);
    // Stale only when freed: a file renamed into another directory, and
    // one whose first name was removed while a hard link keeps it.
    NfsWriteNew(c, UserPath("moved"), "moved");
    moved = HandleOf(c, UserPath("moved"));
    REQUIRE(nfs_rename(c.get(), UserPath("moved").c_str(), UserPath("d/moved").c_str()) == 0);
    NfsWriteNew(c, UserPath("linked"), "linked");
    linked = HandleOf(c, UserPath("linked"));
    REQUIRE(nfs_link(c.get(), UserPath("linked").c_str(), UserPath("d/sub/link").c_str()) == 0);
    REQUIRE(nfs_unlink(c.get(), UserPath("linked").c_str()) == 0);
  }

  // The checks after each restart, with a new client (a new connection
  // and MOUNT, the handles alone carried over).
  auto check_handles = [&](const char* after) {
    INFO("after " << after);
    NfsClient c(ex.mount.dir(), kUser, kUser);
    const NfsAttr a = Getattr3(c, kept);
    REQUIRE(a.status == NFS3_OK);
    CHECK(a.fileid == kept_ino);
    CHECK(a.type == NF3REG);
    const NfsRead r = Read3(c, kept, 0, 100);
    CHECK(r.status == NFS3_OK);
    CHECK(r.data == "kept");
    const NfsAttr d = Getattr3(c, dir);
    CHECK(d.status == NFS3_OK);
    CHECK(d.type == NF3DIR);
    const NfsLookup l = Lookup3(c, dir, "kept");
    CHECK(l.status == NFS3_OK);
    CHECK(l.handle == kept);  // the same handle for the same file
    CHECK(Getattr3(c, gone).status == NFS3ERR_STALE);
    CHECK(Read3(c, gone, 0, 100).status == NFS3ERR_STALE);
    CHECK(Read3(c, moved, 0, 100).data == "moved");
    CHECK(Read3(c, linked, 0, 100).data == "linked");
  };

  CHECK(ex.ganesha->Stop() == 0);
  ex.ganesha->Start();
  check_handles("a ganesha restart");

  ex.Remount();
  check_handles("an nvfs remount");

  // New files may reuse the removed file's inode number, never with its
  // generation: its handle stays stale. (Usually "moved", made right after
  // the removal, has taken it already.)
  bool reused = Stat(ex.mount.path("u/d/moved")).st_ino == gone_ino ||
                Stat(ex.mount.path("u/d/sub/link")).st_ino == gone_ino;
  for (int i = 0; i < 64 && !reused; ++i) {
    const std::string path = ex.mount.path("u/new" + std::to_string(i));
    LocalWrite(path, "new");
    reused = Stat(path).st_ino == gone_ino;
  }
  INFO("gone was inode " << gone_ino);
  CHECK(reused);
  ex.Remount();
  check_handles("the number's reuse and another remount");

  CHECK(ex.ganesha->Stop() == 0);
  StopAndCheck(ex.mount);
}

}  // namespace nvfs::test
