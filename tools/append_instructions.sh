#!/usr/bin/env bash
# Daemon instructions per 4 KiB append+fsync, counted by callgrind (repeatable
# whatever else the machine does): a `-s` daemon under valgrind serves
# `nvfs-metaops append FILE N` for N = 2000 and N = 6000; the slope between
# the two is the cost of one append, start-up and shutdown cancelled out.
#   tools/append_instructions.sh [BUILD_DIR ...]   (default: build)
# With --attached, a process holds the file attached for direct reads
# (libnvfs-direct through LD_PRELOAD), so every append also moves the file's
# slot in the shared table: the mirror's cost (issue 20, item 5).
# Images under /dev/shm, mounts under /tmp; both removed on any exit.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
nvfs_install_deps valgrind
nvfs_build

attached=0
if [ "${1:-}" = --attached ]; then attached=1; shift; fi
builds=("$@")
[ ${#builds[@]} -gt 0 ] || builds=("$NVFS_BUILD")
work=$(mktemp -d /tmp/nvfs-appends.XXXXXX)
img=/dev/shm/nvfs-appends-$$.img
mnt=$work/mnt
vpid= holder=
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
  mountpoint -q "$mnt" 2>/dev/null && fusermount3 -u "$mnt" 2>/dev/null || true
  [ -n "$vpid" ] && wait "$vpid" 2>/dev/null || true
  rm -f "$img"
  rm -rf "$work"
}
trap cleanup EXIT

# Instructions of one daemon run serving N appends.
count() {
  local b=$1 n=$2 out=$work/callgrind.out
  mkdir -p "$mnt"
  "$b/mkfs.nvfs" -q -f -s 256M "$img"
  valgrind --tool=callgrind --callgrind-out-file="$out" -q \
    "$b/nvfs" -f -s -o io_uring=off "$img" "$mnt" 2>"$work/log" &
  vpid=$!
  for _ in $(seq 300); do
    mountpoint -q "$mnt" && grep -q "mounted on" "$work/log" && break
    sleep 0.1
  done
  : >"$mnt/log"
  if [ "$attached" = 1 ]; then
    LD_PRELOAD="$NVFS_BUILD/libnvfs-direct.so" python3 -c '
import ctypes, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.pread(fd, 1, 0)
why = ctypes.CDLL(sys.argv[2]).nvfs_direct_fd_why(fd)
print("attached" if why == 0 else f"not attached ({why})", file=sys.stderr, flush=True)
time.sleep(3600)' "$mnt/log" "$NVFS_BUILD/libnvfs-direct.so" &
    holder=$!
    sleep 1
  fi
  "$NVFS_BUILD/nvfs-metaops" append "$mnt/log" "$n" >/dev/null
  if [ -n "$holder" ]; then kill "$holder"; wait "$holder" 2>/dev/null || true; holder=; fi
  sleep 0.5
  fusermount3 -u "$mnt"
  wait "$vpid" || true
  vpid=
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

for b in "${builds[@]}"; do
  small=$(count "$b" 2000)
  large=$(count "$b" 6000)
  echo "$b: $(( (large - small) / 4000 )) instructions per append" \
       "($small for 2000, $large for 6000$([ "$attached" = 1 ] && echo ', file attached'))"
done
