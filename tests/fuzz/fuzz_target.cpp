#include "fuzz_target.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "nvfs/fs.hpp"
#include "nvfs/fsck.hpp"

namespace nvfs::fuzz {

namespace {

constexpr size_t kMaxRuns = 64;

struct Walk {
  Filesystem& fs;
  const CaseOptions& options;
  CaseResult& result;
  const char* label;          // "read-only mount", ...
  bool strict = false;        // an I/O error is a violation (a repaired image)
  uint64_t io_errors = 0;
  std::vector<std::byte> a, b, c;
  std::vector<char> xattr_value;
  uint64_t some_file = 0;  // a regular file and a directory the walk met
  uint64_t some_dir = 0;

  void Violation(const std::string& what) {
    result.violations.push_back(std::string(label) + ": " + what);
  }
  void Error(int code, const char* op, uint64_t ino) {
    if (code != EIO && code != EUCLEAN) return;
    ++io_errors;
    if (strict) {
      Violation(std::string(op) + " of inode " + std::to_string(ino) + " failed with " +
                std::to_string(code) + " on an image fsck found clean");
    }
  }

  // Reads [offset, offset + len) of an open file through read, read_iter and
  // map; the three must agree.
  void ReadWindow(FileHandle file, uint64_t ino, uint64_t offset, size_t len) {
    // Sized once (a fill per window would cost more than the reads).
    if (a.size() < len) {
      a.resize(len);
      b.resize(len);
      c.resize(len);
    }
    Result<size_t> r1 = fs.Read(file, offset, a.data(), len);
    // Three uneven segments.
    const size_t first = len / 3, second = len / 5;
    iovec iov[3] = {{b.data(), first}, {b.data() + first, second},
                    {b.data() + first + second, len - first - second}};
    Result<size_t> r2 = fs.ReadIter(file, offset, iov, 3);
    ReadRun runs[kMaxRuns];
    size_t run_count = 0;
    const MapGuard held;
    Result<size_t> r3 = fs.Map(file, offset, len, runs, kMaxRuns, &run_count, held);
    size_t mapped = 0;
    if (r3.ok()) {
      for (size_t i = 0; i < run_count; ++i) {
        if (mapped + runs[i].len > len) {
          Violation("map of inode " + std::to_string(ino) + " returned more than asked");
          return;
        }
        std::memcpy(c.data() + mapped, runs[i].data, runs[i].len);
        mapped += runs[i].len;
      }
      if (mapped != *r3) Violation("map of inode " + std::to_string(ino) + ": runs disagree with its count");
    }
    if (!r1.ok()) Error(r1.code(), "read", ino);
    if (r1.ok() != r2.ok() || (!r1.ok() && r1.code() != r2.code())) {
      Violation("read and read_iter of inode " + std::to_string(ino) + " disagree on failing");
      return;
    }
    if (!r1.ok()) return;
    if (*r1 > len || *r2 != *r1 || std::memcmp(a.data(), b.data(), *r1) != 0) {
      Violation("read and read_iter of inode " + std::to_string(ino) + " at " +
                std::to_string(offset) + " return different bytes");
    }
    if (r3.ok() && (mapped > *r1 || std::memcmp(a.data(), c.data(), mapped) != 0)) {
      Violation("read and map of inode " + std::to_string(ino) + " at " + std::to_string(offset) +
                " return different bytes");
    }
  }

  void ReadFile(uint64_t ino, uint64_t size) {
    Result<FileHandle> file = fs.Open(ino, O_RDONLY);
    if (!file.ok()) {
      Error(file.code(), "open", ino);
      return;
    }
    const uint64_t window = options.max_read;
    ReadWindow(*file, ino, 0, static_cast<size_t>(std::min(size + 100, window)));
    if (size > window) {
      ReadWindow(*file, ino, size / 2 - size / 2 % 4096 + 1000, static_cast<size_t>(window));
      ReadWindow(*file, ino, size - window / 2, static_cast<size_t>(window));
    }
    for (int whence : {SEEK_DATA, SEEK_HOLE}) {
      for (uint64_t at : {uint64_t{0}, size / 3, size > 0 ? size - 1 : 0}) {
        (void)fs.Lseek(*file, at, whence);
      }
    }
    fs.Release(*file);
  }

