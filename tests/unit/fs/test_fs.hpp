// What the files of the filesystem core's test (test_fs_*.cpp, one
// executable, meson test 'fs') share: the calls every case makes through the
// core's C++ API, and the fsck every stage of a case can end with.
#pragma once

#include <catch2/catch.hpp>

#include <fcntl.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fs_image.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/media.hpp"

namespace nvfs::test {

inline constexpr uint64_t kRoot = 1;
inline const Cred kCred{1000, 1000};

inline uint64_t MustMkdir(Filesystem& fs, uint64_t parent, const std::string& name) {
  auto a = fs.Mkdir(parent, name, 0755, kCred);
  REQUIRE(a.ok());
  return a->ino;
}

// A new regular file holding `content`, closed and forgotten: only the name
// holds it.
inline uint64_t MustCreate(Filesystem& fs, uint64_t parent, const std::string& name,
                           const std::string& content = "") {
  Attr attr;
  auto f = fs.Create(parent, name, 0644, O_RDWR, kCred, &attr);
  REQUIRE(f.ok());
  if (!content.empty()) {
    auto n = fs.Write(*f, 0, content.data(), content.size());
    REQUIRE(n.ok());
    REQUIRE(*n == content.size());
  }
  fs.Release(*f);
  fs.Forget(attr.ino, 1);  // Create took a lookup reference, as FUSE's would
  return attr.ino;
}

inline std::string ReadAll(Filesystem& fs, uint64_t ino) {
  auto f = fs.Open(ino, O_RDONLY);
  REQUIRE(f.ok());
  auto attr = fs.GetAttr(ino);
  REQUIRE(attr.ok());
  std::string data(attr->size, '\0');
  auto n = fs.Read(*f, 0, data.data(), data.size());
  fs.Release(*f);
  REQUIRE(n.ok());
  data.resize(*n);
  return data;
}

inline std::set<std::string> List(Filesystem& fs, uint64_t dir) {
  std::set<std::string> names;
  REQUIRE(fs.ReadDir(dir, 0, [&](const Filesystem::DirEntry& e, uint64_t) {
    names.insert(std::string(e.name));
    return true;
  }).ok());
  return names;
}

// fsck (the library, in this process, so under the same forced hash) finds
// nothing to say about the unmounted image; the image is mounted again after.
inline void RequireFsckClean(FsImage& img, const char* stage) {
  img.Unmount();
  {
    MediaOptions options;
    options.read_only = true;
    auto media = OpenMedia(img.path(), options);
    REQUIRE(media.ok());
    std::vector<std::string> lines;
    const FsckReport report = CheckNamespace(
        **media, RepairMode::kNone, [&](const std::string& line) { lines.push_back(line); });
    INFO("fsck after " << stage << ": " << (lines.empty() ? "" : lines.front()));
    CHECK(report.exit_code == kFsckClean);
    CHECK(report.problems == 0);
  }
  img.Mount();
}

// Failures seen by worker threads, checked once they are joined.
class ThreadErrors {
 public:
  void Add(const std::string& what, int code) {
    std::lock_guard lock(mu_);
    list_.push_back(what + ": errno " + std::to_string(code));
  }
  void Check() {
    INFO((list_.empty() ? std::string() : list_[0]) << " (" << list_.size() << " in all)");
    CHECK(list_.empty());
  }

 private:
  std::mutex mu_;
  std::vector<std::string> list_;
};

}  // namespace nvfs::test
