#!/bin/bash
# FUSE_MKFS_PROG for fstests (tests/xfstests/fstests-fuse.patch):
#   mkfs.nvfs.sh [MKFS_OPTIONS...] [-s BYTES] [-b BLOCK_SIZE] DEVICE
# formats DEVICE as nvfs, always (-f). An image file is made anew at the
# size asked (-s, from _scratch_mkfs_sized) or else at the run's scratch
# size, so a test that shrank the scratch image does not leave it small
# for the next one (mkfs.nvfs -s only ever grows a file).
# NVFS_MKFS: mkfs.nvfs; NVFS_XFSTESTS_SCRATCH_SIZE: the default size.
set -u
mkfs=${NVFS_MKFS:-@NVFS_MKFS@}
size=${NVFS_XFSTESTS_SCRATCH_SIZE:-@SCRATCH_SIZE@}
args=()
while [ $# -gt 1 ]; do
  case $1 in
    -s) size=$2; shift 2 ;;
    -s*) size=${1#-s}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
dev=$1
# An image truncate creates is the owner's only, as one mkfs.nvfs -s creates
# (doc/integrity.md, "The namespace is the boundary").
umask 077
if [ -c "$dev" ] || [ -b "$dev" ]; then
  exec "$mkfs" -f -q "${args[@]}" "$dev"
fi
truncate -s 0 "$dev" || exit 1
exec "$mkfs" -f -q -s "$size" "${args[@]}" "$dev"
