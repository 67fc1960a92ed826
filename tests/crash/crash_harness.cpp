// The workload runner and the checks of each crash state (crash_harness.hpp).
#include "crash_harness.hpp"

#include <fcntl.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "crash_enumerator.hpp"
#include "nvfs/crc32c.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs::test {

// ---------------------------------------------------------------------------
// Configuration and crash-state ids
// ---------------------------------------------------------------------------

namespace {

uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  return std::strtoull(text, nullptr, 0);
}

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

std::string FormatId(const std::string& workload, uint64_t point, uint64_t subset, uint64_t seed,
                     const std::optional<std::pair<uint64_t, uint64_t>>& recovery = {}) {
  std::string id = workload + ":" + std::to_string(point) + ":" + std::to_string(subset) + ":" +
                   std::to_string(seed);
  if (recovery) id += ":" + std::to_string(recovery->first) + ":" + std::to_string(recovery->second);
  return id;
}

std::string ReplayHint(const std::string& id) {
  return "replay alone: NVFS_CRASH_REPLAY=" + id + " ./build/tests/crash/test_crash";
}

}  // namespace

std::optional<ReplayId> ParseReplayId(const std::string& text) {
  const std::vector<std::string> parts = Split(text, ':');
  if (parts.size() != 4 && parts.size() != 6) return std::nullopt;
  ReplayId id;
  id.workload = parts[0];
  id.point = std::strtoull(parts[1].c_str(), nullptr, 10);
  id.subset = std::strtoull(parts[2].c_str(), nullptr, 10);
  id.seed = std::strtoull(parts[3].c_str(), nullptr, 10);
  if (parts.size() == 6) {
    id.recovery = std::make_pair(std::strtoull(parts[4].c_str(), nullptr, 10),
                                 std::strtoull(parts[5].c_str(), nullptr, 10));
  }
  return id;
}

CrashConfig CrashConfig::FromEnv() {
  CrashConfig c;
  c.seed = EnvNumber("NVFS_CRASH_SEED", c.seed);
  c.workload_cap = EnvNumber("NVFS_CRASH_CAP", c.workload_cap);
  c.point_cap = EnvNumber("NVFS_CRASH_POINT_CAP", c.point_cap);
  c.recovery_every = EnvNumber("NVFS_CRASH_RECOVERY", c.recovery_every);
  if (EnvNumber("NVFS_CRASH_ALL", 0) != 0) {
    c.workload_cap = SIZE_MAX;
    c.point_cap = SIZE_MAX;
  }
  if (const char* only = std::getenv("NVFS_CRASH_ONLY")) c.only = only;
  if (const char* replay = std::getenv("NVFS_CRASH_REPLAY"); replay && *replay) {
    c.replay = ParseReplayId(replay);
    if (!c.replay) {
      std::fprintf(stderr, "NVFS_CRASH_REPLAY=%s: expected workload:point:subset:seed\n", replay);
      std::exit(2);
    }
    c.seed = c.replay->seed;
  }
  return c;
}

std::string CapText(size_t cap) { return cap == SIZE_MAX ? "none" : std::to_string(cap); }

std::string WorkloadResult::Summary() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%-28s %5" PRIu64 " crash points %6" PRIu64 " unique states %5" PRIu64
                " checked %4" PRIu64 " in recovery%s %6.1fs%s",
                name.c_str(), points, candidates, checked, recovery_checked,
                capped ? " (capped)" : "", seconds, failures.empty() ? "" : "  FAILED");
  return buf;
}

namespace {

// Bytes every file is extended by after recovery, to see what lay past its end.
constexpr uint64_t kExtensionCheck = 64 << 10;
// Crash states kept per crash point inside a recovery.
constexpr size_t kRecoveryPointCap = 4;

RecordingOptions PlainOptions() {
  RecordingOptions o;
  o.record = false;
  return o;
}

}  // namespace

// ---------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------

class WorkloadRunner {
 public:
  WorkloadRunner(const Workload& workload, const CrashConfig& config)
      : workload_(workload), config_(config), image_(StandardImage(workload.image)) {
    result_.name = workload.name;
  }

  WorkloadResult Run();
  void Remount(StepContext& ctx, bool clean,
               const std::function<void(StepContext&, Media&)>* offline = nullptr);

