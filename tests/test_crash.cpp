// The crash suite: every metadata operation, the data writes, directory
// growth, long truncations and orphans, and seeded two-operation sequences,
// each crashed at every fence and operation end (crash_harness.hpp says how
// and how to replay one case). Prints crash-state counts per workload.
#include <catch2/catch.hpp>

#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include "crash_ops.hpp"
#include "crash_random.hpp"

namespace nvfs::test {
namespace {

using namespace ops;

Step S(std::string name, std::function<void(StepContext&)> run) {
  return Step{std::move(name), std::move(run)};
}

Workload W(std::string name, std::vector<Step> steps,
           std::function<void(StepContext&)> setup = {}, ImageSpec image = {}) {
  return Workload{std::move(name), image, std::move(setup), std::move(steps)};
}

void Report(const std::vector<WorkloadResult>& results) {
  for (const WorkloadResult& r : results) {
    INFO(r.name);
    for (size_t i = 0; i < r.failures.size() && i < 8; ++i) FAIL_CHECK(r.failures[i]);
    if (r.failures.size() > 8) FAIL_CHECK(std::to_string(r.failures.size() - 8) + " more failures");
  }
}

SetAttrRequest Mode(uint32_t mode) {
  SetAttrRequest r;
  r.valid = kSetMode;
  r.mode = mode;
  return r;
}

std::vector<Workload> MetadataWorkloads() {
  std::vector<Workload> w;
  w.push_back(W("create", {S("create /d1/new", [](auto& c) { Create(c, "/d1/new"); })}));
  w.push_back(W("create-in-root", {S("create /new", [](auto& c) { Create(c, "/new", 0600); })}));
  w.push_back(W("mkdir", {S("mkdir /d1/newdir", [](auto& c) { Mkdir(c, "/d1/newdir"); })}));
  w.push_back(W("mknod", {S("mknod fifo", [](auto& c) { Mknod(c, "/d2/fifo", S_IFIFO | 0644, 0); }),
                          S("mknod chr", [](auto& c) {
                            Mknod(c, "/d2/chr", S_IFCHR | 0600, makedev(4, 5));
                          })}));
  w.push_back(W("symlink-short", {S("symlink", [](auto& c) { Symlink(c, "/d1/s", "f1"); })}));
  w.push_back(W("symlink-long", {S("symlink", [](auto& c) {
                  Symlink(c, "/d1/s-long", std::string(300, 'x') + "/end");
                })}));
  w.push_back(W("link", {S("link /d1/f1 /d2/link2", [](auto& c) { Link(c, "/d1/f1", "/d2/link2"); })}));
  w.push_back(W("unlink-closed", {S("unlink /d2/g1", [](auto& c) { Unlink(c, "/d2/g1"); })}));
  w.push_back(W("unlink-hard-link", {S("unlink /d2/hl", [](auto& c) { Unlink(c, "/d2/hl"); })}));
  w.push_back(W("unlink-symlink-long", {S("unlink /sl-long", [](auto& c) { Unlink(c, "/sl-long"); })}));
  w.push_back(W("unlink-open",
                {S("unlink /d2/g1", [](auto& c) { Unlink(c, "/d2/g1"); }),
                 S("release it", [](auto& c) { c.Close("g1"); })},
                [](auto& c) { OpenKeep(c, "g1", "/d2/g1"); }));
  w.push_back(W("rmdir", {S("rmdir /d2/empty", [](auto& c) { Rmdir(c, "/d2/empty"); })}));
  w.push_back(W("rename-new-name",
                {S("rename /d1/f1 /d1/f1-renamed", [](auto& c) { Rename(c, "/d1/f1", "/d1/f1-renamed"); })}));
  w.push_back(W("rename-over-file",
                {S("rename /d1/f2 /d2/g1", [](auto& c) { Rename(c, "/d1/f2", "/d2/g1"); })}));
  w.push_back(W("rename-over-hard-link",
                {S("rename /d1/f2 /d2/hl", [](auto& c) { Rename(c, "/d1/f2", "/d2/hl"); })}));
  w.push_back(W("rename-over-open-file",
                {S("rename /d1/f2 /d2/g1", [](auto& c) { Rename(c, "/d1/f2", "/d2/g1"); }),
                 S("release the replaced file", [](auto& c) { c.Close("g1"); })},
                [](auto& c) { OpenKeep(c, "g1", "/d2/g1"); }));
  w.push_back(W("rename-over-empty-dir",
                {S("rename /d1/sub /d2/empty", [](auto& c) { Rename(c, "/d1/sub", "/d2/empty"); })}));
  w.push_back(W("rename-across-dirs",
                {S("rename /d1/f1 /d2/moved", [](auto& c) { Rename(c, "/d1/f1", "/d2/moved"); })}));
  w.push_back(W("rename-dir-across-dirs",
                {S("rename /d1/full /d2/full2", [](auto& c) { Rename(c, "/d1/full", "/d2/full2"); })}));
  w.push_back(W("rename-dir-over-dir-across",
                {S("rename /d1/full /d2/empty", [](auto& c) { Rename(c, "/d1/full", "/d2/empty"); })}));
  w.push_back(W("rename-exchange-files", {S("exchange /d1/f1 /d2/g1", [](auto& c) {
                  Rename(c, "/d1/f1", "/d2/g1", RENAME_EXCHANGE);
                })}));
  w.push_back(W("rename-exchange-dir-file", {S("exchange /d1/full /d2/g1", [](auto& c) {
                  Rename(c, "/d1/full", "/d2/g1", RENAME_EXCHANGE);
                })}));
  w.push_back(W("rename-exchange-dirs", {S("exchange /d1/full /d2/empty", [](auto& c) {
                  Rename(c, "/d1/full", "/d2/empty", RENAME_EXCHANGE);
                })}));
  w.push_back(W("rename-noreplace", {S("rename noreplace /d1/f2 /d2/f2", [](auto& c) {
                  Rename(c, "/d1/f2", "/d2/f2", RENAME_NOREPLACE);
                })}));
  w.push_back(W("rename-symlink", {S("rename /sl /d1/sl", [](auto& c) { Rename(c, "/sl", "/d1/sl"); })}));
  w.push_back(W("setattr-mode", {S("chmod /d1/f1", [](auto& c) { SetAttr(c, "/d1/f1", Mode(04711)); })}));
  w.push_back(W("setattr-owner", {S("chown /d2/g1", [](auto& c) {
                  SetAttrRequest r;
                  r.valid = kSetUid | kSetGid;
                  r.uid = 42;
                  r.gid = 43;
                  SetAttr(c, "/d2/g1", r);
                })}));
  w.push_back(W("setattr-times", {S("utimes /d1", [](auto& c) {
                  SetAttrRequest r;
                  r.valid = kSetAtime | kSetMtime;
                  r.atime = {1000, 5};
                  r.mtime = {2000, 6};
                  SetAttr(c, "/d1", r);
                })}));
  w.push_back(W("setattr-size-up", {S("truncate /d1/f2 100000", [](auto& c) { Truncate(c, "/d1/f2", 100000); })}));
  w.push_back(W("setattr-size-down", {S("truncate /big 5000", [](auto& c) { Truncate(c, "/big", 5000); })}));
  w.push_back(W("setattr-everything", {S("chmod chown truncate /d2/g1", [](auto& c) {
                  SetAttrRequest r;
                  r.valid = kSetMode | kSetUid | kSetGid | kSetSize;
                  r.mode = 0600;
                  r.uid = 7;
                  r.gid = 8;
                  r.size = 4097;
                  SetAttr(c, "/d2/g1", r);
                })}));
  w.push_back(W("truncate-down-to-zero", {S("truncate /big 0", [](auto& c) { Truncate(c, "/big", 0); })}));
  w.push_back(W("truncate-up-in-block", {S("truncate /d1/f1 12000", [](auto& c) { Truncate(c, "/d1/f1", 12000); })}));
  w.push_back(W("truncate-down-then-up",
                {S("truncate /d1/f1 5000", [](auto& c) { Truncate(c, "/d1/f1", 5000); }),
                 S("truncate /d1/f1 9000", [](auto& c) { Truncate(c, "/d1/f1", 9000); })}));
  w.push_back(W("open-truncate", {S("open O_TRUNC /d2/g1", [](auto& c) {
                  FileHandle f = c.Expect(c.fs().Open(c.Ino("/d2/g1"), O_RDWR | O_TRUNC), "open");
                  c.fs().Release(f);
                })}));
  w.push_back(W("setxattr-create", {S("setxattr /d2/g1", [](auto& c) { SetXattr(c, "/d2/g1", "user.new", "value"); })}));
  w.push_back(W("setxattr-replace", {S("setxattr replace /d1/f1", [](auto& c) {
                  SetXattr(c, "/d1/f1", "user.color", "red", XATTR_REPLACE);
                })}));
  w.push_back(W("setxattr-on-dir-and-symlink",
                {S("setxattr /d2", [](auto& c) { SetXattr(c, "/d2", "trusted.t", std::string(1000, 't')); }),
                 S("setxattr /sl", [](auto& c) { SetXattr(c, "/sl", "user.s", "1"); })}));
  w.push_back(W("removexattr", {S("removexattr /d1/f1", [](auto& c) { RemoveXattr(c, "/d1/f1", "user.big"); })}));
  w.push_back(W("removexattr-last", {S("removexattr /d1", [](auto& c) { RemoveXattr(c, "/d1", "user.dir"); })}));
  w.push_back(W("fallocate-keep-size", {S("fallocate keep size /d1/f1", [](auto& c) {
                  Fallocate(c, "/d1/f1", FALLOC_FL_KEEP_SIZE, 20000, 50000);
                })}));
  w.push_back(W("fallocate-extend", {S("fallocate /d1/f2", [](auto& c) { Fallocate(c, "/d1/f2", 0, 0, 30000); })}));
  w.push_back(W("punch-hole", {S("punch /big", [](auto& c) {
                  Fallocate(c, "/big", FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 8192, 8192 * 10 + 100);
                })}));
  w.push_back(W("punch-partial-block", {S("punch /d1/f1", [](auto& c) {
                  Fallocate(c, "/d1/f1", FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 300);
                })}));
  return w;
}

std::vector<Workload> DataWorkloads() {
  std::vector<Workload> w;
  w.push_back(W("write-append", {S("append to /d1/f1", [](auto& c) {
                  Write(c, "/d1/f1", 0, Bytes(3000, 1), O_RDWR | O_APPEND);
                })}));
  w.push_back(W("write-overwrite-in-block", {S("overwrite /d2/g1", [](auto& c) {
                  Overwrite(c, "/d2/g1", 100, Bytes(500, 2));
                })}));
  w.push_back(W("write-unaligned-across-blocks", {S("overwrite /d2/g1", [](auto& c) {
                  Overwrite(c, "/d2/g1", 4000, Bytes(300, 3));
                })}));
  w.push_back(W("write-extend-multiblock", {S("write 5 blocks to /d1/f2", [](auto& c) {
                  Write(c, "/d1/f2", 0, Bytes(5 * 4096 + 123, 4));
                })}));
  w.push_back(W("write-fill-hole", {S("write into the hole of /sparse", [](auto& c) {
                  Write(c, "/sparse", 5 * 4096 + 10, Bytes(5000, 5));
                })}));
  w.push_back(W("write-past-eof-gap", {S("write past the end of /d1/f1", [](auto& c) {
                  Write(c, "/d1/f1", 50000, Bytes(100, 6));
                })}));
  w.push_back(W("write-new-indirect-block", {S("write at block 600 of /d1/f2", [](auto& c) {
                  Write(c, "/d1/f2", 600 * 4096, Bytes(4096, 7));
                })}));
  w.push_back(W("write-extend-big", {S("append to /big", [](auto& c) {
                  Write(c, "/big", 60 * 4096, Bytes(3 * 4096, 8));
                })}));
  w.push_back(W("write-two-appends",
                {S("append 1", [](auto& c) { Write(c, "/d1/f2", 0, Bytes(100, 9)); }),
                 S("append 2", [](auto& c) { Write(c, "/d1/f2", 100, Bytes(200, 10)); })}));
  return w;
}

// How many names /d1/sub takes before its first leaf splits (the hash seed
// is fixed, so this is the same on every run).
size_t NamesBeforeSplit() {
  static const size_t count = [] {
    const BaseImage& image = StandardImage();
    RecordingOptions plain;
    plain.record = false;
    RecordingMedia media(image.bytes.data(), image.bytes.size(), plain);
    auto fs = Filesystem::Mount(BorrowMedia(media), {});
    if (!fs.ok()) return size_t{0};
    const uint64_t sub = ResolvePath(**fs, "/d1/sub").value();
    const uint64_t size = (*fs)->GetAttr(sub)->size;
    for (size_t n = 0; n < 10000; ++n) {
      Attr attr;
      auto file = (*fs)->Create(sub, "name-with-some-length-" + std::to_string(n), 0644, O_RDWR,
                                {}, &attr);
      if (!file.ok()) return size_t{0};
      (*fs)->Release(*file);
      (*fs)->Forget(attr.ino, 1);
      if ((*fs)->GetAttr(sub)->size != size) return n;
    }
    return size_t{0};
  }();
  return count;
}

std::string SplitName(size_t n) { return "/d1/sub/name-with-some-length-" + std::to_string(n); }

std::vector<Workload> DirectoryWorkloads() {
  std::vector<Workload> w;
  const size_t n = NamesBeforeSplit();
  auto fill = [n](StepContext& c) {
    for (size_t i = 0; i < n; ++i) Create(c, SplitName(i));
  };
  w.push_back(W("dir-leaf-split", {S("create the name that splits the leaf", [n](auto& c) {
                  Create(c, SplitName(n));
                })}, fill));
  w.push_back(W("dir-split-then-unlink",
                {S("split", [n](auto& c) { Create(c, SplitName(n)); }),
                 S("unlink one", [](auto& c) { Unlink(c, SplitName(0)); })},
                fill));
  w.push_back(W("dir-mkdir-in-split-dir", {S("mkdir that splits", [n](auto& c) {
                  Mkdir(c, SplitName(n));
                })}, fill));
  w.push_back(W("rmdir-grown-dir", {S("rmdir /d1/sub", [](auto& c) { Rmdir(c, "/d1/sub"); })},
                [n](StepContext& c) {
                  for (size_t i = 0; i <= n + 10; ++i) Create(c, SplitName(i));
                  for (size_t i = 0; i <= n + 10; ++i) Unlink(c, SplitName(i));
                }));
  w.push_back(W("rename-into-split-dir", {S("rename /d1/f1 into /d1/sub", [n](auto& c) {
                  Rename(c, "/d1/f1", SplitName(n));
                })}, fill));
  return w;
}

// A file whose blocks alternate with another's, so freeing it takes one
// journal record per block: with 4 KiB journal slots, several transactions.
void MakeFragmented(StepContext& c) {
  Create(c, "/frag");
  Create(c, "/frag-other");
  const std::string block = Bytes(4096, 11);
  for (uint64_t i = 0; i < 160; ++i) {
    Write(c, "/frag", i * 4096, block);
    Write(c, "/frag-other", i * 4096, block);
  }
}

const ImageSpec kSmallSlots{8ull << 20, 4096};

std::vector<Workload> LongWorkloads() {
  std::vector<Workload> w;
  w.push_back(W("truncate-long", {S("truncate /frag 4096", [](auto& c) { Truncate(c, "/frag", 4096); })},
                MakeFragmented, kSmallSlots));
  w.push_back(W("unlink-long", {S("unlink /frag", [](auto& c) { Unlink(c, "/frag"); })},
                MakeFragmented, kSmallSlots));
  w.push_back(W("unlink-long-open",
                {S("unlink /frag", [](auto& c) { Unlink(c, "/frag"); }),
                 S("release it", [](auto& c) { c.Close("frag"); })},
                [](StepContext& c) {
                  MakeFragmented(c);
                  OpenKeep(c, "frag", "/frag");
                },
                kSmallSlots));
  w.push_back(W("mount-with-orphans", {S("crash and mount", [](auto& c) { c.CrashAndRemount(); })},
                [](StepContext& c) {
                  OpenKeep(c, "g1", "/d2/g1");
                  Unlink(c, "/d2/g1");
                }));
  w.push_back(W("mount-with-long-orphan", {S("crash and mount", [](auto& c) { c.CrashAndRemount(); })},
                [](StepContext& c) {
                  MakeFragmented(c);
                  OpenKeep(c, "frag", "/frag");
                  Unlink(c, "/frag");
                },
                kSmallSlots));
  w.push_back(W("small-slots-rename-and-xattr",
                {S("rename over file", [](auto& c) { Rename(c, "/d1/f2", "/d2/g1"); }),
                 S("setxattr", [](auto& c) { SetXattr(c, "/d1/f1", "user.color", "green"); })},
                {}, kSmallSlots));
  return w;
}

std::vector<Workload> SequenceWorkloads() {
  std::vector<Workload> w;
  for (int i = 0; i < 48; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "seq-%02d", i);
    w.push_back(W(name, {S("random op 1", [](auto& c) { RandomOp(c); }),
                         S("random op 2", [](auto& c) { RandomOp(c); })}));
  }
  return w;
}

TEST_CASE("crash: every metadata operation", "[crash][meta]") {
  Report(RunWorkloads("metadata", MetadataWorkloads()));
}

TEST_CASE("crash: data writes", "[crash][data]") {
  Report(RunWorkloads("data", DataWorkloads()));
}

TEST_CASE("crash: directory growth and shrinking", "[crash][dir]") {
  REQUIRE(NamesBeforeSplit() > 0);
  Report(RunWorkloads("directories", DirectoryWorkloads()));
}

TEST_CASE("crash: long truncations, orphans and small journal slots", "[crash][long]") {
  Report(RunWorkloads("long", LongWorkloads()));
}

TEST_CASE("crash: seeded two-operation sequences", "[crash][seq]") {
  Report(RunWorkloads("sequences", SequenceWorkloads()));
}

}  // namespace
}  // namespace nvfs::test
