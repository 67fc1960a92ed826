// The libpmem2 backend: the real mapping of a namespace.
#include <fcntl.h>
#include <libpmem2.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/falloc.h>
#include <linux/magic.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <fstream>
#include <sstream>
#include <string>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "nvfs/media.hpp"

namespace nvfs {

const char* GranularityName(Granularity g) {
  switch (g) {
    case Granularity::kByte: return "byte";
    case Granularity::kCacheLine: return "cache line";
    case Granularity::kPage: return "page";
    case Granularity::kMemory: return "memory (tmpfs)";
  }
  return "?";
}

void Media::CheckWrite(uint64_t offset, size_t len) const {
  const uint64_t size = this->size();
  if (read_only_ || offset > size || len > size - offset) {
    std::fprintf(stderr,
                 "nvfs: BUG: media write of %zu bytes at offset %" PRIu64
                 " outside a %s namespace of %" PRIu64 " bytes\n",
                 len, offset, read_only_ ? "read-only" : "writable", size);
    std::abort();
  }
}

namespace media_detail {
constinit thread_local FaultPoint* fault_point = nullptr;
}  // namespace media_detail

namespace {

// The mappings the SIGBUS handler recognises: a fixed table, written under
// mappings_mu (open and close), read by the handler without a lock.
constexpr int kMaxMappings = 64;
struct MappingSlot {
  std::atomic<uintptr_t> base{0};
  std::atomic<uint64_t> size{0};
  std::atomic<uint64_t> lost{0};  // pages replaced by SubstituteLostPage
};
MappingSlot mappings[kMaxMappings];
std::mutex mappings_mu;
std::atomic<uint64_t> media_errors{0};
std::atomic<uint64_t> last_error_offset{UINT64_MAX};

// A fault outside every recovery point (metadata: a directory block, an
// inode table page, a bitmap, a pointer block, the journal, met by code that
// holds locks and a transaction and so cannot be jumped out of). The page
// (or, where the mapping cannot be split there, the 2 MiB around it) is
// replaced by private anonymous memory filled with all ones, and the
// faulting instruction runs again on it: a load reads ones, which every
// on-media object rejects (no data block is numbered ~0, no checksum or
// magic matches, an all-ones bitmap word is "in use"), so the operation
// fails as on damage; a store lands in the substitute and is lost. The
// loss is counted on the mapping (Media::LostPages), which stops every
// later commit and makes the namespace not Intact. Async-signal-safe: mmap
// and plain stores. False if the kernel refused (the process then dies).
bool SubstituteLostPage(MappingSlot& m, uintptr_t base, uintptr_t addr) {
  const uint64_t size = m.size.load(std::memory_order_relaxed);
  for (uintptr_t unit : {uintptr_t{4096}, uintptr_t{2} << 20}) {
    const uintptr_t page = addr & ~(unit - 1);
    if (page < base || page + unit > base + size) continue;
    void* p = mmap(reinterpret_cast<void*>(page), unit, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) continue;
    auto* words = static_cast<uint64_t*>(p);
    for (size_t i = 0; i < unit / sizeof(uint64_t); ++i) {
      __atomic_store_n(&words[i], ~uint64_t{0}, __ATOMIC_RELAXED);
    }
    m.lost.fetch_add(unit / 4096, std::memory_order_release);
    return true;
  }
  return false;
}

// Async-signal-safe: atomics, siglongjmp, mmap, sigaction.
void OnSigbus(int sig, siginfo_t* info, void*) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  FaultPoint* point = media_detail::fault_point;
  for (MappingSlot& m : mappings) {
    const uintptr_t base = m.base.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr - base >= m.size.load(std::memory_order_relaxed)) continue;
    media_errors.fetch_add(1, std::memory_order_relaxed);
    last_error_offset.store(addr - base, std::memory_order_relaxed);
    if (point == nullptr) {
      if (SubstituteLostPage(m, base, addr)) return;
      break;
    }
    media_detail::fault_point = point->prev;
    siglongjmp(point->env, 1);
  }
  // Not ours, or a page that could not be replaced: die of it as before.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
}

