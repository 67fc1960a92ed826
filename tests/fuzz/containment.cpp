#include "containment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>

#include "nvfs/bitmap.hpp"
#include "nvfs/format.hpp"
#include "nvfs/superblock.hpp"
#include "nvfs/validate.hpp"

namespace nvfs::fuzz {

namespace {

using format::Inode;

// A file's data read in chunks of this, and no more than this in all (the
// seeds' files hold a few MiB at most; a damaged map may claim far more).
constexpr size_t kChunk = 256 << 10;
constexpr uint64_t kMaxFileBytes = 32 << 20;
constexpr uint64_t kMaxNames = 20000;  // names walked for the census's paths

std::string Hex(uint8_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", v);
  return buf;
}

// The byte of `c` at `offset` (0 in a hole, or past the data).
uint8_t ByteAt(const FileContent& c, uint64_t offset) {
  for (const FileContent::Extent& e : c.data) {
    if (offset >= e.offset && offset - e.offset < e.bytes.size()) {
      return std::to_integer<uint8_t>(e.bytes[offset - e.offset]);
    }
  }
  return 0;
}

// The first offset of an extent of `x` where `y` reads otherwise, or ~0.
uint64_t FirstDifference(const FileContent& x, const FileContent& y) {
  for (const FileContent::Extent& e : x.data) {
    const uint64_t end = e.offset + e.bytes.size();
    uint64_t at = e.offset;
    while (at < end) {
      // The extent of y covering `at`, or the next one after it.
      const FileContent::Extent* cover = nullptr;
      uint64_t next = end;
      for (const FileContent::Extent& f : y.data) {
        if (at >= f.offset && at - f.offset < f.bytes.size()) {
          cover = &f;
          break;
        }
        if (f.offset > at) next = std::min(next, f.offset);
      }
      if (cover != nullptr) {
        const uint64_t stop = std::min(end, cover->offset + cover->bytes.size());
        const std::byte* a = e.bytes.data() + (at - e.offset);
        const std::byte* b = cover->bytes.data() + (at - cover->offset);
        if (std::memcmp(a, b, stop - at) != 0) {
          for (uint64_t i = 0; i < stop - at; ++i) {
            if (a[i] != b[i]) return at + i;
          }
        }
        at = stop;
      } else {
        const std::byte* a = e.bytes.data() + (at - e.offset);
        for (uint64_t i = 0; i < next - at; ++i) {
          if (a[i] != std::byte{0}) return at + i;
        }
        at = next;
      }
    }
  }
  return ~uint64_t{0};
}

}  // namespace

ContainmentMode ContainmentModeFromEnv() {
  const char* v = std::getenv("NVFS_FUZZ_CONTAINMENT");
  if (v == nullptr || *v == 0) return kContainmentDefault;
  const std::string mode = v;
  if (mode == "off") return ContainmentMode::kOff;
  if (mode == "report") return ContainmentMode::kReport;
  if (mode == "local") return ContainmentMode::kLocal;
  if (mode == "strict") return ContainmentMode::kStrict;
  std::fprintf(stderr, "NVFS_FUZZ_CONTAINMENT=%s: not off, report, local or strict\n", v);
  std::abort();
}

const char* ModeName(ContainmentMode mode) {
  switch (mode) {
    case ContainmentMode::kOff: return "off";
    case ContainmentMode::kReport: return "report";
    case ContainmentMode::kLocal: return "local";
    case ContainmentMode::kStrict: return "strict";
  }
  return "?";
}

std::string GlobalNames(uint32_t global) {
  std::string names;
  const auto add = [&](uint32_t bit, const char* name) {
    if (!(global & bit)) return;
    if (!names.empty()) names += "+";
    names += name;
  };
  add(kGlobalSuper, "super");
  add(kGlobalGroup, "group");
  add(kGlobalBitmap, "bitmap");
  add(kGlobalJournal, "journal");
  return names;
}

bool Touch::Touches(uint64_t ino) const {
  return std::binary_search(inodes.begin(), inodes.end(), ino);
}

std::string Touch::Describe() const {
  std::string s = std::to_string(bytes) + " bytes changed; inodes touched:";
  if (inodes.empty()) s += " none";
  for (size_t i = 0; i < inodes.size(); ++i) {
    if (i == 12) {
      s += " ... (" + std::to_string(inodes.size()) + " in all)";
      break;
    }
    s += (i == 0 ? " " : ",") + std::to_string(inodes[i]);
  }
  if (global != 0) s += "; global metadata: " + GlobalNames(global);
  return s;
}

bool ReadContent(Filesystem& fs, uint64_t ino, uint64_t max_bytes, FileContent* content,
                 std::string* error) {
  *content = FileContent{};
  Result<Attr> attr = fs.LookupInode(ino);
  if (!attr.ok()) {
    *error = "lookup by inode number failed with errno " + std::to_string(attr.code());
    return false;
  }
  struct Drop {
    Filesystem& fs;
    uint64_t ino;
    ~Drop() { fs.Forget(ino, 1); }
  } drop{fs, ino};
  content->type = attr->mode & S_IFMT;
  content->size = attr->size;
  if (S_ISLNK(attr->mode)) {
    Result<std::string> target = fs.Readlink(ino);
    if (!target.ok()) {
      *error = "readlink failed with errno " + std::to_string(target.code());
      return false;
    }
    content->target = *target;
    return true;
  }
  if (!S_ISREG(attr->mode)) return true;
  Result<FileHandle> file = fs.Open(ino, O_RDONLY);
  if (!file.ok()) {
    *error = "open failed with errno " + std::to_string(file.code());
    return false;
  }
  bool ok = true;
  uint64_t total = 0;
  for (uint64_t at = 0; at < attr->size && ok;) {
    Result<uint64_t> data = fs.Lseek(*file, at, SEEK_DATA);
    if (!data.ok()) {
      if (data.code() == ENXIO) break;
      *error = "SEEK_DATA at " + std::to_string(at) + " failed with errno " +
               std::to_string(data.code());
      ok = false;
      break;
    }
    Result<uint64_t> hole = fs.Lseek(*file, *data, SEEK_HOLE);
    if (!hole.ok()) {
      *error = "SEEK_HOLE at " + std::to_string(*data) + " failed with errno " +
               std::to_string(hole.code());
      ok = false;
      break;
    }
    if (*data < at || *hole <= *data) {
      *error = "SEEK_DATA/SEEK_HOLE from " + std::to_string(at) + " went to " +
               std::to_string(*data) + ", " + std::to_string(*hole);
      ok = false;
      break;
    }
    const uint64_t end = std::min(*hole, attr->size);
    if (end - *data > max_bytes - total) {
      *error = "more than " + std::to_string(max_bytes) + " bytes of data";
      ok = false;
      break;
    }
    FileContent::Extent extent{*data, std::vector<std::byte>(end - *data)};
    for (uint64_t done = 0; done < extent.bytes.size();) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunk, extent.bytes.size() - done));
      Result<size_t> n = fs.Read(*file, *data + done, extent.bytes.data() + done, len);
      if (!n.ok() || *n == 0) {
        *error = "read at " + std::to_string(*data + done) + " failed with " +
                 (n.ok() ? std::string("0 bytes") : "errno " + std::to_string(n.code()));
        ok = false;
        break;
      }
      done += *n;
    }
    total += extent.bytes.size();
    content->data.push_back(std::move(extent));
    at = end;
  }
  fs.Release(*file);
  return ok;
}

