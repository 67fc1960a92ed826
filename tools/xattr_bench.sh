#!/usr/bin/env bash
# Times extended attributes through a real mount: N sets of small
# attributes on one file (user.attribute_I = value_I, one setxattr each),
# then getxattr of one name among them (the last set, the deepest to find),
# repeated. Run for both xattr formats of the same build: the chain
# (default) and the one-block format of mkfs 2.0 (-O ^xattr_chain), whose
# one block holds about a hundred such names: there the sets stop at ENOSPC
# and the run says how many fitted.
#   tools/xattr_bench.sh [NAMES (default 1000)] [GETS (default 20000)] [ROUNDS (default 5)]
# Prints, per format and round: names set, us per set, us per get; then
# the medians.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

names=${1:-1000}
gets=${2:-20000}
rounds=${3:-5}
nvfs_build >/dev/null
img=/dev/shm/nvfs-xattr-bench.$$.img
mnt=$(mktemp -d /tmp/nvfs-xattr-bench.XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then fusermount3 -u "$mnt" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -f "$img"; rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT

run_once() {  # $1: mkfs feature option (or empty)
  rm -f "$img"
  "$NVFS_BUILD/mkfs.nvfs" -q -s 256M $1 "$img"
  "$NVFS_BUILD/nvfs" -f "$img" "$mnt" 2>/dev/null &
  pid=$!
  for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.05; done
  python3 - "$mnt/f" "$names" "$gets" <<'PY'
import os, sys, time
path, names, gets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
open(path, "w").close()
t = time.perf_counter()
done = 0
for i in range(names):
    try:
        os.setxattr(path, f"user.attribute_{i}", f"value_{i}".encode())
    except OSError:
        break
    done += 1
set_us = (time.perf_counter() - t) / max(done, 1) * 1e6
last = f"user.attribute_{done - 1}"
t = time.perf_counter()
for _ in range(gets):
    os.getxattr(path, last)
get_us = (time.perf_counter() - t) / gets * 1e6
print(f"{done} {set_us:.1f} {get_us:.2f}")
PY
  fusermount3 -u "$mnt"; wait "$pid"; pid=
}

declare -A results
for r in $(seq "$rounds"); do
  for fmt in chain onebl; do  # alternating, side by side
    opt=""; [ "$fmt" = onebl ] && opt="-O ^xattr_chain"
    line=$(run_once "$opt")
    echo "round $r $fmt: names=${line%% *} set_us=$(echo "$line" | cut -d' ' -f2) get_us=${line##* }"
    results[$fmt]+="$line"$'\n'
  done
done
for fmt in chain onebl; do
  printf '%s' "${results[$fmt]}" | python3 -c "
import sys, statistics as s
rows = [l.split() for l in sys.stdin if l.strip()]
print('median $fmt: names=%s set_us=%.1f get_us=%.2f' % (rows[0][0],
      s.median(float(r[1]) for r in rows), s.median(float(r[2]) for r in rows)))"
done
