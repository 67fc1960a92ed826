// The libpmem2 backend's lock on the namespace and its serving marks
// (Pmem2Media::Lock, ServeThroughMount, EndService; the scheme below), and
// FindServingMount, which reads the marks for nvfs-resize.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "media/mounts.hpp"
#include "media/pmem2_media.hpp"

namespace nvfs {

// The lock (MediaOptions::lock) is flock, exclusive for writers and shared
// for readers, held until the descriptor closes; and beside it one of two
// marks, open-file-description locks (F_OFD_SETLK, write or read) on the
// namespace itself:
//   byte 0, "serving": the holder is using the namespace (mkfs, fsck, a
//     daemon until it has mounted, or one that could not learn its mount's
//     device number);
//   byte kUniqueMarks + N, "serving through the mount whose unique mount
//     id is N" (statmount(2), Linux 6.8; never given to another mount): a
//     daemon once its mount is in place (ServeThroughMount takes it, then
//     drops byte 0, so one of them is always held);
//   byte kMountMarks + N, "serving through the FUSE mount whose device
//     number is N" (N = major << 20 | minor, as the kernel keeps it): the
//     same, where the kernel gives no unique id.
// A mark is found by the namespace itself (its inode, whatever path it is
// opened by), and names the mount as the kernel does, which nobody
// chooses; a mount's source is anyone's to choose (fsname=), and so is its
// type (subtype=). A mark goes with its holder: a killed daemon leaves none
// behind. A device number is the kernel's to give again: the moment a
// FUSE mount is gone, the next mount anywhere takes its number (the lowest
// free anonymous one), so a device mark may name someone else's live
// mount; a unique id never does.
// EndService drops the mark as soon as the holder begins to shut down. An
// opener that finds the flock taken looks at the marks: byte 0 held, a
// unique mark held whose mount is still in the opener's mount namespace,
// or a device mark held whose FUSE mount (that device number) is still in
// /proc/self/mountinfo: the namespace is in use (EBUSY at once). Otherwise
// its holder is on its way out (a daemon between the unmount, which returns
// before the daemon has even seen its session end, and its exit), and the
// opener waits for it (MediaOptions::release_wait_ms), saying so once on
// stderr if it takes longer than a second. Byte 1 was the mount mark of
// daemons before this scheme, which named no mount: held, the namespace is
// in use.
namespace {

constexpr off_t kMountMarks = off_t{1} << 32;
constexpr off_t kMountMarksEnd = kMountMarks + (off_t{1} << 32);
constexpr off_t kUniqueMarks = off_t{1} << 40;
constexpr off_t kUniqueMarksEnd = off_t{1} << 62;
// Linux keeps a device number in 32 bits: 12 of major, 20 of minor.
constexpr unsigned kMinorBits = 20;

// The mount mark's offset for a FUSE mount's device number; -1 for a number
// the kernel never gives.
off_t MountMarkOffset(dev_t dev) {
  if (major(dev) >= (1u << (32 - kMinorBits)) || minor(dev) >= (1u << kMinorBits)) return -1;
  return kMountMarks + ((off_t{major(dev)} << kMinorBits) | minor(dev));
}

dev_t MountMarkDevice(off_t offset) {
  const uint64_t n = static_cast<uint64_t>(offset - kMountMarks);
  return makedev(static_cast<unsigned>(n >> kMinorBits),
                 static_cast<unsigned>(n & ((1u << kMinorBits) - 1)));
}

// True if the F_OFD lock on `byte` that an opener of the given kind would
// take conflicts with one held.
bool MarkHeld(int fd, bool shared, off_t byte) {
  struct flock probe {};
  probe.l_type = shared ? F_RDLCK : F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = byte;
  probe.l_len = 1;
  return fcntl(fd, F_OFD_GETLK, &probe) != 0 || probe.l_type != F_UNLCK;
}

bool SetMark(int fd, short type, off_t byte) {
  struct flock mark {};
  mark.l_type = type;
  mark.l_whence = SEEK_SET;
  mark.l_start = byte;
  mark.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &mark) == 0;
}

// The offsets of the marks in [from, to) that conflict with an opener of
// the given kind (several read-only daemons may share a namespace).
// nullopt if something else holds a lock there, or the marks cannot be
// read: the caller takes that as "in use".
std::optional<std::vector<off_t>> MarksIn(int fd, bool shared, off_t from_offset,
                                          off_t to_offset) {
  // F_OFD_GETLK reports one conflicting lock of a range, not the lowest:
  // the range is split around each one found.
  constexpr int kMaxProbes = 64;
  std::vector<off_t> marks;
  std::vector<std::pair<off_t, off_t>> ranges{{from_offset, to_offset}};
  for (int probes = 0; !ranges.empty(); ++probes) {
    if (probes == kMaxProbes) return std::nullopt;
    const auto [from, to] = ranges.back();
    ranges.pop_back();
    struct flock probe {};
    probe.l_type = shared ? F_RDLCK : F_WRLCK;
    probe.l_whence = SEEK_SET;
    probe.l_start = from;
    probe.l_len = to - from;
    if (fcntl(fd, F_OFD_GETLK, &probe) != 0) return std::nullopt;
    if (probe.l_type == F_UNLCK) continue;
    if (probe.l_start < from || probe.l_len != 1) return std::nullopt;  // not a mark
    marks.push_back(probe.l_start);
    if (probe.l_start > from) ranges.emplace_back(from, probe.l_start);
    if (probe.l_start + 1 < to) ranges.emplace_back(probe.l_start + 1, to);
  }
  return marks;
}

// The device numbers of the FUSE mounts in this process's mount namespace
// (/proc/self/mountinfo: "ID PARENT MAJOR:MINOR ... - TYPE ..."); nullopt if
// it cannot be read.
std::optional<std::set<dev_t>> FuseMounts() {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return std::nullopt;
  std::set<dev_t> mounts;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev;
    if (!(fields >> id >> parent >> dev)) continue;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    std::string type;
    if (!(rest >> type) || (type != "fuse" && type.rfind("fuse.", 0) != 0)) continue;
    unsigned major_no = 0, minor_no = 0;
    if (std::sscanf(dev.c_str(), "%u:%u", &major_no, &minor_no) != 2) continue;
    mounts.insert(makedev(major_no, minor_no));
  }
  return mounts;
}

