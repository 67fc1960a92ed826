# Shared by the mount suite's shell tests (mount_tools.sh, mount_stress.sh,
# mount_faults.sh, mount_uring.sh, mount_detach.sh); sourcing it checks that NVFS_DAEMON,
# NVFS_MKFS and NVFS_FSCK are set.
# Source it, then set `image`, `mnt` and `options` (mount options, may be
# empty) before calling:
#   require_fuse   exits 77 (meson's "skipped") with a loud SKIPPED where
#                  /dev/fuse is unusable
#   mount_nvfs     starts "$NVFS_DAEMON -f" on $image at $mnt (daemon_pid),
#                  returns once mounted
#   unmount_nvfs   unmounts and waits for the daemon; fails if it exited non-zero
#   stop_nvfs      for EXIT traps: unmounts if still mounted, waits for the
#                  daemon (kills it after 10 s), removes $mnt

: "${NVFS_DAEMON:?set NVFS_DAEMON to the nvfs daemon}"
: "${NVFS_MKFS:?set NVFS_MKFS to mkfs.nvfs}"
: "${NVFS_FSCK:?set NVFS_FSCK to fsck.nvfs}"

daemon_pid=

require_fuse() {
  if ! [ -c /dev/fuse ] || ! [ -r /dev/fuse ] || ! [ -w /dev/fuse ]; then
    echo "*** SKIPPED: /dev/fuse is not usable on this machine; nvfs cannot be mounted ***"
    exit 77
  fi
}

mount_nvfs() {
  "$NVFS_DAEMON" -f ${options:+-o "$options"} "$image" "$mnt" &
  daemon_pid=$!
  for _ in $(seq 500); do
    mountpoint -q "$mnt" && return 0
    kill -0 "$daemon_pid" 2>/dev/null || { echo "nvfs exited before mounting"; return 1; }
    sleep 0.01
  done
  echo "nvfs did not mount"; return 1
}

unmount_nvfs() {
  # EBUSY for a moment while another process's request on the mount (a
  # statfs of every mount) waits for the daemon (mount_fixture.cpp, Stop);
  # a mount that stays busy fails.
  local tries=0
  until fusermount3 -u "$mnt" 2>/dev/null; do
    tries=$((tries + 1))
    if [ "$tries" -ge 200 ] || ! mountpoint -q "$mnt"; then
      fusermount3 -u "$mnt" || return 1
      break
    fi
    sleep 0.05
  done
  local status=0
  wait "$daemon_pid" || status=$?
  daemon_pid=
  [ "$status" -eq 0 ] || { echo "the nvfs daemon exited with status $status"; return 1; }
}

stop_nvfs() {
  if [ -n "${mnt:-}" ] && mountpoint -q "$mnt"; then
    fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" 2>/dev/null || true
  fi
  if [ -n "$daemon_pid" ]; then
    for _ in $(seq 200); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=
  fi
  if [ -n "${mnt:-}" ]; then rmdir "$mnt" 2>/dev/null || true; fi
}
