#!/usr/bin/env bash
# Faults that must fail one request, not the daemon (issue 12, items 5, 6).
#   host-space: a 256 MiB image on a 64 MiB tmpfs; 200 MiB written through
#     the mount: the writer gets ENOSPC (not a SIGBUS in the daemon), the
#     daemon lives, the files written before are intact, the unmount is
#     clean (daemon exit 0) and fsck.nvfs finds nothing.
#   cut-backing: a 100 MiB file, then the image truncated to 64 MiB under
#     the running daemon: reads of the lost range fail with EIO, the daemon
#     lives and serves the surviving files, the unmount is clean.
#   cut-metadata: the same cut, where it takes the second group's inode
#     table, bitmaps and directory blocks: every request that meets them
#     (readdir, create, unlink, truncate, getxattr in a directory of that
#     group) fails with EIO or, once the damage turned the mount read-only,
#     EROFS; the daemon lives, a file of the first group still reads back,
#     the unmount goes through and the daemon exits 1 (not marked clean);
#     with errors=continue, a change in the first group fails with EIO (no
#     transaction commits after a page was lost).
# Run by meson (suite mount) with NVFS_MKFS, NVFS_DAEMON, NVFS_FSCK set, or:
#   NVFS_DAEMON=build/nvfs NVFS_MKFS=build/mkfs.nvfs NVFS_FSCK=build/fsck.nvfs \
#     bash tests/mount/mount_faults.sh [host-space|cut-backing|cut-metadata]
# Everything it mounts (the tmpfs included) is unmounted on any exit.
set -euo pipefail

which=${1:-all}
options=

source "$(dirname "$0")/mount_lib.sh"
require_fuse
if [ "$(id -u)" -ne 0 ]; then
  echo "*** SKIPPED: mounting a tmpfs needs root ***"
  exit 77
fi

host=
image=
mnt=
ref=
cleanup() {
  local rc=$?
  if [ -n "$ref" ]; then rm -rf "$ref"; fi
  # A daemon that died leaves a mount mountpoint(1) cannot stat.
  if [ -n "$mnt" ]; then fusermount3 -uz "$mnt" 2>/dev/null || true; fi
  stop_nvfs
  if [ -n "$host" ]; then
    if mountpoint -q "$host"; then umount "$host" || umount -l "$host"; fi
    rmdir "$host"
  fi
  [ $rc -eq 0 ] && echo "mount_faults: all passed" || echo "mount_faults: FAILED (exit $rc)"
  exit $rc
}
trap cleanup EXIT

step() { printf '== %s\n' "$*"; }
fail() { echo "FAIL: $*"; exit 1; }
alive() { kill -0 "$daemon_pid" 2>/dev/null && mountpoint -q "$mnt" && stat "$mnt" >/dev/null; }
# Runs "$@", which must fail with the error text $1, the daemon living on.
must_fail_with() {
  local what=$1 status err
  shift
  set +e
  err=$("$@" 2>&1)
  status=$?
  set -e
  echo "$1: status $status: $(echo "$err" | head -1)"
  alive || fail "the daemon died ($*)"
  [ $status -ne 0 ] || fail "$* succeeded"
  echo "$err" | grep -Eq "$what" || fail "$* did not fail with '$what'"
}

host=$(mktemp -d /tmp/nvfs-faults-host-XXXXXX)

# A tmpfs of $1 holding a 256 MiB image, mounted.
new_mount() {
  if mountpoint -q "$host"; then umount "$host"; fi
  mount -t tmpfs -o "size=$1" nvfs-faults "$host"
  image=$host/img
  rm -f "$image"
  "$NVFS_MKFS" -q -s 256M "$image"
  mnt=$(mktemp -d /tmp/nvfs-faults-XXXXXX)
  mount_nvfs
}

# Unmounts a namespace that lost pages: the unmount itself goes through;
# the daemon then refuses to mark it clean and says so: exit 1, never a
# signal.
end_lost_mount() {
  fusermount3 -u "$mnt"
  status=0
  wait "$daemon_pid" || status=$?
  daemon_pid=
  echo "daemon exit status after the cut: $status"
  [ "$status" -eq 1 ] || fail "the daemon exited with $status (1 expected: not marked clean)"
  rmdir "$mnt"
  mnt=
  rm -f "$image"
}

end_mount() {
  unmount_nvfs
  rmdir "$mnt"
  mnt=
}

