// The crash-state harness (doc/integrity.md, "How the crash suite checks the
// argument").
//
// A workload is a list of steps (each one filesystem operation, or a short
// fixed group of them) run on a small pre-populated namespace mounted on a
// RecordingMedia. While a step runs, every fence and every operation end is a
// crash point; at each, with P the lines pending since the last fence, the
// enumerator builds crash images: none of P; all of P; each single line; all
// but one; every pair when |P| <= 8; the power set when |P| <= 4; 16 seeded
// random subsets with random in-order prefixes per line (crash_enumerator.hpp).
// They are deduplicated per step (by the image's bytes) and capped per crash
// point and per workload, spread over the step's crash points. After the
// step, each image is checked:
//  1. mounting it (journal recovery, orphans) succeeds;
//  2. its tree equals the tree before or after the step (bytes of an
//     overwrite or a punch may mix old and new; a fallocate spanning
//     transactions may have allocated part of its range), with the link
//     counts the tree implies;
//  3. after a clean unmount, CheckNamespace (no repair) exits 0;
//  4. every file, extended by 64 KiB, reads zeros there; deleting
//     everything returns the free block and inode counts to those of an
//     empty namespace;
//  5. for a sample, the mount's own fences are crash points too: each such
//     image, mounted again, must give the same tree and free counts.
// Besides, at every operation end of the workload itself nothing may be left
// unflushed or unfenced (RecordingMedia::violations), and its volatile image
// is write-protected outside the media's store functions.
//
// Every crash state has an id `workload:point:subset:seed` (and
// `:rpoint:rsubset` for a crash during recovery); a failure prints it and the
// command that replays that one case (NVFS_CRASH_REPLAY). Crash points are
// numbered across the workload's steps; subsets in the order above. The
// workload is deterministic but for timestamps: an inode's times are stored
// from the first byte that changed, so if a second boundary falls elsewhere
// in the replay a pending line may hold one piece more or less, and a subset
// number then names a neighbouring state (the replay prints the lines).
//
// Environment:
//   NVFS_CRASH_CAP=N        unique states checked per workload (default 160)
//   NVFS_CRASH_POINT_CAP=N  unique states kept per crash point (default 24)
//   NVFS_CRASH_ALL=1        no caps: every unique state of every point
//   NVFS_CRASH_RECOVERY=N   crash the recovery of every Nth state (default 6; 0: never)
//   NVFS_CRASH_SEED=N       seed of the random subsets and random steps (default 1)
//   NVFS_CRASH_ONLY=text    run only workloads whose name contains text
//   NVFS_CRASH_REPLAY=id    run the one crash state `id` and describe it
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "crash_tree.hpp"
#include "testing/recording_media.hpp"
#include "nvfs/fs.hpp"

namespace nvfs::test {

struct ReplayId {
  std::string workload;
  uint64_t point = 0;
  uint64_t subset = 0;
  uint64_t seed = 0;
  std::optional<std::pair<uint64_t, uint64_t>> recovery;  // rpoint, rsubset
};
std::optional<ReplayId> ParseReplayId(const std::string& text);

struct CrashConfig {
  uint64_t seed = 1;
  size_t workload_cap = 160;
  size_t point_cap = 24;
  size_t recovery_every = 6;
  size_t recovery_cap = 6;  // crash states per crashed recovery
  std::string only;
  std::optional<ReplayId> replay;
  static CrashConfig FromEnv();
};
// A cap as the suite prints it ("none" for NVFS_CRASH_ALL).
std::string CapText(size_t cap);

// The namespace every workload starts from (see PopulateStandard in
// crash_harness.cpp): an 8 MiB namespace, mkfs'd with a fixed hash seed.
struct ImageSpec {
  uint64_t size = 8ull << 20;
  uint32_t journal_slot_size = 0;  // 0: mkfs's default
  uint32_t block_size = 4096;
  // Bytes of namespace past the filesystem's end (the grow workloads grow
  // into them): the namespace is size + room bytes, mkfs'd for size.
  uint64_t room = 0;
  bool operator<(const ImageSpec& o) const {
    return std::tie(size, journal_slot_size, block_size, room) <
           std::tie(o.size, o.journal_slot_size, o.block_size, o.room);
  }
};

struct BaseImage {
  ImageSpec spec;
  std::vector<std::byte> bytes;  // cleanly unmounted
  uint64_t empty_free_blocks = 0;  // of the same namespace freshly made
  uint64_t empty_free_inodes = 0;
};
const BaseImage& StandardImage(const ImageSpec& spec = {});

// A media that forwards to one it does not own, so one image can be mounted
// several times in a row.
std::unique_ptr<Media> BorrowMedia(Media& target);

class StepContext;

struct Step {
  std::string name;
  std::function<void(StepContext&)> run;
};

struct Workload {
  std::string name;  // no ':'
  ImageSpec image;
  std::function<void(StepContext&)> setup;  // not a crash point; may be empty
  std::vector<Step> steps;
};

// What a step sees. Failures throw StepFailure (caught by the runner; steps
// run outside the filesystem's code, so unwinding is safe).
class StepContext {
 public:
  Filesystem& fs() { return *fs_; }
  std::mt19937_64& rng() { return rng_; }
  // The tree before this step.
  const Tree& tree() const { return *tree_; }

