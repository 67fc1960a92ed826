// The Catch2 main of every test binary. Catch2 2.x has no skip of its own: a
// case that skips says so (NVFS_SKIP, tests/lib/skip_count.hpp) and Catch2
// counts it as passed. A run in which cases ran and every one skipped exits
// 77, meson's SKIP, so that the summary says SKIP rather than OK; its output
// keeps the "NVFS-SKIPPED: why" lines that tools/lib/count_tests.py counts.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>

#include "skip_count.hpp"

namespace nvfs::test {
namespace {

std::atomic<int> skipped_cases{0};
std::atomic<int> run_cases{0};

class CaseCounter : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    ++run_cases;
  }
};

}  // namespace

void CountSkipped() { ++skipped_cases; }

void PrintSkipped(const char* why) {
  CountSkipped();
  std::printf("NVFS-SKIPPED: %s\n", why);
  std::fflush(stdout);
}

}  // namespace nvfs::test

namespace {
using nvfs::test::CaseCounter;
CATCH_REGISTER_LISTENER(CaseCounter)
}  // namespace

int main(int argc, char* argv[]) {
  const int failed = Catch::Session().run(argc, argv);
  const int run = nvfs::test::run_cases.load();
  if (failed == 0 && run > 0 && nvfs::test::skipped_cases.load() >= run) return 77;
  return failed == 77 ? 78 : failed;  // 77 failures are not a skip
}
