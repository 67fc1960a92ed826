#!/usr/bin/env bash
# FUSE over io_uring (src/fuse/uring.hpp; issue 13, items 3 and 6). Turns
# the kernel's switch, /sys/module/fuse/parameters/enable_uring, to Y for its
# run and puts the old value back on every exit (the switch is global:
# meson runs this test alone). Then:
#   refusal     with the switch N, nvfs -o io_uring=on exits 1 with one line
#               and mounts nothing;
#   teardown    over io_uring: a file written and read back; SIGTERM under
#               load unmounts cleanly (exit 0, no mount left); kill -9 under
#               load leaves no stuck process (the readers end, with an error)
#               and a dead mount that fusermount3 -u removes; the namespace
#               mounts again and unmounts consistent (fsck.nvfs -n);
#   startup-unmount  an unmount while the rings register ends the daemon
#               with 0;
#   spread      a queue's thread leaves its CPU while its callers keep
#               requests queued, comes back when they come one at a time,
#               and never runs where the daemon was not started;
#   suite       the C++ mount suite (NVFS_TEST_MOUNT, its arguments after
#               "suite"), the tool, fault and (with NVFS_STRESS) stress
#               tests, with NVFS_IO_URING=on: every mount they make is
#               served over io_uring, or refuses to start.
# Run by meson (suite mount) with NVFS_MKFS, NVFS_DAEMON, NVFS_FSCK,
# NVFS_TEST_MOUNT set, or by hand:
#   NVFS_DAEMON=build/nvfs NVFS_MKFS=build/mkfs.nvfs NVFS_FSCK=build/fsck.nvfs \
#     NVFS_TEST_MOUNT=build/tests/mount/test_mount bash tests/mount/mount_uring.sh [refusal|teardown|suite]
set -euo pipefail

which=${1:-all}
options=
here=$(dirname "$0")
source "$here/mount_lib.sh"
require_fuse

knob=/sys/module/fuse/parameters/enable_uring
if ! [ -e "$knob" ]; then
  echo "NVFS-SKIPPED: this kernel has no FUSE over io_uring ($knob is absent)"
  exit 77
fi
if ! [ -w "$knob" ]; then
  echo "NVFS-SKIPPED: $knob is not writable (needs root)"
  exit 77
fi
old_knob=$(cat "$knob")