  void Xattrs(uint64_t ino) {
    Result<size_t> need = fs.ListXattr(ino, nullptr, 0, Cred{});
    if (!need.ok()) {
      Error(need.code(), "listxattr", ino);
      return;
    }
    std::vector<char> list(*need + 1);
    Result<size_t> got = fs.ListXattr(ino, list.data(), list.size(), Cred{});
    if (!got.ok()) {
      Error(got.code(), "listxattr", ino);
      return;
    }
    if (xattr_value.empty()) xattr_value.resize(65536);
    for (size_t pos = 0; pos < *got;) {
      const std::string name(list.data() + pos);
      pos += name.size() + 1;
      Result<size_t> size = fs.GetXattr(ino, name, nullptr, 0);
      if (size.ok()) (void)fs.GetXattr(ino, name, xattr_value.data(), xattr_value.size());
    }
  }

  // Changes on a damaged image mounted read-write: every error is allowed
  // (the image lies), but nothing may crash, hang, or touch memory outside
  // the mapping (the media aborts on a write outside it; ASan watches the
  // rest). New names in the root and in a directory the walk met, data and
  // holes, xattrs, rename, link, truncate, unlink; an existing file
  // overwritten and truncated.
  template <class R>
  void Count(const R& r) {
    result.changes += r.ok();
  }

  void Change() {
    const Cred cred{0, 0};
    const std::string data(10000, 'n');
    auto write_into = [&](uint64_t ino) {
      Result<FileHandle> file = fs.Open(ino, O_RDWR);
      if (!file.ok()) return;
      Count(fs.Write(*file, 0, data.data(), data.size()));
      Count(fs.Write(*file, 1 << 20, data.data(), 4096));
      Count(fs.Fallocate(*file, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 5000));
      Count(fs.Fallocate(*file, FALLOC_FL_ZERO_RANGE, 6000, 3000));
      fs.Release(*file);
    };
    for (uint64_t dir : {uint64_t{1}, some_dir}) {
      if (dir == 0) continue;
      Attr attr;
      Result<FileHandle> created = fs.Create(dir, "fuzz.new", 0644, O_RDWR, cred, &attr);
      if (created.ok()) {
        fs.Release(*created);
        write_into(attr.ino);
        Count(fs.SetXattr(attr.ino, "user.fuzz", "value", 5, 0));
        SetAttrRequest shrink;
        shrink.valid = kSetSize;
        shrink.size = 3000;
        Count(fs.SetAttr(attr.ino, shrink));
        if (fs.Link(attr.ino, dir, "fuzz.link").ok()) fs.Forget(attr.ino, 1);
        Count(fs.Rename(dir, "fuzz.new", 1, "fuzz.moved", 0));
        fs.Forget(attr.ino, 1);
      }
      if (Result<Attr> made = fs.Mkdir(dir, "fuzz.dir", 0755, cred); made.ok()) {
        if (Result<Attr> link = fs.Symlink(made->ino, "fuzz.sym", "../somewhere", cred); link.ok()) {
          fs.Forget(link->ino, 1);
        }
        Count(fs.Unlink(made->ino, "fuzz.sym"));
        fs.Forget(made->ino, 1);
      }
      Count(fs.Rmdir(dir, "fuzz.dir"));
      Count(fs.Unlink(dir, "fuzz.link"));
      Count(fs.Unlink(1, "fuzz.moved"));
    }
    if (some_file != 0) {
      write_into(some_file);
      SetAttrRequest half;
      half.valid = kSetSize;
      half.size = 4097;
      Count(fs.SetAttr(some_file, half));
    }
  }

