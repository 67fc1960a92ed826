// FUSE over io_uring (uring.hpp).
#include "fuse/uring.hpp"

#include <linux/fuse.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <condition_variable>
#include <thread>

#include "fuse/adapter.hpp"
#include "fuse/transport.hpp"
#include "fuse/uring_abi.hpp"
#include "nvfs/media.hpp"
#include "util/races.hpp"

namespace nvfs {

namespace {

constexpr const char* kKnob = "/sys/module/fuse/parameters/enable_uring";
constexpr size_t kPage = 4096;
// Each entry's memory: the header page, then a page of room in front of the
// payload for the request's fuse_in_header and first argument (libfuse
// wants the three contiguous), then the payload buffer: the largest request
// or reply (kFuseMaxIo, the kernel's max_write and max_pages) and a page.
constexpr size_t kHeaderArea = kPage;
constexpr size_t kFrontArea = kPage;
constexpr size_t kPayloadSize = kFuseMaxIo + kPage;
constexpr size_t kEntrySize = kHeaderArea + kFrontArea + kPayloadSize;
static_assert(sizeof(uring_abi::ReqHeader) <= kHeaderArea);
static_assert(sizeof(fuse_in_header) + uring_abi::kOpInOutSize <= kFrontArea);

constexpr uint64_t kEventData = 0;  // the stop eventfd's poll; entries are pointers

// Sets up `ring` for the protocol: 128-byte SQEs (the command area holds a
// fuse_uring_cmd_req), a completion queue that cannot overflow.
int InitRing(io_uring* ring, unsigned entries) {
  io_uring_params params{};
  params.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE;
  params.cq_entries = 2 * entries;
  return io_uring_queue_init_params(entries, ring, &params);
}

void PrepareCommand(io_uring_sqe* sqe, uint32_t cmd, unsigned qid, uint64_t commit_id,
                    void* data) {
  // The whole 128-byte SQE (IORING_SETUP_SQE128): the 64 bytes of
  // io_uring_sqe, then the rest of the command area.
  std::memset(sqe, 0, sizeof *sqe);
  std::memset(sqe->cmd, 0, 80);
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->flags = IOSQE_FIXED_FILE;
  sqe->fd = 0;  // the registered /dev/fuse
  sqe->cmd_op = cmd;
  io_uring_sqe_set_data(sqe, data);
  uring_abi::CmdReq req{};
  req.commit_id = commit_id;
  req.qid = static_cast<uint16_t>(qid);
  std::memcpy(sqe->cmd, &req, sizeof req);
}

// Makes the kernel give up io_uring for the connection of `fd`: a REGISTER
// it refuses (a wrong iovec count) clears fc->io_uring and wakes the
// requests held back for the ring (dev_uring.c, fuse_uring_cmd). True if it
// refused it.
bool TellKernelNoRing(int fd) {
  io_uring ring;
  if (InitRing(&ring, 2) != 0) return false;
  bool refused = false;
  if (io_uring_register_files(&ring, &fd, 1) == 0) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_cqe* cqe = nullptr;
    // sqe->len stays 0: the kernel wants 2 iovecs (header, payload).
    if (sqe != nullptr) PrepareCommand(sqe, uring_abi::kCmdRegister, 0, 0, nullptr);
    if (sqe != nullptr && io_uring_submit_and_wait(&ring, 1) >= 0 && io_uring_peek_cqe(&ring, &cqe) == 0) {
      refused = cqe->res < 0;
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  io_uring_queue_exit(&ring);
  return refused;
}

// The kernel's number of queues: num_possible_cpus() (dev_uring.c,
// fuse_uring_create), which may exceed the CPUs online or present on a VM
// that can hot-plug more. The ring is ready only once every one of them
// has an entry, so the count must be the kernel's.
unsigned PossibleCpus() {
  std::ifstream in("/sys/devices/system/cpu/possible");
  std::string list;
  unsigned count = 0;
  if (in >> list) {
    size_t at = 0;
    while (at < list.size()) {
      const size_t comma = std::min(list.find(',', at), list.size());
      const std::string range = list.substr(at, comma - at);
      const size_t dash = range.find('-');
      const unsigned lo = static_cast<unsigned>(std::stoul(range.substr(0, dash)));
      const unsigned hi =
          dash == std::string::npos ? lo : static_cast<unsigned>(std::stoul(range.substr(dash + 1)));
      count += hi - lo + 1;
      at = comma + 1;
    }
  }
  return count != 0 ? count : static_cast<unsigned>(std::max(1, get_nprocs_conf()));
}

}  // namespace

struct Entry {
  UringTransport::Queue* queue = nullptr;
  uring_abi::ReqHeader* header = nullptr;
  char* payload = nullptr;  // kPayloadSize bytes, kFrontArea writable in front
  iovec iov[2]{};           // what REGISTER hands the kernel
  uint64_t commit_id = 0;
  uint64_t unique = 0;      // the request being served
  uint32_t last_cmd = uring_abi::kCmdRegister;  // the entry's command in flight
  bool replied = false;
};

struct UringTransport::Queue {
  unsigned qid = 0;
  fuse_session* se = nullptr;
  void* userdata = nullptr;  // the session's (the FuseAdapter)
  io_uring ring{};
  bool ring_ok = false;
  int event_fd = -1;
  void* memory = nullptr;
  Entry entries[kQueueDepth];
  std::thread thread;
  std::atomic<bool> stop{false};
  // Start-up handshake with Start().
  std::mutex mu;
  std::condition_variable cv;
  bool reported = false;
  int status = 0;

