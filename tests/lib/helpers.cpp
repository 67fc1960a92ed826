#include "helpers.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "nvfs/crc32c.hpp"

namespace nvfs::test {

TempPath::TempPath(const std::string& tag) {
  static std::atomic<int> counter{0};
  path_ = "/dev/shm/nvfs-test-" + std::to_string(getpid()) + "-" + tag + "-" +
          std::to_string(counter++);
  unlink(path_.c_str());
}

TempPath::~TempPath() {
  if (unlink(path_.c_str()) != 0 && errno == EISDIR) rmdir(path_.c_str());
}

void MakeFile(const std::string& path, uint64_t size, char fill) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);  // as mkfs.nvfs -s
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

namespace {

// Calls `fn` on each chunk of the file, in order.
void ForEachChunk(const std::string& path,
                  const std::function<void(const char*, size_t)>& fn) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      close(fd);
      throw std::runtime_error("read " + path);
    }
    if (n == 0) break;
    fn(buf.data(), static_cast<size_t>(n));
  }
  close(fd);
}

}  // namespace

std::vector<char> ReadFile(const std::string& path) {
  std::vector<char> bytes;
  ForEachChunk(path, [&](const char* p, size_t n) { bytes.insert(bytes.end(), p, p + n); });
  return bytes;
}

void WriteAt(const std::string& path, uint64_t offset, const void* data, size_t len) {
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  if (pwrite(fd, data, len, static_cast<off_t>(offset)) != static_cast<ssize_t>(len)) {
    close(fd);
    throw std::runtime_error("pwrite");
  }
  close(fd);
}

std::vector<char> ReadAt(const std::string& path, uint64_t offset, size_t len) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  std::vector<char> bytes(len);
  const ssize_t n = pread(fd, bytes.data(), len, static_cast<off_t>(offset));
  close(fd);
  if (n != static_cast<ssize_t>(len)) throw std::runtime_error("short pread of " + path);
  return bytes;
}

void FlipByte(const std::string& path, uint64_t offset, uint8_t mask) {
  std::vector<char> byte = ReadAt(path, offset, 1);
  byte[0] = static_cast<char>(static_cast<uint8_t>(byte[0]) ^ mask);
  WriteAt(path, offset, byte.data(), 1);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw std::runtime_error("cannot stat " + path);
  return static_cast<uint64_t>(st.st_size);
}

FileDigest DigestFile(const std::string& path) {
  FileDigest digest;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return digest;
  digest.exists = true;
  if (!S_ISREG(st.st_mode)) return digest;
  ForEachChunk(path, [&](const char* p, size_t n) {
    digest.crc = Crc32c(digest.crc, p, n);
    digest.size += n;
  });
  return digest;
}

RunResult RunShell(const std::string& command) {
  RunResult result;
  FILE* pipe = popen((command + " 2>&1 </dev/null").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) result.out.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

DecoyFuseMount::DecoyFuseMount(const std::string& source) {
  char dir[] = "/tmp/nvfs-decoy-XXXXXX";
  if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp");
  dir_ = dir;
  const int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    error_ = std::string("/dev/fuse: ") + std::strerror(errno);
    return;
  }
  const std::string options = "fd=" + std::to_string(fd) + ",rootmode=40000,user_id=" +
                              std::to_string(getuid()) + ",group_id=" + std::to_string(getgid());
  mounted_ = mount(source.c_str(), dir_.c_str(), "fuse.decoy", MS_NOSUID | MS_NODEV,
                   options.c_str()) == 0;
  if (!mounted_) error_ = std::string("mount: ") + std::strerror(errno);
  close(fd);  // the connection's last descriptor: the kernel cuts it
  if (!mounted_) return;
  if (const std::optional<MountName> name = MountAt(dir_)) name_ = *name;
}

DecoyFuseMount::~DecoyFuseMount() {
  if (mounted_) (void)umount2(dir_.c_str(), MNT_DETACH);
  rmdir(dir_.c_str());
}

RunResult Run(const char* program_env, const std::vector<std::string>& args) {
  const char* program = std::getenv(program_env);
  if (program == nullptr) throw std::runtime_error(std::string(program_env) + " is not set");
  std::string command = program;
  for (const auto& a : args) command += " '" + a + "'";
  return RunShell(command);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::string LetterPattern(size_t len, uint32_t seed) {
  std::string out(len, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < len; ++i) {
    x = x * 1103515245u + 12345u;
    out[i] = static_cast<char>('a' + (x >> 16) % 26);
  }
  return out;
}

int RunInChild(const std::function<int()>& body, unsigned timeout_seconds) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork");
  if (pid == 0) {
    // Catch's handlers would report the child's death as a test failure of
    // its own; the parent judges how the child ended.
    for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGALRM}) signal(sig, SIG_DFL);
    alarm(timeout_seconds);
    int code = 254;  // the body threw
    try {
      code = body();
    } catch (...) {
    }
    _exit(code);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid");
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

}  // namespace nvfs::test

namespace nvfs::test {

std::vector<LeafRecord> ParseDirLeaf(const std::byte* block, size_t size) {
  auto fail = [](const std::string& what, uint32_t offset) {
    throw std::runtime_error("directory leaf: " + what + " at offset " +
                             std::to_string(offset));
  };
  std::vector<LeafRecord> records;
  uint32_t offset = sizeof(format::DirLeafHeader);
  while (offset < size) {
    LeafRecord r;
    r.offset = offset;
    if (offset + sizeof(format::DirEntry) > size) fail("record header past the end", offset);
    std::memcpy(&r.entry, block + offset, sizeof r.entry);
    if (r.entry.rec_len < sizeof(format::DirEntry)) fail("rec_len too short", offset);
    if (r.entry.rec_len % 8 != 0) fail("rec_len not a multiple of 8", offset);
    if (offset + r.entry.rec_len > size) fail("record past the end", offset);
    if (r.entry.reserved != 0) fail("reserved field set", offset);
    if (r.entry.ino != 0) {
      if (r.entry.name_len == 0) fail("empty name", offset);
      if (format::DirRecordLength(r.entry.name_len) > r.entry.rec_len) {
        fail("name longer than the record", offset);
      }
      r.name.assign(reinterpret_cast<const char*>(block) + offset + sizeof(format::DirEntry),
                    r.entry.name_len);
    }
    records.push_back(r);
    offset += r.entry.rec_len;
  }
  if (offset != size) fail("chain does not end at the block end", offset);
  return records;
}

}  // namespace nvfs::test
