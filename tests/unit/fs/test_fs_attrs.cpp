// The filesystem core through its C++ API (meson test 'fs'): attributes —
// setattr, and extended attributes as the core serves them (src/fs/xattr*.cpp
// on their own: test_xattr.cpp): many names and large values, a full
// filesystem, the one-block format of mkfs 2.0, and fsck's repairs of a chain.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fs_image.hpp"
#include "nvfs/format.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/geometry.hpp"
#include "nvfs/media.hpp"
#include "test_fs.hpp"

namespace nvfs::test {
namespace {

TEST_CASE("xattrs: create, replace, get, list, remove", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t f = MustCreate(fs, kRoot, "f");
  REQUIRE(fs.SetXattr(f, "user.a", "1", 1, XATTR_CREATE).ok());
  CHECK(fs.SetXattr(f, "user.a", "2", 1, XATTR_CREATE).code() == EEXIST);
  CHECK(fs.SetXattr(f, "user.b", "2", 1, XATTR_REPLACE).code() == ENODATA);
  REQUIRE(fs.SetXattr(f, "user.a", "22", 2, XATTR_REPLACE).ok());
  REQUIRE(fs.SetXattr(f, "user.b", "333", 3, 0).ok());
  CHECK(*fs.GetXattr(f, "user.a", nullptr, 0) == 2);
  char small[1];
  CHECK(fs.GetXattr(f, "user.a", small, 1).code() == ERANGE);
  CHECK(fs.GetXattr(f, "user.zz", nullptr, 0).code() == ENODATA);
  CHECK(fs.SetXattr(f, "bogus.x", "1", 1, 0).code() == EOPNOTSUPP);
  char list[64];
  auto n = fs.ListXattr(f, list, sizeof list, Cred{});
  REQUIRE(n.ok());
  CHECK(std::string(list, *n) == std::string("user.a\0user.b\0", 14));
  CHECK(fs.ListXattr(f, list, 3, Cred{}).code() == ERANGE);
  REQUIRE(fs.RemoveXattr(f, "user.a").ok());
  CHECK(fs.RemoveXattr(f, "user.a").code() == ENODATA);
  img.Remount();
  char value[8];
  CHECK(*img->GetXattr(f, "user.b", value, sizeof value) == 3);
  CHECK(std::string(value, 3) == "333");
}

// Issue 11, item 2: system.* names were stored for anyone (a block each),
// and trusted.* names were listed to every caller.
TEST_CASE("xattrs: system names refused and trusted names listed only to uid 0", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t f = MustCreate(fs, kRoot, "f");
  char buf[64];
  // (The POSIX ACL names are served: tests/unit/test_acl.cpp.)
  for (const char* name : {"system.foo", "system.posix_acl_accessx", "system."}) {
    INFO(name);
    CHECK(fs.SetXattr(f, name, "\2\0\0\0", 4, 0).code() == EOPNOTSUPP);
    CHECK(fs.GetXattr(f, name, buf, sizeof buf).code() == EOPNOTSUPP);
    CHECK(fs.GetXattr(f, name, nullptr, 0).code() == EOPNOTSUPP);
    CHECK(fs.RemoveXattr(f, name).code() == EOPNOTSUPP);
  }
  CHECK(fs.GetAttr(f)->blocks == 0);
  REQUIRE(fs.SetXattr(f, "trusted.t", "1", 1, 0).ok());
  REQUIRE(fs.SetXattr(f, "user.u", "2", 1, 0).ok());
  REQUIRE(fs.SetXattr(f, "security.s", "3", 1, 0).ok());
  const Cred root{0, 0};
  const Cred nobody{65534, 65534};
  const std::string all("trusted.t\0user.u\0security.s\0", 28);
  const std::string shown("user.u\0security.s\0", 18);
  CHECK(*fs.ListXattr(f, nullptr, 0, root) == all.size());
  REQUIRE(*fs.ListXattr(f, buf, sizeof buf, root) == all.size());
  CHECK(std::string(buf, all.size()) == all);
  // The size query agrees with the list the same caller gets.
  CHECK(*fs.ListXattr(f, nullptr, 0, nobody) == shown.size());
  REQUIRE(*fs.ListXattr(f, buf, shown.size(), nobody) == shown.size());
  CHECK(std::string(buf, shown.size()) == shown);
  CHECK(fs.ListXattr(f, buf, shown.size() - 1, nobody).code() == ERANGE);
  // Not listed is not gone: the kernel decides who reads trusted.*.
  CHECK(*fs.GetXattr(f, "trusted.t", buf, sizeof buf) == 1);
}

TEST_CASE("setattr: mode, owner, times", "[fs]") {
  FsImage img;
  Filesystem& fs = img.fs();
  const uint64_t f = MustCreate(fs, kRoot, "f");
  SetAttrRequest req;
  req.valid = kSetMode | kSetUid | kSetGid | kSetAtime | kSetMtime;
  req.mode = 04711;
  req.uid = 5;
  req.gid = 6;
  req.atime = {1000, 5};
  req.mtime = {2000, 7};
  auto a = fs.SetAttr(f, req);
  REQUIRE(a.ok());
  CHECK((a->mode & 07777) == 04711);
  CHECK(S_ISREG(a->mode));
  CHECK(a->uid == 5);
  CHECK(a->gid == 6);
  CHECK(a->atime.tv_sec == 1000);
  CHECK(a->atime.tv_nsec == 5);
  CHECK(a->mtime.tv_sec == 2000);
  CHECK(a->ctime.tv_sec > 2000);
  img.Remount();
  CHECK(img->GetAttr(f)->mtime.tv_nsec == 7);
}

// Extended attributes past one block (issue 14, item 5): values up to
// 64 KiB, a thousand names per file, removal on a full filesystem.

std::string XattrName(int i) { return "user.attribute_" + std::to_string(i); }
std::string XattrValue(int i) { return "value_" + std::to_string(i); }
std::string BigValue(size_t size, char seed) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; ++i) v[i] = static_cast<char>(seed + i * 7 + i / 4096);
  return v;
}
std::string GetString(Filesystem& fs, uint64_t ino, const std::string& name) {
  Result<size_t> n = fs.GetXattr(ino, name, nullptr, 0);
  REQUIRE(n.ok());
  std::string v(*n, '\0');
  Result<size_t> got = fs.GetXattr(ino, name, v.data(), v.size());
  REQUIRE(got.ok());
  REQUIRE(*got == v.size());
  return v;
}


