// The mount suite (test_mount, tests/mount/test_mount_*.cpp): who may do what —
// permissions for a second uid, the image's own mode (the namespace is the
// boundary), and set-user-ID, set-group-ID and capabilities dropped by an
// unprivileged change, down to what exec(2) sees.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "helpers.hpp"
#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

TEST_CASE("mount: permissions with default_permissions and a second uid", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "allow_other", "allow_other,cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  REQUIRE(chmod(m.dir().c_str(), 0755) == 0);
  WriteFile(m.path("public"), "public data", 0644);
  REQUIRE(chmod(m.path("public").c_str(), 0644) == 0);
  WriteFile(m.path("secret"), "secret", 0600);
  REQUIRE(chmod(m.path("secret").c_str(), 0600) == 0);
  REQUIRE(mkdir(m.path("rootdir").c_str(), 0755) == 0);
  REQUIRE(mkdir(m.path("shared").c_str(), 01777) == 0);
  REQUIRE(chmod(m.path("shared").c_str(), 01777) == 0);
  WriteFile(m.path("shared/rootfile"), "r");
  WriteFile(m.path("given"), "");
  REQUIRE(chown(m.path("given").c_str(), 65534, 65534) == 0);
  WriteFile(m.path("setid"), "");
  REQUIRE(chown(m.path("setid").c_str(), 65534, 65534) == 0);
  REQUIRE(chmod(m.path("setid").c_str(), 06755) == 0);
  WriteFile(m.path("setid-chown"), "");
  REQUIRE(chmod(m.path("setid-chown").c_str(), 06755) == 0);
  REQUIRE(chown(m.path("setid-chown").c_str(), 1, 1) == 0);  // chown clears both bits
  CHECK((Stat(m.path("setid-chown")).st_mode & 07777) == 0755);

  const int failed_step = RunInChild([&]() -> int {
    if (!BecomeNobody()) {
      return 100;
    }
    int step = 0;
    auto expect = [&step](bool ok) {
      ++step;
      return ok;
    };
    char buf[64];
    // Can read a 0644 root file, cannot write it.
    int fd = open(m.path("public").c_str(), O_RDONLY);
    if (!expect(fd >= 0)) return step;
    const ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (!expect(n == 11 && std::memcmp(buf, "public data", 11) == 0)) return step;
    if (!expect(Err(open(m.path("public").c_str(), O_WRONLY)) == EACCES)) return step;
    if (!expect(Err(truncate(m.path("public").c_str(), 0)) == EACCES)) return step;
    if (!expect(Err(access(m.path("public").c_str(), W_OK)) == EACCES)) return step;
    if (!expect(access(m.path("public").c_str(), R_OK) == 0)) return step;
    if (!expect(Err(open(m.path("secret").c_str(), O_RDONLY)) == EACCES)) return step;
    // Cannot create in, or remove from, a 0755 root directory.
    if (!expect(Err(open(m.path("rootdir/new").c_str(), O_CREAT | O_WRONLY, 0644)) == EACCES)) {
      return step;
    }
    if (!expect(Err(mkdir(m.path("rootdir/d").c_str(), 0755)) == EACCES)) return step;
    if (!expect(Err(unlink(m.path("public").c_str())) == EACCES)) return step;
    if (!expect(Err(rename(m.path("public").c_str(), m.path("p2").c_str())) == EACCES)) {
      return step;
    }
    // Not the owner: no chmod, chown, explicit times or user xattrs.
    if (!expect(Err(chmod(m.path("public").c_str(), 0666)) == EPERM)) return step;
    if (!expect(Err(chown(m.path("public").c_str(), 65534, 65534)) == EPERM)) return step;
    const timespec times[2] = {{1, 0}, {2, 0}};
    if (!expect(Err(utimensat(AT_FDCWD, m.path("public").c_str(), times, 0)) == EPERM)) {
      return step;
    }
    if (!expect(Err(setxattr(m.path("public").c_str(), "user.x", "1", 1, 0)) == EACCES)) {
      return step;
    }
    // A sticky world-writable directory: may create, may not remove root's file.
    fd = open(m.path("shared/mine").c_str(), O_CREAT | O_WRONLY, 0644);
    if (!expect(fd >= 0)) return step;
    close(fd);
    struct stat st {};
    if (!expect(stat(m.path("shared/mine").c_str(), &st) == 0 && st.st_uid == 65534 &&
                st.st_gid == 65534)) {
      return step;
    }
    if (!expect(Err(unlink(m.path("shared/rootfile").c_str())) == EPERM)) return step;
    if (!expect(unlink(m.path("shared/mine").c_str()) == 0)) return step;
    // A file given to this uid: writable, and its mode is ours to change.
    fd = open(m.path("given").c_str(), O_WRONLY);
    if (!expect(fd >= 0)) return step;
    const bool wrote = write(fd, "mine", 4) == 4;
    close(fd);
    if (!expect(wrote)) return step;
    if (!expect(chmod(m.path("given").c_str(), 0600) == 0)) return step;
    // A write by an unprivileged owner clears set-user-ID and set-group-ID.
    fd = open(m.path("setid").c_str(), O_WRONLY);
    if (!expect(fd >= 0)) return step;
    const bool wrote_setid = write(fd, "x", 1) == 1;
    close(fd);
    if (!expect(wrote_setid)) return step;
    if (!expect(stat(m.path("setid").c_str(), &st) == 0 && (st.st_mode & 07777) == 0755)) {
      return step;
    }
    return 0;
  });
  INFO("first failed step in the child (100: could not change uid): " << failed_step);
  CHECK(failed_step == 0);
  CHECK(ReadAll(m.path("public")) == "public data");
  CHECK(ReadAll(m.path("given")) == "mine");
  CHECK(PathExists(m.path("shared/rootfile")));
  StopAndCheck(m);
}

