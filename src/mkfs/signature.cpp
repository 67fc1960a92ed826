// Recognising what a namespace already holds, so mkfs never formats over a
// filesystem by accident.
#include <algorithm>
#include <cstring>
#include <string_view>

#include "nvfs/mkfs.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs {

namespace {

struct Magic {
  const char* name;
  uint64_t offset;
  std::string_view bytes;
};

using namespace std::string_view_literals;

// Magic numbers of the filesystems and containers a user would hate to lose.
constexpr Magic kMagics[] = {
    {"ext2/ext3/ext4", 1080, "\x53\xEF"sv},
    {"xfs", 0, "XFSB"sv},
    {"btrfs", 65600, "_BHRfS_M"sv},
    {"f2fs", 1024, "\x10\x20\xF5\xF2"sv},
    {"LUKS", 0, "LUKS\xBA\xBE"sv},
    {"swap", 4086, "SWAPSPACE2"sv},
    {"iso9660", 32769, "CD001"sv},
    {"GPT partition table", 512, "EFI PART"sv},
};

bool HasBytes(const std::byte* base, uint64_t size, uint64_t offset, std::string_view bytes) {
  return offset <= size && bytes.size() <= size - offset &&
         std::memcmp(base + offset, bytes.data(), bytes.size()) == 0;
}

}  // namespace

std::vector<Signature> DetectSignatures(const std::byte* base, uint64_t size) {
  std::vector<Signature> found;
  const std::string_view nvfs_magic(format::kSuperStaticMagic, sizeof format::kSuperStaticMagic);
  if (HasBytes(base, size, 0, nvfs_magic)) found.push_back({"nvfs", 0, 8});
  // Block sizes that divide the size name the same candidate; report it once.
  ForEachBackupCandidate(size, [&](uint64_t offset, uint32_t) {
    const bool seen = std::any_of(found.begin(), found.end(),
                                  [&](const Signature& s) { return s.offset == offset; });
    if (!seen && HasBytes(base, size, offset, nvfs_magic)) {
      found.push_back({"nvfs (backup)", offset, 8});
    }
  });
  for (const Magic& m : kMagics) {
    if (HasBytes(base, size, m.offset, m.bytes)) {
      found.push_back({m.name, m.offset, static_cast<uint32_t>(m.bytes.size())});
    }
  }
  return found;
}

}  // namespace nvfs