TEST_CASE("xattrs: 1000 names and 64 KiB values, listed, replaced, removed, blocks counted",
          "[fs][xattr]") {
  FsImage img;
  const uint64_t free_before = img->GetStatFs()->blocks_free;
  const uint64_t f = MustCreate(img.fs(), kRoot, "f");
  for (int i = 0; i < 1000; ++i) {
    const std::string v = XattrValue(i);
    REQUIRE(img->SetXattr(f, XattrName(i), v.data(), v.size(), XATTR_CREATE).ok());
  }
  const std::string big = BigValue(65536, 'a');
  REQUIRE(img->SetXattr(f, "user.big", big.data(), big.size(), 0).ok());
  CHECK(img->SetXattr(f, "user.toobig", big.data(), big.size() + 1, 0).code() == E2BIG);
  // What ext4 answers for the list: its size, ERANGE for a short buffer.
  const size_t list_size = *img->ListXattr(f, nullptr, 0, Cred{});
  std::string list(list_size, '\0');
  CHECK(img->ListXattr(f, list.data(), list_size - 1, Cred{}).code() == ERANGE);
  REQUIRE(*img->ListXattr(f, list.data(), list.size(), Cred{}) == list_size);
  std::set<std::string> names;
  for (size_t at = 0; at < list.size(); at += std::strlen(list.data() + at) + 1) {
    names.insert(list.data() + at);
  }
  CHECK(names.size() == 1001);
  CHECK(names.count(XattrName(999)) == 1);
  CHECK(names.count("user.big") == 1);

  img.Remount();
  CHECK(GetString(img.fs(), f, "user.big") == big);
  for (int i = 0; i < 1000; i += 37) CHECK(GetString(img.fs(), f, XattrName(i)) == XattrValue(i));
  // The blocks the file holds are what the filesystem lost.
  const uint64_t held = free_before - img->GetStatFs()->blocks_free;
  CHECK(img->GetAttr(f)->blocks * 512 == held * 4096);
  CHECK(held >= 17);  // the value's 16 blocks and the names' blocks
  RequireFsckClean(img, "1000 names and a 64 KiB value");

  // Replace: big -> small (inline) -> big again, and a name in the middle.
  REQUIRE(img->SetXattr(f, "user.big", "x", 1, XATTR_REPLACE).ok());
  CHECK(GetString(img.fs(), f, "user.big") == "x");
  const std::string other = BigValue(40000, 'q');
  REQUIRE(img->SetXattr(f, "user.big", other.data(), other.size(), XATTR_REPLACE).ok());
  REQUIRE(img->SetXattr(f, XattrName(500), other.data(), other.size(), XATTR_REPLACE).ok());
  CHECK(GetString(img.fs(), f, "user.big") == other);
  CHECK(GetString(img.fs(), f, XattrName(500)) == other);
  CHECK(GetString(img.fs(), f, XattrName(501)) == XattrValue(501));
  RequireFsckClean(img, "replaces");

  // Remove every name: every block comes back.
  REQUIRE(img->RemoveXattr(f, "user.big").ok());
  for (int i = 0; i < 1000; ++i) REQUIRE(img->RemoveXattr(f, XattrName(i)).ok());
  CHECK(*img->ListXattr(f, nullptr, 0, Cred{}) == 0);
  CHECK(img->GetAttr(f)->blocks == 0);
  CHECK(img->GetStatFs()->blocks_free == free_before);
  RequireFsckClean(img, "removes");
}

