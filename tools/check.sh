#!/usr/bin/env bash
# Installs what it needs, builds, runs every test suite, and ends with one line:
# "N passed, N failed, N skipped" (Catch2 test cases, summed over every suite of both
# build directories). The corrupted-image suite ("fuzz") runs in a second
# build with AddressSanitizer and UndefinedBehaviorSanitizer, where the unit
# suite runs once more too.
#
#   tools/check.sh [--package] [MESON TEST ARGUMENTS]
#
# --package also builds the Debian packages (tools/package.sh, a third build:
# several minutes) and has the package-install test check them; without it
# that test is counted as skipped.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

unset NVFS_PACKAGE_FAILED
if [ "${1:-}" = --package ]; then
  shift
  # A failed package build fails the package-install test (counted below).
  "$NVFS_TOP/tools/package.sh" || export NVFS_PACKAGE_FAILED=$?
  export NVFS_PACKAGE_DIR=${NVFS_PACKAGE_DIR:-$NVFS_TOP/build-package}
else
  unset NVFS_PACKAGE_DIR
fi

nvfs_install_deps
nvfs_build
nvfs_build_asan unit fuzz

cd "$NVFS_TOP"
set +e
meson test -C "$NVFS_BUILD" --print-errorlogs --num-processes 2 --no-suite fuzz "$@"
meson_rc=$?
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
  meson test -C "$NVFS_ASAN_BUILD" --no-rebuild --print-errorlogs --num-processes 2 \
  --suite fuzz --suite unit
asan_rc=$?
python3 "$NVFS_TOP/tools/lib/count_tests.py" "$NVFS_BUILD/meson-logs/testlog.json" \
  "$NVFS_ASAN_BUILD/meson-logs/testlog.json"
count_rc=$?
set -e
[ $meson_rc -eq 0 ] && [ $asan_rc -eq 0 ] && [ $count_rc -eq 0 ]
