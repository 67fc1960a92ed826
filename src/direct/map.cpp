// Direct maps (map.hpp): the registry of the process's direct maps, the
// mappers (one connection per mount, and its listener thread), and the
// installation of a map's pages.
#include "direct/map.hpp"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "direct/epoch.hpp"
#include "direct/file.hpp"
#include "direct/lazy.hpp"
#include "direct/libc.hpp"
#include "direct/credentials.hpp"
#include "direct/proof_fds.hpp"
#include "direct/protocol.hpp"
#include "direct/session.hpp"
#include "direct/transport.hpp"
#include "nvfs/direct.h"
#include "nvfs/paths.hpp"

namespace nvfs::direct {

namespace {

constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t v) { return (v + kPage - 1) & ~(kPage - 1); }

void CloseFd(int fd) {
  if (fd >= 0) libc::Get(&libc::Table::close)(fd);
}

// A descriptor registered with the proof's (proof_fds.hpp), closed unless
// the program freed its number.
void CloseProofFd(int* fd, int* slot) {
  if (ProofFdRemove(*slot)) CloseFd(*fd);
  *fd = -1;
  *slot = -1;
}

struct Mapper;
struct MappedFile;

// What a stretch of a shared map is on: a block of the namespace (its
// offset there), a hole (kDirectHole: zeros, lazy in a writable map) or
// the past-the-end page (kOnPastEnd).
struct Piece {
  uint64_t len;
  uint64_t on;
};
constexpr uint64_t kOnPastEnd = kDirectHole - 1;  // never a block's: those are page-aligned

uint64_t Advance(uint64_t on, uint64_t by) {
  return on == kDirectHole || on == kOnPastEnd ? on : on + by;
}

// Adds `p` to `out`, as one piece with the last where they continue.
void Append(std::vector<Piece>* out, Piece p) {
  if (p.len == 0) return;
  if (!out->empty() && Advance(out->back().on, out->back().len) == p.on) {
    out->back().len += p.len;
  } else {
    out->push_back(p);
  }
}

// [from, to) of `shape` (offsets from its start).
std::vector<Piece> Slice(const std::vector<Piece>& shape, uint64_t from, uint64_t to) {
  std::vector<Piece> out;
  uint64_t at = 0;
  for (const Piece& p : shape) {
    const uint64_t a = std::max(at, from), b = std::min(at + p.len, to);
    if (a < b) Append(&out, {b - a, Advance(p.on, a - at)});
    at += p.len;
  }
  return out;
}

// One direct map (or what is left of one after a partial munmap).
struct Range {
  uintptr_t addr;
  uint64_t len;
  uint64_t offset;  // in the file
  int prot;
  bool shared;      // MAP_SHARED, else MAP_PRIVATE
  uint64_t seq;     // the slot seq of the runs its pages are from
  MappedFile* file;
  // A shared map's pages, as installed ([offset, offset + len)), when
  // known (else empty): a new mapping of its pages replaces only what
  // differs, so pages that stay on their blocks keep their page tables.
  std::vector<Piece> shape{};
};

struct Runs {
  uint64_t start = 0;  // file offset of runs[0]
  uint64_t seq = 0;
  uint64_t size = 0;
  uint64_t ino = 0;
  uint32_t slot = 0;
  bool have = false;  // gathered
  std::vector<DirectRun> runs;