// The namespace is the boundary (doc/integrity.md): a user the mount refuses
// a file must not get its bytes from the image instead. mkfs.nvfs -s made
// images 0644, and uid 65534 read a 0600 file's secret out of the image.
TEST_CASE("mount: a 0600 file's bytes cannot be read by another user through the image "
          "mkfs.nvfs -s made", "[mount][namespace]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m(64 * kMiB);
  m.Start("allow_other");  // so the mount itself lets uid 65534 in, and only the modes refuse
  REQUIRE(chmod(m.dir().c_str(), 0755) == 0);
  const std::string secret = "nvfs-secret-" + std::to_string(getpid()) + "-" +
                             std::to_string(std::random_device{}());
  WriteFile(m.path("secret"), secret, 0600);
  REQUIRE(chmod(m.path("secret").c_str(), 0600) == 0);
  REQUIRE(ReadAll(m.path("secret")) == secret);

  // The child's answer: 0 both refused with EACCES; 1 the image opened and
  // held the secret; 2 the image opened, no secret in it; 3 the image
  // refused with another errno; 4 the file through the mount not refused
  // with EACCES; 100 could not become uid 65534.
  const int outcome = RunInChild([&]() -> int {
    if (!BecomeNobody()) return 100;
    const int fd = open(m.image().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      std::string bytes;
      char buf[1 << 16];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) bytes.append(buf, static_cast<size_t>(n));
      close(fd);
      return bytes.find(secret) != std::string::npos ? 1 : 2;
    }
    if (errno != EACCES) return 3;
    if (Err(open(m.path("secret").c_str(), O_RDONLY | O_CLOEXEC)) != EACCES) return 4;
    return 0;
  });
  INFO("uid 65534: 0 refused both; 1 read the secret out of the image; 2 opened the image; "
       "3 the image refused with an errno other than EACCES; 4 the file through the mount not "
       "refused; 100 could not change uid: got " << outcome);
  CHECK(outcome == 0);
  CHECK((Stat(m.image()).st_mode & 07777) == 0600);
  StopAndCheck(m);
}

// The daemon says, in one line, what an image every user can read exposes
// and how to close it; a group is the administrator's choice and is not
// warned about.
TEST_CASE("mount: the daemon warns in one line about an image every user can read",
          "[mount][namespace]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m(64 * kMiB);
  REQUIRE(chmod(m.image().c_str(), 0644) == 0);
  m.Start();
  CHECK(m.Stop() == 0);
  const auto warnings = [&] {
    std::vector<std::string> found;
    for (const std::string& line : Lines(m.log())) {
      if (line.find("warning") != std::string::npos) found.push_back(line);
    }
    return found;
  };
  INFO("daemon log: " << m.log());
  const std::vector<std::string> first = warnings();
  REQUIRE(first.size() == 1);
  CHECK(first[0] == "nvfs: warning: " + m.image() +
                        " can be read by every user, who can then read every file in it "
                        "whatever its permissions; chmod o-rw " + m.image());

  REQUIRE(chmod(m.image().c_str(), 0640) == 0);
  m.Start();
  CHECK(m.Stop() == 0);
  CHECK(warnings().size() == 1);  // the log is appended to: still the first mount's one
}