std::string CompareContent(const FileContent& want, const FileContent& got) {
  if (got.type != want.type) {
    return "type 0" + std::to_string(want.type >> 12) + " became 0" + std::to_string(got.type >> 12);
  }
  if (got.size != want.size) {
    return "size " + std::to_string(want.size) + " became " + std::to_string(got.size);
  }
  if (want.type == S_IFLNK) {
    if (got.target == want.target) return "";
    return "symlink target changed (" + std::to_string(want.target.size()) + " bytes, now " +
           std::to_string(got.target.size()) + ")";
  }
  const uint64_t a = FirstDifference(want, got);
  const uint64_t b = FirstDifference(got, want);
  const uint64_t at = std::min(a, b);
  if (at == ~uint64_t{0}) return "";
  uint64_t differ = 0;  // bytes that differ in the first 1 MiB from there
  for (uint64_t i = at; i < want.size && i < at + (1 << 20); ++i) {
    differ += ByteAt(want, i) != ByteAt(got, i);
  }
  return "byte " + std::to_string(at) + " was " + Hex(ByteAt(want, at)) + ", now " +
         Hex(ByteAt(got, at)) + " (" + std::to_string(differ) +
         " bytes differ in the MiB from there)";
}

Census::Census(const Arena& arena) {
  Result<FoundSuper> found = FindSuper(arena.pristine().data(), arena.pristine().size());
  if (!found.ok()) throw std::runtime_error("census: " + found.error().message);
  geometry_ = found->geometry;
  const Geometry& g = geometry_;

  global_.assign(g.block_count(), 0);
  global_[0] |= kGlobalSuper;
  global_[g.BackupBlock()] |= kGlobalSuper;
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    global_[g.GroupDescBlock(group)] |= kGlobalGroup;
    global_[g.BlockBitmapBlock(group)] |= kGlobalBitmap;
    global_[g.InodeBitmapBlock(group)] |= kGlobalBitmap;
  }
  for (uint64_t b = 0; b < g.journal_blocks(); ++b) global_[g.journal_block() + b] |= kGlobalJournal;

  // The seed as stored, then as its first read-write mount leaves it.
  AddOwners(arena.pristine().data());
  Arena settled(arena.size());
  settled.Load(arena.pristine());
  {
    auto fs = Filesystem::Mount(std::make_unique<ArenaMedia>(settled, false), MountOptions{});
    if (!fs.ok()) throw std::runtime_error("census: mount: " + fs.error().Describe());
    if (!(*fs)->Unmount().ok()) throw std::runtime_error("census: unmount");
  }
  AddOwners(settled.data());
  AddInFlight(arena.pristine().data());

  MountOptions read_only;
  read_only.read_only = true;
  auto mounted = Filesystem::Mount(std::make_unique<ArenaMedia>(settled, true), read_only);
  if (!mounted.ok()) throw std::runtime_error("census: mount: " + mounted.error().Describe());
  Filesystem& fs = **mounted;

  // Paths, for messages only.
  std::vector<std::pair<uint64_t, std::string>> dirs{{format::kRootIno, ""}};
  std::set<uint64_t> seen{format::kRootIno};
  uint64_t names = 0;
  while (!dirs.empty() && names < kMaxNames) {
    const auto [dir, path] = dirs.back();
    dirs.pop_back();
    (void)fs.ReadDir(dir, 0, [&](const Filesystem::DirEntry& e, uint64_t) {
      if (e.name == "." || e.name == "..") return true;
      const std::string child = path + "/" + std::string(e.name);
      paths_.emplace(e.ino, child);
      if (e.type == DT_DIR && seen.insert(e.ino).second) dirs.push_back({e.ino, child});
      return ++names < kMaxNames;
    });
  }

  const std::byte* image = settled.data();
  for (uint64_t ino = 1; ino < g.inode_count(); ++ino) {
    const std::byte* ibitmap = image + g.BlockOffset(g.InodeBitmapBlock(g.InodeGroup(ino)));
    if (!TestBit(ibitmap, static_cast<uint32_t>(ino % g.inodes_per_group()))) continue;
    Inode inode;
    std::memcpy(&inode, image + g.InodeOffset(ino), sizeof inode);
    if (!(S_ISREG(inode.mode) || S_ISLNK(inode.mode)) || inode.nlink == 0) continue;
    FileContent content;
    std::string error;
    if (!ReadContent(fs, ino, kMaxFileBytes, &content, &error)) {
      throw std::runtime_error("census: inode " + std::to_string(ino) + ": " + error);
    }
    files_.emplace(ino, std::move(content));
  }
  if (!fs.Unmount().ok()) throw std::runtime_error("census: unmount");
}

