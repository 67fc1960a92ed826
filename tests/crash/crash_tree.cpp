#include "crash_tree.hpp"

#include "nvfs/format.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <set>
#include <vector>

namespace nvfs::test {

namespace {

struct Entry {
  std::string name;
  uint64_t ino;
};

Result<std::vector<Entry>> ListDir(Filesystem& fs, uint64_t dir, uint64_t* dot,
                                   uint64_t* dotdot) {
  std::vector<Entry> entries;
  Status st = fs.ReadDir(dir, 0, [&](const Filesystem::DirEntry& e, uint64_t) {
    if (e.name == ".") {
      *dot = e.ino;
    } else if (e.name == "..") {
      *dotdot = e.ino;
    } else {
      entries.push_back({std::string(e.name), e.ino});
    }
    return true;
  });
  if (!st.ok()) return st.take_error();
  return entries;
}

Error PathError(const std::string& path, const char* what, const Error& error) {
  return Error(error.code, path + ": " + what + ": " + error.Describe());
}

Status ReadXattrs(Filesystem& fs, uint64_t ino, const std::string& path, TreeNode* node) {
  Result<size_t> size = fs.ListXattr(ino, nullptr, 0, Cred{});
  if (!size.ok()) return PathError(path, "listxattr", size.error());
  std::string names(*size, '\0');
  if (*size != 0) {
    Result<size_t> got = fs.ListXattr(ino, names.data(), names.size(), Cred{});
    if (!got.ok()) return PathError(path, "listxattr", got.error());
  }
  for (size_t pos = 0; pos < names.size();) {
    const std::string name = names.c_str() + pos;
    pos += name.size() + 1;
    Result<size_t> len = fs.GetXattr(ino, name, nullptr, 0);
    if (!len.ok()) return PathError(path, name.c_str(), len.error());
    std::string value(*len, '\0');
    if (*len != 0) {
      Result<size_t> got = fs.GetXattr(ino, name, value.data(), value.size());
      if (!got.ok()) return PathError(path, name.c_str(), got.error());
    }
    node->xattrs[name] = value;
  }
  return Status::Ok();
}

Status ReadContent(Filesystem& fs, uint64_t ino, const std::string& path, TreeNode* node) {
  if (S_ISLNK(node->mode)) {
    Result<std::string> target = fs.Readlink(ino);
    if (!target.ok()) return PathError(path, "readlink", target.error());
    node->content = *target;
    return Status::Ok();
  }
  if (!S_ISREG(node->mode)) return Status::Ok();
  Result<FileHandle> file = fs.Open(ino, O_RDONLY);
  if (!file.ok()) return PathError(path, "open", file.error());
  node->content.resize(node->size);
  Result<size_t> got = fs.Read(*file, 0, node->content.data(), node->content.size());
  fs.Release(*file);
  if (!got.ok()) return PathError(path, "read", got.error());
  if (*got != node->size) {
    return MakeError(EIO, "%s: read %zu of %" PRIu64 " bytes", path.c_str(), *got, node->size);
  }
  return Status::Ok();
}

// What GetAttr says of inode `ino`, as a tree node (the rest is filled by
// the walk).
TreeNode NodeOf(uint64_t ino, const Attr& attr) {
  TreeNode node;
  node.ino = ino;
  node.mode = attr.mode;
  node.uid = attr.uid;
  node.gid = attr.gid;
  node.nlink = attr.nlink;
  node.size = attr.size;
  node.blocks = attr.blocks;
  node.rdev = attr.rdev;
  return node;
}

Status Walk(Filesystem& fs, uint64_t dir, const std::string& path, uint64_t parent, Tree* tree,
            std::set<uint64_t>* dirs_seen) {
  if (!dirs_seen->insert(dir).second) {
    return MakeError(EUCLEAN, "%s: directory inode %" PRIu64 " reached twice", path.c_str(), dir);
  }
  uint64_t dot = 0, dotdot = 0;
  Result<std::vector<Entry>> entries = ListDir(fs, dir, &dot, &dotdot);
  if (!entries.ok()) return PathError(path, "readdir", entries.error());
  if (dot != dir || dotdot != parent) {
    return MakeError(EUCLEAN, "%s: '.' is %" PRIu64 ", '..' is %" PRIu64 "; expected %" PRIu64
                     ", %" PRIu64, path.c_str(), dot, dotdot, dir, parent);
  }
  for (const Entry& e : *entries) {
    const std::string child = (path == "/" ? "/" : path + "/") + e.name;
    Result<Attr> attr = fs.GetAttr(e.ino);
    if (!attr.ok()) return PathError(child, "getattr", attr.error());
    TreeNode node = NodeOf(e.ino, *attr);
    if (S_ISREG(node.mode) || S_ISDIR(node.mode)) {
      Result<uint32_t> flags = fs.GetInodeFlags(e.ino);
      if (!flags.ok()) return PathError(child, "getflags", flags.error());
      node.attr_flags = *flags;
    }
    NVFS_TRY(ReadXattrs(fs, e.ino, child, &node));
    NVFS_TRY(ReadContent(fs, e.ino, child, &node));
    if (S_ISDIR(node.mode)) node.parent = dir;
    (*tree)[child] = node;
    if (S_ISDIR(node.mode)) NVFS_TRY(Walk(fs, e.ino, child, dir, tree, dirs_seen));
  }
  return Status::Ok();
}

std::string Describe(const TreeNode& n) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "ino %" PRIu64 " mode 0%o uid %u gid %u nlink %u size %" PRIu64
                " blocks %" PRIu64 " rdev %" PRIu64 " parent %" PRIu64 " xattrs %zu flags 0x%x",
                n.ino, n.mode, n.uid, n.gid, n.nlink, n.size, n.blocks, n.rdev, n.parent,
                n.xattrs.size(), n.attr_flags);
  return buf;
}

}  // namespace

