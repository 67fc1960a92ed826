#!/usr/bin/env bash
# Installs what it needs, builds, makes an emulated pmem image under /dev/shm,
# formats it, checks it and shows what is on it. Idempotent.
#   tools/demo.sh [IMAGE] [SIZE]
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

image=${1:-/dev/shm/nvfs-demo.img}
size=${2:-1G}

nvfs_install_deps
nvfs_build
bin=$NVFS_BUILD

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

# -f: the demo re-formats its own image on every run.
step "$bin/mkfs.nvfs" -f -s "$size" -L demo "$image"
step "$bin/fsck.nvfs" -n "$image"
step "$bin/nvfs-dump" "$image"
echo
echo "demo: formatted $image ($size); mounting and benchmarking arrive with the daemon (issue 4)."
