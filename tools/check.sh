#!/usr/bin/env bash
# Installs what it needs, builds, runs every test suite, and ends with one line:
# "N passed, N failed" (Catch2 test cases, summed over every suite).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

nvfs_install_deps
nvfs_build

cd "$NVFS_TOP"
set +e
meson test -C "$NVFS_BUILD" --print-errorlogs --num-processes 2 "$@"
meson_rc=$?
set -e

python3 "$NVFS_TOP/tools/lib/count_tests.py" "$NVFS_BUILD/meson-logs/testlog.json"
count_rc=$?
[ $meson_rc -eq 0 ] && [ $count_rc -eq 0 ]