const std::string& Census::PathOf(uint64_t ino) const {
  static const std::string unnamed = "(no name)";
  auto it = paths_.find(ino);
  return it == paths_.end() ? unnamed : it->second;
}

void Census::Own(uint64_t block_no, uint64_t ino) {
  if (block_no == 0 || block_no >= geometry_.block_count()) return;
  std::vector<uint64_t>& owners = owners_[block_no];
  if (std::find(owners.begin(), owners.end(), ino) == owners.end()) owners.push_back(ino);
}

void Census::OwnTree(const std::byte* image, uint64_t block_no, uint32_t height, uint64_t ino) {
  if (block_no == 0 || block_no >= geometry_.block_count()) return;
  Own(block_no, ino);
  const uint64_t* slots = reinterpret_cast<const uint64_t*>(image + geometry_.BlockOffset(block_no));
  for (uint64_t i = 0; i < geometry_.pointers_per_block(); ++i) {
    if (slots[i] == 0) continue;
    if (height == 1) {
      Own(slots[i], ino);
    } else {
      OwnTree(image, slots[i], height - 1, ino);
    }
  }
}

void Census::OwnDirNode(const std::byte* image, uint64_t ptr, int depth, uint64_t ino) {
  const uint64_t block_no = ptr & format::kDirNodeBlockMask;
  if (block_no == 0 || block_no >= geometry_.block_count() || depth > 16) return;
  Own(block_no, ino);
  const std::byte* block = image + geometry_.BlockOffset(block_no);
  if (ptr & format::kDirNodeIndexBit) {
    const uint64_t* slots = reinterpret_cast<const uint64_t*>(block);
    uint64_t prev = 0;
    for (uint64_t i = 0; i < geometry_.pointers_per_block(); ++i) {
      if (slots[i] == 0 || slots[i] == prev) continue;  // a leaf fills many slots
      prev = slots[i];
      OwnDirNode(image, slots[i], depth + 1, ino);
    }
    return;
  }
  // A leaf and its overflow chain.
  uint64_t next = 0;
  std::memcpy(&next, block + offsetof(format::DirLeafHeader, next), sizeof next);
  for (int chain = 0; next != 0 && next < geometry_.block_count() && chain < 4096; ++chain) {
    Own(next, ino);
    std::memcpy(&next, image + geometry_.BlockOffset(next) + offsetof(format::DirLeafHeader, next),
                sizeof next);
  }
}

