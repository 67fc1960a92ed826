#include "mount_fixture.hpp"

#include "helpers.hpp"
#include "skip_count.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace nvfs::test {

namespace {

const char* Program(const char* env) {
  const char* path = std::getenv(env);
  if (path == nullptr) throw std::runtime_error(std::string(env) + " is not set (run through meson)");
  return path;
}

// Spawns argv with stdout and stderr appended to `log` (or /dev/null).
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string out = log.empty() ? "/dev/null" : log;
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot run " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// waitpid with a deadline: the exit code, or -1 if `pid` is still running.
int WaitFor(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return ExitCode(status);
    if (r < 0 && errno != EINTR) return 255;  // not our child any more
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Unmount(const std::string& dir) {
  if (!IsMountPoint(dir)) return;
  RunProgram({"fusermount3", "-u", dir});
  if (IsMountPoint(dir)) RunProgram({"fusermount3", "-uz", dir});
}

std::string UniqueName(const char* prefix) {
  static std::atomic<int> counter{0};
  return std::string(prefix) + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

}  // namespace

pid_t SpawnProgram(const std::vector<std::string>& argv, const std::string& log) {
  return Spawn(argv, log);
}

int WaitForExit(pid_t pid, double seconds) { return WaitFor(pid, seconds); }

bool BecomeNobody() {
  return setgroups(0, nullptr) == 0 && setresgid(65534, 65534, 65534) == 0 &&
         setresuid(65534, 65534, 65534) == 0;
}

bool FuseAvailable() {
  static const bool available = [] {
    const int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      std::fprintf(stderr,
                   "\n**********************************************************\n"
                   "*** SKIPPING the mount tests: cannot open /dev/fuse (%s)\n"
                   "*** They need the fuse module and access to /dev/fuse.\n"
                   "**********************************************************\n\n",
                   std::strerror(errno));
      return false;
    }
    close(fd);
    return true;
  }();
  return available;
}

bool IsMountPoint(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // id parent major:minor root MOUNT_POINT ...
    std::istringstream fields(line);
    std::string id, parent, dev, root, mount_point;
    fields >> id >> parent >> dev >> root >> mount_point;
    if (mount_point == dir) return true;
  }
  return false;
}

int RunProgram(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = Spawn(argv, log);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 255;
  }
  return ExitCode(status);
}

FsckResult FsckImage(const std::string& image) {
  RunResult r = Run("NVFS_FSCK", {"-n", image});
  return {r.exit_code, r.out};
}

FsckResult CheckFsckClean(const std::string& image) {
  const FsckResult fsck = FsckImage(image);
  INFO("fsck.nvfs -n " << image << ": " << fsck.output);
  CHECK(fsck.exit_code == 0);
  return fsck;
}

FsckResult StopAndCheck(MountedFs& m) {
  CHECK(m.Stop() == 0);
  return CheckFsckClean(m.image());
}

