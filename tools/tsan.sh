#!/usr/bin/env bash
# The race detector (issue 21, item 2): builds the threaded tests with
# ThreadSanitizer into build-tsan (a third full build, so not part of
# tools/check.sh) and runs them; any report fails the run. Reads that race
# by design are annotated in one place (src/util/races.hpp); the one
# suppression left is in tools/tsan.supp, with its argument.
#   tools/tsan.sh [TEST_BINARY ...]   (default: every one below)
# Ends with "tsan: N passed, N failed".
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
nvfs_install_deps

build=${NVFS_TSAN_BUILD:-$NVFS_TOP/build-tsan}
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(test_fs test_epoch test_fs_model test_direct_client)
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$NVFS_TOP" -Db_sanitize=thread -Db_lundef=false >/dev/null
fi
targets=(mkfs.nvfs fsck.nvfs tests/direct_helper)
for t in "${tests[@]}"; do targets+=("tests/$t"); done
ninja -C "$build" "${targets[@]}" >/dev/null
nvfs_relink_direct_lib "$build"

export NVFS_MKFS=$build/mkfs.nvfs NVFS_FSCK=$build/fsck.nvfs
export NVFS_DIRECT_HELPER=$build/tests/direct_helper NVFS_DIRECT_LIB=$build/libnvfs-direct.so
# The direct client's readers rely on membarrier on the retiring side, which
# the detector cannot see: under it they fence instead (the same code path
# the direct-client-fences test runs).
export NVFS_DIRECT_NO_MEMBARRIER=1
export TSAN_OPTIONS="suppressions=$NVFS_TOP/tools/tsan.supp halt_on_error=0 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
passed=0 failed=0
for t in "${tests[@]}"; do
  log=$build/tsan-$t.log
  start=$(date +%s)
  if "$build/tests/$t" >"$log" 2>&1 && ! grep -q "WARNING: ThreadSanitizer" "$log"; then
    echo "tsan: $t: no report ($(( $(date +%s) - start )) s)"
    passed=$((passed + 1))
  else
    echo "tsan: $t: FAILED ($(grep -c "WARNING: ThreadSanitizer" "$log") reports; $log)"
    grep -A12 "WARNING: ThreadSanitizer" "$log" | head -40
    failed=$((failed + 1))
  fi
done
echo "tsan: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
