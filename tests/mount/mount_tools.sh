#!/usr/bin/env bash
# Ordinary tools on an nvfs mount: mkfs.nvfs -s 1G IMG && nvfs IMG DIR, then
# cp -a of a source tree, tar c | tar x, diff -r, git init/add/commit, make of
# a small C project, rsync -a, xattrs through getfattr/setfattr, SQLite in WAL
# mode (its -shm file is a shared mapping: FUSE_DIRECT_IO_ALLOW_MMAP with the
# default cache=none), statx's birth time (stat %W). Run by meson
# (suite mount) with NVFS_MKFS, NVFS_DAEMON and NVFS_FSCK set; also by hand:
#   NVFS_DAEMON=build/nvfs NVFS_MKFS=build/mkfs.nvfs NVFS_FSCK=build/fsck.nvfs \
#     bash tests/mount/mount_tools.sh [MOUNT_OPTIONS]
# Everything it makes is removed, and the mount unmounted, on any exit.
set -euo pipefail

options=${1:-}

source "$(dirname "$0")/mount_lib.sh"
require_fuse
for tool in git rsync make cc tar diff getfattr setfattr sqlite3 fusermount3; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool (tools/lib/common.sh installs it)"; exit 1; }
done

repo_src=$(cd "$(dirname "$0")/../.." && pwd)/src
image=/dev/shm/nvfs-tools-$$.img
mnt=
work=

image2=/dev/shm/nvfs-tools-$$-2.img
mnt2=
daemon2=

cleanup() {
  local rc=$?
  if [ -n "$mnt2" ]; then
    mountpoint -q "$mnt2" && { fusermount3 -u "$mnt2" || fusermount3 -uz "$mnt2"; }
    [ -n "$daemon2" ] && { wait "$daemon2" || true; }
    rmdir "$mnt2"
  fi
  rm -f "$image2"
  stop_nvfs
  if [ -n "$work" ]; then rm -rf "$work"; fi
  rm -f "$image"
  [ $rc -eq 0 ] && echo "mount_tools: all passed" || echo "mount_tools: FAILED (exit $rc)"
  exit $rc
}
trap cleanup EXIT
mnt=$(mktemp -d /tmp/nvfs-tools-XXXXXX)
work=$(mktemp -d /dev/shm/nvfs-tools-work-XXXXXX)

step() { printf '== %s\n' "$*"; }

# Type, mode, owner, times (ns) and, for files and symlinks, size of
# everything under a tree: what cp -a, rsync -a and tar xp must preserve.
meta() { (cd "$1" && find . -printf '%y %m %U:%G %T@ %p\n' -a \( -type d -o -printf '  %s\n' \) | sort); }
same_meta() {
  diff <(meta "$1") <(meta "$2") || { echo "metadata differs: $1 vs $2"; return 1; }
}

# A snapshot of this repository's sources, so edits made meanwhile do not
# show up as differences.
src=$work/src
cp -a "$repo_src" "$src"

step "mkfs.nvfs -s 1G $image; nvfs $image $mnt ${options:+-o $options}"
"$NVFS_MKFS" -q -s 1G "$image"
mount_nvfs

step "cp -a of a source tree, diff -r"
cp -a "$src" "$mnt/src"
diff -r "$src" "$mnt/src"
same_meta "$src" "$mnt/src"
cp -a /usr/include/c++ "$mnt/cxx"
diff -r /usr/include/c++ "$mnt/cxx"
same_meta /usr/include/c++ "$mnt/cxx"

step "tar c | tar x round trip, diff -r"
(cd "$mnt" && tar cf - src cxx) | (mkdir "$work/untar" && cd "$work/untar" && tar xf -)
diff -r "$src" "$work/untar/src"
mkdir "$mnt/untar"
tar cf - -C "$work/untar" . | tar xpf - -C "$mnt/untar"
diff -r "$work/untar" "$mnt/untar"
same_meta "$work/untar/src" "$mnt/untar/src"

step "rsync -a, then an incremental rsync that finds nothing to do"
rsync -a "$src/" "$mnt/rsynced/"
diff -r "$src" "$mnt/rsynced"
same_meta "$src" "$mnt/rsynced"
changes=$(rsync -ai "$src/" "$mnt/rsynced/" | wc -l)
[ "$changes" -eq 0 ] || { echo "second rsync changed $changes entries"; exit 1; }
rsync -a --delete "$mnt/rsynced/" "$work/back/"
diff -r "$src" "$work/back"
same_meta "$src" "$work/back"

step "git init, add, commit, log, status"
(
  cd "$mnt/src"
  git init -q
  git -c user.name=nvfs -c user.email=nvfs@example.invalid add -A
  git -c user.name=nvfs -c user.email=nvfs@example.invalid commit -q -m "import"
  echo "// touched" >> fs/super.cpp
  git -c user.name=nvfs -c user.email=nvfs@example.invalid commit -qam "touch"
  [ "$(git rev-list --count HEAD)" -eq 2 ]
  git fsck --no-progress --strict
  [ -z "$(git status --porcelain)" ]
  git gc -q
  git fsck --no-progress
)

