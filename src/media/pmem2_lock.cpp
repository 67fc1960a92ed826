// The libpmem2 backend's lock on the namespace and its serving marks
// (Pmem2Media::Lock, ServeThroughMount, EndService; the scheme below).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "media/pmem2_media.hpp"

namespace nvfs {

// The lock (MediaOptions::lock) is flock, exclusive for writers and shared
// for readers, held until the descriptor closes; and beside it one of two
// marks, open-file-description locks (F_OFD_SETLK, write or read):
//   byte 0, "serving": the holder is using the namespace (mkfs, fsck, a
//     daemon until it has mounted);
//   byte 1, "serving through a mount": a daemon whose FUSE mount has the
//     namespace's absolute path as its source (ServeThroughMount takes it,
//     then drops byte 0, so one of them is always held).
// EndService drops both as soon as the holder begins to shut down. An
// opener that finds the flock taken looks at the marks: byte 0 held, or
// byte 1 held and the mount still in /proc/self/mountinfo: the namespace is
// in use (EBUSY at once). Otherwise its holder is on its way out (a daemon
// between the unmount, which returns before the daemon has even seen its
// session end, and its exit), and the opener waits for it
// (MediaOptions::release_wait_ms), saying so once on stderr if it takes
// longer than a second.
namespace {

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

// mountinfo writes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& field) {
  std::string out;
  const auto octal = [&](size_t at) { return field[at] >= '0' && field[at] <= '7'; };
  for (size_t i = 0; i < field.size(); ++i) {
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

// True if a FUSE file system whose source is `source` is mounted (in this
// process's mount namespace). Unreadable mountinfo: true (refuse at once,
// as before there was a mount mark).
bool FuseMountOf(const std::string& source) {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return true;
  std::string line;
  while (std::getline(in, line)) {
    // ... optional fields - FSTYPE SOURCE SUPER_OPTIONS
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    std::string type, src;
    if (!(rest >> type >> src)) continue;
    if ((type == "fuse" || type.rfind("fuse.", 0) == 0) && Unescape(src) == source) return true;
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
  char resolved[PATH_MAX];
  const std::string source = realpath(p, resolved) != nullptr ? resolved : path_;
  while (flock(fd_, op) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return MakeError(errno, "%s: cannot lock: %s", p, std::strerror(errno));
    if (MarkHeld(fd_, shared, 0) || (MarkHeld(fd_, shared, 1) && FuseMountOf(source))) {
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

void Pmem2Media::ServeThroughMount() {
  if (!serving_) return;
  // Byte 1 before byte 0 goes: never a moment with neither.
  if (!SetMark(fd_, read_only() ? F_RDLCK : F_WRLCK, 1)) return;  // keep byte 0
  mounted_mark_ = true;
  (void)SetMark(fd_, F_UNLCK, 0);
}

void Pmem2Media::EndService() {
  if (!serving_) return;
  (void)SetMark(fd_, F_UNLCK, 0);
  if (mounted_mark_) (void)SetMark(fd_, F_UNLCK, 1);
  serving_ = false;
  mounted_mark_ = false;
}

}  // namespace nvfs
