#!/usr/bin/env bash
# The same copy through nfs-ganesha over nvfs (both cache modes) and over
# ext4 on a loop device: a file copied into the export and back out with libnfs's nfs-cp
# (NFSv3, 127.0.0.1), medians of a few runs side by side. Both file
# systems' images live under /dev/shm; ganesha runs with doc/ganesha.conf
# (only the exported path differs), restarted for every copy, the targets
# alternating. Needs root (mount, losetup, ganesha). Not run by check.sh.
#
# Each file system is written once through its mount before the runs (the
# file then removed): the first store to each page of a fresh image costs a
# page fault of the daemon's mapping of /dev/shm (about 30 us each on the
# development VM, 4 KiB pages), which is not what the copy is to measure.
# --cold skips that.
#
#   tools/nfs_bench.sh [--size MIB] [--reps N] [--cold]   (default 1024 MiB, 3 runs)
#
# It starts rpcbind (loopback only, tools/lib/rpcbind_loopback.py) where none
# runs, and stops only what it started, by PID. It cannot run beside
# test_nfs (one ganesha at a time: port 2049 and the rpcbind registration).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

size_mib=1024
reps=3
warm=1
while [ $# -gt 0 ]; do
  case $1 in
    --size) size_mib=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --cold) warm=""; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "nfs_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "nfs_bench.sh: needs root" >&2; exit 1; }

nvfs_install_deps bc
nvfs_build

user=4242  # the client's uid: doc/ganesha.conf squashes root
scratch=$(mktemp -d /tmp/nvfs-nfsbench-XXXXXX)
image_mib=$((size_mib + 512))
nvfs_img=/dev/shm/nvfs-nfsbench-$$.img
page_img=/dev/shm/nvfs-nfsbench-page-$$.img
ext4_img=/dev/shm/nvfs-nfsbench-ext4-$$.img
src=/dev/shm/nvfs-nfsbench-src-$$
out=/dev/shm/nvfs-nfsbench-out-$$
loop=""
rpcbind_pid=""
ganesha_pid=""

cleanup() {
  set +e
  if [ -n "$ganesha_pid" ]; then
    kill "$ganesha_pid"
    for _ in $(seq 200); do kill -0 "$ganesha_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$ganesha_pid" 2>/dev/null
  fi
  if [ -n "$rpcbind_pid" ]; then
    kill "$rpcbind_pid"; wait "$rpcbind_pid" 2>/dev/null; rm -f /run/rpcbind.sock
  fi
  mountpoint -q "$scratch/ext4" && umount "$scratch/ext4"
  [ -n "$loop" ] && losetup -d "$loop"
  mountpoint -q "$scratch/nvfs" && fusermount3 -u "$scratch/nvfs"
  mountpoint -q "$scratch/nvfs-page" && fusermount3 -u "$scratch/nvfs-page"
  rm -f "$nvfs_img" "$page_img" "$ext4_img" "$src" "$out"
  rm -rf "$scratch"
}
trap cleanup EXIT

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
# nvfs-direct: ganesha under LD_PRELOAD=libnvfs-direct.so over the
# cache=none mount (it may read and write the namespace: it runs as root),
# its reads and writes of the exported files straight from and to the
# namespace (doc/direct.md).
targets=(nvfs nvfs-direct nvfs-page ext4)
mkdir -p "$scratch/nvfs" "$scratch/nvfs-page" "$scratch/ext4"
"$NVFS_BUILD/mkfs.nvfs" -q -s "${image_mib}M" "$nvfs_img"
"$NVFS_BUILD/nvfs" -o allow_other "$nvfs_img" "$scratch/nvfs"
"$NVFS_BUILD/mkfs.nvfs" -q -s "${image_mib}M" "$page_img"
"$NVFS_BUILD/nvfs" -o allow_other,cache=page "$page_img" "$scratch/nvfs-page"
truncate -s "${image_mib}M" "$ext4_img"
chmod 600 "$ext4_img"
loop=$(losetup -f --show "$ext4_img")
mkfs.ext4 -q "$loop"
mount "$loop" "$scratch/ext4"
dir_of() { [ "$1" = nvfs-direct ] && echo "$scratch/nvfs" || echo "$scratch/$1"; }
for fs in nvfs nvfs-page ext4; do
  mkdir "$scratch/$fs/u"
  chown "$user:$user" "$scratch/$fs/u"
