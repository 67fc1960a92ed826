// nvfs: mounts an nvfs namespace through FUSE (libfuse3, low-level API).
//
//   nvfs [-f] [-d] [-s] [-o OPTION,...] DEVICE MOUNTPOINT
//
// Life cycle, in this order, so that every refusal happens before anything
// is mounted and leaves the namespace untouched or cleanly unmounted:
//   1. parse the command line (fuse_opt): nvfs's own options are taken out,
//      the rest goes to libfuse (fuse_session_new rejects what it does not
//      know, before the namespace is opened);
//   2. mount the core (Filesystem::Mount): a missing, foreign, damaged or
//      in-use namespace fails here with one line and exit status 1;
//   3. mount the FUSE file system, detach (unless -f), serve requests;
//   4. on umount, SIGTERM, SIGINT or SIGHUP: leave the loop, unmount FUSE,
//      then Filesystem::Unmount (exact counters, state clean) and exit 0.
// After kill -9 nothing of this runs: every operation that returned is
// durable already, and the next mount recovers (journal, orphans).
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <syslog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/control.hpp"
#include "direct/server.hpp"
#include "fuse/adapter.hpp"
#include "fuse/transport.hpp"
#include "fuse/uring.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/media.hpp"

namespace {

constexpr const char* kUsage =
    "Usage: nvfs [-f] [-d] [-s] [-o OPTION,...] DEVICE MOUNTPOINT\n"
    "Mounts the nvfs filesystem on DEVICE (a DAX character device or an image\n"
    "file made by mkfs.nvfs) at MOUNTPOINT.\n"
    "\n"
    "  -f                 stay in the foreground\n"
    "  -d                 debug: print every FUSE request (implies -f)\n"
    "  -s                 serve requests on one thread\n"
    "  -o OPTION,...      mount options (below)\n"
    "  -V, --version      print the version and exit\n"
    "  -h, --help         print this help and exit\n"
    "\n"
    "nvfs options:\n"
    "  read_path=read|iter|map  the core read path behind FUSE reads: one copy,\n"
    "                           a copy into 4 KiB segments, or none (the reply\n"
    "                           points into the mapping); default map\n"
    "  cache=none|page          none: FUSE direct I/O, no page cache but for\n"
    "                           shared mappings (default); page: the kernel\n"
    "                           page cache, write-through\n"
    "  threads=N                at most N worker threads (default 10)\n"
    "  io_uring=auto|on|off     the transport: FUSE over io_uring (one queue\n"
    "                           per CPU, a pinned thread each) when the kernel\n"
    "                           offers it, else /dev/fuse (auto, the default;\n"
    "                           NVFS_IO_URING in the environment changes it);\n"
    "                           on: io_uring or no mount; off: /dev/fuse.\n"
    "                           With -s, auto means off\n"
    "                           The kernel offers it while\n"
    "                           /sys/module/fuse/parameters/enable_uring is Y\n"
    "  read_ahead_kb=N          with cache=page, the kernel's read-ahead for the\n"
    "                           mount (default 1024; needs root, else the\n"
    "                           kernel's 128 is kept)\n"
    "  extent_map_runs=N        the most runs a file's DRAM extent map holds\n"
    "                           (about 20 bytes each; default 65536; 0: none,\n"
    "                           every read walks the block map)\n"
    "  entry_timeout=S          how long the kernel may trust a name it looked\n"
    "  attr_timeout=S           up, and an inode's attributes (default: as long\n"
    "                           as the mount; the daemon tells the kernel of\n"
    "                           every change it cannot know; for measurements)\n"
    "  direct=on|off            serve direct reads (libnvfs-direct) on the socket\n"
    "                           /run/nvfs/direct-MAJOR:MINOR of the mount (default\n"
    "                           on; needs root): processes that can read DEVICE\n"
    "                           read files from their own mapping of it\n"
    "  ro                       mount read-only\n"
    "  errors=remount-ro        on damage found on the media (a block pointer\n"
    "                           naming no data block, a damaged directory or\n"
    "                           xattr block): fail that request, log one line,\n"
    "                           set the superblock's errors flag and refuse\n"
    "                           every later change (EROFS) (default); a\n"
    "                           namespace with the flag set mounts read-only\n"
    "  errors=continue          the same, but go on serving changes, and mount\n"
    "                           a namespace with the flag set read-write\n"
    "\n"
    "Usual FUSE and mount options are passed to libfuse: allow_other,\n"
    "default_permissions (always on: the kernel checks permissions), fsname=\n"
    "(default DEVICE), subtype= (default nvfs), max_read=N, noatime, nodev,\n"
    "nosuid, noexec, ... Also usable as: mount -t fuse.nvfs DEVICE MOUNTPOINT -o ...\n"
    "(with -o remount,...: the mount at MOUNTPOINT changes its flags, ro/rw among\n"
    "them, through mount(8); no daemon starts)\n";

enum Key {
  kKeyForeground,
  kKeyDebug,
  kKeySingle,
  kKeyHelp,
  kKeyVersion,
  kKeyReadOnly,
  kKeyReadWrite,
  kKeyFsname,
  kKeySubtype,
  kKeyRemount,
};

struct CommandLine {
  char* read_path = nullptr;  // set by fuse_opt_parse (malloc'ed)
  char* cache = nullptr;
  char* errors = nullptr;
  char* io_uring = nullptr;
  char* direct = nullptr;
  unsigned threads = 0;
  int read_ahead_kb = -1;  // -1: not given
  long long extent_map_runs = -1;  // -1: not given
  double entry_timeout = -1;  // -1: not given
  double attr_timeout = -1;
  bool foreground = false;
  bool debug = false;
  bool single_thread = false;
  bool help = false;
  bool version = false;
  bool read_only = false;
  bool have_fsname = false;
  bool have_subtype = false;
  bool remount = false;
  std::vector<std::string> vfs_options;  // ro, nosuid, ...: what a remount may change
  std::vector<std::string> positional;