 private:
  void Failure(const std::string& what) { result_.failures.push_back(what); }
  std::unique_ptr<RecordingMedia> NewWorkloadMedia(const std::byte* bytes) const {
    RecordingOptions o;
    o.keep_log = false;
    o.protect = true;
    return std::make_unique<RecordingMedia>(bytes, image_.bytes.size(), o);
  }
  void TakeViolations(const std::string& where) {
    for (const auto& v : media_->violations()) Failure(workload_.name + ": " + where + ": " + v.Describe());
    media_->ClearViolations();
  }
  bool replaying() const { return config_.replay.has_value(); }

  const Workload& workload_;
  const CrashConfig& config_;
  const BaseImage& image_;
  WorkloadResult result_;
  RecordingMedia* media_ = nullptr;  // owned by fs_
  std::unique_ptr<Filesystem> fs_;
  std::vector<std::byte> step_base_;
  Enumerator* enumerator_ = nullptr;  // of the step running
  uint64_t next_point_ = 0;
  StateChecker checker_{workload_.name, config_, image_, result_};
};

void StepContext::Fail(const std::string& what) { throw StepFailure{what}; }

void KeepAnOrphan(StepContext& ctx) {
  const uint64_t keep = ctx.Ino("/d2/keep-open");
  ctx.Keep("keep-open", ctx.Expect(ctx.fs().Open(keep, O_RDWR), "open keep-open"));
  ctx.Expect(ctx.fs().Unlink(ctx.Ino("/d2"), "keep-open"), "unlink keep-open");
}

void StepContext::Expect(const Status& st, const std::string& what) {
  if (!st.ok()) Fail(what + ": " + st.error().Describe());
}

uint64_t StepContext::Ino(const std::string& path) {
  return Expect(ResolvePath(fs(), path), "resolve " + path);
}

std::pair<uint64_t, std::string> StepContext::Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == 0 ? "/" : path.substr(0, slash);
  return {Ino(dir), path.substr(slash + 1)};
}

uint64_t StepContext::Known(const std::string& key) {
  auto it = inos_.find(key);
  if (it == inos_.end()) Fail("the setup named no inode " + key);
  return it->second;
}

FileHandle StepContext::Handle(const std::string& name) {
  auto it = handles_.find(name);
  if (it == handles_.end()) Fail("no open file named " + name);
  return it->second;
}

void StepContext::Close(const std::string& name) {
  FileHandle file = Handle(name);
  handles_.erase(name);
  fs().Release(file);
}

void StepContext::AllowMixed(const std::string& path, uint64_t offset, uint64_t len) {
  mixed_ = MixedRange{MixedRange::kBytes, path, offset, len};
}

void StepContext::AllowPrivilegesFirst(const std::string& path, uint64_t offset, uint64_t len) {
  mixed_ = MixedRange{MixedRange::kPrivilegesFirst, path, offset, len};
}

void StepContext::AllowPartialAllocation(const std::string& path) {
  mixed_ = MixedRange{MixedRange::kAllocation, path, 0, 0};
}

void StepContext::AllowReserveFreed(const std::string& path) {
  mixed_ = MixedRange{MixedRange::kReserveFreed, path, 0, 0, fs().block_size()};
}

void StepContext::CrashAndRemount() { runner_->Remount(*this, /*clean=*/false); }
void StepContext::CleanRemount() { runner_->Remount(*this, /*clean=*/true); }
void StepContext::CleanRemount(const std::function<void(StepContext&, Media&)>& offline) {
  runner_->Remount(*this, /*clean=*/true, &offline);
}

void WorkloadRunner::Remount(StepContext& ctx, bool clean,
                             const std::function<void(StepContext&, Media&)>* offline) {
  if (clean) {
    for (auto& [name, file] : ctx.handles_) fs_->Release(file);
    ctx.handles_.clear();
    ctx.Expect(fs_->Unmount(), "unmount");
    if (offline != nullptr) (*offline)(ctx, *media_);
  }
  // After a crash, open files die with the process: their handles are
  // dropped, not released.
  ctx.handles_.clear();
  std::vector<std::byte> durable(media_->durable(), media_->durable() + media_->size());
  if (enumerator_ != nullptr) enumerator_->Carry(*media_);
  Enumerator::Detach(*media_);
  fs_.reset();  // after a crash, its clean unmount lands on the abandoned media
  auto media = NewWorkloadMedia(durable.data());
  media_ = media.get();
  // The new mount's fences are crash points of the step that remounts.
  if (enumerator_ != nullptr) enumerator_->Attach(*media_);
  Result<std::unique_ptr<Filesystem>> fs = Filesystem::Mount(std::move(media), {});
  if (!fs.ok()) ctx.Fail("remount after a simulated crash: " + fs.error().Describe());
  fs_ = std::move(fs.value());
  ctx.fs_ = fs_.get();
}

