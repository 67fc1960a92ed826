// The concurrent crash workloads and their runner (crash_concurrent.hpp).
#include "crash_concurrent.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "crash_enumerator.hpp"
#include "crash_ops.hpp"
#include "nvfs/crc32c.hpp"
#include "nvfs/format.hpp"
#include "nvfs/geometry.hpp"

namespace nvfs::test {

namespace {

// ---------------------------------------------------------------------------
// The scheduler
// ---------------------------------------------------------------------------

// The kernel's state of one of our threads: 'R' running or runnable, 'S'
// asleep (a futex: a lock or a condition variable), ... '?' if unreadable.
char ThreadState(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", static_cast<int>(tid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return '?';
  char buf[512];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return '?';
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');
  return paren != nullptr && paren[1] == ' ' ? paren[2] : '?';
}

class Scheduler;
thread_local Scheduler* tl_scheduler = nullptr;
thread_local size_t tl_worker = 0;

// Lets one worker thread at a time past its next media event (the gate),
// chosen by a seeded generator among the workers parked at a gate, once every
// other worker is parked, finished, or asleep on a lock.
class Scheduler {
 public:
  static constexpr size_t kNone = SIZE_MAX;

  Scheduler(uint64_t seed, size_t workers) : rng_(seed), workers_(workers) {}

  // Worker side. Enter first (it parks until the first grant), Leave last.
  void Enter(size_t id) {
    tl_scheduler = this;
    tl_worker = id;
    Worker& w = workers_[id];
    w.arriving.store(true);
    std::unique_lock lock(mu_);
    w.tid = static_cast<pid_t>(syscall(SYS_gettid));
    Park(lock, id);
  }
  void Gate() {
    if (tl_scheduler != this) return;
    Worker& w = workers_[tl_worker];
    w.arriving.store(true);  // before the lock: asleep on mu_ is not blocked
    std::unique_lock lock(mu_);
    Park(lock, tl_worker);
  }
  void Leave() {
    Worker& w = workers_[tl_worker];
    w.arriving.store(true);
    std::lock_guard lock(mu_);
    w.left = true;
    tl_scheduler = nullptr;
    cv_.notify_all();
  }
  // The clock that orders operation begins, ends and crash points.
  uint64_t Tick() { return clock_.fetch_add(1) + 1; }
  uint64_t Now() const { return clock_.load(); }

  // Driver side: chooses until every worker has left. "" or what went wrong
  // (a worker that never parks again: a hang in the filesystem).
  std::string Drive() {
    using Clock = std::chrono::steady_clock;
    std::unique_lock lock(mu_);
    Clock::time_point waiting_since = Clock::now();
    for (;;) {
      std::vector<size_t> parked;
      size_t live = 0;
      bool running = false;
      for (size_t i = 0; i < workers_.size(); ++i) {
        Worker& w = workers_[i];
        if (w.left) continue;
        ++live;
        if (w.parked) {
          parked.push_back(i);
        } else if (w.tid == 0 || w.arriving.load() || ThreadState(w.tid) != 'S') {
          running = true;
        }
      }
      if (live == 0) return "";
      const auto waited = Clock::now() - waiting_since;
      // A worker that neither parks nor sleeps for 2 s spins (a grace period
      // a parked worker holds back): let the others run.
      if ((running && waited < std::chrono::seconds(2)) || parked.empty()) {
        if (parked.empty() && !running && waited > std::chrono::seconds(30)) {
          return "every live worker has slept on a lock for 30 s with none at a gate (a deadlock)";
        }
        if (parked.empty() && waited > std::chrono::seconds(120)) {
          return "no worker reached a gate for 120 s (a hang)";
        }
        cv_.wait_for(lock, std::chrono::microseconds(50));
        continue;
      }
      if (running) ++spins_;
      if (last_ != kNone && !workers_[last_].left && !workers_[last_].parked) ++blocked_;
      // Bursts: the thread that ran goes on with probability 15/16 when it
      // can, else any parked thread; so a switch lands anywhere inside
      // another thread's longer stretches (a uniform choice at every gate
      // would almost never leave one thread alone for 20 gates).
      const bool last_parked = last_ != kNone && !workers_[last_].left && workers_[last_].parked;
      const uint64_t draw = rng_();
      const size_t pick = last_parked && draw % 16 != 0 ? last_ : parked[(draw >> 8) % parked.size()];
      if (pick != last_) ++switches_;
      ++events_;
      if (trace_.empty() || trace_.back().first != pick) {
        trace_.emplace_back(pick, 1);
      } else {
        ++trace_.back().second;
      }
      last_ = pick;
      granted_ = pick;
      cv_.notify_all();
      cv_.wait(lock, [&] { return granted_ == kNone; });
      waiting_since = Clock::now();
    }
  }

