#include "crash_random.hpp"

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
      case 0: return Create(c, Join(pick.One(dirs), fresh));
      case 1: return Mkdir(c, Join(pick.One(dirs), fresh));
      case 2: return Symlink(c, Join(pick.One(dirs), fresh), std::string(1 + pick.Below(300), 's'));
      case 3: return Link(c, pick.One(files), Join(pick.One(dirs), fresh));
      case 4: {
        const std::string& victim = pick.One(names);
        if (S_ISDIR(tree.at(victim).mode)) continue;
        return Unlink(c, victim);
      }
      case 5:
        if (empty_dirs.empty()) continue;
        return Rmdir(c, pick.One(empty_dirs));
      case 6: {  // rename to a new name, or over a compatible name
        const std::string& from = pick.One(names);
        const bool from_dir = S_ISDIR(tree.at(from).mode);
        if (pick.Below(2) == 0) {
          const std::string& to = pick.One(names);
          const bool to_dir = S_ISDIR(tree.at(to).mode);
          if (to == from || to_dir != from_dir || Under(to, from) || Under(from, to)) continue;
          if (to_dir && std::find(empty_dirs.begin(), empty_dirs.end(), to) == empty_dirs.end()) continue;
          if (tree.at(to).ino == tree.at(from).ino) continue;  // two links of one file
          return Rename(c, from, to);
        }
        const std::string& dir = pick.One(dirs);
        if (from_dir && Under(dir, from)) continue;
        return Rename(c, from, Join(dir, fresh));
      }
      case 7: {  // exchange
        const std::string& a = pick.One(names);
        const std::string& b = pick.One(names);
        if (a == b || Under(a, b) || Under(b, a)) continue;
        if (tree.at(a).ino == tree.at(b).ino) continue;
        return Rename(c, a, b, RENAME_EXCHANGE);
      }
      case 8: {
        SetAttrRequest r;
        r.valid = kSetMode | kSetUid;
        r.mode = static_cast<uint32_t>(pick.Below(07777));
        r.uid = static_cast<uint32_t>(pick.Below(5000));
        return SetAttr(c, pick.One(names), r);
      }
      case 9:
        if (files.empty()) continue;
        return Truncate(c, pick.One(files), pick.Below(70000));
      case 10:
        return SetXattr(c, pick.One(names), "user." + std::to_string(pick.Below(4)),
                        std::string(pick.Below(600), 'v'));
      case 11: {
        if (with_xattrs.empty()) continue;
        const std::string& path = pick.One(with_xattrs);
        const auto& xattrs = tree.at(path).xattrs;
        auto it = xattrs.begin();
        std::advance(it, static_cast<long>(pick.Below(xattrs.size())));
        return RemoveXattr(c, path, it->first);
      }
      case 12: {  // a write from the end of the file: atomic
        if (files.empty()) continue;
        const std::string& path = pick.One(files);
        const uint64_t size = tree.at(path).size;
        return Write(c, path, size + pick.Below(5000), Bytes(1 + pick.Below(9000), 'w'));
      }
      case 13: {  // an overwrite: bytes may mix
        if (files.empty()) continue;
        const std::string& path = pick.One(files);
        const uint64_t size = tree.at(path).size;
        if (size < 2) continue;
        const uint64_t offset = pick.Below(size - 1);
        const uint64_t len = 1 + pick.Below(std::min<uint64_t>(size - offset, 6000));
        return Overwrite(c, path, offset, Bytes(len, 'o'));
      }
      case 14: {
        if (files.empty()) continue;
        const std::string& path = pick.One(files);
        const uint64_t offset = pick.Below(40000);
        const uint64_t len = 1 + pick.Below(30000);
        if (pick.Below(2) == 0) {
          return Fallocate(c, path, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, len);
        }
        return Fallocate(c, path, pick.Below(2) ? FALLOC_FL_KEEP_SIZE : 0, offset, len);
      }
    }
  }
}

}  // namespace nvfs::test