// The pages lost in the mapping at `base`.
uint64_t LostPagesOf(const std::byte* base) {
  for (const MappingSlot& m : mappings) {
    if (m.base.load(std::memory_order_acquire) == reinterpret_cast<uintptr_t>(base)) {
      return m.lost.load(std::memory_order_acquire);
    }
  }
  return 0;
}

void RegisterMapping(const std::byte* base, uint64_t size) {
  std::lock_guard lock(mappings_mu);
  static bool installed = false;
  if (!installed) {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, nullptr);
    installed = true;
  }
  for (MappingSlot& m : mappings) {
    if (m.base.load(std::memory_order_relaxed) != 0) continue;
    m.size.store(size, std::memory_order_relaxed);
    m.lost.store(0, std::memory_order_relaxed);
    m.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return;
  }
}

// The mapping at `base` grew (Media::Grow): faults in its new part are ours.
void ResizeMapping(const std::byte* base, uint64_t size) {
  std::lock_guard lock(mappings_mu);
  for (MappingSlot& m : mappings) {
    if (m.base.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(base)) {
      m.size.store(size, std::memory_order_release);
    }
  }
}

void UnregisterMapping(const std::byte* base) {
  std::lock_guard lock(mappings_mu);
  for (MappingSlot& m : mappings) {
    if (m.base.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(base)) {
      m.base.store(0, std::memory_order_release);
    }
  }
}

// Owns the file descriptor (and with it the advisory lock) and the pmem2 objects.
class Pmem2Media final : public Media {
 public:
  ~Pmem2Media() override {
    if (base_ != nullptr) UnregisterMapping(base_);
    for (auto it = grown_maps_.rbegin(); it != grown_maps_.rend(); ++it) pmem2_map_delete(&*it);
    if (map_ != nullptr) pmem2_map_delete(&map_);
    if (reservation_ != nullptr) pmem2_vm_reservation_delete(&reservation_);
    if (source_ != nullptr) pmem2_source_delete(&source_);
    if (fd_ >= 0) close(fd_);
  }

  static Result<std::unique_ptr<Media>> Open(const std::string& path,
                                             const MediaOptions& options);

  void Store(uint64_t offset, const void* src, size_t len) override {
    CheckWrite(offset, len);
    std::memcpy(base_ + offset, src, len);
    CountStored(len);
  }
  void Store64(uint64_t offset, uint64_t value) override {
    CheckWrite(offset, 8);
    if (offset % 8 != 0) {
      std::fprintf(stderr, "nvfs: BUG: unaligned 8-byte store at %" PRIu64 "\n", offset);
      std::abort();
    }
    __atomic_store_n(reinterpret_cast<uint64_t*>(base_ + offset), value, __ATOMIC_RELAXED);
    CountStored(8);
  }
  void Fill(uint64_t offset, int byte, size_t len) override {
    CheckWrite(offset, len);
    std::memset(base_ + offset, byte, len);
    CountStored(len);
  }
  void Flush(uint64_t offset, size_t len) override {
    CheckWrite(offset, len);
    if (len != 0) flush_(base_ + offset, len);
  }
  void Drain() override { drain_(); }
  void StoreFlush(uint64_t offset, const void* src, size_t len) override {
    CheckWrite(offset, len);
    memcpy_(base_ + offset, src, len, PMEM2_F_MEM_NODRAIN);
    CountStored(len);
  }

