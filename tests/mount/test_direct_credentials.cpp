// Access ends with the credentials, on every path (doc/integrity.md section
// 10): a process that read, wrote and mapped files directly, then changed
// its credentials in any of the ways a program can — libc's wrappers,
// syscall() (libcap's and libpsx's way), fork then a drop in the child, a
// new user namespace by unshare or clone3, an execve — keeps no mapping of
// the namespace (its direct maps included), no page of the writers' file,
// no descriptor of the namespace and no connection to the daemon.
//
// Each case runs in a child: credentials are the process's.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/sched.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "mount_fixture.hpp"
#include "mount_helpers.hpp"
#include "nvfs/direct.h"

using nvfs::test::MountedFs;

namespace {

bool RootDaemon() { return geteuid() == 0; }

// What of the namespace the calling process holds, as the kernel lists it.
struct Exposure {
  int image_maps = 0;    // mappings of the image file
  int writers_maps = 0;  // mappings of a writers' file (/run/nvfs/writers-*)
  int image_fds = 0;     // descriptors of the image
  int daemon_sockets = 0;  // sockets connected to a daemon's socket (/run/nvfs/...)
};

Exposure Look(const std::string& image) {
  Exposure e;
  struct stat img {};
  if (stat(image.c_str(), &img) != 0) _exit(90);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long start, end, offset, inode;
    unsigned major, minor;
    char perms[8];
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %x:%x %lu", &start, &end, perms, &offset, &major,
                    &minor, &inode) != 7) {
      continue;
    }
    if (inode == img.st_ino && makedev(major, minor) == img.st_dev) ++e.image_maps;
    if (line.find("/writers-") != std::string::npos) ++e.writers_maps;
  }
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) _exit(91);
  while (dirent* d = readdir(fds)) {
    const int fd = std::atoi(d->d_name);
    if (d->d_name[0] == '.' || fd == dirfd(fds)) continue;
    struct stat st {};
    if (fstat(fd, &st) != 0) continue;
    if (st.st_ino == img.st_ino && st.st_dev == img.st_dev) ++e.image_fds;
    if (S_ISSOCK(st.st_mode)) {
      sockaddr_un peer{};
      socklen_t len = sizeof peer;
      // One shut down (a mapper's, which its listener thread closes a
      // moment later) is no connection any more.
      pollfd p{fd, POLLOUT, 0};
      const bool hung_up = poll(&p, 1, 0) == 1 && (p.revents & POLLHUP) != 0;
      if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 &&
          peer.sun_family == AF_UNIX && std::strncmp(peer.sun_path, "/run/nvfs/", 10) == 0 &&
          !hung_up) {
        ++e.daemon_sockets;
      }
    }
  }
  closedir(fds);
  return e;
}

// Everything a proof gives: a direct write (the writers' page), a writable
// shared direct map and a private one (the mapper's connection and its
// descriptor of the namespace), a direct read. Kept for the process's life.
// Without `maps`, no map: a mapper's listener thread makes the process
// multithreaded, and unshare(CLONE_NEWUSER) refuses such a process.
void UseEverything(const std::string& path, bool maps = true) {
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) _exit(80);
  nvfs_direct* d = nvfs_direct_attach(fd);
  if (d == nullptr) _exit(81);
  const std::string bytes(8192, 'w');
  if (nvfs_direct_pwrite(d, bytes.data(), bytes.size(), 0) != 8192) _exit(82);
  if (nvfs_direct_write_why(d) != NVFS_DIRECT_ACTIVE) _exit(83);
  char c;
  if (nvfs_direct_pread(d, &c, 1, 100) != 1 || c != 'w') _exit(85);
  if (!maps) return;
  void* shared = nvfs_direct_mmap(d, nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, 0);
  void* priv = nvfs_direct_mmap(d, nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE, 0);
  if (shared == MAP_FAILED || priv == MAP_FAILED || nvfs_direct_mmap_why(d) != NVFS_DIRECT_ACTIVE) {
    _exit(84);
  }
  static_cast<char*>(priv)[0] = 'P';  // a page of its own
}

// Exit codes of a child: 0 all taken out; 1 an image mapping left; 2 a
// writers' page left; 3 a descriptor of the image left; 4 a connection
// left; 70 + n: the case's own step n failed; 80.. setting up; 99 before:
// nothing was held to begin with.
int Judge(const std::string& image) {
  const Exposure e = Look(image);
  if (e.image_maps != 0) return 1;
  if (e.writers_maps != 0) return 2;
  if (e.image_fds != 0) return 3;
  if (e.daemon_sockets != 0) return 4;
  return 0;
}

template <class Drop>
int InChild(const MountedFs& m, Drop&& drop, bool maps = true) {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    UseEverything(m.path("f"), maps);
    const Exposure before = Look(m.image());
    if (before.image_maps == 0 || before.writers_maps == 0 || (maps && before.image_fds == 0) ||
        before.daemon_sockets == 0) {
      _exit(99);
    }
    _exit(drop(m.image()));
  }
  return nvfs::test::WaitForExit(child, 60);
}

bool UserNamespaces() {
  std::ifstream f("/proc/sys/user/max_user_namespaces");
  long n = 0;
  return (f >> n) && n > 0;
}

}  // namespace

