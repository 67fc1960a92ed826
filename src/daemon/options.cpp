// The daemon's command line (options.hpp): the help text, fuse_opt's table
// and the checks of nvfs's own options.
#include "daemon/options.hpp"

#include <limits.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "daemon/say.hpp"

namespace nvfs::daemon {

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


// An absolute path, so it still names the same thing after the daemon
// chdir()s to / (and reads well in /proc/mounts).
std::string Absolute(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) != nullptr) return resolved;
  return path;  // the open that follows reports why
}

}  // namespace

int ParseCommandLine(fuse_args* args, CommandLine* out) {
  CommandLine& cl = *out;
  if (fuse_opt_parse(args, &cl, kOptions, ProcessOption) != 0) return UsageError("bad option");
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
  return -1;
}

int CheckOptions(const CommandLine& cl, DaemonOptions* out) {
  nvfs::AdapterOptions& adapter_options = out->adapter;
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
  nvfs::UringMode& uring_mode = out->uring_mode;
  uring_mode = nvfs::UringMode::kAuto;
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
  nvfs::ErrorBehavior& errors = out->errors;
  errors = nvfs::ErrorBehavior::kRemountReadOnly;
  if (cl.errors != nullptr) {
    const std::string v = cl.errors;
    if (v == "continue") {
      errors = nvfs::ErrorBehavior::kContinue;
    } else if (v != "remount-ro") {
      return UsageError("errors must be remount-ro or continue");
    }
  }
  bool& direct_reads = out->direct_reads;
  direct_reads = true;
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
  for (const double* timeout : {&cl.entry_timeout, &cl.attr_timeout}) {
    if (*timeout == -1) continue;
    if (!(*timeout >= 0 && *timeout <= nvfs::kCacheForever)) {
      return UsageError("entry_timeout and attr_timeout must be between 0 and 1e9 seconds");
    }
  }
  if (cl.entry_timeout != -1) adapter_options.entry_timeout = cl.entry_timeout;
  if (cl.attr_timeout != -1) adapter_options.attr_timeout = cl.attr_timeout;
  out->device = Absolute(cl.positional[0]);
  out->mountpoint = Absolute(cl.positional[1]);
  const std::string& mountpoint = out->mountpoint;
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
  return -1;
}

bool AddMountArgs(fuse_args* args, const CommandLine& cl, const std::string& device) {
  // The core checks no permissions: the kernel must. fsname and subtype make
  // /proc/mounts read "DEVICE MOUNTPOINT fuse.nvfs".
  fuse_opt_add_arg(args, "-odefault_permissions");
  if (!cl.have_subtype) fuse_opt_add_arg(args, "-osubtype=nvfs");
  if (!cl.have_fsname) {
    char* opts = nullptr;
    if (fuse_opt_add_opt_escaped(&opts, ("fsname=" + device).c_str()) != 0) return false;
    fuse_opt_add_arg(args, ("-o" + std::string(opts)).c_str());
    std::free(opts);
  }
  return true;
}

}  // namespace nvfs::daemon
