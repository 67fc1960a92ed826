// The daemon's socket skeleton (socket_server.hpp).
#include "daemon/socket_server.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <linux/sockios.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <system_error>

#include "nvfs/paths.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::daemon {

namespace {

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// The directory of the sockets: root's, writable by root alone, so that a
// socket in it is a daemon's (clients check the same).
bool MakeSocketDir(std::string* why) {
  const char* dir = kSocketDir;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    *why = std::string("cannot make ") + dir + ": " + std::strerror(errno);
    return false;
  }
  struct stat st;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 ||
      (st.st_mode & (S_IWGRP | S_IWOTH))) {
    *why = std::string(dir) + " is not a directory writable by root alone";
    return false;
  }
  return true;
}

}  // namespace

bool RootAndNamespace(const std::string& namespace_path, struct stat* namespace_stat,
                      std::string* why) {
  if (geteuid() != 0) {
    *why = "the daemon is not root (only root may make sockets in /run/nvfs)";
    return false;
  }
  if (stat(namespace_path.c_str(), namespace_stat) != 0) {
    *why = namespace_path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

bool ClientDescriptors::Start(const struct stat& namespace_stat, dev_t mount_dev,
                              std::string* why) {
  namespace_stat_ = namespace_stat;
  mount_dev_ = mount_dev;
  reaper_ = Reaper::Create(why);
  return reaper_ != nullptr;
}

namespace {

// What the kernel knows of a descriptor, without asking whoever serves the
// file system it is on (a FUSE server may never answer).
bool StatFd(int fd, struct statx* stx) {
  return statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_INO, stx) == 0;
}

}  // namespace

bool ClientDescriptors::IsNamespace(int fd) const {
  struct statx stx {};
  return StatFd(fd, &stx) && IsNamespace(stx);
}

bool ClientDescriptors::IsNamespace(const struct statx& stx) const {
  if ((stx.stx_mode & S_IFMT) != (namespace_stat_.st_mode & S_IFMT)) return false;
  if (S_ISCHR(namespace_stat_.st_mode)) {
    return makedev(stx.stx_rdev_major, stx.stx_rdev_minor) == namespace_stat_.st_rdev;
  }
  return makedev(stx.stx_dev_major, stx.stx_dev_minor) == namespace_stat_.st_dev &&
         stx.stx_ino == namespace_stat_.st_ino;
}

void ClientDescriptors::Release(int fd, uid_t owner) const noexcept {
  if (fd < 0) return;
  struct statx stx {};
  const bool here = StatFd(fd, &stx) &&
                    (IsNamespace(stx) ||
                     (makedev(stx.stx_dev_major, stx.stx_dev_minor) == mount_dev_ &&
                      (S_ISREG(stx.stx_mode) || S_ISDIR(stx.stx_mode))));
  if (here) {
    close(fd);
  } else {
    reaper_->Release(fd, owner);
  }
}

void ClientDescriptors::CloseConnection(int fd, uid_t owner) const noexcept {
  if (fd < 0) return;
  // After the shutdown the peer's sendmsg fails (the kernel checks under
  // the lock it queues with), so what is queued now is all there will be.
  (void)shutdown(fd, SHUT_RDWR);
  int queued = 0;
  if (ioctl(fd, SIOCINQ, &queued) == 0 && queued == 0) {
    close(fd);
  } else {
    reaper_->Release(fd, owner);
  }
}

bool SocketServer::Listen(const std::string& path, mode_t mode, int backlog, int type_flags,
                          bool descriptors_from_connect, std::string* why) {
  if (!MakeSocketDir(why)) return false;
  path_ = path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof addr.sun_path) {
    *why = "socket path too long";
    return false;
  }
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0);
  if (listen_fd_ < 0) {
    *why = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  // Before any client can connect: connections inherit it.
  descriptors_gated_ = !descriptors_from_connect && AcceptDescriptors(listen_fd_, false);
  // A socket left there is a killed daemon's, of a mount gone since: the
  // device number is this mount's now.
  (void)unlink(path_.c_str());
  // Never more open than `mode`, even before the chmod: the umask covers
  // the bind.
  const mode_t old_mask = umask(0777 & ~mode);
  const int bound = bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  umask(old_mask);
  struct stat st;
  if (bound != 0 || chmod(path_.c_str(), mode) != 0 || listen(listen_fd_, backlog) != 0 ||
      stat(path_.c_str(), &st) != 0) {
    *why = path_ + ": " + std::strerror(errno);
    CloseFd(listen_fd_);
    (void)unlink(path_.c_str());
    return false;
  }
  socket_ino_ = st.st_ino;
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    *why = std::string("eventfd: ") + std::strerror(errno);
    CloseFd(listen_fd_);
    (void)unlink(path_.c_str());
    return false;
  }
  return true;
}

bool SocketServer::Start(ClientDescriptors& descriptors, std::function<void()> run) {
  if (thread_.joinable() || listen_fd_ < 0) return false;
  std::string why;  // the daemon goes on without this server either way
  if (!descriptors.Serve(&why)) return false;
  try {
    thread_ = std::thread(std::move(run));
  } catch (const std::system_error&) {
    return false;
  }
  return true;
}

void SocketServer::Join() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
}

void SocketServer::Stop() {
  Join();
  if (listen_fd_ >= 0) {
    struct stat st;
    if (stat(path_.c_str(), &st) == 0 && st.st_ino == socket_ino_) {
      (void)unlink(path_.c_str());
    }
    CloseFd(listen_fd_);
  }
  CloseFd(wake_fd_);
}

}  // namespace nvfs::daemon