  Status Back(uint64_t offset, uint64_t len) override;
  Status Grow(uint64_t new_size) override;
  uint64_t reserved() const override { return reservation_ != nullptr ? reserved_ : size(); }
  uint64_t HostAvailable() const override;
  bool Backed(uint64_t offset, uint64_t len) const override {
    if (backed_whole_ || len == 0) return true;
    for (uint64_t c = offset / kBackChunk; c <= (offset + len - 1) / kBackChunk; ++c) {
      if (!ChunkBacked(c)) return false;
    }
    return true;
  }
  bool Intact() const override {
    if (LostPages() != 0) return false;
    struct stat st;
    if (!is_file_ || fstat(fd_, &st) != 0) return true;
    return static_cast<uint64_t>(st.st_size) >= size();
  }
  uint64_t LostPages() const override { return LostPagesOf(base_); }
  void EndService() override;
  void ServeThroughMount() override;
  uint64_t BackedBytes() const override {
    if (backed_whole_) return size();
    return std::min<uint64_t>(size(), backed_chunks_.load(std::memory_order_relaxed) * kBackChunk);
  }

 private:
  Pmem2Media() = default;
  // Marks the chunks wholly inside a data extent of the file (SEEK_DATA /
  // SEEK_HOLE) as backed; everything if the file has no hole.
  void ScanBacking(const struct stat& st);
  // Takes the lock (above Lock's definition). REQUIRES: fd_ and path_ set.
  Status Lock(bool shared, uint32_t wait_ms);
  bool serving_ = false;  // a mark is held (byte 0, or byte 1 after ServeThroughMount)
  bool mounted_mark_ = false;  // the mount mark is held (ServeThroughMount)
  // Fills bad_ranges_ from libpmem2's bad block list (none where it cannot
  // tell: no error, since a file on tmpfs has no such list).
  void ReadBadBlocks();
  bool ChunkBacked(uint64_t chunk) const {
    return (backed_[chunk / 64].load(std::memory_order_acquire) >> (chunk % 64)) & 1u;
  }
  void MarkBacked(uint64_t chunk) {
    backed_[chunk / 64].fetch_or(uint64_t{1} << (chunk % 64), std::memory_order_release);
    backed_chunks_.fetch_add(1, std::memory_order_relaxed);
  }

  // Backing (Back): a bit per kBackChunk of the namespace, set once the
  // chunk is allocated on the host; never cleared (nvfs never punches the
  // image). backed_whole_ is set at open and read-only after.
  bool is_file_ = false;
  bool backed_whole_ = true;
  std::unique_ptr<std::atomic<uint64_t>[]> backed_;  // set under back_mu_, read without it
  std::atomic<uint64_t> backed_chunks_{0};
  std::mutex back_mu_;  // serialises fallocate; a leaf lock

  int fd_ = -1;
  pmem2_source* source_ = nullptr;
  pmem2_map* map_ = nullptr;
  // MediaOptions::reserve: the address space the mapping may grow into, and
  // the maps Grow added after map_, in order (written by Grow only, which
  // one caller at a time runs; freed with the media).
  pmem2_vm_reservation* reservation_ = nullptr;
  uint64_t reserved_ = 0;
  size_t alignment_ = 0;
  std::vector<pmem2_map*> grown_maps_;
  pmem2_flush_fn flush_ = nullptr;
  pmem2_drain_fn drain_ = nullptr;
  pmem2_memcpy_fn memcpy_ = nullptr;
};

// libpmem2 returns -errno, or one of its own PMEM2_E_* codes. Debian's build
// does not export pmem2_err_to_errno, so the few codes we meet are mapped here.
int Pmem2ErrorToErrno(int ret) {
  if (ret < 0 && ret > PMEM2_E_UNKNOWN) return -ret;
  switch (ret) {
    case PMEM2_E_NOSUPP:
    case PMEM2_E_GRANULARITY_NOT_SUPPORTED:
    case PMEM2_E_SOURCE_TYPE_NOT_SUPPORTED: return ENOTSUP;
    case PMEM2_E_INVALID_FILE_TYPE: return ENODEV;
    case PMEM2_E_NO_ACCESS: return EACCES;
    case PMEM2_E_SOURCE_EMPTY: return ENOSPC;
    case PMEM2_E_IO_FAIL: return EIO;
    default: return EINVAL;
  }
}

