#include "crash_enumerator.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <sstream>

#include "nvfs/crc32c.hpp"

namespace nvfs::test {

namespace {

constexpr uint64_t kRandomSubsets = 16;

struct Pick {
  enum Kind { kNone, kAll, kSingle, kAllButOne, kPair, kMask, kRandom } kind;
  uint64_t a = 0;
  uint64_t b = 0;
};

// none, all, then one of each kind in turn (single, all-but-one, pair,
// power-set member, random), so a cap keeps a mix of every kind.
std::vector<Pick> SubsetOrder(size_t n) {
  std::vector<std::vector<Pick>> kinds(5);
  for (uint64_t i = 0; i < n; ++i) kinds[0].push_back({Pick::kSingle, i});
  for (uint64_t i = 0; i < n && n > 1; ++i) kinds[1].push_back({Pick::kAllButOne, i});
  if (n <= 8) {
    for (uint64_t i = 0; i < n; ++i) {
      for (uint64_t j = i + 1; j < n; ++j) kinds[2].push_back({Pick::kPair, i, j});
    }
  }
  if (n <= 4) {
    for (uint64_t mask = 0; mask < (uint64_t{1} << n); ++mask) kinds[3].push_back({Pick::kMask, mask});
  }
  if (n > 0) {
    for (uint64_t r = 0; r < kRandomSubsets; ++r) kinds[4].push_back({Pick::kRandom, r});
  }
  std::vector<Pick> order{{Pick::kNone}};
  if (n > 0) order.push_back({Pick::kAll});
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (const auto& kind : kinds) {
      if (i < kind.size()) {
        order.push_back(kind[i]);
        any = true;
      }
    }
    if (!any) break;
  }
  return order;
}

std::vector<size_t> Prefixes(const Pick& pick, const std::vector<size_t>& counts, uint64_t seed,
                             uint64_t point) {
  const size_t n = counts.size();
  std::vector<size_t> prefixes(n, 0);
  switch (pick.kind) {
    case Pick::kNone: break;
    case Pick::kAll: prefixes = counts; break;
    case Pick::kSingle: prefixes[pick.a] = counts[pick.a]; break;
    case Pick::kAllButOne:
      prefixes = counts;
      prefixes[pick.a] = 0;
      break;
    case Pick::kPair:
      prefixes[pick.a] = counts[pick.a];
      prefixes[pick.b] = counts[pick.b];
      break;
    case Pick::kMask:
      for (size_t i = 0; i < n; ++i) {
        if (pick.a >> i & 1) prefixes[i] = counts[i];
      }
      break;
    case Pick::kRandom: {
      std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull ^ (point << 20) ^ pick.a);
      for (size_t i = 0; i < n; ++i) {
        if (rng() & 1) prefixes[i] = 1 + rng() % counts[i];
      }
      break;
    }
  }
  return prefixes;
}

std::string Label(const Pick& pick) {
  switch (pick.kind) {
    case Pick::kNone: return "none of the pending lines";
    case Pick::kAll: return "all pending lines";
    case Pick::kSingle: return "only pending line " + std::to_string(pick.a);
    case Pick::kAllButOne: return "all pending lines but " + std::to_string(pick.a);
    case Pick::kPair: return "pending lines " + std::to_string(pick.a) + "+" + std::to_string(pick.b);
    case Pick::kMask: return "pending-line mask " + std::to_string(pick.a);
    case Pick::kRandom: return "random prefixes #" + std::to_string(pick.a);
  }
  return "?";
}

