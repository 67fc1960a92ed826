// A real nvfs mount for the mount tests: a fresh image under /dev/shm, a
// mount directory under /tmp, and the `nvfs` daemon (NVFS_DAEMON) serving
// it in the foreground as a child of the test. The destructor ALWAYS
// unmounts (fusermount3 -u, then -uz), reaps the daemon (killing only its
// own child, by PID, if it will not go), and removes the directory and the
// image — also when a REQUIRE failed halfway through a test.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "skip_count.hpp"

namespace nvfs::test {

// True if /dev/fuse can be used; otherwise prints, once and loudly, why the
// mount tests are skipped. Tests return early (and pass) when it is false.
bool FuseAvailable();

#define NVFS_REQUIRE_FUSE()                                        \
  do {                                                             \
    if (!::nvfs::test::FuseAvailable()) {                          \
      NVFS_SKIP("/dev/fuse is not usable on this machine");        \
    }                                                              \
  } while (0)

// In a child: drops to uid and gid 65534 (nobody), no supplementary
// groups. False if it could not.
bool BecomeNobody();

// True if `dir` is a mount point (per /proc/self/mountinfo).
bool IsMountPoint(const std::string& dir);

// Runs argv (argv[0] looked up in PATH), output to `log` (or /dev/null if
// empty); returns the exit status, or 128 + signal.
int RunProgram(const std::vector<std::string>& argv, const std::string& log = "");
// Starts argv (looked up in PATH) without waiting, stdin /dev/null, stdout
// and stderr appended to `log` (or /dev/null if empty). Throws if it cannot.
pid_t SpawnProgram(const std::vector<std::string>& argv, const std::string& log = "");
// Waits up to `seconds` for the child `pid`: its exit status (128 + signal),
// -1 if it is still running, 255 if it is not our child.
int WaitForExit(pid_t pid, double seconds);

struct DaemonResult {
  int exit_code = -1;      // 128 + signal if killed
  std::string output;      // stdout and stderr
  bool mounted = false;    // the mount point showed up (it was unmounted again)
};

// Runs `nvfs -f ARGS` expecting it to fail before mounting; if it mounts
// anyway, unmounts it, stops it and says so in `mounted`.
DaemonResult RunDaemonExpectingFailure(const std::vector<std::string>& args,
                                       const std::string& mount_dir);

class MountedFs {
 public:
  // Formats a fresh image of `image_size` bytes and makes the mount
  // directory; nothing is mounted yet (Start does it).
  explicit MountedFs(uint64_t image_size = 256ull << 20);
  ~MountedFs();
  MountedFs(const MountedFs&) = delete;
  MountedFs& operator=(const MountedFs&) = delete;

  // Starts `nvfs -f [FLAGS] [-o OPTIONS] IMAGE DIR` and waits (REQUIRE,
  // 10 s) until the mount shows in /proc/self/mountinfo.
  void Start(const std::string& options = "", const std::vector<std::string>& flags = {});
  // Unmounts with fusermount3 -u and waits for the daemon to exit; returns
  // its exit status (0 for a clean shutdown).
  int Stop();
  // Sends `sig` to the daemon and waits for it to exit; returns its status
  // (128 + signal if it died of it). For SIGKILL the dead mount is then
  // unmounted (fusermount3 -u).
  int Signal(int sig);
  // The caller took the mount away itself (umount): waits for the daemon
  // to exit and returns its status, as Stop does.
  int WaitExit();

  const std::string& dir() const { return dir_; }
  const std::string& image() const { return image_; }
  std::string path(const std::string& relative) const { return dir_ + "/" + relative; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // What the daemon printed so far.
  std::string log() const;

 private:
  // Waits up to `seconds` for the daemon to exit; -1 if it did not.
  int Reap(double seconds);

  std::string image_;
  std::string dir_;
  std::string log_;
  pid_t pid_ = -1;
};

// Runs fsck.nvfs -n on an image; exit status and output.
struct FsckResult {
  int exit_code = -1;
  std::string output;
};
FsckResult FsckImage(const std::string& image);

// fsck.nvfs -n must find `image` clean: CHECKs the exit status (0), with
// the output as the message; returns the result for more checks of it.
FsckResult CheckFsckClean(const std::string& image);

// The end of a mount case: unmounts, CHECKs that the daemon exited 0, then
// CheckFsckClean on the image (whose result it returns).
FsckResult StopAndCheck(MountedFs& m);

// Waits until no process holds the image's lock (the daemon has exited and
// released the namespace), up to `seconds`. True if it is free.
bool WaitImageFree(const std::string& image, double seconds);

}  // namespace nvfs::test