if [ "$which" = all ] || [ "$which" = host-space ]; then
  step "host-space: 256 MiB image on a 64 MiB tmpfs, 200 MiB written"
  new_mount 64m
  ref=$(mktemp -d /dev/shm/nvfs-faults-ref-XXXXXX)
  for i in 1 2 3; do
    head -c 4M /dev/urandom >"$ref/f$i"
    cp "$ref/f$i" "$mnt/f$i"
  done
  sync
  must_fail_with "No space left on device" dd if=/dev/zero of="$mnt/big" bs=1M count=200 conv=fsync
  for i in 1 2 3; do cmp "$ref/f$i" "$mnt/f$i" || fail "f$i damaged"; done
  avail=$(stat -f -c '%a' "$mnt")
  bsize=$(stat -f -c '%S' "$mnt")
  echo "statfs: $((avail * bsize / 1048576)) MiB available (host tmpfs: $(df -m --output=avail "$host" | tail -1) MiB)"
  [ $((avail * bsize)) -le $((8 << 20)) ] || fail "statfs promises more than the host can back"

  echo "written before: intact; big: $(stat -c %s "$mnt/big") bytes"
  rm "$mnt/big"
  head -c 1M /dev/urandom >"$ref/again"
  cp "$ref/again" "$mnt/again"
  cmp "$ref/again" "$mnt/again" || fail "a file written after the rm does not read back"
  rm -rf "$ref"
  end_mount
  "$NVFS_FSCK" -n "$image" || fail "fsck.nvfs after the full host"
  rm -f "$image"
fi

# $1: mount options. With read_path=map the large file is read whole first,
# so its extent map is current and the lost data is met by the kernel's copy
# of the reply (writev fails with EFAULT; the reader gets EIO).
cut_backing() {
  options=$1
  step "cut-backing${options:+ (-o $options)}: a 100 MiB file, the image truncated to 64 MiB under the daemon"
  new_mount 300m
  ref=$(mktemp -d /dev/shm/nvfs-faults-ref-XXXXXX)
  head -c 40K /dev/urandom >"$ref/small"
  cp "$ref/small" "$mnt/small"
  dd if=/dev/urandom of="$mnt/large" bs=1M count=100 status=none
  sync
  if [ -n "$options" ]; then
    for _ in 1 2 3; do dd if="$mnt/large" of=/dev/null bs=1M iflag=direct status=none; done
  fi
  truncate -s 64M "$image"
  must_fail_with "Input/output error" dd if="$mnt/large" of=/dev/null bs=1M skip=80 count=4 iflag=direct
  cmp "$ref/small" "$mnt/small" || fail "a surviving file does not read back"
  cat "$mnt/small" >/dev/null
  alive || fail "the daemon died"
  rm -rf "$ref"
  end_lost_mount
  options=
}

if [ "$which" = all ] || [ "$which" = cut-backing ]; then
  cut_backing ""
  cut_backing read_path=map
fi

# Metadata lost under the daemon: met outside any read, by requests that
# hold inode locks and a transaction (doc/integrity.md, "Media errors").
# $1: mount options. With errors=continue the mount stays writable after
# the damage, and the change in the first group is refused by the journal
# (no commit after a lost page) rather than by the read-only switch.
cut_metadata() {
  options=$1
  step "cut-metadata${options:+ (-o $options)}: the second group's metadata and directories cut off under the daemon"
  new_mount 300m
  # Directories are spread over both groups (8192 inodes a group here);
  # each gets a file, and one of the first group keeps a reference copy.
  far= near=
  for i in 1 2 3 4; do
    mkdir "$mnt/d$i"
    head -c 8K /dev/urandom >"$mnt/d$i/f"
    setfattr -n user.tag -v "d$i" "$mnt/d$i/f"
    if [ "$(stat -c %i "$mnt/d$i")" -ge 8192 ]; then far=${far:-d$i}; else near=${near:-d$i}; fi
  done
  [ -n "$far" ] && [ -n "$near" ] || fail "no directory in each group (far=$far near=$near)"
  ref=$(mktemp -d /dev/shm/nvfs-faults-ref-XXXXXX)
  cp "$mnt/$near/f" "$ref/near"
  sync
  truncate -s 64M "$image"
  lost="Input/output error|Read-only file system|Structure needs cleaning"
  must_fail_with "$lost" ls "$mnt/$far"
  must_fail_with "$lost" touch "$mnt/$far/new"
  must_fail_with "$lost" rm "$mnt/$far/f"
  must_fail_with "$lost" truncate -s 0 "$mnt/$far/f"
  must_fail_with "$lost|No such attribute" getfattr -n user.tag "$mnt/$far/f"
  if [ -n "$options" ]; then
    must_fail_with "Input/output error" mkdir "$mnt/$near/sub"
  else
    must_fail_with "$lost" mkdir "$mnt/$near/sub"
  fi
  cmp "$ref/near" "$mnt/$near/f" || fail "a file of the first group does not read back"
  ls "$mnt/$near" >/dev/null || fail "a directory of the first group cannot be listed"
  alive || fail "the daemon died"
  rm -rf "$ref"
  ref=
  end_lost_mount
  options=
}

if [ "$which" = all ] || [ "$which" = cut-metadata ]; then
  cut_metadata ""
  cut_metadata errors=continue
fi