done
head -c "$((size_mib * 1024 * 1024))" /dev/urandom >"$src"
if [ -n "$warm" ]; then
  for fs in nvfs nvfs-page ext4; do
    cp "$src" "$scratch/$fs/u/warm" && sync -f "$scratch/$fs/u/warm" && rm "$scratch/$fs/u/warm"
  done
fi

if ! python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect("/run/rpcbind.sock")' 2>/dev/null; then
  /usr/bin/python3 -I "$NVFS_TOP/tools/lib/rpcbind_loopback.py" >"$scratch/rpcbind.log" 2>&1 &
  rpcbind_pid=$!
  for _ in $(seq 100); do [ -S /run/rpcbind.sock ] && break; sleep 0.1; done
fi

start_ganesha() {  # $1: the exported directory; $2: a library to preload, or ""
  sed "s#/mnt/nvfs#$1#g" "$NVFS_TOP/doc/ganesha.conf" >"$scratch/ganesha.conf"
  : >"$scratch/ganesha.log"
  env ${2:+LD_PRELOAD=$2} \
    ganesha.nfsd -F -f "$scratch/ganesha.conf" -L "$scratch/ganesha.log" -p "$scratch/ganesha.pid" &
  ganesha_pid=$!
  for _ in $(seq 300); do
    grep -q "NFS SERVER INITIALIZED" "$scratch/ganesha.log" && return 0
    kill -0 "$ganesha_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "nfs_bench.sh: ganesha did not start:" >&2
  cat "$scratch/ganesha.log" >&2
  exit 1
}

stop_ganesha() {
  kill "$ganesha_pid"
  for _ in $(seq 200); do kill -0 "$ganesha_pid" 2>/dev/null || break; sleep 0.1; done
  wait "$ganesha_pid" 2>/dev/null || true
  ganesha_pid=""
}

now() { date +%s.%N; }

declare -A write_mbs read_mbs
for rep in $(seq "$reps"); do
  for fs in "${targets[@]}"; do
    dir=$(dir_of "$fs")
    preload=""
    [ "$fs" = nvfs-direct ] && preload="$NVFS_BUILD/libnvfs-direct.so"
    start_ganesha "$dir" "$preload"
    url="nfs://127.0.0.1$dir/u/file?version=3&uid=$user&gid=$user"
    t0=$(now)
    timeout 600 nfs-cp "$src" "$url" >/dev/null
    t1=$(now)
    timeout 600 nfs-cp "$url" "$out" >/dev/null
    t2=$(now)
    cmp -s "$src" "$out" || { echo "nfs_bench.sh: $fs: the copy read back differs" >&2; exit 1; }
    stop_ganesha
    rm -f "$dir/u/file" "$out"
    w=$(echo "$size_mib * 1048576 / ($t1 - $t0) / 1000000" | bc -l)
    r=$(echo "$size_mib * 1048576 / ($t2 - $t1) / 1000000" | bc -l)
    printf 'run %d %-9s write %7.1f MB/s  read %7.1f MB/s\n' "$rep" "$fs" "$w" "$r"
    write_mbs[$fs]+="$w "
    read_mbs[$fs]+="$r "
  done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
echo
echo "nfs-cp of ${size_mib} MiB through ganesha (NFSv3, 127.0.0.1), medians of $reps runs:"
printf '| %-28s | %10s | %10s |\n' "target" "write MB/s" "read MB/s"
declare -A labels=([nvfs]="ganesha over nvfs" [nvfs-direct]="ganesha (preload) over nvfs"
                   [nvfs-page]="ganesha over nvfs cache=page"
                   [ext4]="ganesha over ext4 (loop)")
for fs in "${targets[@]}"; do
  label=${labels[$fs]}
  printf '| %-28s | %10.1f | %10.1f |\n' "$label" \
    "$(echo "${write_mbs[$fs]}" | median)" "$(echo "${read_mbs[$fs]}" | median)"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