void Census::OwnXattrs(const std::byte* image, uint64_t block_no, uint64_t ino) {
  const Geometry& g = geometry_;
  for (int chain = 0; block_no != 0 && block_no < g.block_count() && chain < 4096; ++chain) {
    Own(block_no, ino);
    XattrBlockView view;
    DecodeXattrBlock({image + g.BlockOffset(block_no), g.block_size()}, g.xattr_chain(),
                     [&](const XattrRecord& record) {
                       for (uint32_t r = 0; r < record.runs; ++r) {
                         const format::XattrValueRun run = record.Run(r);
                         for (uint64_t i = 0; i < run.count && i < 64; ++i) Own(run.first + i, ino);
                       }
                     },
                     &view);
    block_no = view.next;
  }
}

void Census::AddOwners(const std::byte* image) {
  const Geometry& g = geometry_;
  for (uint64_t ino = 1; ino < g.inode_count(); ++ino) {
    const std::byte* ibitmap = image + g.BlockOffset(g.InodeBitmapBlock(g.InodeGroup(ino)));
    if (!TestBit(ibitmap, static_cast<uint32_t>(ino % g.inodes_per_group()))) continue;
    Inode inode;
    std::memcpy(&inode, image + g.InodeOffset(ino), sizeof inode);
    if (inode.mode == 0) continue;
    Own(g.InodeOffset(ino) >> g.block_shift(), ino);
    OwnXattrs(image, inode.xattr_block, ino);
    if (S_ISREG(inode.mode) || (S_ISLNK(inode.mode) && inode.size > format::kInlineSymlinkMax)) {
      for (uint64_t ptr : inode.map.file.direct) Own(ptr, ino);
      for (uint32_t d = 1; d <= format::kIndirectPointers; ++d) {
        OwnTree(image, inode.map.file.indirect[d - 1], d, ino);
      }
    } else if (S_ISDIR(inode.mode)) {
      OwnDirNode(image, inode.map.dir.root, 0, ino);
    }
  }
}

void Census::OwnersOf(uint64_t offset, uint64_t len, std::vector<uint64_t>* inodes) const {
  const Geometry& g = geometry_;
  if (len == 0 || offset >= g.bytes() || len > g.bytes() - offset) return;
  const uint64_t table_bytes = uint64_t{g.itable_blocks()} << g.block_shift();
  for (uint32_t group = 0; group < g.group_count(); ++group) {
    const uint64_t table = g.BlockOffset(g.InodeTableBlock(group));
    if (offset >= table && offset - table < table_bytes) {
      const uint64_t last = std::min(offset + len, table + table_bytes) - 1;
      for (uint64_t at = offset - (offset - table) % format::kInodeSize; at <= last;
           at += format::kInodeSize) {
        inodes->push_back(uint64_t{group} * g.inodes_per_group() + (at - table) / format::kInodeSize);
      }
      return;
    }
  }
  for (uint64_t b = offset >> g.block_shift(); b <= (offset + len - 1) >> g.block_shift(); ++b) {
    auto it = owners_.find(b);
    if (it != owners_.end()) inodes->insert(inodes->end(), it->second.begin(), it->second.end());
  }
}