  ~CommandLine() {
    std::free(read_path);
    std::free(cache);
    std::free(errors);
    std::free(io_uring);
    std::free(direct);
  }
};

#define NVFS_OPT(templ, field) {templ, offsetof(CommandLine, field), 0}
const fuse_opt kOptions[] = {
    NVFS_OPT("read_path=%s", read_path),
    NVFS_OPT("cache=%s", cache),
    NVFS_OPT("errors=%s", errors),
    NVFS_OPT("io_uring=%s", io_uring),
    NVFS_OPT("direct=%s", direct),
    NVFS_OPT("threads=%u", threads),
    NVFS_OPT("read_ahead_kb=%d", read_ahead_kb),
    NVFS_OPT("extent_map_runs=%lld", extent_map_runs),
    NVFS_OPT("entry_timeout=%lf", entry_timeout),
    NVFS_OPT("attr_timeout=%lf", attr_timeout),
    FUSE_OPT_KEY("-f", kKeyForeground),
    FUSE_OPT_KEY("-d", kKeyDebug),
    FUSE_OPT_KEY("debug", kKeyDebug),
    FUSE_OPT_KEY("-s", kKeySingle),
    FUSE_OPT_KEY("-h", kKeyHelp),
    FUSE_OPT_KEY("--help", kKeyHelp),
    FUSE_OPT_KEY("-V", kKeyVersion),
    FUSE_OPT_KEY("--version", kKeyVersion),
    FUSE_OPT_KEY("ro", kKeyReadOnly),
    FUSE_OPT_KEY("rw", kKeyReadWrite),
    FUSE_OPT_KEY("fsname=", kKeyFsname),
    FUSE_OPT_KEY("subtype=", kKeySubtype),
    FUSE_OPT_KEY("remount", kKeyRemount),
    FUSE_OPT_END,
};
#undef NVFS_OPT

// Returns 0 to take an argument out of what libfuse sees, 1 to keep it.
// The mount flags a remount may change (the kernel changes ro/rw of a FUSE
// superblock and the mount's own flags; nothing of FUSE's).
bool IsVfsOption(const char* arg) {
  static const char* const kVfs[] = {"ro",         "rw",        "nosuid",      "suid",
                                     "nodev",      "dev",       "noexec",      "exec",
                                     "noatime",    "atime",     "nodiratime",  "diratime",
                                     "relatime",   "norelatime", "strictatime", "nostrictatime",
                                     "sync",       "async",     "dirsync"};
  for (const char* v : kVfs) {
    if (std::strcmp(arg, v) == 0) return true;
  }
  return false;
}

int ProcessOption(void* data, const char* arg, int key, fuse_args* /*out*/) {
  auto& cl = *static_cast<CommandLine*>(data);
  if (key != FUSE_OPT_KEY_NONOPT && IsVfsOption(arg)) cl.vfs_options.emplace_back(arg);
  switch (key) {
    case kKeyRemount: cl.remount = true; return 0;
    case FUSE_OPT_KEY_NONOPT: cl.positional.emplace_back(arg); return 0;
    case kKeyForeground: cl.foreground = true; return 0;
    case kKeyDebug: cl.debug = cl.foreground = true; return 1;
    case kKeySingle: cl.single_thread = true; return 0;
    case kKeyHelp: cl.help = true; return 0;
    case kKeyVersion: cl.version = true; return 0;
    case kKeyReadOnly: cl.read_only = true; return 1;
    case kKeyReadWrite: cl.read_only = false; return 1;
    case kKeyFsname: cl.have_fsname = true; return 1;
    case kKeySubtype: cl.have_subtype = true; return 1;
    default: return 1;
  }
}

// Before the daemon detaches, messages go to stderr; after, to syslog too.
bool g_detached = false;

void Say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Say(const char* fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "nvfs: %s\n", line);
  if (g_detached) syslog(LOG_ERR, "%s", line);
}