  uint64_t switches() const { return switches_; }
  uint64_t events() const { return events_; }
  uint64_t blocked() const { return blocked_; }
  uint64_t spins() const { return spins_; }
  // A hash of the whole trace (replays compare it: crash_concurrent.hpp).
  uint64_t TraceHash() const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const auto& [worker, count] : trace_) {
      h = (h ^ worker) * 0x100000001b3ull;
      h = (h ^ count) * 0x100000001b3ull;
    }
    return h;
  }
  // "A12 B3 A1 ...": which worker went through how many gates in a row.
  std::string Trace(size_t max_runs) const {
    std::string out;
    for (size_t i = 0; i < trace_.size() && i < max_runs; ++i) {
      if (!out.empty()) out += ' ';
      out += static_cast<char>('A' + trace_[i].first);
      out += std::to_string(trace_[i].second);
    }
    if (trace_.size() > max_runs) out += " ... (" + std::to_string(trace_.size()) + " runs)";
    return out;
  }

 private:
  struct Worker {
    pid_t tid = 0;
    bool parked = false;  // protected by mu_
    bool left = false;    // protected by mu_
    std::atomic<bool> arriving{false};
  };

  void Park(std::unique_lock<std::mutex>& lock, size_t id) {
    Worker& w = workers_[id];
    w.parked = true;
    w.arriving.store(false);
    cv_.notify_all();
    cv_.wait(lock, [&] { return granted_ == id; });
    w.parked = false;
    granted_ = kNone;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::mt19937_64 rng_;
  std::vector<Worker> workers_;
  size_t granted_ = kNone;
  size_t last_ = kNone;
  std::atomic<uint64_t> clock_{0};
  uint64_t switches_ = 0, events_ = 0, blocked_ = 0, spins_ = 0;
  std::vector<std::pair<size_t, uint64_t>> trace_;
};

// ---------------------------------------------------------------------------
// Trees compared across orders
// ---------------------------------------------------------------------------

// The inodes of the standard image keep their numbers; those the setup named
// get 1,000,000 + their key's rank; any other (made by the threads) 2,000,000
// + its rank in path order.
Tree Canonical(const Tree& tree, const std::set<uint64_t>& image_inos,
               const std::map<std::string, uint64_t>& known) {
  std::map<uint64_t, uint64_t> relabel;
  uint64_t rank = 0;
  for (const auto& [key, ino] : known) {
    if (!image_inos.contains(ino)) relabel.emplace(ino, 1000000 + rank++);
  }
  uint64_t next = 2000000;
  for (const auto& [path, node] : tree) {
    if (!image_inos.contains(node.ino) && !relabel.contains(node.ino)) relabel.emplace(node.ino, next++);
  }
  const auto label = [&](uint64_t ino) {
    auto it = relabel.find(ino);
    return it == relabel.end() ? ino : it->second;
  };
  Tree out;
  for (const auto& [path, node] : tree) {
    TreeNode n = node;
    n.ino = label(node.ino);
    n.parent = label(node.parent);
    out.emplace(path, std::move(n));
  }
  return out;
}

RecordingOptions PlainOptions() {
  RecordingOptions o;
  o.record = false;
  return o;
}

// ---------------------------------------------------------------------------
// The model: sequences run on one thread
// ---------------------------------------------------------------------------

struct Outcome {
  std::vector<int> results;  // by position in the sequence
  Tree tree;                 // canonical
  std::string error;         // the sequence could not run (a harness failure)
};

}  // namespace

class SequenceModel {
 public:
  SequenceModel(const ConcurrentWorkload& workload, const std::vector<const ThreadOp*>& ops,
                const std::set<uint64_t>& image_inos)
      : workload_(workload), ops_(ops), image_inos_(image_inos) {}

  const Outcome& Run(const std::vector<int>& sequence) {
    auto [it, fresh] = memo_.try_emplace(sequence);
    if (fresh) it->second = Compute(sequence);
    return it->second;
  }
  size_t runs() const { return memo_.size(); }

 private:
  Outcome Compute(const std::vector<int>& sequence) {
    Outcome out;
    const BaseImage& image = StandardImage(workload_.image);
    RecordingMedia plain(image.bytes.data(), image.bytes.size(), PlainOptions());
    Result<std::unique_ptr<Filesystem>> fs = Filesystem::Mount(BorrowMedia(plain), {});
    if (!fs.ok()) {
      out.error = "model: mount: " + fs.error().Describe();
      return out;
    }
    StepContext ctx;
    ctx.fs_ = fs->get();
    try {
      KeepAnOrphan(ctx);
      if (workload_.setup) workload_.setup(ctx);
      for (int op : sequence) {
        out.results.push_back(ops_[op]->run(ctx));
        if (!ops_[op]->releases.empty()) ctx.handles_.erase(ops_[op]->releases);
      }
    } catch (const StepFailure& f) {
      out.error = "model: " + f.what;
      return out;
    }
    Result<Tree> tree = SnapshotTree(**fs);
    if (!tree.ok()) {
      out.error = "model: tree: " + tree.error().Describe();
      return out;
    }
    out.tree = Canonical(*tree, image_inos_, ctx.known());
    for (auto& [name, file] : ctx.handles_) (*fs)->Release(file);
    (void)(*fs)->Unmount();
    return out;
  }

  const ConcurrentWorkload& workload_;
  const std::vector<const ThreadOp*>& ops_;
  const std::set<uint64_t>& image_inos_;
  std::map<std::vector<int>, Outcome> memo_;
};

