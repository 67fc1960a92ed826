// The daemon's command line (nvfs --help): what fuse_opt takes out of the
// arguments for nvfs, checked and turned into the adapter's, the
// transport's and the core's options. Everything else goes to libfuse.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "fuse/adapter.hpp"
#include "fuse/uring.hpp"
#include "nvfs/fs.hpp"

namespace nvfs::daemon {

// What fuse_opt_parse found, as it found it.
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

// The options checked: what the daemon runs with.
struct DaemonOptions {
  AdapterOptions adapter;
  UringMode uring_mode = UringMode::kAuto;
  ErrorBehavior errors = ErrorBehavior::kRemountReadOnly;
  bool direct_reads = true;
  std::string device;      // absolute
  std::string mountpoint;  // absolute, a directory
};

// fuse_opt_parse, then --help, --version and the count of DEVICE and
// MOUNTPOINT. Returns -1 to go on, else the exit status (having printed
// what it must).
int ParseCommandLine(fuse_args* args, CommandLine* cl);

// Checks nvfs's own options and the mount point into *out, and decides the
// transport (io_uring=on refuses here, before anything is mounted). Returns
// -1 to go on, else the exit status 1 (having said why).
int CheckOptions(const CommandLine& cl, DaemonOptions* out);

// The options every mount gets from the daemon itself: default_permissions,
// and unless given, subtype=nvfs and fsname=DEVICE. False when out of memory.
bool AddMountArgs(fuse_args* args, const CommandLine& cl, const std::string& device);

}  // namespace nvfs::daemon
