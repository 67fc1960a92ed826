// Helpers shared by the tests: scratch images under /dev/shm that remove
// themselves, and running the programs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nvfs::test {

// A file path under /dev/shm, unique per process and call, removed by the
// destructor.
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

// Creates (or truncates) `path` with `size` bytes, all `fill`.
void MakeFile(const std::string& path, uint64_t size, char fill = 0);
std::vector<char> ReadFile(const std::string& path);
void WriteAt(const std::string& path, uint64_t offset, const void* data, size_t len);

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};
// Runs argv[0] with the arguments; `program_env` names the environment
// variable holding the program's path (set by meson).
RunResult Run(const char* program_env, const std::vector<std::string>& args);

}  // namespace nvfs::test
