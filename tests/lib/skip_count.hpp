#ifndef NVFS_TESTS_SKIP_COUNT_HPP_
#define NVFS_TESTS_SKIP_COUNT_HPP_

namespace nvfs::test {

// Counts one test case as skipped (catch_main.cpp): a binary whose every run
// case skipped exits 77. Called by PrintSkipped, once per skipped case.
void CountSkipped();

// Counts the case as skipped and prints the line tools/lib/count_tests.py
// counts as one skipped test case ("NVFS-SKIPPED: why"), on stdout. Catch2
// 2.x has no skip of its own, and would count the case as passed.
void PrintSkipped(const char* why);

// Ends the current test case as skipped, loudly.
#define NVFS_SKIP(why)                    \
  do {                                    \
    WARN("SKIPPED: " << (why));           \
    ::nvfs::test::PrintSkipped(why);      \
    return;                               \
  } while (0)

}  // namespace nvfs::test

#endif  // NVFS_TESTS_SKIP_COUNT_HPP_