Error Pmem2Error(const std::string& path, const char* what, int pmem2_ret) {
  const int code = Pmem2ErrorToErrno(pmem2_ret);
  return MakeError(code, "%s: %s: %s", path.c_str(), what, pmem2_errormsg());
}

// A file whose pages are tmpfs's (Granularity::kMemory).
static bool OnTmpfs(int fd) {
  struct statfs sfs;
  return fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC;
}

Result<std::unique_ptr<Media>> Pmem2Media::Open(const std::string& path,
                                                const MediaOptions& options) {
  const char* p = path.c_str();
  struct stat st;
  const bool may_create = options.grow_to != 0 && !options.read_only;
  if (stat(p, &st) != 0) {
    if (!(errno == ENOENT && may_create)) {
      if (errno == ENOENT) return MakeError(ENOENT, "%s: no such file or directory", p);
      return MakeError(errno, "%s: %s", p, std::strerror(errno));
    }
  } else if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
    return MakeError(ENODEV, "%s: not a regular file or a DAX character device", p);
  } else if (S_ISCHR(st.st_mode) && options.grow_to != 0) {
    return MakeError(EINVAL, "%s: a device cannot be created or resized; a size applies to "
                     "image files only", p);
  }

  std::unique_ptr<Pmem2Media> media(new Pmem2Media());
  media->path_ = path;
  media->read_only_ = options.read_only;
  int flags = (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NONBLOCK;
  if (may_create) flags |= O_CREAT;
  // Created owner-only: whoever can read the image reads every file in it
  // (NamespaceExposure). An existing file keeps its mode.
  media->fd_ = open(p, flags, 0600);
  if (media->fd_ < 0) {
    if (errno == EACCES || errno == EPERM || errno == EROFS) {
      return MakeError(errno, "%s: permission denied (%s access)", p,
                       options.read_only ? "read" : "read-write");
    }
    return MakeError(errno, "%s: %s", p, std::strerror(errno));
  }
  if (fstat(media->fd_, &st) != 0) return MakeError(errno, "%s: %s", p, std::strerror(errno));
  if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
    return MakeError(ENODEV, "%s: not a regular file or a DAX character device", p);
  }
  if (options.lock) {
    Status locked = media->Lock(options.read_only, options.release_wait_ms);
    if (!locked.ok()) return locked.error();
  }
  if (S_ISREG(st.st_mode) && options.grow_to > static_cast<uint64_t>(st.st_size)) {
    if (ftruncate(media->fd_, static_cast<off_t>(options.grow_to)) != 0) {
      return MakeError(errno, "%s: cannot extend to %" PRIu64 " bytes: %s", p, options.grow_to,
                       std::strerror(errno));
    }
  }

  int ret = pmem2_source_from_fd(&media->source_, media->fd_);
  if (ret != 0) {
    if (ret == PMEM2_E_INVALID_FILE_TYPE) {
      return MakeError(ENODEV, "%s: not a regular file or a DAX character device", p);
    }
    return Pmem2Error(path, "cannot use as a pmem source", ret);
  }
  size_t size = 0;
  ret = pmem2_source_size(media->source_, &size);
  if (ret != 0) return Pmem2Error(path, "cannot read size", ret);
  size_t alignment = 0;
  ret = pmem2_source_alignment(media->source_, &alignment);
  if (ret != 0) return Pmem2Error(path, "cannot read alignment", ret);
  size_t usable = alignment ? size / alignment * alignment : size;
  if (usable == 0 && options.min_size == 0) {
    // No minimum was asked for: say what the mapping needs, not "at least 0".
    return MakeError(ENOSPC, "%s: too small: %zu bytes; a mapping needs at least %zu bytes", p,
                     size, alignment ? alignment : size_t{1});
  }
  if (usable < options.min_size) {
    return MakeError(ENOSPC, "%s: too small: %zu bytes; nvfs needs at least %" PRIu64 " bytes",
                     p, size, options.min_size);
  }

  pmem2_config* config = nullptr;
  ret = pmem2_config_new(&config);
  if (ret != 0) return Pmem2Error(path, "cannot map", ret);
  std::unique_ptr<pmem2_config, int (*)(pmem2_config*)> config_owner(
      config, [](pmem2_config* c) { return pmem2_config_delete(&c); });
  // Accept any granularity: the flush functions libpmem2 picks for the mapping
  // (msync for PAGE) are the ones we use.
  ret = pmem2_config_set_required_store_granularity(config, PMEM2_GRANULARITY_PAGE);
  if (ret == 0) ret = pmem2_config_set_length(config, usable);
  media->alignment_ = alignment ? alignment : 4096;
  if (ret == 0 && !options.read_only && options.reserve > usable) {
    // Rounded to 1 GiB, a multiple of every alignment a source has.
    const uint64_t reserve = (options.reserve + (1ull << 30) - 1) >> 30 << 30;
    // Without the address space (a ulimit -v, a 32-bit host) the namespace
    // is mapped as before and cannot grow while open.
    if (pmem2_vm_reservation_new(&media->reservation_, nullptr, reserve) == 0) {
      media->reserved_ = reserve;
      ret = pmem2_config_set_vm_reservation(config, media->reservation_, 0);
    } else {
      media->reservation_ = nullptr;
    }
  }
  if (ret == 0) {
    ret = pmem2_config_set_protection(config, options.read_only
                                                  ? PMEM2_PROT_READ
                                                  : PMEM2_PROT_READ | PMEM2_PROT_WRITE);
  }
  if (ret != 0) return Pmem2Error(path, "cannot map", ret);
  ret = pmem2_map_new(&media->map_, config, media->source_);
  if (ret != 0) return Pmem2Error(path, "cannot be mapped", ret);

  media->base_ = static_cast<std::byte*>(pmem2_map_get_address(media->map_));
  media->size_ = pmem2_map_get_size(media->map_);
  switch (pmem2_map_get_store_granularity(media->map_)) {
    case PMEM2_GRANULARITY_BYTE: media->granularity_ = Granularity::kByte; break;
    case PMEM2_GRANULARITY_CACHE_LINE: media->granularity_ = Granularity::kCacheLine; break;
    default: media->granularity_ = Granularity::kPage; break;
  }
  media->flush_ = pmem2_get_flush_fn(media->map_);
  media->drain_ = pmem2_get_drain_fn(media->map_);
  media->memcpy_ = pmem2_get_memcpy_fn(media->map_);
  if (media->granularity_ == Granularity::kPage && OnTmpfs(media->fd_) &&
      std::getenv("PMEM2_FORCE_GRANULARITY") == nullptr) {
    media->granularity_ = Granularity::kMemory;
    media->flush_ = [](const void*, size_t) {};
    media->drain_ = [] { std::atomic_thread_fence(std::memory_order_seq_cst); };
    media->memcpy_ = [](void* dst, const void* src, size_t len, unsigned) {
      return std::memcpy(dst, src, len);
    };
  }
  if (!options.read_only) media->ScanBacking(st);
  media->is_file_ = S_ISREG(st.st_mode);
  media->ReadBadBlocks();
  RegisterMapping(media->base_, media->size_);
  return std::unique_ptr<Media>(std::move(media));
}

