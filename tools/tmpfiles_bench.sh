#!/usr/bin/env bash
# generic/531's cost, measured: N O_TMPFILE files opened, then closed, on a
# fresh mount, then the time from the unmount (fusermount3 -u) until the
# daemon has exited (it reclaims what the kernel forgets meanwhile and at
# the end). Prints one line per run, then the median.
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
source "$top/tests/mount_lib.sh"
require_fuse
image=/dev/shm/nvfs-tmpfiles-$$.img
mnt=$(mktemp -d /tmp/nvfs-tmpfiles.XXXXXX)
trap 'stop_nvfs; rm -f "$image"' EXIT
times=()
for run in $(seq "$runs"); do
  rm -f "$image"
  truncate -s 512M "$image"
  "$NVFS_MKFS" -q "$image" >/dev/null
  mount_nvfs
  phases=$("$build/nvfs-tmpfiles" "$mnt" "$n")
  start=$(date +%s.%N)
  unmount_nvfs
  end=$(date +%s.%N)
  t=$(echo "$end - $start" | bc -l)
  times+=("$t")
  printf 'run %d: %s; unmount until the daemon exited: %.3f s\n' "$run" "$phases" "$t"
done
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "median unmount: %.3f s (N=%d, %d runs)\n", a[int((NR+1)/2)], '"$n"', NR}'
