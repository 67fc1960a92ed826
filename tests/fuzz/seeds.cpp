#include "seeds.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "arena_media.hpp"
#include "forced_name_hash.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/mkfs.hpp"

namespace nvfs::fuzz {

namespace {

constexpr uint64_t kMiB = 1 << 20;
const Cred kCred{1000, 1000};

void Check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("fuzz seed: " + what);
}

void Mkfs(Arena& arena, uint32_t block_size, uint64_t inodes) {
  ArenaMedia media(arena, false);
  MkfsOptions options;
  options.block_size = block_size;
  options.inode_count = inodes;
  options.dir_hash_key = std::array<uint8_t, 16>{0x5e, 0xed, 0x5e, 0xed, 0x5e, 0xed};
  options.uuid = Uuid{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  options.now = 1700000000;
  options.label = "fuzz";
  auto plan = PlanMkfs(media.size(), options);
  Check(plan.ok(), "mkfs plan");
  Check(WriteMkfs(media, *plan).ok(), "mkfs");
}

std::unique_ptr<Filesystem> Mount(Arena& arena, ArenaMedia** media_out = nullptr) {
  auto media = std::make_unique<ArenaMedia>(arena, false);
  if (media_out) *media_out = media.get();
  auto fs = Filesystem::Mount(std::move(media), MountOptions{});
  Check(fs.ok(), "mount: " + (fs.ok() ? std::string() : fs.error().Describe()));
  return std::move(fs.value());
}

std::vector<std::byte> Snapshot(const Arena& arena) {
  return std::vector<std::byte>(arena.data(), arena.data() + arena.size());
}

// Small helpers over the core that drop the references they take.
struct Builder {
  Filesystem& fs;

  uint64_t Dir(uint64_t parent, const std::string& name) {
    auto a = fs.Mkdir(parent, name, 0755, kCred);
    Check(a.ok(), "mkdir " + name);
    fs.Forget(a->ino, 1);
    return a->ino;
  }
  uint64_t File(uint64_t parent, const std::string& name, uint64_t offset = 0,
                const std::string& content = "") {
    Attr attr;
    auto f = fs.Create(parent, name, 0644, O_RDWR, kCred, &attr);
    Check(f.ok(), "create " + name);
    if (!content.empty()) {
      auto n = fs.Write(*f, offset, content.data(), content.size());
      Check(n.ok(), "write " + name);
    }
    fs.Release(*f);
    fs.Forget(attr.ino, 1);
    return attr.ino;
  }
  void Symlink(uint64_t parent, const std::string& name, const std::string& target) {
    auto a = fs.Symlink(parent, name, target, kCred);
    Check(a.ok(), "symlink " + name);
    fs.Forget(a->ino, 1);
  }
  void Link(uint64_t ino, uint64_t parent, const std::string& name) {
    auto a = fs.Link(ino, parent, name);
    Check(a.ok(), "link " + name);
    fs.Forget(ino, 1);
  }
  void Node(uint64_t parent, const std::string& name, uint32_t mode, uint64_t rdev) {
    auto a = fs.Mknod(parent, name, mode, rdev, kCred);
    Check(a.ok(), "mknod " + name);
    fs.Forget(a->ino, 1);
  }
};

// The populated tree (see seeds.hpp); `block_size` scales the file offsets so
// every depth of the file map is used.
void Populate(Filesystem& fs, uint32_t block_size) {
  Builder b{fs};
  const uint64_t bs = block_size;
  const uint64_t p = bs / 8;
  const std::string block(bs, 'b');
  uint64_t dir = 1;
  for (const char* name : {"a", "b", "c", "d"}) {
    dir = b.Dir(dir, name);
    b.File(dir, std::string("in-") + name, 0, std::string(100, name[0]));
  }
  b.File(1, "empty");
  b.File(1, "small", 0, "hello, world\n");
  b.File(1, "three-blocks", 0, std::string(3 * bs - 7, 't'));
  b.File(1, "depth1", 0, std::string((format::kDirectPointers + 4) * bs, '1'));
  b.File(1, "depth2", (format::kDirectPointers + p + 5) * bs, block);
  b.File(1, "depth3", (format::kDirectPointers + p + p * p + 9) * bs, "deep");
  const uint64_t linked = b.File(1, "linked", 0, "three names");
  b.Link(linked, 1, "linked-2");
  b.Link(linked, 2 + 0, "linked-in-lost+found");  // inode 2 is lost+found
  b.Symlink(1, "short-link", "small");
  b.Symlink(1, "long-link", std::string(400, 'L') + "/target");
  const uint64_t with_xattr = b.File(1, "xattrs", 0, "x");
  Check(fs.SetXattr(with_xattr, "user.color", "blue", 4, 0).ok(), "setxattr");
  Check(fs.SetXattr(with_xattr, "user.empty", "", 0, 0).ok(), "setxattr");
  // A value in runs of its own (chained xattrs): its run pointer is a target.
  const std::string runs_value(6000, 'R');
  Check(fs.SetXattr(with_xattr, "user.runs", runs_value.data(), runs_value.size(), 0).ok(),
        "setxattr in runs");
  Check(fs.SetXattr(1, "trusted.root", "r", 1, 0).ok(), "setxattr on a directory");
  b.Node(1, "fifo", S_IFIFO | 0600, 0);
  b.Node(1, "chardev", S_IFCHR | 0600, makedev(1, 3));
  const uint64_t big = b.Dir(1, "big");
  for (int i = 0; i < 300; ++i) {
    b.File(big, "a-rather-long-file-name-to-fill-the-leaves-" + std::to_string(i));
  }
  // Some holes in the big directory's leaves.
  for (int i = 0; i < 300; i += 7) {
    Check(fs.Unlink(big, "a-rather-long-file-name-to-fill-the-leaves-" + std::to_string(i)).ok(),
          "unlink");
  }
}

// The seed `name`: an arena of `size` bytes formatted with `block_size`
// blocks and `inodes` inodes, mounted, filled by build(fs), and unmounted.
template <typename Build>
Seed Unmounted(const char* name, uint64_t size, uint32_t block_size, uint64_t inodes,
               Build build) {
  Arena arena(size);
  Mkfs(arena, block_size, inodes);
  auto fs = Mount(arena);
  build(*fs);
  Check(fs->Unmount().ok(), "unmount");
  fs.reset();
  return {name, Snapshot(arena)};
}

Seed Fresh() {
  Arena arena(8 * kMiB);
  Mkfs(arena, 4096, 0);
  return {"fresh", Snapshot(arena)};
}

Seed Populated(const char* name, uint32_t block_size, uint64_t size) {
  return Unmounted(name, size, block_size, 1024,
                   [&](Filesystem& fs) { Populate(fs, block_size); });
}

Seed Orphans() {
  Seed seed = Populated("orphans", 4096, 8 * kMiB);
  Arena arena(seed.image.size());
  arena.Load(seed.image);
  auto fs = Mount(arena);
  Builder b{*fs};
  std::vector<FileHandle> open;
  for (const char* name : {"doomed-1", "doomed-2"}) {
    const uint64_t ino = b.File(1, name, 0, std::string(5000, 'd'));
    auto f = fs->Open(ino, O_RDONLY);
    Check(f.ok(), "open");
    open.push_back(*f);
    Check(fs->Unlink(1, name).ok(), "unlink");
  }
  seed.image = Snapshot(arena);  // the crash: both still open, nothing unmounted
  for (FileHandle f : open) fs->Release(f);
  return seed;
}

Seed Recovery() {
  Seed seed = Populated("recovery", 4096, 8 * kMiB);
  Arena arena(seed.image.size());
  arena.Load(seed.image);
  ArenaMedia* media = nullptr;
  auto fs = Mount(arena, &media);
  // A rename across directories that replaces a file: many logged stores.
  auto d = fs->Lookup(1, "a");
  Check(d.ok(), "lookup a");
  uint64_t stores = 0;
  std::vector<std::byte> crashed;
  media->set_store_hook([&] {
    if (++stores == 12) crashed = Snapshot(arena);
  });
  Check(fs->Rename(1, "small", d->ino, "in-a", 0).ok(), "rename");
  media->set_store_hook({});
  Check(!crashed.empty(), "the rename stored too little");
  seed.image = std::move(crashed);
  return seed;
}

Seed Full() {
  return Unmounted("full", 4 * kMiB, 4096, 256, [](Filesystem& fs) {
    Builder b{fs};
    const std::string chunk(48 * 1024, 'f');
    for (int i = 0;; ++i) {
      Attr attr;
      auto f = fs.Create(1, "fill-" + std::to_string(i), 0644, O_RDWR, kCred, &attr);
      if (!f.ok()) break;
      auto n = fs.Write(*f, 0, chunk.data(), chunk.size());
      fs.Release(*f);
      fs.Forget(attr.ino, 1);
      if (!n.ok() || *n < chunk.size()) break;
    }
    b.Symlink(1, "last-link", "fill-0");
  });
}

// Two groups and 40 directories spread over them: fsck's passes run on
// several threads here (src/fsck/checker.hpp, "Threads").
Seed TwoGroups() {
  return Unmounted("two-groups", 128 * kMiB + 8 * kMiB, 4096, 2048, [](Filesystem& fs) {
    Builder b{fs};
    for (int d = 0; d < 40; ++d) {
      const uint64_t dir = b.Dir(1, "dir-" + std::to_string(d));
      for (int f = 0; f < 3; ++f) {
        b.File(dir, "file-" + std::to_string(f), 0, std::string(100 + 3000 * f, 'a' + f));
      }
    }
  });
}

// A name of /chain: 200 bytes, forced onto one hash (the test hook; the
// keyed hash has no collisions anyone can find). Forced for the rest of the
// process, so the fuzzed copies of the seed are read with the same hashes.
std::string ChainName(int i) {
  static test::ForcedNameHash forced;
  std::string name = "chain-" + std::to_string(i) + "-";
  name.resize(200, 'c');
  forced.Force(name, 0xC0111DEDC0111DEDull);
  return name;
}

// 90 names of one hash in /chain: a collision chain of six leaves, with
// holes; beside ordinary names.
Seed Collisions() {
  return Unmounted("collisions", 8 * kMiB, 4096, 1024, [](Filesystem& fs) {
    Builder b{fs};
    const uint64_t dir = b.Dir(1, "chain");
    for (int i = 0; i < 90; ++i) b.File(dir, ChainName(i), 0, i % 10 == 0 ? "data" : "");
    for (int i = 0; i < 20; ++i) b.File(dir, "plain-" + std::to_string(i));
    for (int i = 0; i < 90; i += 7) Check(fs.Unlink(dir, ChainName(i)).ok(), "unlink");
  });
}

}  // namespace

Seed BuildSeed(const std::string& name) {
  if (name == "collisions") return Collisions();
  if (name == "fresh") return Fresh();
  if (name == "populated") return Populated("populated", 4096, 8 * kMiB);
  if (name == "orphans") return Orphans();
  if (name == "recovery") return Recovery();
  if (name == "full") return Full();
  if (name == "big-blocks") return Populated("big-blocks", 65536, 16 * kMiB);
  if (name == "two-groups") return TwoGroups();
  return {name, {}};
}

std::vector<Seed> BuildSeeds() {
  std::vector<Seed> seeds;
  for (const char* name :
       {"fresh", "populated", "orphans", "recovery", "full", "big-blocks", "two-groups",
        "collisions"}) {
    seeds.push_back(BuildSeed(name));
  }
  return seeds;
}

}  // namespace nvfs::fuzz