WorkloadResult WorkloadRunner::Run() {
  const auto start = std::chrono::steady_clock::now();
  {
    auto media = NewWorkloadMedia(image_.bytes.data());
    media_ = media.get();
    Result<std::unique_ptr<Filesystem>> fs = Filesystem::Mount(std::move(media), {});
    if (!fs.ok()) {
      Failure(workload_.name + ": mount of the standard image: " + fs.error().Describe());
      return result_;
    }
    fs_ = std::move(fs.value());
  }
  StepContext ctx;
  ctx.fs_ = fs_.get();
  ctx.runner_ = this;
  ctx.rng_.seed(config_.seed);
  Tree before;
  try {
    KeepAnOrphan(ctx);
    if (workload_.setup) workload_.setup(ctx);
    before = ctx.Expect(SnapshotTree(*fs_), "tree before the first step");
  } catch (const StepFailure& f) {
    Failure(workload_.name + ": setup: " + f.what);
    return result_;
  }
  TakeViolations("setup");

  size_t budget_left = config_.workload_cap;
  for (size_t k = 0; k < workload_.steps.size(); ++k) {
    const Step& step = workload_.steps[k];
    step_base_.assign(media_->durable(), media_->durable() + media_->size());
    const uint64_t blocks_before = fs_->geometry().block_count();
    std::optional<Enumerator::Filter> filter;
    if (replaying()) filter = Enumerator::Filter{config_.replay->point, config_.replay->subset};
    const size_t steps_left = workload_.steps.size() - k;
    const size_t budget = replaying() ? SIZE_MAX : budget_left / steps_left;
    Enumerator enumerator(step_base_.data(), step_base_.size(), config_.seed, config_.point_cap,
                          budget, &next_point_, filter);
    enumerator_ = &enumerator;
    enumerator.Attach(*media_);
    ctx.tree_ = &before;
    ctx.mixed_.reset();
    ctx.note_.clear();
    ctx.rng_.seed(config_.seed * 1000003 + k * 7919 +
                  Crc32c(0, workload_.name.data(), workload_.name.size()));
    bool failed = false;
    try {
      step.run(ctx);
    } catch (const StepFailure& f) {
      Failure(workload_.name + ": step '" + step.name + (ctx.note_.empty() ? "" : ": " + ctx.note_) +
              "': " + f.what);
      failed = true;
    }
    Enumerator::Detach(*media_);
    enumerator_ = nullptr;
    const std::string step_name = ctx.note_.empty() ? step.name : step.name + ": " + ctx.note_;
    TakeViolations("step '" + step_name + "'");
    result_.points += enumerator.points();
    if (failed) break;
    Result<Tree> after = SnapshotTree(*fs_);
    if (!after.ok()) {
      Failure(workload_.name + ": tree after step '" + step_name + "': " + after.error().Describe());
      break;
    }
    if (std::string links = CheckLinkCounts(*after); !links.empty()) {
      Failure(workload_.name + ": after step '" + step_name + "' (no crash): " + links);
    }
    checker_.set_block_counts(blocks_before, fs_->geometry().block_count());
    result_.candidates += enumerator.unique();
    const std::vector<const CrashState*> selected = enumerator.Select(budget);
    if (selected.size() < enumerator.unique() && !replaying()) result_.capped = true;
    budget_left -= std::min(budget_left, selected.size());
    const MixedRange* mixed = ctx.mixed_ ? &*ctx.mixed_ : nullptr;
    const auto matches = [&](const Tree& tree) -> std::string {
      if (TreeMatches(tree, before, *after, mixed)) return "";
      return "the tree is neither the one before nor the one after the step:\n    vs before: " +
             TreeDiff(before, tree) + "\n    vs after:  " + TreeDiff(*after, tree);
    };
    for (const CrashState* state : selected) checker_.Check(*state, step_base_, step_name, matches);
    before = std::move(after.value());
  }
  for (auto& [name, file] : ctx.handles_) fs_->Release(file);
  ctx.handles_.clear();
  Status st = fs_->Unmount();
  if (!st.ok()) Failure(workload_.name + ": unmount: " + st.error().Describe());
  TakeViolations("unmount");
  fs_.reset();
  result_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result_;
}