  // Pinned to its CPU while requests come one at a time; free to move
  // while they queue up (Spread).
  bool pinned = false;
  unsigned single_rounds = 0;
  cpu_set_t allowed{};  // the CPUs the daemon was started on (taskset)

  void Run();
  int Setup();
  void Spread(unsigned served);
  void Pin(bool on);
  void Report(int s) {
    std::lock_guard lock(mu);
    status = s;
    reported = true;
    cv.notify_all();
  }
  void Serve(Entry& e);
  void Commit(Entry& e);
  void Resubmit(Entry& e);
  io_uring_sqe* NextSqe();
};

namespace {

// The entry the calling thread is serving, if any (a ring thread, inside
// fuse_session_process_buf).
thread_local Entry* current_entry = nullptr;

}  // namespace

std::string UringUnavailable() {
  std::ifstream knob(kKnob);
  char c = 0;
  if (!(knob >> c)) {
    return std::string("this kernel has no FUSE over io_uring (") + kKnob + " is absent)";
  }
  if (c != 'Y' && c != 'y' && c != '1') {
    return std::string("FUSE over io_uring is disabled (") + kKnob +
           " is N; as root: echo Y > " + kKnob + ")";
  }
  io_uring ring;
  const int r = InitRing(&ring, 2);
  if (r != 0) return std::string("cannot set up an io_uring: ") + std::strerror(-r);
  io_uring_queue_exit(&ring);
  return "";
}

UringTransport::UringTransport(fuse_session* se, void* userdata) : se_(se) {
  nr_queues_ = PossibleCpus();
  queues_ = std::make_unique<Queue[]>(nr_queues_);
  for (unsigned q = 0; q < nr_queues_; ++q) {
    queues_[q].qid = q;
    queues_[q].se = se;
    queues_[q].userdata = userdata;
  }
}

UringTransport::~UringTransport() { Stop(); }

unsigned UringTransport::queues() const { return nr_queues_; }

int UringTransport::Start() {
  // The ring threads take no asynchronous signals: the /dev/fuse loop's
  // threads do (libfuse's handlers end the session), and an io_uring wait
  // is never interrupted halfway. The synchronous ones stay open: SIGBUS is
  // how a media error in the mapping reaches the media layer's handler
  // (media.hpp, RunFaultGuarded), and a fault of a blocked one kills.
  sigset_t all, old;
  sigfillset(&all);
  for (int sig : {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&all, sig);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int status = 0;
  unsigned created = 0;
  for (; created < nr_queues_; ++created) {
    Queue& q = queues_[created];
    try {
      q.thread = std::thread([&q] { q.Run(); });
    } catch (const std::system_error& e) {
      status = -e.code().value();
      break;
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  for (unsigned i = 0; i < created; ++i) {
    Queue& q = queues_[i];
    std::unique_lock lock(q.mu);
    q.cv.wait(lock, [&q] { return q.reported; });
    if (q.status != 0 && status == 0) status = q.status;
  }
  started_ = true;
  if (status != 0) {
    Stop();
    TellKernelNoRing(fuse_session_fd(se_));
  }
  return status;
}

void UringTransport::Stop() {
  if (!started_) return;
  started_ = false;
  for (unsigned i = 0; i < nr_queues_; ++i) {
    Queue& q = queues_[i];
    q.stop.store(true);
    if (q.event_fd >= 0) {
      const uint64_t one = 1;
      (void)!write(q.event_fd, &one, sizeof one);
    }
  }
  for (unsigned i = 0; i < nr_queues_; ++i) {
    Queue& q = queues_[i];
    if (q.thread.joinable()) q.thread.join();
    // Closing the ring cancels the entries still waiting for a request
    // (fuse_uring_cancel); the kernel ends what is left when the connection
    // goes.
    if (q.ring_ok) io_uring_queue_exit(&q.ring);
    q.ring_ok = false;
    if (q.event_fd >= 0) close(q.event_fd);
    q.event_fd = -1;
    if (q.memory != nullptr) munmap(q.memory, kEntrySize * kQueueDepth);
    q.memory = nullptr;
  }
}

void UringTransport::Queue::Pin(bool on) {
  // Unpinned: the CPUs the daemon was given, no more. A CPU it may not run
  // on leaves the thread unpinned: it still serves.
  cpu_set_t cpus = allowed;
  if (on) {
    if (!CPU_ISSET(qid, &allowed)) return;
    CPU_ZERO(&cpus);
    CPU_SET(qid, &cpus);
  }
  const bool set = sched_setaffinity(0, sizeof cpus, &cpus) == 0;
  pinned = on && set;
}

// The kernel hands a request to the queue of the CPU its caller runs on.
// One caller waiting for one request at a time is served fastest by the
// thread on that CPU (the caller sleeps; no wake-up crosses CPUs: pinned,
// a round trip costs half what it does unpinned). A caller that keeps many
// requests in flight (fio at depth, one thread) keeps its CPU busy
// submitting, and a thread pinned beside it halves both: so while requests
// come in batches the thread may run anywhere (seed 001's 4 KiB reads at
// depth 32: 1.6x; doc/bench.md, "Reads at queue depth"), and it goes back
// to its CPU after kSingleRounds rounds of one request each.
void UringTransport::Queue::Spread(unsigned served) {
  constexpr unsigned kSingleRounds = 64;
  if (served > 1) {
    single_rounds = 0;
    if (pinned) Pin(false);
  } else if (served == 1 && !pinned && ++single_rounds >= kSingleRounds) {
    Pin(true);
  }
}

int UringTransport::Queue::Setup() {
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &allowed);
  }
  Pin(true);
  char name[16];
  std::snprintf(name, sizeof name, "nvfs-ring-%u", qid);
  pthread_setname_np(pthread_self(), name);

  event_fd = eventfd(0, EFD_CLOEXEC);
  if (event_fd < 0) return -errno;
  int r = InitRing(&ring, kQueueDepth + 1);  // the entries and the stop poll
  if (r != 0) return r;
  ring_ok = true;
  int fd = fuse_session_fd(se);
  r = io_uring_register_files(&ring, &fd, 1);
  if (r != 0) return r;
  // Populated now, on this CPU's node, so serving takes no page fault.
  memory = mmap(nullptr, kEntrySize * kQueueDepth, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (memory == MAP_FAILED) {
    memory = nullptr;
    return -ENOMEM;
  }
  for (unsigned i = 0; i < kQueueDepth; ++i) {
    Entry& e = entries[i];
    char* base = static_cast<char*>(memory) + i * kEntrySize;
    e.queue = this;
    e.header = reinterpret_cast<uring_abi::ReqHeader*>(base);
    e.payload = base + kHeaderArea + kFrontArea;
    e.iov[0] = {e.header, sizeof(uring_abi::ReqHeader)};
    e.iov[1] = {e.payload, kPayloadSize};
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) return -EIO;  // the ring has kQueueDepth + 1
    PrepareCommand(sqe, uring_abi::kCmdRegister, qid, 0, &e);
    sqe->addr = reinterpret_cast<uint64_t>(e.iov);
    sqe->len = 2;
  }
  io_uring_sqe* poll = io_uring_get_sqe(&ring);
  if (poll == nullptr) return -EIO;
  io_uring_prep_poll_add(poll, event_fd, POLLIN);
  io_uring_sqe_set_data64(poll, kEventData);
  r = io_uring_submit(&ring);
  if (r < 0) return r;
  if (const char* delay = std::getenv("NVFS_TEST_RING_SETUP_DELAY_MS")) {
    usleep(static_cast<useconds_t>(std::atoi(delay)) * 1000);  // tests/mount/mount_uring.sh
  }
  // A REGISTER the kernel refuses completes at once; one it takes stays
  // pending until a request comes, and one may come at once (the last
  // queue to register makes the ring ready, and requests held back for it
  // go out): such a completion stays for Run to serve. So does the end of
  // the connection (-ENOTCONN, -ECONNABORTED: an unmount while this thread
  // waited for its CPU between the submit and this peek, which the other
  // queues' requests may already have come through): not a refusal, the
  // session is ending, and Run lets the entry go.
  io_uring_cqe* cqe = nullptr;
  if (io_uring_peek_cqe(&ring, &cqe) == 0 && cqe->res < 0 && cqe->res != -ENOTCONN &&
      cqe->res != -ECONNABORTED) {
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    return res;
  }
  return 0;
}

void UringTransport::Queue::Run() {
  const int s = Setup();
  Report(s);
  if (s != 0) return;
  while (!stop.load(std::memory_order_relaxed)) {
    const int r = io_uring_submit_and_wait(&ring, 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      // Nothing the protocol expects. The thread stays: a queue without a
      // thread would leave its CPU's callers waiting until the unmount.
      std::fprintf(stderr, "nvfs: io_uring queue %u: io_uring_enter: %s\n", qid, std::strerror(-r));
      usleep(1000);
    }
    unsigned head;
    unsigned seen = 0;
    unsigned served = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      const uint64_t data = io_uring_cqe_get_data64(cqe);
      if (data == kEventData) {
        stop.store(true);
        continue;
      }
      Entry& e = *reinterpret_cast<Entry*>(data);
      if (cqe->res == 0) {
        ++served;
        Serve(e);
        Commit(e);
      } else if (cqe->res == -EAGAIN || cqe->res == -EINTR) {
        Resubmit(e);  // the kernel did not take the command: again
      }
      // Otherwise the entry is gone: -ENOTCONN/-ECONNABORTED when the
      // connection ends (unmount, abort), -ENOTCONN for a cancel. Nothing
      // to do; the stop poll ends the thread.
    }
    io_uring_cq_advance(&ring, seen);
    Spread(served);
  }
  // Hand the kernel the replies committed in the last batch.
  io_uring_submit(&ring);
}

void UringTransport::Queue::Serve(Entry& e) {
  fuse_in_header in;
  std::memcpy(&in, e.header->in_out, sizeof in);
  uring_abi::EntInOut io;
  std::memcpy(&io, &e.header->ring_ent_in_out, sizeof io);
  e.commit_id = io.commit_id;
  e.unique = in.unique;
  e.replied = false;
  // in.len counts the header, the first argument (in op_in) and the
  // payload; the first argument is what is left.
  const size_t payload = io.payload_sz;
  if (in.len >= sizeof in + payload && in.len - sizeof in - payload <= uring_abi::kOpInOutSize &&
      payload <= kPayloadSize) {
    const size_t arg = in.len - sizeof in - payload;
    char* start = e.payload - arg - sizeof in;
    std::memcpy(start, &in, sizeof in);
    std::memcpy(start + sizeof in, e.header->op_in, arg);
    fuse_buf buf{};
    buf.mem = start;
    buf.size = static_cast<size_t>(ObserveRequest(start, in.len, userdata));
    current_entry = &e;
    fuse_session_process_buf(se, &buf);
    current_entry = nullptr;
  }
  if (!e.replied) {
    // A request libfuse did not answer (or a malformed one): answer EIO, so
    // the caller does not wait for ever.
    fuse_out_header out{};
    out.len = sizeof out;
    out.error = -EIO;
    out.unique = in.unique;
    std::memcpy(e.header->in_out, &out, sizeof out);
    io.payload_sz = 0;
    std::memcpy(&e.header->ring_ent_in_out, &io, sizeof io);
  }
}

io_uring_sqe* UringTransport::Queue::NextSqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  if (sqe == nullptr) {  // one SQE per entry: cannot happen; flush and retry
    io_uring_submit(&ring);
    sqe = io_uring_get_sqe(&ring);
  }
  return sqe;  // null: the kernel ends the request with the connection
}

void UringTransport::Queue::Commit(Entry& e) {
  io_uring_sqe* sqe = NextSqe();
  if (sqe == nullptr) return;
  e.last_cmd = uring_abi::kCmdCommitAndFetch;
  PrepareCommand(sqe, uring_abi::kCmdCommitAndFetch, qid, e.commit_id, &e);
}

void UringTransport::Queue::Resubmit(Entry& e) {
  io_uring_sqe* sqe = NextSqe();
  if (sqe == nullptr) return;
  PrepareCommand(sqe, e.last_cmd, qid, e.last_cmd == uring_abi::kCmdRegister ? 0 : e.commit_id, &e);
  if (e.last_cmd == uring_abi::kCmdRegister) {
    sqe->addr = reinterpret_cast<uint64_t>(e.iov);
    sqe->len = 2;
  }
}

bool TakeRingReply(const iovec* iov, int count, ssize_t* written) {
  Entry* e = current_entry;
  if (e == nullptr || count < 1 || iov[0].iov_len != sizeof(fuse_out_header)) return false;
  fuse_out_header out;
  std::memcpy(&out, iov[0].iov_base, sizeof out);
  if (out.unique != e->unique) return false;  // a notification: /dev/fuse
  size_t len = 0;
  for (int i = 1; i < count; ++i) {
    if (iov[i].iov_len > kPayloadSize - len) {
      out.error = -EIO;
      len = 0;
      break;
    }
    len += iov[i].iov_len;
  }
  // The map read path's runs point into the mapping: a media error there
  // (a poisoned page, the backing file cut short) faults this copy, where
  // over /dev/fuse the kernel's copy fails the writev with EFAULT. Either
  // way the reader gets EIO and the daemon lives. Those runs may be changing
  // meanwhile, as over /dev/fuse (a read racing a write to the same bytes;
  // the MapGuard keeps them the file's until the reply is sent):
  // CopyRacing (util/races.hpp).
  char* const payload = e->payload;
  const bool copied = len == 0 || RunFaultGuarded([&] {
    size_t at = 0;
    for (int i = 1; i < count; ++i) {
      CopyRacing(payload + at, iov[i].iov_base, iov[i].iov_len);
      at += iov[i].iov_len;
    }
  });
  if (!copied) {
    std::fprintf(stderr, "nvfs: media error while copying a read reply into the io_uring entry: EIO\n");
    out.error = -EIO;
    len = 0;
  }
  out.len = static_cast<uint32_t>(sizeof out + len);
  std::memcpy(e->header->in_out, &out, sizeof out);
  uring_abi::EntInOut io;
  std::memcpy(&io, &e->header->ring_ent_in_out, sizeof io);
  io.payload_sz = static_cast<uint32_t>(len);
  std::memcpy(&e->header->ring_ent_in_out, &io, sizeof io);
  e->replied = true;
  *written = static_cast<ssize_t>(sizeof out + len);
  return true;
}

}  // namespace nvfs
