#!/usr/bin/env bash
# Installs, builds, and runs the side-by-side read benchmark (tools/bench.py):
# nvfs with every read path and cache mode, fuse2fs, ext4 on a loop device and
# tmpfs, with nvfs-pread and fio; prints one table and draws doc/bench.png.
#   tools/bench.sh [--quick] [--reps N] [--size BYTES] [--targets a,b,...]
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

nvfs_install_deps fio fuse2fs gnuplot-nox
nvfs_build
exec python3 "$NVFS_TOP/tools/bench.py" "$@"
