#!/usr/bin/env bash
# generic/531's cost, measured: N O_TMPFILE files opened, then closed, on a
# fresh mount, then unmounted (fusermount3 -u). The figure is the time from
# the first close until the daemon has exited: the kernel sends each file's
# RELEASE and FORGET after its close, and the daemon reclaims them before
# or during the unmount. Prints one line per run, then the median.
#   tools/tmpfiles_bench.sh [N (5000)] [RUNS (3)] [MOUNT_OPTIONS]
# Uses the binaries of $NVFS_BUILD (default build/), builds nothing.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${NVFS_BUILD:-$top/build}
n=${1:-5000}
runs=${2:-3}
options=${3:-}
NVFS_DAEMON=$build/nvfs NVFS_MKFS=$build/mkfs.nvfs NVFS_FSCK=$build/fsck.nvfs
export NVFS_DAEMON NVFS_MKFS NVFS_FSCK
source "$top/tests/mount/mount_lib.sh"
require_fuse
image=/dev/shm/nvfs-tmpfiles-$$.img
mnt=$(mktemp -d /tmp/nvfs-tmpfiles.XXXXXX)
trap 'stop_nvfs; rm -f "$image"' EXIT
times=()
for run in $(seq "$runs"); do
  rm -f "$image"
  "$NVFS_MKFS" -q -s 512M "$image" >/dev/null  # -s: created 0600, as every image
  mount_nvfs
  start=$(date +%s.%N)
  phases=$("$build/nvfs-tmpfiles" "$mnt" "$n") || { echo "nvfs-tmpfiles failed: $phases"; exit 1; }
  umount_start=$(date +%s.%N)
  unmount_nvfs || echo "run $run: the daemon did not exit cleanly (above); timed all the same"
  end=$(date +%s.%N)
  open_s=$(sed -n 's/^opened [0-9]* in \([0-9.]*\) s.*/\1/p' <<<"$phases")
  t=$(echo "$end - $start - $open_s" | bc -l)
  u=$(echo "$end - $umount_start" | bc -l)
  times+=("$t")
  printf 'run %d: %s; unmount %.3f s; first close to the daemon'"'"'s exit %.3f s\n' "$run" "$phases" "$u" "$t"
done
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "median, first close to exit: %.3f s (N=%d, %d runs)\n", a[int((NR+1)/2)], '"$n"', NR}'
