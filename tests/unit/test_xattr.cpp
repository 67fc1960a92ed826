// The extended-attribute module (src/fs/xattr.hpp) on its own: the namespace
// policy as plain functions; the chained and the one-block formats over a
// formatted namespace opened as mount opens it (FsFixture: media, allocator,
// journal, no Filesystem); then what the Filesystem entry points add on top
// (size and flag checks, the ACL names, what ListXattr shows to whom, a
// read-only mount) on a mounted image.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cstddef>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "fs/xattr.hpp"
#include "fs_fixture.hpp"
#include "fs_image.hpp"

namespace nvfs::test {
namespace {

using format::Inode;

// ---------------------------------------------------------------------------
// The namespace policy
// ---------------------------------------------------------------------------

TEST_CASE("xattr policy: user, trusted and security names are served as given", "[xattr]") {
  for (const char* name : {"user.a", "trusted.t", "security.selinux", "security.capability",
                           "user.a.b.c", "user.with space"}) {
    INFO(name);
    CHECK(xattr::CheckXattrName(name).ok());
  }
}

TEST_CASE("xattr policy: of system names only the two ACL names", "[xattr]") {
  CHECK(xattr::CheckXattrName(format::kAclAccessName).ok());
  CHECK(xattr::CheckXattrName(format::kAclDefaultName).ok());
  CHECK(xattr::IsAclName(format::kAclAccessName));
  CHECK(xattr::IsAclName(format::kAclDefaultName));
  for (const char* name : {"system.foo", "system.posix_acl_access2", "system.nfs4_acl",
                           "system.posix_acl"}) {
    INFO(name);
    CHECK_FALSE(xattr::IsAclName(name));
    CHECK(xattr::CheckXattrName(name).code() == EOPNOTSUPP);
  }
}

TEST_CASE("xattr policy: names of no namespace are EOPNOTSUPP, bad lengths ERANGE", "[xattr]") {
  // A prefix alone is no name: the namespace needs a byte after it.
  for (const char* name : {"bogus.x", "user", "user.", "trusted.", "security.", "system.",
                           "User.a", ".user.a", "a"}) {
    INFO(name);
    CHECK(xattr::CheckXattrName(name).code() == EOPNOTSUPP);
  }
  CHECK(xattr::CheckXattrName("").code() == ERANGE);
  std::string name = "user.";
  name.resize(format::kXattrNameMax, 'n');
  CHECK(xattr::CheckXattrName(name).ok());
  name.push_back('n');
  CHECK(xattr::CheckXattrName(name).code() == ERANGE);
  // Too long is ERANGE even in no namespace (the length is checked first).
  CHECK(xattr::CheckXattrName(std::string(300, 'x')).code() == ERANGE);
}

TEST_CASE("xattr policy: trusted names listed to uid 0 only, system names but ACLs to no one",
          "[xattr]") {
  const Cred root{0, 0};
  const Cred user{1000, 1000};
  const Cred group_zero{1000, 0};  // gid 0 is no privilege
  for (const Cred& cred : {root, user, group_zero}) {
    INFO("uid " << cred.uid << " gid " << cred.gid);
    CHECK(xattr::Listed("user.a", cred));
    CHECK(xattr::Listed("security.selinux", cred));
    CHECK(xattr::Listed(format::kAclAccessName, cred));
    CHECK(xattr::Listed(format::kAclDefaultName, cred));
    CHECK_FALSE(xattr::Listed("system.foo", cred));  // on the media from before the rule
    CHECK_FALSE(xattr::Listed("bogus.x", cred));
    CHECK(xattr::Listed("trusted.t", cred) == (cred.uid == 0));
  }
}

// ---------------------------------------------------------------------------
// The formats, over a namespace without a mount
// ---------------------------------------------------------------------------

// Reformats the fixture's namespace in the one-block format (as mkfs 2.0
// made them, mkfs.nvfs -O ^xattr_chain).
void FormatOneBlock(FsFixture& fs) {
  fs.Reopen([](Media& media) {
    MkfsOptions options;
    options.feature_incompat = format::kIncompatKnown & ~format::kIncompatXattrChain;
    auto plan = PlanMkfs(media.size(), options);
    REQUIRE(plan.ok());
    REQUIRE(WriteMkfs(media, *plan).ok());
  });
  REQUIRE_FALSE(fs.geometry().xattr_chain());
}

// The value of `name` through the module's own lookup, or "<none>".
std::string Get(FsFixture& fs, uint64_t ino, std::string_view name) {
  xattr::Found found;
  REQUIRE(xattr::Find(fs.ctx(), fs.ctx().InodeAt(ino), name, &found).ok());
  if (!found.found) return "<none>";
  std::string value(found.record.value_len, '\0');
  xattr::CopyValue(fs.ctx(), found.record, value.data());
  return value;
}

// Live names in walk order.
std::vector<std::string> Names(FsFixture& fs, uint64_t ino) {
  std::vector<std::string> names;
  REQUIRE(xattr::Walk(fs.ctx(), fs.ctx().InodeAt(ino),
                      [&](const xattr::ChainBlock&, const XattrRecord& record) {
                        if (!record.free) names.emplace_back(record.name);
                        return true;
                      })
              .ok());
  return names;
}

Status Set(FsFixture& fs, uint64_t ino, std::string_view name, const std::string& value,
           int flags = 0) {
  return xattr::SetChained(fs.ctx(), ino, fs.ctx().InodeAt(ino), name, value.data(), value.size(),
                           flags);
}

Status Remove(FsFixture& fs, uint64_t ino, std::string_view name) {
  return xattr::RemoveChained(fs.ctx(), fs.ctx().InodeAt(ino), name, nullptr);
}

// The record of `name`: whether its value lies in runs.
bool InRuns(FsFixture& fs, uint64_t ino, std::string_view name) {
  xattr::Found found;
  REQUIRE(xattr::Find(fs.ctx(), fs.ctx().InodeAt(ino), name, &found).ok());
  REQUIRE(found.found);
  return found.record.runs != 0;
}

// The largest value of `name` whose record stays inline.
size_t LargestInline(std::string_view name) {
  size_t size = 0;
  while (format::XattrEntryLength(name.size(), size + 1) <= xattr::kInlineRecordMax) ++size;
  return size;
}

TEST_CASE("chained xattrs: set, get, list, replace and remove", "[xattr]") {
  FsFixture fs;
  REQUIRE(fs.geometry().xattr_chain());
  const uint64_t ino = CreateFile(fs);
  const Inode& inode = fs.ctx().InodeAt(ino);
  REQUIRE(Set(fs, ino, "user.a", "1", XATTR_CREATE).ok());
  CHECK(Set(fs, ino, "user.a", "2", XATTR_CREATE).code() == EEXIST);
  CHECK(Set(fs, ino, "user.b", "2", XATTR_REPLACE).code() == ENODATA);
  REQUIRE(Set(fs, ino, "user.b", "").ok());  // an empty value is a value
  REQUIRE(Set(fs, ino, "trusted.c", "333").ok());
  CHECK(inode.blocks == 1);  // one block of records
  CHECK(Get(fs, ino, "user.a") == "1");
  CHECK(Get(fs, ino, "user.b") == "");
  CHECK(Get(fs, ino, "trusted.c") == "333");
  CHECK(Get(fs, ino, "user.zz") == "<none>");
  const std::vector<std::string> names = Names(fs, ino);
  CHECK(std::set<std::string>(names.begin(), names.end()) ==
        std::set<std::string>{"user.a", "user.b", "trusted.c"});

  REQUIRE(Set(fs, ino, "user.a", "a longer value than before", XATTR_REPLACE).ok());
  CHECK(Get(fs, ino, "user.a") == "a longer value than before");
  REQUIRE(Set(fs, ino, "user.a", "x").ok());
  CHECK(Get(fs, ino, "user.a") == "x");
  CHECK(Names(fs, ino).size() == 3);

  REQUIRE(Remove(fs, ino, "user.b").ok());
  CHECK(Remove(fs, ino, "user.b").code() == ENODATA);
  CHECK(Get(fs, ino, "user.b") == "<none>");
  REQUIRE(Remove(fs, ino, "user.a").ok());
  REQUIRE(Remove(fs, ino, "trusted.c").ok());
  // The last live record gone: the block is unlinked and freed.
  CHECK(Names(fs, ino).empty());
  CHECK(inode.xattr_block == 0);
  CHECK(inode.blocks == 0);
  // Everything survives a reopen (journal recovery finds nothing to do).
  REQUIRE(Set(fs, ino, "user.kept", "k").ok());
  fs.Reopen();
  CHECK(Get(fs, ino, "user.kept") == "k");
}

TEST_CASE("chained xattrs: a freed record's place takes the next set, no block added",
          "[xattr]") {
  FsFixture fs;
  const uint64_t ino = CreateFile(fs);
  const Inode& inode = fs.ctx().InodeAt(ino);
  // Records of 120 bytes (8-byte names, 100-byte values): 33 fill a 4 KiB
  // block but for a tail of 104 bytes, too short for another.
  const auto name_of = [](char prefix, int i) {
    return std::string("user.") + prefix + static_cast<char>('0' + i / 10) +
           static_cast<char>('0' + i % 10);
  };
  REQUIRE(format::XattrEntryLength(8, 100) == 120);
  for (int i = 0; i < 33; ++i) {
    REQUIRE(Set(fs, ino, name_of('n', i), std::string(100, static_cast<char>('a' + i))).ok());
  }
  const uint64_t head = inode.xattr_block;
  REQUIRE(inode.blocks == 1);
  REQUIRE(Remove(fs, ino, name_of('n', 4)).ok());
  REQUIRE(Set(fs, ino, name_of('m', 4), std::string(100, 'z')).ok());
  CHECK(inode.xattr_block == head);
  CHECK(inode.blocks == 1);
  CHECK(Get(fs, ino, name_of('m', 4)) == std::string(100, 'z'));
  CHECK(Get(fs, ino, name_of('n', 5)) == std::string(100, 'f'));
  // No free record left: the next set takes a new block at the head.
  REQUIRE(Set(fs, ino, name_of('n', 33), std::string(100, 'y')).ok());
  CHECK(inode.blocks == 2);
  CHECK(inode.xattr_block != head);
}

TEST_CASE("chained xattrs: a record up to kInlineRecordMax keeps its value inline, "
          "one byte more goes to runs", "[xattr]") {
  FsFixture fs;
  const uint64_t ino = CreateFile(fs);
  const Inode& inode = fs.ctx().InodeAt(ino);
  const size_t inline_max = LargestInline("user.edge");
  REQUIRE(format::XattrEntryLength(9, inline_max) == xattr::kInlineRecordMax);
  const std::string at_limit(inline_max, 'i');
  REQUIRE(Set(fs, ino, "user.edge", at_limit).ok());
  CHECK_FALSE(InRuns(fs, ino, "user.edge"));
  CHECK(inode.blocks == 1);
  const std::string past(inline_max + 1, 'r');
  REQUIRE(Set(fs, ino, "user.edge", past).ok());
  CHECK(InRuns(fs, ino, "user.edge"));
  CHECK(inode.blocks == 2);  // the record block and the value's block
  CHECK(Get(fs, ino, "user.edge") == past);
  REQUIRE(Set(fs, ino, "user.edge", at_limit).ok());  // back inline: the run freed
  CHECK_FALSE(InRuns(fs, ino, "user.edge"));
  CHECK(inode.blocks == 1);
}

TEST_CASE("chained xattrs: the largest value (kXattrValueMax) in runs, read back whole",
          "[xattr]") {
  FsFixture fs;
  const uint64_t ino = CreateFile(fs);
  const Inode& inode = fs.ctx().InodeAt(ino);
  std::string big(format::kXattrValueMax, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + i / 4096);
  REQUIRE(Set(fs, ino, "user.big", big).ok());
  CHECK(InRuns(fs, ino, "user.big"));
  CHECK(inode.blocks == 1 + format::kXattrValueMax / fs.geometry().block_size());
  CHECK(Get(fs, ino, "user.big") == big);
  fs.Reopen();
  CHECK(Get(fs, ino, "user.big") == big);
  REQUIRE(Remove(fs, ino, "user.big").ok());
  CHECK(fs.ctx().InodeAt(ino).blocks == 0);
}

TEST_CASE("chained xattrs: the names' list stops at kXattrListMax (ENOSPC); a replace "
          "still works when it is full", "[xattr]") {
  FsFixture fs;
  const uint64_t ino = CreateFile(fs);
  // 255-byte names take 256 bytes of the list each: 256 of them fill it.
  const auto name_of = [](int i) {
    std::string name = "user." + std::to_string(i) + "_";
    name.resize(format::kXattrNameMax, 'n');
    return name;
  };
  int set = 0;
  for (; set < 256; ++set) REQUIRE(Set(fs, ino, name_of(set), "v").ok());
  uint64_t list_bytes = 0;
  xattr::Found found;
  REQUIRE(xattr::Find(fs.ctx(), fs.ctx().InodeAt(ino), "user.none", &found, &list_bytes).ok());
  CHECK(list_bytes == format::kXattrListMax);
  CHECK(Set(fs, ino, name_of(set), "v").code() == ENOSPC);
  CHECK(Set(fs, ino, "user.x", "v").code() == ENOSPC);  // even the shortest name
  REQUIRE(Set(fs, ino, name_of(0), "replaced").ok());  // the list does not grow
  CHECK(Get(fs, ino, name_of(0)) == "replaced");
  REQUIRE(Remove(fs, ino, name_of(1)).ok());
  REQUIRE(Set(fs, ino, name_of(set), "v").ok());  // room again
}

// ---------------------------------------------------------------------------
// The one-block format
// ---------------------------------------------------------------------------

Status LegacySet(FsFixture& fs, uint64_t ino, const std::string& name, const std::string& value) {
  return xattr::LegacyChange(fs.ctx(), ino, fs.ctx().InodeAt(ino),
                             [&](std::vector<xattr::Attribute>& attrs) -> Status {
                               auto it = xattr::FindIn(attrs, name);
                               if (it != attrs.end()) {
                                 it->value = value;
                               } else {
                                 attrs.push_back({name, value});
                               }
                               return Status::Ok();
                             });
}

Status LegacyRemove(FsFixture& fs, uint64_t ino, const std::string& name) {
  return xattr::LegacyChange(fs.ctx(), ino, fs.ctx().InodeAt(ino),
                             [&](std::vector<xattr::Attribute>& attrs) -> Status {
                               auto it = xattr::FindIn(attrs, name);
                               if (it == attrs.end()) return Error(ENODATA);
                               attrs.erase(it);
                               return Status::Ok();
                             });
}

TEST_CASE("one-block xattrs: set, get, list, replace and remove, the block replaced whole",
          "[xattr]") {
  FsFixture fs;
  FormatOneBlock(fs);
  const uint64_t ino = CreateFile(fs);
  const Inode& inode = fs.ctx().InodeAt(ino);
  REQUIRE(LegacySet(fs, ino, "user.a", "1").ok());
  const uint64_t first = inode.xattr_block;
  REQUIRE(first != 0);
  REQUIRE(LegacySet(fs, ino, "user.b", "22").ok());
  CHECK(inode.xattr_block != first);  // a new block for every change
  CHECK(inode.blocks == 1);           // and the old one freed
  format::XattrHeader header;
  std::memcpy(&header, fs.ctx().Block(inode.xattr_block), sizeof header);
  CHECK(header.magic == format::kXattrMagic);
  CHECK(header.count == 2);

  CHECK(Names(fs, ino) == std::vector<std::string>{"user.a", "user.b"});
  CHECK(Get(fs, ino, "user.b") == "22");
  REQUIRE(LegacySet(fs, ino, "user.a", "replaced").ok());
  CHECK(Get(fs, ino, "user.a") == "replaced");
  auto attrs = xattr::LegacyLoad(fs.ctx(), inode);
  REQUIRE(attrs.ok());
  REQUIRE(attrs->size() == 2);
  CHECK((*attrs)[0].name == "user.a");
  CHECK((*attrs)[0].value == "replaced");

  // A refused change stores nothing.
  const uint64_t before = inode.xattr_block;
  CHECK(LegacyRemove(fs, ino, "user.zz").code() == ENODATA);
  CHECK(inode.xattr_block == before);
  REQUIRE(LegacyRemove(fs, ino, "user.a").ok());
  REQUIRE(LegacyRemove(fs, ino, "user.b").ok());
  CHECK(inode.xattr_block == 0);
  CHECK(inode.blocks == 0);
}

TEST_CASE("one-block xattrs: the largest value that fits the block, ENOSPC one byte past it",
          "[xattr]") {
  FsFixture fs;
  FormatOneBlock(fs);
  const uint64_t ino = CreateFile(fs);
  const uint32_t room = fs.geometry().block_size() - sizeof(format::XattrHeader);
  const std::string name = "user.v";
  size_t largest = 0;
  while (format::XattrEntryLength(name.size(), largest + 1) <= room) ++largest;
  REQUIRE(largest == room - sizeof(format::XattrEntry) - name.size());
  REQUIRE(LegacySet(fs, ino, name, std::string(largest, 'L')).ok());
  CHECK(Get(fs, ino, name) == std::string(largest, 'L'));
  CHECK(LegacySet(fs, ino, name, std::string(largest + 1, 'L')).code() == ENOSPC);
  CHECK(Get(fs, ino, name) == std::string(largest, 'L'));  // kept as it was
  // Full: even an empty value of another name does not fit.
  CHECK(LegacySet(fs, ino, "user.w", "").code() == ENOSPC);
}

TEST_CASE("one-block xattrs: a block written as mkfs 2.0's code wrote it is read", "[xattr]") {
  FsFixture fs;
  FormatOneBlock(fs);
  const uint64_t ino = CreateFile(fs);
  const Inode& inode = fs.ctx().InodeAt(ino);
  // The block by hand: header, then entries of name and value, each padded
  // to 8 bytes.
  const std::vector<std::pair<std::string, std::string>> entries = {
      {"user.first", "one"}, {"security.selinux", "system_u:object_r:t:s0"}, {"user.e", ""}};
  std::vector<std::byte> block(fs.geometry().block_size());
  format::XattrHeader header{};
  header.magic = format::kXattrMagic;
  uint32_t pos = sizeof header;
  for (const auto& [name, value] : entries) {
    format::XattrEntry entry{};
    entry.name_len = static_cast<uint8_t>(name.size());
    entry.value_len = static_cast<uint32_t>(value.size());
    std::memcpy(block.data() + pos, &entry, sizeof entry);
    std::memcpy(block.data() + pos + sizeof entry, name.data(), name.size());
    std::memcpy(block.data() + pos + sizeof entry + name.size(), value.data(), value.size());
    pos += static_cast<uint32_t>(format::XattrEntryLength(name.size(), value.size()));
    ++header.count;
  }
  header.used = pos - static_cast<uint32_t>(sizeof header);
  std::memcpy(block.data(), &header, sizeof header);
  {
    Tx tx(fs.journal(), "hand-made xattr block");
    auto run = fs.alloc().AllocateBlocks(tx, fs.geometry().FirstDataBlock(0), 1);
    REQUIRE(run.ok());
    tx.StoreFresh(fs.geometry().BlockOffset(run->first), block.data(), block.size());
    tx.Set(inode.xattr_block, run->first);
    tx.Set(inode.blocks, uint64_t{1});
    REQUIRE(tx.Commit().ok());
  }
  CHECK(Names(fs, ino) == std::vector<std::string>{"user.first", "security.selinux", "user.e"});
  CHECK(Get(fs, ino, "security.selinux") == "system_u:object_r:t:s0");
  CHECK(Get(fs, ino, "user.e") == "");
  auto attrs = xattr::LegacyLoad(fs.ctx(), inode);
  REQUIRE(attrs.ok());
  CHECK(attrs->size() == 3);
  // The same block in a chained namespace is damage (its magic is not a
  // chain's): EIO, nothing followed.
  FsFixture chained;
  const uint64_t other = CreateFile(chained);
  {
    const Inode& other_inode = chained.ctx().InodeAt(other);
    Tx tx(chained.journal(), "one-block block in a chain");
    auto run = chained.alloc().AllocateBlocks(tx, chained.geometry().FirstDataBlock(0), 1);
    REQUIRE(run.ok());
    tx.StoreFresh(chained.geometry().BlockOffset(run->first), block.data(), block.size());
    tx.Set(other_inode.xattr_block, run->first);
    tx.Set(other_inode.blocks, uint64_t{1});
    REQUIRE(tx.Commit().ok());
    xattr::Found found;
    CHECK(xattr::Find(chained.ctx(), other_inode, "user.first", &found).code() == EIO);
  }
}

// ---------------------------------------------------------------------------
// The Filesystem entry points
// ---------------------------------------------------------------------------

uint64_t MountedFile(FsImage& img) {
  Attr attr;
  auto f = img->Create(1, "f", 0644, O_RDWR, Cred{1000, 1000}, &attr);
  REQUIRE(f.ok());
  img->Release(*f);
  img->Forget(attr.ino, 1);  // Create took a lookup reference, as FUSE's would
  return attr.ino;
}

TEST_CASE("xattr entry points: E2BIG past kXattrValueMax, EINVAL for unknown flags, the "
          "policy's refusals before the inode is read", "[xattr]") {
  FsImage img;
  const uint64_t f = MountedFile(img);
  const std::string max(format::kXattrValueMax, 'm');
  REQUIRE(img->SetXattr(f, "user.max", max.data(), max.size(), 0).ok());
  CHECK(*img->GetXattr(f, "user.max", nullptr, 0) == max.size());
  const std::string over(format::kXattrValueMax + 1, 'o');
  CHECK(img->SetXattr(f, "user.over", over.data(), over.size(), 0).code() == E2BIG);
  CHECK(img->SetXattr(f, "user.a", "1", 1, 4).code() == EINVAL);
  CHECK(img->SetXattr(f, "user.a", "1", 1, XATTR_CREATE | XATTR_REPLACE).code() == ENODATA);
  // The name is checked first, on any inode number.
  char buf[64];
  CHECK(img->SetXattr(f, "system.foo", "1", 1, 0).code() == EOPNOTSUPP);
  CHECK(img->GetXattr(f, "system.foo", buf, sizeof buf).code() == EOPNOTSUPP);
  CHECK(img->RemoveXattr(f, "system.foo").code() == EOPNOTSUPP);
  CHECK(img->GetXattr(999999, "bogus.x", buf, sizeof buf).code() == EOPNOTSUPP);
  CHECK(img->GetXattr(f, "", buf, sizeof buf).code() == ERANGE);
  // A value read into too small a buffer: ERANGE; size 0 asks for the size.
  REQUIRE(img->SetXattr(f, "user.a", "12345", 5, 0).ok());
  CHECK(*img->GetXattr(f, "user.a", nullptr, 0) == 5);
  CHECK(img->GetXattr(f, "user.a", buf, 4).code() == ERANGE);
  CHECK(*img->GetXattr(f, "user.a", buf, 5) == 5);
  CHECK(img->GetXattr(f, "user.none", buf, sizeof buf).code() == ENODATA);
}

TEST_CASE("xattr entry points: ListXattr shows trusted names to uid 0 only, and ERANGE for a "
          "short buffer", "[xattr]") {
  FsImage img;
  const uint64_t f = MountedFile(img);
  REQUIRE(img->SetXattr(f, "user.u", "1", 1, 0).ok());
  REQUIRE(img->SetXattr(f, "trusted.t", "2", 1, 0).ok());
  REQUIRE(img->SetXattr(f, "security.s", "3", 1, 0).ok());
  const auto listed = [&](const Cred& cred) {
    std::vector<char> buf(*img->ListXattr(f, nullptr, 0, cred));
    REQUIRE(*img->ListXattr(f, buf.data(), buf.size(), cred) == buf.size());
    std::set<std::string> names;
    for (size_t at = 0; at < buf.size(); at += std::strlen(buf.data() + at) + 1) {
      names.insert(buf.data() + at);
    }
    return names;
  };
  CHECK(listed(Cred{0, 0}) == std::set<std::string>{"user.u", "trusted.t", "security.s"});
  CHECK(listed(Cred{1000, 0}) == std::set<std::string>{"user.u", "security.s"});
  // Hidden from the lister, still there for a get (the kernel checks the
  // capability, not us).
  char value[8];
  CHECK(*img->GetXattr(f, "trusted.t", value, sizeof value) == 1);
  const size_t all = *img->ListXattr(f, nullptr, 0, Cred{0, 0});
  std::vector<char> buf(all);
  CHECK(img->ListXattr(f, buf.data(), all - 1, Cred{0, 0}).code() == ERANGE);
}

TEST_CASE("xattr entry points: a read-only mount refuses set and remove (EROFS), reads work",
          "[xattr]") {
  FsImage img;
  const uint64_t f = MountedFile(img);
  REQUIRE(img->SetXattr(f, "user.a", "1", 1, 0).ok());
  img.mount_options.read_only = true;
  img.Remount();
  CHECK(img->SetXattr(f, "user.b", "1", 1, 0).code() == EROFS);
  CHECK(img->RemoveXattr(f, "user.a").code() == EROFS);
  char value[4];
  CHECK(*img->GetXattr(f, "user.a", value, sizeof value) == 1);
}

TEST_CASE("xattr entry points: a one-block namespace takes up to a block, ENOSPC past it",
          "[xattr]") {
  FsImage img(128ull << 20, 4096, 0, format::kIncompatKnown & ~format::kIncompatXattrChain);
  const uint64_t f = MountedFile(img);
  const uint32_t room = 4096 - sizeof(format::XattrHeader);
  const size_t largest = room - sizeof(format::XattrEntry) - std::strlen("user.v");
  const std::string value(largest, 'v');
  REQUIRE(img->SetXattr(f, "user.v", value.data(), value.size(), 0).ok());
  CHECK(img->SetXattr(f, "user.w", "", 0, 0).code() == ENOSPC);
  REQUIRE(img->RemoveXattr(f, "user.v").ok());
  const std::string past(largest + 1, 'v');
  CHECK(img->SetXattr(f, "user.v", past.data(), past.size(), 0).code() == ENOSPC);
  CHECK(img->GetXattr(f, "user.v", nullptr, 0).code() == ENODATA);
}

}  // namespace
}  // namespace nvfs::test