// True if a mount mark that conflicts with an opener of the given kind
// names a mount still in this process's mount namespace; its device number
// in *mount. Marks, mounts or mountinfo that cannot be read count as such a
// mount (*mount 0).
bool ServedThroughLiveMount(int fd, bool shared, dev_t* mount) {
  *mount = 0;
  const std::optional<std::vector<off_t>> unique =
      MarksIn(fd, shared, kUniqueMarks, kUniqueMarksEnd);
  if (!unique) return true;
  for (const off_t mark : *unique) {
    dev_t dev = 0;
    const int r = MountLive(static_cast<uint64_t>(mark - kUniqueMarks), &dev);
    if (r == -ENOENT) continue;  // gone: its holder is on its way out
    *mount = r == 0 ? dev : 0;
    return true;
  }
  const std::optional<std::vector<off_t>> marks = MarksIn(fd, shared, kMountMarks, kMountMarksEnd);
  if (!marks) return true;
  if (marks->empty()) return false;
  const std::optional<std::set<dev_t>> mounts = FuseMounts();
  if (!mounts) return true;
  for (const off_t mark : *marks) {
    const dev_t dev = MountMarkDevice(mark);
    if (mounts->count(dev) != 0) {
      *mount = dev;
      return true;
    }
  }
  return false;
}

}  // namespace

Status Pmem2Media::Lock(bool shared, uint32_t wait_ms) {
  const char* p = path_.c_str();
  const int op = (shared ? LOCK_SH : LOCK_EX) | LOCK_NB;
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + std::chrono::milliseconds(wait_ms);
  bool said = false;
  while (flock(fd_, op) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return MakeError(errno, "%s: cannot lock: %s", p, std::strerror(errno));
    dev_t mount;
    if (MarkHeld(fd_, shared, 0) || MarkHeld(fd_, shared, 1) ||
        ServedThroughLiveMount(fd_, shared, &mount)) {
      return MakeError(EBUSY, "%s: in use (mounted by nvfs, or mkfs/fsck running on it)", p);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return MakeError(EBUSY, "%s: still in use %.1f s later (the process that was releasing "
                       "it has not)", p, wait_ms / 1000.0);
    }
    // Said once the wait is long enough to notice: the usual one, for a
    // daemon an umount has just ended, is a few milliseconds, and scripts
    // (fstests compares output) mount and check right after umount.
    if (!said && std::chrono::steady_clock::now() >= started + std::chrono::seconds(1)) {
      std::fprintf(stderr, "nvfs: %s: waiting for the nvfs process that is releasing it\n", p);
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  serving_ = SetMark(fd_, shared ? F_RDLCK : F_WRLCK, 0);  // else: openers wait, then fail
  return Status::Ok();
}

void Pmem2Media::ServeThroughMount(const MountName& mount) {
  if (!serving_) return;
  const off_t mark =
      mount.unique_id != 0 && mount.unique_id < uint64_t{kUniqueMarksEnd - kUniqueMarks}
          ? kUniqueMarks + static_cast<off_t>(mount.unique_id)
          : MountMarkOffset(mount.dev);
  if (mark < 0) return;  // keep byte 0: in use until EndService
  // The mount mark before byte 0 goes: never a moment with neither.
  if (!SetMark(fd_, read_only() ? F_RDLCK : F_WRLCK, mark)) return;  // keep byte 0
  mount_mark_ = mark;
  (void)SetMark(fd_, F_UNLCK, 0);
}

void Pmem2Media::EndService() {
  if (!serving_) return;
  (void)SetMark(fd_, F_UNLCK, 0);
  if (mount_mark_ >= 0) (void)SetMark(fd_, F_UNLCK, mount_mark_);
  serving_ = false;
  mount_mark_ = -1;
}

Result<dev_t> FindServingMount(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return MakeError(errno, "%s: %s", path.c_str(), std::strerror(errno));
  dev_t mount;
  const bool served = ServedThroughLiveMount(fd, /*shared=*/false, &mount);
  close(fd);
  if (!served || mount == 0) {
    return MakeError(ENOENT, "%s: no nvfs daemon serves it through a mount this process sees",
                     path.c_str());
  }
  return mount;
}

}  // namespace nvfs