// A line's contribution to an image's hash: images are compared by the sum
// over the lines where they differ from the base, which does not depend on
// how those lines split between durable and pending.
uint64_t LineHash(uint64_t line, const std::byte* bytes) {
  uint64_t x = (uint64_t{Crc32c(0, bytes, RecordingMedia::kLine)} << 32 |
                Crc32c(0x5EED, bytes, RecordingMedia::kLine)) ^ (line * 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

void Enumerator::OnPoint(const RecordingMedia& media, const RecordingMedia::CrashPoint& point) {
  const uint64_t index = (*next_point_)++;
  ++points_;
  if (filter_ && filter_->point != index) return;
  const uint64_t context = context_ ? context_() : 0;
  const auto& pending = media.pending();
  std::vector<uint64_t> pending_lines;
  std::vector<size_t> counts;
  for (const auto& [offset, line] : pending) {
    pending_lines.push_back(offset);
    counts.push_back(line.writes.size());
  }
  // The lines that differ from base whatever the crash keeps: stored since
  // Attach (or carried over a remount) and durable, not pending.
  auto settled = std::make_shared<LineSet>();
  uint64_t settled_hash = 0;
  std::byte line_bytes[RecordingMedia::kLine];
  const auto settle = [&](uint64_t line) {
    if (pending.count(line)) return;
    const std::byte* durable = media.durable() + line;
    if (std::memcmp(durable, base_ + line, RecordingMedia::kLine) == 0) return;
    settled->Add(line, durable);
    settled_hash += LineHash(line, durable);
  };
  if (carried_.empty()) {
    for (uint64_t line : media.touched()) settle(line);
  } else {
    std::vector<uint64_t> lines;
    std::set_union(media.touched().begin(), media.touched().end(), carried_.begin(),
                   carried_.end(), std::back_inserter(lines));
    for (uint64_t line : lines) settle(line);
  }

  // Each pending line with none or all of its writes, computed once.
  struct Ends {
    std::byte none[RecordingMedia::kLine];
    std::byte all[RecordingMedia::kLine];
    uint64_t none_hash = 0;  // 0 when equal to base
    uint64_t all_hash = 0;
  };
  std::vector<Ends> ends(pending_lines.size());
  {
    size_t i = 0;
    for (const auto& [offset, line] : pending) {
      Ends& e = ends[i++];
      std::memcpy(e.none, media.durable() + offset, RecordingMedia::kLine);
      std::memcpy(e.all, e.none, RecordingMedia::kLine);
      RecordingMedia::ApplyWrites(line, line.writes.size(), e.all);
      if (std::memcmp(e.none, base_ + offset, RecordingMedia::kLine) != 0) {
        e.none_hash = LineHash(offset, e.none);
      }
      if (std::memcmp(e.all, base_ + offset, RecordingMedia::kLine) != 0) {
        e.all_hash = LineHash(offset, e.all);
      }
    }
  }
  // The line `i` with `prefix` writes, and its hash (0: equal to base).
  const auto line_with = [&](size_t i, size_t prefix, std::byte* out) -> uint64_t {
    const Ends& e = ends[i];
    if (prefix == 0) {
      std::memcpy(out, e.none, RecordingMedia::kLine);
      return e.none_hash;
    }
    if (prefix >= counts[i]) {
      std::memcpy(out, e.all, RecordingMedia::kLine);
      return e.all_hash;
    }
    std::memcpy(out, e.none, RecordingMedia::kLine);
    RecordingMedia::ApplyWrites(pending.at(pending_lines[i]), prefix, out);
    if (std::memcmp(out, base_ + pending_lines[i], RecordingMedia::kLine) == 0) return 0;
    return LineHash(pending_lines[i], out);
  };

  std::vector<CrashState> states;
  const std::vector<Pick> order = SubsetOrder(pending_lines.size());
  for (uint64_t subset = 0; subset < order.size() && states.size() < point_cap_; ++subset) {
    if (filter_ && filter_->subset != subset) continue;
    const std::vector<size_t> prefixes = Prefixes(order[subset], counts, seed_, index);
    uint64_t hash = settled_hash;
    for (size_t i = 0; i < pending_lines.size(); ++i) {
      const size_t p = prefixes[i];
      if (p == 0) {
        hash += ends[i].none_hash;
      } else if (p >= counts[i]) {
        hash += ends[i].all_hash;
      } else {
        hash += line_with(i, p, line_bytes);
      }
    }
    if (!filter_ && !seen_.insert(hash).second) continue;
    CrashState state;
    for (size_t i = 0; i < pending_lines.size(); ++i) {
      if (line_with(i, prefixes[i], line_bytes) != 0) state.chosen.Add(pending_lines[i], line_bytes);
    }
    state.point = index;
    state.subset = subset;
    state.label = Label(order[subset]);
    state.op = point.op;
    state.context = context;
    state.settled = settled;
    if (filter_) {
      std::ostringstream out;
      out << (point.kind == RecordingMedia::PointKind::kFence ? "fence" : "operation end")
          << " in '" << point.op << "', " << pending_lines.size() << " pending line(s):";
      for (size_t i = 0; i < pending_lines.size(); ++i) {
        out << " " << pending_lines[i] << "[" << prefixes[i] << "/" << counts[i] << "]";
      }
      state.pending = out.str();
    }
    states.push_back(std::move(state));
  }
  if (!states.empty()) kept_.push_back(std::move(states));
  if (filter_) return;
  // The fewest rounds of Select that reach the budget with the points seen so
  // far; more points only lower it, so nothing beyond it is ever selected.
  const auto selected_in = [&](size_t rounds) {
    size_t n = 0;
    for (const auto& kept : kept_) n += std::min(kept.size(), rounds);
    return n;
  };
  if (selected_in(point_cap_) <= budget_) return;
  size_t low = 1, high = point_cap_;
  while (low < high) {
    const size_t mid = (low + high) / 2;
    if (selected_in(mid) >= budget_) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  for (auto& kept : kept_) {
    if (kept.size() > low) kept.resize(low);
  }
}

}  // namespace nvfs::test