TEST_CASE("xattrs: a remove works on a full filesystem and frees the value's blocks",
          "[fs][xattr]") {
  FsImage img(16ull << 20);
  const uint64_t f = MustCreate(img.fs(), kRoot, "f");
  const std::string big = BigValue(65536, 'b');
  REQUIRE(img->SetXattr(f, "user.big", big.data(), big.size(), 0).ok());
  for (int i = 0; i < 50; ++i) {
    const std::string v = XattrValue(i);
    REQUIRE(img->SetXattr(f, XattrName(i), v.data(), v.size(), 0).ok());
  }
  // Fill the filesystem to its last block.
  const uint64_t filler = MustCreate(img.fs(), kRoot, "filler");
  {
    auto h = img->Open(filler, O_RDWR);
    REQUIRE(h.ok());
    const std::string chunk(1 << 20, 'z');
    uint64_t at = 0;
    for (;;) {
      auto n = img->Write(*h, at, chunk.data(), chunk.size());
      if (!n.ok()) {
        CHECK(n.code() == ENOSPC);
        break;
      }
      at += *n;
    }
    const char one = 'z';
    while (img->Write(*h, at, &one, 1).ok()) at += 4096;
    img->Release(*h);
  }
  const uint64_t reserve = ReserveBlocks(*img->GetStatFs());
  CHECK(img->GetStatFs()->blocks_free == reserve);
  CHECK(img->SetXattr(f, "user.new", big.data(), big.size(), 0).code() == ENOSPC);
  REQUIRE(img->RemoveXattr(f, XattrName(7)).ok());
  REQUIRE(img->RemoveXattr(f, "user.big").ok());
  CHECK(img->GetXattr(f, "user.big", nullptr, 0).code() == ENODATA);
  CHECK(GetString(img.fs(), f, XattrName(8)) == XattrValue(8));
  CHECK(img->GetStatFs()->blocks_free == reserve + 16);
  RequireFsckClean(img, "removes on a full filesystem");
}

TEST_CASE("xattrs: unlink frees a file of 1000 big values, over several transactions",
          "[fs][xattr]") {
  FsImage img(96ull << 20);
  const uint64_t free_before = img->GetStatFs()->blocks_free;
  const uint64_t inodes_before = img->GetStatFs()->inodes_free;
  const uint64_t f = MustCreate(img.fs(), kRoot, "f");
  const std::string value = BigValue(5000, 'c');  // two blocks each
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(img->SetXattr(f, XattrName(i), value.data(), value.size(), 0).ok());
  }
  CHECK(img->GetAttr(f)->blocks * 512 >= 2000u * 4096);
  REQUIRE(img->Unlink(kRoot, "f").ok());
  CHECK(img->GetStatFs()->blocks_free == free_before);
  CHECK(img->GetStatFs()->inodes_free == inodes_before);
  RequireFsckClean(img, "the unlink");
}

