// The mount suite (test_mount, tests/mount/test_mount_*.cpp): work at once and at
// random — concurrent writers and creators, a seeded exerciser against a
// shadow copy on tmpfs, and reads racing a truncate while another user
// takes the freed blocks.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "mount_fixture.hpp"
#include "mount_helpers.hpp"

namespace nvfs::test {
namespace {

TEST_CASE("mount: concurrent writers on separate files and on one directory", "[mount]") {
  NVFS_REQUIRE_FUSE();
  MountedFs m;
  m.Start();
  REQUIRE(mkdir(m.path("shared").c_str(), 0755) == 0);
  constexpr int kWriters = 4, kCreators = 4, kFilesEach = 250;
  const size_t file_size = 4 * kMiB;
  ThreadErrors errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&, t] {
      const std::string data = Pattern(file_size, 100 + t);
      const int fd = open(m.path("w" + std::to_string(t)).c_str(),
                          O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) return errors.Add("open writer file");
      std::mt19937 rng(t);
      size_t at = 0;
      while (at < data.size()) {
        const size_t n = std::min<size_t>(data.size() - at, 1 + rng() % (256 * kKiB));
        if (pwrite(fd, data.data() + at, n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) {
          errors.Add("pwrite");
          break;
        }
        at += n;
      }
      close(fd);
    });
  }
  for (int t = 0; t < kCreators; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kFilesEach; ++i) {
        const std::string n = m.path("shared/t" + std::to_string(t) + "-" + std::to_string(i));
        const int fd = open(n.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) {
          errors.Add("create " + n);
          continue;
        }
        if (write(fd, n.data(), n.size()) != static_cast<ssize_t>(n.size())) errors.Add("write");
        close(fd);
        if (i % 5 == 4 && unlink(n.c_str()) != 0) errors.Add("unlink " + n);
        if (i % 50 == 0) {
          const std::string sub = m.path("shared/dir" + std::to_string(t) + "-" + std::to_string(i));
          if (mkdir(sub.c_str(), 0755) != 0) errors.Add("mkdir " + sub);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  errors.Check();
  for (int t = 0; t < kWriters; ++t) {
    INFO("writer " << t);
    CHECK(ReadAll(m.path("w" + std::to_string(t))) == Pattern(file_size, 100 + t));
  }
  std::set<std::string> expected{".", ".."};
  for (int t = 0; t < kCreators; ++t) {
    for (int i = 0; i < kFilesEach; ++i) {
      const std::string n = "t" + std::to_string(t) + "-" + std::to_string(i);
      if (i % 5 != 4) expected.insert(n);
      if (i % 50 == 0) expected.insert("dir" + std::to_string(t) + "-" + std::to_string(i));
    }
  }
  CHECK(ListDir(m.path("shared")) == expected);
  CHECK(ReadAll(m.path("shared/t2-7")) == m.path("shared/t2-7"));
  CHECK(Stat(m.path("shared")).st_nlink == 2 + kCreators * (kFilesEach / 50));
  StopAndCheck(m);
}

// One file of the exerciser: its descriptor on the mount and in the shadow.
struct ExercisedFile {
  int fd = -1;
  int shadow = -1;
};

TEST_CASE("mount: seeded random exerciser against a shadow copy", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "read_path=map",
                                       "read_path=iter,threads=2", "read_path=read",
                                       "cache=page");
  const bool use_mmap = options.find("cache=page") != std::string::npos;
  const char* seed_env = std::getenv("NVFS_SEED");
  const uint64_t seed = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 0) : 20251130;
  INFO("options: " << options << ", seed " << seed << " (set NVFS_SEED to replay)");
  MountedFs m;
  m.Start(options);
  char shadow_dir[] = "/dev/shm/nvfs-shadow-XXXXXX";
  REQUIRE(mkdtemp(shadow_dir) != nullptr);
  // Removed on every exit, a failed REQUIRE's too.
  struct RemoveDir {
    const char* dir;
    ~RemoveDir() { std::filesystem::remove_all(dir); }
  } remove_shadow{shadow_dir};
  constexpr int kFiles = 3, kOps = 3000;
  constexpr uint64_t kMaxSize = 3 * kMiB;
  std::vector<ExercisedFile> files(kFiles);
  auto name = [](int i) { return "file" + std::to_string(i); };
  auto open_file = [&](int i) {
    files[i].fd = open(m.path(name(i)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    files[i].shadow =
        open((std::string(shadow_dir) + "/" + name(i)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(files[i].fd >= 0);
    REQUIRE(files[i].shadow >= 0);
  };
  for (int i = 0; i < kFiles; ++i) open_file(i);
  auto size_of = [](int fd) {
    struct stat st {};
    REQUIRE(fstat(fd, &st) == 0);
    return static_cast<uint64_t>(st.st_size);
  };
  std::mt19937_64 rng(seed);
  auto uniform = [&](uint64_t below) { return below == 0 ? 0 : rng() % below; };
  std::string buf, back, shadow_back;
  std::map<std::string, int> counts;
  for (int op = 0; op < kOps; ++op) {
    const int i = static_cast<int>(uniform(kFiles));
    ExercisedFile& f = files[i];
    const uint64_t size = size_of(f.shadow);
    const int kind = static_cast<int>(uniform(use_mmap ? 100 : 88));
    INFO("op " << op << " kind " << kind << " on " << name(i) << ", size " << size);
    if (kind < 30) {  // write
      const uint64_t off = uniform(kMaxSize);
      const size_t len = 1 + uniform(std::min<uint64_t>(kMaxSize - off, 300 * kKiB));
      buf = Pattern(len, rng());
      REQUIRE(pwrite(f.fd, buf.data(), len, static_cast<off_t>(off)) == static_cast<ssize_t>(len));
      REQUIRE(pwrite(f.shadow, buf.data(), len, static_cast<off_t>(off)) ==
              static_cast<ssize_t>(len));
      ++counts["write"];
    } else if (kind < 60) {  // read, sometimes past the end
      const uint64_t off = uniform(size + 8192);
      const size_t len = 1 + uniform(1200 * kKiB);
      back.assign(len, '\1');
      shadow_back.assign(len, '\2');
      const ssize_t n = pread(f.fd, back.data(), len, static_cast<off_t>(off));
      const ssize_t sn = pread(f.shadow, shadow_back.data(), len, static_cast<off_t>(off));
      REQUIRE(n == sn);
      if (n > 0) CHECK(std::memcmp(back.data(), shadow_back.data(), static_cast<size_t>(n)) == 0);
      ++counts["read"];
    } else if (kind < 70) {  // truncate
      const uint64_t to = uniform(kMaxSize);
      REQUIRE(ftruncate(f.fd, static_cast<off_t>(to)) == 0);
      REQUIRE(ftruncate(f.shadow, static_cast<off_t>(to)) == 0);
      ++counts["truncate"];
    } else if (kind < 82) {  // fallocate: allocate, keep size, punch, zero range
      static const int kModes[] = {0, FALLOC_FL_KEEP_SIZE,
                                   FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                   FALLOC_FL_ZERO_RANGE,
                                   FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE};
      const int mode = kModes[uniform(5)];
      const off_t off = static_cast<off_t>(uniform(kMaxSize));
      const off_t len = static_cast<off_t>(
          1 + uniform(std::min<uint64_t>(kMaxSize - static_cast<uint64_t>(off), 512 * kKiB)));
      INFO("fallocate mode " << mode << " at " << off << " len " << len);
      REQUIRE(fallocate(f.fd, mode, off, len) == 0);
      if (mode & FALLOC_FL_ZERO_RANGE) {
        // tmpfs has no ZERO_RANGE: a punch, then an allocation, is the same.
        REQUIRE(fallocate(f.shadow, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) == 0);
        REQUIRE(fallocate(f.shadow, mode & FALLOC_FL_KEEP_SIZE, off, len) == 0);
      } else {
        REQUIRE(fallocate(f.shadow, mode, off, len) == 0);
      }
      ++counts["fallocate"];
    } else if (kind < 85) {  // fsync
      REQUIRE(fsync(f.fd) == 0);
      ++counts["fsync"];
    } else if (kind < 88) {  // reopen
      close(f.fd);
      close(f.shadow);
      open_file(i);
      ++counts["reopen"];
    } else if (size > 0) {  // mmap: write a range, read it back, msync
      const uint64_t off = uniform(size);
      const size_t len = 1 + uniform(std::min<uint64_t>(size - off, 64 * kKiB));
      const uint64_t map_off = off & ~uint64_t{4095};
      const size_t map_len = len + (off - map_off);
      void* p = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd,
                     static_cast<off_t>(map_off));
      void* s = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, f.shadow,
                     static_cast<off_t>(map_off));
      REQUIRE(p != MAP_FAILED);
      REQUIRE(s != MAP_FAILED);
      char* pb = static_cast<char*>(p) + (off - map_off);
      char* sb = static_cast<char*>(s) + (off - map_off);
      CHECK(std::memcmp(pb, sb, len) == 0);
      if (uniform(2) == 0) {
        buf = Pattern(len, rng());
        std::memcpy(pb, buf.data(), len);
        std::memcpy(sb, buf.data(), len);
        REQUIRE(msync(p, map_len, MS_SYNC) == 0);
      }
      munmap(p, map_len);
      munmap(s, map_len);
      ++counts["mmap"];
    }
    REQUIRE(size_of(f.fd) == size_of(f.shadow));
  }
  for (int i = 0; i < kFiles; ++i) {
    close(files[i].fd);
    close(files[i].shadow);
  }
  auto compare_all = [&](const char* when) {
    for (int i = 0; i < kFiles; ++i) {
      INFO(when << ": " << name(i));
      const std::string shadow = ReadAll(std::string(shadow_dir) + "/" + name(i));
      CHECK(ReadAll(m.path(name(i))) == shadow);
    }
  };
  compare_all("end of run");
  CHECK(m.Stop() == 0);
  m.Start();  // no page cache left: what the daemon stored
  compare_all("after remount");
  StopAndCheck(m);
  for (const auto& [what, n] : counts) INFO(what << ": " << n);
  CHECK(counts["write"] > 0);
}

// The `map` read path replies with pointers into the mapping, which the
// kernel copies from after Map returned. A truncate that frees the blocks in
// that window must not let another user's file have them before the copy:
// the reader would receive that user's bytes (issue 11: on the old code
// this returned whole 1 MiB pieces of the other user's marker). Tight on
// space, so the other user's files take the freed blocks at once.
TEST_CASE("mount: a read never shows another user's bytes while its file is truncated and "
          "rewritten", "[mount]") {
  NVFS_REQUIRE_FUSE();
  const std::string options = GENERATE(as<std::string>{}, "allow_other", "allow_other,cache=page");
  INFO("options: " << options);
  const bool page_cache = options.find("cache=page") != std::string::npos;
  // One 1 MiB file read and rewritten, 1.5 MiB free besides: on the old
  // code 8-27 of ~2500 reads in 6 s held the marker (cache=none).
  constexpr size_t kFile = kMiB, kChunk = kMiB;
  constexpr uint64_t kFree = 3 * kMiB / 2;
  constexpr double kSeconds = 6;
  MountedFs m(64 * kMiB);
  m.Start(options);
  REQUIRE(mkdir(m.path("shared").c_str(), 01777) == 0);
  REQUIRE(chmod(m.path("shared").c_str(), 01777) == 0);
  const std::string victim(kChunk, 'V');
  {
    Fd fd(m.path("victim"), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    for (size_t off = 0; off < kFile; off += kChunk) {
      REQUIRE(pwrite(fd.get(), victim.data(), kChunk, static_cast<off_t>(off)) == kChunk);
    }
  }
  // Leave kFree: the other user's 1 MiB files and the rewrite compete for
  // the blocks each truncate frees.
  {
    const struct statvfs sv = StatFs(m.dir());
    const uint64_t free_bytes = uint64_t{sv.f_bavail} * sv.f_frsize;
    REQUIRE(free_bytes > kFree);
    Fd fd(m.path("filler"), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd.ok());
    const std::string zeros(kChunk, 'f');
    uint64_t left = free_bytes - kFree;
    for (uint64_t off = 0; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kChunk));
      REQUIRE(pwrite(fd.get(), zeros.data(), n, static_cast<off_t>(off)) == static_cast<ssize_t>(n));
      off += n;
      left -= n;
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kSeconds);
  // The other user: 1 MiB files of 'M', created and removed in a loop.
  int other_exit = -1;
  std::thread other([&] {
    const std::string marker(kChunk, 'M');
    const std::string dir = m.path("shared");
    other_exit = RunInChild([&]() -> int {
      if (!BecomeNobody()) {
        return 100;
      }
      int files = 0;
      while (std::chrono::steady_clock::now() < deadline) {
        const std::string name = dir + "/m" + std::to_string(files++ % 2);
        const int fd = open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) return 101;
        const ssize_t n = write(fd, marker.data(), marker.size());
        close(fd);
        if (n < 0 && errno != ENOSPC) return 102;
        if (unlink(name.c_str()) != 0) return 103;
      }
      return files > 0 ? 0 : 104;
    }, static_cast<unsigned>(kSeconds + 30));
  });
  ThreadErrors errors;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, foreign{0}, rewrites{0}, bytes{0};
  std::thread rewriter([&] {
    Fd fd(m.path("victim"), O_RDWR);
    if (!fd.ok()) return errors.Add("open victim for rewriting");
    while (!stop.load(std::memory_order_relaxed)) {
      if (ftruncate(fd.get(), 0) != 0) return errors.Add("ftruncate");
      for (size_t off = 0; off < kFile; off += kChunk) {
        if (pwrite(fd.get(), victim.data(), kChunk, static_cast<off_t>(off)) < 0 &&
            errno != ENOSPC) {
          return errors.Add("pwrite");
        }
      }
      rewrites.fetch_add(1, std::memory_order_relaxed);
    }
  });
  std::thread reader([&] {
    Fd fd(m.path("victim"), O_RDONLY);
    if (!fd.ok()) return errors.Add("open victim for reading");
    std::string buf(kChunk, '\0');
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      const off_t off = static_cast<off_t>(i % (kFile / kChunk) * kChunk);
      // With the page cache, drop the range first, so each read is a fill.
      if (page_cache) (void)posix_fadvise(fd.get(), off, kChunk, POSIX_FADV_DONTNEED);
      const ssize_t n = pread(fd.get(), buf.data(), kChunk, off);
      if (n < 0) return errors.Add("pread");
      // The victim's own bytes, or zeros (a page-cache fill cut short by
      // the truncate): never anything else.
      for (ssize_t k = 0; k < n; ++k) {
        if (buf[k] != 'V' && buf[k] != '\0') {
          foreign.fetch_add(1, std::memory_order_relaxed);
          break;
        }
      }
      reads.fetch_add(1, std::memory_order_relaxed);
      bytes.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    }
  });
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  reader.join();
  rewriter.join();
  other.join();
  errors.Check();
  CHECK(other_exit == 0);
  INFO("reads: " << reads << " (" << bytes / kMiB << " MiB), rewrites: " << rewrites);
  CHECK(reads > 20);  // enough to have raced (a loaded machine did 84 in the window)
  CHECK(rewrites > 2);
  CHECK(foreign == 0);
  StopAndCheck(m);
}

}  // namespace
}  // namespace nvfs::test
