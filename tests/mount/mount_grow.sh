#!/usr/bin/env bash
# Growing a mounted nvfs (issue 22 item 2; doc/integrity.md section 12):
#  1. under load: a 32 MiB filesystem grown 10x to 320 MiB while nvfs-stress
#     races metadata operations, a reader checks a file's bytes through
#     read(2) and through a shared mapping, and a writer fills files; df
#     shows the new size at once, nothing fails, every byte reads back, and
#     fsck.nvfs -n finds the image clean after the unmount;
#  2. a sparse image grown from 64 MiB to 64 GiB while mounted, then a file
#     of 512 MiB written past the old end and read back; fsck clean;
#  3. the figures: the time to grow 1 GiB to 64 GiB, mounted and not.
# Run by meson (suite mount) with NVFS_MKFS, NVFS_DAEMON, NVFS_FSCK,
# NVFS_RESIZE and NVFS_STRESS set. Everything it makes is removed, and every
# mount unmounted, on any exit.
set -euo pipefail

: "${NVFS_RESIZE:?set NVFS_RESIZE to nvfs-resize}"
: "${NVFS_STRESS:?set NVFS_STRESS to nvfs-stress}"
source "$(dirname "$0")/mount_lib.sh"
require_fuse
if [ "$(id -u)" -ne 0 ]; then
  echo "*** SKIPPED: a mounted grow goes through the daemon's control socket, root only ***"
  exit 77
fi

options=${1:-}
image=/dev/shm/nvfs-grow-$$.img
offline=/dev/shm/nvfs-grow-off-$$.img
work=$(mktemp -d /tmp/nvfs-grow-work-XXXXXX)
mnt=
daemon_pid=
bg_pids=()

cleanup() {
  local rc=$?
  for pid in "${bg_pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  stop_nvfs
  rm -f "$image" "$offline"
  rm -rf "$work"
  [ $rc -eq 0 ] && echo "mount_grow: passed" || echo "mount_grow: FAILED (exit $rc)"
  exit $rc
}
trap cleanup EXIT

fail() { echo "mount_grow: $*" >&2; exit 1; }
df_bytes() { df -B1 --output=size "$mnt" | tail -1 | tr -d ' '; }

# --- 1. 10x under load -------------------------------------------------------
mnt=$(mktemp -d /tmp/nvfs-grow-XXXXXX)
"$NVFS_MKFS" -q -s 32M "$image"
mount_nvfs
head -c $((8 << 20)) /dev/urandom > "$work/ref"
cp "$work/ref" "$mnt/ref"
want=$(md5sum < "$work/ref")

# The reader: read(2) and a shared mapping of /ref, again and again.
python3 - "$mnt/ref" "$want" "$work/reader" <<'PY' &
import hashlib, mmap, os, sys, time
path, want, out = sys.argv[1], sys.argv[2].split()[0], sys.argv[3]
reads = maps = bad = 0
mapped = True
end = time.time() + 6
while time.time() < end:
    with open(path, 'rb') as f:
        if hashlib.md5(f.read()).hexdigest() != want: bad += 1
        reads += 1
        if mapped:
            try:
                m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            except OSError:
                mapped = False  # cache=none without shared mappings
                continue
            if hashlib.md5(m[:]).hexdigest() != want: bad += 1
            m.close()
            maps += 1
open(out, 'w').write(f"{reads} {maps} {bad}\n")
sys.exit(1 if bad else 0)
PY
bg_pids+=($!)
reader_pid=$!

# The writer: files of 4 MiB, each checked after it is written, until the
# filesystem is full, then (after the grow) on past the old size.
(
  i=0
  head -c $((4 << 20)) /dev/urandom > "$work/chunk"
  sum=$(md5sum < "$work/chunk")
  end=$((SECONDS + 6))
  written=0
  while [ $SECONDS -lt $end ]; do
    if cp "$work/chunk" "$mnt/w$i" 2>/dev/null; then
      [ "$(md5sum < "$mnt/w$i")" = "$sum" ] || { echo "writer: w$i reads back wrong"; exit 1; }
      written=$((written + 4))
    else
      rm -f "$mnt/w$i"  # ENOSPC before the grow
    fi
    i=$((i + 1))
  done
  echo "$written" > "$work/writer"
) &
bg_pids+=($!)
writer_pid=$!

"$NVFS_STRESS" -t 4 -D 6 "$mnt" > "$work/stress" 2>&1 &
bg_pids+=($!)
stress_pid=$!

sleep 2
before=$(df_bytes)
"$NVFS_RESIZE" "$image" 320M
after=$(df_bytes)
[ "$before" -eq $((32 << 20)) ] || fail "df said $before bytes before the grow"
[ "$after" -eq $((320 << 20)) ] || fail "df says $after bytes right after the grow, not 320 MiB"

wait "$stress_pid" || { cat "$work/stress"; fail "nvfs-stress failed during the grow"; }
wait "$writer_pid" || fail "the writer failed during the grow"
wait "$reader_pid" || fail "the reader saw wrong bytes during the grow ($(cat "$work/reader"))"
bg_pids=()
written=$(cat "$work/writer")
[ "$written" -gt 32 ] || fail "the writer wrote only $written MiB: nothing past the old size"
echo "mount_grow: 32 MiB -> 320 MiB under load: reader $(cat "$work/reader") (reads maps bad), writer $written MiB"
[ "$(md5sum < "$mnt/ref")" = "$want" ] || fail "/ref changed"
unmount_nvfs
"$NVFS_FSCK" -n "$image"
rm -f "$image"

# --- 2. 64 MiB -> 64 GiB, sparse, filled past the old end --------------------
mnt=$(mktemp -d /tmp/nvfs-grow-XXXXXX)
"$NVFS_MKFS" -q -s 64M "$image"
mount_nvfs
cp "$work/ref" "$mnt/ref"
"$NVFS_RESIZE" "$image" 64G
[ "$(df_bytes)" -eq $((64 << 30)) ] || fail "df says $(df_bytes) bytes after the grow to 64 GiB"
head -c $((512 << 20)) /dev/urandom | tee "$mnt/big" | md5sum > "$work/big.md5"
[ "$(md5sum < "$mnt/big")" = "$(cat "$work/big.md5")" ] || fail "/big reads back wrong"
[ "$(md5sum < "$mnt/ref")" = "$want" ] || fail "/ref changed"
unmount_nvfs
"$NVFS_FSCK" -n "$image"
echo "mount_grow: 64 MiB -> 64 GiB mounted, 512 MiB written past the old end: clean ($(du -h "$image" | cut -f1) of host memory)"
rm -f "$image"

# --- 3. The figures: 1 GiB -> 64 GiB, mounted and not ------------------------
mnt=$(mktemp -d /tmp/nvfs-grow-XXXXXX)
"$NVFS_MKFS" -q -s 1G "$image"
mount_nvfs
start=$(date +%s.%N)
"$NVFS_RESIZE" -q "$image" 64G
mounted_s=$(echo "$(date +%s.%N) - $start" | bc)
unmount_nvfs
"$NVFS_FSCK" -n "$image" > /dev/null
rm -f "$image"
"$NVFS_MKFS" -q -s 1G "$offline"
start=$(date +%s.%N)
"$NVFS_RESIZE" -q "$offline" 64G
offline_s=$(echo "$(date +%s.%N) - $start" | bc)
"$NVFS_FSCK" -n "$offline" > /dev/null
echo "mount_grow: figures: 1 GiB -> 64 GiB: mounted ${mounted_s} s, offline ${offline_s} s (nvfs-resize wall time, sparse /dev/shm image)"