TEST_CASE("xattrs: a namespace of the one-block format (mkfs 2.0) is read and kept as it is",
          "[fs][xattr]") {
  FsImage img(128ull << 20, 4096, 0, /*feature_incompat=*/0);
  const uint64_t f = MustCreate(img.fs(), kRoot, "f");
  REQUIRE(img->SetXattr(f, "user.a", "1", 1, 0).ok());
  REQUIRE(img->SetXattr(f, "user.b", "22", 2, 0).ok());
  const std::string big = BigValue(65536, 'd');
  CHECK(img->SetXattr(f, "user.big", big.data(), big.size(), 0).code() == ENOSPC);
  REQUIRE(img->RemoveXattr(f, "user.a").ok());
  const auto& inode = *reinterpret_cast<const format::Inode*>(
      img->media().base() + img->geometry().InodeOffset(f));
  const uint64_t block = img->geometry().BlockOffset(inode.xattr_block);
  format::XattrHeader header;
  std::memcpy(&header, img->media().base() + block, sizeof header);
  CHECK(header.magic == format::kXattrMagic);
  CHECK(header.count == 1);
  img.Remount();
  CHECK(GetString(img.fs(), f, "user.b") == "22");
  RequireFsckClean(img, "one-block xattrs");
}

// fsck's repairs of a chain: a value whose run names another file's blocks
// loses that attribute only; a chain looped back on itself is damage to the
// core (the walk is bounded by the inode's blocks) and fsck cuts the loop.
TEST_CASE("xattrs: fsck drops a damaged value and cuts a looped chain, keeping the rest",
          "[fs][xattr]") {
  FsImage img;
  // `other` first: pass 1 claims its blocks before f's runs (the first
  // claimant of a block keeps it; a later xattr run naming it is dropped).
  const uint64_t other = MustCreate(img.fs(), kRoot, "other", std::string(8192, 'o'));
  const uint64_t f = MustCreate(img.fs(), kRoot, "f");
  REQUIRE(img->SetXattr(f, "user.a", "1", 1, 0).ok());
  const std::string big = BigValue(9000, 'e');
  REQUIRE(img->SetXattr(f, "user.big", big.data(), big.size(), 0).ok());
  REQUIRE(img->SetXattr(f, "user.c", "3", 1, 0).ok());
  const Geometry& g = img->geometry();
  auto* base = const_cast<std::byte*>(img->media().base());
  const auto& inode = *reinterpret_cast<const format::Inode*>(base + g.InodeOffset(f));
  const auto& other_inode = *reinterpret_cast<const format::Inode*>(base + g.InodeOffset(other));
  std::byte* block = base + g.BlockOffset(inode.xattr_block);
  const auto fsck = [&](RepairMode mode) {
    img.Unmount();
    std::vector<std::string> lines;
    FsckReport report;
    {
      auto media = OpenMedia(img.path(), MediaOptions{});
      REQUIRE(media.ok());
      report =
          CheckNamespace(**media, mode, [&](const std::string& line) { lines.push_back(line); });
    }
    std::string all;
    for (const std::string& line : lines) all += line + "\n";
    img.Mount();
    return std::make_pair(report, all);
  };
  SECTION("a run naming another file's block") {
    // The record of user.big: after user.a's (8 + 6 + 1 -> 16 bytes).
    format::XattrEntry entry;
    const uint32_t at = sizeof(format::XattrBlockHeader) + 16;
    std::memcpy(&entry, block + at, sizeof entry);
    REQUIRE(entry.runs >= 1);
    const uint64_t stolen = other_inode.map.file.direct[0];
    std::memcpy(block + at + 8 + 8, &stolen, sizeof stolen);  // name "user.big" is 8 bytes
    auto [report, out] = fsck(RepairMode::kYes);
    INFO(out);
    CHECK(report.problems >= 1);
    CHECK(out.find("dropping that attribute") != std::string::npos);
    CHECK(img->GetXattr(f, "user.big", nullptr, 0).code() == ENODATA);
    CHECK(GetString(img.fs(), f, "user.a") == "1");
    CHECK(GetString(img.fs(), f, "user.c") == "3");
    CHECK(ReadAll(img.fs(), other) == std::string(8192, 'o'));
  }
  SECTION("a chain whose next names its own block") {
    format::XattrBlockHeader header;
    std::memcpy(&header, block, sizeof header);
    header.next = inode.xattr_block;
    std::memcpy(block, &header, sizeof header);
    CHECK(img->GetXattr(f, "user.zz", nullptr, 0).code() == EIO);
    CHECK(img->read_only());
    img.mount_options = MountOptions{};
    auto [report, out] = fsck(RepairMode::kYes);
    INFO(out);
    CHECK(report.problems >= 1);
    INFO("exit " << report.exit_code << " read-only " << img->read_only());
    // The loop is cut where the block comes round again: the block is kept.
    CHECK(GetString(img.fs(), f, "user.a") == "1");
    CHECK(GetString(img.fs(), f, "user.big") == big);
  }
  RequireFsckClean(img, "the repair");
}

}  // namespace
}  // namespace nvfs::test