// A valid security.capability value (VFS_CAP_REVISION_2, cap_net_raw
// permitted and effective): the kernel checks the format on setxattr.
std::string CapabilityValue() {
  const uint32_t words[5] = {0x02000001u, 1u << 13, 0, 0, 0};
  return std::string(reinterpret_cast<const char*>(words), sizeof words);
}

// Privileges are dropped by every change of a file's bytes by a caller
// without CAP_FSETID — write, truncate, O_TRUNC, fallocate, punch, zero
// range — in both cache modes, set-user-ID, group-executable set-group-ID
// and security.capability alike; root keeps the mode bits. On the old code
// a truncate or fallocate by uid 65534 kept the bits, and no direct write
// removed the capability.
TEST_CASE("mount: a change by an unprivileged caller drops set-user-ID, set-group-ID and "
          "capabilities", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "allow_other", "allow_other,cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  REQUIRE(chmod(m.dir().c_str(), 0755) == 0);
  const std::string cap = CapabilityValue();
  const auto prepare = [&](const std::string& name, uid_t owner) {
    WriteFile(m.path(name), std::string(8192, 'p'));
    REQUIRE(chown(m.path(name).c_str(), owner, owner) == 0);
    REQUIRE(chmod(m.path(name).c_str(), 06755) == 0);
    INFO(name << ": " << std::strerror(errno));
    REQUIRE(setxattr(m.path(name).c_str(), "security.capability", cap.data(), cap.size(), 0) == 0);
  };
  const auto has_cap = [&](const std::string& name) {
    char buf[64];
    return getxattr(m.path(name).c_str(), "security.capability", buf, sizeof buf) > 0;
  };
  // name -> what the caller does to it (0 on success).
  const std::vector<std::pair<std::string, std::function<int(const std::string&)>>> changes = {
      {"write", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY);
         const int rc = fd >= 0 && pwrite(fd, "w", 1, 100) == 1 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
      {"append", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY | O_APPEND);
         const int rc = fd >= 0 && write(fd, "a", 1) == 1 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
      {"truncate", [](const std::string& p) { return truncate(p.c_str(), 100) == 0 ? 0 : 1; }},
      {"otrunc", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY | O_TRUNC);
         if (fd >= 0) close(fd);
         return fd >= 0 ? 0 : 1;
       }},
      {"fallocate", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY);
         const int rc = fd >= 0 && fallocate(fd, 0, 0, 65536) == 0 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
      {"punch", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY);
         const int rc = fd >= 0 && fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                             4096) == 0 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
      {"zero", [](const std::string& p) {
         const int fd = open(p.c_str(), O_WRONLY);
         const int rc = fd >= 0 && fallocate(fd, FALLOC_FL_ZERO_RANGE, 0, 4096) == 0 ? 0 : 1;
         if (fd >= 0) close(fd);
         return rc;
       }},
  };
  for (const auto& [name, change] : changes) {
    prepare("user-" + name, 65534);
    prepare("root-" + name, 0);
    REQUIRE(chmod(m.path("root-" + name).c_str(), 06757) == 0);  // others may write
  }
  const int failed = RunInChild([&]() -> int {
    if (!BecomeNobody()) {
      return 100;
    }
    int step = 0;
    for (const auto& [name, change] : changes) {
      ++step;
      if (change(m.path("user-" + name)) != 0) return step;
    }
    return 0;
  });
  INFO("first failed change in the child (100: could not change uid): " << failed);
  REQUIRE(failed == 0);
  for (const auto& [name, change] : changes) {
    INFO(name);
    CHECK((Stat(m.path("user-" + name)).st_mode & 07777) == 0755);
    CHECK_FALSE(has_cap("user-" + name));
    // Root (CAP_FSETID) keeps the bits; file capabilities go whoever
    // changes the file, as on every local filesystem.
    REQUIRE(change(m.path("root-" + name)) == 0);
    CHECK((Stat(m.path("root-" + name)).st_mode & 07777) == 06757);
    CHECK_FALSE(has_cap("root-" + name));
  }
  // Set-group-ID without group execution marks mandatory locking: it stays.
  prepare("lock", 65534);
  REQUIRE(chmod(m.path("lock").c_str(), 02745) == 0);
  const int lock_failed = RunInChild([&]() -> int {
    if (!BecomeNobody()) {
      return 100;
    }
    return changes[0].second(m.path("lock"));
  });
  REQUIRE(lock_failed == 0);
  CHECK((Stat(m.path("lock")).st_mode & 07777) == 02745);
  CHECK_FALSE(has_cap("lock"));
  // ... but not for a caller outside the file's group (the kernel's
  // setattr_should_drop_sgid; fstests generic/683-685): a write, truncate
  // or fallocate by nobody of a root:root file clears it.
  for (const size_t i : {size_t{0}, size_t{2}, size_t{4}}) {
    const std::string name = "outsider-" + changes[i].first;
    prepare(name, 0);
    REQUIRE(chmod(m.path(name).c_str(), 02646) == 0);  // others may write
    const int outsider_failed = RunInChild([&]() -> int {
      if (!BecomeNobody()) return 100;
      return changes[i].second(m.path(name));
    });
    INFO(name);
    REQUIRE(outsider_failed == 0);
    CHECK((Stat(m.path(name)).st_mode & 07777) == 0646);
  }
  StopAndCheck(m);
}

