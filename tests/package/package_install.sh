#!/bin/bash
# The Debian packages tools/package.sh built, installed into a scratch root
# with dpkg-deb -x: every program runs from there (its libraries from there
# too) and answers --version with this tree's version, every program has its
# man page and every page renders without a warning, the header and library
# of libnvfs-direct-dev build and run a client, and, as root with /dev/fuse,
# mount(8)'s helper for type fuse.nvfs mounts through the packaged daemon.
#
# NVFS_PACKAGE_DIR: where tools/package.sh put the .deb files (check.sh
# --package sets it). Unset, or holding no package of this version: SKIPPED
# (77), never passed. NVFS_PACKAGE_FAILED (check.sh --package, when
# package.sh failed): FAIL.
set -euo pipefail
: "${NVFS_VERSION:?set NVFS_VERSION to the project version}"
: "${NVFS_SOURCE_ROOT:?set NVFS_SOURCE_ROOT to the source tree (where meson.build is)}"

skip() { echo "*** SKIPPED: $* ***"; exit 77; }
fail() { echo "FAIL: $*"; failed=1; }
failed=0

if [ -n "${NVFS_PACKAGE_FAILED:-}" ]; then
  echo "FAIL: tools/package.sh failed (exit $NVFS_PACKAGE_FAILED): no package to test"
  exit 1
fi
[ -n "${NVFS_PACKAGE_DIR:-}" ] ||
  skip "no package built: run tools/package.sh, then this test with NVFS_PACKAGE_DIR=its output folder (or tools/check.sh --package)"
shopt -s nullglob
debs=()
for deb in "$NVFS_PACKAGE_DIR"/*_"$NVFS_VERSION"_*.deb; do
  [[ "$(basename "$deb")" == *-dbgsym_* ]] || debs+=("$deb")  # debug symbols: not installed
done
[ ${#debs[@]} -gt 0 ] || skip "no .deb of version $NVFS_VERSION in $NVFS_PACKAGE_DIR"
for tool in dpkg-deb groff man; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (NVFS_PACKAGE_TOOLS)"
done

root=$(mktemp -d /tmp/nvfs-package.XXXXXX)
mnt='' daemon_dev=''
cleanup() {
  if [ -n "$mnt" ]; then
    mountpoint -q "$mnt" && { umount "$mnt" 2>/dev/null || umount -l "$mnt"; }
    rmdir "$mnt" 2>/dev/null || true
  fi
  rm -rf "$root"
  [ -n "$daemon_dev" ] && rm -f "$daemon_dev"
  return 0
}
trap cleanup EXIT

for deb in "${debs[@]}"; do
  echo "extracting $(basename "$deb")"
  dpkg-deb -x "$deb" "$root"
done
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
libdir=$root/usr/lib/$multiarch
export LD_LIBRARY_PATH=$libdir

# The programs: the ones issue 22 names must be there (nvfs-resize once
# meson.build builds it); every one found answers --version.
resize_built=false
if grep -rqs --include=meson.build "executable('nvfs-resize'" "$NVFS_SOURCE_ROOT"
then
  resize_built=true
fi
for prog in mkfs.nvfs fsck.nvfs nvfs nvfs-dump nvfs-pread nvfs-resize; do
  if [ ! -x "$root/usr/sbin/$prog" ] && [ ! -x "$root/usr/bin/$prog" ]; then
    if [ "$prog" = nvfs-resize ] && ! $resize_built; then
      echo "note: nvfs-resize is not in the package (meson.build does not build it yet: issue 22, items 1-2)"
    else
      fail "$prog is not in the package"
    fi
  fi
done
programs=("$root"/usr/sbin/* "$root"/usr/bin/*)
[ ${#programs[@]} -gt 0 ] || fail "the package holds no program"
for path in "${programs[@]}"; do
  prog=$(basename "$path")
  # Its libraries from the scratch root, not from an installed copy.
  if ldd "$path" | grep -q 'libnvfs-direct' &&
     ! ldd "$path" | grep 'libnvfs-direct' | grep -q "=> $libdir/"; then
    fail "$prog does not load libnvfs-direct from the package: $(ldd "$path" | grep libnvfs-direct)"
  fi
  if ! out=$("$path" --version 2>&1); then
    fail "$prog --version failed: $out"
  elif [[ "$out" != "$prog $NVFS_VERSION"* ]]; then
    fail "$prog --version says \"$out\", not \"$prog $NVFS_VERSION\""
  else
    echo "ok: $out"
  fi
  pages=("$root"/usr/share/man/man[18]/"$prog".[18].gz)
  [ ${#pages[@]} -eq 1 ] || fail "$prog has no man page in the package"
done

# Every man page: groff finds nothing to warn about, man renders it with its
# name and this version in the title, and its program is in the package.
pages=("$root"/usr/share/man/man[18]/*.gz)
[ ${#pages[@]} -ge 6 ] || fail "${#pages[@]} man pages in the package, not 6"
for page in "${pages[@]}"; do
  name=$(basename "$page" .gz)
  prog=${name%.*}
  if ! warnings=$(zcat "$page" | groff -ww -z -man 2>&1) || [ -n "$warnings" ]; then
    fail "groff -ww on $name: $warnings"
  fi
  if ! text=$(MANWIDTH=80 man -l "$page" 2>&1); then
    fail "man -l $name failed: $text"
  elif ! grep -q "^NAME" <<< "$text" || ! grep -q "nvfs $NVFS_VERSION" <<< "$text" ||
       ! grep -qF -- "$prog" <<< "$text"; then
    fail "man -l $name: no NAME, program name or version \"nvfs $NVFS_VERSION\""
  else
    echo "ok: $name renders ($(wc -l <<< "$text") lines)"
  fi
  if [ ! -x "$root/usr/sbin/$prog" ] && [ ! -x "$root/usr/bin/$prog" ]; then
    echo "note: $name documents $prog, which is not in the package"
    if [ "$prog" != nvfs-resize ] || $resize_built; then fail "$name has no program"; fi
  fi
done

# libnvfs-direct-dev: the header and the link build a client, which runs
# against the packaged library (its own executable, on no nvfs mount, is
# read through the kernel, and nvfs_direct_why says so).
if command -v cc >/dev/null && [ -f "$root/usr/include/nvfs/direct.h" ]; then
  cat > "$root/client.c" <<'EOF'
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <nvfs/direct.h>
/* A file on no nvfs mount: a handle whose reads go to the kernel. */
int main(int argc, char** argv) {
  char buf[4];
  int fd = open(argv[0], O_RDONLY);
  nvfs_direct* f = nvfs_direct_attach(fd);
  if (f == NULL || nvfs_direct_why(f) != NVFS_DIRECT_NOT_NVFS) return 1;
  if (nvfs_direct_pread(f, buf, 4, 0) != 4 || buf[1] != 'E') return 2;
  printf("%s\n", nvfs_direct_strwhy(nvfs_direct_why(f)));
  nvfs_direct_detach(f);
  close(fd);
  return argc == 1 ? 0 : 3;
}
EOF
  if cc -o "$root/client" -I"$root/usr/include" "$root/client.c" -L"$libdir" -lnvfs-direct \
       2> "$root/cc.log" && "$root/client" > /dev/null; then
    echo "ok: a client of nvfs/direct.h builds, links -lnvfs-direct and runs"
  else
    fail "the libnvfs-direct-dev client: $(cat "$root/cc.log")"
  fi