namespace {

// Lets the scheduler choose again, as a media event would: for operations
// that store nothing (a getattr), so that they interleave with others' gates.
void Yield() {
  if (tl_scheduler != nullptr) tl_scheduler->Gate();
}

// One operation of one run, as the threads saw it.
struct OpRecord {
  size_t thread = 0;
  uint64_t begin = UINT64_MAX;  // Scheduler::Tick before it ran
  uint64_t end = UINT64_MAX;    // and after it returned
  int result = 0;
  std::string failure;  // a StepFailure (a harness error)
};

// The trees of the linearizations allowed at clock `now`
// (crash_concurrent.hpp).
class Linearizations {
 public:
  Linearizations(const std::vector<OpRecord>& records, const std::vector<std::vector<int>>& by_thread,
                 SequenceModel& model)
      : records_(records), by_thread_(by_thread), model_(model) {}

  struct Allowed {
    std::vector<const Outcome*> outcomes;
    std::vector<std::vector<int>> sequences;
    size_t tried = 0;
    size_t done = 0, in_flight = 0;
    std::string model_error;
  };

  const Allowed& At(uint64_t now) {
    auto [it, fresh] = cache_.try_emplace(now);
    if (!fresh) return it->second;
    Allowed& allowed = it->second;
    for (const OpRecord& r : records_) {
      if (Done(r, now)) {
        ++allowed.done;
      } else if (r.begin <= now) {
        ++allowed.in_flight;
      }
    }
    std::vector<int> sequence;
    std::vector<bool> included(records_.size(), false);
    Walk(now, sequence, included, allowed);
    return allowed;
  }

  static bool Done(const OpRecord& r, uint64_t now) { return r.end <= now; }

 private:
  void Walk(uint64_t now, std::vector<int>& sequence, std::vector<bool>& included, Allowed& allowed) {
    bool all_done = true;
    for (size_t i = 0; i < records_.size(); ++i) {
      if (Done(records_[i], now) && !included[i]) all_done = false;
    }
    if (all_done) Consider(now, sequence, allowed);
    for (const std::vector<int>& ops : by_thread_) {
      int next = -1;
      for (int op : ops) {
        if (!included[op]) {
          next = op;
          break;
        }
      }
      if (next < 0 || records_[next].begin > now) continue;
      bool ready = true;
      for (size_t i = 0; i < records_.size() && ready; ++i) {
        if (!included[i] && Done(records_[i], now) && records_[i].end < records_[next].begin) ready = false;
      }
      if (!ready) continue;
      included[next] = true;
      sequence.push_back(next);
      Walk(now, sequence, included, allowed);
      sequence.pop_back();
      included[next] = false;
    }
  }

  void Consider(uint64_t now, const std::vector<int>& sequence, Allowed& allowed) {
    ++allowed.tried;
    const Outcome& outcome = model_.Run(sequence);
    if (!outcome.error.empty()) {
      allowed.model_error = outcome.error;
      return;
    }
    for (size_t k = 0; k < sequence.size(); ++k) {
      const OpRecord& r = records_[sequence[k]];
      if (Done(r, now) && outcome.results[k] != r.result) return;
    }
    allowed.outcomes.push_back(&outcome);
    allowed.sequences.push_back(sequence);
  }

  const std::vector<OpRecord>& records_;
  const std::vector<std::vector<int>>& by_thread_;
  SequenceModel& model_;
  std::map<uint64_t, Allowed> cache_;
};

std::string ErrnoName(int code) {
  if (code == 0) return "ok";
  if (code < 0) return "harness failure";
  const char* name = strerrorname_np(code);
  return name != nullptr ? name : std::to_string(code);
}

}  // namespace

// ---------------------------------------------------------------------------
// The runner: one interleaving of one workload
// ---------------------------------------------------------------------------

class ConcurrentRunner {
 public:
  ConcurrentRunner(const ConcurrentWorkload& workload, const std::vector<const ThreadOp*>& ops,
                   const std::vector<std::vector<int>>& by_thread, SequenceModel& model,
                   const std::set<uint64_t>& image_inos, ConcurrentResult& result)
      : workload_(workload), ops_(ops), by_thread_(by_thread), model_(model),
        image_inos_(image_inos), result_(result) {}

  // False, having checked nothing, when `trace` is given and the
  // interleaving's trace hash is another.
  bool Run(const CrashConfig& config, std::optional<uint64_t> trace);

 private:
  void Failure(const std::string& what) { result_.failures.push_back(what); }
  std::string Describe(const std::vector<OpRecord>& records, const std::vector<int>& sequence) const {
    std::string out;
    for (int op : sequence) {
      if (!out.empty()) out += ", ";
      out += std::string(1, static_cast<char>('A' + records[op].thread)) + ":" + ops_[op]->name;
    }
    return "[" + out + "]";
  }

  const ConcurrentWorkload& workload_;
  const std::vector<const ThreadOp*>& ops_;
  const std::vector<std::vector<int>>& by_thread_;
  SequenceModel& model_;
  const std::set<uint64_t>& image_inos_;
  ConcurrentResult& result_;
};

