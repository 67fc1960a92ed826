#!/usr/bin/env bash
# Where a single caller's 4 KiB read over FUSE goes on an idle machine: the
# caller's migrations per request, unpinned and pinned (nvfs-pread -C), over
# io_uring and /dev/fuse, with the time per read. Over io_uring the kernel
# queues a request on the ring of the caller's CPU and the queue thread,
# pinned there, commits the reply and wakes the caller while it still runs:
# the scheduler then puts the caller on the other, idle CPU (a cross-CPU
# wake-up, the cost io_uring was to spare), and its next request goes to
# that CPU's ring. A pinned caller stays. Needs root (enable_uring is turned
# on for the run and its old value restored on exit).
#   tools/uring_wakeups.sh [SECONDS per run (2)]
# Uses the binaries of $NVFS_BUILD (default build/), builds nothing.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${NVFS_BUILD:-$top/build}
seconds=${1:-2}
knob=/sys/module/fuse/parameters/enable_uring
[ -w "$knob" ] || { echo "uring_wakeups: $knob is not writable (root, kernel 6.14+)" >&2; exit 1; }
old=$(cat "$knob")
image=/dev/shm/nvfs-wakeups-$$.img
mnt=$(mktemp -d /tmp/nvfs-wakeups.XXXXXX)
daemon=
stop() {
  if mountpoint -q "$mnt"; then fusermount3 -u "$mnt" || fusermount3 -uz "$mnt"; fi
  if [ -n "$daemon" ]; then
    while kill -0 "$daemon" 2>/dev/null; do sleep 0.1; done
  fi
  daemon=
}
trap 'stop; rm -f "$image"; rmdir "$mnt"; echo "$old" > "$knob"' EXIT
echo Y > "$knob"
"$build/mkfs.nvfs" -q -f -s 1g "$image"

# sched field of the reader's thread (the last task of the process).
field() { awk -v f="$2" '$1 == f { print $3 }' "$1/sched"; }

echo "transport  caller    ns/read  migrations/request"
for transport in on off; do
  "$build/nvfs" "$image" "$mnt" -o "io_uring=$transport" 2>/dev/null
  daemon=$(pgrep -n -f "^$build/nvfs $image ")
  [ -f "$mnt/f" ] || dd if=/dev/urandom of="$mnt/f" bs=1M count=64 status=none
  for pin in "" -C "" -C; do
    out=$(mktemp)
    # (stopped by the trap too, if this script fails meanwhile)
    "$build/nvfs-pread" file -b 4k -P rand -D "$((seconds + 1))" -r 1 -p pread --json $pin "$mnt/f" > "$out" &
    reader=$!
    sleep 0.5
    task=/proc/$reader/task/$(ls "/proc/$reader/task" | tail -1)
    m1=$(field "$task" nr_migrations); s1=$(field "$task" nr_switches)
    sleep "$seconds"
    m2=$(field "$task" nr_migrations); s2=$(field "$task" nr_switches)
    wait "$reader"
    ns=$(python3 -c 'import json,sys; print(round(json.loads(open(sys.argv[1]).readline())["ns_per_op"]))' "$out")
    rm -f "$out"
    # Each read sleeps once (a context switch) waiting for its reply.
    python3 -c 'import sys; t, p, ns, m, s = sys.argv[1:]; print(f"{t:10} {p:9} {ns:>7}  {int(m) / max(int(s), 1):.2f}")' \
      "$([ "$transport" = on ] && echo io_uring || echo /dev/fuse)" "$([ -n "$pin" ] && echo pinned || echo unpinned)" "$ns" "$((m2 - m1))" "$((s2 - s1))"
  done
  stop
done