Result<Tree> SnapshotTree(Filesystem& fs) {
  Tree tree;
  Result<Attr> root = fs.GetAttr(format::kRootIno);
  if (!root.ok()) return PathError("/", "getattr", root.error());
  TreeNode node = NodeOf(format::kRootIno, *root);  // rdev 0: a directory
  node.parent = format::kRootIno;
  NVFS_TRY(ReadXattrs(fs, format::kRootIno, "/", &node));
  tree["/"] = node;
  std::set<uint64_t> dirs_seen;
  NVFS_TRY(Walk(fs, format::kRootIno, "/", format::kRootIno, &tree, &dirs_seen));
  return tree;
}

std::string CheckLinkCounts(const Tree& tree) {
  std::map<uint64_t, uint32_t> links;  // names per inode; directories: 2 + subdirectories
  for (const auto& [path, node] : tree) {
    if (S_ISDIR(node.mode)) {
      links[node.ino] += 2;
      if (path != "/") links[node.parent] += 1;
    } else {
      links[node.ino] += 1;
    }
  }
  for (const auto& [path, node] : tree) {
    if (links[node.ino] != node.nlink) {
      return path + ": link count " + std::to_string(node.nlink) + ", the tree implies " +
             std::to_string(links[node.ino]);
    }
  }
  return "";
}

std::string TreeDiff(const Tree& expected, const Tree& actual) {
  for (const auto& [path, node] : expected) {
    auto it = actual.find(path);
    if (it == actual.end()) return path + ": missing (expected " + Describe(node) + ")";
    const TreeNode& got = it->second;
    if (got == node) continue;
    std::string out = path + ": expected " + Describe(node) + ", got " + Describe(got);
    if (got.content != node.content) {
      size_t i = 0;
      while (i < got.content.size() && i < node.content.size() && got.content[i] == node.content[i]) ++i;
      out += "; content differs from byte " + std::to_string(i);
    }
    if (got.xattrs != node.xattrs) out += "; xattrs differ";
    return out;
  }
  for (const auto& [path, node] : actual) {
    if (!expected.count(path)) return path + ": unexpected (" + Describe(node) + ")";
  }
  return "";
}

bool TreeMatches(const Tree& actual, const Tree& before, const Tree& after,
                 const MixedRange* mixed) {
  if (actual == before || actual == after) return true;
  if (mixed == nullptr) return false;
  auto b = before.find(mixed->path);
  auto c = after.find(mixed->path);
  if (b == before.end() || c == after.end()) return false;
  const std::string& old_bytes = b->second.content;
  const std::string& new_bytes = c->second.content;
  // Every name of the inode (hard links) is adjusted alike.
  if (mixed->kind == MixedRange::kReserveFreed) {
    const auto freed_as = [&](const Tree& expected, const TreeNode& file) {
      const uint64_t bs = mixed->block_size;
      const uint64_t dense = (file.size + bs - 1) / bs * (bs / 512);
      Tree adjusted = actual;
      for (auto& [path, node] : adjusted) {
        if (node.ino != file.ino || !S_ISREG(node.mode)) continue;
        // The count holds the map's blocks too: between the data's alone
        // and the count before the mount freed any.
        if (node.blocks >= dense && node.blocks <= file.blocks) node.blocks = file.blocks;
      }
      return adjusted == expected;
    };
    return freed_as(before, b->second) || freed_as(after, c->second);
  }
  if (mixed->kind == MixedRange::kAllocation) {
    Tree adjusted = actual;
    const uint64_t low = std::min(b->second.blocks, c->second.blocks);
    const uint64_t high = std::max(b->second.blocks, c->second.blocks);
    for (auto& [path, node] : adjusted) {
      if (node.ino != b->second.ino || !S_ISREG(node.mode)) continue;
      if (node.blocks < low || node.blocks > high) return false;
      node.blocks = b->second.blocks;
    }
    return adjusted == before;
  }
  // The bytes of the range that hold one version are made the other's; the
  // rest of the tree must then be the tree after (the operation committed),
  // or before (it did not; only the unlogged bytes reached the media).
  const auto settle = [&](const std::string& from, const std::string& to) {
    Tree t = actual;
    for (auto& [path, node] : t) {
      if (node.ino != c->second.ino || !S_ISREG(node.mode)) continue;
      std::string& content = node.content;
      const uint64_t end = std::min<uint64_t>({mixed->offset + mixed->len, content.size(),
                                               from.size(), to.size()});
      for (uint64_t i = mixed->offset; i < end; ++i) {
        if (content[i] == from[i]) content[i] = to[i];
      }
    }
    return t;
  };
  if (mixed->kind == MixedRange::kPrivilegesFirst) {
    // `before` with the privileges of `after`: the first transaction done.
    Tree dropped = before;
    for (auto& [path, node] : dropped) {
      if (node.ino != c->second.ino) continue;
      node.mode = c->second.mode;
      node.xattrs = c->second.xattrs;
    }
    return actual == dropped || settle(old_bytes, new_bytes) == after ||
           settle(new_bytes, old_bytes) == dropped;
  }
  return settle(old_bytes, new_bytes) == after || settle(new_bytes, old_bytes) == before;
}

