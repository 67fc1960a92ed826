// A seeded random model test: thousands of random operations applied both to
// the filesystem core and to an in-memory model of the tree; after each round
// (and a remount, or a simulated crash) the whole tree is compared.
// A failure prints the seed, round and operation number.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/stat.h>

#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fs_image.hpp"

namespace nvfs::test {
namespace {

#define REQUIRE_MSG(cond) \
  do {                         \
    INFO(Where());             \
    REQUIRE(cond);             \
  } while (0)

constexpr uint64_t kRoot = 1;
const Cred kCred{0, 0};

struct Node {
  uint32_t mode = 0;                       // type | permissions
  std::string data;                        // files: contents; symlinks: target
  std::map<std::string, uint64_t> entries; // directories: name -> node id
  std::map<std::string, std::string> xattrs;
  uint32_t nlink = 1;
  uint64_t ino = 0;                        // in the filesystem
};

class Model {
 public:
  Model() {
    nodes_[kRoot] = Node{S_IFDIR | 0755, {}, {}, {}, 3, kRoot};
    nodes_[2] = Node{S_IFDIR | 0700, {}, {}, {}, 2, 2};
    nodes_[kRoot].entries["lost+found"] = 2;
  }
  std::map<uint64_t, Node> nodes_;  // by inode number
};

class Runner {
 public:
  Runner(uint64_t seed) : rng_(seed), seed_(seed) {}

  void Round(FsImage& img, int ops) {
    for (int i = 0; i < ops; ++i) {
      op_ = i;
      Step(img.fs());
    }
  }

  // Compares every reachable node of the model with the filesystem.
  void Compare(Filesystem& fs) { CompareDir(fs, kRoot, "/"); }

  std::string Where() const {
    std::ostringstream out;
    out << "seed " << seed_ << " round " << round_ << " op " << op_ << " (" << last_ << ")";
    return out.str();
  }
  int round_ = 0;

 private:
  uint64_t Pick(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }

  std::vector<uint64_t> Dirs() {
    std::vector<uint64_t> dirs;
    for (auto& [ino, n] : model_.nodes_) if (S_ISDIR(n.mode) && n.nlink > 0) dirs.push_back(ino);
    return dirs;
  }
  std::vector<std::pair<uint64_t, std::string>> Names() {
    std::vector<std::pair<uint64_t, std::string>> names;
    for (auto& [ino, n] : model_.nodes_) {
      for (auto& [name, child] : n.entries) if (child != 2) names.push_back({ino, name});
    }
    return names;
  }
  std::string NewName() { return "n" + std::to_string(Pick(40)); }

