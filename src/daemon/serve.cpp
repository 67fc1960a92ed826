// One mount's life (serve.hpp): the steps of main.cpp's list from the
// core's mount to the core's unmount, in the order they must run.
#include "daemon/serve.hpp"

#include <sys/sysmacros.h>
#include <syslog.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "daemon/direct_writers.hpp"
#include "daemon/host.hpp"
#include "daemon/say.hpp"
#include "fuse/transport.hpp"
#include "nvfs/media.hpp"

namespace nvfs::daemon {

namespace {

// How long a mount waits for a direct writer of an earlier mount to leave
// its store (a store is microseconds; a stopped process is refused).
constexpr int kEarlierWritersSeconds = 10;

// Unmounts the core; the one place a failure to leave the namespace clean
// is reported.
int UnmountCore(std::unique_ptr<nvfs::Filesystem> fs, const std::string& device) {
  nvfs::Status st = fs->Unmount();
  if (!st.ok()) {
    Say("%s: unmount failed: %s", device.c_str(), st.error().Describe().c_str());
    return 1;
  }
  return 0;
}

// Serves the kernel's first request, INIT, before the request loop starts:
// when this returns the kernel has taken the reply (its read-ahead limit
// among it), so what is set after it stays set. False if the session ended
// first (a signal, an unmount).
bool ServeInit(fuse_session* se) {
  fuse_buf buf{};
  int got;
  do {
    got = fuse_session_receive_buf(se, &buf);
  } while (got == -EINTR && !fuse_session_exited(se));
  if (got > 0) fuse_session_process_buf(se, &buf);
  std::free(buf.mem);
  return got > 0 && !fuse_session_exited(se);
}

// The device number of the mount at `mountpoint`; false if unknown.
}  // namespace

Daemon::Daemon(const CommandLine& cl, const DaemonOptions& options)
    : cl_(cl), options_(options), adapter_(options.adapter) {}

int Daemon::GiveUp(bool fuse_mounted) {
  fuse_session* se = session_.get();
  if (fuse_mounted) fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  (void)UnmountCore(std::move(fs_), options_.device);
  return 1;
}

int Daemon::Mount(fuse_args* args) {
  const std::string& device = options_.device;
  const std::string& mountpoint = options_.mountpoint;
  fuse_session* se =
      fuse_session_new(args, &nvfs::FuseAdapter::Ops(), sizeof(fuse_lowlevel_ops), &adapter_);
  if (se == nullptr) return 1;  // libfuse said why (an unknown option)
  adapter_.set_session(se);
  session_.reset(se);

  nvfs::MountOptions mount_options;
  mount_options.read_only = cl_.read_only;
  mount_options.errors = options_.errors;
  mount_options.log = [](const std::string& line) { Say("%s", line.c_str()); };
  // The core cleared set-user-ID on its own (a write by a caller without
  // CAP_FSETID): the kernel's cached mode is stale.
  FuseAdapter& adapter = adapter_;
  mount_options.privs_dropped = [&adapter](uint64_t ino) { adapter.ForgetCachedAttr(ino); };
  mount_options.data_freed = [&adapter](uint64_t ino) { adapter.ForgetCachedAttr(ino); };
  mount_options.caller_in_group = [](uint32_t gid) { return nvfs::CallerInGroup(gid); };
  if (cl_.extent_map_runs >= 0) {
    mount_options.extent_map_runs = static_cast<uint32_t>(cl_.extent_map_runs);
  }
  // Address space for the mapping to grow into while mounted (nvfs-resize
  // through the control socket): a reservation costs no memory.
  mount_options.grow_reserve = uint64_t{8} << 40;
  auto mounted = nvfs::Filesystem::Mount(device, mount_options);
  if (!mounted.ok()) {
    Say("%s", mounted.error().Describe().c_str());
    return 1;
  }
  fs_ = std::move(mounted.value());
  adapter_.set_filesystem(fs_.get());
  if (const std::string exposure = nvfs::NamespaceExposure(device); !exposure.empty()) {
    Say("warning: %s", exposure.c_str());
  }
  if (fs_->recorded_errors()) {
    Say("%s: warning: the filesystem has recorded errors; %s; run fsck.nvfs", device.c_str(),
        fs_->read_only() ? "mounted read-only" : "mounted read-write (errors=continue)");
  }
  // A daemon killed under direct writers leaves them running: before this
  // mount can give any block to another file, none of them may still be
  // inside a store (direct_writers.hpp, doc/integrity.md section 11).
  if (!fs_->read_only()) {
    const nvfs::direct::NamespaceIdentity id = nvfs::direct::IdentityAt(fs_->media().base());
    std::string why;
    if (!nvfs::direct::WaitForEarlierWriters(id.uuid, id.mount_count, kEarlierWritersSeconds,
                                             &why)) {
      Say("%s: %s", device.c_str(), why.c_str());
      (void)UnmountCore(std::move(fs_), device);
      return 1;
    }
  }

  if (fuse_set_signal_handlers(se) != 0) {
    Say("cannot set signal handlers");
    (void)UnmountCore(std::move(fs_), device);
    return 1;
  }
  if (fuse_session_mount(se, mountpoint.c_str()) != 0) {
    // libfuse printed why (e.g. "fuse: device not found").
    Say("%s: cannot mount on %s", device.c_str(), mountpoint.c_str());
    return GiveUp(false);
  }
  const int io = nvfs::InstallTransport(se);
  if (io != 0) {
    Say("%s: cannot set up the FUSE transport: %s", mountpoint.c_str(), std::strerror(-io));
    return GiveUp(true);
  }
  if (!ServeInit(se)) {
    Say("%s: the kernel did not complete the FUSE handshake", mountpoint.c_str());
    return GiveUp(true);
  }
  // The mount shows in mountinfo now, under the device number the kernel
  // gave it: an opener of the namespace refuses while it does, and waits
  // for this process once umount has taken it away; nvfs-resize finds the
  // control socket by it. Unknown: the namespace stays in use, never
  // waited for, until the session ends.
  if (const std::optional<nvfs::MountName> mount = nvfs::MountAt(mountpoint)) {
    mount_dev_ = mount->dev;
    fs_->ServeThroughMount(*mount);
  }
  use_ring_ = adapter_.protocol().io_uring;
  if (options_.uring_mode == nvfs::UringMode::kOn && !use_ring_) {
    Say("io_uring=on: the kernel did not offer FUSE over io_uring in INIT");
    return GiveUp(true);
  }
  if (options_.adapter.cache == nvfs::CacheMode::kPage) {
    SetReadAhead(mountpoint, mount_dev_, cl_.read_ahead_kb >= 0 ? cl_.read_ahead_kb : 1024,
                 cl_.read_ahead_kb >= 0);
  }
  return 0;
}

void Daemon::OpenSockets() {
  const std::string& device = options_.device;
  // Direct reads: the socket is bound before the daemon detaches, so that a
  // client started once this command has returned finds it (it waits in
  // the backlog until the thread starts, below).
  if (options_.direct_reads) {
    std::string why = "the mount's device number is unknown";
    std::string writes_why;
    if (mount_dev_.has_value()) {
      nvfs::direct::ServerOptions direct_options;
      // With cache=page the kernel's cached pages would miss a direct
      // write: such mounts' files are written through the kernel.
      direct_options.writes = options_.adapter.cache == nvfs::CacheMode::kNone;
      direct_options.size_changed = [this](uint64_t ino, uint64_t size, uint8_t last_byte) {
        adapter_.DirectlyGrown(ino, size, last_byte);
      };
      direct_options.attrs_changed = [this](uint64_t ino) { adapter_.ForgetCachedAttr(ino); };
      direct_ = nvfs::direct::Server::Create(*fs_, *mount_dev_, device, direct_options, &why,
                                             &writes_why);
    }
    direct_note_ = direct_ == nullptr ? "direct reads off: " + why
                   : "direct reads on " + direct_->socket_path() +
                         (direct_->writes() ? " (and writes)" : " (writes off: " + writes_why + ")");
  }
  // The control socket (nvfs-resize of the mounted filesystem): root only.
  if (!fs_->read_only() && mount_dev_.has_value()) {
    std::string why;
    control_ = nvfs::control::Server::Create(*fs_, *mount_dev_, device, &why);
  }
}

int Daemon::Detach() {
  if (!cl_.foreground) openlog("nvfs", LOG_PID, LOG_DAEMON);
  if (fuse_daemonize(cl_.foreground ? 1 : 0) != 0) {
    Say("cannot detach (fork failed); try -f");
    return GiveUp(true);
  }
  SetDetached(!cl_.foreground);
  return 0;
}

int Daemon::Start() {
  const std::string& device = options_.device;
  const std::string& mountpoint = options_.mountpoint;
  // The rings start here, after the fork (threads do not survive one) and
  // after INIT's reply (the kernel takes no REGISTER before it); the kernel
  // holds requests back until they are registered.
  const char* transport = "/dev/fuse";
  if (use_ring_) {
    ring_ = std::make_unique<nvfs::UringTransport>(session_.get(), &adapter_);
    const int r = ring_->Start();
    if (r != 0) {
      ring_.reset();
      if (options_.uring_mode == nvfs::UringMode::kOn) {
        Say("io_uring=on: cannot start the rings: %s", std::strerror(-r));
        return GiveUp(true);
      }
      Say("%s: cannot start the io_uring queues (%s): serving over /dev/fuse",
          mountpoint.c_str(), std::strerror(-r));
    } else {
      transport = "io_uring";
    }
  }
  if (control_ != nullptr && !control_->Serve()) control_.reset();
  if (direct_ != nullptr && !direct_->Serve()) {
    direct_.reset();
    direct_note_ = "direct reads off: cannot start their thread";
  }
  if (ring_ != nullptr) {
    Say("%s: mounted on %s, transport io_uring (%u queues of %u entries, one pinned thread "
        "each; /dev/fuse for FORGET, INTERRUPT, notifications); %s",
        device.c_str(), mountpoint.c_str(), ring_->queues(), nvfs::UringTransport::kQueueDepth,
        direct_note_.c_str());
  } else {
    Say("%s: mounted on %s, transport %s; %s", device.c_str(), mountpoint.c_str(), transport,
        direct_note_.c_str());
  }
  return 0;
}

int Daemon::Run() {
  fuse_session* se = session_.get();
  int loop;
  fuse_loop_config* config = cl_.single_thread ? nullptr : fuse_loop_cfg_create();
  if (config == nullptr) {
    loop = fuse_session_loop(se);  // -s, or no memory for a thread pool
  } else {
    fuse_loop_cfg_set_clone_fd(config, 1);
    if (cl_.threads != 0) {
      fuse_loop_cfg_set_max_threads(config, cl_.threads);
      fuse_loop_cfg_set_idle_threads(config, cl_.threads);
    }
    loop = fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
  }
  if (ring_ != nullptr) ring_->Stop();
  // No direct request reaches the core from now on; the table stays, kept
  // current by the core, until `direct_` goes after the core's unmount.
  if (direct_ != nullptr) direct_->Stop();
  if (control_ != nullptr) control_->Stop();  // waits for a grow in progress
  adapter_.StopInvalidations();  // it notifies through the session freed below
  // Every worker has returned: nothing runs in the core any more. A mount
  // of the namespace from now on waits for this process to exit.
  fs_->EndService();
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  // The releases below may tell the kernel of freed data (data_freed): no
  // session to tell any more, and none to point at once it is freed.
  adapter_.set_session(nullptr);
  session_.reset();
  adapter_.EndSession();  // what the kernel still held: open files, lookups
  int status = UnmountCore(std::move(fs_), options_.device);
  if (loop < 0) {
    Say("%s: session ended with an error: %s", options_.mountpoint.c_str(), std::strerror(-loop));
    status = 1;
  }
  return status;
}

}  // namespace nvfs::daemon
