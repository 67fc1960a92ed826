#!/usr/bin/env bash
# nvfs-stress on a real mount: many threads racing creates, unlinks, renames,
# links, opens and reads of a few names while the kernel's dentry and inode
# caches are dropped every 0.2 s (so FORGETs race with everything else).
# Passes when no operation failed with an errno a race does not explain, the
# daemon survived and exited 0 after the unmount, and fsck.nvfs -n finds the
# image clean. Run by meson (suite mount) for NVFS_STRESS_SECONDS (default 5)
# with NVFS_MKFS, NVFS_DAEMON, NVFS_FSCK and NVFS_STRESS set; tools/stress.sh
# runs it longer. Everything it makes is removed, and the mount unmounted, on
# any exit.
set -euo pipefail

options=${1:-}
seconds=${NVFS_STRESS_SECONDS:-5}
threads=${NVFS_STRESS_THREADS:-8}
: "${NVFS_STRESS:?set NVFS_STRESS to nvfs-stress}"

source "$(dirname "$0")/mount_lib.sh"
require_fuse

image=/dev/shm/nvfs-stress-$$.img
mnt=
dropper_pid=

cleanup() {
  local rc=$?
  if [ -n "$dropper_pid" ]; then kill "$dropper_pid" 2>/dev/null || true; wait "$dropper_pid" 2>/dev/null || true; fi
  stop_nvfs
  rm -f "$image"
  [ $rc -eq 0 ] && echo "mount_stress: passed" || echo "mount_stress: FAILED (exit $rc)"
  exit $rc
}
trap cleanup EXIT
mnt=$(mktemp -d /tmp/nvfs-stress-XXXXXX)

"$NVFS_MKFS" -q -s 256M "$image"
mount_nvfs

# Dropping the caches needs root; without it the kernel still forgets under
# its own pressure, only less often.
if [ -w /proc/sys/vm/drop_caches ]; then
  (while :; do echo 2 > /proc/sys/vm/drop_caches; sleep 0.2; done) &
  dropper_pid=$!
fi

"$NVFS_STRESS" -t "$threads" -D "$seconds" "$mnt"

if [ -n "$dropper_pid" ]; then kill "$dropper_pid"; wait "$dropper_pid" 2>/dev/null || true; dropper_pid=; fi
unmount_nvfs
"$NVFS_FSCK" -n "$image"
