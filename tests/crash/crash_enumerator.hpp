// The crash-state enumerator of the crash suite (crash_harness.hpp): at each
// crash point of a RecordingMedia, the crash images worth mounting, as the
// lines where they differ from a base image.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "testing/recording_media.hpp"

namespace nvfs::test {

// Lines of an image and their bytes (kLine each), in offset order.
struct LineSet {
  std::vector<uint64_t> lines;
  std::vector<std::byte> bytes;
  void Add(uint64_t line, const std::byte* b) {
    lines.push_back(line);
    bytes.insert(bytes.end(), b, b + RecordingMedia::kLine);
  }
  void PreloadInto(RecordingMedia& media) const {
    for (size_t i = 0; i < lines.size(); ++i) {
      media.Preload(lines[i], bytes.data() + i * RecordingMedia::kLine, RecordingMedia::kLine);
    }
  }
};

// One crash image, as the lines where it differs from the enumerator's base.
struct CrashState {
  uint64_t point = 0;
  uint64_t subset = 0;
  std::string label;
  std::string op;
  std::string pending;  // a description of the pending lines (replay)
  uint64_t context = 0;  // what the enumerator's context function said at the point
  std::shared_ptr<const LineSet> settled;  // durable lines, shared by one point's states
  LineSet chosen;                          // the pending lines' chosen prefixes

  std::unique_ptr<RecordingMedia> Materialize(const std::byte* base, uint64_t size,
                                              const RecordingOptions& options) const {
    auto media = std::make_unique<RecordingMedia>(base, size, options);
    settled->PreloadInto(*media);
    chosen.PreloadInto(*media);
    return media;
  }
};

// Collects the crash states of the crash points it sees, deduplicated, at
// most point_cap per point, and (to bound memory) only as many per point as
// a round-robin selection of `budget` states over the points seen so far can
// take: the first states of every point are what Select checks first.
class Enumerator {
 public:
  struct Filter {
    uint64_t point;
    uint64_t subset;
  };

  // `base`: the image the states are expressed against (it must not change
  // while the enumerator is attached). `next_point` numbers crash points
  // across several enumerators of one workload.
  Enumerator(const std::byte* base, uint64_t size, uint64_t seed, size_t point_cap,
             size_t budget, uint64_t* next_point, std::optional<Filter> filter)
      : base_(base), size_(size), seed_(seed), point_cap_(point_cap), budget_(budget),
        next_point_(next_point), filter_(filter) {}

  void Attach(RecordingMedia& media) {
    media.ResetTouched();
    media.set_crash_hook([this](const RecordingMedia& m, const RecordingMedia::CrashPoint& p) {
      OnPoint(m, p);
    });
  }
  static void Detach(RecordingMedia& media) { media.set_crash_hook(nullptr); }
  // Called at every crash point (under the media's lock); its value is kept
  // in the point's states (the concurrent runner: which operations had
  // returned and which were in flight).
  void set_context(std::function<uint64_t()> context) { context_ = std::move(context); }
  // Lines the media changed relative to base before a remount: they stay
  // part of every later state's difference.
  void Carry(const RecordingMedia& media) { carried_.insert(media.touched().begin(), media.touched().end()); }

  // At most `budget` states, spread over the crash points: the first state of
  // every point, then the second of every point, and so on.
  std::vector<const CrashState*> Select(size_t budget) const {
    std::vector<const CrashState*> selected;
    for (size_t round = 0; selected.size() < budget; ++round) {
      bool any = false;
      for (const auto& states : kept_) {
        if (round < states.size() && selected.size() < budget) {
          selected.push_back(&states[round]);
          any = true;
        }
      }
      if (!any) break;
    }
    return selected;
  }
  uint64_t points() const { return points_; }
  uint64_t unique() const { return seen_.size(); }

 private:
  void OnPoint(const RecordingMedia& media, const RecordingMedia::CrashPoint& point);

  const std::byte* base_;
  uint64_t size_;
  uint64_t seed_;
  size_t point_cap_;
  size_t budget_;
  uint64_t* next_point_;
  std::optional<Filter> filter_;
  std::function<uint64_t()> context_;
  std::set<uint64_t> carried_;
  std::unordered_set<uint64_t> seen_;
  std::vector<std::vector<CrashState>> kept_;  // per point that had new states
  uint64_t points_ = 0;
};

}  // namespace nvfs::test
