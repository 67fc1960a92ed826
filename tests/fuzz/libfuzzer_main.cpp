// nvfs-fuzz: the libFuzzer target over the corrupted-image entry point
// (fuzz_target.hpp): bytes -> image -> fsck, mounts, walks, repair. Built by
// tools/fuzz.sh with clang (-Dlibfuzzer=true).
//
// An input does not hold a whole image (megabytes, where libFuzzer does best
// with small inputs); it names a seed image and patches it:
//
//   byte 0       seed (index into seeds.hpp's list, modulo its size)
//   byte 1       flags: bit 0 recompute every checksum after patching
//   then, until the input ends, patches of
//     4 bytes    offset, little-endian, modulo the image size
//     1 byte     length - 1 (1..16, low four bits)
//     length     bytes (fewer if the input ends)
//
// Any property RunCase reports broken aborts, so libFuzzer keeps the input as
// a crash. With NVFS_FUZZ_WRITE_CORPUS=DIR set, writes a seed corpus to DIR
// (each seed unpatched, and seeded mutations of each from the suite's
// mutator, as patches) and exits.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "arena_media.hpp"
#include "fuzz_target.hpp"
#include "mutator.hpp"
#include "seeds.hpp"

namespace {

using nvfs::fuzz::Arena;
using nvfs::fuzz::Catalog;

struct Loaded {
  nvfs::fuzz::Seed seed;
  std::unique_ptr<Arena> arena;
  std::unique_ptr<Catalog> catalog;
};

std::vector<Loaded>& Seeds() {
  static std::vector<Loaded> seeds = [] {
    std::vector<Loaded> out;
    for (nvfs::fuzz::Seed& seed : nvfs::fuzz::BuildSeeds()) {
      Loaded l;
      l.arena = std::make_unique<Arena>(seed.image.size());
      l.arena->Load(seed.image);
      l.catalog = std::make_unique<Catalog>(*l.arena);
      l.seed = std::move(seed);
      out.push_back(std::move(l));
    }
    return out;
  }();
  return seeds;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

// One input per seed unpatched, and `per_seed` mutations of each.
void WriteCorpus(const char* dir, int per_seed) {
  mkdir(dir, 0755);
  std::vector<Loaded>& seeds = Seeds();
  int written = 0;
  for (size_t s = 0; s < seeds.size(); ++s) {
    Arena& arena = *seeds[s].arena;
    WriteFile(std::string(dir) + "/" + seeds[s].seed.name + "-0",
              {static_cast<uint8_t>(s), 0});
    ++written;
    for (int n = 1; n <= per_seed; ++n) {
      std::mt19937_64 rng(s * 100003 + static_cast<uint64_t>(n));
      (void)seeds[s].catalog->Mutate(arena, rng);
      // The mutation's bytes, as patches against the pristine image.
      std::vector<uint8_t> input{static_cast<uint8_t>(s), 0};
      const auto& pristine = arena.pristine();
      for (uint64_t at = 0; at < arena.size(); ++at) {
        if (arena.data()[at] == pristine[at]) continue;
        uint64_t end = at;
        while (end < arena.size() && end - at < 16 && arena.data()[end] != pristine[end]) ++end;
        const uint32_t offset = static_cast<uint32_t>(at);
        for (int i = 0; i < 4; ++i) input.push_back(static_cast<uint8_t>(offset >> (8 * i)));
        input.push_back(static_cast<uint8_t>(end - at - 1));
        for (uint64_t i = at; i < end; ++i) input.push_back(std::to_integer<uint8_t>(arena.data()[i]));
        at = end - 1;
      }
      arena.Restore();
      WriteFile(std::string(dir) + "/" + seeds[s].seed.name + "-" + std::to_string(n), input);
      ++written;
    }
  }
  std::printf("nvfs-fuzz: wrote %d inputs to %s\n", written, dir);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("NVFS_FUZZ_WRITE_CORPUS")) {
    WriteCorpus(dir, 40);
    std::exit(0);
  }
  (void)Seeds();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::vector<Loaded>& seeds = Seeds();
  Loaded& loaded = seeds[data[0] % seeds.size()];
  Arena& arena = *loaded.arena;
  const uint8_t flags = data[1];
  size_t pos = 2;
  while (pos + 5 <= size) {
    uint32_t offset = 0;
    for (int i = 0; i < 4; ++i) offset |= uint32_t{data[pos + i]} << (8 * i);
    size_t len = 1 + (data[pos + 4] & 15);
    pos += 5;
    len = std::min(len, size - pos);
    if (len == 0) break;
    const uint64_t at = offset % arena.size();
    len = std::min<uint64_t>(len, arena.size() - at);
    arena.Poke(at, data + pos, len);
    pos += len;
  }
  if (flags & 1) Catalog::FixAll(arena, loaded.catalog->geometry());
  nvfs::fuzz::CaseOptions options;
  options.max_entries = 512;
  const nvfs::fuzz::CaseResult result = nvfs::fuzz::RunCase(arena, options);
  arena.Restore();
  if (!result.violations.empty()) {
    for (const std::string& v : result.violations) {
      std::fprintf(stderr, "nvfs-fuzz: seed %s: %s\n", loaded.seed.name.c_str(), v.c_str());
    }
    std::abort();
  }
  return 0;
}
