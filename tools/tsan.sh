#!/usr/bin/env bash
# The race detector (issue 21, item 2): builds the threaded tests, the
# daemon and nvfs-stress with ThreadSanitizer into build-tsan (a third full
# build, so not part of tools/check.sh) and runs them; any report fails the
# run. Reads that race by design are annotated in one place
# (src/util/races.hpp); the one suppression left is in tools/tsan.supp, with
# its argument.
#   tools/tsan.sh [RUN ...]   (default: every run below)
# A RUN is a test binary, optionally with its Catch2 test spec as one word
# ("test_fs [fs]"), or `stress [MOUNT_OPTIONS]`: tests/mount/mount_stress.sh
# (nvfs-stress's 8 threads racing namespace and data operations on a real
# mount, FORGETs included) for NVFS_STRESS_SECONDS (default here 30)
# against the detector's daemon, whose reports make it exit 66.
# Ends with "tsan: N passed, N failed, N skipped".
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
nvfs_install_deps

build=${NVFS_TSAN_BUILD:-$NVFS_TOP/build-tsan}
runs=("$@")
if [ ${#runs[@]} -eq 0 ]; then
  runs=(test_fs test_epoch test_fs_model test_direct_client test_media stress "stress cache=page"
        "test_crash [threaded]")
fi
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$NVFS_TOP" -Db_sanitize=thread -Db_lundef=false >/dev/null
fi
# A test binary's path in the build, by its folder of tests/ (tests/meson.build).
test_path() {
  case $1 in
    test_direct_client) echo "tests/unit/direct/$1" ;;
    test_crash) echo "tests/crash/$1" ;;
    test_mount | test_direct | test_direct_lib | test_direct_write | test_direct_map | test_nfs) echo "tests/mount/$1" ;;
    *) echo "tests/unit/$1" ;;
  esac
}
targets=(mkfs.nvfs fsck.nvfs tests/unit/direct/direct_helper)
for run in "${runs[@]}"; do
  case $run in
    stress*) targets+=(nvfs nvfs-stress) ;;
    test_mount* | test_direct\ * | test_direct | test_direct_lib* | test_direct_write* | test_direct_map* | test_nfs*)
      # Through real mounts: the detector's daemon too.
      targets+=(nvfs "$(test_path "${run%% *}")") ;;
    *) targets+=("$(test_path "${run%% *}")") ;;
  esac
done
ninja -C "$build" "${targets[@]}" >/dev/null
nvfs_relink_direct_lib "$build"

export NVFS_MKFS=$build/mkfs.nvfs NVFS_FSCK=$build/fsck.nvfs
export NVFS_DIRECT_HELPER=$build/tests/unit/direct/direct_helper NVFS_DIRECT_LIB=$build/libnvfs-direct.so
export NVFS_DAEMON=$build/nvfs NVFS_STRESS=$build/nvfs-stress
export NVFS_STRESS_SECONDS=${NVFS_STRESS_SECONDS:-30}
# The direct client's readers rely on membarrier on the retiring side, which
# the detector cannot see: under it they fence instead (the same code path
# the direct-client-fences test runs).
export NVFS_DIRECT_NO_MEMBARRIER=1
export TSAN_OPTIONS="suppressions=$NVFS_TOP/tools/tsan.supp halt_on_error=0 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
passed=0 failed=0 skipped=0
for run in "${runs[@]}"; do
  name=${run// /-}
  name=${name//[^A-Za-z0-9_-]/}
  log=$build/tsan-$name.log
  start=$(date +%s)
  status=0
  case $run in
    stress) bash "$NVFS_TOP/tests/mount/mount_stress.sh" >"$log" 2>&1 || status=$? ;;
    stress\ *) bash "$NVFS_TOP/tests/mount/mount_stress.sh" "${run#stress }" >"$log" 2>&1 || status=$? ;;
    *\ *) "$build/$(test_path "${run%% *}")" "${run#* }" >"$log" 2>&1 || status=$? ;;
    *) "$build/$(test_path "$run")" >"$log" 2>&1 || status=$? ;;
  esac
  reports=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
  if [ "$status" -eq 77 ] && [ "$reports" -eq 0 ]; then
    echo "tsan: $run: SKIPPED ($log)"
    skipped=$((skipped + 1))
  elif [ "$status" -eq 0 ] && [ "$reports" -eq 0 ]; then
    echo "tsan: $run: no report ($(( $(date +%s) - start )) s)"
    passed=$((passed + 1))
  else
    echo "tsan: $run: FAILED (exit $status, $reports reports; $log)"
    grep -A12 "WARNING: ThreadSanitizer" "$log" | head -40 || tail -20 "$log"
    failed=$((failed + 1))
  fi
done
echo "tsan: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
