// The workloads of the crash suite (crash_workloads.hpp).
#include "crash_workloads.hpp"

#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "crash_ops.hpp"
#include "nvfs/format.hpp"
#include "crash_random.hpp"
#include "forced_name_hash.hpp"

namespace nvfs::test {

using namespace ops;

const ImageSpec kSmallSlots{8ull << 20, 4096};

namespace {

Step S(std::string name, std::function<void(StepContext&)> run) {
  return Step{std::move(name), std::move(run)};
}

Workload W(std::string name, std::vector<Step> steps,
           std::function<void(StepContext&)> setup = {}, ImageSpec image = {}) {
  return Workload{std::move(name), image, std::move(setup), std::move(steps)};
}

// An ACL value in the kernel's format (format.hpp): {tag, perm, id}...
std::string AclValue(std::initializer_list<format::AclXattrEntry> entries) {
  std::string v(4 + 8 * entries.size(), '\0');
  const uint32_t version = format::kAclXattrVersion;
  std::memcpy(v.data(), &version, 4);
  size_t at = 4;
  for (const format::AclXattrEntry& e : entries) {
    std::memcpy(v.data() + at, &e, 8);
    at += 8;
  }
  return v;
}

// u::rwx u:2000:rw- g::r-x m::rwx o::r-- (the default ACL of the inherit
// workloads, too).
std::string NamedAcl() {
  constexpr uint32_t kNone = format::kAclUndefinedId;
  return AclValue({{format::kAclUserObj, 7, kNone}, {format::kAclUser, 6, 2000},
                   {format::kAclGroupObj, 5, kNone}, {format::kAclMask, 7, kNone},
                   {format::kAclOther, 4, kNone}});
}

const std::string kAclAccess(format::kAclAccessName);
const std::string kAclDefault(format::kAclDefaultName);

SetAttrRequest Mode(uint32_t mode) {
  SetAttrRequest r;
  r.valid = kSetMode;
  r.mode = mode;
  return r;
}

}  // namespace

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
  // RENAME_WHITEOUT: the rename and the whiteout left at the old name are
  // one operation.
  w.push_back(W("rename-whiteout", {S("rename whiteout /d1/f1 /d1/f1-moved", [](auto& c) {
                  Rename(c, "/d1/f1", "/d1/f1-moved", RENAME_WHITEOUT);
                })}));
  w.push_back(W("rename-whiteout-over-file", {S("rename whiteout /d1/f2 /d2/g1", [](auto& c) {
                  Rename(c, "/d1/f2", "/d2/g1", RENAME_WHITEOUT);
                })}));
  w.push_back(W("rename-whiteout-dir", {S("rename whiteout /d1/full /d2/full2", [](auto& c) {
                  Rename(c, "/d1/full", "/d2/full2", RENAME_WHITEOUT | RENAME_NOREPLACE);
                })}));
  // chattr: one logged store of the flags (and ctime); the directory's
  // append-only flag, set in the setup, cleared by the step.
  w.push_back(W("setflags", {S("chattr +i /d1/f1", [](auto& c) {
                  c.Expect(c.fs().SetInodeFlags(c.Ino("/d1/f1"), FS_IMMUTABLE_FL | FS_NODUMP_FL,
                                                Cred{}),
                           "setflags /d1/f1");
                }),
                S("chattr -a /d2", [](auto& c) {
                  c.Expect(c.fs().SetInodeFlags(c.Ino("/d2"), 0, Cred{}), "setflags /d2");
                })},
                [](auto& c) {
                  c.Expect(c.fs().SetInodeFlags(c.Ino("/d2"), FS_APPEND_FL, Cred{}),
                           "setflags /d2");
                }));
  // O_TMPFILE: made unnamed (on the orphan list), written, linked (off it)
  // in one transaction; a second never linked, released: reclaimed.
  w.push_back(W("tmpfile", {S("tmpfile in /d1", [](auto& c) {
                  Attr attr;
                  c.Keep("tmp", c.Expect(c.fs().Tmpfile(c.Ino("/d1"), 0600, O_RDWR, kUser, &attr),
                                         "tmpfile"));
                  c.fs().Forget(attr.ino, 1);
                }),
                S("write it", [](auto& c) {
                  FileHandle f = c.Handle("tmp");
                  const std::string data = Bytes(10000, 3);
                  c.Expect(c.fs().Write(f, 0, data.data(), data.size()), "write tmpfile");
                }),
                S("link it as /d1/named", [](auto& c) {
                  FileHandle f = c.Handle("tmp");
                  const uint64_t ino = c.fs().HandleIno(f);
                  c.fs().Forget(c.Expect(c.fs().Link(ino, c.Ino("/d1"), "named"), "link").ino, 1);
                }),
                S("release it", [](auto& c) { c.Close("tmp"); }),
                S("tmpfile never linked", [](auto& c) {
                  Attr attr;
                  FileHandle f = c.Expect(c.fs().Tmpfile(c.Ino("/d2"), 0600, O_RDWR, kUser, &attr),
                                          "tmpfile");
                  const std::string data = Bytes(20000, 5);
                  c.Expect(c.fs().Write(f, 0, data.data(), data.size()), "write tmpfile");
                  c.fs().Forget(attr.ino, 1);
                  c.fs().Release(f);
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
  // POSIX ACLs: the mode and the ACL change in one transaction; what a
  // create inherits is written in the create's.
  w.push_back(W("setfacl", {S("setfacl /d2/g1", [](auto& c) { SetXattr(c, "/d2/g1", kAclAccess, NamedAcl()); }),
                            S("setfacl /d1/f1", [](auto& c) { SetXattr(c, "/d1/f1", kAclAccess, NamedAcl()); })}));
  w.push_back(W("setfacl-to-the-mode-and-chmod",
                {S("setfacl base entries /d1/f1", [](auto& c) {
                   constexpr uint32_t kNone = format::kAclUndefinedId;
                   SetXattr(c, "/d1/f1", kAclAccess,
                            AclValue({{format::kAclUserObj, 6, kNone}, {format::kAclGroupObj, 0, kNone},
                                      {format::kAclOther, 0, kNone}}));
                 }),
                 S("chmod /d2/g1", [](auto& c) { SetAttr(c, "/d2/g1", Mode(0604)); })},
                [](auto& c) {
                  SetXattr(c, "/d1/f1", kAclAccess, NamedAcl());
                  SetXattr(c, "/d2/g1", kAclAccess, NamedAcl());
                }));
  w.push_back(W("create-with-default-acl",
                {S("create /d2/new", [](auto& c) { Create(c, "/d2/new", 0666); }),
                 S("mkdir /d2/newdir", [](auto& c) { Mkdir(c, "/d2/newdir", 0777); }),
                 S("mknod /d2/newdir/fifo", [](auto& c) { Mknod(c, "/d2/newdir/fifo", S_IFIFO | 0640, 0); })},
                [](auto& c) { SetXattr(c, "/d2", kAclDefault, NamedAcl()); }));
  // Chained xattrs (issue 14): a 64 KiB value in runs of its own, replaced
  // and removed (also on a full filesystem: no allocation), a thousand names.
  w.push_back(W("setxattr-64k", {S("setxattr 64 KiB /d1/f1", [](auto& c) {
                  SetXattr(c, "/d1/f1", "user.huge", Bytes(65536, 21));
                })}));
  w.push_back(W("setxattr-64k-replace",
                {S("replace 64 KiB by 64 KiB", [](auto& c) {
                   SetXattr(c, "/d1/f1", "user.huge", Bytes(65536, 23), XATTR_REPLACE);
                 }),
                 S("replace 64 KiB by 3 bytes", [](auto& c) {
                   SetXattr(c, "/d1/f1", "user.huge", "abc", XATTR_REPLACE);
                 })},
                [](StepContext& c) { SetXattr(c, "/d1/f1", "user.huge", Bytes(65536, 22)); }));
  w.push_back(W("removexattr-64k-when-full",
                {S("removexattr 64 KiB on a full filesystem", [](auto& c) {
                   RemoveXattr(c, "/d1/f1", "user.huge");
                 })},
                [](StepContext& c) {
                  SetXattr(c, "/d1/f1", "user.huge", Bytes(65536, 24));
                  FillUp(c);
                }));
  w.push_back(W("xattr-1000-names",
                {S("setxattr the 1001st", [](auto& c) { SetXattr(c, "/d2/g1", "user.n1000", "v"); }),
                 S("removexattr one of 1000", [](auto& c) { RemoveXattr(c, "/d2/g1", "user.n500"); }),
                 S("unlink the file of 1000 names", [](auto& c) { Unlink(c, "/d2/g1"); })},
                [](StepContext& c) {
                  for (int i = 0; i < 1000; ++i) {
                    SetXattr(c, "/d2/g1", "user.n" + std::to_string(i),
                             i % 25 == 0 ? Bytes(5000, static_cast<char>(i)) : "v" + std::to_string(i));
                  }
                },
                kSmallSlots));
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
  w.push_back(W("zero-range", {S("zero range /big", [](auto& c) {
                  Fallocate(c, "/big", FALLOC_FL_ZERO_RANGE, 8192 + 100, 8192 * 9);
                })}));
  w.push_back(W("zero-range-extend", {S("zero range past the end of /d1/f1", [](auto& c) {
                  Fallocate(c, "/d1/f1", FALLOC_FL_ZERO_RANGE, 100, 30000);
                })}));
  // Aborted operations: ENOSPC in the middle of a transaction.
  w.push_back(W("abort-symlink-enospc", {S("symlink needing a block, none free", [](auto& c) {
                  auto [dir, name] = c.Parent("/d1/s-long");
                  Result<Attr> attr = c.fs().Symlink(dir, name, std::string(300, 'x'), kUser);
                  if (attr.code() != ENOSPC) c.Fail("symlink: expected ENOSPC, got " + std::to_string(attr.code()));
                })}, FillUp));
  w.push_back(W("abort-write-enospc", {S("write into a hole, no block free", [](auto& c) {
                  FileHandle f = c.Expect(c.fs().Open(c.Ino("/sparse"), O_RDWR), "open");
                  const std::string data = Bytes(100, 13);
                  Result<size_t> n = c.fs().Write(f, 3 * 4096, data.data(), data.size());
                  c.fs().Release(f);
                  if (n.code() != ENOSPC) c.Fail("write: expected ENOSPC, got " + std::to_string(n.code()));
                })}, FillUp));
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
  w.push_back(W("write-into-preallocated-tail", {S("write 100 bytes to /d1/f2", [](auto& c) {
                  Write(c, "/d1/f2", 0, Bytes(100, 12));
                })}, [](StepContext& c) {
                  Fallocate(c, "/d1/f2", FALLOC_FL_KEEP_SIZE, 0, 16384);
                }));
  // Privileges dropped by a caller without CAP_FSETID (fs.hpp): never a new
  // byte under the old set-user-ID bit or capability, whatever the crash.
  const auto privileged = [](StepContext& c) {
    Overwrite(c, "/d2/g1", 0, Bytes(64, 20));  // not a crash point
    SetAttr(c, "/d2/g1", Mode(06755));
    SetXattr(c, "/d2/g1", "security.capability", std::string(20, '\x01'));
  };
  w.push_back(W("write-drops-privileges", {S("overwrite /d2/g1 unprivileged", [](auto& c) {
                  c.AllowPrivilegesFirst("/d2/g1", 100, 500);
                  FileHandle f = c.Expect(c.fs().Open(c.Ino("/d2/g1"), O_RDWR), "open");
                  const std::string data = Bytes(500, 21);
                  Result<size_t> n = c.fs().Write(f, 100, data.data(), data.size(), kKillSuidgid);
                  c.fs().Release(f);
                  if (c.Expect(std::move(n), "write") != data.size()) c.Fail("short write");
                })}, privileged));
  w.push_back(W("truncate-drops-privileges", {S("truncate /d2/g1 unprivileged", [](auto& c) {
                  SetAttrRequest r;
                  r.valid = kSetSize | kSetKillSuidgid;
                  r.size = 10;
                  SetAttr(c, "/d2/g1", r);
                })}, privileged));
  w.push_back(W("zero-range-drops-privileges", {S("zero range of /d2/g1 unprivileged", [](auto& c) {
                  c.AllowPrivilegesFirst("/d2/g1", 0, 4096);
                  FileHandle f = c.Expect(c.fs().Open(c.Ino("/d2/g1"), O_RDWR), "open");
                  Status st = c.fs().Fallocate(f, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 0,
                                               4096, kKillSuidgid);
                  c.fs().Release(f);
                  c.Expect(st, "zero range");
                })}, privileged));
  w.push_back(W("write-two-appends",
                {S("append 1", [](auto& c) { Write(c, "/d1/f2", 0, Bytes(100, 9)); }),
                 S("append 2", [](auto& c) { Write(c, "/d1/f2", 100, Bytes(200, 10)); })}));
  return w;
}

size_t NamesBeforeSplit() {
  static const size_t count = [] {
    const BaseImage& image = StandardImage();
    RecordingOptions plain;
    plain.record = false;
    RecordingMedia media(image.bytes.data(), image.bytes.size(), plain);
    auto fs = Filesystem::Mount(BorrowMedia(media), {});
    if (!fs.ok()) return size_t{0};
    const uint64_t sub = ResolvePath(**fs, "/d1/sub").value();
    uint64_t size = 0;  // after the first name: one leaf (an empty directory may have none)
    for (size_t n = 0; n < 10000; ++n) {
      Attr attr;
      auto file = (*fs)->Create(sub, "name-with-some-length-" + std::to_string(n), 0644, O_RDWR,
                                {}, &attr);
      if (!file.ok()) return size_t{0};
      (*fs)->Release(*file);
      (*fs)->Forget(attr.ino, 1);
      const uint64_t now = (*fs)->GetAttr(sub)->size;
      if (n == 0) size = now;
      if (now != size) return n;
    }
    return size_t{0};
  }();
  return count;
}

namespace {

std::string SplitName(size_t n) { return "/d1/sub/name-with-some-length-" + std::to_string(n); }

// /d1/chain/<n>: 200-byte names forced onto one hash (the test hook; real
// collisions cannot be found), 18 to a 4 KiB leaf, so past 18 they make a
// chain of overflow leaves. Forced for the rest of the process: no other
// workload uses these names.
std::string ChainName(size_t n) {
  static ForcedNameHash forced;
  char stem[16];
  std::snprintf(stem, sizeof stem, "chain-%03zu-", n);
  const std::string name = stem + std::string(200 - std::strlen(stem), 'c');
  forced.Force(name, 0x0C0111DE0C0111DEull);
  return "/d1/chain/" + name;
}

}  // namespace

std::vector<Workload> DirectWriteWorkloads() {
  std::vector<Workload> w;
  // /d1/f1 has 10000 bytes; /d1/f2 none; /sparse a hole in its first 20 blocks.
  const auto open_f1 = [](StepContext& c) {
    EnableDirect(c);
    OpenKeep(c, "f", "/d1/f1");
  };
  // Allocation (a crash may leave any part of it: blocks past the end, the
  // size as before), the store (past the end: nothing shows), the commit
  // (the size and the bytes at once).
  w.push_back(W("direct-extend", {S("append 3000 bytes to /d1/f1 directly", [](auto& c) {
                  c.AllowPartialAllocation("/d1/f1");
                  const DirectGrant g = DirectAllocate(c, "f", 10000, 3000, 13000 + 65536);
                  DirectStore(c, g, 10000, Bytes(3000, 30));
                  DirectCommit(c, "f", 10000, 13000, g.seq, 13000 + 65536);
                })}, open_f1));
  // A write past the end that leaves a gap: zeros between, never old bytes.
  w.push_back(W("direct-extend-gap", {S("write at 50000 of /d1/f1 directly", [](auto& c) {
                  c.AllowPartialAllocation("/d1/f1");
                  const DirectGrant g = DirectAllocate(c, "f", 50000, 100, 50100);
                  DirectStore(c, g, 50000, Bytes(100, 35));
                  DirectCommit(c, "f", 50000, 50100, g.seq, 50100);
                })}, open_f1));
  // A hole filled: its blocks come zeroed (the hole read as zeros), then
  // the bytes, which may mix after a crash as any overwrite's.
  w.push_back(W("direct-fill-hole",
                {S("allocate in the hole of /sparse", [](auto& c) {
                   c.AllowPartialAllocation("/sparse");
                   DirectAllocate(c, "s", 5 * 4096 + 10, 5000, 5 * 4096 + 5010);
                 }),
                 S("store into it", [](auto& c) {
                   c.AllowMixed("/sparse", 5 * 4096 + 10, 5000);
                   // Nothing left to allocate: the runs, the seq unmoved.
                   const DirectGrant g = DirectAllocate(c, "s", 5 * 4096 + 10, 5000, 5 * 4096 + 5010);
                   DirectStore(c, g, 5 * 4096 + 10, Bytes(5000, 31));
                   DirectCommit(c, "s", 0, 0, 0, 0);  // the times only
                 })},
                [](StepContext& c) {
                  EnableDirect(c);
                  OpenKeep(c, "s", "/sparse");
                }));
  // An append into blocks a first one kept past the end (the first needed
  // a block of its own: 12388 crosses into the fourth): the commit alone.
  w.push_back(W("direct-append-through-reserve",
                {S("append 4000 bytes into the reserve", [](auto& c) {
                  const DirectGrant g = DirectAllocate(c, "f", 12388, 4000, 16388);
                  DirectStore(c, g, 12388, Bytes(4000, 33));
                  DirectCommit(c, "f", 12388, 16388, g.seq, 16388 + 65536);
                })},
                [](StepContext& c) {
                  EnableDirect(c);
                  OpenKeep(c, "f", "/d1/f1");
                  const DirectGrant g = DirectAllocate(c, "f", 10000, 2388, 12388 + 65536);
                  DirectStore(c, g, 10000, Bytes(2388, 32));
                  DirectCommit(c, "f", 10000, 12388, g.seq, 12388 + 65536);
                }));
  // A reserve left unused at a crash (the first step's states), then given
  // back (DirectTrim, as at the writer's close).
  w.push_back(W("direct-reserve-unused",
                {S("append 500 bytes to the empty /d1/f2 with a reserve", [](auto& c) {
                   c.AllowPartialAllocation("/d1/f2");
                   const DirectGrant g = DirectAllocate(c, "e", 0, 500, 65536);
                   DirectStore(c, g, 0, Bytes(500, 34));
                   DirectCommit(c, "e", 0, 500, g.seq, 65536);
                 }),
                 S("give the reserve back", [](auto& c) {
                   c.AllowPartialAllocation("/d1/f2");
                   c.Expect(c.fs().DirectTrim(c.fs().HandleIno(c.Handle("e"))), "direct trim");
                 })},
                [](StepContext& c) {
                  EnableDirect(c);
                  OpenKeep(c, "e", "/d1/f2");
                }));
  return w;
}

std::vector<Workload> AppendWordWorkloads() {
  std::vector<Workload> w;
  // /d1/f1 has 10000 bytes. The setup's commit leaves the reserve past the
  // new end, so it opens the word (the file on the orphan list); each
  // append then stores its bytes into the reserve and moves the word, with
  // no call of the core. A crash shows the size before or after the word's
  // store: the mount folds the word, then frees the reserve
  // (AllowReserveFreed). The steps share the grant through `grant`, set
  // again by each run's setup.
  const auto open_word = [](std::shared_ptr<DirectGrant> grant) {
    return [grant](StepContext& c) {
      EnableDirect(c);
      OpenKeep(c, "f", "/d1/f1");
      EnableAppendWords(c);
      const DirectGrant g = DirectAllocate(c, "f", 10000, 2388, 12388 + 65536);
      DirectStore(c, g, 10000, Bytes(2388, 32));
      *grant = DirectCommit(c, "f", 10000, 12388, g.seq, 12388 + 65536);
      if (grant->append_word == 0) c.Fail("the commit left a reserve but opened no append word");
    };
  };
  const auto append_by_word = [](std::shared_ptr<DirectGrant> grant, uint64_t offset,
                                 uint64_t len, char seed) {
    return [=](StepContext& c) {
      c.AllowReserveFreed("/d1/f1");
      *grant = DirectAppendByWord(c, *grant, offset, Bytes(len, seed));
      const Attr attr = c.Expect(c.fs().GetAttr(c.Ino("/d1/f1")), "getattr /d1/f1");
      if (attr.size != offset + len || !attr.size_moving) {
        c.Fail("after the word's store the size is " + std::to_string(attr.size) +
               (attr.size_moving ? "" : ", not moving"));
      }
    };
  };
  {
    auto grant = std::make_shared<DirectGrant>();
    w.push_back(W("direct-append-by-word",
                  {S("append 4000 bytes by word", append_by_word(grant, 12388, 4000, 33)),
                   S("append 3000 more by word", append_by_word(grant, 16388, 3000, 36))},
                  open_word(grant)));
  }
  // The word folded and closed by the next change of the file (here a
  // truncation): the fold's transaction, the word's store of 0, then the
  // truncation's.
  {
    auto grant = std::make_shared<DirectGrant>();
    w.push_back(W("direct-append-word-closed-by-truncate",
                  {S("append 4000 bytes by word", append_by_word(grant, 12388, 4000, 33)),
                   S("truncate /d1/f1 to 5000", [grant](auto& c) {
                     c.AllowReserveFreed("/d1/f1");
                     Truncate(c, "/d1/f1", 5000);
                     uint64_t word = 0;
                     std::memcpy(&word, c.fs().media().base() + grant->append_at, sizeof word);
                     if (word != 0) c.Fail("the truncation left the append word open");
                   })},
                  open_word(grant)));
  }
  return w;
}

std::vector<Workload> DirectoryWorkloads() {
  std::vector<Workload> w;
  const size_t n = NamesBeforeSplit();
  auto fill = [n](StepContext& c) {
    for (size_t i = 0; i < n; ++i) Create(c, SplitName(i));
  };
  w.push_back(W("dir-leaf-split", {S("create the name that splits the leaf", [n](auto& c) {
                  Create(c, SplitName(n));
                  if (c.fs().GetAttr(c.Ino("/d1/sub"))->size == c.tree().at("/d1/sub").size) {
                    c.Fail("the leaf did not split");
                  }
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
  w.push_back(W("abort-create-enospc-split", {S("create that must split, no block free", [n](auto& c) {
                  auto [dir, name] = c.Parent(SplitName(n));
                  Attr attr;
                  Result<FileHandle> f = c.fs().Create(dir, name, 0644, O_RDWR, kUser, &attr);
                  if (f.code() != ENOSPC) {
                    c.Fail("create: expected ENOSPC, got " + std::to_string(f.code()));
                  }
                })}, [fill](StepContext& c) {
                  fill(c);
                  FillUp(c);
                }));
  // 36 names of one hash: two full leaves of a chain. The 37th appends a
  // leaf (fresh leaf, then the logged link); unlinking it unlinks the leaf;
  // renaming within the chain removes then inserts under one transaction.
  auto chain = [](StepContext& c) {
    Mkdir(c, "/d1/chain");
    for (size_t i = 0; i < 36; ++i) Create(c, ChainName(i));
  };
  w.push_back(W("dir-chain-append-unlink",
                {S("create the name that appends a leaf", [](auto& c) {
                   const uint64_t size = c.tree().at("/d1/chain").size;
                   Create(c, ChainName(36));
                   if (c.fs().GetAttr(c.Ino("/d1/chain"))->size == size) {
                     c.Fail("no leaf was appended");
                   }
                 }),
                 S("unlink it, emptying the leaf", [](auto& c) { Unlink(c, ChainName(36)); }),
                 S("rename inside the chain", [](auto& c) { Rename(c, ChainName(3), ChainName(40)); }),
                 S("unlink from the head leaf", [](auto& c) { Unlink(c, ChainName(0)); })},
                chain));
  w.push_back(W("rename-into-split-dir", {S("rename /d1/f1 into /d1/sub", [n](auto& c) {
                  Rename(c, "/d1/f1", SplitName(n));
                })}, fill));
  return w;
}

namespace {

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

}  // namespace

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
  // generic/511: the kernel still holds the inode (a lookup: an O_PATH
  // descriptor, a cached dentry) when the last open file closes: the
  // release frees the data in slot-sized steps (FreeUnlinkedData), the
  // inode waiting on the orphan list for a FORGET that never comes here.
  w.push_back(W("unlink-long-looked-up-open",
                {S("unlink /frag", [](auto& c) { Unlink(c, "/frag"); }),
                 S("release it: the data goes, the inode stays", [](auto& c) { c.Close("frag"); })},
                [](StepContext& c) {
                  MakeFragmented(c);
                  OpenKeep(c, "frag", "/frag");
                  auto [dir, name] = c.Parent("/frag");
                  (void)c.Expect(c.fs().Lookup(dir, name), "lookup /frag");
                },
                kSmallSlots));
  w.push_back(W("truncate-long-unlinked-open",
                {S("truncate the open, unlinked /frag to 4096", [](auto& c) {
                   SetAttrRequest r;
                   r.valid = kSetSize;
                   r.size = 4096;
                   (void)c.Expect(c.fs().SetAttr(c.fs().HandleIno(c.Handle("frag")), r), "truncate");
                 }),
                 S("release it", [](auto& c) { c.Close("frag"); })},
                [](StepContext& c) {
                  MakeFragmented(c);
                  OpenKeep(c, "frag", "/frag");
                  Unlink(c, "/frag");
                },
                kSmallSlots));
  w.push_back(W("orphan-remove-not-head", {S("release the older orphan", [](auto& c) {
                  c.Close("keep-open");
                })}, [](StepContext& c) {
                  OpenKeep(c, "g1", "/d2/g1");
                  Unlink(c, "/d2/g1");
                }));
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
  // Not atomic by design (doc/integrity.md): with 4 KiB journal slots each
  // hole takes a transaction of its own.
  w.push_back(W("fallocate-long", {S("fallocate over 80 holes of /holes", [](auto& c) {
                  c.AllowPartialAllocation("/holes");
                  Fallocate(c, "/holes", 0, 0, 160 * 4096);
                })},
                [](StepContext& c) {
                  Create(c, "/holes");
                  for (uint64_t i = 0; i < 160; i += 2) Write(c, "/holes", i * 4096, Bytes(4096, 14));
                },
                kSmallSlots));
  w.push_back(W("unmount-and-mount", {S("release, unmount cleanly, mount", [](auto& c) {
                  c.CleanRemount();
                })}));
  w.push_back(W("small-slots-rename-and-xattr",
                {S("rename over file", [](auto& c) { Rename(c, "/d1/f2", "/d2/g1"); }),
                 S("setxattr", [](auto& c) { SetXattr(c, "/d1/f1", "user.color", "green"); })},
                {}, kSmallSlots));
  return w;
}

std::vector<Workload> LargeBlockWorkloads() {
  const ImageSpec big_blocks{16ull << 20, 0, 65536};
  std::vector<Workload> w;
  w.push_back(W("bs64k-create", {S("create /d1/new", [](auto& c) { Create(c, "/d1/new"); })}, {},
                big_blocks));
  w.push_back(W("bs64k-unlink-open",
                {S("unlink /d2/g1", [](auto& c) { Unlink(c, "/d2/g1"); }),
                 S("release it", [](auto& c) { c.Close("g1"); })},
                [](auto& c) { OpenKeep(c, "g1", "/d2/g1"); }, big_blocks));
  w.push_back(W("bs64k-rename-over-file",
                {S("rename /d1/f2 /d2/g1", [](auto& c) { Rename(c, "/d1/f2", "/d2/g1"); })}, {},
                big_blocks));
  w.push_back(W("bs64k-write-extend", {S("write 300 KiB to /d1/f2", [](auto& c) {
                  Write(c, "/d1/f2", 1000, Bytes(300 << 10, 15));
                })}, {}, big_blocks));
  w.push_back(W("bs64k-truncate-down", {S("truncate /big 70000", [](auto& c) {
                  Truncate(c, "/big", 70000);
                })}, {}, big_blocks));
  w.push_back(W("bs64k-punch", {S("punch /big", [](auto& c) {
                  Fallocate(c, "/big", FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, 150000);
                })}, {}, big_blocks));
  w.push_back(W("bs64k-setxattr", {S("setxattr /d1/f1", [](auto& c) {
                  SetXattr(c, "/d1/f1", "user.color", std::string(5000, 'c'));
                })}, {}, big_blocks));
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

}  // namespace nvfs::test
