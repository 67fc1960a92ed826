// The namespace the crash workloads start from, and a borrowing media.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstring>
#include <mutex>
#include <stdexcept>

#include "crash_harness.hpp"
#include "helpers.hpp"
#include "nvfs/mkfs.hpp"

namespace nvfs::test {

namespace {

class BorrowedMedia final : public Media {
 public:
  explicit BorrowedMedia(Media& target) : target_(target) {
    base_ = const_cast<std::byte*>(target.base());
    size_ = target.size();
    read_only_ = target.read_only();
    granularity_ = target.granularity();
    path_ = target.path();
  }
  void Store(uint64_t offset, const void* src, size_t len) override {
    target_.Store(offset, src, len);
  }
  void Store64(uint64_t offset, uint64_t value) override { target_.Store64(offset, value); }
  bool CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) override {
    return target_.CompareExchange64(offset, expected, desired);
  }
  void Fill(uint64_t offset, int byte, size_t len) override { target_.Fill(offset, byte, len); }
  void Flush(uint64_t offset, size_t len) override { target_.Flush(offset, len); }
  void Drain() override { target_.Drain(); }
  void StoreFlush(uint64_t offset, const void* src, size_t len) override {
    target_.StoreFlush(offset, src, len);
  }
  void BeginOp(const char* name) override { target_.BeginOp(name); }
  void EndOp() override { target_.EndOp(); }

 private:
  Media& target_;
};

[[noreturn]] void SetupError(const std::string& what, const Error& error) {
  throw std::runtime_error("standard image: " + what + ": " + error.Describe());
}

template <class T>
T Must(Result<T> r, const std::string& what) {
  if (!r.ok()) SetupError(what, r.error());
  return std::move(r.value());
}

void Must(const Status& st, const std::string& what) {
  if (!st.ok()) SetupError(what, st.error());
}

void WriteFile(Filesystem& fs, uint64_t dir, const std::string& name, uint32_t mode,
               const std::string& data, const Cred& cred, uint64_t offset = 0) {
  Attr attr;
  FileHandle file = Must(fs.Create(dir, name, mode, O_RDWR, cred, &attr), "create " + name);
  if (!data.empty()) Must(fs.Write(file, offset, data.data(), data.size()), "write " + name);
  fs.Release(file);
  fs.Forget(attr.ino, 1);
}

uint64_t MakeDir(Filesystem& fs, uint64_t dir, const std::string& name, uint32_t mode,
                 const Cred& cred) {
  Attr attr = Must(fs.Mkdir(dir, name, mode, cred), "mkdir " + name);
  fs.Forget(attr.ino, 1);
  return attr.ino;
}

// The standard tree (crash_harness.hpp): a few directories, files with data
// (one past the direct pointers, one sparse), a hard link, short and long
// symlinks, special files, and xattrs.
void PopulateStandard(Filesystem& fs) {
  const Cred user{1000, 1000};
  const Cred root{0, 0};
  const uint64_t d1 = MakeDir(fs, 1, "d1", 0755, user);
  const uint64_t d2 = MakeDir(fs, 1, "d2", 0700, root);
  WriteFile(fs, d1, "f1", 0644, LetterPattern(10000, 1), user);
  WriteFile(fs, d1, "f2", 0600, "", user);
  MakeDir(fs, d1, "sub", 0755, user);
  const uint64_t full = MakeDir(fs, d1, "full", 0755, user);
  WriteFile(fs, full, "x", 0644, LetterPattern(100, 2), user);
  WriteFile(fs, d2, "g1", 0644, LetterPattern(3 * 4096 + 100, 3), root);
  MakeDir(fs, d2, "empty", 0755, root);
  WriteFile(fs, d2, "keep-open", 0644, LetterPattern(5000, 4), root);
  WriteFile(fs, 1, "big", 0644, LetterPattern(60 * 4096, 5), root);
  WriteFile(fs, 1, "sparse", 0644, LetterPattern(4096, 6), root, 20 * 4096);
  {
    const uint64_t f1 = Must(ResolvePath(fs, "/d1/f1"), "resolve f1");
    const Attr attr = Must(fs.Link(f1, d2, "hl"), "link hl");
    fs.Forget(attr.ino, 1);
    const std::string big_value = LetterPattern(300, 7);
    Must(fs.SetXattr(f1, "user.color", "blue", 4, 0), "setxattr");
    Must(fs.SetXattr(f1, "user.big", big_value.data(), big_value.size(), 0), "setxattr");
    Must(fs.SetXattr(d1, "user.dir", "1", 1, 0), "setxattr");
  }
  fs.Forget(Must(fs.Symlink(1, "sl", "d1/f1", root), "symlink").ino, 1);
  fs.Forget(Must(fs.Symlink(1, "sl-long", std::string(200, 'L') + "/target", root), "symlink").ino,
            1);
  fs.Forget(Must(fs.Mknod(1, "fifo", S_IFIFO | 0644, 0, root), "mknod").ino, 1);
  fs.Forget(Must(fs.Mknod(1, "chr", S_IFCHR | 0600, makedev(1, 3), root), "mknod").ino, 1);
}

std::unique_ptr<RecordingMedia> Format(const ImageSpec& spec) {
  RecordingOptions plain;
  plain.record = false;
  auto media = std::make_unique<RecordingMedia>(spec.size + spec.room, plain);
  MkfsOptions options;
  options.dir_hash_key = std::array<uint8_t, 16>{0x5E, 0xED};
  options.now = 1700000000;
  options.journal_slot_size = spec.journal_slot_size;
  options.block_size = spec.block_size;
  options.uuid = Uuid{0x6e, 0x76, 0x66, 0x73, 0x2d, 0x63, 0x72, 0x61, 0x73, 0x68, 0, 0, 0, 0, 0, 1};
  Result<MkfsPlan> plan = PlanMkfs(spec.size, options);
  if (!plan.ok()) SetupError("mkfs plan", plan.error());
  Must(WriteMkfs(*media, *plan), "mkfs");
  return media;
}

BaseImage BuildImage(const ImageSpec& spec) {
  BaseImage image;
  image.spec = spec;
  {
    auto media = Format(spec);
    auto fs = Must(Filesystem::Mount(BorrowMedia(*media), {}), "mount empty");
    StatFs st = Must(fs->GetStatFs(), "statfs");
    image.empty_free_blocks = st.blocks_free;
    image.empty_free_inodes = st.inodes_free;
    Must(fs->Unmount(), "unmount empty");
  }
  auto media = Format(spec);
  auto fs = Must(Filesystem::Mount(BorrowMedia(*media), {}), "mount");
  PopulateStandard(*fs);
  Must(fs->Unmount(), "unmount");
  fs.reset();
  image.bytes.assign(media->base(), media->base() + media->size());
  return image;
}

}  // namespace

std::unique_ptr<Media> BorrowMedia(Media& target) {
  return std::make_unique<BorrowedMedia>(target);
}

const BaseImage& StandardImage(const ImageSpec& spec) {
  static std::mutex mu;
  static std::map<ImageSpec, std::unique_ptr<BaseImage>> images;
  std::lock_guard lock(mu);
  auto& slot = images[spec];
  if (!slot) slot = std::make_unique<BaseImage>(BuildImage(spec));
  return *slot;
}

}  // namespace nvfs::test