// The lock (MediaOptions::lock) is flock, exclusive for writers and shared
// for readers, held until the descriptor closes; and beside it one of two
// marks, open-file-description locks (F_OFD_SETLK, write or read):
//   byte 0, "serving": the holder is using the namespace (mkfs, fsck, a
//     daemon until it has mounted);
//   byte 1, "serving through a mount": a daemon whose FUSE mount has the
//     namespace's absolute path as its source (ServeThroughMount takes it,
//     then drops byte 0, so one of them is always held).
// EndService drops both as soon as the holder begins to shut down. An
// opener that finds the flock taken looks at the marks: byte 0 held, or
// byte 1 held and the mount still in /proc/self/mountinfo: the namespace is
// in use (EBUSY at once). Otherwise its holder is on its way out (a daemon
// between the unmount, which returns before the daemon has even seen its
// session end, and its exit), and the opener waits for it
// (MediaOptions::release_wait_ms), saying so once on stderr if it takes
// longer than a second.
namespace {

// True if the F_OFD lock on `byte` that an opener of the given kind would
// take conflicts with one held.
bool MarkHeld(int fd, bool shared, off_t byte) {
  struct flock probe {};
  probe.l_type = shared ? F_RDLCK : F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = byte;
  probe.l_len = 1;
  return fcntl(fd, F_OFD_GETLK, &probe) != 0 || probe.l_type != F_UNLCK;
}

bool SetMark(int fd, short type, off_t byte) {
  struct flock mark {};
  mark.l_type = type;
  mark.l_whence = SEEK_SET;
  mark.l_start = byte;
  mark.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &mark) == 0;
}