int UsageError(const char* message) {
  std::fprintf(stderr, "nvfs: %s\nTry 'nvfs --help' for more information.\n", message);
  return 1;
}

// Descriptors inherited from whoever started the daemon (a shell's
// redirections, a test harness's open files) would stay open for the life of
// the mount: one on a file of another mount keeps that mount busy ("umount:
// target is busy", fstests' checks after a test that mounted its scratch
// device) until this daemon exits. Only 0-2 are kept (fuse_daemonize points
// them at /dev/null when the daemon detaches); nothing reaches the daemon as
// a descriptor (MOUNTPOINT is a directory, never /dev/fd/N).
void CloseInheritedDescriptors() {
  if (close_range(3, ~0U, 0) == 0) return;
  const long limit = sysconf(_SC_OPEN_MAX);  // kernels before 5.9
  for (long fd = 3; fd < (limit > 0 ? limit : 1024); ++fd) (void)close(static_cast<int>(fd));
}

// An absolute path, so it still names the same thing after the daemon
// chdir()s to / (and reads well in /proc/mounts).
std::string Absolute(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) != nullptr) return resolved;
  return path;  // the open that follows reports why
}

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

// The "major:minor" of the file system mounted at `mountpoint` (the last
// one, if several are stacked there), from /proc/self/mountinfo: a stat()
// of the mount point would wait for this daemon's own GETATTR reply.
std::string MountDevice(const std::string& mountpoint) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line, found;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    if (!(fields >> id >> parent >> dev >> root >> point)) continue;
    std::string unescaped;  // mountinfo writes space, tab, newline and \ as \ooo
    for (size_t i = 0; i < point.size(); ++i) {
      const auto octal = [&](size_t at) { return point[at] >= '0' && point[at] <= '7'; };
      if (point[i] == '\\' && i + 3 < point.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
        unescaped += static_cast<char>((point[i + 1] - '0') * 64 + (point[i + 2] - '0') * 8 +
                                       (point[i + 3] - '0'));
        i += 3;
      } else {
        unescaped += point[i];
      }
    }
    if (unescaped == mountpoint) found = dev;
  }
  return found;
}

