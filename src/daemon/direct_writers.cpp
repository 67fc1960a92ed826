// Direct writers' grace periods, the daemon's side (direct_writers.hpp).
//
// The rule (doc/integrity.md section 11) is the read path's Dekker pair
// turned around. A writer makes its thread's gen odd, fences, and only then
// loads its file's slot seq and the namespace's identity; it stores only if
// both are what its runs were given for. The daemon moves the slot seq
// before it changes a file's mapping, and Start() fences before it reads
// the gens. So a writer that Start() did not see inside loads the moved
// seq and stores nothing into the old runs, and one it saw inside is waited
// out: its gen moves when its store and flush are done.
#include "daemon/direct_writers.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <linux/membarrier.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "nvfs/format.hpp"
#include "nvfs/paths.hpp"

namespace nvfs::direct {

NamespaceIdentity IdentityAt(const std::byte* base) {
  NamespaceIdentity id{};
  std::memcpy(id.uuid, base + offsetof(format::SuperStatic, uuid), sizeof id.uuid);
  std::memcpy(&id.mount_count,
              base + format::kSuperDynamicOffset + offsetof(format::SuperDynamic, mount_count),
              sizeof id.mount_count);
  return id;
}

std::string WritersPath(const uint8_t uuid[16]) {
  std::string path = std::string(kSocketDir) + "/writers-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(hex, sizeof hex, "%02x", uuid[i]);
    path += hex;
  }
  return path;
}

uint64_t ProcessStartTime(uint64_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%" PRIu64 "/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // "PID (COMM) STATE ..." : COMM may hold anything, so fields are counted
  // from its closing parenthesis, the last one. starttime is field 22.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  // p[1] is a space; field 3 (state) follows.
  int field = 2;
  for (++p; *p != '\0'; ++p) {
    if (*p != ' ') continue;
    if (++field == 22) return std::strtoull(p + 1, nullptr, 10);
  }
  return 0;
}

bool ProcessAlive(uint64_t pid, uint64_t start_time) {
  if (pid == 0) return false;
  const uint64_t now = ProcessStartTime(pid);
  return now != 0 && now == start_time;
}

// DIR/writers-UUID.owners: who each page was given to, by which mount. The
// daemons' own (root's, 0600, never passed to a client), so that no
// process can make a page seem another's: a page's own pid, start time and
// mount count are written too, but only for a daemon of an earlier build,
// and never believed.
struct OwnersFile {
  uint64_t magic;  // kOwnersMagic
  uint32_t version;
  uint32_t page_count;  // kDirectWriterPages
  struct Owner {
    uint64_t pid;  // 0: never given
    uint64_t start_time;
    uint64_t mount_count;
  } owner[kDirectWriterPages];
};
constexpr uint64_t kOwnersMagic = 0x73726e776f2d766eULL;  // "nv-ownrs"
constexpr uint32_t kOwnersVersion = 1;
constexpr size_t kOwnersBytes = 4096;
static_assert(sizeof(OwnersFile) <= kOwnersBytes);

