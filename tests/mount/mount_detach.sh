#!/usr/bin/env bash
# A daemon that detaches (no -f: as mount(8), fstab and tools/demo.sh start
# it). Every other test runs the daemon in the foreground, where nothing
# forks. The servers' threads must start after the fork: a thread does not
# survive one, and a mutex it held at that instant stays locked in the child.
# Here, as root:
#   - a descriptor a client passes the direct socket, which the daemon
#     hands to its reaper (a pipe: not the namespace, not a file of the
#     mount), is closed: the pipe's reader sees its end;
#   - after umount the daemon exits (within 10 s) and the namespace is
#     consistent (fsck.nvfs -n).
# Before the fix the reapers' threads started before the fork: in the
# detached daemon none ran, so a passed pipe stayed open for good, and one
# daemon hung at its exit on a reaper's mutex.
# Run by meson (suite mount) with NVFS_MKFS, NVFS_DAEMON, NVFS_FSCK set.
set -euo pipefail

here=$(dirname "$0")
source "$here/mount_lib.sh"
require_fuse
if [ "$(id -u)" -ne 0 ]; then
  echo "NVFS-SKIPPED: the direct socket needs a root daemon"
  exit 77
fi

image=$(mktemp /dev/shm/nvfs-detach-XXXXXX.img)
mnt=$(mktemp -d /tmp/nvfs-detach-mnt-XXXXXX)
detached=
cleanup() {
  local rc=$?
  if mountpoint -q "$mnt"; then fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" || true; fi
  # The detached daemon is ours: found by its unique image path.
  if [ -n "$detached" ] && kill -0 "$detached" 2>/dev/null; then kill -9 "$detached" || true; fi
  rmdir "$mnt" 2>/dev/null || true
  rm -f "$image"
  exit "$rc"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$NVFS_MKFS" -q -s $((128 << 20)) "$image"
"$NVFS_DAEMON" "$image" "$mnt"  # returns once the child serves the mount
mountpoint -q "$mnt" || fail "the detached daemon did not mount"
detached=$(pgrep -f -- "$image" | head -n 1)
[ -n "$detached" ] || fail "no detached daemon found"
socket=/run/nvfs/direct-$(mountpoint -d "$mnt")
[ -S "$socket" ] || fail "no direct socket at $socket"

# A pipe's write end, passed with a request before any proof: refused, and
# released through the reaper. The pipe ends when the daemon's copy closes.
# The protocol's version, as the daemon was built with it.
version=$(sed -n 's/.*kVersion = \([0-9]*\);.*/\1/p' "$(dirname "$0")/../../src/direct/protocol.hpp")
[ -n "$version" ] || fail "no kVersion in src/direct/protocol.hpp"
python3 - "$socket" "$version" <<'EOF' || fail "the passed pipe was never closed by the daemon"
import os, select, socket, struct, sys
MAGIC, VERSION, HELLO, MAP = 0x7264766E, int(sys.argv[2]), 1, 3
def request(op):
    return struct.pack("<4I6Q", MAGIC, VERSION, op, 0, 0, 0, 0, 0, 0, 0)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(request(HELLO))
s.recv(16)
r, w = os.pipe()
socket.send_fds(s, [request(MAP)], [w])
os.close(w)
s.recv(4096)  # the refusal
s.close()
ready, _, _ = select.select([r], [], [], 5.0)
sys.exit(0 if ready and os.read(r, 1) == b"" else 1)
EOF

# Unmounted, the daemon exits.
fusermount3 -u "$mnt"
for _ in $(seq 200); do
  kill -0 "$detached" 2>/dev/null || break
  sleep 0.05
done
if kill -0 "$detached" 2>/dev/null; then
  grep -E '^State' "/proc/$detached/status" || true
  fail "the detached daemon did not exit within 10 s of the unmount"
fi
detached=
"$NVFS_FSCK" -n "$image" > /dev/null || fail "fsck after the detached daemon's exit"
echo "ok detach"