bool WaitImageFree(const std::string& image, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const int fd = open(image.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;  // gone: nobody holds it
    const bool free = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd);
    if (free) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

DaemonResult RunDaemonExpectingFailure(const std::vector<std::string>& args,
                                       const std::string& mount_dir) {
  const std::string log = "/dev/shm/" + UniqueName("nvfs-mt-fail-") + ".log";
  std::vector<std::string> argv{Program("NVFS_DAEMON"), "-f"};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = Spawn(argv, log);
  DaemonResult result;
  int code = WaitFor(pid, 10);
  if (code < 0) {
    // It is serving: it mounted although it should not have.
    result.mounted = IsMountPoint(mount_dir);
    Unmount(mount_dir);
    code = WaitFor(pid, 5);
    if (code < 0) {
      kill(pid, SIGKILL);
      code = WaitFor(pid, 5);
    }
  }
  result.mounted = result.mounted || IsMountPoint(mount_dir);
  Unmount(mount_dir);
  result.exit_code = code;
  result.output = ReadText(log);
  unlink(log.c_str());
  return result;
}

MountedFs::MountedFs(uint64_t image_size) {
  image_ = "/dev/shm/" + UniqueName("nvfs-mt-") + ".img";
  log_ = image_ + ".log";
  char dir[] = "/tmp/nvfs-mnt-XXXXXX";
  if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp");
  dir_ = dir;
  // No destructor runs if the constructor throws: undo by hand.
  std::string failure;
  try {
    RunResult r = Run("NVFS_MKFS", {"-q", "-s", std::to_string(image_size), image_});
    if (r.exit_code != 0) failure = "mkfs.nvfs failed: " + r.out;
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    rmdir(dir_.c_str());
    unlink(image_.c_str());
    throw std::runtime_error(failure);
  }
}

MountedFs::~MountedFs() {
  Unmount(dir_);
  if (pid_ > 0 && Reap(5) < 0) {
    kill(pid_, SIGKILL);  // our own child, by PID
    Reap(5);
  }
  Unmount(dir_);  // a daemon killed above leaves its mount dead
  rmdir(dir_.c_str());
  unlink(image_.c_str());
  unlink(log_.c_str());
}

std::string MountedFs::log() const { return ReadText(log_); }

int MountedFs::Reap(double seconds) {
  if (pid_ <= 0) return -1;
  const int code = WaitFor(pid_, seconds);
  if (code >= 0) pid_ = -1;
  return code;
}

void MountedFs::Start(const std::string& options, const std::vector<std::string>& flags) {
  REQUIRE(pid_ <= 0);
  REQUIRE_FALSE(IsMountPoint(dir_));
  std::vector<std::string> argv{Program("NVFS_DAEMON"), "-f"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  if (!options.empty()) {
    argv.push_back("-o");
    argv.push_back(options);
  }
  argv.push_back(image_);
  argv.push_back(dir_);
  // The mount point shows up before the kernel's INIT is served; the daemon
  // says "mounted on" once it has been (and its direct-read socket is
  // bound). A test that unmounts at once must not cut the handshake short.
  const auto mounted_lines = [&] {
    const std::string text = log();
    size_t n = 0;
    for (size_t at = text.find(": mounted on "); at != std::string::npos;
         at = text.find(": mounted on ", at + 1)) {
      ++n;
    }
    return n;
  };
  const size_t mounted_before = mounted_lines();
  pid_ = Spawn(argv, log_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!IsMountPoint(dir_) || mounted_lines() == mounted_before) {
    const int code = WaitFor(pid_, 0);
    if (code >= 0) {
      pid_ = -1;
      FAIL("nvfs exited with status " << code << " before mounting: " << log());
    }
    if (std::chrono::steady_clock::now() > deadline) FAIL("nvfs did not mount within 10 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

int MountedFs::Stop() {
  REQUIRE(pid_ > 0);
  // The kernel may refuse the unmount for a moment (EBUSY, fusermount3
  // exits 1) while another process's request on the mount still waits for
  // the daemon: on a shared machine, any statfs of every mount (df, -d
  // traces show STATFS from strangers' pids), and after a burst of work the
  // daemon answers late (seen with the slow ASan daemon over io_uring, and
  // right after 10,000 creates). A mount kept busy by a file the test left
  // open stays busy: 10 s, then the failure.
  int rc = RunProgram({"fusermount3", "-u", dir_});
  for (int i = 0; rc != 0 && i < 200 && IsMountPoint(dir_); ++i) {
    usleep(50 * 1000);
    rc = RunProgram({"fusermount3", "-u", dir_});
  }
  INFO("daemon log: " << log());
  REQUIRE(rc == 0);
  const int code = Reap(10);
  REQUIRE(code >= 0);  // the destructor kills it otherwise
  // The caller checks the status; the log, which the destructor deletes,
  // says why it is not 0.
  if (code != 0) WARN("nvfs exited with status " << code << " at unmount; its log: " << log());
  REQUIRE_FALSE(IsMountPoint(dir_));
  return code;
}

int MountedFs::WaitExit() {
  REQUIRE(pid_ > 0);
  INFO("daemon log: " << log());
  const int code = Reap(10);
  REQUIRE(code >= 0);
  REQUIRE_FALSE(IsMountPoint(dir_));
  return code;
}

int MountedFs::Signal(int sig) {
  REQUIRE(pid_ > 0);
  kill(pid_, sig);
  // Generous: the exit unmounts the core, and on a loaded machine (the
  // suites run side by side) one took over 10 s over io_uring.
  const int code = Reap(30);
  INFO("daemon log: " << log());
  REQUIRE(code >= 0);
  if (sig == SIGKILL) Unmount(dir_);  // the kernel keeps a dead mount
  return code;
}

}  // namespace nvfs::test
