#!/usr/bin/env bash
# Installs what it needs, builds, makes an emulated pmem image under /dev/shm,
# formats it, checks it, shows what is on it, then mounts it with the nvfs
# daemon, does a few things a person can see, runs the pread benchmark
# (nvfs-pread) through the mount with each read path and in process, and
# unmounts (also when a step fails). Idempotent: it re-formats its own
# image and first unmounts what an interrupted run may have left mounted.
#   tools/demo.sh [IMAGE] [SIZE]
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

image=${1:-/dev/shm/nvfs-demo.img}
size=${2:-1G}
mnt=${NVFS_DEMO_MOUNT:-/tmp/nvfs-demo.mnt}

nvfs_install_deps
nvfs_build
bin=$NVFS_BUILD

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

# Waits until the daemon has let go of the image (it holds a lock while mounted).
wait_image_free() {
  for _ in $(seq 500); do
    flock -n "$image" true 2>/dev/null && return 0
    sleep 0.01
  done
  echo "demo: $image is still held by a process" >&2
  return 1
}

# Unmounts every mount of the demo image (a run killed before its trap ran
# leaves one behind) and waits for its daemon to exit.
unmount_demo() {
  local dir
  for dir in $(awk -v img="$image" '$1 == img && $3 == "fuse.nvfs" { print $2 }' /proc/mounts); do
    fusermount3 -u "$dir" 2>/dev/null || fusermount3 -uz "$dir"
  done
  [ -e "$image" ] && wait_image_free
  return 0
}

unmount_demo

# -f: the demo re-formats its own image on every run. mkfs.nvfs makes a new
# image 0600 but keeps an existing file's mode, and one an older demo left
# 0644 would let every user read what the demo writes (doc/integrity.md,
# "The namespace is the boundary"): it is made 0600 first.
if [ -f "$image" ]; then chmod 600 "$image"; fi
step "$bin/mkfs.nvfs" -f -s "$size" -L demo "$image"
step "$bin/fsck.nvfs" -n "$image"
step "$bin/nvfs-dump" "$image"

if ! [ -c /dev/fuse ] || ! [ -r /dev/fuse ] || ! [ -w /dev/fuse ]; then
  echo
  echo "demo: /dev/fuse is not usable here, so the image cannot be mounted; stopping."
  exit 0
fi

mkdir -p "$mnt"
cleanup() {
  unmount_demo || true
  rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT

step "$bin/nvfs" "$image" "$mnt"
step grep " $mnt " /proc/mounts
step mkdir "$mnt/docs"
printf '\n\033[1m$ echo "hello from nvfs" > %s\033[0m\n' "$mnt/docs/hello.txt"
echo "hello from nvfs" > "$mnt/docs/hello.txt"
step cat "$mnt/docs/hello.txt"
step ln -s docs/hello.txt "$mnt/hello-link"
step cp -a "$NVFS_TOP/src" "$mnt/src"
step ls -la "$mnt" "$mnt/docs"
step stat "$mnt/docs/hello.txt"
step du -sh "$mnt/src"
step df -h "$mnt"

# The pread benchmark through the mount: a 256 MiB file, 4 KiB and 1 MiB
# reads, sequential and random, with pread and preadv (4 KiB iovecs), and the
# FUSE round trip (getxattr) as the floor of a 4 KiB read.
step dd if=/dev/urandom of="$mnt/bench.dat" bs=1M count=256 status=none
step "$bin/nvfs-pread" file -r 3 -D 0.5 -b 4k,1m -P seq,rand -T "nvfs read_path=map" "$mnt/bench.dat"
step "$bin/nvfs-pread" file -r 3 -D 0.5 -P same -b 4k -p getxattr "$mnt/bench.dat"
# The same file read directly (libnvfs-direct: this process may read the
# image, so it maps it and reads without a FUSE round trip; doc/direct.md).
step "$bin/nvfs-pread" file --direct -r 3 -D 0.5 -b 4k,1m -P seq,rand -T "nvfs direct" "$mnt/bench.dat"

printf '\n\033[1m$ umount %s\033[0m\n' "$mnt"
umount "$mnt"
wait_image_free

# The other two read paths, and the page cache, side by side on the same file.
for opts in read_path=read read_path=iter cache=page; do
  step "$bin/nvfs" -o "$opts" "$image" "$mnt"
  step "$bin/nvfs-pread" file -r 3 -D 0.5 -b 4k,1m -P seq -p pread -T "nvfs $opts" "$mnt/bench.dat"
  printf '\n\033[1m$ umount %s\033[0m\n' "$mnt"
  umount "$mnt"
  wait_image_free
done

# The core's read paths in process (no FUSE): the seed's loop of reads of one
# 4 KiB block (2^22 of them here) and the sequential and random matrix.
step "$bin/nvfs-pread" engine -r 3 -n 4m -s 64m "$image"

step "$bin/fsck.nvfs" -n "$image"
echo
echo "demo: $image ($size) was formatted, mounted on $mnt, used, benchmarked and cleanly unmounted."