// The mode the kernel caches is what exec(2) reads for set-user-ID
// (bprm_fill_uid), and a write only makes the kernel drop a file's size and
// times: when the core clears set-user-ID on a write by an unprivileged
// caller, the daemon must make the kernel forget the mode too, or the next
// exec of the file runs with its owner's uid.
TEST_CASE("mount: exec after a write that cleared set-user-ID runs without it", "[mount]") {
  NVFS_REQUIRE_FUSE();
  if (geteuid() != 0) {
    NVFS_SKIP("needs root (a root-owned set-user-ID program)");
  }
  const std::string options = GENERATE(as<std::string>{}, "allow_other,suid",
                                        "allow_other,suid,cache=page");
  INFO("options: " << options);
  MountedFs m;
  m.Start(options);
  REQUIRE(chmod(m.dir().c_str(), 0777) == 0);
  const std::string id = m.path("id");
  WriteFile(id, ReadAll("/usr/bin/id"), 0755);
  REQUIRE(chmod(id.c_str(), 04777) == 0);
  REQUIRE((Stat(id).st_mode & 07777) == 04777);  // cached by the kernel now
  const std::string out = "/tmp/nvfs-exec-" + std::to_string(getpid());
  const auto euid_of_exec = [&] {
    unlink(out.c_str());
    const int status = RunInChild([&]() -> int {
      const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || dup2(fd, 1) < 0 || !BecomeNobody()) return 100;
      execl(id.c_str(), "id", "-u", static_cast<char*>(nullptr));
      return 101;
    });
    std::string euid = status == 0 ? ReadAll(out) : "status " + std::to_string(status);
    unlink(out.c_str());
    return euid;
  };
  CHECK(euid_of_exec() == "0\n");  // set-user-ID root: the mount honours it
  // A write by nobody: the same byte again, so the program still runs.
  const std::string first = ReadAll(id).substr(0, 1);
  const int failed = RunInChild([&]() -> int {
    if (!BecomeNobody()) return 100;
    const int fd = open(id.c_str(), O_WRONLY);
    const int rc = fd >= 0 && pwrite(fd, first.data(), 1, 0) == 1 ? 0 : 1;
    if (fd >= 0) close(fd);
    return rc;
  });
  REQUIRE(failed == 0);
  // No stat in between: only the daemon's word makes the kernel look again.
  CHECK(euid_of_exec() == "65534\n");
  CHECK((Stat(id).st_mode & 07777) == 0777);
  StopAndCheck(m);
}

}  // namespace
}  // namespace nvfs::test
