#include "test_util.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace nvfs::test {

TempPath::TempPath(const std::string& tag) {
  static std::atomic<int> counter{0};
  path_ = "/dev/shm/nvfs-test-" + std::to_string(getpid()) + "-" + tag + "-" +
          std::to_string(counter++);
  unlink(path_.c_str());
}

TempPath::~TempPath() { unlink(path_.c_str()); }

void MakeFile(const std::string& path, uint64_t size, char fill) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) throw std::runtime_error("ftruncate");
  if (fill != 0) {
    std::string chunk(1 << 20, fill);
    for (uint64_t off = 0; off < size; off += chunk.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - off));
      if (pwrite(fd, chunk.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
        throw std::runtime_error("pwrite");
      }
    }
  }
  close(fd);
}

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void WriteAt(const std::string& path, uint64_t offset, const void* data, size_t len) {
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  if (pwrite(fd, data, len, static_cast<off_t>(offset)) != static_cast<ssize_t>(len)) {
    throw std::runtime_error("pwrite");
  }
  close(fd);
}

RunResult Run(const char* program_env, const std::vector<std::string>& args) {
  const char* program = std::getenv(program_env);
  if (program == nullptr) throw std::runtime_error(std::string(program_env) + " is not set");
  std::string command = program;
  for (const auto& a : args) command += " '" + a + "'";
  command += " 2>&1";
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) result.out.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace nvfs::test
