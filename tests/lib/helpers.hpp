// Helpers shared by the tests of every folder (not a test of src/util):
// scratch images under /dev/shm that remove themselves, reading and damaging
// them, a FUSE mount no daemon serves, running the programs, and parsing a
// directory leaf.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nvfs/format.hpp"
#include "nvfs/media.hpp"

namespace nvfs::test {

// A file path under /dev/shm, unique per process and call, removed by the
// destructor (an empty directory made at the path is removed too).
class TempPath {
 public:
  explicit TempPath(const std::string& tag);
  ~TempPath();
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Creates (0600, as mkfs.nvfs -s does: the tests' images are namespaces) or
// truncates `path` with `size` bytes, all `fill`.
void MakeFile(const std::string& path, uint64_t size, char fill = 0);
std::vector<char> ReadFile(const std::string& path);
void WriteAt(const std::string& path, uint64_t offset, const void* data, size_t len);
std::vector<char> ReadAt(const std::string& path, uint64_t offset, size_t len);
// XORs the byte at `offset` with `mask` (nonzero), so it surely changes.
void FlipByte(const std::string& path, uint64_t offset, uint8_t mask = 0xFF);
bool PathExists(const std::string& path);
uint64_t FileSize(const std::string& path);

// What a file holds, cheaply comparable: existence, size and a checksum of
// every byte. Used to assert that a refused command wrote nothing.
struct FileDigest {
  bool exists = false;
  uint64_t size = 0;
  uint32_t crc = 0;
  bool operator==(const FileDigest&) const = default;
};
FileDigest DigestFile(const std::string& path);

// A FUSE mount that no daemon serves, whose source (fsname) is `source`:
// the mount a user who may mount FUSE makes with `-o fsname=IMAGE`
// (fusermount3's shows the same in mountinfo: that source, a fuse type).
// Made with mount(2), so root only. Its connection is cut at once (the
// descriptor closed): anything that looks into it fails with ENOTCONN
// instead of waiting. The destructor unmounts it (lazily) and removes its
// directory, also when a REQUIRE failed halfway through a test.
class DecoyFuseMount {
 public:
  explicit DecoyFuseMount(const std::string& source);
  ~DecoyFuseMount();
  DecoyFuseMount(const DecoyFuseMount&) = delete;
  DecoyFuseMount& operator=(const DecoyFuseMount&) = delete;

  // False, with why in error(), if it could not be made (not root).
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_; }
  // Its device number, from mountinfo (a stat of it fails: ENOTCONN).
  dev_t dev() const { return name_.dev; }
  // Its device number and unique mount id (0 where the kernel gives none).
  const MountName& name() const { return name_; }

 private:
  std::string dir_;
  std::string error_;
  bool mounted_ = false;
  MountName name_;
};

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};
// Runs argv[0] with the arguments; `program_env` names the environment
// variable holding the program's path (set by meson).
RunResult Run(const char* program_env, const std::vector<std::string>& args);

// Runs a shell command line, stdout and stderr together.
RunResult RunShell(const std::string& command);

// Non-empty lines of `text`.
std::vector<std::string> Lines(const std::string& text);

// `len` lowercase letters from a generator seeded with `seed`: file data
// that reads as text where a check prints it. The same seed gives the same
// letters in every build (the crash suite's standard image depends on it).
std::string LetterPattern(size_t len, uint32_t seed);

// Runs `body` in a forked child, killed by SIGALRM after `timeout_seconds`.
// Returns its exit status (0..255), or 1000 + the signal that ended it.
int RunInChild(const std::function<int()>& body, unsigned timeout_seconds = 10);

// One record of a directory leaf.
struct LeafRecord {
  uint32_t offset = 0;
  format::DirEntry entry{};
  std::string name;  // empty for a free record
};
// Walks the rec_len chain of a directory leaf from just after its header.
// Throws std::runtime_error (a test failure) unless every record is well formed
// and the chain ends exactly at the end of the block.
std::vector<LeafRecord> ParseDirLeaf(const std::byte* block, size_t size);

}  // namespace nvfs::test