Result<uint64_t> ResolvePath(Filesystem& fs, std::string_view path) {
  uint64_t ino = format::kRootIno;
  size_t pos = 0;
  while (pos < path.size()) {
    if (path[pos] == '/') {
      ++pos;
      continue;
    }
    const size_t end = std::min(path.find('/', pos), path.size());
    Result<Attr> attr = fs.Lookup(ino, path.substr(pos, end - pos));
    if (!attr.ok()) return attr.take_error();
    fs.Forget(attr->ino, 1);
    ino = attr->ino;
    pos = end;
  }
  return ino;
}

Status CheckExtensionsRead0(Filesystem& fs, const Tree& tree, uint64_t extra) {
  std::set<uint64_t> done;
  std::string buffer(extra, '\0');
  for (const auto& [path, node] : tree) {
    if (!S_ISREG(node.mode) || !done.insert(node.ino).second) continue;
    // chattr's immutable and append-only would refuse the truncation.
    if (node.attr_flags != 0) NVFS_TRY(fs.SetInodeFlags(node.ino, 0, Cred{}));
    SetAttrRequest grow;
    grow.valid = kSetSize;
    grow.size = node.size + extra;
    Result<Attr> attr = fs.SetAttr(node.ino, grow);
    if (!attr.ok()) return PathError(path, "truncate up", attr.error());
    Result<FileHandle> file = fs.Open(node.ino, O_RDONLY);
    if (!file.ok()) return PathError(path, "open", file.error());
    Result<size_t> got = fs.Read(*file, node.size, buffer.data(), buffer.size());
    fs.Release(*file);
    if (!got.ok()) return PathError(path, "read", got.error());
    for (size_t i = 0; i < *got; ++i) {
      if (buffer[i] != '\0') {
        return MakeError(EUCLEAN, "%s: truncated up from %" PRIu64 " bytes, byte %" PRIu64
                         " reads 0x%02x, not zero", path.c_str(), node.size, node.size + i,
                         static_cast<unsigned>(static_cast<unsigned char>(buffer[i])));
      }
    }
  }
  return Status::Ok();
}

namespace {

Status EmptyDir(Filesystem& fs, uint64_t dir) {
  uint64_t dot = 0, dotdot = 0;
  Result<std::vector<Entry>> entries = ListDir(fs, dir, &dot, &dotdot);
  if (!entries.ok()) return entries.take_error();
  for (const Entry& e : *entries) {
    Result<Attr> attr = fs.GetAttr(e.ino);
    if (!attr.ok()) return attr.take_error();
    // chattr's immutable and append-only would refuse the removal.
    if (S_ISREG(attr->mode) || S_ISDIR(attr->mode)) {
      NVFS_TRY(fs.SetInodeFlags(e.ino, 0, Cred{}));
    }
    if (S_ISDIR(attr->mode)) {
      NVFS_TRY(EmptyDir(fs, e.ino));
      if (dir == format::kRootIno && e.name == "lost+found") continue;
      NVFS_TRY(fs.Rmdir(dir, e.name));
    } else {
      NVFS_TRY(fs.Unlink(dir, e.name));
    }
  }
  return Status::Ok();
}

}  // namespace

Status DeleteAll(Filesystem& fs) { return EmptyDir(fs, format::kRootIno); }

}  // namespace nvfs::test
