#!/usr/bin/env bash
# Installs, builds, and runs the side-by-side read benchmark (tools/bench.py):
# nvfs with every read path and cache mode, fuse2fs, ext4 on a loop device and
# tmpfs, with nvfs-pread and fio; prints one table and draws doc/bench.png.
#   tools/bench.sh [--quick] [--reps N] [--size BYTES] [--targets a,b,...]
# With --meta first, the metadata table instead (tools/bench_meta.py: untar,
# find, du, rm -rf, creates, stats, unlinks, appends with fsync, against tmpfs,
# ext4 on a loop device and fuse2fs; nvfs over /dev/fuse and io_uring):
#   tools/bench.sh --meta [--reps N] [--files N] [-n N] [--appends N]
#                         [--targets a,b,...] [--baseline DIR_WITH_AN_OLDER_nvfs]
#                         [--count-requests]
# With --writes first, durable writes (tools/bench_writes.py): libnvfs-direct's
# against nvfs through the mount, tmpfs, ext4 on a loop device and the
# in-process floor; 4 KiB random, 4 KiB appends, 1 MiB sequential, two threads,
# and fio's psync engine under the preload:
#   tools/bench.sh --writes [--reps N] [--size BYTES] [--seconds S]
# With --depth first, random reads at queue depth as the seeds run them
# (tools/bench_depth.py): fio's libaio engine at depth 128 on 4 jobs (seed
# 000) and its io_uring engine with registered buffers and files at depth 32
# (seed 001), on nvfs over both transports and cache modes, tmpfs, ext4 on a
# loop device and fuse2fs:
#   tools/bench.sh --depth [--reps N] [--size BYTES] [--seconds S]
#                          [--targets a,b,...] [--workloads a,b,...]
#                          [--baseline DIR_WITH_AN_OLDER_nvfs]
# With --iovec first, what a read costs by the kind of its destination (seed
# 002, tools/bench_iovec.py): nvfs-pread's pread (one buffer), preadv (4 KiB
# iovecs) and preadv-page (4 KiB iovecs all on one page), random, at 4 KiB,
# 64 KiB and 1 MiB, on tmpfs, ext4 on a loop device, fuse2fs, nvfs cache=none
# over /dev/fuse and io_uring, nvfs cache=page and nvfs through libnvfs-direct:
#   tools/bench.sh --iovec [--reps N] [--size BYTES] [--seconds S]
#                          [--targets a,b,...] [--baseline DIR_WITH_AN_OLDER_nvfs]
# With --maps first, shared mappings (tools/bench_maps.py, issue 31's direct
# maps): mmap's first touch (the mmap call included), warm 4 KiB copies out
# of and into a mapping (persisted and not) and an unmodified libpmem2
# program, on nvfs through the kernel (both cache modes), nvfs under
# LD_PRELOAD=libnvfs-direct.so, tmpfs, ext4 on a loop device and in process;
# each run says whether its mapping was the kernel's or the namespace's:
#   tools/bench.sh --maps [--reps N] [--size BYTES] [--seconds S]
#                         [--targets a,b,...] [--baseline DIR_WITH_AN_OLDER_nvfs]
# With --walks first, tree walks with the kernel's caches as long as the mount
# against 1 s timeouts (tools/bench_walks.py):
#   tools/bench.sh --walks [--files N] [--reps N] [--idle S] [--targets a,b,...]
#                          [--baseline DIR_WITH_AN_OLDER_nvfs]
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

if [ "${1:-}" = --meta ]; then
  shift
  nvfs_install_deps psmisc fuse2fs linux-perf  # fuser; perf for --count-requests
  nvfs_build
  exec python3 "$NVFS_TOP/tools/bench_meta.py" "$@"
fi
if [ "${1:-}" = --writes ]; then
  shift
  nvfs_install_deps fio
  nvfs_build
  exec python3 "$NVFS_TOP/tools/bench_writes.py" "$@"
fi
if [ "${1:-}" = --depth ]; then
  shift
  nvfs_install_deps fio fuse2fs
  nvfs_build
  exec python3 "$NVFS_TOP/tools/bench_depth.py" "$@"
fi
if [ "${1:-}" = --iovec ]; then
  shift
  nvfs_install_deps fuse2fs
  nvfs_build
  exec python3 "$NVFS_TOP/tools/bench_iovec.py" "$@"
fi
if [ "${1:-}" = --maps ]; then
  shift
  nvfs_install_deps psmisc  # fuser: a daemon let go of its image
  nvfs_build
  exec python3 "$NVFS_TOP/tools/bench_maps.py" "$@"
fi
if [ "${1:-}" = --walks ]; then
  shift
  nvfs_install_deps psmisc  # fuser
  nvfs_build
  exec python3 "$NVFS_TOP/tools/bench_walks.py" "$@"
fi

nvfs_install_deps fio fuse2fs gnuplot-nox
nvfs_build
exec python3 "$NVFS_TOP/tools/bench.py" "$@"