// The kernel gives a FUSE mount 128 KiB of read-ahead at most (the INIT
// reply can only lower it; ServeInit has run), so cold page-cache reads
// arrive in 128 KiB requests, each a round trip. Raising the mount's backing-device
// read-ahead lets one request fill up to kFuseMaxIo. Needs write access to
// sysfs (root); otherwise the kernel's value stays, with a warning when the
// value was asked for explicitly. Done before anything can open a file:
// a file takes its read-ahead window from the device when opened.
void SetReadAhead(const std::string& mountpoint, int kb, bool asked) {
  const std::string dev = MountDevice(mountpoint);
  const std::string path = "/sys/class/bdi/" + dev + "/read_ahead_kb";
  const int fd = dev.empty() ? -1 : open(path.c_str(), O_WRONLY | O_CLOEXEC);
  int error = dev.empty() ? ENOENT : errno;
  if (fd >= 0) {
    const std::string value = std::to_string(kb) + "\n";
    const bool ok = write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
    error = ok ? 0 : errno;
    close(fd);
  }
  if (error != 0 && asked) {
    Say("%s: cannot set read_ahead_kb (%s): kept the kernel's", mountpoint.c_str(),
        std::strerror(error));
  }
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

}  // namespace

int main(int argc, char** argv) {
  fuse_args args = FUSE_ARGS_INIT(argc, argv);
  std::unique_ptr<fuse_args, void (*)(fuse_args*)> args_owner(&args, fuse_opt_free_args);
  CommandLine cl;
  if (fuse_opt_parse(&args, &cl, kOptions, ProcessOption) != 0) return UsageError("bad option");
  if (cl.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cl.version) {
    std::printf("nvfs %s (libfuse %s)\n", NVFS_VERSION, fuse_pkgversion());
    return 0;
  }
  if (cl.positional.size() != 2) {
    return UsageError(cl.positional.empty()      ? "no DEVICE and MOUNTPOINT given"
                      : cl.positional.size() == 1 ? "no MOUNTPOINT given"
                                                  : "too many arguments");
  }
  // mount -o remount,... of a fuse.nvfs mount runs us (mount.fuse3) with
  // "remount": the namespace is served already, by the daemon of that
  // mount, and the kernel makes the change itself (ro/rw, the mount's
  // flags). Hand it to mount(8) (-i: no helper, so not us again), as
  // libfuse's own mount helpers do; no second daemon starts.
  if (cl.remount) {
    std::string opts = "remount";
    for (const std::string& o : cl.vfs_options) opts += "," + o;
    const std::string mountpoint = cl.positional[1];
    execlp("mount", "mount", "-i", "-o", opts.c_str(), mountpoint.c_str(),
           static_cast<char*>(nullptr));
    Say("remount: cannot run mount(8): %s", std::strerror(errno));
    return 1;
  }
  CloseInheritedDescriptors();
  nvfs::AdapterOptions adapter_options;
  if (cl.read_path != nullptr) {
    const std::string v = cl.read_path;
    if (v == "read") {
      adapter_options.read_path = nvfs::ReadPath::kRead;
    } else if (v == "iter") {
      adapter_options.read_path = nvfs::ReadPath::kIter;
    } else if (v == "map") {
      adapter_options.read_path = nvfs::ReadPath::kMap;
    } else {
      return UsageError("read_path must be read, iter or map");
    }
  }
  if (cl.cache != nullptr) {
    const std::string v = cl.cache;
    if (v == "none") {
      adapter_options.cache = nvfs::CacheMode::kNone;
    } else if (v == "page") {
      adapter_options.cache = nvfs::CacheMode::kPage;
    } else {
      return UsageError("cache must be none or page");
    }
  }
  // The transport (fuse/uring.hpp). The environment's NVFS_IO_URING is the
  // default, so that a test suite can run every mount over either.
  nvfs::UringMode uring_mode = nvfs::UringMode::kAuto;
  {
    const char* env = std::getenv("NVFS_IO_URING");
    const char* given = cl.io_uring != nullptr ? cl.io_uring : env;
    if (given != nullptr && *given != '\0') {
      const std::string v = given;
      if (v == "auto") {
        uring_mode = nvfs::UringMode::kAuto;
      } else if (v == "on") {
        uring_mode = nvfs::UringMode::kOn;
      } else if (v == "off") {
        uring_mode = nvfs::UringMode::kOff;
      } else {
        return UsageError(cl.io_uring != nullptr ? "io_uring must be auto, on or off"
                                                 : "NVFS_IO_URING must be auto, on or off");
      }
    }
  }
  nvfs::ErrorBehavior errors = nvfs::ErrorBehavior::kRemountReadOnly;
  if (cl.errors != nullptr) {
    const std::string v = cl.errors;
    if (v == "continue") {
      errors = nvfs::ErrorBehavior::kContinue;
    } else if (v != "remount-ro") {
      return UsageError("errors must be remount-ro or continue");
    }
  }
  bool direct_reads = true;
  if (cl.direct != nullptr) {
    const std::string v = cl.direct;
    if (v == "off") {
      direct_reads = false;
    } else if (v != "on") {
      return UsageError("direct must be on or off");
    }
  }
  if (cl.read_ahead_kb < -1 || cl.read_ahead_kb > (1 << 20)) {
    return UsageError("read_ahead_kb must be between 0 and 1048576");
  }
  if (cl.extent_map_runs < -1 || cl.extent_map_runs > (1 << 24)) {
    return UsageError("extent_map_runs must be between 0 and 16777216");
  }
  for (double* timeout : {&cl.entry_timeout, &cl.attr_timeout}) {
    if (*timeout == -1) continue;
    if (!(*timeout >= 0 && *timeout <= nvfs::kCacheForever)) {
      return UsageError("entry_timeout and attr_timeout must be between 0 and 1e9 seconds");
    }
  }
  if (cl.entry_timeout != -1) adapter_options.entry_timeout = cl.entry_timeout;
  if (cl.attr_timeout != -1) adapter_options.attr_timeout = cl.attr_timeout;
  const std::string device = Absolute(cl.positional[0]);
  const std::string mountpoint = Absolute(cl.positional[1]);
  struct stat st;
  if (stat(mountpoint.c_str(), &st) != 0) {
    Say("%s: %s", mountpoint.c_str(), std::strerror(errno));
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) {
    Say("%s: not a directory", mountpoint.c_str());
    return 1;
  }

  // What the kernel cannot tell before INIT: whether it lets FUSE use
  // io_uring at all, and whether this process can set one up. io_uring=on
  // refuses here, before anything is mounted.
  // -s asks for one serving thread, which io_uring's thread per queue is
  // not: auto then stays on /dev/fuse (on still means io_uring).
  if (uring_mode == nvfs::UringMode::kAuto && cl.single_thread) uring_mode = nvfs::UringMode::kOff;
  if (uring_mode != nvfs::UringMode::kOff) {
    const std::string why = nvfs::UringUnavailable();
    if (!why.empty()) {
      if (uring_mode == nvfs::UringMode::kOn) {
        Say("io_uring=on: %s", why.c_str());
        return 1;
      }
      uring_mode = nvfs::UringMode::kOff;
    }
  }
  adapter_options.io_uring = uring_mode != nvfs::UringMode::kOff;

  // The core checks no permissions: the kernel must. fsname and subtype make
  // /proc/mounts read "DEVICE MOUNTPOINT fuse.nvfs".
  fuse_opt_add_arg(&args, "-odefault_permissions");
  if (!cl.have_subtype) fuse_opt_add_arg(&args, "-osubtype=nvfs");
  if (!cl.have_fsname) {
    char* opts = nullptr;
    if (fuse_opt_add_opt_escaped(&opts, ("fsname=" + device).c_str()) != 0) return 1;
    fuse_opt_add_arg(&args, ("-o" + std::string(opts)).c_str());
    std::free(opts);
  }

  nvfs::FuseAdapter adapter(adapter_options);
  fuse_session* se =
      fuse_session_new(&args, &nvfs::FuseAdapter::Ops(), sizeof(fuse_lowlevel_ops), &adapter);
  if (se == nullptr) return 1;  // libfuse said why (an unknown option)
  adapter.set_session(se);
  std::unique_ptr<fuse_session, void (*)(fuse_session*)> session(se, fuse_session_destroy);

  nvfs::MountOptions mount_options;
  mount_options.read_only = cl.read_only;
  mount_options.errors = errors;
  mount_options.log = [](const std::string& line) { Say("%s", line.c_str()); };
  // The core cleared set-user-ID on its own (a write by a caller without
  // CAP_FSETID): the kernel's cached mode is stale.
  mount_options.privs_dropped = [&adapter](uint64_t ino) { adapter.ForgetCachedAttr(ino); };
  mount_options.data_freed = [&adapter](uint64_t ino) { adapter.ForgetCachedAttr(ino); };
  mount_options.caller_in_group = [](uint32_t gid) { return nvfs::CallerInGroup(gid); };
  if (cl.extent_map_runs >= 0) {
    mount_options.extent_map_runs = static_cast<uint32_t>(cl.extent_map_runs);
  }
  // Direct reads' server: declared before the filesystem, whose inode
  // cache writes into its table to the end, so that it goes after it.
  std::unique_ptr<nvfs::direct::Server> direct;
  std::unique_ptr<nvfs::control::Server> control;
  // Address space for the mapping to grow into while mounted (nvfs-resize
  // through the control socket): a reservation costs no memory.
  mount_options.grow_reserve = uint64_t{8} << 40;
  auto mounted = nvfs::Filesystem::Mount(device, mount_options);
  if (!mounted.ok()) {
    Say("%s", mounted.error().Describe().c_str());
    return 1;
  }
  std::unique_ptr<nvfs::Filesystem> fs = std::move(mounted.value());
  adapter.set_filesystem(fs.get());
  if (const std::string exposure = nvfs::NamespaceExposure(device); !exposure.empty()) {
    Say("warning: %s", exposure.c_str());
  }
  if (fs->recorded_errors()) {
    Say("%s: warning: the filesystem has recorded errors; %s; run fsck.nvfs", device.c_str(),
        fs->read_only() ? "mounted read-only" : "mounted read-write (errors=continue)");
  }

  if (fuse_set_signal_handlers(se) != 0) {
    Say("cannot set signal handlers");
    (void)UnmountCore(std::move(fs), device);
    return 1;
  }
  if (fuse_session_mount(se, mountpoint.c_str()) != 0) {
    // libfuse printed why (e.g. "fuse: device not found").
    Say("%s: cannot mount on %s", device.c_str(), mountpoint.c_str());
    fuse_remove_signal_handlers(se);
    (void)UnmountCore(std::move(fs), device);
    return 1;
  }
  const int io = nvfs::InstallTransport(se);
  if (io != 0) {
    Say("%s: cannot set up the FUSE transport: %s", mountpoint.c_str(), std::strerror(-io));
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    (void)UnmountCore(std::move(fs), device);
    return 1;
  }
  if (!ServeInit(se)) {
    Say("%s: the kernel did not complete the FUSE handshake", mountpoint.c_str());
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    (void)UnmountCore(std::move(fs), device);
    return 1;
  }
  // The mount shows in mountinfo now, with the device as its source (unless
  // fsname= said otherwise): an opener of the namespace refuses while it
  // does, and waits for this process once umount has taken it away.
  if (!cl.have_fsname) fs->ServeThroughMount();
  const bool use_ring = adapter.protocol().io_uring;
  if (uring_mode == nvfs::UringMode::kOn && !use_ring) {
    Say("io_uring=on: the kernel did not offer FUSE over io_uring in INIT");
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    (void)UnmountCore(std::move(fs), device);
    return 1;
  }
  if (adapter_options.cache == nvfs::CacheMode::kPage) {
    SetReadAhead(mountpoint, cl.read_ahead_kb >= 0 ? cl.read_ahead_kb : 1024,
                 cl.read_ahead_kb >= 0);
  }
  // Direct reads: the socket is bound before the daemon detaches, so that a
  // client started once this command has returned finds it (it waits in
  // the backlog until the thread starts, below).
  std::string direct_note = "direct reads off";
  if (direct_reads) {
    unsigned major_no = 0, minor_no = 0;
    std::string why = "the mount's device number is unknown";
    if (std::sscanf(MountDevice(mountpoint).c_str(), "%u:%u", &major_no, &minor_no) == 2) {
      direct = nvfs::direct::Server::Create(*fs, makedev(major_no, minor_no), device, &why);
    }
    direct_note = direct != nullptr ? "direct reads on " + direct->socket_path()
                                    : "direct reads off: " + why;
  }
  // The control socket (nvfs-resize of the mounted filesystem): root only.
  if (!fs->read_only()) {
    unsigned major_no = 0, minor_no = 0;
    std::string why;
    if (std::sscanf(MountDevice(mountpoint).c_str(), "%u:%u", &major_no, &minor_no) == 2) {
      control = nvfs::control::Server::Create(*fs, makedev(major_no, minor_no), device, &why);
    }
  }
  if (!cl.foreground) openlog("nvfs", LOG_PID, LOG_DAEMON);
  if (fuse_daemonize(cl.foreground ? 1 : 0) != 0) {
    Say("cannot detach (fork failed); try -f");
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    (void)UnmountCore(std::move(fs), device);
    return 1;
  }
  g_detached = !cl.foreground;

  // The rings start here, after the fork (threads do not survive one) and
  // after INIT's reply (the kernel takes no REGISTER before it); the kernel
  // holds requests back until they are registered.
  std::unique_ptr<nvfs::UringTransport> ring;
  const char* transport = "/dev/fuse";
  if (use_ring) {
    ring = std::make_unique<nvfs::UringTransport>(se, &adapter);
    const int r = ring->Start();
    if (r != 0) {
      ring.reset();
      if (uring_mode == nvfs::UringMode::kOn) {
        Say("io_uring=on: cannot start the rings: %s", std::strerror(-r));
        fuse_session_unmount(se);
        fuse_remove_signal_handlers(se);
        (void)UnmountCore(std::move(fs), device);
        return 1;
      }
      Say("%s: cannot start the io_uring queues (%s): serving over /dev/fuse",
          mountpoint.c_str(), std::strerror(-r));
    } else {
      transport = "io_uring";
    }
  }
  if (control != nullptr && !control->Serve()) control.reset();
  if (direct != nullptr && !direct->Serve()) {
    direct.reset();
    direct_note = "direct reads off: cannot start their thread";
  }
  if (ring != nullptr) {
    Say("%s: mounted on %s, transport io_uring (%u queues of %u entries, one pinned thread "
        "each; /dev/fuse for FORGET, INTERRUPT, notifications); %s",
        device.c_str(), mountpoint.c_str(), ring->queues(), nvfs::UringTransport::kQueueDepth,
        direct_note.c_str());
  } else {
    Say("%s: mounted on %s, transport %s; %s", device.c_str(), mountpoint.c_str(), transport,
        direct_note.c_str());
  }

  int loop;
  fuse_loop_config* config = cl.single_thread ? nullptr : fuse_loop_cfg_create();
  if (config == nullptr) {
    loop = fuse_session_loop(se);  // -s, or no memory for a thread pool
  } else {
    fuse_loop_cfg_set_clone_fd(config, 1);
    if (cl.threads != 0) {
      fuse_loop_cfg_set_max_threads(config, cl.threads);
      fuse_loop_cfg_set_idle_threads(config, cl.threads);
    }
    loop = fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
  }
  if (ring != nullptr) ring->Stop();
  // No direct request reaches the core from now on; the table stays, kept
  // current by the core, until `direct` goes after the core's unmount.
  if (direct != nullptr) direct->Stop();
  if (control != nullptr) control->Stop();  // waits for a grow in progress
  adapter.StopInvalidations();  // it notifies through the session freed below
  // Every worker has returned: nothing runs in the core any more. A mount
  // of the namespace from now on waits for this process to exit.
  fs->EndService();
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  // The releases below may tell the kernel of freed data (data_freed): no
  // session to tell any more, and none to point at once it is freed.
  adapter.set_session(nullptr);
  session.reset();
  adapter.EndSession();  // what the kernel still held: open files, lookups
  int status = UnmountCore(std::move(fs), device);
  if (loop < 0) {
    Say("%s: session ended with an error: %s", mountpoint.c_str(), std::strerror(-loop));
    status = 1;
  }
  return status;
}