bool ConcurrentRunner::Run(const CrashConfig& config, std::optional<uint64_t> trace) {
  const auto start = std::chrono::steady_clock::now();
  const std::string where = workload_.name + " (seed " + std::to_string(config.seed) + ")";
  const BaseImage& image = StandardImage(workload_.image);
  RecordingOptions options;
  options.keep_log = false;
  options.protect = true;
  options.concurrent = true;
  auto owned = std::make_unique<RecordingMedia>(image.bytes.data(), image.bytes.size(), options);
  RecordingMedia* media = owned.get();
  Result<std::unique_ptr<Filesystem>> mounted = Filesystem::Mount(std::move(owned), {});
  if (!mounted.ok()) {
    Failure(where + ": mount: " + mounted.error().Describe());
    return true;
  }
  Filesystem& fs = **mounted;
  StepContext ctx;
  ctx.fs_ = &fs;
  try {
    KeepAnOrphan(ctx);
    if (workload_.setup) workload_.setup(ctx);
  } catch (const StepFailure& f) {
    Failure(where + ": setup: " + f.what);
    return true;
  }
  for (const auto& v : media->violations()) Failure(where + ": setup: " + v.Describe());
  media->ClearViolations();

  // The threads, each parked at every media event until the scheduler
  // chooses it; every fence and transaction end is a crash point.
  const std::vector<std::byte> base(media->durable(), media->durable() + media->size());
  const bool replaying = config.replay.has_value();
  std::optional<Enumerator::Filter> filter;
  if (replaying) filter = Enumerator::Filter{config.replay->point, config.replay->subset};
  uint64_t next_point = 0;
  const size_t budget = replaying ? SIZE_MAX : config.workload_cap;
  Scheduler scheduler(config.seed, by_thread_.size());
  Enumerator enumerator(base.data(), base.size(), config.seed, config.point_cap, budget,
                        &next_point, filter);
  enumerator.set_context([&] { return scheduler.Now(); });
  enumerator.Attach(*media);
  media->set_gate([&] { scheduler.Gate(); });
  std::vector<OpRecord> records(ops_.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < by_thread_.size(); ++t) {
    threads.emplace_back([&, t] {
      scheduler.Enter(t);
      for (int op : by_thread_[t]) {
        OpRecord& r = records[op];
        r.thread = t;
        r.begin = scheduler.Tick();
        try {
          r.result = ops_[op]->run(ctx);
        } catch (const StepFailure& f) {
          r.result = -1;
          r.failure = f.what;
        }
        r.end = scheduler.Tick();
      }
      scheduler.Leave();
    });
  }
  const std::string stuck = scheduler.Drive();
  if (!stuck.empty()) {
    // Threads that never return cannot be joined: say why and stop.
    std::fprintf(stderr, "crash: %s: %s; trace %s\n", where.c_str(), stuck.c_str(),
                 scheduler.Trace(64).c_str());
    std::abort();
  }
  for (std::thread& t : threads) t.join();
  media->set_gate(nullptr);
  Enumerator::Detach(*media);
  const auto finish = [&] {
    for (auto& [name, file] : ctx.handles_) fs.Release(file);
    ctx.handles_.clear();
    Status st = fs.Unmount();
    if (!st.ok()) Failure(where + ": unmount: " + st.error().Describe());
  };
  if (trace && scheduler.TraceHash() != *trace) {
    for (size_t i = 0; i < records.size(); ++i) {
      if (!ops_[i]->releases.empty()) ctx.handles_.erase(ops_[i]->releases);
    }
    media->ClearViolations();
    finish();
    return false;
  }
  for (const auto& v : media->violations()) Failure(where + ": " + v.Describe());
  media->ClearViolations();
  for (size_t i = 0; i < records.size(); ++i) {
    if (!records[i].failure.empty()) Failure(where + ": " + ops_[i]->name + ": " + records[i].failure);
    if (!ops_[i]->releases.empty()) ctx.handles_.erase(ops_[i]->releases);
  }

  ++result_.interleavings;
  result_.points += enumerator.points();
  result_.candidates += enumerator.unique();
  result_.switches += scheduler.switches();
  result_.events += scheduler.events();
  result_.blocked += scheduler.blocked();

  // No crash: the tree is that of a linearization of every operation, with
  // the results the threads saw.
  Linearizations linearizations(records, by_thread_, model_);
  std::string results;
  for (size_t i = 0; i < records.size(); ++i) {
    results += (results.empty() ? "" : ", ") + std::string(1, static_cast<char>('A' + records[i].thread)) +
               ":" + ops_[i]->name + " -> " + ErrnoName(records[i].result);
  }
  Result<Tree> after = SnapshotTree(fs);
  if (!after.ok()) {
    Failure(where + ": tree after the threads: " + after.error().Describe());
  } else if (std::string links = CheckLinkCounts(*after); !links.empty()) {
    Failure(where + ": after the threads (no crash): " + links);
  } else {
    const Linearizations::Allowed& all = linearizations.At(scheduler.Now());
    const Tree tree = Canonical(*after, image_inos_, ctx.known());
    bool found = false;
    for (const Outcome* o : all.outcomes) found = found || o->tree == tree;
    if (!all.model_error.empty()) Failure(where + ": " + all.model_error);
    if (all.outcomes.empty()) {
      Failure(where + ": no order of the operations gives the results the threads saw (" +
              results + "; " + std::to_string(all.tried) + " orders tried)");
    } else if (!found) {
      Failure(where + ": the tree after the threads is that of no order of the operations (" +
              results + "): vs " + Describe(records, all.sequences.front()) + ": " +
              TreeDiff(all.outcomes.front()->tree, tree));
    }
  }

  // Every crash state selected.
  const std::vector<const CrashState*> selected = enumerator.Select(budget);
  if (selected.size() < enumerator.unique() && !replaying) result_.capped = true;
  StateChecker checker(workload_.name, config, image, result_);
  checker.set_block_counts(fs.geometry().block_count(), fs.geometry().block_count());
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016" PRIx64, scheduler.TraceHash());
  const std::string step = "threads " + results + "; trace " + hash +
                           " (replay with NVFS_CRASH_TRACE=" + hash + " too)";
  for (const CrashState* state : selected) {
    const Linearizations::Allowed& allowed = linearizations.At(state->context);
    const auto matches = [&](const Tree& actual) -> std::string {
      const Tree tree = Canonical(actual, image_inos_, ctx.known());
      for (const Outcome* o : allowed.outcomes) {
        if (o->tree == tree) return "";
      }
      std::string why = "the tree is that of no order of the " + std::to_string(allowed.done) +
                        " operation(s) that had returned and any of the " +
                        std::to_string(allowed.in_flight) + " in flight (" +
                        std::to_string(allowed.tried) + " orders tried)";
      if (!allowed.model_error.empty()) why += "; " + allowed.model_error;
      if (!allowed.outcomes.empty()) {
        why += ": vs " + Describe(records, allowed.sequences.front()) + ": " +
               TreeDiff(allowed.outcomes.front()->tree, tree);
      }
      return why;
    };
    checker.Check(*state, base, step, matches);
  }
  result_.sequences = model_.runs();

  char line[256];
  std::snprintf(line, sizeof line,
                "seed %-4" PRIu64 " %4" PRIu64 " gates %3" PRIu64 " switches %2" PRIu64
                " blocked %4" PRIu64 " crash points %5" PRIu64 " unique %4zu checked  ",
                config.seed, scheduler.events(), scheduler.switches(), scheduler.blocked(),
                enumerator.points(), enumerator.unique(), selected.size());
  result_.traces.push_back(line + scheduler.Trace(12));

  result_.traces.back() += std::string("  trace ") + hash;
  finish();
  result_.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return true;
}