image=
mnt=
log=
readers=()
cleanup() {
  local rc=$?
  local r
  for r in "${readers[@]}"; do kill "$r" 2>/dev/null || true; done
  if [ -n "$mnt" ]; then fusermount3 -uz "$mnt" 2>/dev/null || true; fi
  stop_nvfs
  if [ -n "$image" ]; then rm -f "$image"; fi
  if [ -n "$log" ]; then rm -f "$log"; fi
  echo "$old_knob" > "$knob"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() { echo "FAIL: $*"; [ -n "$log" ] && [ -s "$log" ] && sed 's/^/  daemon: /' "$log"; exit 1; }

new_mount() {
  image=$(mktemp /dev/shm/nvfs-uring-XXXXXX.img)
  log=$image.log
  mnt=$(mktemp -d /tmp/nvfs-uring-mnt-XXXXXX)
  "$NVFS_MKFS" -q -s $((128 << 20)) "$image"
}

# Starts the daemon with $options, output to $log.
start_daemon() {
  "$NVFS_DAEMON" -f ${options:+-o "$options"} "$image" "$mnt" > "$log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 500); do
    if mountpoint -q "$mnt"; then
      # The mount is visible before the daemon says how it serves it (the
      # line comes after the session starts): wait for the line too.
      for _ in $(seq 500); do
        grep -q 'mounted on' "$log" && return 0
        sleep 0.01
      done
      fail "nvfs mounted but printed no 'mounted on' line"
    fi
    kill -0 "$daemon_pid" 2>/dev/null || fail "nvfs exited before mounting"
    sleep 0.01
  done
  fail "nvfs did not mount"
}

# Readers of $mnt/data that loop until the mount fails them.
start_readers() {
  local i
  readers=()
  for i in 1 2 3; do
    ( while dd if="$mnt/data" of=/dev/null bs=4k iflag=direct status=none; do :; done ) \
      2>/dev/null &
    readers+=($!)
  done
  sleep 0.3
}

# Every reader ends within 10 s: none is stuck on the dead connection.
readers_end() {
  local r
  for r in "${readers[@]}"; do
    for _ in $(seq 200); do kill -0 "$r" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$r" 2>/dev/null; then
      grep -E '^State' "/proc/$r/status" || true
      fail "a reader is stuck after the daemon went ($1)"
    fi
    wait "$r" 2>/dev/null || true
  done
  readers=()
}

cleanup_mount() {
  rmdir "$mnt" 2>/dev/null || true
  rm -f "$image" "$log"
  image= log= mnt=
}

refusal() {
  echo N > "$knob"
  new_mount
  local status=0
  "$NVFS_DAEMON" -f -o io_uring=on "$image" "$mnt" > "$log" 2>&1 || status=$?
  [ "$status" -eq 1 ] || fail "io_uring=on with enable_uring=N: exit $status, wanted 1"
  ! mountpoint -q "$mnt" || fail "io_uring=on with enable_uring=N mounted"
  [ "$(wc -l < "$log")" -eq 1 ] || fail "io_uring=on refusal: not one line"
  grep -q 'io_uring=on: .*enable_uring is N' "$log" || fail "io_uring=on refusal: no reason"
  # auto falls back to /dev/fuse and says so.
  options=io_uring=auto start_daemon
  grep -q 'transport /dev/fuse' "$log" || fail "io_uring=auto with N: no /dev/fuse line"
  unmount_nvfs
  cleanup_mount
  echo Y > "$knob"
  echo "ok refusal"
}

teardown() {
  echo Y > "$knob"
  new_mount
  options=io_uring=on start_daemon
  grep -q 'transport io_uring' "$log" || fail "no io_uring start-up line"
  head -c $((8 << 20)) /dev/urandom > "$image.ref"
  cp "$image.ref" "$mnt/data"
  cmp "$image.ref" "$mnt/data" || fail "read back over io_uring differs"
  rm -f "$image.ref"
  # The rings served it: 4 KiB direct reads wake the queue threads once each.
  local t before=0 after=0
  for t in /proc/"$daemon_pid"/task/*; do
    [[ "$(cat "$t/comm")" == nvfs-ring-* ]] && before=$((before + $(cut -d' ' -f3 "$t/schedstat")))
  done
  dd if="$mnt/data" of=/dev/null bs=4k count=1000 iflag=direct status=none
  for t in /proc/"$daemon_pid"/task/*; do
    [[ "$(cat "$t/comm")" == nvfs-ring-* ]] && after=$((after + $(cut -d' ' -f3 "$t/schedstat")))
  done
  echo "ring threads: $((after - before)) wake-ups for 1000 reads"
  [ $((after - before)) -ge 900 ] || fail "the ring threads did not serve the reads"
  # SIGTERM under load: a clean exit, nothing left mounted.
  start_readers
  kill -TERM "$daemon_pid"
  local status=0
  wait "$daemon_pid" || status=$?
  daemon_pid=
  [ "$status" -eq 0 ] || fail "SIGTERM: daemon exit $status"
  readers_end SIGTERM
  ! mountpoint -q "$mnt" || fail "SIGTERM left the mount"
  "$NVFS_FSCK" -n "$image" > /dev/null || fail "fsck after SIGTERM"
  # kill -9 under load.
  options=io_uring=on start_daemon
  start_readers
  kill -9 "$daemon_pid"
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=
  readers_end "kill -9"
  timeout 10 fusermount3 -u "$mnt" || fail "kill -9: fusermount3 -u of the dead mount failed"
  ! grep -q " $mnt " /proc/mounts || fail "kill -9: the mount is still listed"
  # It mounts again over io_uring (recovering what the kill left), the data
  # intact, and unmounts consistent.
  options=io_uring=on start_daemon
  [ "$(stat -c %s "$mnt/data")" -eq $((8 << 20)) ] || fail "after kill -9: wrong size"
  unmount_nvfs
  "$NVFS_FSCK" -n "$image" > /dev/null || fail "fsck after kill -9 and a remount"
  cleanup_mount
  echo "ok teardown"
}

# An unmount while a queue thread is still registering (the thread waited
# for its CPU between submitting its REGISTERs and looking at their
# completions; NVFS_TEST_RING_SETUP_DELAY_MS makes that wait long): the
# completions then say the connection ended (-ENOTCONN), which is the end of
# the session, not a refusal of io_uring. The daemon exits 0. It exited 1
# ("io_uring=on: cannot start the rings: Transport endpoint is not
# connected") before the fix: seen with the ASan daemon on a loaded machine.
startup_unmount() {
  echo Y > "$knob"
  new_mount
  # Nothing may touch the mount meanwhile (mountpoint's stat would be the
  # first completion the queue thread sees): /proc/mounts says it is there.
  NVFS_TEST_RING_SETUP_DELAY_MS=1500 "$NVFS_DAEMON" -f -o io_uring=on "$image" "$mnt" \
    > "$log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 500); do
    grep -q " $mnt " /proc/mounts && break
    kill -0 "$daemon_pid" 2>/dev/null || fail "nvfs exited before mounting"
    sleep 0.01
  done
  sleep 0.5  # INIT served, the REGISTERs submitted, the queue threads waiting
  # The connection ends as an unmount ends it (fuse_abort_conn), through
  # its control file: other processes' statfs of every mount can hold this
  # one busy for as long as the queue threads wait, and an umount would
  # then say EBUSY. The connection is named by the mount's device number
  # (minor; major 0), from mountinfo: a stat would wait too.
  local dev ctl_mounted=
  if ! [ -d /sys/fs/fuse/connections ] || ! mountpoint -q /sys/fs/fuse/connections; then
    mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null ||
      { echo "NVFS-SKIPPED: startup-unmount needs fusectl"; kill "$daemon_pid"; wait "$daemon_pid"; daemon_pid=; cleanup_mount; return 0; }
    ctl_mounted=1
  fi
  dev=$(awk -v m="$mnt" '$5 == m { split($3, d, ":"); print d[2] }' /proc/self/mountinfo)
  [ -n "$dev" ] && [ -e "/sys/fs/fuse/connections/$dev/abort" ] || fail "no connection for $mnt"
  echo 1 > "/sys/fs/fuse/connections/$dev/abort"
  [ -z "$ctl_mounted" ] || umount /sys/fs/fuse/connections
  local status=0
  wait "$daemon_pid" || status=$?
  daemon_pid=
  [ "$status" -eq 0 ] || fail "the connection ended while the rings registered: daemon exit $status"
  fusermount3 -u "$mnt" || fusermount3 -uz "$mnt"
  cleanup_mount
  echo "ok startup-unmount"
}

# Ring thread $1's allowed CPUs (Cpus_allowed_list), of the running daemon.
ring_cpus() {
  local t
  for t in /proc/"$daemon_pid"/task/*; do
    if [ "$(cat "$t/comm")" = "nvfs-ring-$1" ]; then
      awk '/^Cpus_allowed_list/ { print $2 }' "$t/status"
      return
    fi
  done
}

# Where a queue's thread runs (UringTransport::Queue::Spread): pinned to its
# CPU while requests come one at a time, free to move while they queue up
# (callers on CPU 0 keeping several in flight), pinned again once they come
# one at a time; and never outside the CPUs the daemon was started on.
spread() {
  if [ "$(nproc)" -lt 2 ]; then
    echo "NVFS-SKIPPED: spread needs two CPUs"
    return 0
  fi
  if ! command -v fio > /dev/null; then
    echo "NVFS-SKIPPED: spread needs fio (tools/check.sh installs it)"
    return 0
  fi
  echo Y > "$knob"
  new_mount
  options=io_uring=on start_daemon
  head -c $((8 << 20)) /dev/urandom > "$mnt/data"
  [ "$(ring_cpus 0)" = 0 ] || fail "spread: ring 0 starts on $(ring_cpus 0), wanted 0"
  # One caller on CPU 0 keeping 32 reads in flight, for 3 s at most.
  fio --name=spread --filename="$mnt/data" --rw=randread --bs=4k --direct=1 \
    --ioengine=io_uring --iodepth=32 --cpus_allowed=0 --time_based --runtime=3 \
    --eta=never --output=/dev/null &
  local fio_pid=$! wide=
  readers=("$fio_pid")
  for _ in $(seq 60); do
    [ "$(ring_cpus 0)" != 0 ] && { wide=$(ring_cpus 0); break; }
    sleep 0.05
  done
  wait "$fio_pid" || fail "spread: fio failed"
  readers=()
  [ -n "$wide" ] || fail "spread: ring 0 stayed pinned to CPU 0 under 32 reads queued from CPU 0"
  # One read at a time from CPU 0: back on CPU 0 within 64 of them.
  taskset -c 0 dd if="$mnt/data" of=/dev/null bs=4k count=400 iflag=direct status=none
  [ "$(ring_cpus 0)" = 0 ] || fail "spread: ring 0 on $(ring_cpus 0) after single reads, wanted 0"
  unmount_nvfs
  # Started on CPU 0 alone: no ring thread ever runs elsewhere.
  taskset -c 0 "$NVFS_DAEMON" -f -o io_uring=on "$image" "$mnt" > "$log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 500); do grep -q 'mounted on' "$log" && break; sleep 0.01; done
  grep -q 'transport io_uring' "$log" || fail "spread: no io_uring start-up line"
  fio --name=spread --filename="$mnt/data" --rw=randread --bs=4k --direct=1 \
    --ioengine=io_uring --iodepth=32 --cpus_allowed=0 --time_based --runtime=1 \
    --eta=never --output=/dev/null || fail "spread: fio failed under taskset"
  [ "$(ring_cpus 0)" = 0 ] && [ "$(ring_cpus 1)" = 0 ] ||
    fail "spread: under taskset -c 0, rings on $(ring_cpus 0) and $(ring_cpus 1)"
  unmount_nvfs
  cleanup_mount
  echo "ok spread"
}

suite() {
  echo Y > "$knob"
  : "${NVFS_TEST_MOUNT:?set NVFS_TEST_MOUNT to tests/mount/test_mount}"
  export NVFS_IO_URING=on
  echo "== test_mount over io_uring"
  "$NVFS_TEST_MOUNT" "$@"
  echo "== mount_tools.sh over io_uring"
  bash "$here/mount_tools.sh"
  echo "== mount_tools.sh cache=page over io_uring"
  bash "$here/mount_tools.sh" cache=page
  echo "== mount_faults.sh over io_uring"
  bash "$here/mount_faults.sh"
  if [ -n "${NVFS_STRESS:-}" ]; then
    echo "== mount_stress.sh over io_uring"
    bash "$here/mount_stress.sh"
  fi
  unset NVFS_IO_URING
  echo "ok suite"
}

case "$which" in
  refusal) refusal ;;
  teardown) teardown ;;
  startup-unmount) startup_unmount ;;
  spread) spread ;;
  suite) shift; suite "$@" ;;
  all) refusal; teardown; startup_unmount; spread; suite ;;
  *) echo "usage: $0 [refusal|teardown|startup-unmount|spread|suite [test_mount args]]"; exit 2 ;;
esac