  void Step(Filesystem& fs) {
    auto dirs = Dirs();
    auto names = Names();
    const uint64_t dir = dirs[Pick(dirs.size())];
    Node& d = model_.nodes_[dir];
    const std::string name = NewName();
    const bool exists = d.entries.count(name) != 0;
    switch (Pick(13)) {
      case 0: {  // create
        last_ = "create " + name;
        Attr attr;
        auto h = fs.Create(dir, name, 0640, O_RDWR, kCred, &attr);
        if (exists) { REQUIRE_MSG(h.code() == EEXIST); return; }
        REQUIRE_MSG(h.ok());
        fs.Release(*h);
        fs.Forget(attr.ino, 1);
        model_.nodes_[attr.ino] = Node{S_IFREG | 0640, {}, {}, {}, 1, attr.ino};
        model_.nodes_[dir].entries[name] = attr.ino;
        return;
      }
      case 1: {  // mkdir
        last_ = "mkdir " + name;
        auto a = fs.Mkdir(dir, name, 0750, kCred);
        if (exists) { REQUIRE_MSG(a.code() == EEXIST); return; }
        REQUIRE_MSG(a.ok());
        fs.Forget(a->ino, 1);
        model_.nodes_[a->ino] = Node{S_IFDIR | 0750, {}, {}, {}, 2, a->ino};
        model_.nodes_[dir].entries[name] = a->ino;
        model_.nodes_[dir].nlink++;
        return;
      }
      case 2: case 3: case 4: {  // write
        if (names.empty()) return;
        auto [p, n] = names[Pick(names.size())];
        Node& f = model_.nodes_[model_.nodes_[p].entries[n]];
        if (!S_ISREG(f.mode)) return;
        const uint64_t off = Pick(3) == 0 ? f.data.size() : Pick(70000);
        std::string bytes(Pick(20000) + 1, '\0');
        for (auto& c : bytes) c = static_cast<char>('A' + Pick(26));
        last_ = "write " + n + " @" + std::to_string(off) + "+" + std::to_string(bytes.size());
        auto h = fs.Open(f.ino, O_RDWR);
        REQUIRE_MSG(h.ok());
        auto w = fs.Write(*h, off, bytes.data(), bytes.size());
        fs.Release(*h);
        REQUIRE_MSG(w.ok());
        REQUIRE_MSG(*w == bytes.size());
        if (f.data.size() < off + bytes.size()) f.data.resize(off + bytes.size(), '\0');
        f.data.replace(off, bytes.size(), bytes);
        return;
      }
      case 5: {  // truncate
        if (names.empty()) return;
        auto [p, n] = names[Pick(names.size())];
        Node& f = model_.nodes_[model_.nodes_[p].entries[n]];
        if (!S_ISREG(f.mode)) return;
        const uint64_t size = Pick(80000);
        last_ = "truncate " + n + " " + std::to_string(size);
        SetAttrRequest req;
        req.valid = kSetSize;
        req.size = size;
        REQUIRE_MSG(fs.SetAttr(f.ino, req).ok());
        f.data.resize(size, '\0');
        return;
      }
      case 6: {  // unlink or rmdir
        if (names.empty()) return;
        auto [p, n] = names[Pick(names.size())];
        const uint64_t child = model_.nodes_[p].entries[n];
        Node& c = model_.nodes_[child];
        last_ = "remove " + n;
        if (S_ISDIR(c.mode)) {
          Status st = fs.Rmdir(p, n);
          if (!c.entries.empty()) { REQUIRE_MSG(st.code() == ENOTEMPTY); return; }
          REQUIRE_MSG(st.ok());
          model_.nodes_[p].nlink--;
          model_.nodes_.erase(child);
        } else {
          REQUIRE_MSG(fs.Unlink(p, n).ok());
          if (--c.nlink == 0) model_.nodes_.erase(child);
        }
        model_.nodes_[p].entries.erase(n);
        return;
      }
      case 7: {  // rename
        if (names.empty()) return;
        auto [p, n] = names[Pick(names.size())];
        const uint64_t src = model_.nodes_[p].entries[n];
        last_ = "rename " + n + " -> " + name;
        Status st = fs.Rename(p, n, dir, name, 0);
        Node& s = model_.nodes_[src];
        // The model's verdict.
        int expect = 0;
        uint64_t dst = exists ? d.entries[name] : 0;
        if (S_ISDIR(s.mode)) {
          for (uint64_t x = dir;; x = Parent(x)) {
            if (x == src) { expect = EINVAL; break; }
            if (x == kRoot) break;
          }
        }
        if (!expect && dst == src) { REQUIRE_MSG(st.ok()); return; }
        if (!expect && dst) {
          Node& t = model_.nodes_[dst];
          if (S_ISDIR(s.mode) && !S_ISDIR(t.mode)) expect = ENOTDIR;
          else if (!S_ISDIR(s.mode) && S_ISDIR(t.mode)) expect = EISDIR;
          else if (S_ISDIR(t.mode) && !t.entries.empty()) expect = ENOTEMPTY;
        }
        if (expect) { REQUIRE_MSG(st.code() == expect); return; }
        REQUIRE_MSG(st.ok());
        if (dst) {
          Node& t = model_.nodes_[dst];
          if (S_ISDIR(t.mode)) { model_.nodes_[dir].nlink--; model_.nodes_.erase(dst); }
          else if (--t.nlink == 0) model_.nodes_.erase(dst);
        }
        model_.nodes_[p].entries.erase(n);
        model_.nodes_[dir].entries[name] = src;
        if (S_ISDIR(s.mode) && p != dir) { model_.nodes_[p].nlink--; model_.nodes_[dir].nlink++; }
        return;
      }
      case 8: {  // link
        if (names.empty() || exists) return;
        auto [p, n] = names[Pick(names.size())];
        const uint64_t src = model_.nodes_[p].entries[n];
        if (S_ISDIR(model_.nodes_[src].mode)) return;
        last_ = "link " + n + " -> " + name;
        auto a = fs.Link(src, dir, name);
        REQUIRE_MSG(a.ok());
        fs.Forget(src, 1);
        model_.nodes_[src].nlink++;
        model_.nodes_[dir].entries[name] = src;
        return;
      }
      case 9: {  // symlink
        if (exists) return;
        std::string target(Pick(300) + 1, 't');
        last_ = "symlink " + name;
        auto a = fs.Symlink(dir, name, target, kCred);
        REQUIRE_MSG(a.ok());
        fs.Forget(a->ino, 1);
        model_.nodes_[a->ino] = Node{S_IFLNK | 0777, target, {}, {}, 1, a->ino};
        model_.nodes_[dir].entries[name] = a->ino;
        return;
      }
      case 10: {  // xattr
        if (names.empty()) return;
        auto [p, n] = names[Pick(names.size())];
        Node& f = model_.nodes_[model_.nodes_[p].entries[n]];
        if (S_ISLNK(f.mode)) return;
        const std::string key = "user.k" + std::to_string(Pick(4));
        last_ = "xattr " + n + " " + key;
        if (Pick(3) == 0) {
          Status st = fs.RemoveXattr(f.ino, key);
          if (f.xattrs.erase(key)) REQUIRE_MSG(st.ok()); else REQUIRE_MSG(st.code() == ENODATA);
        } else {
          std::string value(Pick(200), 'v');
          REQUIRE_MSG(fs.SetXattr(f.ino, key, value.data(), value.size(), 0).ok());
          f.xattrs[key] = value;
        }
        return;
      }
      case 12: {  // fallocate: allocate, keep size, punch, zero range
        if (names.empty()) return;
        auto [p, n] = names[Pick(names.size())];
        Node& f = model_.nodes_[model_.nodes_[p].entries[n]];
        if (!S_ISREG(f.mode)) return;
        static const int kModes[] = {0, FALLOC_FL_KEEP_SIZE,
                                     FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                     FALLOC_FL_ZERO_RANGE,
                                     FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE};
        const int mode = kModes[Pick(5)];
        const uint64_t off = Pick(70000);
        const uint64_t len = Pick(30000) + 1;
        last_ = "fallocate " + n + " mode " + std::to_string(mode) + " @" + std::to_string(off) +
                "+" + std::to_string(len);
        auto h = fs.Open(f.ino, O_RDWR);
        REQUIRE_MSG(h.ok());
        Status st = fs.Fallocate(*h, mode, off, len);
        fs.Release(*h);
        REQUIRE_MSG(st.ok());
        const uint64_t end = off + len;
        if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
          if (off < f.data.size()) {
            const uint64_t to = std::min<uint64_t>(end, f.data.size());
            f.data.replace(off, to - off, std::string(to - off, '\0'));
          }
        }
        if (!(mode & FALLOC_FL_KEEP_SIZE) && end > f.data.size()) f.data.resize(end, '\0');
        return;
      }
      case 11: {  // chmod
        if (names.empty()) return;
        auto [p, n] = names[Pick(names.size())];
        Node& f = model_.nodes_[model_.nodes_[p].entries[n]];
        if (S_ISLNK(f.mode)) return;
        last_ = "chmod " + n;
        SetAttrRequest req;
        req.valid = kSetMode;
        req.mode = static_cast<uint32_t>(Pick(01000));
        REQUIRE_MSG(fs.SetAttr(f.ino, req).ok());
        f.mode = (f.mode & S_IFMT) | req.mode;
        return;
      }
    }
  }

