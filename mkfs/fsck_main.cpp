// fsck.nvfs: checks (and with -p or -y repairs) an nvfs namespace.
#include <getopt.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "nvfs/cli.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/media.hpp"

namespace {

constexpr const char* kUsage =
    "Usage: fsck.nvfs [-n | -p | -a | -y] [-f] [-v] [-j THREADS] [-V] DEVICE\n"
    "Checks the nvfs filesystem on DEVICE.\n"
    "\n"
    "  -n             check only: open read-only, change nothing\n"
    "  -p, -a         repair automatically what is safe to repair\n"
    "  -y             answer yes to every repair\n"
    "  -f             check even if the filesystem seems clean (always done)\n"
    "  -v             verbose: counts, time per pass, inodes checked per second\n"
    "  -j THREADS     threads for the inode and directory passes (default: one\n"
    "                 per CPU, at most 8); the findings do not depend on it\n"
    "  -V, --version  print the version and exit\n"
    "  -h, --help     print this help and exit\n"
    "\n"
    "Exit status: 0 clean, 1 errors corrected, 4 errors left uncorrected,\n"
    "8 operational error, 16 usage error.\n";

int Usage(const char* message) {
  std::fprintf(stderr, "fsck.nvfs: %s\n%s", message, kUsage);
  return nvfs::kFsckUsage;
}

}  // namespace

int main(int argc, char** argv) {
  int modes = 0;
  nvfs::RepairMode mode = nvfs::RepairMode::kNone;
  bool verbose = false;
  unsigned threads = 0;
  static const option kLong[] = {{"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {nullptr, 0, nullptr, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "npayfvj:Vh", kLong, nullptr)) != -1) {
    switch (opt) {
      case 'n': mode = nvfs::RepairMode::kNone; ++modes; break;
      case 'p':
      case 'a': mode = nvfs::RepairMode::kPreen; ++modes; break;
      case 'y': mode = nvfs::RepairMode::kYes; ++modes; break;
      case 'f': break;
      case 'v': verbose = true; break;
      case 'j': {
        char* end = nullptr;
        const unsigned long n = std::strtoul(optarg, &end, 10);
        if (end == optarg || *end != '\0' || n == 0 || n > 256) {
          return Usage("-j wants a number of threads from 1 to 256");
        }
        threads = static_cast<unsigned>(n);
        break;
      }
      case 'V': std::printf("fsck.nvfs %s\n", NVFS_VERSION); return 0;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: std::fputs(kUsage, stderr); return nvfs::kFsckUsage;
    }
  }
  if (modes > 1) return Usage("only one of -n, -p/-a and -y may be given");
  if (optind + 1 != argc) return Usage(optind >= argc ? "no DEVICE given" : "too many arguments");
  const std::string device = argv[optind];

  nvfs::MediaOptions options;
  options.read_only = mode == nvfs::RepairMode::kNone;
  auto media = nvfs::OpenMedia(device, options);
  if (!media.ok()) {
    std::fprintf(stderr, "fsck.nvfs: %s\n", media.error().message.c_str());
    return nvfs::kFsckOperational;
  }
  if (const std::string exposure = nvfs::NamespaceExposure(device); !exposure.empty()) {
    std::fprintf(stderr, "fsck.nvfs: warning: %s\n", exposure.c_str());
  }
  std::unique_ptr<nvfs::Progress> progress;  // made once the group count is known
  const nvfs::FsckReport report = nvfs::CheckNamespace(
      **media, mode,
      [&](const std::string& line) { std::printf("%s\n", line.c_str()); },
      [&](uint64_t done, uint64_t total) {
        if (!progress) progress = std::make_unique<nvfs::Progress>("checking", total, false);
        progress->Update(done);
      },
      threads);
  progress.reset();
  if (report.block_count != 0) {
    std::printf("%s: %s, %" PRIu64 "/%" PRIu64 " inodes, %" PRIu64 "/%" PRIu64 " blocks\n",
                device.c_str(),
                report.exit_code == nvfs::kFsckClean ? "clean"
                : report.exit_code == nvfs::kFsckCorrected ? "errors corrected"
                : report.exit_code == nvfs::kFsckUncorrected ? "ERRORS LEFT UNCORRECTED"
                                                             : "check failed",
                report.inodes_used, report.inode_count, report.blocks_used, report.block_count);
    if (verbose) {
      std::printf("  %" PRIu64 " problems found, %" PRIu64 " corrected\n", report.problems,
                  report.corrected);
      std::printf("  %" PRIu64 " inodes, %" PRIu64 " directories, %" PRIu64 " entries checked "
                  "in %.3f s (%.0f inodes/s)\n",
                  report.inodes_checked, report.directories, report.entries, report.seconds,
                  report.seconds > 0 ? report.inodes_checked / report.seconds : 0.0);
      for (const auto& [pass, seconds] : report.pass_seconds) {
        std::printf("    %-13s %.3f s\n", pass.c_str(), seconds);
      }
    }
  }
  if ((*media)->LostPages() != 0) {
    // Media errors met while checking (a poisoned page, an image cut short
    // under fsck): the lost pages read as all ones, and repairs stored
    // into them were kept by nothing.
    std::fprintf(stderr, "fsck.nvfs: %s: %" PRIu64 " pages could not be read (media errors); "
                 "the check is not to be trusted\n", device.c_str(), (*media)->LostPages());
    return nvfs::kFsckOperational;
  }
  return report.exit_code;
}
