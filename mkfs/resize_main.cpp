// nvfs-resize: grows an nvfs filesystem to fill its namespace (as resize2fs):
// an image file extended to SIZE, or a device's or file's present size.
#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <fcntl.h>

#include "nvfs/cli.hpp"
#include "nvfs/control.hpp"
#include "nvfs/media.hpp"
#include "nvfs/resize.hpp"

namespace {

constexpr const char* kUsage =
    "Usage: nvfs-resize [-n] [-q] [-V] DEVICE [SIZE]\n"
    "Grows the nvfs filesystem on DEVICE (a DAX character device or an image\n"
    "file) by whole groups: to SIZE (e.g. 64G; an image file is extended to it),\n"
    "or, without SIZE, to the present size of the device or file. nvfs does not\n"
    "shrink. A mounted filesystem is grown through its daemon.\n"
    "\n"
    "  -n             show what would be done; write nothing\n"
    "  -q             quiet: print errors only\n"
    "  -V, --version  print the version and exit\n"
    "  -h, --help     print this help and exit\n"
    "\n"
    "Exit status: 0 grown (or nothing to do), 1 an error (one line on stderr).\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "nvfs-resize: %s\n", message.c_str());
  return 1;
}

int Usage(const char* message) {
  std::fprintf(stderr, "nvfs-resize: %s (nvfs-resize --help says more)\n", message);
  return 1;
}

void Describe(const char* verb, const std::string& device, const nvfs::GrowPlan& plan) {
  const nvfs::Geometry& f = plan.from;
  const nvfs::Geometry& t = plan.to;
  std::printf("%s: %s %s (%" PRIu64 " blocks, %u groups) to %s (%" PRIu64 " blocks, %u groups)\n",
              device.c_str(), verb, nvfs::FormatSize(f.bytes()).c_str(), f.block_count(),
              f.group_count(), nvfs::FormatSize(t.bytes()).c_str(), t.block_count(),
              t.group_count());
  std::printf("  free: +%" PRIu64 " blocks (%s), +%" PRIu64 " inodes\n", plan.added_free_blocks,
              nvfs::FormatSize(plan.added_free_blocks * t.block_size()).c_str(),
              plan.added_free_inodes);
}

// A mounted filesystem: its daemon is asked, through its control socket,
// with a descriptor of the namespace open for writing as proof. The socket
// is named by the daemon's mount, which the namespace's own mark names
// (FindServingMount), not by any mount's source.
int GrowMounted(const std::string& device, const struct stat& st, uint64_t size, bool dry_run,
                bool quiet) {
  nvfs::Result<dev_t> mount = nvfs::FindServingMount(device);
  if (!mount.ok()) {
    return Fail(device + " is in use (being checked or formatted, or mounted where this "
                "process cannot see the mount)");
  }
  if (size == 0) size = static_cast<uint64_t>(st.st_size);
  if (dry_run) {
    if (!quiet) std::printf("%s: mounted; would ask its daemon to grow it to %s\n",
                            device.c_str(), nvfs::FormatSize(size).c_str());
    return 0;
  }
  const int fd = open(device.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Fail(device + ": " + std::strerror(errno));
  const auto start = std::chrono::steady_clock::now();
  nvfs::Result<nvfs::control::Reply> reply = nvfs::control::AskGrow(*mount, fd, size);
  close(fd);
  if (!reply.ok()) return Fail(device + " is mounted and its daemon cannot be asked: " +
                               reply.error().message);
  if (reply->error != 0) return Fail(device + " (mounted): " + reply->message);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (quiet) return 0;
  if (reply->new_blocks == reply->old_blocks) {
    std::printf("%s: mounted; the filesystem is already %" PRIu64 " blocks; nothing to do\n",
                device.c_str(), reply->old_blocks);
    return 0;
  }
  std::printf("%s: mounted; grew %s (%" PRIu64 " blocks) to %s (%" PRIu64 " blocks)\n",
              device.c_str(), nvfs::FormatSize(reply->old_blocks * reply->block_size).c_str(),
              reply->old_blocks, nvfs::FormatSize(reply->new_blocks * reply->block_size).c_str(),
              reply->new_blocks);
  std::printf("  free: +%" PRIu64 " blocks, +%" PRIu64 " inodes\n  in %.3f s\n",
              reply->added_free_blocks, reply->added_free_inodes, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool dry_run = false, quiet = false;
  static const option kLong[] = {{"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {nullptr, 0, nullptr, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "nqVh", kLong, nullptr)) != -1) {
    switch (opt) {
      case 'n': dry_run = true; break;
      case 'q': quiet = true; break;
      case 'V': std::printf("nvfs-resize %s\n", NVFS_VERSION); return 0;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: return Usage("unknown option");
    }
  }
  if (optind >= argc) return Usage("no DEVICE given");
  if (argc - optind > 2) return Usage("too many arguments");
  const std::string device = argv[optind];
  uint64_t size = 0;
  if (optind + 1 < argc) {
    auto v = nvfs::ParseSize(argv[optind + 1]);
    if (!v || *v == 0) return Usage("invalid size");
    size = *v;
  }
  struct stat st;
  if (stat(device.c_str(), &st) != 0) {
    return Fail(device + ": " + std::strerror(errno));
  }

  // Checked before anything is written: the filesystem on the namespace as
  // it is, under the exclusive lock (a mounted namespace is refused here).
  if (S_ISDIR(st.st_mode)) {
    return Fail(device + " is a directory: give the namespace (the image file or device) "
                "the filesystem is on");
  }
  nvfs::Result<std::unique_ptr<nvfs::Media>> media = nvfs::OpenMedia(device, {});
  if (!media.ok()) {
    if (media.error().code == EBUSY) return GrowMounted(device, st, size, dry_run, quiet);
    return Fail(media.error().message);
  }
  const uint64_t present = (*media)->size();
  if (size == 0) size = present;
  if (size > present && !S_ISREG(st.st_mode)) {
    return Fail(device + " holds " + nvfs::FormatSize(present) + ", less than " +
                nvfs::FormatSize(size) + ": a device is not extended");
  }
  nvfs::Result<nvfs::GrowPlan> plan = nvfs::CheckGrowOffline(**media, size);
  if (!plan.ok()) return Fail(device + ": " + plan.error().message);
  if (!plan->grows()) {
    if (!quiet) {
      std::printf("%s: the filesystem is already %" PRIu64 " blocks (%s); nothing to do\n",
                  device.c_str(), plan->from.block_count(),
                  nvfs::FormatSize(plan->from.bytes()).c_str());
    }
    return 0;
  }
  if (dry_run) {
    if (!quiet) Describe("would grow", device, *plan);
    return 0;
  }
  if (size > present) {
    // Extended under the lock of the new open (taken before the file grows).
    media.value().reset();
    nvfs::MediaOptions grow;
    grow.grow_to = size;
    media = nvfs::OpenMedia(device, grow);
    if (!media.ok()) return Fail(media.error().message);
  }
  const auto start = std::chrono::steady_clock::now();
  nvfs::Progress progress("writing new groups", plan->to.group_count() - plan->from.group_count(),
                          quiet);
  plan = nvfs::GrowOffline(**media, size, [&](uint64_t done, uint64_t) { progress.Update(done); });
  if (!plan.ok()) return Fail(device + ": " + plan.error().message);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!quiet) {
    Describe("grew", device, *plan);
    std::printf("  in %.3f s\n", seconds);
  }
  return 0;
}
