// nvfs-pread engine: the core's read paths, in process, on a file it
// makes in the namespace (main.cpp's usage).
#include <fcntl.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "nvfs/fs.hpp"
#include "pread/pread.hpp"

namespace nvfs::pread {

int Engine(Options& o, const std::string& namespace_path) {
  nvfs::MountOptions mount_options;
  if (o.no_extent_maps) mount_options.extent_map_runs = 0;
  auto mounted = nvfs::Filesystem::Mount(namespace_path, mount_options);
  if (!mounted.ok()) Die(mounted.error().Describe());
  nvfs::Filesystem& fs = **mounted;
  if (o.target.empty()) o.target = namespace_path;
  if (o.paths.empty()) o.paths = {"read", "read_iter", "read_iter_4k", "map", "memcpy"};

  // The data file: created once, filled with a pattern, reused by later runs.
  const std::string name = "nvfs-pread.dat";
  uint64_t ino;
  auto found = fs.Lookup(1, name);
  if (found.ok() && found->size >= o.file_size) {
    ino = found->ino;
  } else {
    if (found.ok()) {
      (void)fs.Unlink(1, name);
      fs.Forget(found->ino, 1);
    }
    nvfs::Attr attr;
    auto created = fs.Create(1, name, 0644, O_RDWR, {0, 0}, &attr);
    if (!created.ok()) Die("cannot create the data file: " + created.error().Describe());
    std::vector<char> chunk(1 << 20);
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 131 + 7);
    for (uint64_t off = 0; off < o.file_size; off += chunk.size()) {
      auto w = fs.Write(*created, off, chunk.data(), chunk.size());
      if (!w.ok()) Die("cannot write the data file: " + w.error().Describe());
    }
    fs.Release(*created);
    ino = attr.ino;
  }
  auto handle = fs.Open(ino, O_RDONLY);
  if (!handle.ok()) Die(handle.error().Describe());
  nvfs::FileHandle h = *handle;

  // -w: a second thread overwrites the file in place, 4 KiB at a time, for as
  // long as the reads run: what readers pay for a concurrent writer.
  std::atomic<bool> stop_writer{false};
  std::thread writer;
  if (o.writer) {
    auto wh = fs.Open(ino, O_RDWR);
    if (!wh.ok()) Die(wh.error().Describe());
    writer = std::thread([&fs, &stop_writer, &o, w = *wh] {
      std::vector<char> block(4096, 'w');
      for (uint64_t off = 0; !stop_writer.load(std::memory_order_relaxed);
           off = (off + 4096) % o.file_size) {
        if (!fs.Write(w, off, block.data(), block.size()).ok()) Die("the writer thread failed");
      }
      fs.Release(w);
    });
  }

  const uint64_t max_bs = *std::max_element(o.sizes.begin(), o.sizes.end());
  // Page-aligned by default (-A moves it): a destination a few bytes into a
  // page (a large malloc starts 16 bytes in) makes every path, memcpy
  // included, pay for 4 KiB aliasing of its loads with its stores, which
  // hides the paths' own cost.
  struct FreeAligned {
    void operator()(char* p) const { std::free(p); }
  };
  const std::unique_ptr<char, FreeAligned> buffer_memory(
      static_cast<char*>(std::aligned_alloc(4096, (max_bs + 8192 + 4095) & ~uint64_t{4095})));
  if (!buffer_memory) Die("out of memory");
  std::span<char> buffer(buffer_memory.get() + o.buffer_offset, max_bs + 4096);
  std::vector<nvfs::ReadRun> runs(max_bs / 4096 + 64);
  Header(o);
  for (const std::string& pattern : o.patterns) {
    for (uint64_t bs : o.sizes) {
      if (pattern == "same" && bs != 4096) continue;  // the seed's loop is 4 KiB
      const uint64_t ops = OpsFor(o, pattern, bs);
      const std::vector<uint64_t> offsets = Offsets(pattern, bs, o.file_size, ops, bs);
      const size_t mask = offsets.size() - 1;
      const bool pow2 = (offsets.size() & mask) == 0;
      std::vector<iovec> segments;
      for (uint64_t off = 0; off < bs; off += 4096) {
        segments.push_back({buffer.data() + off, std::min<uint64_t>(4096, bs - off)});
      }
      std::vector<std::vector<double>> results(o.paths.size());
      std::vector<nvfs::ReadRun> floor_runs;
      std::vector<size_t> floor_first;
      uint64_t sink = 0;
      for (int rep = 0; rep < o.reps; ++rep) {
        for (size_t p = 0; p < o.paths.size(); ++p) {
          const std::string& path = o.paths[p];
          auto offset_of = [&](uint64_t i) {
            return offsets[pow2 ? (i & mask) : (i % offsets.size())];
          };
          double ns = 0;
          if (path == "read") {
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) sink += *fs.Read(h, offset_of(i), buffer.data(), bs);
            });
          } else if (path == "read_iter") {
            iovec one{buffer.data(), bs};
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) sink += *fs.ReadIter(h, offset_of(i), &one, 1);
            });
          } else if (path == "read_iter_4k") {
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) {
                sink += *fs.ReadIter(h, offset_of(i), segments.data(),
                                     static_cast<int>(segments.size()));
              }
            });
          } else if (path == "map") {
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) {
                size_t count;
                const nvfs::MapGuard held;  // as the FUSE adapter holds it
                sink += *fs.Map(h, offset_of(i), bs, runs.data(), runs.size(), &count, held);
              }
            });
          } else if (path == "memcpy") {
            // The floor: the same bytes copied straight out of the mapping,
            // from the physical runs looked up before the clock starts.
            if (floor_runs.empty()) {
              floor_first.resize(offsets.size() + 1);
              for (size_t i = 0; i < offsets.size(); ++i) {
                floor_first[i] = floor_runs.size();
                size_t count = 0;
                const nvfs::MapGuard held;
                if (!fs.Map(h, offsets[i], bs, runs.data(), runs.size(), &count, held).ok()) {
                  Die("cannot map the data file");
                }
                floor_runs.insert(floor_runs.end(), runs.begin(), runs.begin() + count);
              }
              floor_first[offsets.size()] = floor_runs.size();
            }
            ns = TimeNs(ops, [&] {
              for (uint64_t i = 0; i < ops; ++i) {
                const size_t k = pow2 ? (i & mask) : (i % offsets.size());
                char* out = buffer.data();
                for (size_t r = floor_first[k]; r < floor_first[k + 1]; ++r) {
                  std::memcpy(out, floor_runs[r].data, floor_runs[r].len);
                  out += floor_runs[r].len;
                }
                asm volatile("" ::: "memory");
              }
            });
          } else {
            Die("unknown path " + path);
          }
          results[p].push_back(ns);
        }
      }
      for (size_t p = 0; p < o.paths.size(); ++p) {
        Report(o, "engine", o.paths[p], pattern, bs, 1, ops, results[p]);
      }
      if (sink == 42) std::printf(" ");  // keeps the loops from being optimised away
    }
  }
  if (writer.joinable()) {
    stop_writer = true;
    writer.join();
  }
  fs.Release(h);
  return 0;
}

}  // namespace nvfs::pread
