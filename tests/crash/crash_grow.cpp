// The grow workloads of the crash suite (crash_workloads.hpp, GrowWorkloads):
// an offline grow of a full filesystem (nvfs-resize's GrowOffline) between a
// clean unmount and a mount, and writes into the space it added. A crash at
// every fence of the grow must leave the geometry before it or after it,
// fsck-clean, with every file as it was (crash_harness.hpp, steps 1-5, and
// the geometry check of the runner).
#include <fcntl.h>

#include <string>

#include "crash_ops.hpp"
#include "crash_workloads.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/resize.hpp"

namespace nvfs::test {

using namespace ops;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// A step: unmount cleanly, grow the namespace to `size` bytes, mount.
Step GrowTo(uint64_t size) {
  return Step{"grow offline to " + std::to_string(size >> 10) + " KiB", [size](StepContext& c) {
                c.CleanRemount([size](StepContext& ctx, Media& media) {
                  Result<GrowPlan> plan = GrowOffline(media, size);
                  if (!plan.ok()) ctx.Fail("grow: " + plan.error().Describe());
                  if (!plan->grows()) ctx.Fail("grow: nothing grew");
                });
                if (c.fs().geometry().bytes() != size) c.Fail("grown to the wrong size");
              }};
}

// Two steps (a crash between them shows an empty file, neither tree).
std::vector<Step> WritePast(const std::string& path, uint64_t len) {
  return {Step{"create " + path, [path](StepContext& c) { Create(c, path); }},
          Step{"write " + std::to_string(len >> 10) + " KiB to " + path + " past the old end",
               [path, len](StepContext& c) { Write(c, path, 0, Bytes(len, 9)); }}};
}

// A step: grow the mounted filesystem to `size` bytes (Filesystem::Grow),
// with an unlinked file held open across it (the runner's keep-open).
Step GrowMountedTo(uint64_t size) {
  return Step{"grow mounted to " + std::to_string(size >> 10) + " KiB", [size](StepContext& c) {
                Result<Filesystem::GrowResult> grown = c.fs().Grow(size);
                if (!grown.ok()) c.Fail("grow: " + grown.error().Describe());
                if (c.fs().geometry().bytes() != size) c.Fail("grown to the wrong size");
                if (c.fs().GetStatFs()->blocks != size / c.fs().block_size()) {
                  c.Fail("statfs does not show the new size");
                }
              }};
}

Workload G(std::string name, ImageSpec image, std::vector<Step> steps) {
  return Workload{std::move(name), image, FillUp, std::move(steps)};  // grown blocks take what follows
}

}  // namespace

std::vector<Workload> GrowWorkloads() {
  const auto then = [](Step grow, std::vector<Step> more) {
    more.insert(more.begin(), std::move(grow));
    return more;
  };
  std::vector<Workload> w;
  // Each grow both ways: offline (GrowTo), then mounted (GrowMountedTo,
  // Filesystem::Grow: the same transaction while an unlinked file is held
  // open, then writes into the new space on the same mount).
  struct Way {
    std::string prefix;  // of the workloads' names
    Step (*grow)(uint64_t);
    std::string twice;  // the name of the one that grows twice
  };
  for (const Way& way : {Way{"grow-", GrowTo, "grow-small-slots-twice"},
                         Way{"grow-mounted-", GrowMountedTo, "grow-mounted-twice"}}) {
    // Inside group 0 (4 KiB blocks: 128 MiB groups): the backup block moves
    // and the blocks past the old end join the group.
    w.push_back(G(way.prefix + "in-group", ImageSpec{8 * kMiB, 0, 4096, 4 * kMiB},
                  then(way.grow(12 * kMiB), WritePast("/d1/past", 2 * kMiB))));
    // Group 0 fills up and a new group 1 is added.
    w.push_back(G(way.prefix + "new-group", ImageSpec{8 * kMiB, 0, 4096, 128 * kMiB},
                  then(way.grow(136 * kMiB), WritePast("/d1/past", 1 * kMiB))));
    // 4 KiB journal slots: the grow's records (a 2 KiB backup copy among
    // them) fit one slot; twice in a row, the second from the geometry the
    // first left.
    w.push_back(G(way.twice, ImageSpec{8 * kMiB, 4096, 4096, 2 * kMiB},
                  {way.grow(9 * kMiB), way.grow(10 * kMiB)}));
  }
  // 64 KiB blocks.
  w.push_back(G("grow-bs64k", ImageSpec{16 * kMiB, 0, 65536, 4 * kMiB}, {GrowTo(20 * kMiB)}));
  return w;
}

}  // namespace nvfs::test