// ---------------------------------------------------------------------------
// All workloads
// ---------------------------------------------------------------------------

std::vector<ConcurrentResult> RunConcurrentWorkloads(const std::vector<ConcurrentWorkload>& workloads) {
  const CrashConfig base_config = CrashConfig::FromEnv();
  uint64_t interleavings = 3;
  if (const char* text = std::getenv("NVFS_CRASH_INTERLEAVINGS"); text && *text) {
    interleavings = std::strtoull(text, nullptr, 10);
  }
  std::optional<uint64_t> trace;
  if (const char* text = std::getenv("NVFS_CRASH_TRACE"); text && *text) {
    trace = std::strtoull(text, nullptr, 16);
  }
  constexpr size_t kTraceTries = 200;
  std::vector<ConcurrentResult> results;
  ConcurrentResult total;
  for (const ConcurrentWorkload& w : workloads) {
    if (base_config.replay && base_config.replay->workload != w.name) continue;
    if (!base_config.only.empty() && w.name.find(base_config.only) == std::string::npos) continue;
    ConcurrentResult result;
    result.name = w.name;
    std::vector<const ThreadOp*> ops;
    std::vector<std::vector<int>> by_thread(w.threads.size());
    for (size_t t = 0; t < w.threads.size(); ++t) {
      for (const ThreadOp& op : w.threads[t]) {
        by_thread[t].push_back(static_cast<int>(ops.size()));
        ops.push_back(&op);
      }
    }
    std::set<uint64_t> image_inos;
    {
      const BaseImage& image = StandardImage(w.image);
      RecordingMedia plain(image.bytes.data(), image.bytes.size(), PlainOptions());
      Result<std::unique_ptr<Filesystem>> fs = Filesystem::Mount(BorrowMedia(plain), {});
      if (!fs.ok()) {
        result.failures.push_back(w.name + ": the standard image: " + fs.error().Describe());
        results.push_back(std::move(result));
        continue;
      }
      Result<Tree> tree = SnapshotTree(**fs);
      if (!tree.ok()) {
        result.failures.push_back(w.name + ": the standard image: " + tree.error().Describe());
        results.push_back(std::move(result));
        continue;
      }
      for (const auto& [path, node] : *tree) image_inos.insert(node.ino);
      (void)(*fs)->Unmount();
    }
    SequenceModel model(w, ops, image_inos);
    ConcurrentRunner runner(w, ops, by_thread, model, image_inos, result);
    for (uint64_t k = 0; k < interleavings; ++k) {
      CrashConfig config = base_config;
      if (!config.replay) config.seed = base_config.seed + k;
      // A replay runs the seed's interleaving until its trace is the one
      // asked for: a thread woken by an unlock races the unlocking thread
      // for the lock, the one choice the scheduler does not make.
      size_t tries = 0;
      while (!runner.Run(config, trace) && ++tries < kTraceTries) {
      }
      if (tries == kTraceTries) {
        result.failures.push_back(w.name + ": the trace asked for did not come in " +
                                  std::to_string(kTraceTries) + " runs of seed " +
                                  std::to_string(config.seed));
        break;
      }
      std::cout << "crash: " << w.name << "  " << result.traces.back() << std::endl;
      if (config.replay) break;
    }
    std::cout << "crash: " << result.Summary() << "  (" << result.interleavings
              << " interleavings, " << result.events << " gates, " << result.switches
              << " switches, " << result.sequences << " orders run on the model)" << std::endl;
    total.interleavings += result.interleavings;
    total.points += result.points;
    total.candidates += result.candidates;
    total.checked += result.checked;
    total.recovery_checked += result.recovery_checked;
    total.events += result.events;
    total.switches += result.switches;
    total.sequences += result.sequences;
    total.seconds += result.seconds;
    results.push_back(std::move(result));
  }
  if (results.empty()) return results;
  std::cout << "crash: threads total: " << results.size() << " workloads, " << total.interleavings
            << " interleavings, " << total.events << " gates, " << total.switches << " switches, "
            << total.points << " crash points, " << total.candidates << " unique crash states, "
            << total.checked << " checked + " << total.recovery_checked
            << " crashes inside recovery, " << total.sequences << " orders run on the model, "
            << total.seconds << " s (seed " << base_config.seed << ", cap "
            << CapText(base_config.workload_cap) << "/interleaving, "
            << CapText(base_config.point_cap) << "/point)" << std::endl;
  return results;
}