  // Every directory reachable from the root, each once.
  void Run() {
    std::set<uint64_t> seen{1};
    std::vector<uint64_t> dirs{1};
    uint64_t budget = options.max_entries;
    if (Result<Attr> root = fs.GetAttr(1); !root.ok()) Error(root.code(), "getattr", 1);
    while (!dirs.empty() && budget > 0) {
      const uint64_t dir = dirs.back();
      dirs.pop_back();
      struct Entry {
        std::string name;
        uint64_t ino;
      };
      std::vector<Entry> entries;
      Status listed = fs.ReadDir(dir, 0, [&](const Filesystem::DirEntry& e, uint64_t) {
        entries.push_back({std::string(e.name), e.ino});
        return entries.size() < budget + 2;
      });
      if (!listed.ok()) Error(listed.code(), "readdir", dir);
      // Resuming in the middle, as a second getdents would.
      if (entries.size() > 4) {
        (void)fs.ReadDir(dir, 3, [](const Filesystem::DirEntry&, uint64_t) { return true; });
      }
      for (const Entry& e : entries) {
        if (budget == 0) break;
        --budget;
        ++result.entries;
        Result<Attr> attr = fs.Lookup(dir, e.name);
        if (!attr.ok()) {
          if (e.name != "." && e.name != "..") Error(attr.code(), "lookup", dir);
          continue;
        }
        const uint64_t ino = attr->ino;
        if (Result<Attr> again = fs.GetAttr(ino); !again.ok()) Error(again.code(), "getattr", ino);
        if (e.name != "." && e.name != "..") {
          if (S_ISDIR(attr->mode)) {
            if (seen.insert(ino).second) dirs.push_back(ino);
            if (some_dir == 0) some_dir = ino;
          } else if (S_ISREG(attr->mode)) {
            ReadFile(ino, attr->size);
            if (some_file == 0) some_file = ino;
          } else if (S_ISLNK(attr->mode)) {
            Result<std::string> target = fs.Readlink(ino);
            if (!target.ok()) Error(target.code(), "readlink", ino);
          }
          Xattrs(ino);
        }
        fs.Forget(ino, 1);
      }
    }
  }
};

bool g_verbose = false;

FsckReport Fsck(Arena& arena, RepairMode mode) {
  ArenaMedia media(arena, mode == RepairMode::kNone);
  if (!g_verbose) return CheckNamespace(media, mode, {});
  std::printf("  fsck %s:\n", mode == RepairMode::kNone ? "-n" : mode == RepairMode::kYes ? "-y" : "-p");
  return CheckNamespace(media, mode, [](const std::string& line) {
    std::printf("    %s\n", line.c_str());
  });
}

// The census's check on a mounted image; findings go to result.containment.
// `repaired`: fsck -y has run on the image (every untouched file must then
// be readable, whatever the mutation changed).
void CheckContainment(Filesystem& fs, const CaseOptions& options, CaseResult& result,
                      const char* label, const std::vector<uint64_t>& excluded, bool repaired) {
  if (options.census == nullptr) return;
  std::vector<std::string> found, hidden;
  options.census->Check(fs, result.touch, excluded, repaired || result.touch.global == 0, &found,
                        &hidden);
  for (const std::string& f : found) result.containment.push_back(std::string(label) + ": " + f);
  for (const std::string& f : hidden) result.hidden.push_back(std::string(label) + ": " + f);
}

// Mounts, walks and unmounts; returns false if the mount failed (*error).
// The read-write walk of a damaged image (not `strict`) also makes its changes.
bool MountAndWalk(Arena& arena, bool read_only, bool strict, const char* label,
                  const CaseOptions& options, CaseResult& result, std::string* error,
                  uint64_t* io_errors) {
  MountOptions mount_options;
  mount_options.read_only = read_only;
  auto mounted =
      Filesystem::Mount(std::make_unique<ArenaMedia>(arena, read_only), mount_options);
  if (!mounted.ok()) {
    *error = mounted.error().Describe();
    return false;
  }
  Walk walk{**mounted, options, result, label, strict};
  walk.Run();
  std::vector<uint64_t> excluded;
  if (!read_only && !strict) {
    walk.Change();
    // The one existing file the changes overwrite and truncate on purpose.
    result.changed_on_purpose = walk.some_file;
    if (walk.some_file != 0) excluded.push_back(walk.some_file);
  }
  CheckContainment(**mounted, options, result, label, excluded, strict);
  *io_errors += walk.io_errors;
  Status unmounted = (*mounted)->Unmount();
  if (!unmounted.ok() && strict) {
    result.violations.push_back(std::string(label) + ": unmount failed: " +
                                unmounted.error().Describe());
  }
  return true;
}

}  // namespace

CaseResult RunCase(Arena& arena, const CaseOptions& options) {
  CaseResult result;
  std::string error;
  g_verbose = options.verbose;
  if (options.census != nullptr) result.touch = options.census->TouchedBy(arena);

  // 1 and 2, with the image mapped read-only: a write of any kind faults.
  arena.SetWritable(false);
  result.fsck_exit = Fsck(arena, RepairMode::kNone).exit_code;
  if (arena.refused_writes() != 0) result.violations.push_back("fsck -n tried to write");
  const uint64_t refused = arena.refused_writes();
  result.mounted_ro = MountAndWalk(arena, true, false, "read-only mount", options, result,
                                   &error, &result.io_errors);
  arena.SetWritable(true);
  if (arena.refused_writes() != refused) {
    result.violations.push_back("a read-only mount tried to write (" +
                                std::to_string(arena.refused_writes() - refused) + " times)");
  }

  // 3. Read-write mount: nothing written unless it succeeds.
  result.mounted_rw = MountAndWalk(arena, false, false, "read-write mount", options, result,
                                   &result.mount_error, &result.io_errors);
  if (!result.mounted_rw && (arena.stores() != 0 || !arena.Unchanged())) {
    result.violations.push_back("a failed mount wrote " + std::to_string(arena.stores()) +
                                " ranges first (" + result.mount_error + ")");
  }

  // 3b. Containment after the changes: fsck -y of the changed image, then
  // fsck -n clean, and the untouched files still hold their bytes.
  if (options.census != nullptr && result.mounted_rw && options.repair) {
    arena.SetWritable(true);
    const FsckReport repaired = Fsck(arena, RepairMode::kYes);
    if (repaired.exit_code == kFsckClean || repaired.exit_code == kFsckCorrected) {
      const FsckReport after = Fsck(arena, RepairMode::kNone);
      if (after.exit_code != kFsckClean) {
        result.containment.push_back("fsck -y of the changed image: fsck -n then exits " +
                                     std::to_string(after.exit_code));
      }
    }
    MountOptions read_only;
    read_only.read_only = true;
    auto mounted = Filesystem::Mount(std::make_unique<ArenaMedia>(arena, true), read_only);
    if (!mounted.ok()) {
      result.containment.push_back("fsck -y of the changed image: it no longer mounts (" +
                                   mounted.error().Describe() + ")");
    } else {
      std::vector<uint64_t> excluded;
      if (result.changed_on_purpose != 0) excluded.push_back(result.changed_on_purpose);
      CheckContainment(**mounted, options, result, "fsck -y of the changed image", excluded, true);
      (void)(*mounted)->Unmount();
    }
  }

  // 4. Repair, then everything must be clean and usable.
  if (options.repair) {
    arena.UndoStores();
    const FsckReport repaired = Fsck(arena, RepairMode::kYes);
    result.repair_exit = repaired.exit_code;
    if (repaired.exit_code == kFsckClean || repaired.exit_code == kFsckCorrected) {
      const FsckReport after = Fsck(arena, RepairMode::kNone);
      result.after_repair_exit = after.exit_code;
      if (after.exit_code != kFsckClean) {
        result.violations.push_back("fsck -n after fsck -y exits " +
                                    std::to_string(after.exit_code));
      } else {
        uint64_t errors = 0;
        if (!MountAndWalk(arena, false, true, "mount after repair", options, result, &error,
                          &errors)) {
          result.violations.push_back("mount after fsck -y failed: " + error);
        } else if (Fsck(arena, RepairMode::kNone).exit_code != kFsckClean) {
          result.violations.push_back("fsck -n finds problems after mounting a repaired image");
        }
      }
    }
  }
  arena.UndoStores();
  return result;
}

}  // namespace nvfs::fuzz