namespace {

struct Mapped {
  int fd = -1;
  void* map = MAP_FAILED;
  size_t bytes = 0;
  ~Mapped() {
    if (map != MAP_FAILED) munmap(map, bytes);
    if (fd >= 0) close(fd);
  }
};

constexpr size_t kFileBytes = size_t{kDirectWriterPages + 1} * sizeof(DirectWriterPage);

// Opens and maps the writers' file: made when `create`, else only if it
// exists (false, errno ENOENT, when it does not). It must be root's regular
// file, 0600, of the right size and header.
bool MapWriters(const std::string& path, bool create, Mapped* m, std::string* why) {
  const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | (create ? O_CREAT : 0);
  m->fd = open(path.c_str(), flags, 0600);
  if (m->fd < 0) {
    *why = path + ": " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (fstat(m->fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    *why = path + ": not a regular file of the daemon's user, mode 0600";
    errno = EPERM;
    return false;
  }
  const bool fresh = st.st_size == 0;
  if (fresh && ftruncate(m->fd, static_cast<off_t>(kFileBytes)) != 0) {
    *why = path + ": cannot size it: " + std::strerror(errno);
    return false;
  }
  if (!fresh && static_cast<uint64_t>(st.st_size) != kFileBytes) {
    *why = path + ": not a writers' file of this version (its size)";
    errno = EINVAL;
    return false;
  }
  m->bytes = kFileBytes;
  m->map = mmap(nullptr, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
  if (m->map == MAP_FAILED) {
    *why = path + ": cannot map it: " + std::strerror(errno);
    return false;
  }
  auto* header = static_cast<DirectWritersHeader*>(m->map);
  if (fresh) {
    header->magic = kDirectWritersMagic;
    header->version = kDirectWritersVersion;
    header->page_count = kDirectWriterPages;
  } else if (header->magic != kDirectWritersMagic || header->version != kDirectWritersVersion ||
             header->page_count != kDirectWriterPages) {
    *why = path + ": not a writers' file of this version";
    errno = EINVAL;
    return false;
  }
  return true;
}

DirectWriterPage* PagesOf(void* map) {
  return reinterpret_cast<DirectWriterPage*>(static_cast<std::byte*>(map) + sizeof(DirectWriterPage));
}

std::string OwnersPath(const std::string& writers_path) { return writers_path + ".owners"; }

// Opens and maps the owners' file beside `writers`: made when `create`
// (with what the writers' pages say, once: the file of an earlier build).
bool MapOwners(const std::string& path, bool create, const DirectWriterPage* pages, Mapped* m,
               std::string* why) {
  const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | (create ? O_CREAT : 0);
  m->fd = open(path.c_str(), flags, 0600);
  if (m->fd < 0) {
    *why = path + ": " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (fstat(m->fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    *why = path + ": not a regular file of the daemon's user, mode 0600";
    errno = EPERM;
    return false;
  }
  const bool fresh = st.st_size == 0;
  if ((fresh && ftruncate(m->fd, static_cast<off_t>(kOwnersBytes)) != 0) ||
      (!fresh && static_cast<uint64_t>(st.st_size) != kOwnersBytes)) {
    *why = path + ": not an owners' file of this version (its size)";
    errno = EINVAL;
    return false;
  }
  m->bytes = kOwnersBytes;
  m->map = mmap(nullptr, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
  if (m->map == MAP_FAILED) {
    *why = path + ": cannot map it: " + std::strerror(errno);
    return false;
  }
  auto* owners = static_cast<OwnersFile*>(m->map);
  if (fresh) {
    for (uint32_t p = 0; p < kDirectWriterPages && pages != nullptr; ++p) {
      owners->owner[p] = {pages[p].pid, pages[p].start_time, pages[p].mount_count};
    }
    owners->magic = kOwnersMagic;
    owners->version = kOwnersVersion;
    owners->page_count = kDirectWriterPages;
  } else if (owners->magic != kOwnersMagic || owners->version != kOwnersVersion ||
             owners->page_count != kDirectWriterPages) {
    *why = path + ": not an owners' file of this version";
    errno = EINVAL;
    return false;
  }
  return true;
}

// Who page p is: the owners' file's record, or (no such file: a daemon of
// an earlier build) the page's own words.
OwnersFile::Owner OwnerOf(const OwnersFile* owners, const DirectWriterPage* pages, uint32_t p) {
  if (owners != nullptr) return owners->owner[p];
  return {pages[p].pid, pages[p].start_time, pages[p].mount_count};
}

// A shared lock on byte 0 while a daemon has the file open (released with
// its descriptor): RemoveIdleWriterFiles leaves such a file alone.
bool HoldInUse(int fd) {
  struct flock lk {};
  lk.l_type = F_RDLCK;
  lk.l_whence = SEEK_SET;
  lk.l_start = 0;
  lk.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &lk) == 0;
}

bool AllGone(const OwnersFile* owners, const DirectWriterPage* pages) {
  for (uint32_t p = 0; p < kDirectWriterPages; ++p) {
    const OwnersFile::Owner o = OwnerOf(owners, pages, p);
    if (ProcessAlive(o.pid, o.start_time)) return false;
  }
  return true;
}

// The owners' file beside the writers' file at `path`, mapped into `m` if
// there is one (null if not).
const OwnersFile* ExistingOwners(const std::string& path, Mapped* m) {
  std::string why;
  return MapOwners(OwnersPath(path), false, nullptr, m, &why) ? static_cast<const OwnersFile*>(m->map)
                                                             : nullptr;
}

}  // namespace

void RemoveIdleWriterFiles() {
  DIR* dir = opendir(kSocketDir);
  if (dir == nullptr) return;
  int looked = 0;
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, "writers-", 8) != 0 || ++looked > 4096) continue;
    const std::string path = std::string(kSocketDir) + "/" + e->d_name;
    Mapped m;
    std::string why;
    if (!MapWriters(path, false, &m, &why)) continue;
    struct flock lk {};
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    lk.l_start = 0;
    lk.l_len = 1;
    // Held exclusively while it is looked at: a daemon that opens it now
    // waits for nothing (its own lock is taken after) and makes it anew.
    if (fcntl(m.fd, F_OFD_SETLK, &lk) != 0) continue;  // a daemon has it
    Mapped o;
    if (AllGone(ExistingOwners(path, &o), PagesOf(m.map))) {
      unlink(OwnersPath(path).c_str());
      unlink(path.c_str());
    }
  }
  closedir(dir);
}

std::unique_ptr<Writers> Writers::Open(const uint8_t uuid[16], uint64_t mount_count,
                                       std::string* why) {
  Mapped m;
  const std::string path = WritersPath(uuid);
  // Locked, then still the file at the path: a cleanup that unlinked it
  // between the open and the lock is not followed (the file is made anew).
  for (int attempt = 0;; ++attempt) {
    if (!MapWriters(path, true, &m, why)) return nullptr;
    struct stat named {}, held {};
    if (HoldInUse(m.fd) && stat(path.c_str(), &named) == 0 && fstat(m.fd, &held) == 0 &&
        named.st_ino == held.st_ino && named.st_dev == held.st_dev) {
      break;
    }
    if (attempt == 3) {
      *why = path + ": cannot hold it";
      return nullptr;
    }
    m.~Mapped();
    new (&m) Mapped;
  }
  Mapped o;
  if (!MapOwners(OwnersPath(path), true, PagesOf(m.map), &o, why)) return nullptr;
  std::unique_ptr<Writers> w(new Writers);
  w->owners_ = static_cast<OwnersFile*>(o.map);
  w->owners_map_ = o.map;
  o.map = MAP_FAILED;
  w->path_ = WritersPath(uuid);
  w->fd_ = m.fd;
  w->map_ = m.map;
  w->map_bytes_ = m.bytes;
  w->pages_ = PagesOf(m.map);
  w->mount_count_ = mount_count;
  m.fd = -1;
  m.map = MAP_FAILED;
  return w;
}

void Writers::RemoveIfIdle() {
  std::lock_guard lock(mu_);
  if (AllGone(owners_, pages_)) {
    unlink(OwnersPath(path_).c_str());
    unlink(path_.c_str());
  }
}

Writers::~Writers() {
  if (owners_map_ != nullptr) munmap(owners_map_, kOwnersBytes);
  if (map_ != nullptr) munmap(map_, map_bytes_);
  if (fd_ >= 0) close(fd_);
}

bool Writers::OfThisMount(uint32_t p) const {
  return owners_->owner[p].pid != 0 && owners_->owner[p].mount_count == mount_count_;
}

uint64_t Writers::Assign(uint64_t pid) {
  const uint64_t start = ProcessStartTime(pid);
  if (start == 0) return 0;
  std::lock_guard lock(mu_);
  // The process's own page again, if it has one (a new proof after a change
  // of credentials or a new connection): as it was, its threads' slots
  // and counts included. A page per proof would leave the old ones the
  // process's while it lives (150 changes of credentials took all 128).
  // Who owns a page of this mount is the daemon's own record, never the
  // page's words, which its process can write.
  for (uint32_t p = 0; p < kDirectWriterPages; ++p) {
    const OwnersFile::Owner& o = owners_->owner[p];
    if (o.pid == pid && o.start_time == start && o.mount_count == mount_count_) {
      return uint64_t{p + 1} * sizeof(DirectWriterPage);
    }
  }
  for (uint32_t p = 0; p < kDirectWriterPages; ++p) {
    DirectWriterPage& page = pages_[p];
    // A page stays its process's for as long as the process lives (it may
    // store until it exits, whatever became of its connection): pages of
    // earlier mounts included, as their daemons recorded them.
    if (ProcessAlive(owners_->owner[p].pid, owners_->owner[p].start_time)) continue;
    // A pending grace that saw one of its threads inside sees the process
    // gone (Over), or the gen reset here moved.
    for (DirectWriterThread& t : page.threads) {
      t.owner.store(0, std::memory_order_relaxed);
      t.gen.store(0, std::memory_order_relaxed);
    }
    for (auto& d : page.dirty) d.store(0, std::memory_order_relaxed);
    page.maps.store(0, std::memory_order_relaxed);
    // (The page's own words, for a daemon of an earlier build only.)
    page.pid = pid;
    page.start_time = start;
    page.mount_count = mount_count_;
    owners_->owner[p] = {pid, start, mount_count_};
    std::atomic_thread_fence(std::memory_order_release);
    return uint64_t{p + 1} * sizeof(DirectWriterPage);
  }
  return 0;
}

bool BarrierWithWriters() {
  static const bool test_fails = [] {
    const char* v = secure_getenv("NVFS_TEST_MEMBARRIER_FAILS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (!test_fails && syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0) return true;
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    std::fprintf(stderr,
                 "nvfs: membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) failed: blocks freed "
                 "while direct writers live are held until it works\n");
  }
  return false;
}

// A ticket records nothing: the writers are scanned when a Completed()
// first asks about it. A scan made later than the change it covers sees
// every writer that was inside a store then and is still inside (or the
// gen it has moved on to since); one that left meanwhile is done; one that
// entered after the change loads the moved seq. So a late scan is as good
// as one at the change, and one scan, with one barrier, serves every
// ticket taken since the one before (a truncation frees many runs).
void Writers::SkipTo(uint64_t ticket) {
  std::lock_guard lock(mu_);
  last_ticket_ = scanned_ = ticket;
}

uint64_t Writers::Start() {
  std::lock_guard lock(mu_);
  return ++last_ticket_;
}

bool Writers::Over(const Inside& i) {
  const DirectWriterPage& page = pages_[i.page];
  if (page.threads[i.thread].gen.load(std::memory_order_acquire) != i.gen) return true;
  return !ProcessAlive(owners_->owner[i.page].pid, owners_->owner[i.page].start_time);
}

bool Writers::AnyLiveWriter() const {
  for (uint32_t p = 0; p < kDirectWriterPages; ++p) {
    if (OfThisMount(p) && ProcessAlive(owners_->owner[p].pid, owners_->owner[p].start_time)) {
      return true;
    }
  }
  return false;
}

uint64_t Writers::Completed() {
  std::lock_guard lock(mu_);
  // Every change behind these tickets (a slot seq moved, stored before
  // the ticket was taken) before the loads of the gens, here and in every
  // writer's thread: without the barrier, no scan (no progress) while a
  // process that owns a page of this mount lives. With none, there is no
  // writer to order: one given a page later (Assign, under mu_, after
  // this) learns of it through the daemon's reply, after every change
  // behind these tickets.
  if (scanned_ < last_ticket_ && (BarrierWithWriters() || !AnyLiveWriter())) {
    std::vector<Inside> inside;
    // This mount's writers: one of an earlier mount stores nothing since
    // its guard (WaitForEarlierWriters) let this mount serve.
    for (uint32_t p = 0; p < kDirectWriterPages; ++p) {
      const DirectWriterPage& page = pages_[p];
      if (!OfThisMount(p)) continue;
      for (uint32_t t = 0; t < kDirectWriterThreads; ++t) {
        const uint64_t gen = page.threads[t].gen.load(std::memory_order_acquire);
        if ((gen & 1) != 0) inside.push_back({p, t, gen});
      }
    }
    if (!inside.empty()) pending_.push_back({scanned_ + 1, last_ticket_, std::move(inside)});
    scanned_ = last_ticket_;
  }
  while (!pending_.empty()) {
    Pending& front = pending_.front();
    std::erase_if(front.inside, [&](const Inside& i) { return Over(i); });
    if (!front.inside.empty()) return front.first - 1;
    pending_.pop_front();
  }
  return scanned_;
}

bool WaitForEarlierWriters(const uint8_t uuid[16], uint64_t mount_count, int seconds,
                           std::string* why) {
  Mapped m;
  std::string open_why;
  if (!MapWriters(WritersPath(uuid), false, &m, &open_why)) {
    if (errno == ENOENT) return true;  // no writer ever: nothing to wait for
    *why = open_why;
    return false;
  }
  // This mount's mount_count, stored before, ordered before the loads below
  // (and a barrier in every writer's thread): a writer that was not inside
  // by now sees it and stores nothing. Without the barrier, a live writer
  // of an earlier mount may yet store: the mount waits for it to end.
  const bool ordered = BarrierWithWriters();
  const DirectWriterPage* pages = PagesOf(m.map);
  Mapped o;
  const OwnersFile* owners = ExistingOwners(WritersPath(uuid), &o);
  timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += seconds;
  const auto past = [&] {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > deadline.tv_sec ||
           (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec);
  };
  for (uint32_t p = 0; p < kDirectWriterPages; ++p) {
    const DirectWriterPage& page = pages[p];
    const OwnersFile::Owner owner = OwnerOf(owners, pages, p);
    if (owner.pid == 0 || owner.mount_count == mount_count) continue;
    // Writable direct maps: their pages stay on the files' blocks until the
    // process's listener, finding its daemon gone, takes them off.
    while (page.maps.load(std::memory_order_acquire) != 0 && ProcessAlive(owner.pid, owner.start_time)) {
      if (past()) {
        *why = "process " + std::to_string(owner.pid) +
               ", which maps files of an earlier mount of this namespace for writing, is "
               "stopped: end it (or let it go on) before mounting";
        return false;
      }
      const timespec pause{0, 1000000};
      nanosleep(&pause, nullptr);
    }
    // Without the barrier, a writer that lives may be about to store.
    while (!ordered && ProcessAlive(owner.pid, owner.start_time)) {
      if (past()) {
        *why = "process " + std::to_string(owner.pid) +
               ", a direct writer of an earlier mount of this namespace, still runs and the "
               "kernel refused the barrier that orders its stores (membarrier): end it before "
               "mounting";
        return false;
      }
      const timespec pause{0, 1000000};
      nanosleep(&pause, nullptr);
    }
    for (uint32_t t = 0; t < kDirectWriterThreads; ++t) {
      const uint64_t gen = page.threads[t].gen.load(std::memory_order_acquire);
      if ((gen & 1) == 0) continue;
      for (;;) {
        if (page.threads[t].gen.load(std::memory_order_acquire) != gen ||
            !ProcessAlive(owner.pid, owner.start_time)) {
          break;
        }
        if (past()) {
          *why = "process " + std::to_string(owner.pid) +
                 ", a direct writer of an earlier mount of this namespace, is stopped inside a "
                 "store: end it (or let it go on) before mounting";
          return false;
        }
        const timespec pause{0, 1000000};
        nanosleep(&pause, nullptr);
      }
    }
  }
  return true;
}

}  // namespace nvfs::direct