  // Whether they cover [offset, end) (or up to the end of the file).
  bool Cover(uint64_t offset, uint64_t end) const {
    uint64_t covered = start;
    for (const DirectRun& r : runs) covered += r.len;
    return start <= offset && covered >= std::min(end, (size + 4095) & ~uint64_t{4095});
  }
  // Whether a hole lies in [offset, end) inside the size.
  bool HoleIn(uint64_t offset, uint64_t end) const {
    end = std::min(end, (size + 4095) & ~uint64_t{4095});
    uint64_t at = start;
    for (const DirectRun& r : runs) {
      if (at >= end) break;
      if (at + r.len > offset && r.offset == kDirectHole) return true;
      at += r.len;
    }
    return false;
  }
};

struct MappedFile {
  Mapper* mapper;
  uint64_t ino;
  uint32_t slot;
  bool write;  // registered for writing: its holes inside the size get blocks
  int fd;      // the library's duplicate of the program's descriptor (the kernel's map)
  std::vector<Range*> ranges;
  // Handles (descriptors) that mapped it and are open: the daemon keeps the
  // file registered while one is, so that mapping it again asks nothing
  // when its runs are known (`known`, while the slot's seq is theirs).
  int holders = 0;
  Runs known;
};

struct Waiter {
  void* reply;
  size_t max;
  bool done = false;
  int err = 0;
};

struct Mapper {
  Session* session = nullptr;  // referenced
  int sock = -1;
  int ns_fd = -1;  // the namespace, opened for reading at the proof (MAP_PRIVATE maps)
  int sock_slot = -1;  // their entries among the proof's descriptors
  int ns_slot = -1;
  bool write_proven = false;
  char ns_path[PATH_MAX] = {};
  std::mutex io_mu;
  std::condition_variable io_cv;
  std::deque<Waiter*> waiters;  // protected by io_mu: requests sent, in order
  bool dead = false;            // protected by io_mu
  bool closing = false;         // protected by io_mu: ended by the library
  std::atomic<bool> notified{false};
  std::map<uint64_t, MappedFile*> files;  // protected by maps_mu, by inode
  // Writable shared ranges, and those being made: published in the
  // process's writers' page (its `maps`) for a later mount's guard.
  uint64_t writable = 0;  // protected by maps_mu
};

// REQUIRES: maps_mu.
void CountWritable(Mapper* m, int64_t delta) {
  m->writable = static_cast<uint64_t>(static_cast<int64_t>(m->writable) + delta);
  if (DirectWriterPage* page = m->session->writer_page.load(std::memory_order_acquire)) {
    page->maps.store(m->writable, std::memory_order_seq_cst);
  }
}

bool Writable(const Range& r) { return r.shared && (r.prot & PROT_WRITE) != 0; }

std::mutex maps_mu;
std::map<uintptr_t, Range*> ranges;  // protected by maps_mu, by address
std::vector<Mapper*> mappers;        // protected by maps_mu
std::atomic<int> range_count{0};

// --- the connection -------------------------------------------------------------

// Ends the connection's waiters with an error. REQUIRES: io_mu held.
void FailWaitersLocked(Mapper* m) {
  m->dead = true;
  for (Waiter* w : m->waiters) {
    w->err = EPIPE;
    w->done = true;
  }
  m->waiters.clear();
  m->io_cv.notify_all();
}

// Reads one message: a notification, or the reply of the oldest waiter.
// False when the connection is over.
bool ReadOne(Mapper* m) {
  ReplyHeader h{};
  int err = TransportRecvAll(m->sock, &h, sizeof h);
  if (err == 0 && (h.magic != kMagic || h.size < sizeof h)) err = EPROTO;
  if (err == 0 && h.op == kOpNotify) {
    if (h.size != sizeof h) return false;
    m->notified.store(true, std::memory_order_release);
    return true;
  }
  Waiter* w = nullptr;
  {
    std::lock_guard lock(m->io_mu);
    if (!m->waiters.empty()) w = m->waiters.front();
  }
  if (err == 0 && (w == nullptr || h.size > w->max)) err = EPROTO;
  if (err == 0) {
    std::memset(w->reply, 0, w->max);
    std::memcpy(w->reply, &h, sizeof h);
    err = TransportRecvAll(m->sock, static_cast<char*>(w->reply) + sizeof h, h.size - sizeof h);
  }
  std::lock_guard lock(m->io_mu);
  if (err != 0) {
    FailWaitersLocked(m);
    return false;
  }
  m->waiters.pop_front();
  w->done = true;
  m->io_cv.notify_all();
  return true;
}

// Sends `req` (a one-way one when reply is null). REQUIRES: io_mu held.
bool SendLocked(Mapper* m, const Request& req, int fd) {
  if (m->dead) return false;
  const ssize_t n = SendWithFd(m->sock, &req, sizeof req, fd, MSG_NOSIGNAL);
  if (n != static_cast<ssize_t>(sizeof req)) {
    shutdown(m->sock, SHUT_RDWR);  // the listener ends the waiters
    return false;
  }
  return true;
}

// One request and its reply. The listener reads it (from_listener: this
// thread is the listener, and reads until it comes). 0 or an errno.
int Call(Mapper* m, const Request& req, int fd, void* reply, size_t max, bool from_listener) {
  Waiter w{reply, max};
  {
    std::lock_guard lock(m->io_mu);
    if (!SendLocked(m, req, fd)) return EPIPE;
    m->waiters.push_back(&w);
  }
  if (from_listener) {
    while (!w.done) {
      if (!ReadOne(m)) break;
    }
    return w.done ? w.err : EPIPE;
  }
  std::unique_lock lock(m->io_mu);
  if (!m->io_cv.wait_for(lock, std::chrono::seconds(kReplyTimeoutSeconds), [&] { return w.done; })) {
    // No answer: the connection is given up (the listener then ends every
    // waiter, this one included).
    shutdown(m->sock, SHUT_RDWR);
    m->io_cv.wait(lock, [&] { return w.done; });
  }
  return w.err;
}

void SendOneWay(Mapper* m, uint32_t op, uint64_t ino, uint64_t seq) {
  Request req{kMagic, kVersion, op, 0, 0, 0, seq, 0};
  req.ino = ino;
  std::lock_guard lock(m->io_mu);
  SendLocked(m, req, -1);
}

// --- pages ----------------------------------------------------------------------

// Zeros (a hole): anonymous, private.
bool MapZeros(uintptr_t at, uint64_t len, int prot) {
  return libc::Mmap(reinterpret_cast<void*>(at), len, prot,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) != MAP_FAILED;
}

// Past the end of the file: a shared map of an empty memfd, whose every
// access is SIGBUS, as the kernel's map of a file past its end.
bool MapPastEnd(uintptr_t at, uint64_t len, int prot) {
  const int fd = libc::Get(&libc::Table::memfd_create)("nvfs-past-eof", MFD_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = libc::Mmap(reinterpret_cast<void*>(at), len, prot, MAP_SHARED | MAP_FIXED, fd, 0) !=
                  MAP_FAILED;
  CloseFd(fd);
  return ok;
}

// Takes `len` bytes of a map at `at` off whatever blocks they were on:
// pages past the end of a file (SIGBUS, as the kernel's), or, where no
// descriptor can be had for those (RLIMIT_NOFILE), an inaccessible
// anonymous mapping (SIGSEGV). False if neither could be made: the pages
// may still be on the old blocks, and the caller must not say they moved
// (an acknowledgement, a count of writable maps).
bool TakeOff(uintptr_t at, uint64_t len, int prot) {
  if (MapPastEnd(at, len, prot)) return true;
  return libc::Mmap(reinterpret_cast<void*>(at), len, PROT_NONE,
                    MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) != MAP_FAILED;
}

// `len` bytes of the namespace at `ns_offset`, at `at`.
bool MapBlocks(Mapper* m, const Range& r, uintptr_t at, uint64_t len, uint64_t ns_offset) {
  Session* s = m->session;
  if (r.shared) {
    // A new mapping of the same pages as the session's (the namespace's own
    // shared mapping: read-only, or writable for a writer), then the map's
    // protection; the kernel refuses PROT_WRITE over a file opened
    // read-only, whatever asks.
    if (s->Revoked() || ns_offset + len > s->ns_size) return false;
    if ((r.prot & PROT_WRITE) != 0 &&
        (!s->writable.load(std::memory_order_acquire) ||
         ns_offset + len > s->writable_size.load(std::memory_order_acquire))) {
      return false;
    }
    void* src = const_cast<std::byte*>(s->ns_base) + ns_offset;
    void* got = libc::Get(&libc::Table::mremap)(src, 0, len, MREMAP_MAYMOVE | MREMAP_FIXED,
                                                reinterpret_cast<void*>(at));
    if (got == MAP_FAILED) return false;
    if (mprotect(reinterpret_cast<void*>(at), len, r.prot) != 0) {
      MapZeros(at, len, PROT_NONE);
      return false;
    }
    return true;
  }
  // Private: copy-on-write pages of the namespace, from the descriptor the
  // proof was made with.
  return libc::Mmap(reinterpret_cast<void*>(at), len, r.prot, MAP_PRIVATE | MAP_FIXED, m->ns_fd,
                    static_cast<off_t>(ns_offset)) != MAP_FAILED;
}

// Pages of a private map that are the process's own copies (present and
// anonymous: written since mapped), which a new mapping must keep.
std::vector<bool> OwnPages(const Range& r) {
  std::vector<bool> own(r.len / kPage, false);
  const int fd = libc::Get(&libc::Table::open)("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return own;
  std::vector<uint64_t> entries(own.size());
  const off_t at = static_cast<off_t>(r.addr / kPage * sizeof(uint64_t));
  const ssize_t n = libc::Get(&libc::Table::pread)(fd, entries.data(),
                                                   entries.size() * sizeof(uint64_t), at);
  CloseFd(fd);
  if (n != static_cast<ssize_t>(entries.size() * sizeof(uint64_t))) {
    // Unknown: every present page is kept (a stale page of the old blocks
    // rather than a lost write; the blocks stay held until the unmap).
    own.assign(own.size(), true);
    return own;
  }
  for (size_t i = 0; i < own.size(); ++i) {
    const bool present = (entries[i] >> 63) & 1;
    const bool swapped = (entries[i] >> 62) & 1;
    const bool file_page = (entries[i] >> 61) & 1;
    own[i] = swapped || (present && !file_page);
  }
  return own;
}

void ResolveStore(uintptr_t page);

// Zeros over a hole: anonymous; in a writable shared map, lazy (the first
// store into a page asks for its block, lazy.hpp) where the process can.
bool MapHole(const Range& r, uintptr_t at, uint64_t len) {
  if (!MapZeros(at, len, r.prot)) return false;
  return !Writable(r) || !LazyAvailable(ResolveStore) || LazyProtect(at, len);
}

// Maps `len` bytes at `at` onto what `on` names.
bool Put(Mapper* m, const Range& r, uintptr_t at, uint64_t len, uint64_t on) {
  if (on == kOnPastEnd) return MapPastEnd(at, len, r.prot);
  if (on == kDirectHole) return r.shared ? MapHole(r, at, len) : MapZeros(at, len, r.prot);
  return MapBlocks(m, r, at, len, on);
}

// What [from, to) (file offsets) is on by `runs`. False if they do not
// cover it (the caller asked too little).
bool ShapeOf(const Runs& runs, uint64_t from, uint64_t to, std::vector<Piece>* out) {
  const uint64_t end_of_file = RoundUp(runs.size);
  uint64_t pos = from;
  size_t i = 0;
  uint64_t run_at = runs.start;
  while (pos < to) {
    if (pos >= end_of_file) {
      Append(out, {to - pos, kOnPastEnd});
      break;
    }
    while (i < runs.runs.size() && run_at + runs.runs[i].len <= pos) run_at += runs.runs[i++].len;
    if (i == runs.runs.size() || run_at > pos) return false;
    const DirectRun& run = runs.runs[i];
    const uint64_t piece = std::min({to, run_at + run.len, end_of_file}) - pos;
    Append(out, {piece, run.offset == kDirectHole ? kDirectHole : run.offset + (pos - run_at)});
    pos += piece;
  }
  return true;
}

// Maps [from, to) of the range (file offsets) from `runs`. A shared map
// replaces only the stretches whose blocks differ from its shape's; a
// private one leaves the pages `keep` says (its own copies).
bool Install(Mapper* m, Range& r, const Runs& runs, uint64_t from, uint64_t to,
             const std::vector<bool>* keep) {
  std::vector<Piece> want;
  if (!ShapeOf(runs, from, to, &want)) return false;
  const uint64_t base = r.offset;
  if (!r.shared) {
    r.shape.clear();
    uint64_t pos = from;
    for (const Piece& p : want) {
      for (uint64_t a = pos; a < pos + p.len;) {
        if (keep != nullptr && (*keep)[(a - base) / kPage]) {
          a += kPage;
          continue;
        }
        uint64_t b = a + kPage;
        while (b < pos + p.len && (keep == nullptr || !(*keep)[(b - base) / kPage])) b += kPage;
        if (keep == nullptr) b = pos + p.len;
        if (!Put(m, r, r.addr + (a - base), b - a, Advance(p.on, a - pos))) return false;
        a = b;
      }
      pos += p.len;
    }
    return true;
  }
  const std::vector<Piece> old =
      r.shape.empty() ? std::vector<Piece>{} : Slice(r.shape, from - base, to - base);
  size_t j = 0;
  uint64_t old_at = from;
  uint64_t pos = from;
  for (const Piece& p : want) {
    for (uint64_t a = pos; a < pos + p.len;) {
      uint64_t b = pos + p.len;
      bool same = false;
      while (j < old.size() && old_at + old[j].len <= a) old_at += old[j++].len;
      if (j < old.size()) {
        b = std::min(b, old_at + old[j].len);
        same = Advance(old[j].on, a - old_at) == Advance(p.on, a - pos);
      }
      if (!same && !Put(m, r, r.addr + (a - base), b - a, Advance(p.on, a - pos))) {
        r.shape.clear();  // part replaced: unknown from now on
        return false;
      }
      a = b;
    }
    pos += p.len;
  }
  if (from == base && to == base + r.len) {
    r.shape = std::move(want);
  } else if (!r.shape.empty()) {
    std::vector<Piece> shape = Slice(r.shape, 0, from - base);
    for (const Piece& p : want) Append(&shape, p);
    for (const Piece& p : Slice(r.shape, to - base, r.len)) Append(&shape, p);
    r.shape = std::move(shape);
  }
  return true;
}

// The runs of [offset, offset + len) of a file (by `fd` the first time,
// else by `ino`), all at one seq, up to the end of the file; with
// `allocate` (and `write`), the holes of its first kMaxMapAllocateBytes
// get blocks first.
int Gather(Mapper* m, int fd, uint64_t ino, bool write, bool allocate, uint64_t offset,
           uint64_t len, Runs* out, bool from_listener) {
  const uint64_t end = offset + len;
  for (int attempt = 0; attempt < 8; ++attempt) {
    out->runs.clear();
    out->have = false;
    uint64_t pos = offset;
    bool moved = false;
    for (int guard = 0; guard < 1 << 16; ++guard) {
      const uint32_t flags = (write ? kMapForWrite : 0u) | (write && allocate ? kMapAllocate : 0u);
      Request req{kMagic, kVersion, kOpMmap, flags, pos, end - pos, 0, 0};
      req.ino = fd >= 0 ? 0 : ino;
      auto* reply = new (std::nothrow) MapReply;
      if (reply == nullptr) return ENOMEM;
      std::unique_ptr<MapReply> owned(reply);
      const int err = Call(m, req, fd, reply, sizeof *reply, from_listener);
      if (err != 0) return EPIPE;
      if (reply->h.op != kOpMmap) return EPROTO;
      if (reply->h.error != 0) return reply->h.error;
      if (reply->run_count > kMaxRuns || (reply->seq & 1) != 0 || reply->start > pos ||
          reply->slot == 0 || reply->slot >= m->session->slot_count) {
        return EPROTO;
      }
      fd = -1;  // the daemon keeps the first; by inode from now on
      ino = reply->ino;
      if (!out->have) {
        out->have = true;
        out->seq = reply->seq;
        out->start = reply->start;
        out->size = reply->size;
        out->ino = reply->ino;
        out->slot = reply->slot;
      } else if (reply->seq != out->seq || reply->slot != out->slot) {
        moved = true;
        break;
      }
      // Each reply's runs begin where the last ones ended (its start is
      // the block holding `pos`, which is where they ended).
      if (!out->runs.empty() && reply->start != pos) return EPROTO;
      uint64_t at = reply->start;
      for (uint32_t k = 0; k < reply->run_count; ++k) {
        const DirectRun& run = reply->runs[k];
        if (run.len == 0 || run.len % kPage != 0 ||
            (run.offset != kDirectHole &&
             (run.offset % kPage != 0 || run.offset + run.len > m->session->ns_size ||
              run.offset + run.len < run.offset))) {
          return EPROTO;
        }
        out->runs.push_back(run);
        at += run.len;
      }
      const uint64_t covered = at;
      const uint64_t want = std::min(end, RoundUp(out->size));
      if (covered >= want || reply->run_count == 0) return 0;
      pos = covered;
    }
    if (!moved) return EPROTO;
  }
  return EAGAIN;
}

// Blocks for every hole of [offset, offset + len) inside the size, in
// requests of kMaxMapAllocateBytes (by `*fd` the first time; *ino then
// says the file): a writable map's where holes cannot be lazy. 0 or an
// errno.
int AllocateHoles(Mapper* m, int fd, uint64_t* ino, uint64_t offset, uint64_t len,
                  bool from_listener) {
  const uint64_t end = offset + len;
  uint64_t limit = end;
  for (uint64_t at = offset; at < std::min(end, limit); at += kMaxMapAllocateBytes) {
    Runs part;
    const int err = Gather(m, fd, *ino, true, true, at, std::min(kMaxMapAllocateBytes, end - at),
                           &part, from_listener);
    if (err != 0) return err;
    fd = -1;
    *ino = part.ino;
    limit = RoundUp(part.size);
  }
  return 0;
}

// --- the listener ---------------------------------------------------------------

// Maps again every range of `f` from runs given now. REQUIRES: maps_mu.
void Refresh(Mapper* m, MappedFile* f, bool from_listener) {
  for (Range* r : f->ranges) {
    Runs runs;
    // The seq is read before the runs: the range is said to be at it only
    // once none of its pages can be on a block freed before it.
    const uint64_t now = m->session->table[f->slot].seq.load(std::memory_order_acquire);
    uint64_t ino = f->ino;
    int err = 0;
    if (Writable(*r) && !LazyAvailable(ResolveStore)) {
      err = AllocateHoles(m, -1, &ino, r->offset, r->len, from_listener);
    }
    if (err != 0 || Gather(m, -1, f->ino, f->write, false, r->offset, r->len, &runs, from_listener) != 0) {
      // No runs (the daemon refused, or is gone): nothing of the old
      // blocks stays reachable.
      r->shape.clear();
      if (TakeOff(r->addr, r->len, r->prot)) r->seq = now;
      continue;
    }
    std::vector<bool> keep;
    if (!r->shared) keep = OwnPages(*r);
    if (!Install(m, *r, runs, r->offset, r->offset + r->len, r->shared ? nullptr : &keep) &&
        !TakeOff(r->addr, r->len, r->prot)) {
      continue;  // still at its old seq: acknowledged as such, and held
    }
    r->seq = runs.seq;
    f->slot = runs.slot;
    f->known = std::move(runs);
  }
}

// After kOpNotify: the files whose slot seq moved are mapped again, every
// file acknowledged at the oldest seq its pages are from, then kOpMapDone.
// REQUIRES: maps_mu.
void Recheck(Mapper* m) {
  for (auto& [ino, f] : m->files) {
    const uint64_t now = m->session->table[f->slot].seq.load(std::memory_order_acquire);
    bool stale = false;
    for (const Range* r : f->ranges) stale |= r->seq != now;
#ifdef NVFS_DIRECT_NO_REVOKE
    // A build for the tests alone (tests/mount/meson.build): acknowledges
    // without mapping anew, to show the revoke test fails without it.
    for (Range* r : f->ranges) r->seq = now;
    stale = false;
#endif
    if (stale) Refresh(m, f, /*from_listener=*/true);
    uint64_t oldest = UINT64_MAX;
    for (const Range* r : f->ranges) oldest = std::min(oldest, r->seq);
    if (oldest != UINT64_MAX) SendOneWay(m, kOpMapAck, ino, oldest);
  }
  SendOneWay(m, kOpMapDone, 0, 0);
}

// The daemon is gone (or the connection broke): no page of a map may stay
// on blocks a later mount could give to another file.
void Died(Mapper* m) {
  bool closing;
  {
    std::lock_guard lock(m->io_mu);
    FailWaitersLocked(m);
    closing = m->closing;
  }
  std::lock_guard lock(maps_mu);
  if (!closing) {
    // Writable maps whose pages could not be taken off the blocks stay
    // counted: a new mount waits for them (the restart guard).
    uint64_t stuck = 0;
    for (auto& [ino, f] : m->files) {
      for (Range* r : f->ranges) {
        if (!TakeOff(r->addr, r->len, r->prot) && Writable(*r)) ++stuck;
        ranges.erase(r->addr);
        range_count.fetch_sub(1, std::memory_order_relaxed);
        delete r;
      }
      CloseFd(f->fd);
      delete f;
    }
    m->files.clear();
    m->writable = stuck;
    CountWritable(m, 0);  // the pages are off the blocks: a new mount may go on
  }
  CloseProofFd(&m->sock, &m->sock_slot);
  CloseProofFd(&m->ns_fd, &m->ns_slot);
  m->session->Unref();
}

void* Listen(void* arg) {
  auto* m = static_cast<Mapper*>(arg);
  DepthGuard depth;  // its calls are the library's own
  for (;;) {
    if (m->notified.load(std::memory_order_acquire) && maps_mu.try_lock()) {
      m->notified.store(false, std::memory_order_relaxed);
      Recheck(m);
      maps_mu.unlock();
      continue;
    }
    // A thread holding the maps' lock waits for a reply this thread reads:
    // while a recheck waits for the lock, the socket is still read.
    pollfd p{m->sock, POLLIN, 0};
    const int n = poll(&p, 1, m->notified.load(std::memory_order_relaxed) ? 1 : -1);
    if (n < 0 && errno != EINTR) break;
    if (n > 0 && !ReadOne(m)) break;
  }
  Died(m);
  return nullptr;
}

// The mapper of `s`'s mount, made (connected, proven, its listener
// started) if there is none; proven for writing if `write`. Null and *why.
// REQUIRES: maps_mu held.
Mapper* MapperFor(Session* s, bool write, int* why) {
  Mapper* m = nullptr;
  for (Mapper* c : mappers) {
    std::lock_guard lock(c->io_mu);
    if (c->session == s && !c->dead) m = c;
  }
  if (m == nullptr) {
    m = new (std::nothrow) Mapper;
    if (m == nullptr) {
      *why = NVFS_DIRECT_NO_MEMORY;
      return nullptr;
    }
    auto fail = [&](int w) {
      CloseProofFd(&m->sock, &m->sock_slot);
      CloseProofFd(&m->ns_fd, &m->ns_slot);
      delete m;
      *why = w;
      return nullptr;
    };
    const char* dir = SocketDir();
    char path[PATH_MAX];
    SocketPath(path, sizeof path, s->dev(), dir);
    if (!SocketDirTrusted(dir)) return fail(NVFS_DIRECT_NO_SERVER);
    // Credentials are part of the proof: one made across a change is not
    // used (the descriptors are registered first, so that a change from
    // then on takes them out).
    const uint64_t generation = CredentialsGeneration();
    if (CredentialsChanging()) return fail(NVFS_DIRECT_REFUSED);
    if (TransportConnect(path, TestMode() ? geteuid() : 0, &m->sock) != 0) {
      return fail(NVFS_DIRECT_NO_SERVER);
    }
    m->sock_slot = ProofFdAdd(m->sock);
    if (m->sock_slot < 0) return fail(NVFS_DIRECT_NO_MEMORY);
    Request req{kMagic, kVersion, kOpHello, 0, 0, 0, 0, 0};
    ReplyHeader hello{};
    if (TransportCall(m->sock, req, -1, &hello, sizeof hello, sizeof hello, nullptr) != 0 ||
        hello.error != 0) {
      return fail(NVFS_DIRECT_NO_SERVER);
    }
    struct stat st {};
    if (!NamespacePath(s->dev(), m->ns_path, sizeof m->ns_path)) return fail(NVFS_DIRECT_NO_NAMESPACE);
    m->ns_fd = OpenNamespace(m->ns_path, &st);
    if (m->ns_fd < 0 || !s->IsNamespace(st)) return fail(NVFS_DIRECT_NO_NAMESPACE);
    m->ns_slot = ProofFdAdd(m->ns_fd);
    if (m->ns_slot < 0) return fail(NVFS_DIRECT_NO_MEMORY);
    req.op = kOpProve;
    ProveReply prove{};
    if (TransportCall(m->sock, req, m->ns_fd, &prove, sizeof prove, sizeof prove, nullptr) != 0 ||
        prove.h.error != 0) {
      return fail(NVFS_DIRECT_NO_NAMESPACE);
    }
    if (prove.mount_count != s->mount_count) return fail(NVFS_DIRECT_GONE);
    if (!CredentialsUnchangedSince(generation)) return fail(NVFS_DIRECT_REFUSED);
    m->session = s;
    s->Ref();
    // The listener blocks every signal: the program's handlers run on its
    // own threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    const int err = pthread_create(&thread, nullptr, Listen, m);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (err != 0) {
      s->Unref();
      return fail(NVFS_DIRECT_NO_MEMORY);
    }
    pthread_detach(thread);
    mappers.push_back(m);
  }
  if (write && !m->write_proven) {
    struct stat st {};
    const int rw = OpenNamespace(m->ns_path, &st, O_RDWR);
    if (rw < 0 || !s->IsNamespace(st)) {
      CloseFd(rw);
      *why = NVFS_DIRECT_NO_WRITE_NAMESPACE;
      return nullptr;
    }
    const Request req{kMagic, kVersion, kOpWriteProve, kProveNoPage, 0, 0, 0, 0};
    WriteProveReply reply{};
    const int err = Call(m, req, rw, &reply, sizeof reply, /*from_listener=*/false);
    CloseFd(rw);
    if (err != 0 || reply.h.error != 0) {
      *why = err != 0 ? NVFS_DIRECT_REFUSED : NVFS_DIRECT_NO_WRITES;
      return nullptr;
    }
    m->write_proven = true;
  }
  return m;
}

// --- the registry -------------------------------------------------------------

void Insert(Range* r) {
  if (Writable(*r)) CountWritable(r->file->mapper, 1);
  ranges[r->addr] = r;
  r->file->ranges.push_back(r);
  range_count.fetch_add(1, std::memory_order_relaxed);
}

// Forgets `r` (its pages are someone else's now); the file too when it was
// its last range, which the daemon is told. REQUIRES: maps_mu.
void Forget(Range* r) {
  MappedFile* f = r->file;
  if (Writable(*r)) CountWritable(f->mapper, -1);
  ranges.erase(r->addr);
  range_count.fetch_sub(1, std::memory_order_relaxed);
  std::erase(f->ranges, r);
  delete r;
  if (!f->ranges.empty() || f->holders > 0) return;
  Mapper* m = f->mapper;
  SendOneWay(m, kOpMunmap, f->ino, 0);
  CloseFd(f->fd);
  m->files.erase(f->ino);
  delete f;
}

// Removes [addr, addr + len) from the registry: ranges inside go, ranges
// across its ends are cut (the pages themselves are the caller's to
// unmap or replace). REQUIRES: maps_mu.
void Cut(uintptr_t addr, uint64_t len) {
  const uintptr_t end = addr + len;
  std::vector<Range*> hit;
  auto it = ranges.lower_bound(addr);
  if (it != ranges.begin()) --it;
  for (; it != ranges.end() && it->first < end; ++it) {
    Range* r = it->second;
    if (r->addr + r->len > addr) hit.push_back(r);
  }
  for (Range* r : hit) {
    const uintptr_t r_end = r->addr + r->len;
    if (r->addr < addr) {
      // The head stays; a tail past the cut becomes a range of its own.
      if (r_end > end) {
        auto* tail = new Range(*r);
        tail->addr = end;
        tail->len = r_end - end;
        tail->offset = r->offset + (end - r->addr);
        tail->shape = Slice(r->shape, end - r->addr, r_end - r->addr);
        Insert(tail);
      }
      r->shape = Slice(r->shape, 0, addr - r->addr);
      r->len = addr - r->addr;
    } else if (r_end > end) {
      ranges.erase(r->addr);
      r->shape = Slice(r->shape, end - r->addr, r_end - r->addr);
      r->offset += end - r->addr;
      r->len = r_end - end;
      r->addr = end;
      ranges[r->addr] = r;
    } else {
      Forget(r);
    }
  }
}

// The kernel's map of the same file over `r` (a change of credentials, a
// child of fork), but for a private map's own copies, which stay;
// past-the-end pages where the kernel refuses.
void ToKernel(const Range& r, int fd) {
  std::vector<bool> own;
  if (!r.shared) own = OwnPages(r);
  for (uint64_t at = 0; at < r.len;) {
    if (!own.empty() && own[at / kPage]) {
      at += kPage;
      continue;
    }
    uint64_t end = at + kPage;
    while (end < r.len && (own.empty() || !own[end / kPage])) end += kPage;
    void* got = fd < 0 ? MAP_FAILED
                       : libc::Mmap(reinterpret_cast<void*>(r.addr + at), end - at, r.prot,
                                    (r.shared ? MAP_SHARED : MAP_PRIVATE) | MAP_FIXED, fd,
                                    static_cast<off_t>(r.offset + at));
    // (Where even TakeOff fails, a change of credentials' walk of the
    // process's maps, credentials.cpp, takes the pages out.)
    if (got == MAP_FAILED) (void)TakeOff(r.addr + at, end - at, r.prot);
    at = end;
  }
}

// A shared map that is one run of blocks inside the file: one new mapping
// of the namespace's pages, placed by the kernel. False if it is not.
bool OneRun(Mapper* m, const Runs& runs, uint64_t off, uint64_t len, int prot, uintptr_t* at) {
  Session* s = m->session;
  uint64_t run_at = runs.start;
  for (const DirectRun& run : runs.runs) {
    if (run_at + run.len <= off) {
      run_at += run.len;
      continue;
    }
    if (run.offset == kDirectHole || run_at > off || run_at + run.len < off + len ||
        off + len > RoundUp(runs.size) || s->Revoked()) {
      return false;
    }
    const uint64_t ns_offset = run.offset + (off - run_at);
    const bool rw = s->writable.load(std::memory_order_acquire) &&
                    ns_offset + len <= s->writable_size.load(std::memory_order_acquire);
    if (((prot & PROT_WRITE) != 0 && !rw) || ns_offset + len > s->ns_size) return false;
    void* src = const_cast<std::byte*>(s->ns_base) + ns_offset;
    void* got = libc::Get(&libc::Table::mremap)(src, 0, len, MREMAP_MAYMOVE);
    if (got == MAP_FAILED) return false;
    if (prot != (rw ? PROT_READ | PROT_WRITE : PROT_READ) && mprotect(got, len, prot) != 0) {
      libc::Munmap(got, len);
      return false;
    }
    *at = reinterpret_cast<uintptr_t>(got);
    return true;
  }
  return false;
}

// What the shape says the page at `rel` (from the range's start) is on;
// kDirectHole when the shape is not known.
uint64_t OnAt(const Range& r, uint64_t rel) {
  uint64_t at = 0;
  for (const Piece& p : r.shape) {
    if (rel < at + p.len) return Advance(p.on, rel - at);
    at += p.len;
  }
  return kDirectHole;
}

// Stores into a lazy hole get blocks this many bytes at a time (aligned),
// so that a program filling a map page by page asks once per 16 pages.
constexpr uint64_t kLazyChunk = 16 * kPage;

// The resolver thread (lazy.hpp): a store stopped at `page`. The page's
// chunk of the map gets its blocks and is mapped onto them; where none can
// be had, the page is mapped past the end of a file and the store gets
// SIGBUS. A page no longer a hole of a writable direct map (mapped again
// since, or no direct map's at all) is left as it is.
void ResolveStore(uintptr_t page) {
  {
    std::lock_guard lock(maps_mu);
    auto it = ranges.upper_bound(page);
    Range* r = nullptr;
    if (it != ranges.begin() && page < std::prev(it)->second->addr + std::prev(it)->second->len) {
      r = std::prev(it)->second;
    }
    if (r != nullptr && Writable(*r) && OnAt(*r, page - r->addr) == kDirectHole) {
      MappedFile* f = r->file;
      const uint64_t off = r->offset + (page - r->addr);
      const uint64_t aligned = off & ~(kLazyChunk - 1);
      const uint64_t from = std::max(r->offset, aligned);
      const uint64_t to = std::min(r->offset + r->len, aligned + kLazyChunk);
      Runs runs;
      const bool ok = Gather(f->mapper, -1, f->ino, true, true, from, to - from, &runs, false) == 0 &&
                      Install(f->mapper, *r, runs, from, to, nullptr);
      if (!ok || OnAt(*r, page - r->addr) == kDirectHole) {
        // No block for it (ENOSPC, or the daemon is gone): SIGBUS, as
        // ext4-DAX gives. The map's next refresh makes it a hole again.
        std::vector<Piece> shape = Slice(r->shape, 0, page - r->addr);
        Append(&shape, {kPage, kOnPastEnd});
        for (const Piece& p : Slice(r->shape, page - r->addr + kPage, r->len)) Append(&shape, p);
        r->shape = TakeOff(page, kPage, r->prot) && !r->shape.empty() ? std::move(shape)
                                                                     : std::vector<Piece>{};
      }
    }
  }
  LazyWake(page, kPage);
}

}  // namespace

bool MapFile(nvfs_direct* f, void* addr, size_t length, int prot, int flags, off_t offset,
             void** result, int* why) {
  const int type = flags & MAP_TYPE;
  const bool shared = type == MAP_SHARED || type == MAP_SHARED_VALIDATE;
  constexpr int kServed = MAP_TYPE | MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_SYNC | MAP_NORESERVE |
                          MAP_POPULATE | MAP_NONBLOCK;
  if (length == 0 || offset < 0 || static_cast<uint64_t>(offset) % kPage != 0 ||
      (!shared && type != MAP_PRIVATE) || (flags & ~kServed) != 0 ||
      (prot & ~(PROT_READ | PROT_WRITE)) != 0 || (prot & PROT_READ) == 0 ||
      reinterpret_cast<uintptr_t>(addr) % kPage != 0) {
    *why = NVFS_DIRECT_MAP_FLAGS;
    return false;
  }
  const int read_why = f->read_why();
  if (read_why != NVFS_DIRECT_ACTIVE) {
    *why = read_why;
    return false;
  }
  const bool write = shared && (prot & PROT_WRITE) != 0;
  Session* s = f->session;
  if (write) {
    const int ww = f->write_why.load(std::memory_order_acquire);
    if (ww != NVFS_DIRECT_ACTIVE) {
      *why = ww;
      return false;
    }
    int w;
    {
      std::lock_guard lock(s->mu);
      w = s->EnsureWriterLocked();
    }
    if (w != NVFS_DIRECT_ACTIVE) {
      *why = w;
      return false;
    }
  }
  if (shared && type == MAP_SHARED_VALIDATE && (flags & MAP_SYNC) != 0 && s->flush == kDirectFlushPage) {
    // Stores are made durable by msync here, not by CPU flushes: the
    // kernel's answer for a file system without DAX.
    *why = NVFS_DIRECT_MAP_FLAGS;
    return false;
  }
  const uint64_t len = RoundUp(length);
  const uint64_t off = static_cast<uint64_t>(offset);
  if (off + len < off) {
    *why = NVFS_DIRECT_MAP_FLAGS;
    return false;
  }

  std::lock_guard lock(maps_mu);
  Mapper* m = MapperFor(s, write, why);
  if (m == nullptr) return false;
  // Counted before the daemon is asked: a later mount's guard sees the
  // map from the moment its blocks may be given (Insert counts it for
  // good).
  struct Pending {
    Mapper* m;
    bool on;
    ~Pending() {
      if (on) CountWritable(m, -1);
    }
  } pending{m, write};
  if (write) CountWritable(m, 1);
  MappedFile* known = nullptr;
  if (f->ino != 0) {
    auto it = m->files.find(f->ino);
    if (it != m->files.end()) known = it->second;
  }
  // A file mapped for reading alone that is now mapped for writing is
  // asked for anew (the daemon checks its descriptor for writing).
  const bool by_fd = known == nullptr || (write && !known->write);
  // A writable map's holes get their blocks at the first store into them
  // (lazy.hpp); where they cannot, when the map is made.
  const bool eager = write && !LazyAvailable(ResolveStore);
  Runs fetched;
  const bool cached = !by_fd && known->known.have &&
                      s->table[known->slot].seq.load(std::memory_order_acquire) == known->known.seq &&
                      known->known.Cover(off, off + len) && !(eager && known->known.HoleIn(off, off + len));
  if (!cached) {
    // The map asks from the start of the file: the reply's runs reach on
    // to the end (for a file of few extents, all of it), so maps of other
    // ranges of it ask nothing while it stays as it is.
    uint64_t ino = f->ino;
    int err = eager ? AllocateHoles(m, by_fd ? f->fd : -1, &ino, off, len, false) : 0;
    if (err == 0) {
      err = Gather(m, by_fd && !eager ? f->fd : -1, ino, write, false, 0, off + len, &fetched, false);
    }
    if (err != 0) {
      *why = err == EPERM ? NVFS_DIRECT_PRIVILEGED
             : err == EACCES ? (write ? NVFS_DIRECT_NOT_WRITABLE : NVFS_DIRECT_NOT_READABLE)
                             : NVFS_DIRECT_REFUSED;
      return false;
    }
  }
  const uint64_t ino = cached ? known->ino : fetched.ino;
  MappedFile* file = known;
  if (file == nullptr) {
    auto it = m->files.find(ino);
    if (it != m->files.end()) file = it->second;
  }
  if (file == nullptr) {
    file = new (std::nothrow) MappedFile{m, ino, fetched.slot, write, -1, {}};
    if (file == nullptr) {
      SendOneWay(m, kOpMunmap, ino, 0);
      *why = NVFS_DIRECT_NO_MEMORY;
      return false;
    }
    file->fd = libc::Get(&libc::Table::fcntl)(f->fd, F_DUPFD_CLOEXEC, 256);
    if (file->fd < 0) file->fd = libc::Get(&libc::Table::fcntl)(f->fd, F_DUPFD_CLOEXEC, 0);
    m->files[ino] = file;
  }
  file->write |= write;
  if (!cached) {
    file->slot = fetched.slot;
    file->known = std::move(fetched);
  }
  if (!f->map_held.load(std::memory_order_relaxed)) {
    // The file stays registered while this handle is open (MapsRelease).
    f->map_held.store(true, std::memory_order_relaxed);
    ++file->holders;
  }
  const Runs& runs = file->known;

  // The address: one run of blocks is one new mapping of the namespace's
  // pages where the kernel puts it; otherwise the caller's address with
  // MAP_FIXED (what is there is replaced, as the kernel replaces it), or a
  // reservation the pages go over.
  uintptr_t at = 0;
  if ((flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) == 0 && addr == nullptr && shared &&
      OneRun(m, runs, off, len, prot, &at)) {
    auto* r = new (std::nothrow) Range{at, len, off, prot, shared, runs.seq, file};
    if (r != nullptr) {
      if (!ShapeOf(runs, off, off + len, &r->shape)) r->shape.clear();
      Insert(r);
      *result = reinterpret_cast<void*>(at);
      *why = NVFS_DIRECT_ACTIVE;
      return true;
    }
    libc::Munmap(reinterpret_cast<void*>(at), len);
  }
  if ((flags & MAP_FIXED) != 0) {
    at = reinterpret_cast<uintptr_t>(addr);
    Cut(at, len);
  } else {
    void* room = libc::Mmap(addr, len, PROT_NONE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (flags & MAP_FIXED_NOREPLACE),
                            -1, 0);
    if (room == MAP_FAILED) {
      *result = MAP_FAILED;
      return true;
    }
    at = reinterpret_cast<uintptr_t>(room);
  }
  auto* r = new (std::nothrow) Range{at, len, off, prot, shared, runs.seq, file};
  if (r == nullptr || !Install(m, *r, runs, off, off + len, nullptr)) {
    // What was at the address is gone (MAP_FIXED) or ours: nothing of the
    // file stays there.
    libc::Munmap(reinterpret_cast<void*>(at), len);
    delete r;
    *why = NVFS_DIRECT_NO_MEMORY;
    return false;
  }
  Insert(r);
  *result = reinterpret_cast<void*>(at);
  *why = NVFS_DIRECT_ACTIVE;
  return true;
}

int UnmapRange(void* addr, size_t length) {
  if (range_count.load(std::memory_order_relaxed) == 0) {
    return libc::Munmap(addr, length);
  }
  std::lock_guard lock(maps_mu);
  const int r = libc::Munmap(addr, length);
  if (r == 0) Cut(reinterpret_cast<uintptr_t>(addr), RoundUp(length));
  return r;
}

bool RemapRange(void* old_addr, size_t old_len, size_t new_len, int flags, void* new_addr,
                void** result) {
  if (range_count.load(std::memory_order_relaxed) == 0) return false;
  const auto old_at = reinterpret_cast<uintptr_t>(old_addr);
  Range copy{};
  int fd = -1;
  {
    std::lock_guard lock(maps_mu);
    auto it = ranges.upper_bound(old_at);
    if (it == ranges.begin()) return false;
    --it;
    Range* r = it->second;
    if (old_at >= r->addr + r->len) return false;
    const uint64_t old_size = RoundUp(old_len), new_size = RoundUp(new_len);
    if (new_size <= old_size && (flags & MREMAP_FIXED) == 0) {
      if (new_size < old_size) {
        libc::Munmap(reinterpret_cast<void*>(old_at + new_size), old_size - new_size);
        Cut(old_at + new_size, old_size - new_size);
      }
      *result = old_addr;
      return true;
    }
    if (r->addr != old_at || r->len != old_size || !r->shared || (flags & MREMAP_MAYMOVE) == 0 ||
        (flags & MREMAP_FIXED) != 0) {
      *result = MAP_FAILED;
      errno = ENOMEM;
      return true;
    }
    copy = *r;
    fd = libc::Get(&libc::Table::fcntl)(r->file->fd, F_DUPFD_CLOEXEC, 0);
  }
  (void)new_addr;
  // A larger shared map of the same file, then the old one goes: the same
  // blocks, so nothing is copied.
  nvfs_direct* h = fd < 0 ? nullptr : Attach(fd, copy.offset);
  void* got = MAP_FAILED;
  int why = 0;
  if (h != nullptr &&
      !MapFile(h, nullptr, new_len, copy.prot, MAP_SHARED, static_cast<off_t>(copy.offset), &got, &why)) {
    got = libc::Mmap(nullptr, new_len, copy.prot, MAP_SHARED, fd, static_cast<off_t>(copy.offset));
  }
  if (h != nullptr) {
    MapsRelease(h);  // its file stays registered by its maps, not by this handle
    RetireHandle(h);
  }
  CloseFd(fd);
  if (got == MAP_FAILED) {
    *result = MAP_FAILED;
    errno = ENOMEM;
    return true;
  }
  UnmapRange(old_addr, old_len);
  *result = got;
  return true;
}

bool AdviseRange(void* addr, size_t len, int advice, int* result) {
  if (advice != MADV_REMOVE || range_count.load(std::memory_order_relaxed) == 0) return false;
  const auto at = reinterpret_cast<uintptr_t>(addr);
  int fd = -1;
  uint64_t offset = 0;
  {
    std::lock_guard lock(maps_mu);
    auto it = ranges.upper_bound(at);
    if (it == ranges.begin()) return false;
    --it;
    const Range* r = it->second;
    if (at >= r->addr + r->len) return false;
    if (!r->shared || (r->prot & PROT_WRITE) == 0 || at + len > r->addr + r->len) {
      *result = -1;
      errno = EACCES;  // the kernel's, for a map it may not punch through
      return true;
    }
    offset = r->offset + (at - r->addr);
    fd = libc::Get(&libc::Table::fcntl)(r->file->fd, F_DUPFD_CLOEXEC, 0);
  }
  // The hole is the kernel's to make; the listener then maps it anew.
  *result = fd < 0 ? -1
                   : fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                               static_cast<off_t>(offset), static_cast<off_t>(len));
  const int saved = errno;
  CloseFd(fd);
  errno = saved;
  return true;
}