TEST_CASE("direct credentials: every way of changing credentials takes out what a proof gave",
          "[mount][direct][credentials]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  nvfs::test::WriteFile(m.path("f"), std::string(8192, 'w'));

  SECTION("libc's setresuid") {
    CHECK(InChild(m, [](const std::string& image) {
            if (setresuid(65534, 65534, 65534) != 0) return 70;
            return Judge(image);
          }) == 0);
  }
  SECTION("libc's setresuid to the same ids") {
    CHECK(InChild(m, [](const std::string& image) {
            if (setresuid(0, 0, 0) != 0) return 70;
            return Judge(image);
          }) == 0);
  }
  SECTION("syscall(SYS_setresuid), as libcap's cap_setuid makes it") {
    CHECK(InChild(m, [](const std::string& image) {
            if (syscall(SYS_setresuid, 65534, 65534, 65534) != 0) return 70;
            return Judge(image);
          }) == 0);
  }
  SECTION("syscall(SYS_setgroups)") {
    CHECK(InChild(m, [](const std::string& image) {
            if (syscall(SYS_setgroups, 0, nullptr) != 0) return 70;
            return Judge(image);
          }) == 0);
  }
  SECTION("fork, then a drop through syscall() in the child") {
    CHECK(InChild(m, [](const std::string& image) {
            const pid_t grandchild = fork();
            if (grandchild < 0) return 70;
            if (grandchild == 0) {
              if (syscall(SYS_setresuid, 65534, 65534, 65534) != 0) _exit(70);
              _exit(Judge(image));
            }
            return nvfs::test::WaitForExit(grandchild, 30);
          }) == 0);
  }
  SECTION("a fork's child holds no page of its parent") {
    CHECK(InChild(m, [](const std::string& image) {
            const pid_t grandchild = fork();
            if (grandchild < 0) return 70;
            if (grandchild == 0) _exit(Look(image).writers_maps != 0 ? 2 : 0);
            return nvfs::test::WaitForExit(grandchild, 30);
          }) == 0);
  }
  SECTION("unshare(CLONE_NEWUSER) and syscall(SYS_unshare, CLONE_NEWUSER)") {
    if (!UserNamespaces()) NVFS_SKIP("this kernel makes no user namespaces");
    CHECK(InChild(m, [](const std::string& image) {
            if (unshare(CLONE_NEWUSER) != 0) return 70;
            return Judge(image);
          }, /*maps=*/false) == 0);
    CHECK(InChild(m, [](const std::string& image) {
            if (syscall(SYS_unshare, CLONE_NEWUSER) != 0) return 70;
            return Judge(image);
          }, /*maps=*/false) == 0);
  }
  SECTION("clone3 of a child in a new user namespace") {
    if (!UserNamespaces()) NVFS_SKIP("this kernel makes no user namespaces");
    CHECK(InChild(m, [](const std::string& image) {
            clone_args args{};
            args.flags = CLONE_NEWUSER;
            args.exit_signal = SIGCHLD;
            const long child = syscall(SYS_clone3, &args, sizeof args);
            if (child < 0) return 70;
            if (child == 0) _exit(Judge(image));
            return nvfs::test::WaitForExit(static_cast<pid_t>(child), 30);
          }) == 0);
  }
  SECTION("execve: no descriptor of the library's survives it") {
    CHECK(InChild(m, [](const std::string& image) {
            // The new program lists what it was given.
            const std::string script =
                "n=$(for f in /proc/$$/fd/*; do readlink \"$f\"; done | grep -c -e '" + image +
                "' -e '/writers-'); [ \"$n\" = 0 ]";
            execl("/bin/sh", "sh", "-c", script.c_str(), nullptr);
            return 71;
          }) == 0);
  }
  nvfs::test::StopAndCheck(m);
}

TEST_CASE("direct credentials: after a drop, the process proves itself again as what it is now",
          "[mount][direct][credentials]") {
  NVFS_REQUIRE_FUSE();
  if (!RootDaemon()) NVFS_SKIP("the direct socket needs a root daemon");
  MountedFs m(64ull << 20);
  m.Start();
  nvfs::test::WriteFile(m.path("f"), std::string(8192, 'w'));
  // The same credentials again through syscall(), over and over: the
  // writer's page comes back at its address each time, and direct writes
  // go on.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    UseEverything(m.path("f"));
    if (syscall(SYS_setresuid, 0, 0, 0) != 0) _exit(70);
    const int fd = open(m.path("f").c_str(), O_RDWR);
    nvfs_direct* d = fd < 0 ? nullptr : nvfs_direct_attach(fd);
    if (d == nullptr) _exit(71);
    for (int i = 0; i < 3; ++i) {
      const std::string bytes(4096, static_cast<char>('a' + i));
      if (nvfs_direct_pwrite(d, bytes.data(), bytes.size(), 4096) != 4096) _exit(72);
      if (nvfs_direct_write_why(d) != NVFS_DIRECT_ACTIVE) _exit(73);
      if (syscall(SYS_setresuid, 0, 0, 0) != 0) _exit(74);
    }
    char c = 0;
    if (pread(fd, &c, 1, 4096) != 1 || c != 'c') _exit(75);
    _exit(0);
  }
  CHECK(nvfs::test::WaitForExit(child, 60) == 0);
  std::string back(1, '\0');
  const int fd = open(m.path("f").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(pread(fd, back.data(), 1, 4096) == 1);
  close(fd);
  CHECK(back == "c");
  nvfs::test::StopAndCheck(m);
}
