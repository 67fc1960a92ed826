#ifndef NVFS_TESTS_SKIP_COUNT_HPP_
#define NVFS_TESTS_SKIP_COUNT_HPP_

namespace nvfs::test {

// Counts one test case as skipped (test_main.cpp): a binary whose every run
// case skipped exits 77. Called by PrintSkipped (mount_fixture.hpp), once
// per skipped case.
void CountSkipped();

}  // namespace nvfs::test

#endif  // NVFS_TESTS_SKIP_COUNT_HPP_