else
  fail "no cc, or no nvfs/direct.h in the package"
fi

# mount -t fuse.nvfs: mount(8) runs /sbin/mount.fuse.nvfs or, with none,
# fuse3's /sbin/mount.fuse as "mount.fuse DEVICE DIR -o rw,OPTIONS -t
# fuse.nvfs", which runs "nvfs DEVICE DIR -o OPTIONS" through /bin/sh.
# mount(8) gives its helper no PATH, so the shell's default path finds the
# package's /usr/sbin/nvfs; here the helper is run as mount(8) runs it, with
# a PATH that puts the scratch root's /usr/sbin first.
if [ "$(id -u)" -ne 0 ] || ! [ -c /dev/fuse ]; then
  echo "note: mount -t fuse.nvfs not tried (needs root and /dev/fuse)"
elif [ -e /sbin/mount.fuse.nvfs ]; then
  echo "note: mount -t fuse.nvfs not tried: /sbin/mount.fuse.nvfs (not the package's) is installed"
elif ! [ -x /sbin/mount.fuse ]; then
  fail "no /sbin/mount.fuse (the fuse3 package, which nvfs depends on)"
else
  daemon_dev=/dev/shm/nvfs-package-$$.img
  mnt=$(mktemp -d /tmp/nvfs-package-mnt.XXXXXX)
  "$root/usr/sbin/mkfs.nvfs" -q -s 64M "$daemon_dev"
  if PATH=$root/usr/sbin:$PATH /sbin/mount.fuse "$daemon_dev" "$mnt" -o rw,direct=off -t fuse.nvfs
  then
    type=$(findmnt -n -o FSTYPE "$mnt" || true)
    echo hello > "$mnt/file"
    [ "$type" = fuse.nvfs ] || fail "mounted as \"$type\", not fuse.nvfs"
    [ "$(cat "$mnt/file")" = hello ] || fail "a file written through the mount reads back wrong"
    umount "$mnt"
    # fsck waits for the daemon to let go of the namespace.
    if "$root/usr/sbin/fsck.nvfs" -n "$daemon_dev" > /dev/null; then
      echo "ok: mount.fuse (type fuse.nvfs) mounted through the packaged daemon; fsck clean after umount"
    else
      fail "fsck.nvfs -n after the umount"
    fi
  else
    fail "/sbin/mount.fuse with type fuse.nvfs, through the packaged daemon"
  fi
fi

[ "$failed" -eq 0 ] || exit 1
echo "package install test: passed"