// mountinfo writes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& field) {
  std::string out;
  const auto octal = [&](size_t at) { return field[at] >= '0' && field[at] <= '7'; };
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1) && octal(i + 2) &&
        octal(i + 3)) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// True if a FUSE file system whose source is `source` is mounted (in this
// process's mount namespace). Unreadable mountinfo: true (refuse at once,
// as before there was a mount mark).
bool FuseMountOf(const std::string& source) {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return true;
  std::string line;
  while (std::getline(in, line)) {
    // ... optional fields - FSTYPE SOURCE SUPER_OPTIONS
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    std::string type, src;
    if (!(rest >> type >> src)) continue;
    if ((type == "fuse" || type.rfind("fuse.", 0) == 0) && Unescape(src) == source) return true;
  }
  return false;
}

}  // namespace

Status Pmem2Media::Lock(bool shared, uint32_t wait_ms) {
  const char* p = path_.c_str();
  const int op = (shared ? LOCK_SH : LOCK_EX) | LOCK_NB;
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + std::chrono::milliseconds(wait_ms);
  bool said = false;
  char resolved[PATH_MAX];
  const std::string source = realpath(p, resolved) != nullptr ? resolved : path_;
  while (flock(fd_, op) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return MakeError(errno, "%s: cannot lock: %s", p, std::strerror(errno));
    if (MarkHeld(fd_, shared, 0) || (MarkHeld(fd_, shared, 1) && FuseMountOf(source))) {
      return MakeError(EBUSY, "%s: in use (mounted by nvfs, or mkfs/fsck running on it)", p);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return MakeError(EBUSY, "%s: still in use %.1f s later (the process that was releasing "
                       "it has not)", p, wait_ms / 1000.0);
    }
    // Said once the wait is long enough to notice: the usual one, for a
    // daemon an umount has just ended, is a few milliseconds, and scripts
    // (fstests compares output) mount and check right after umount.
    if (!said && std::chrono::steady_clock::now() >= started + std::chrono::seconds(1)) {
      std::fprintf(stderr, "nvfs: %s: waiting for the nvfs process that is releasing it\n", p);
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  serving_ = SetMark(fd_, shared ? F_RDLCK : F_WRLCK, 0);  // else: openers wait, then fail
  return Status::Ok();
}

void Pmem2Media::ServeThroughMount() {
  if (!serving_) return;
  // Byte 1 before byte 0 goes: never a moment with neither.
  if (!SetMark(fd_, read_only() ? F_RDLCK : F_WRLCK, 1)) return;  // keep byte 0
  mounted_mark_ = true;
  (void)SetMark(fd_, F_UNLCK, 0);
}

void Pmem2Media::EndService() {
  if (!serving_) return;
  (void)SetMark(fd_, F_UNLCK, 0);
  if (mounted_mark_) (void)SetMark(fd_, F_UNLCK, 1);
  serving_ = false;
  mounted_mark_ = false;
}

void Pmem2Media::ScanBacking(const struct stat& st) {
  backed_whole_ = !S_ISREG(st.st_mode) ||  // a DAX device has no holes
                  static_cast<uint64_t>(st.st_blocks) * 512 >= size_;
  // A file that may grow keeps the map of its chunks from the start: what a
  // grow adds is a hole until backed.
  const bool may_grow = S_ISREG(st.st_mode) && reservation_ != nullptr;
  if (backed_whole_ && !may_grow) return;
  const uint64_t chunks = (size_ + kBackChunk - 1) / kBackChunk;
  const uint64_t capacity = (std::max<uint64_t>(size_, reserved_) + kBackChunk - 1) / kBackChunk;
  backed_.reset(new std::atomic<uint64_t>[(capacity + 63) / 64]());
  if (backed_whole_) {
    for (uint64_t c = 0; c < chunks; ++c) MarkBacked(c);
    backed_whole_ = false;
    return;
  }
  off_t at = 0;
  while (static_cast<uint64_t>(at) < size_) {
    const off_t data = lseek(fd_, at, SEEK_DATA);
    if (data < 0) break;  // ENXIO: no data past `at`; anything else: assume holes
    off_t hole = lseek(fd_, data, SEEK_HOLE);
    if (hole < 0 || static_cast<uint64_t>(hole) > size_) hole = static_cast<off_t>(size_);
    for (uint64_t c = (static_cast<uint64_t>(data) + kBackChunk - 1) / kBackChunk;
         c < chunks && std::min((c + 1) * kBackChunk, size_) <= static_cast<uint64_t>(hole);
         ++c) {
      MarkBacked(c);
    }
    at = hole;
  }
}

// Order: the file is extended, the new part mapped into the reservation
// right after the mapping (one more pmem2 map: the same source, the same
// flush functions, which take addresses), the SIGBUS handler told, and size
// moved last, with release, so no one is handed an offset in the new part
// before it is mapped.
Status Pmem2Media::Grow(uint64_t new_size) {
  const uint64_t old_size = size();
  new_size = new_size / alignment_ * alignment_;
  if (new_size <= old_size) return Status::Ok();
  if (read_only_) return MakeError(EROFS, "%s: read-only", path_.c_str());
  if (reservation_ == nullptr || new_size > reserved_) {
    return MakeError(ENOSPC, "%s: cannot grow to %" PRIu64 " bytes while mounted: the mount "
                     "reserved address space for %" PRIu64 " (remount, or grow it unmounted)",
                     path_.c_str(), new_size, reservation_ != nullptr ? reserved_ : old_size);
  }
  struct stat st;
  if (fstat(fd_, &st) != 0) return MakeError(errno, "%s: %s", path_.c_str(), std::strerror(errno));
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < new_size &&
      ftruncate(fd_, static_cast<off_t>(new_size)) != 0) {
    return MakeError(errno, "%s: cannot extend to %" PRIu64 " bytes: %s", path_.c_str(), new_size,
                     std::strerror(errno));
  }
  pmem2_config* config = nullptr;
  int ret = pmem2_config_new(&config);
  if (ret != 0) return Pmem2Error(path_, "cannot map", ret);
  std::unique_ptr<pmem2_config, int (*)(pmem2_config*)> config_owner(
      config, [](pmem2_config* c) { return pmem2_config_delete(&c); });
  ret = pmem2_config_set_required_store_granularity(config, PMEM2_GRANULARITY_PAGE);
  if (ret == 0) ret = pmem2_config_set_offset(config, old_size);
  if (ret == 0) ret = pmem2_config_set_length(config, new_size - old_size);
  if (ret == 0) ret = pmem2_config_set_protection(config, PMEM2_PROT_READ | PMEM2_PROT_WRITE);
  if (ret == 0) ret = pmem2_config_set_vm_reservation(config, reservation_, old_size);
  if (ret != 0) return Pmem2Error(path_, "cannot map the grown part", ret);
  pmem2_map* map = nullptr;
  ret = pmem2_map_new(&map, config, source_);
  if (ret != 0) return Pmem2Error(path_, "cannot map the grown part", ret);
  if (static_cast<const std::byte*>(pmem2_map_get_address(map)) != base_ + old_size ||
      pmem2_map_get_store_granularity(map) != pmem2_map_get_store_granularity(map_)) {
    pmem2_map_delete(&map);
    return MakeError(EINVAL, "%s: the grown part maps elsewhere or with another store granularity",
                     path_.c_str());
  }
  grown_maps_.push_back(map);
  ResizeMapping(base_, new_size);
  __atomic_store_n(&size_, new_size, __ATOMIC_RELEASE);
  return Status::Ok();
}

// Backs whole chunks (KEEP_SIZE: a file cut short under the mount stays cut,
// its lost pages keep failing as media errors rather than reading as zeros).
// A chunk the host cannot back whole is backed just where asked, so the last
// free pages of the host stay usable.
Status Pmem2Media::Back(uint64_t offset, uint64_t len) {
  if (backed_whole_ || len == 0) return Status::Ok();
  const uint64_t size = this->size();  // a grow may move it meanwhile
  if (offset > size || len > size - offset) return MakeError(EINVAL, "backing outside the namespace");
  const uint64_t first = offset / kBackChunk, last = (offset + len - 1) / kBackChunk;
  for (uint64_t c = first; c <= last; ++c) {
    if (ChunkBacked(c)) continue;
    std::lock_guard lock(back_mu_);
    if (ChunkBacked(c)) continue;
    const uint64_t start = c * kBackChunk;
    const uint64_t n = std::min(kBackChunk, size - start);
    if (fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(start), static_cast<off_t>(n)) == 0) {
      MarkBacked(c);
      continue;
    }
    if (errno == EOPNOTSUPP) {
      // The host cannot reserve space (no fallocate): nothing better to do
      // than to store and hope, as before.
      MarkBacked(c);
      continue;
    }
    const int chunk_errno = errno;
    const uint64_t from = std::max(offset, start) / 4096 * 4096;
    const uint64_t to = std::min(offset + len, start + n);
    if ((chunk_errno == ENOSPC || chunk_errno == EDQUOT) &&
        fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                  static_cast<off_t>(to - from)) == 0) {
      continue;  // backed where asked; the chunk stays unmarked
    }
    return MakeError(chunk_errno == EDQUOT ? EDQUOT : ENOSPC,
                     "%s: the host filesystem cannot back %" PRIu64 " bytes at %" PRIu64 ": %s",
                     path_.c_str(), to - from, from, std::strerror(chunk_errno));
  }
  return Status::Ok();
}

void Pmem2Media::ReadBadBlocks() {
  pmem2_badblock_context* ctx = nullptr;
  if (pmem2_badblock_context_new(&ctx, source_) != 0) return;
  pmem2_badblock bb;
  while (pmem2_badblock_next(ctx, &bb) == 0) {
    if (bb.offset < size_) {
      bad_ranges_.push_back({bb.offset, std::min<uint64_t>(bb.length, size_ - bb.offset)});
    }
  }
  pmem2_badblock_context_delete(&ctx);
}

uint64_t Pmem2Media::HostAvailable() const {
  if (backed_whole_) return kBackedWhole;
  struct statvfs sv;
  if (fstatvfs(fd_, &sv) != 0) return kBackedWhole;
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

}  // namespace

uint64_t MediaErrorCount() { return media_errors.load(std::memory_order_relaxed); }
uint64_t LastMediaErrorOffset() { return last_error_offset.load(std::memory_order_relaxed); }

Result<std::unique_ptr<Media>> OpenMedia(const std::string& path, const MediaOptions& options) {
  return Pmem2Media::Open(path, options);
}

}  // namespace nvfs