// ---------------------------------------------------------------------------
// The workloads
// ---------------------------------------------------------------------------

namespace {

using ops::kUser;

ThreadOp Op(std::string name, std::function<int(StepContext&)> run, std::string releases = {}) {
  return ThreadOp{std::move(name), std::move(run), std::move(releases)};
}

// "release <handle>": closes the handle a setup kept open.
ThreadOp ReleaseOp(const std::string& handle) {
  return Op("release " + handle, [handle](StepContext& c) {
    c.fs().Release(c.Handle(handle));
    return 0;
  }, handle);
}

int CreateOp(StepContext& c, const std::string& dir, const std::string& name) {
  Attr attr;
  Result<FileHandle> file = c.fs().Create(c.Known(dir), name, 0644, O_RDWR, kUser, &attr);
  if (!file.ok()) return file.code();
  c.fs().Release(*file);
  c.fs().Forget(attr.ino, 1);
  return 0;
}

int MkdirOp(StepContext& c, const std::string& dir, const std::string& name) {
  Result<Attr> attr = c.fs().Mkdir(c.Known(dir), name, 0755, kUser);
  if (!attr.ok()) return attr.code();
  c.fs().Forget(attr->ino, 1);
  return 0;
}

int RenameOp(StepContext& c, const std::string& from_dir, const std::string& from,
             const std::string& to_dir, const std::string& to, unsigned flags = 0) {
  return c.fs().Rename(c.Known(from_dir), from, c.Known(to_dir), to, flags).code();
}

int LinkOp(StepContext& c, const std::string& ino, const std::string& dir, const std::string& name) {
  Result<Attr> attr = c.fs().Link(c.Known(ino), c.Known(dir), name);
  if (!attr.ok()) return attr.code();
  c.fs().Forget(attr->ino, 1);
  return 0;
}

int SetSize(StepContext& c, const std::string& ino, uint64_t size) {
  SetAttrRequest r;
  r.valid = kSetSize;
  r.size = size;
  return c.fs().SetAttr(c.Known(ino), r).code();
}

int Chmod(StepContext& c, const std::string& ino, uint32_t mode) {
  SetAttrRequest r;
  r.valid = kSetMode;
  r.mode = mode;
  return c.fs().SetAttr(c.Known(ino), r).code();
}

int WriteOp(StepContext& c, const std::string& handle, uint64_t offset, size_t len, char seed) {
  const std::string data = ops::Bytes(len, seed);
  Result<size_t> n = c.fs().Write(c.Handle(handle), offset, data.data(), data.size());
  if (!n.ok()) return n.code();
  return *n == len ? 0 : EIO;
}

int SetXattrOp(StepContext& c, const std::string& ino, const std::string& name,
               const std::string& value) {
  return c.fs().SetXattr(c.Known(ino), name, value.data(), value.size(), 0).code();
}

std::string Acl(uint32_t user_perm, uint32_t named_perm, uint32_t mask) {
  constexpr uint32_t kNone = format::kAclUndefinedId;
  const format::AclXattrEntry entries[] = {
      {format::kAclUserObj, static_cast<uint16_t>(user_perm), kNone},
      {format::kAclUser, static_cast<uint16_t>(named_perm), 2000},
      {format::kAclGroupObj, 4, kNone},
      {format::kAclMask, static_cast<uint16_t>(mask), kNone},
      {format::kAclOther, 4, kNone}};
  std::string v(4 + sizeof entries, '\0');
  const uint32_t version = format::kAclXattrVersion;
  std::memcpy(v.data(), &version, 4);
  std::memcpy(v.data() + 4, entries, sizeof entries);
  return v;
}

void Remember(StepContext& c, std::initializer_list<std::pair<const char*, const char*>> names) {
  for (const auto& [key, path] : names) c.Remember(key, c.Ino(path));
}

}  // namespace

