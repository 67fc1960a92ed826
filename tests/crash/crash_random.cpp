#include "crash_random.hpp"

#include <algorithm>
#include <iterator>
#include <vector>

#include "crash_ops.hpp"

namespace nvfs::test {

namespace {

using namespace ops;

struct Picker {
  StepContext& c;
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : c.rng()() % n; }
  template <class T>
  const T& One(const std::vector<T>& from) { return from[Below(from.size())]; }
};

bool Under(const std::string& path, const std::string& dir) {
  return path == dir || path.compare(0, dir.size() + 1, dir + "/") == 0;
}

std::string Join(const std::string& dir, const std::string& name) {
  return (dir == "/" ? "/" : dir + "/") + name;
}

}  // namespace

void RandomOp(StepContext& c) {
  Picker pick{c};
  const Tree& tree = c.tree();
  std::vector<std::string> dirs, files, names, empty_dirs, with_xattrs;
  for (const auto& [path, node] : tree) {
    if (Under(path, "/lost+found")) continue;
    if (S_ISDIR(node.mode)) {
      dirs.push_back(path);
      bool empty = path != "/";
      for (const auto& [other, unused] : tree) {
        if (other != path && Under(other, path)) {
          empty = false;
          break;
        }
      }
      if (empty) empty_dirs.push_back(path);
    }
    if (S_ISREG(node.mode)) files.push_back(path);
    if (path != "/") names.push_back(path);
    if (!node.xattrs.empty() && path != "/") with_xattrs.push_back(path);
  }
  const std::string fresh = "r" + std::to_string(pick.Below(1000000));

  for (;;) {
    switch (pick.Below(15)) {
      case 0: {
        const std::string path = Join(pick.One(dirs), fresh);
        c.Note("create " + path);
        return Create(c, path);
      }
      case 1: {
        const std::string path = Join(pick.One(dirs), fresh);
        c.Note("mkdir " + path);
        return Mkdir(c, path);
      }
      case 2: {
        const std::string path = Join(pick.One(dirs), fresh);
        const size_t len = 1 + pick.Below(300);
        c.Note("symlink " + path + " (" + std::to_string(len) + " bytes)");
        return Symlink(c, path, std::string(len, 's'));
      }
      case 3: {
        if (files.empty()) continue;
        const std::string& from = pick.One(files);
        const std::string to = Join(pick.One(dirs), fresh);
        c.Note("link " + from + " " + to);
        return Link(c, from, to);
      }
      case 4: {
        const std::string& victim = pick.One(names);
        if (S_ISDIR(tree.at(victim).mode)) continue;
        c.Note("unlink " + victim);
        return Unlink(c, victim);
      }
      case 5: {
        if (empty_dirs.empty()) continue;
        const std::string& victim = pick.One(empty_dirs);
        c.Note("rmdir " + victim);
        return Rmdir(c, victim);
      }
      case 6: {  // rename to a new name, or over a compatible name
        const std::string& from = pick.One(names);
        const bool from_dir = S_ISDIR(tree.at(from).mode);
        if (pick.Below(2) == 0) {
          const std::string& to = pick.One(names);
          const bool to_dir = S_ISDIR(tree.at(to).mode);
          if (to == from || to_dir != from_dir || Under(to, from) || Under(from, to)) continue;
          if (to_dir && std::find(empty_dirs.begin(), empty_dirs.end(), to) == empty_dirs.end()) continue;
          if (tree.at(to).ino == tree.at(from).ino) continue;  // two links of one file
          c.Note("rename " + from + " over " + to);
          return Rename(c, from, to);
        }
        const std::string& dir = pick.One(dirs);
        if (from_dir && Under(dir, from)) continue;
        c.Note("rename " + from + " " + Join(dir, fresh));
        return Rename(c, from, Join(dir, fresh));
      }
      case 7: {  // exchange
        const std::string& a = pick.One(names);
        const std::string& b = pick.One(names);
        if (a == b || Under(a, b) || Under(b, a)) continue;
        if (tree.at(a).ino == tree.at(b).ino) continue;
        c.Note("exchange " + a + " " + b);
        return Rename(c, a, b, RENAME_EXCHANGE);
      }
      case 8: {
        SetAttrRequest r;
        r.valid = kSetMode | kSetUid;
        r.mode = static_cast<uint32_t>(pick.Below(07777));
        r.uid = static_cast<uint32_t>(pick.Below(5000));
        const std::string& path = pick.One(names);
        c.Note("chmod chown " + path);
        return SetAttr(c, path, r);
      }
      case 9: {
        if (files.empty()) continue;
        const std::string& path = pick.One(files);
        const uint64_t size = pick.Below(70000);
        c.Note("truncate " + path + " " + std::to_string(size));
        return Truncate(c, path, size);
      }
      case 10: {
        const std::string& path = pick.One(names);
        const std::string name = "user." + std::to_string(pick.Below(4));
        c.Note("setxattr " + path + " " + name);
        return SetXattr(c, path, name, std::string(pick.Below(600), 'v'));
      }
      case 11: {
        if (with_xattrs.empty()) continue;
        const std::string& path = pick.One(with_xattrs);
        const auto& xattrs = tree.at(path).xattrs;
        auto it = xattrs.begin();
        std::advance(it, static_cast<long>(pick.Below(xattrs.size())));
        c.Note("removexattr " + path + " " + it->first);
        return RemoveXattr(c, path, it->first);
      }
      case 12: {  // a write from the end of the file: atomic
        if (files.empty()) continue;
        const std::string& path = pick.One(files);
        const uint64_t offset = tree.at(path).size + pick.Below(5000);
        const size_t len = 1 + pick.Below(9000);
        c.Note("write " + path + " at " + std::to_string(offset) + ", " + std::to_string(len) +
               " bytes");
        return Write(c, path, offset, Bytes(len, 'w'));
      }
      case 13: {  // an overwrite: bytes may mix
        if (files.empty()) continue;
        const std::string& path = pick.One(files);
        const uint64_t size = tree.at(path).size;
        if (size < 2) continue;
        const uint64_t offset = pick.Below(size - 1);
        const uint64_t len = 1 + pick.Below(std::min<uint64_t>(size - offset, 6000));
        c.Note("overwrite " + path + " at " + std::to_string(offset) + ", " + std::to_string(len) +
               " bytes");
        return Overwrite(c, path, offset, Bytes(len, 'o'));
      }
      case 14: {
        if (files.empty()) continue;
        const std::string& path = pick.One(files);
        const uint64_t offset = pick.Below(40000);
        const uint64_t len = 1 + pick.Below(30000);
        const std::string range = " " + std::to_string(offset) + "+" + std::to_string(len);
        if (pick.Below(2) == 0) {
          c.Note("punch " + path + range);
          return Fallocate(c, path, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, len);
        }
        const int mode = pick.Below(2) ? FALLOC_FL_KEEP_SIZE : 0;
        c.Note(std::string(mode ? "fallocate keep size " : "fallocate ") + path + range);
        return Fallocate(c, path, mode, offset, len);
      }
    }
  }
}

}  // namespace nvfs::test
