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
: "${NVFS_DAEMON:?set NVFS_DAEMON to the nvfs daemon}"
: "${NVFS_MKFS:?set NVFS_MKFS to mkfs.nvfs}"
: "${NVFS_FSCK:?set NVFS_FSCK to fsck.nvfs}"
: "${NVFS_STRESS:?set NVFS_STRESS to nvfs-stress}"

if ! [ -c /dev/fuse ] || ! [ -r /dev/fuse ] || ! [ -w /dev/fuse ]; then
  echo "*** SKIPPED: /dev/fuse is not usable on this machine; nvfs cannot be mounted ***"
  exit 0
fi

image=/dev/shm/nvfs-stress-$$.img
mnt=
daemon_pid=
dropper_pid=

cleanup() {
  local rc=$?
  if [ -n "$dropper_pid" ]; then kill "$dropper_pid" 2>/dev/null || true; wait "$dropper_pid" 2>/dev/null || true; fi
  if [ -n "$mnt" ] && mountpoint -q "$mnt"; then
    fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" 2>/dev/null || true
  fi
  if [ -n "$daemon_pid" ]; then
    for _ in $(seq 200); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  if [ -n "$mnt" ]; then rmdir "$mnt" 2>/dev/null || true; fi
  rm -f "$image"
  [ $rc -eq 0 ] && echo "mount_stress: passed" || echo "mount_stress: FAILED (exit $rc)"
  exit $rc
}
trap cleanup EXIT
mnt=$(mktemp -d /tmp/nvfs-stress-XXXXXX)

"$NVFS_MKFS" -q -s 256M "$image"
"$NVFS_DAEMON" -f ${options:+-o "$options"} "$image" "$mnt" &
daemon_pid=$!
for _ in $(seq 500); do
  mountpoint -q "$mnt" && break
  kill -0 "$daemon_pid" 2>/dev/null || { echo "nvfs exited before mounting"; exit 1; }
  sleep 0.01
done
mountpoint -q "$mnt" || { echo "nvfs did not mount"; exit 1; }

# Dropping the caches needs root; without it the kernel still forgets under
# its own pressure, only less often.
if [ -w /proc/sys/vm/drop_caches ]; then
  (while :; do echo 2 > /proc/sys/vm/drop_caches; sleep 0.2; done) &
  dropper_pid=$!
fi

"$NVFS_STRESS" -t "$threads" -D "$seconds" "$mnt"

if [ -n "$dropper_pid" ]; then kill "$dropper_pid"; wait "$dropper_pid" 2>/dev/null || true; dropper_pid=; fi
fusermount3 -u "$mnt"
status=0
wait "$daemon_pid" || status=$?
daemon_pid=
[ "$status" -eq 0 ] || { echo "the nvfs daemon exited with status $status"; exit 1; }
"$NVFS_FSCK" -n "$image"
