// mkfs.nvfs: formats a pmem namespace (DAX device or image file) as nvfs.
#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "nvfs/cli.hpp"
#include "nvfs/media.hpp"
#include "nvfs/mkfs.hpp"

namespace {

constexpr const char* kUsage =
    "Usage: mkfs.nvfs [-b BLOCK_SIZE] [-N INODES | -i BYTES_PER_INODE] [-L LABEL]\n"
    "                 [-U UUID] [-O [^]FEATURE] [-s SIZE] [-P] [-f] [-n] [-q] [-V] DEVICE\n"
    "Formats DEVICE (a DAX character device or an image file) as nvfs.\n"
    "\n"
    "  -b BLOCK_SIZE       block size: 4k (default), 8k, ... 1M\n"
    "  -N INODES           number of inodes (rounded up to fill inode-table blocks)\n"
    "  -i BYTES_PER_INODE  one inode per this many bytes (default 16k)\n"
    "  -L LABEL            volume label, at most 63 bytes\n"
    "  -U UUID             filesystem UUID (default: random)\n"
    "  -O [^]FEATURE       turn a feature on (default) or, with ^, off; one:\n"
    "                      xattr_chain  xattrs past one block (64 KiB values,\n"
    "                                   thousands of names); without it, the\n"
    "                                   format 2.0 nvfs reads (one block per file)\n"
    "  -s SIZE             create the image file, or extend it, to SIZE (e.g. 1G)\n"
    "  -P, --preallocate   have the host filesystem back the whole image now\n"
    "                      (fallocate), so a sparse image never runs out of\n"
    "                      host space later; devices need nothing\n"
    "  -f                  format even if DEVICE holds a filesystem\n"
    "  -n                  show what would be done; write nothing\n"
    "  -q                  quiet: print errors only\n"
    "  -V, --version       print the version and exit\n"
    "  -h, --help          print this help and exit\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "mkfs.nvfs: %s\n", message.c_str());
  return 1;
}