std::pair<uint64_t, uint64_t> StateChecker::EmptyFreeCounts(const Geometry& g) const {
  const Geometry base =
      FindSuper(image_.bytes.data(), image_.bytes.size()).value().geometry;
  if (g.block_count() == base.block_count()) {
    return {image_.empty_free_blocks, image_.empty_free_inodes};
  }
  const auto data_blocks = [](const Geometry& geometry) {
    uint64_t blocks = 0;
    for (uint32_t group = 0; group < geometry.group_count(); ++group) {
      blocks += geometry.GroupBlocks(group) - geometry.GroupMetaBlocks(group);
    }
    return blocks - 1;  // the backup block
  };
  return {image_.empty_free_blocks + data_blocks(g) - data_blocks(base),
          image_.empty_free_inodes +
              uint64_t{g.group_count() - base.group_count()} * g.inodes_per_group()};
}

// Mounts one crash image and checks it (crash_harness.hpp, steps 1-5).
void StateChecker::Check(const CrashState& state, const std::vector<std::byte>& step_base,
                         const std::string& step, const TreeCheck& matches) {
  ++result_.checked;
  const std::string id = FormatId(workload_, state.point, state.subset, config_.seed);
  const auto fail = [&](const std::string& what) {
    Failure(id + " (step '" + step + "', crash in '" + state.op + "', " + state.label + "): " +
            what + "\n    " + ReplayHint(id));
  };
  if (replaying()) {
    std::cout << "replaying " << id << ": step '" << step << "', " << state.label << "\n  "
              << state.pending << "\n  " << state.settled->lines.size() + state.chosen.lines.size()
              << " line(s) differ from the image before the step\n";
  }
  const uint64_t size = step_base.size();
  std::unique_ptr<RecordingMedia> crashed =
      state.Materialize(step_base.data(), size, PlainOptions());

  // A sample also crashes inside its own recovery.
  const bool crash_recovery =
      replaying() ? config_.replay->recovery.has_value()
                  : config_.recovery_every != 0 && sampled_++ % config_.recovery_every == 0;
  uint64_t recovery_points = 0;
  std::optional<Enumerator> recovery;
  std::unique_ptr<Media> mount_media;
  RecordingMedia* recovering = nullptr;
  if (crash_recovery) {
    RecordingOptions o;
    o.keep_log = false;
    o.compare_at_op_end = false;
    auto media = std::make_unique<RecordingMedia>(crashed->base(), size, o);
    recovering = media.get();
    std::optional<Enumerator::Filter> filter;
    if (replaying()) {
      filter = Enumerator::Filter{config_.replay->recovery->first, config_.replay->recovery->second};
    }
    recovery.emplace(crashed->base(), size, config_.seed, kRecoveryPointCap,
                     replaying() ? SIZE_MAX : config_.recovery_cap, &recovery_points, filter);
    recovery->Attach(*media);
    mount_media = std::move(media);
  } else {
    mount_media = BorrowMedia(*crashed);
  }

  Result<std::unique_ptr<Filesystem>> mounted = Filesystem::Mount(std::move(mount_media), {});
  if (recovering != nullptr) Enumerator::Detach(*recovering);
  if (!mounted.ok()) return fail("mount failed: " + mounted.error().Describe());
  Filesystem& fs = **mounted;
  if (recovering != nullptr) {
    for (const auto& v : recovering->violations()) fail("during recovery: " + v.Describe());
  }
  if (const uint64_t blocks = fs.geometry().block_count();
      blocks_before_ != 0 && blocks != blocks_before_ && blocks != blocks_after_) {
    return fail("the filesystem has " + std::to_string(blocks) + " blocks, neither the " +
                std::to_string(blocks_before_) + " before the step nor the " +
                std::to_string(blocks_after_) + " after it");
  }
  Result<Tree> tree = SnapshotTree(fs);
  if (!tree.ok()) return fail("tree after recovery: " + tree.error().Describe());
  if (std::string links = CheckLinkCounts(*tree); !links.empty()) {
    return fail("after recovery: " + links);
  }
  if (std::string why = matches(*tree); !why.empty()) return fail(why);
  const StatFs counts = fs.GetStatFs().value();
  Status st = fs.Unmount();
  if (!st.ok()) return fail("unmount: " + st.error().Describe());
  std::string said;
  const FsckReport report = CheckNamespace(fs.media(), RepairMode::kNone,
                                           [&](const std::string& line) { said += "\n      " + line; });
  if (report.exit_code != kFsckClean) {
    fail("fsck exit code " + std::to_string(report.exit_code) + ", " +
         std::to_string(report.problems) + " problem(s):" + said);
  }
  {
    Result<std::unique_ptr<Filesystem>> again = Filesystem::Mount(BorrowMedia(fs.media()), {});
    if (!again.ok()) return fail("second mount: " + again.error().Describe());
    Status zeros = CheckExtensionsRead0(**again, *tree, kExtensionCheck);
    if (!zeros.ok()) fail("after recovery, a file extended by truncate: " + zeros.error().Describe());
    Status deleted = DeleteAll(**again);
    if (!deleted.ok()) return fail("deleting everything: " + deleted.error().Describe());
    const StatFs empty = (*again)->GetStatFs().value();
    const auto [empty_blocks, empty_inodes] = EmptyFreeCounts((*again)->geometry());
    if (empty.blocks_free != empty_blocks || empty.inodes_free != empty_inodes) {
      fail("after deleting everything " + std::to_string(empty.blocks_free) + " blocks and " +
           std::to_string(empty.inodes_free) + " inodes are free; an empty namespace has " +
           std::to_string(empty_blocks) + " and " + std::to_string(empty_inodes));
    }
    (void)(*again)->Unmount();
  }

  if (!recovery) return;
  const std::vector<const CrashState*> selected =
      recovery->Select(replaying() ? SIZE_MAX : config_.recovery_cap);
  for (const CrashState* rstate : selected) {
    ++result_.recovery_checked;
    const std::string rid = FormatId(workload_, state.point, state.subset, config_.seed,
                                     std::make_pair(rstate->point, rstate->subset));
    const auto rfail = [&](const std::string& what) {
      Failure(rid + " (step '" + step + "', crash in '" + state.op + "', " + state.label +
              "; then a crash during recovery in '" + rstate->op + "', " + rstate->label +
              "): " + what + "\n    " + ReplayHint(rid));
    };
    auto media = rstate->Materialize(crashed->base(), size, PlainOptions());
    Result<std::unique_ptr<Filesystem>> remounted = Filesystem::Mount(BorrowMedia(*media), {});
    if (!remounted.ok()) {
      rfail("mount failed: " + remounted.error().Describe());
      continue;
    }
    Result<Tree> rtree = SnapshotTree(**remounted);
    if (!rtree.ok()) {
      rfail("tree: " + rtree.error().Describe());
      continue;
    }
    if (*rtree != *tree) {
      rfail("a second recovery gives another tree: " + TreeDiff(*tree, *rtree));
      continue;
    }
    const StatFs rcounts = (*remounted)->GetStatFs().value();
    if (rcounts.blocks_free != counts.blocks_free || rcounts.inodes_free != counts.inodes_free) {
      rfail("a second recovery leaves " + std::to_string(rcounts.blocks_free) + " blocks and " +
            std::to_string(rcounts.inodes_free) + " inodes free; the first left " +
            std::to_string(counts.blocks_free) + " and " + std::to_string(counts.inodes_free));
    }
  }
}

