#!/usr/bin/env bash
# Runs fstests (xfstests) against nvfs, or against a peer FUSE filesystem.
#
#   tools/xfstests.sh XFSTESTS_DIR [--cache=none|page] [--peer=PASSTHROUGH_HP]
#                     [--tag=NAME] [--test-size=SIZE] [--scratch-size=SIZE]
#                     [TEST... | -g GROUP | other ./check arguments]
#
# XFSTESTS_DIR is an fstests checkout (git://git.kernel.org/pub/scm/fs/xfs/
# xfstests-dev.git, or github.com/kdave/xfstests). In this order, the script
#   1. installs the Debian packages fstests needs (NVFS_XFSTESTS_PACKAGES in
#      tools/lib/common.sh) and fstests' users fsgqa, fsgqa2, 123456-fsgqa;
#   2. applies tests/xfstests/fstests-fuse.patch to the checkout (once; it
#      lets FSTYP=fuse format and check its scratch and test devices) and
#      builds fstests (make) unless it is built;
#   3. builds nvfs (or, with --peer, libfuse 3.14's passthrough_hp example),
#      installs the mount helper /sbin/mount.fuse.nvfs (or
#      mount.fuse.passthrough_hp), makes the test and scratch images under
#      /dev/shm, writes the fstests config (tests/xfstests/local.config.in);
#   4. runs ./check with the arguments given (default: -g quick), then
#      unmounts, removes the images, the helper and the users it added (each
#      only when no other run of this script still uses it), also when the
#      run fails or is interrupted;
#   5. ends with the line
#        xfstests: ran=N passed=N failed=N notrun=N
#      and the names of the failed tests; exit status 0 if none failed.
#
# --cache: nvfs's cache mode (default none). --peer=P runs the same tests
# against passthrough_hp instead of nvfs: P is the binary, or a libfuse
# source tree (its example/passthrough_hp.cc is built against the system's
# libfuse3, with tests/xfstests/passthrough_hp-3.14-mount-options.patch).
# --tag names this run's images, mount points and results (default: nvfs-
# CACHE or peer), so runs with different tags can go side by side.
# NVFS_XFSTESTS_BIN=DIR: run the nvfs, mkfs.nvfs, fsck.nvfs in DIR, unbuilt.
# Results: $NVFS_XFSTESTS_RESULTS (default /tmp/nvfs-xfstests/TAG/results),
# the whole output in .../TAG/check.log.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 1 ] || usage
xfstests=$(cd "$1" && pwd) || usage
shift
cache=none peer= tag= test_size=2G scratch_size=4G
check_args=()
for arg in "$@"; do
  case $arg in
    --cache=none|--cache=page) cache=${arg#--cache=} ;;
    --cache=*) echo "xfstests.sh: --cache must be none or page" >&2; exit 2 ;;
    --peer=*) peer=${arg#--peer=} ;;
    --tag=*) tag=${arg#--tag=} ;;
    --test-size=*) test_size=${arg#--test-size=} ;;
    --scratch-size=*) scratch_size=${arg#--scratch-size=} ;;
    -h|--help) usage ;;
    *) check_args+=("$arg") ;;
  esac
