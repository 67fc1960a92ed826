// The kernel's names for a mount (MountAt, include/nvfs/media.hpp; and
// MountLive, mounts.hpp): its device number from /proc/self/mountinfo, and
// its unique mount id from statmount(2)/listmount(2) (Linux 6.8).
#include "media/mounts.hpp"

#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

namespace nvfs {

namespace {

// Not in Debian 12's headers (linux-libc-dev 6.1): the system calls' numbers
// are the same on every architecture since 5.1's unified table, and the
// structures only grow (the kernel copies what the size given holds).
constexpr long kSysStatmount = 457;
constexpr long kSysListmount = 458;
constexpr uint64_t kListRoot = ~uint64_t{0};  // LSMT_ROOT: the namespace's root
constexpr uint64_t kStatSbBasic = 0x1;        // STATMOUNT_SB_BASIC
constexpr uint64_t kStatMntBasic = 0x2;       // STATMOUNT_MNT_BASIC

struct MountIdRequest {  // struct mnt_id_req, MNT_ID_REQ_SIZE_VER0
  uint32_t size;
  uint32_t spare;
  uint64_t mnt_id;
  uint64_t param;
};

struct StatMount {  // the head of struct statmount
  uint32_t size;
  uint32_t spare1;
  uint64_t mask;
  uint32_t sb_dev_major;
  uint32_t sb_dev_minor;
  uint64_t sb_magic;
  uint32_t sb_flags;
  uint32_t fs_type;
  uint64_t mnt_id;
  uint64_t mnt_parent_id;
  uint32_t mnt_id_old;
  uint32_t mnt_parent_id_old;
  uint64_t rest[56];  // the remaining fixed fields (512 bytes in all in 6.8)
};

// statmount(2) of the mount `unique_id` in this process's mount namespace:
// 0, or -errno (ENOENT: no such mount there; ENOSYS: a kernel before 6.8).
int StatMountOf(uint64_t unique_id, uint64_t mask, StatMount* out) {
  MountIdRequest request{sizeof(MountIdRequest), 0, unique_id, mask};
  *out = StatMount{};
  if (syscall(kSysStatmount, &request, out, sizeof(*out), 0) != 0) return -errno;
  return 0;
}

// The unique id of the mount that mountinfo calls `old_id` with device
// `dev`; 0 if the kernel cannot say (before 6.8, or not allowed).
uint64_t UniqueIdOf(uint32_t old_id, dev_t dev) {
  std::vector<uint64_t> ids(256);
  uint64_t last = 0;
  // Bounded: listmount gives each mount once, in increasing order.
  for (int rounds = 0; rounds < 4096; ++rounds) {
    MountIdRequest request{sizeof(MountIdRequest), 0, kListRoot, last};
    const long got = syscall(kSysListmount, &request, ids.data(), ids.size(), 0);
    if (got <= 0) return 0;
    for (long i = 0; i < got; ++i) {
      StatMount sm;
      if (StatMountOf(ids[i], kStatSbBasic | kStatMntBasic, &sm) != 0) continue;
      if ((sm.mask & kStatMntBasic) == 0 || (sm.mask & kStatSbBasic) == 0) continue;
      if (sm.mnt_id_old == old_id && makedev(sm.sb_dev_major, sm.sb_dev_minor) == dev) {
        return sm.mnt_id;
      }
    }
    if (static_cast<size_t>(got) < ids.size()) return 0;
    last = ids[got - 1];
  }
  return 0;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    const auto octal = [&](size_t at) { return field[at] >= '0' && field[at] <= '7'; };
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1) && octal(i + 2) &&
        octal(i + 3)) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

}  // namespace

std::optional<MountName> MountAt(const std::string& mountpoint) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  std::optional<MountName> found;
  uint32_t found_old_id = 0;
  while (std::getline(in, line)) {
    // ID PARENT MAJOR:MINOR ROOT MOUNT_POINT ...
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    if (!(fields >> id >> parent >> dev >> root >> point)) continue;
    unsigned major_no = 0, minor_no = 0, old_id = 0;
    if (std::sscanf(dev.c_str(), "%u:%u", &major_no, &minor_no) != 2) continue;
    if (std::sscanf(id.c_str(), "%u", &old_id) != 1) continue;
    if (Unescape(point) != mountpoint) continue;
    found = MountName{makedev(major_no, minor_no), 0};  // the last one stacked there
    found_old_id = old_id;
  }
  if (found) found->unique_id = UniqueIdOf(found_old_id, found->dev);
  return found;
}

int MountLive(uint64_t unique_id, dev_t* dev) {
  StatMount sm;
  const int r = StatMountOf(unique_id, kStatSbBasic, &sm);
  if (r == 0 && (sm.mask & kStatSbBasic) != 0) *dev = makedev(sm.sb_dev_major, sm.sb_dev_minor);
  return r;
}

}  // namespace nvfs