  uint64_t Ino(const std::string& path);
  // Parent directory's inode and the last component.
  std::pair<uint64_t, std::string> Parent(const std::string& path);
  void Expect(const Status& st, const std::string& what);
  template <class T>
  T Expect(Result<T> r, const std::string& what) {
    if (!r.ok()) Fail(what + ": " + r.error().Describe());
    return std::move(r.value());
  }
  [[noreturn]] void Fail(const std::string& what);

  // Open files kept across steps, by a name of the workload's choosing.
  void Keep(const std::string& name, FileHandle file) { handles_[name] = file; }
  FileHandle Handle(const std::string& name);
  void Close(const std::string& name);

  // Inode numbers a workload's setup names for the steps or threads that
  // follow (the concurrent workloads: a path may move under another thread).
  void Remember(const std::string& key, uint64_t ino) { inos_[key] = ino; }
  uint64_t Known(const std::string& key);
  const std::map<std::string, uint64_t>& known() const { return inos_; }

  // What the step does, when its name does not say (random steps).
  void Note(const std::string& what) { note_ = what; }

  // The step overwrites bytes in place: they may mix after a crash.
  void AllowMixed(const std::string& path, uint64_t offset, uint64_t len);
  // The step drops the file's privileges first, then overwrites bytes in
  // place (MixedRange::kPrivilegesFirst).
  void AllowPrivilegesFirst(const std::string& path, uint64_t offset, uint64_t len);
  // The step allocates in several transactions: a crash may leave part of it.
  void AllowPartialAllocation(const std::string& path);
  // The file is on the orphan list with blocks past its size (an open
  // append word's): a mount after a crash frees them.
  void AllowReserveFreed(const std::string& path);
  // Simulates a power failure now (everything durable survives) and mounts
  // again; the new mount's fences are crash points of this step.
  void CrashAndRemount();
  // Releases the open files, unmounts cleanly and mounts again; the release,
  // the unmount and the mount are all crash points of this step.
  void CleanRemount();
  // The same with `offline` run on the unmounted namespace in between (a
  // grow): its fences are crash points of this step too, and a crash image
  // may hold the geometry before or after the step (harness step 4 expects
  // the free counts of an empty namespace of the geometry it finds).
  void CleanRemount(const std::function<void(StepContext&, Media&)>& offline);

 private:
  friend class WorkloadRunner;
  friend class ConcurrentRunner;
  friend class SequenceModel;
  Filesystem* fs_ = nullptr;
  class WorkloadRunner* runner_ = nullptr;
  std::mt19937_64 rng_;
  const Tree* tree_ = nullptr;
  std::map<std::string, FileHandle> handles_;
  std::map<std::string, uint64_t> inos_;
  std::optional<MixedRange> mixed_;
  std::string note_;
};

struct StepFailure {
  std::string what;
};

// Every workload runs with an inode on the orphan list: /d2/keep-open,
// unlinked and kept open (as "keep-open"), so every crash image also
// exercises orphan recovery.
void KeepAnOrphan(StepContext& ctx);

struct WorkloadResult {
  std::string name;
  uint64_t points = 0;      // crash points seen while steps ran
  uint64_t candidates = 0;  // unique crash states found (after dedup, before caps)
  uint64_t checked = 0;     // crash states mounted and checked
  uint64_t recovery_checked = 0;  // crash states inside a recovery, checked
  bool capped = false;
  double seconds = 0;
  std::vector<std::string> failures;
  std::string Summary() const;
};

WorkloadResult RunWorkload(const Workload& workload, const CrashConfig& config);

struct CrashState;

// Whether a recovered tree is one the workload allows: "" when it is, else
// what is wrong with it.
using TreeCheck = std::function<std::string(const Tree&)>;

// Checks crash states (steps 1-5 above; `matches` is step 2), adding to
// `result` its counts and failures. Every Nth state also crashes inside its
// own recovery (NVFS_CRASH_RECOVERY).
class StateChecker {
 public:
  StateChecker(const std::string& workload, const CrashConfig& config, const BaseImage& image,
               WorkloadResult& result)
      : workload_(workload), config_(config), image_(image), result_(result) {}
  // `step_base`: the image `state` is expressed against.
  void Check(const CrashState& state, const std::vector<std::byte>& step_base,
             const std::string& step, const TreeCheck& matches);
  // The filesystem's size before and after the step being checked: a crash
  // image must hold one of them (only a grow changes it). 0: not checked.
  void set_block_counts(uint64_t before, uint64_t after) {
    blocks_before_ = before;
    blocks_after_ = after;
  }

 private:
  // The free blocks and inodes of an empty namespace of geometry `g`: the
  // standard image's when it is that image's geometry, else theirs plus what
  // a grow from it to `g` adds (every added block but the new groups'
  // metadata, every added inode).
  std::pair<uint64_t, uint64_t> EmptyFreeCounts(const Geometry& g) const;
  bool replaying() const { return config_.replay.has_value(); }
  void Failure(const std::string& what) { result_.failures.push_back(what); }

  const std::string& workload_;
  const CrashConfig& config_;
  const BaseImage& image_;
  WorkloadResult& result_;
  uint64_t sampled_ = 0;
  uint64_t blocks_before_ = 0;
  uint64_t blocks_after_ = 0;
};

// Runs the workloads (those NVFS_CRASH_ONLY / NVFS_CRASH_REPLAY select),
// prints one line per workload and a total to stdout, and returns the results.
std::vector<WorkloadResult> RunWorkloads(const std::string& suite,
                                         const std::vector<Workload>& workloads);

}  // namespace nvfs::test
