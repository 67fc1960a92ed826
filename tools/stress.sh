#!/usr/bin/env bash
# Runs the namespace stress test (tests/mount/mount_stress.sh: nvfs-stress on a
# real mount while the kernel's caches are dropped, then fsck) for longer
# than the test suite does. Installs what it needs and builds first.
#   tools/stress.sh [SECONDS (default 60)] [THREADS (default 16)] [MOUNT_OPTIONS]
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

nvfs_install_deps
nvfs_build
NVFS_STRESS_SECONDS=${1:-60} NVFS_STRESS_THREADS=${2:-16} \
  NVFS_MKFS="$NVFS_BUILD/mkfs.nvfs" NVFS_FSCK="$NVFS_BUILD/fsck.nvfs" \
  NVFS_DAEMON="$NVFS_BUILD/nvfs" NVFS_STRESS="$NVFS_BUILD/nvfs-stress" \
  exec bash "$NVFS_TOP/tests/mount/mount_stress.sh" "${3:-}"
