// nvfs-pread: the pread microbenchmark.
//
//   nvfs-pread engine [OPTIONS] NAMESPACE   the core's read paths, in process
//   nvfs-pread file   [OPTIONS] PATH        pread/preadv on any file (preadv
//                                           into 4 KiB iovecs, or each iovec
//                                           the same page: preadv-page)
//   nvfs-pread file --direct [OPTIONS] PATH the same through libnvfs-direct
//
// Every measurement is repeated R times, the paths interleaved within each
// repetition so drift hits them alike; reported as mean and standard
// deviation of ns per operation, ops/s and GB/s — but for engine's `map`
// path, which copies no byte (it returns pointers into the mapping), the
// last column is the time per request in microseconds ("us" after it): a
// throughput of bytes never moved would read 96,000 GB/s at 1 MiB.
//
// The parts: main.cpp (the command line), report.cpp (the figures, the
// offsets), engine.cpp (engine mode), file.cpp (file mode's loops) and
// direct.cpp (file mode's reads through libnvfs-direct).
#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "nvfs/cli.hpp"
#include "pread/pread.hpp"

namespace {

constexpr const char* kUsage =
    "Usage: nvfs-pread engine [OPTIONS] NAMESPACE\n"
    "       nvfs-pread file [OPTIONS] PATH\n"
    "\n"
    "engine: mounts NAMESPACE in process (no FUSE; it must not be mounted) and\n"
    "  measures the core's read paths: read, read_iter (one segment), read_iter_4k\n"
    "  (4 KiB segments), map (no copy), and memcpy from the mapping (the floor).\n"
    "  With no options: the seed benchmark (N reads of the same 4 KiB at offset 0)\n"
    "  and sequential and random reads of 512 B, 4 KiB, 64 KiB and 1 MiB over a\n"
    "  file it creates in the namespace (/nvfs-pread.dat).\n"
    "file: pread and preadv (4 KiB iovecs) loops on PATH (any filesystem); with\n"
    "  --direct, through libnvfs-direct (nvfs_direct_pread and _preadv on a handle\n"
    "  attached to each thread's descriptor; reported as mode \"direct\").\n"
    "\n"
    "Options:\n"
    "  -n N            operations in the seed loop (default 2^24; engine)\n"
    "  -N N            operations per matrix run (default: 256 MiB worth, at most 2^20)\n"
    "  -r R            repetitions (default 3)\n"
    "  -b SIZES        block sizes, comma-separated (default 512,4k,64k,1m)\n"
    "  -P PATTERNS     same,seq,rand (default: all)\n"
    "  -p PATHS        engine: read,read_iter,read_iter_4k,map,memcpy;\n"
    "                  file: pread,preadv,preadv-page (4 KiB iovecs that all point\n"
    "                  at one page: the copy stays in cache, the cost per segment\n"
    "                  shows), and the round-trip floors: getxattr (a missing\n"
    "                  xattr) and eofread (a pread at the end of the file)\n"
    "  -s SIZE         engine: size of the data file (default 256m)\n"
    "  -t THREADS      threads (file mode; default 1)\n"
    "  -D SECONDS      file mode: run each measurement for this long instead of N ops\n"
    "  -d              O_DIRECT (file mode)\n"
    "  --direct        file mode: read through libnvfs-direct (a file it cannot\n"
    "                  read directly says why on stderr and is read through the kernel)\n"
    "  -C              file mode: pin thread i to CPU i (mod the CPU count)\n"
    "  -w              engine: a second thread overwrites the file in place meanwhile\n"
    "  -A OFFSET       engine: the destination buffer starts OFFSET bytes into a\n"
    "                  page (default 0; 16 is where a large malloc puts it)\n"
    "  -X              engine: extent maps off, every read walks the block map\n"
    "  -T TARGET       a name for the target in the output (default: the path)\n"
    "  -j, --json      one JSON object per line instead of a table\n"
    "  -h, --help      this help;  -V, --version  the version\n";

}  // namespace

int main(int argc, char** argv) {
  using nvfs::pread::Die;
  using nvfs::pread::Split;
  if (argc >= 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc >= 2 && (std::strcmp(argv[1], "-V") == 0 || std::strcmp(argv[1], "--version") == 0)) {
    std::printf("nvfs-pread %s\n", NVFS_VERSION);
    return 0;
  }
  if (argc < 2 || (std::strcmp(argv[1], "engine") != 0 && std::strcmp(argv[1], "file") != 0)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string mode = argv[1];
  nvfs::pread::Options o;
  static const option kLong[] = {{"json", no_argument, nullptr, 'j'},
                                 {"direct", no_argument, nullptr, 'R'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  optind = 2;
  int opt;
  auto size_arg = [](const char* text) {
    auto v = nvfs::ParseSize(text);
    if (!v || *v == 0) Die(std::string("invalid size: ") + text);
    return *v;
  };
  while ((opt = getopt_long(argc, argv, "n:N:r:b:P:p:s:t:D:dCwA:XT:jh", kLong, nullptr)) != -1) {
    switch (opt) {
      case 'n': o.seed_ops = size_arg(optarg); break;
      case 'N': o.matrix_ops = size_arg(optarg); break;
      case 'r': o.reps = static_cast<int>(size_arg(optarg)); break;
      case 'b':
        o.sizes.clear();
        for (const auto& s : Split(optarg)) o.sizes.push_back(size_arg(s.c_str()));
        break;
      case 'P': o.patterns = Split(optarg); break;
      case 'p': o.paths = Split(optarg); break;
      case 's': o.file_size = size_arg(optarg); break;
      case 't': o.threads = static_cast<int>(size_arg(optarg)); break;
      case 'd': o.o_direct = true; break;
      case 'R': o.nvfs_direct = true; break;
      case 'C': o.pin = true; break;
      case 'w': o.writer = true; break;
      case 'X': o.no_extent_maps = true; break;
      case 'A':
        o.buffer_offset = std::strtoull(optarg, nullptr, 0);
        if (o.buffer_offset >= 4096) Die("-A: the offset must be below 4096");
        break;
      case 'D': o.duration = std::atof(optarg); break;
      case 'T': o.target = optarg; break;
      case 'j': o.json = true; break;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: std::fputs(kUsage, stderr); return 2;
    }
  }
  if (optind + 1 != argc) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (o.nvfs_direct && mode != "file") Die("--direct is for file mode");
  for (const auto& p : o.patterns) {
    if (p != "same" && p != "seq" && p != "rand") Die("unknown pattern " + p);
  }
  return mode == "engine" ? nvfs::pread::Engine(o, argv[optind])
                          : nvfs::pread::File(o, argv[optind]);
}