step "make of a small C project"
mkdir "$mnt/proj"
cat > "$mnt/proj/main.c" <<'C'
#include <stdio.h>
int add(int a, int b);
int main(void) { printf("%d\n", add(40, 2)); return 0; }
C
cat > "$mnt/proj/add.c" <<'C'
int add(int a, int b) { return a + b; }
C
printf 'hello: main.o add.o\n\t$(CC) -o $@ $^\n%%.o: %%.c\n\t$(CC) -O2 -c -o $@ $<\nclean:\n\trm -f hello *.o\n' \
  > "$mnt/proj/Makefile"
make -s -C "$mnt/proj"
[ "$("$mnt/proj/hello")" = 42 ]
touch "$mnt/proj/add.c"
rebuilt=$(make -C "$mnt/proj")
grep -q "add.o" <<<"$rebuilt"   # make saw the new mtime
make -s -C "$mnt/proj" clean
[ ! -e "$mnt/proj/hello" ]

step "xattrs through setfattr/getfattr"
setfattr -n user.color -v blue "$mnt/proj/main.c"
[ "$(getfattr --only-values -n user.color "$mnt/proj/main.c")" = blue ]

step "stat's birth time (statx STATX_BTIME: FUSE_STATX)"
# %W is 0 where the file system gives no birth time (as before the
# transport served FUSE_STATX).
born=$(stat -c %W "$mnt/proj/main.c")
if ! [ "$born" -gt 0 ] || ! [ "$born" -le "$(stat -c %Z "$mnt/proj/main.c")" ]; then
  echo "birth time $born (ctime $(stat -c %Z "$mnt/proj/main.c"))"
  exit 1
fi

step "SQLite in WAL mode: create, fill, reopen"
# WAL keeps its index in DB-shm, mapped MAP_SHARED by every connection: with
# cache=none that mmap failed with ENODEV before the daemon asked for
# FUSE_DIRECT_IO_ALLOW_MMAP, and the first insert said "disk I/O error".
db=$mnt/sqlite/test.db
mkdir "$mnt/sqlite"
[ "$(sqlite3 "$db" 'PRAGMA journal_mode=WAL;')" = wal ]
sqlite3 "$db" 'CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
  WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
  INSERT INTO t(v) SELECT printf("row %d", i) FROM n;'
for i in $(seq 1 20); do sqlite3 "$db" "INSERT INTO t(v) VALUES ('single $i');"; done
[ -e "$db-wal" ] && [ -e "$db-shm" ]
# A second connection reads while the first holds the database open: the two
# meet only in the shared mapping of DB-shm.
[ "$(sqlite3 "$db" 'SELECT count(*) FROM t;')" = 5020 ]
[ "$(sqlite3 "$db" 'PRAGMA integrity_check;')" = ok ]
[ "$(sqlite3 "$db" 'PRAGMA wal_checkpoint(TRUNCATE);' | cut -d'|' -f1)" = 0 ]

step "persistence: unmount, fsck -n, mount again, diff -r"
unmount_nvfs
"$NVFS_FSCK" -n "$image"
mount_nvfs
diff -r "$src" "$mnt/rsynced"
same_meta "$src" "$mnt/rsynced"
diff -r /usr/include/c++ "$mnt/cxx"
same_meta /usr/include/c++ "$mnt/cxx"
(cd "$mnt/src" && git fsck --no-progress && [ "$(git rev-list --count HEAD)" -eq 2 ])
[ "$(sqlite3 "$db" 'SELECT count(*), max(v) FROM t;')" = "5020|single 9" ]
[ "$(sqlite3 "$db" 'PRAGMA journal_mode;')" = wal ]
sqlite3 "$db" "INSERT INTO t(v) VALUES ('after remount');"
[ "$(sqlite3 "$db" 'PRAGMA integrity_check;')" = ok ]
step "a second daemon keeps no descriptor it inherited (this mount stays free to unmount)"
# Started while this shell holds a file of the first mount open (fstests
# mounts its scratch device from a shell like that): a daemon that kept the
# descriptor kept the first mount busy until it exited.
"$NVFS_MKFS" -q -s 64M "$image2"
mnt2=$(mktemp -d /tmp/nvfs-tools-2-XXXXXX)
exec 7>"$mnt/held-by-the-shell"
"$NVFS_DAEMON" -f "$image2" "$mnt2" &
daemon2=$!
exec 7>&-
for _ in $(seq 500); do mountpoint -q "$mnt2" && break; sleep 0.01; done
mountpoint -q "$mnt2"
held=$(find "/proc/$daemon2/fd" -lname "$mnt/*" -printf '%f -> %l\n')
[ -z "$held" ] || { echo "the second daemon holds descriptors of $mnt: $held"; exit 1; }
rm "$mnt/held-by-the-shell"

df -h "$mnt" | tail -1
unmount_nvfs
"$NVFS_FSCK" -n "$image"
fusermount3 -u "$mnt2"
wait "$daemon2"
daemon2=