int Usage(const char* message) {
  std::fprintf(stderr, "mkfs.nvfs: %s\n%s", message, kUsage);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  nvfs::MkfsOptions options;
  options.root_uid = getuid();
  options.root_gid = getgid();
  uint64_t grow_to = 0;
  bool force = false, dry_run = false, quiet = false;
  static const option kLong[] = {{"help", no_argument, nullptr, 'h'},
                                 {"version", no_argument, nullptr, 'V'},
                                 {"preallocate", no_argument, nullptr, 'P'},
                                 {nullptr, 0, nullptr, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "b:N:i:L:U:O:s:PfnqVh", kLong, nullptr)) != -1) {
    switch (opt) {
      case 'b': {
        auto v = nvfs::ParseSize(optarg);
        if (!v || *v > UINT32_MAX) return Usage("invalid block size");
        options.block_size = static_cast<uint32_t>(*v);
        break;
      }
      case 'N': {
        auto v = nvfs::ParseSize(optarg);
        if (!v || *v == 0) return Usage("invalid inode count");
        options.inode_count = *v;
        break;
      }
      case 'i': {
        auto v = nvfs::ParseSize(optarg);
        if (!v || *v == 0) return Usage("invalid bytes-per-inode");
        options.bytes_per_inode = *v;
        break;
      }
      case 'L': options.label = optarg; break;
      case 'U': {
        auto v = nvfs::ParseUuid(optarg);
        if (!v) return Usage("invalid UUID (expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
        options.uuid = *v;
        break;
      }
      case 'O': {
        const std::string feature = optarg;
        const bool off = feature.starts_with("^");
        if ((off ? feature.substr(1) : feature) != "xattr_chain") {
          return Usage(("unknown feature: " + feature).c_str());
        }
        if (off) {
          options.feature_incompat &= ~nvfs::format::kIncompatXattrChain;
        } else {
          options.feature_incompat |= nvfs::format::kIncompatXattrChain;
        }
        break;
      }
      case 's': {
        auto v = nvfs::ParseSize(optarg);
        if (!v || *v == 0) return Usage("invalid size");
        grow_to = *v;
        break;
      }
      case 'P': options.preallocate = true; break;
      case 'f': force = true; break;
      case 'n': dry_run = true; break;
      case 'q': quiet = true; break;
      case 'V': std::printf("mkfs.nvfs %s\n", NVFS_VERSION); return 0;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: std::fputs(kUsage, stderr); return 1;
    }
  }
  if (options.inode_count != 0 && options.bytes_per_inode != 0) {
    return Usage("-N and -i are mutually exclusive");
  }
  if (optind + 1 != argc) return Usage(optind >= argc ? "no DEVICE given" : "too many arguments");
  const std::string device = argv[optind];

  // Everything is checked before anything is written: first a read-only look
  // (size, signatures), then, unless -n, the writable open that may grow the file.
  struct stat st;
  const bool exists = stat(device.c_str(), &st) == 0;
  uint64_t size = 0;
  if (exists && S_ISREG(st.st_mode) && grow_to != 0 &&
      static_cast<uint64_t>(st.st_size) > grow_to) {
    return Fail(device + " is " + nvfs::FormatSize(static_cast<uint64_t>(st.st_size)) +
                ", larger than -s " + nvfs::FormatSize(grow_to) +
                "; mkfs.nvfs does not shrink images");
  }
  if (exists && S_ISCHR(st.st_mode) && grow_to != 0) {
    return Fail(device + ": -s applies to image files, not devices");
  }
  std::vector<nvfs::Signature> signatures;
  if (exists) {
    nvfs::MediaOptions look;
    look.read_only = true;
    auto media = nvfs::OpenMedia(device, look);
    if (!media.ok()) {
      // An empty or short image that -s will extend is fine.
      const bool will_grow = media.error().code == ENOSPC && grow_to != 0;
      if (!will_grow) return Fail(media.error().message);
    } else {
      size = (*media)->size();
      signatures = nvfs::DetectSignatures((*media)->base(), (*media)->size());
    }
  } else if (grow_to == 0) {
    return Fail(device + ": no such file or directory (use -s SIZE to create an image)");
  }
  if (grow_to > size) size = grow_to;

  auto plan = nvfs::PlanMkfs(size, options);
  if (!plan.ok()) return Fail(device + ": " + plan.error().message);
  if (!signatures.empty() && !force) {
    const nvfs::Signature& sig = signatures.front();
    return Fail(device + " already holds " + sig.name + " (magic at byte " +
                std::to_string(sig.offset) + "); use -f to format it anyway");
  }

  // An existing file or device keeps its mode (a new image is made 0600):
  // said once, even with -q, when every user can read or write it.
  if (exists) {
    if (const std::string exposure = nvfs::NamespaceExposure(device); !exposure.empty()) {
      std::fprintf(stderr, "mkfs.nvfs: warning: %s\n", exposure.c_str());
    }
  }

  const nvfs::Geometry& g = plan->geometry;
  if (!quiet) {
    std::printf("%s%s: %s, %" PRIu64 " blocks of %u bytes, %u groups\n",
                dry_run ? "(dry run) " : "", device.c_str(),
                nvfs::FormatSize(g.bytes()).c_str(), g.block_count(), g.block_size(),
                g.group_count());
    std::printf("  inodes: %" PRIu64 " (%u per group), journal: %u slots of %s\n",
                g.inode_count(), g.inodes_per_group(), g.journal_slots(),
                nvfs::FormatSize(g.journal_slot_size()).c_str());
    nvfs::Uuid uuid;
    std::memcpy(uuid.data(), plan->super.uuid, uuid.size());
    std::printf("  UUID: %s, label: \"%s\"\n", nvfs::FormatUuid(uuid).c_str(),
                options.label.c_str());
    std::printf("  free: %" PRIu64 " blocks (%s), %" PRIu64 " inodes\n", plan->free_blocks,
                nvfs::FormatSize(plan->free_blocks * g.block_size()).c_str(),
                plan->free_inodes);
  }
  // Said only once the namespace is ours, so the output never claims a wipe
  // that did not happen.
  auto report_wipes = [&](const char* verb) {
    if (quiet) return;
    for (const auto& sig : signatures) {
      std::printf("  %s the %s signature at byte %" PRIu64 "\n", verb, sig.name.c_str(),
                  sig.offset);
    }
  };
  if (dry_run) {
    report_wipes("would wipe");
    return 0;
  }

  nvfs::MediaOptions rw;
  rw.grow_to = grow_to;
  rw.min_size = g.bytes();
  auto media = nvfs::OpenMedia(device, rw);
  if (!media.ok()) return Fail(media.error().message);
  report_wipes("wiping");
  const auto start = std::chrono::steady_clock::now();
  nvfs::Progress progress("writing group metadata", g.group_count(), quiet);
  nvfs::Status written = nvfs::WriteMkfs(**media, *plan, [&](uint64_t done, uint64_t) {
    progress.Update(done);
  });
  if (!written.ok()) return Fail(written.error().message);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!quiet) {
    std::printf("  wrote %s of metadata in %.3f s (store granularity: %s)\n",
                nvfs::FormatSize((*media)->bytes_stored()).c_str(), seconds,
                nvfs::GranularityName((*media)->granularity()));
  }
  return 0;
}