// The records of every active slot, as recovery would read them (the seed's
// journal is intact).
void Census::AddInFlight(const std::byte* image) {
  using format::JournalRecord;
  using format::JournalRecordType;
  const Geometry& g = geometry_;
  for (uint32_t slot = 0; slot < g.journal_slots(); ++slot) {
    const uint64_t at = g.JournalSlotOffset(slot);
    format::JournalSlotHeader header;
    std::memcpy(&header, image + at, sizeof header);
    if (header.state == 0) continue;
    const uint64_t end = at + g.journal_slot_size();
    for (uint64_t pos = at + sizeof header; pos + sizeof(JournalRecord) <= end;) {
      JournalRecord r;
      std::memcpy(&r, image + pos, sizeof r);
      if (r.tx_seq != header.tx_seq) break;
      const auto type = static_cast<JournalRecordType>(r.type);
      uint64_t payload = 0;
      switch (type) {
        case JournalRecordType::kUndo:
          OwnersOf(r.target, r.length, &in_flight_);
          payload = r.length;
          break;
        case JournalRecordType::kBitmapSet:
        case JournalRecordType::kDeferredFree:
          for (uint64_t b = r.target; b < r.target + r.length && b < g.block_count(); ++b) {
            OwnersOf(g.BlockOffset(b), 1, &in_flight_);
          }
          break;
        case JournalRecordType::kInodeSet:
        case JournalRecordType::kInodeFree:
          for (uint64_t ino = r.target; ino < r.target + r.length && ino < g.inode_count(); ++ino) {
            in_flight_.push_back(ino);
          }
          break;
      }
      pos += sizeof r + ((payload + 7) & ~uint64_t{7});
    }
  }
  std::sort(in_flight_.begin(), in_flight_.end());
  in_flight_.erase(std::unique(in_flight_.begin(), in_flight_.end()), in_flight_.end());
}

Touch Census::TouchedBy(const Arena& arena) const {
  Touch touch;
  std::set<uint64_t> blocks;
  // Bytes, counted once however many pokes covered them.
  std::set<uint64_t> changed;
  const std::byte* now = arena.data();
  const std::byte* before = arena.pristine().data();
  for (const Range& r : arena.poked()) {
    for (uint64_t at = r.offset; at < r.offset + r.len; ++at) {
      if (now[at] == before[at]) continue;
      changed.insert(at);
      blocks.insert(at >> geometry_.block_shift());
    }
  }
  touch.bytes = changed.size();
  std::set<uint64_t> inodes;
  for (uint64_t b : blocks) {
    if (b < global_.size()) touch.global |= global_[b];
    auto it = owners_.find(b);
    if (it != owners_.end()) inodes.insert(it->second.begin(), it->second.end());
  }
  if (touch.global & kGlobalJournal) inodes.insert(in_flight_.begin(), in_flight_.end());
  touch.inodes.assign(inodes.begin(), inodes.end());
  return touch;
}

void Census::Check(Filesystem& fs, const Touch& touch, const std::vector<uint64_t>& excluded,
                   bool demand_readable, std::vector<std::string>* violations,
                   std::vector<std::string>* hidden) const {
  // In inode order, so messages come out the same on every run.
  std::vector<uint64_t> inos;
  inos.reserve(files_.size());
  for (const auto& [ino, content] : files_) inos.push_back(ino);
  std::sort(inos.begin(), inos.end());
  for (uint64_t ino : inos) {
    if (touch.Touches(ino)) continue;
    if (std::find(excluded.begin(), excluded.end(), ino) != excluded.end()) continue;
    const FileContent& want = files_.at(ino);
    uint64_t recorded = 0;
    for (const FileContent::Extent& e : want.data) recorded += e.bytes.size();
    FileContent got;
    std::string error;
    const std::string name = "inode " + std::to_string(ino) + " (" + PathOf(ino) + "): ";
    if (!ReadContent(fs, ino, 2 * recorded + (1 << 20), &got, &error)) {
      (demand_readable ? violations : hidden)->push_back(name + error);
    } else if (std::string what = CompareContent(want, got); !what.empty()) {
      violations->push_back(name + what);
    }
  }
}

}  // namespace nvfs::fuzz