int MapWhy(const void* addr) {
  const auto at = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard lock(maps_mu);
  auto it = ranges.upper_bound(at);
  if (it == ranges.begin()) return NVFS_DIRECT_NOT_NVFS;
  --it;
  return at < it->second->addr + it->second->len ? NVFS_DIRECT_ACTIVE : NVFS_DIRECT_NOT_NVFS;
}

void MapsToKernel() {
  if (tls.depth != 0 || range_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lock(maps_mu);
  for (auto& [addr, r] : ranges) ToKernel(*r, r->file->fd);
  for (Mapper* m : mappers) {
    {
      // A mapper that ended (an earlier change, or its daemon gone) has no
      // file left, and its listener gave its session back: that session
      // may be freed.
      std::lock_guard io(m->io_mu);
      if (m->dead) continue;
    }
    for (auto& [ino, f] : m->files) {
      SendOneWay(m, kOpMunmap, ino, 0);
      for (Range* r : f->ranges) delete r;
      CloseFd(f->fd);
      delete f;
    }
    m->files.clear();
    m->writable = 0;
    CountWritable(m, 0);
    std::lock_guard io(m->io_mu);
    m->closing = true;
    m->dead = true;
    shutdown(m->sock, SHUT_RDWR);  // the listener ends, and closes it
  }
  ranges.clear();
  range_count.store(0, std::memory_order_relaxed);
}

void MapsRelease(nvfs_direct* h) {
  // From wherever a handle is closed or freed: a thread that holds the lock
  // (a signal handler that interrupted it) leaves the file registered until
  // the connection ends.
  if (!h->map_held.load(std::memory_order_relaxed) || !maps_mu.try_lock()) return;
  if (h->map_held.exchange(false, std::memory_order_relaxed)) {
    for (Mapper* m : mappers) {
      if (m->session != h->session) continue;
      auto it = m->files.find(h->ino);
      if (it == m->files.end()) continue;
      MappedFile* f = it->second;
      if (--f->holders > 0 || !f->ranges.empty()) continue;
      SendOneWay(m, kOpMunmap, h->ino, 0);
      CloseFd(f->fd);
      m->files.erase(it);
      delete f;
    }
  }
  maps_mu.unlock();
}

bool MapsAny() { return range_count.load(std::memory_order_relaxed) != 0; }

namespace {

// Maps the file's ranges again if its slot seq moved since they were made.
// REQUIRES: maps_mu held.
void RefreshIfStale(Mapper* m, MappedFile* f) {
  const uint64_t now = m->session->table[f->slot].seq.load(std::memory_order_acquire);
  bool stale = false;
  for (const Range* r : f->ranges) stale |= r->seq != now;
  if (stale) Refresh(m, f, /*from_listener=*/false);
}

// Every mapper of mount `dev` (or of `session`, if given) whose file `ino`
// is mapped: RefreshIfStale. A signal handler that interrupted the library
// (which may hold the lock) only tries.
void RefreshFile(const Session* session, dev_t dev, uint64_t ino) {
  std::unique_lock lock(maps_mu, std::defer_lock);
  if (tls.depth > 1) {
    if (!lock.try_lock()) return;
  } else {
    lock.lock();
  }
  for (Mapper* m : mappers) {
    if (session != nullptr ? m->session != session : m->session->dev() != dev) continue;
    {
      std::lock_guard io(m->io_mu);
      if (m->dead) continue;
    }
    auto it = m->files.find(ino);
    if (it != m->files.end()) RefreshIfStale(m, it->second);
  }
}

}  // namespace

void MapsAfterWrite(nvfs_direct* h) {
  if (!MapsAny() || h->session == nullptr) return;
  // The write filled a hole or moved the end: this process's maps show
  // it before the write returns, as the kernel's do. (Another process's
  // follow when their listener hears of it.)
  RefreshFile(h->session, 0, h->ino);
}

void MapsAfterChange(dev_t dev, uint64_t ino) {
  if (!MapsAny() || tls.depth != 0) return;
  DepthGuard depth;
  // A truncation, a punched hole, O_TRUNC: a load past the new end through
  // this process's maps faults (SIGBUS) once the call returns, as the
  // kernel's maps do; a punched range reads zeros.
  RefreshFile(nullptr, dev, ino);
}

void MapsPrepareFork() { maps_mu.lock(); }

void MapsParentAfterFork() { maps_mu.unlock(); }

void MapsChildAfterFork() {
  // The child's own copies of the library's descriptors are closed; the
  // connections stay the parent's.
  for (auto& [addr, r] : ranges) ToKernel(*r, r->file->fd);
  for (Mapper* m : mappers) {
    for (auto& [ino, f] : m->files) {
      for (Range* r : f->ranges) delete r;
      CloseFd(f->fd);
      delete f;
    }
    m->files.clear();
    CloseProofFd(&m->sock, &m->sock_slot);
    CloseProofFd(&m->ns_fd, &m->ns_slot);
    new (&m->io_mu) std::mutex;  // its holder (a thread of the parent) is not here
    m->dead = true;
    m->closing = true;
    m->waiters.clear();
  }
  ranges.clear();
  range_count.store(0, std::memory_order_relaxed);
  maps_mu.unlock();
}

}  // namespace nvfs::direct