done
[ ${#check_args[@]} -gt 0 ] || check_args=(-g quick)
[ -f "$xfstests/check" ] || { echo "xfstests.sh: $xfstests has no ./check" >&2; exit 2; }
if [ -n "$peer" ]; then tag=${tag:-peer}; else tag=${tag:-nvfs-$cache}; fi
[[ $tag =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "xfstests.sh: bad --tag" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "xfstests.sh: fstests runs as root" >&2; exit 2; }
[ -c /dev/fuse ] || { echo "xfstests.sh: no /dev/fuse" >&2; exit 2; }

here=$NVFS_TOP/tests/xfstests
state=/tmp/nvfs-xfstests/$tag
results=${NVFS_XFSTESTS_RESULTS:-$state/results}
shared=/run/nvfs-xfstests   # what several runs share: the helper, the users
if [ -z "$peer" ]; then
  test_dev=/dev/shm/nvfs-xfstests-$tag-test.img
  scratch_dev=/dev/shm/nvfs-xfstests-$tag-scratch.img
else
  # Names, not paths (mount.fuse.passthrough_hp): the directories are
  # /dev/shm/NAME.
  test_dev=nvfs-xfstests-$tag-test
  scratch_dev=nvfs-xfstests-$tag-scratch
fi
test_dir=$state/test
scratch_mnt=$state/scratch
users=(fsgqa fsgqa2 123456-fsgqa)

say() { echo "xfstests.sh: $*" >&2; }

mkdir -p "$state"
nvfs_install_deps "${NVFS_XFSTESTS_PACKAGES[@]}"

# --- The mount target: nvfs, or the peer ---------------------------------
if [ -z "$peer" ]; then
  # NVFS_XFSTESTS_BIN: a folder with nvfs, mkfs.nvfs and fsck.nvfs to use
  # as they are (e.g. a copy of an earlier build); else build/ is built.
  if [ -n "${NVFS_XFSTESTS_BIN:-}" ]; then
    NVFS_BUILD=$(cd "$NVFS_XFSTESTS_BIN" && pwd)
  else
    nvfs_build
  fi
  subtype=nvfs
  daemon=$NVFS_BUILD/nvfs
  helper_src=$here/mount.fuse.nvfs
else
  subtype=passthrough_hp
  if [ -d "$peer" ]; then
    src=$peer/example/passthrough_hp.cc
    [ -f "$src" ] || { say "$peer has no example/passthrough_hp.cc"; exit 2; }
    mkdir -p "$state/peer"
    cp "$src" "$peer/example/cxxopts.hpp" "$state/peer/"
    patch -s -p2 -d "$state/peer" < "$here/passthrough_hp-3.14-mount-options.patch"
    say "building passthrough_hp from $src"
    g++ -O2 -std=c++17 -o "$state/peer/passthrough_hp" "$state/peer/passthrough_hp.cc" \
      $(pkg-config --cflags --libs fuse3) -pthread
    daemon=$state/peer/passthrough_hp
  else
    daemon=$(readlink -f "$peer")
  fi
  [ -x "$daemon" ] || { say "$daemon is not executable"; exit 2; }
  helper_src=$here/mount.fuse.passthrough_hp
fi
helper=/sbin/mount.fuse.$subtype

# --- fstests: the patch, the build ----------------------------------------
# Applied once: a checkout the patch is already in is left as it is.
if patch -s -p1 -R -f --dry-run -d "$xfstests" < "$here/fstests-fuse.patch" >/dev/null 2>&1; then
  :
elif patch -s -p1 -N -f --dry-run -d "$xfstests" < "$here/fstests-fuse.patch" >/dev/null; then
  patch -s -p1 -N -d "$xfstests" < "$here/fstests-fuse.patch"
  say "applied tests/xfstests/fstests-fuse.patch to $xfstests"
else
  say "tests/xfstests/fstests-fuse.patch does not apply to $xfstests"; exit 1
fi
if [ ! -x "$xfstests/ltp/fsstress" ] || [ ! -x "$xfstests/src/aio-dio-regress/aio-dio-fcntl-race" ]; then
  say "building fstests in $xfstests"
  make -C "$xfstests" -j"$(nproc)" >"$state.make.log" 2>&1 \
    || { say "make failed: $state.make.log"; exit 1; }
fi

# --- What several runs share: taken under a lock, given back by the last --
mkdir -p "$shared" "$state"
exec 9>"$shared/lock"
take_shared() {
  flock 9
  touch "$shared/run.$$"
  if [ ! -e "$helper" ]; then
    sed "s|@NVFS_DAEMON@|$daemon|" "$helper_src" > "$helper.tmp.$$"
    chmod 755 "$helper.tmp.$$"
    mv "$helper.tmp.$$" "$helper"
    touch "$shared/ours.$subtype"
  elif [ ! -e "$shared/ours.$subtype" ]; then
    say "using the $helper already installed (not ours: left in place)"
  fi
  # As fstests' README has it: each user with a group of its own name
  # (fsgqa2's is required by some tests), and a group fsgqa.
  local u
  for u in "${users[@]}"; do
    if ! id "$u" >/dev/null 2>&1; then
      useradd -m -U "$u" 2>/dev/null || useradd -m -U --badname "$u"
      touch "$shared/ours.user.$u"
    fi
  done
  getent group fsgqa >/dev/null || { groupadd fsgqa; touch "$shared/ours.group"; }
  flock -u 9
}
give_back_shared() {
  flock 9
  rm -f "$shared/run.$$"
  local other alive=0
  for other in "$shared"/run.*; do
    [ -e "$other" ] || continue
    if kill -0 "${other##*.}" 2>/dev/null; then alive=1; else rm -f "$other"; fi
  done
  if [ $alive -eq 0 ]; then
    local s u
    for s in nvfs passthrough_hp; do
      [ -e "$shared/ours.$s" ] && rm -f "/sbin/mount.fuse.$s" "$shared/ours.$s"
    done
    for u in "${users[@]}"; do
      [ -e "$shared/ours.user.$u" ] && { userdel -r "$u" 2>/dev/null || true; rm -f "$shared/ours.user.$u"; }
    done
    [ -e "$shared/ours.group" ] && { groupdel fsgqa 2>/dev/null || true; rm -f "$shared/ours.group"; }
  fi
  flock -u 9
}

# Unmounts whatever is mounted on this run's mount points (a killed run
# leaves mounts behind) and waits for the daemons to let go.
unmount_all() {
  local dir pass
  for pass in 1 2; do
    for dir in "$scratch_mnt" "$test_dir"; do
      while findmnt -rn "$dir" >/dev/null 2>&1; do
        umount "$dir" 2>/dev/null || fusermount3 -uz "$dir" 2>/dev/null || break
      done
    done
  done
  local img
  for img in "$test_dev" "$scratch_dev"; do
    [ -f "$img" ] || continue
    for _ in $(seq 300); do flock -n "$img" true 2>/dev/null && break; sleep 0.1; done
  done
}

cleanup() {
  local status=$?
  set +e
  unmount_all
  if [ -z "$peer" ]; then
    rm -f "$test_dev" "$scratch_dev"
  else
    rm -rf "/dev/shm/$test_dev" "/dev/shm/$scratch_dev"
  fi
  give_back_shared
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

take_shared
unmount_all

# --- The devices and the config -------------------------------------------
mkdir -p "$test_dir" "$scratch_mnt" "$results"
opts="allow_other"
if [ -z "$peer" ]; then
  opts+=",cache=$cache"
  rm -f "$test_dev" "$scratch_dev"
  "$NVFS_BUILD/mkfs.nvfs" -q -s "$test_size" "$test_dev"
  "$NVFS_BUILD/mkfs.nvfs" -q -s "$scratch_size" "$scratch_dev"
  sed -e "s|@NVFS_MKFS@|$NVFS_BUILD/mkfs.nvfs|" -e "s|@SCRATCH_SIZE@|$scratch_size|" \
    "$here/mkfs.nvfs.sh" > "$state/mkfs.nvfs.sh"
  chmod 755 "$state/mkfs.nvfs.sh"
  mkfs_prog=$state/mkfs.nvfs.sh
  fsck_prog="$NVFS_BUILD/fsck.nvfs -n"
else
  # passthrough_hp serves a directory: "formatting" it is emptying it, which
  # fstests does by itself when FUSE_MKFS_PROG is unset (and it cannot make
  # a filesystem of a given size).
  rm -rf "/dev/shm/$test_dev" "/dev/shm/$scratch_dev"
  mkdir -p "/dev/shm/$test_dev" "/dev/shm/$scratch_dev"
  mkfs_prog= fsck_prog=
fi
sed -e "s|@SUBTYPE@|$subtype|" -e "s|@TEST_DEV@|$test_dev|" -e "s|@TEST_DIR@|$test_dir|" \
  -e "s|@SCRATCH_DEV@|$scratch_dev|" -e "s|@SCRATCH_MNT@|$scratch_mnt|" \
  -e "s|@OPTIONS@|$opts|" -e "s|@DAEMON@|$daemon|" -e "s|@MKFS_PROG@|$mkfs_prog|" \
  -e "s|@FSCK_PROG@|$fsck_prog|" -e "s|@RESULT_BASE@|$results|" \
  -e "s|@SCRATCH_SIZE@|$scratch_size|" \
  "$here/local.config.in" > "$state/local.config"

# --- The run ----------------------------------------------------------------
say "fstests in $xfstests, ${peer:+peer $daemon, }config $state/local.config, log $state/check.log"
rc=0
# fstests' unmounts go through tests/xfstests/retry/umount (a "busy" for the
# moment the kernel still releases a finished test's files is retried, and
# logged); NVFS_XFSTESTS_NO_RETRY=1 runs the plain umount.
retries=$state/umount-retries.log
rm -f "$retries"
retry_path=$here/retry:
[ "${NVFS_XFSTESTS_NO_RETRY:-0}" = 1 ] && retry_path=
(cd "$xfstests" && PATH=$retry_path$PATH NVFS_UMOUNT_RETRY_LOG=$retries \
  HOST_OPTIONS=$state/local.config ./check "${check_args[@]}") \
  2>&1 | tee "$state/check.log" || rc=$?
unmount_all
if [ -s "$retries" ]; then
  echo "xfstests: $(wc -l <"$retries") unmounts were busy for a moment and retried ($retries):"
  sed 's/^/  /' "$retries"
fi

# check's summary: "Ran: a b" (every test, the not-run ones too, as fstests
# counts them), "Not run: c", "Failures: d", each on one line.
list() { sed -n "s/^$1: //p" "$state/check.log" | tail -1; }
ran=$(list Ran | wc -w)
notrun=$(list 'Not run' | wc -w)
failures=$(list Failures)
failed=$(echo "$failures" | wc -w)
echo "xfstests: ran=$ran passed=$((ran - failed - notrun)) failed=$failed notrun=$notrun"
[ "$failed" -eq 0 ] || echo "failed: $failures"
[ "$failed" -eq 0 ] && [ "$ran" -gt 0 ]