  uint64_t Parent(uint64_t dir) {
    for (auto& [ino, n] : model_.nodes_) {
      for (auto& [name, child] : n.entries) if (child == dir && S_ISDIR(model_.nodes_[child].mode)) return ino;
    }
    return kRoot;
  }

  void CompareDir(Filesystem& fs, uint64_t dir, const std::string& path) {
    const Node& d = model_.nodes_.at(dir);
    std::map<std::string, uint64_t> listed;
    REQUIRE_MSG(fs.ReadDir(dir, 0, [&](const Filesystem::DirEntry& e, uint64_t) {
      if (e.name != "." && e.name != "..") listed[std::string(e.name)] = e.ino;
      return true;
    }).ok());
    INFO(Where() << " dir " << path);
    REQUIRE(listed == d.entries);
    for (auto& [name, child] : d.entries) {
      const Node& c = model_.nodes_.at(child);
      auto attr = fs.GetAttr(child);
      INFO(Where() << " node " << path << name);
      REQUIRE(attr.ok());
      CHECK(attr->mode == c.mode);
      CHECK(attr->nlink == c.nlink);
      if (S_ISREG(c.mode)) {
        REQUIRE(attr->size == c.data.size());
        auto h = fs.Open(child, O_RDONLY);
        std::string data(c.data.size(), '\0');
        auto n = fs.Read(*h, 0, data.data(), data.size());
        fs.Release(*h);
        REQUIRE(n.ok());
        CHECK(data == c.data);
      } else if (S_ISLNK(c.mode)) {
        CHECK(*fs.Readlink(child) == c.data);
      }
      if (!S_ISLNK(c.mode)) {
        std::vector<char> list(4096);
        auto n = fs.ListXattr(child, list.data(), list.size(), Cred{});
        REQUIRE(n.ok());
        std::map<std::string, std::string> xattrs;
        for (size_t pos = 0; pos < *n;) {
          std::string key(list.data() + pos);
          std::vector<char> value(1024);
          auto v = fs.GetXattr(child, key, value.data(), value.size());
          REQUIRE(v.ok());
          xattrs[key] = std::string(value.data(), *v);
          pos += key.size() + 1;
        }
        CHECK(xattrs == c.xattrs);
      }
      if (S_ISDIR(c.mode) && child != 2) CompareDir(fs, child, path + name + "/");
    }
  }

  Model model_;
  std::mt19937_64 rng_;
  uint64_t seed_;
  int op_ = 0;
  std::string last_;
};

TEST_CASE("random operations match the model across remounts and crashes", "[fs][model]") {
  for (uint64_t seed : {1ull, 2ull, 3ull}) {
    FsImage img(256ull << 20);
    Runner runner(seed);
    for (int round = 0; round < 6; ++round) {
      runner.round_ = round;
      runner.Round(img, 400);
      runner.Compare(img.fs());
      if (round % 2 == 0) img.Remount(); else img.CrashAndMount();
      runner.Compare(img.fs());
    }
  }
}

}  // namespace
}  // namespace nvfs::test