WorkloadResult RunWorkload(const Workload& workload, const CrashConfig& config) {
  WorkloadRunner runner(workload, config);
  return runner.Run();
}

std::vector<WorkloadResult> RunWorkloads(const std::string& suite,
                                         const std::vector<Workload>& workloads) {
  const CrashConfig config = CrashConfig::FromEnv();
  std::vector<WorkloadResult> results;
  uint64_t points = 0, candidates = 0, checked = 0, recovery = 0;
  double seconds = 0;
  for (const Workload& w : workloads) {
    if (config.replay && config.replay->workload != w.name) continue;
    if (!config.only.empty() && w.name.find(config.only) == std::string::npos) continue;
    results.push_back(RunWorkload(w, config));
    const WorkloadResult& r = results.back();
    std::cout << "crash: " << r.Summary() << std::endl;
    points += r.points;
    candidates += r.candidates;
    checked += r.checked;
    recovery += r.recovery_checked;
    seconds += r.seconds;
  }
  if (results.empty() && (config.replay || !config.only.empty())) return results;
  std::cout << "crash: " << suite << " total: " << results.size() << " workloads, " << points
            << " crash points, " << candidates << " unique crash states, " << checked
            << " checked + " << recovery << " crashes inside recovery, " << seconds << " s"
            << " (seed " << config.seed << ", cap " << CapText(config.workload_cap) << "/workload, "
            << CapText(config.point_cap) << "/point)" << std::endl;
  return results;
}

}  // namespace nvfs::test