std::vector<ConcurrentWorkload> ConcurrentWorkloads() {
  std::vector<ConcurrentWorkload> w;

  // Creates, renames and unlinks in one directory, names crossing.
  w.push_back({"threads-one-dir", {},
               [](StepContext& c) { Remember(c, {{"d1", "/d1"}}); },
               {{Op("create d1/n1", [](auto& c) { return CreateOp(c, "d1", "n1"); }),
                 Op("rename d1/n1 d1/n2", [](auto& c) { return RenameOp(c, "d1", "n1", "d1", "n2"); })},
                {Op("unlink d1/f2", [](auto& c) { return c.fs().Unlink(c.Known("d1"), "f2").code(); }),
                 Op("create d1/n2", [](auto& c) { return CreateOp(c, "d1", "n2"); })},
                {Op("rename d1/f1 d1/n1", [](auto& c) { return RenameOp(c, "d1", "f1", "d1", "n1"); })}}});

  // A directory renamed while names are made inside it, and a rename over it
  // that needs it empty.
  w.push_back({"threads-rename-dir-vs-create", {},
               [](StepContext& c) { Remember(c, {{"d1", "/d1"}, {"d2", "/d2"}, {"sub", "/d1/sub"}}); },
               {{Op("rename d1/sub d2/moved", [](auto& c) { return RenameOp(c, "d1", "sub", "d2", "moved"); })},
                {Op("create sub/a", [](auto& c) { return CreateOp(c, "sub", "a"); }),
                 Op("mkdir sub/b", [](auto& c) { return MkdirOp(c, "sub", "b"); })},
                {Op("rename d1/full d1/sub", [](auto& c) { return RenameOp(c, "d1", "full", "d1", "sub"); })}}});

  // One file written past its end, extended and truncated at once (block-
  // aligned, so each operation is all or nothing).
  w.push_back({"threads-one-file", {},
               [](StepContext& c) {
                 Remember(c, {{"f", "/d1/f2"}});
                 ops::Write(c, "/d1/f2", 0, ops::Bytes(8192, 3));
                 ops::OpenKeep(c, "w", "/d1/f2");
                 ops::OpenKeep(c, "x", "/d1/f2");
               },
               {{Op("write 4K at 12K", [](auto& c) { return WriteOp(c, "w", 12288, 4096, 5); })},
                {Op("fallocate 8K at 20K", [](auto& c) {
                   return c.fs().Fallocate(c.Handle("x"), 0, 20480, 8192).code();
                 })},
                {Op("truncate to 2K", [](auto& c) { return SetSize(c, "f", 2048); }),
                 Op("truncate to 40K", [](auto& c) { return SetSize(c, "f", 40960); })}}});

  // The last name of an open file goes while its last handle writes and is
  // released.
  w.push_back({"threads-unlink-vs-release", {},
               [](StepContext& c) {
                 Remember(c, {{"d2", "/d2"}});
                 ops::OpenKeep(c, "g1", "/d2/g1");
               },
               {{Op("unlink d2/g1", [](auto& c) { return c.fs().Unlink(c.Known("d2"), "g1").code(); })},
                {Op("write 4K at 16K", [](auto& c) { return WriteOp(c, "g1", 16384, 4096, 7); }),
                 ReleaseOp("g1")}}});

  // Extended attributes and ACLs changed while chmod rewrites the mode (and
  // the access ACL's mask).
  w.push_back({"threads-xattr-vs-chmod", {},
               [](StepContext& c) {
                 Remember(c, {{"f1", "/d1/f1"}, {"f2", "/d1/f2"}});
                 SetXattrOp(c, "f2", std::string(format::kAclAccessName), Acl(7, 6, 7));
               },
               {{Op("set f2's access ACL", [](auto& c) {
                   return SetXattrOp(c, "f2", std::string(format::kAclAccessName), Acl(6, 4, 6));
                 }),
                 Op("remove f1's user.big", [](auto& c) {
                   return c.fs().RemoveXattr(c.Known("f1"), "user.big").code();
                 })},
                {Op("chmod f2 0640", [](auto& c) { return Chmod(c, "f2", 0640); }),
                 Op("chmod f1 0600", [](auto& c) { return Chmod(c, "f1", 0600); })},
                {Op("set f2's user.k", [](auto& c) { return SetXattrOp(c, "f2", "user.k", "v"); }),
                 Op("replace f1's user.color", [](auto& c) {
                   return SetXattrOp(c, "f1", "user.color", "red");
                 })}}});

  // The last reference to an inode dropped (its reclaim) while a rename takes
  // its last name.
  w.push_back({"threads-reclaim-vs-rename", {},
               [](StepContext& c) {
                 Remember(c, {{"d1", "/d1"}, {"full", "/d1/full"}});
                 // A lookup reference the forget drops.
                 const uint64_t x = c.Expect(c.fs().Lookup(c.Known("full"), "x"), "lookup x").ino;
                 c.Remember("x", x);
               },
               {{Op("forget full/x", [](auto& c) {
                   c.fs().Forget(c.Known("x"), 1);
                   return 0;
                 })},
                {Op("rename d1/f2 full/x", [](auto& c) { return RenameOp(c, "d1", "f2", "full", "x"); })},
                {Op("create full/y", [](auto& c) { return CreateOp(c, "full", "y"); })}}});

  // A hard link made to an inode whose other names go.
  w.push_back({"threads-link-vs-unlink", {},
               [](StepContext& c) {
                 Remember(c, {{"d1", "/d1"}, {"d2", "/d2"}});
                 // The reference a client holds to the inode it links (the
                 // kernel's dentry of the source): the inode outlives its names.
                 c.Remember("f1", c.Expect(c.fs().Lookup(c.Known("d1"), "f1"), "lookup f1").ino);
               },
               {{Op("link f1 d1/f1b", [](auto& c) { return LinkOp(c, "f1", "d1", "f1b"); })},
                {Op("unlink d2/hl", [](auto& c) { return c.fs().Unlink(c.Known("d2"), "hl").code(); }),
                 Op("unlink d1/f1", [](auto& c) { return c.fs().Unlink(c.Known("d1"), "f1").code(); })}}});

  // A directory removed while a name is made in it.
  w.push_back({"threads-mkdir-vs-rmdir", {},
               [](StepContext& c) { Remember(c, {{"d2", "/d2"}, {"empty", "/d2/empty"}}); },
               {{Op("mkdir empty/a", [](auto& c) { return MkdirOp(c, "empty", "a"); })},
                {Op("rmdir d2/empty", [](auto& c) { return c.fs().Rmdir(c.Known("d2"), "empty").code(); })}}});

  // Three changes of the orphan list at once, on three inodes: two open
  // files lose their last names while the standing orphan is released.
  w.push_back({"threads-orphans", {},
               [](StepContext& c) {
                 Remember(c, {{"d2", "/d2"}, {"root", "/"}});
                 ops::OpenKeep(c, "g1", "/d2/g1");
                 ops::OpenKeep(c, "big", "/big");
               },
               {{Op("unlink d2/g1", [](auto& c) { return c.fs().Unlink(c.Known("d2"), "g1").code(); })},
                {ReleaseOp("keep-open")},
                {Op("unlink /big", [](auto& c) { return c.fs().Unlink(c.Known("root"), "big").code(); }),
                 ReleaseOp("big")}}});

  // Three directories changed at once, with names moving between them:
  // transactions of different directories overlap.
  w.push_back({"threads-three-dirs", {},
               [](StepContext& c) {
                 Remember(c, {{"d1", "/d1"}, {"d2", "/d2"}, {"root", "/"}, {"sub", "/d1/sub"}});
               },
               {{Op("create d1/a", [](auto& c) { return CreateOp(c, "d1", "a"); }),
                 Op("rename d2/g1 d1/g1", [](auto& c) { return RenameOp(c, "d2", "g1", "d1", "g1"); })},
                {Op("mkdir sub/s", [](auto& c) { return MkdirOp(c, "sub", "s"); }),
                 Op("unlink /fifo", [](auto& c) { return c.fs().Unlink(c.Known("root"), "fifo").code(); })},
                {Op("create d2/b", [](auto& c) { return CreateOp(c, "d2", "b"); }),
                 Op("rename /sl d2/sl", [](auto& c) { return RenameOp(c, "root", "sl", "d2", "sl"); })}}});

  // Attributes asked by number while the inode is reclaimed: each answer is
  // the inode's or ESTALE, never damage (a reclaim stores mode 0 before
  // its commit clears the bitmap bit).
  w.push_back({"threads-getattr-vs-reclaim", {},
               [](StepContext& c) {
                 Remember(c, {{"d1", "/d1"}});
                 c.Remember("f2", c.Expect(c.fs().Lookup(c.Known("d1"), "f2"), "lookup f2").ino);
                 c.Expect(c.fs().Unlink(c.Known("d1"), "f2"), "unlink f2");
               },
               {{Op("forget f2 (reclaim)", [](auto& c) {
                   c.fs().Forget(c.Known("f2"), 1);
                   return 0;
                 })},
                {Op("getattr f2 x64", [](auto& c) {
                  for (int i = 0; i < 64; ++i) {
                    Result<Attr> attr = c.fs().GetAttr(c.Known("f2"));
                    if (!attr.ok() && attr.code() != ESTALE) return attr.code();
                    Yield();
                  }
                  return 0;
                })}}});

  return w;
}

}  // namespace nvfs::test
