#!/bin/bash
# The mount suite's test of what fstests found missing (issue 14, item 6)
# that a FUSE daemon can serve: chattr/lsattr's attributes (FS_IOC_GETFLAGS
# and FS_IOC_SETFLAGS through FUSE_IOCTL) and their rules, RENAME_WHITEOUT
# (FUSE_RENAME2), O_TMPFILE (FUSE_TMPFILE) with linkat, and statx's btime
# (FUSE_STATX). Each part failed on the daemon before them (chattr and
# lsattr: "Operation not supported"; the rename: EINVAL; O_TMPFILE:
# EOPNOTSUPP; statx: no STATX_BTIME in stx_mask). Usage: mount_attrs.sh
# [MOUNT-OPTIONS]
set -u
. "$(dirname "$0")/mount_lib.sh"
require_fuse
for tool in chattr lsattr python3; do
  command -v "$tool" >/dev/null || { echo "*** SKIPPED: $tool is not installed ***"; exit 77; }
done

options=${1:-}
work=$(mktemp -d /tmp/nvfs-attrs.XXXXXX)
image=/dev/shm/nvfs-attrs-$$.img
mnt=$work/mnt
mkdir "$mnt"
cleanup() {
  stop_nvfs
  rm -f "$image"
  rm -rf "$work"
}
trap cleanup EXIT

"$NVFS_MKFS" -q -s 64M "$image" >/dev/null || { echo "mkfs failed"; exit 1; }
mount_nvfs || exit 1

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# must_fail WHAT CMD...: CMD must fail (any error: EPERM is checked by python below).
must_fail() {
  local what=$1; shift
  if "$@" 2>/dev/null; then fail "$what succeeded"; fi
}
# The errno of one call, by name, from python (EPERM where the rule holds).
errno_of() {
  python3 - "$@" <<'EOF'
import errno, os, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "append": os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    elif op == "write": os.close(os.open(path, os.O_WRONLY))
    elif op == "trunc": os.truncate(path, 0)
    elif op == "unlink": os.unlink(path)
    elif op == "rename": os.rename(path, path + ".moved")
    elif op == "link": os.link(path, path + ".link")
    elif op == "chmod": os.chmod(path, 0o600)
    elif op == "setxattr": os.setxattr(path, "user.x", b"1")
    elif op == "create": open(os.path.join(path, "new"), "w").close()
    elif op == "utime": os.utime(path, (1, 1))
    print("ok")
except OSError as e:
    print(errno.errorcode[e.errno])
EOF
}
expect() {  # expect ERRNO OP PATH
  local got
  got=$(errno_of "$2" "$3")
  [ "$got" = "$1" ] || fail "$2 $3: $got, expected $1"
}

# --- chattr +i ---------------------------------------------------------------
printf 'frozen' >"$mnt/f"
chattr +i "$mnt/f" || fail "chattr +i"
lsattr "$mnt/f" | grep -q '^[^ ]*i[^ ]* ' || fail "lsattr does not show i: $(lsattr "$mnt/f")"
for op in write append trunc unlink rename link chmod setxattr utime; do expect EPERM "$op" "$mnt/f"; done
[ "$(cat "$mnt/f")" = frozen ] || fail "immutable file changed"
chattr +d "$mnt/f" 2>/dev/null && fail "another flag changed on an immutable file"
chattr -i "$mnt/f" || fail "chattr -i"
expect ok chmod "$mnt/f"

# --- chattr +a ---------------------------------------------------------------
printf 'one\n' >"$mnt/log"
chattr +a "$mnt/log" || fail "chattr +a"
lsattr "$mnt/log" | grep -q '^[^ ]*a[^ ]* ' || fail "lsattr does not show a: $(lsattr "$mnt/log")"
printf 'two\n' >>"$mnt/log" || fail "append to an append-only file"
for op in write trunc unlink rename link chmod setxattr utime; do expect EPERM "$op" "$mnt/log"; done
expect ok append "$mnt/log"
[ "$(cat "$mnt/log")" = "$(printf 'one\ntwo')" ] || fail "append-only file: $(cat "$mnt/log")"

# --- directories -------------------------------------------------------------
mkdir "$mnt/d" "$mnt/ad"
printf x >"$mnt/d/in"
printf x >"$mnt/ad/in"
chattr +i "$mnt/d" && chattr +a "$mnt/ad" || fail "chattr of a directory"
expect EPERM create "$mnt/d"
expect EPERM unlink "$mnt/d/in"
expect ok create "$mnt/ad"
expect EPERM unlink "$mnt/ad/in"
lsattr -d "$mnt/d" | grep -q '^[^ ]*i[^ ]* ' || fail "lsattr -d: $(lsattr -d "$mnt/d")"

# --- the other flags, and refusals --------------------------------------------
printf x >"$mnt/plain"
chattr +dAS "$mnt/plain" || fail "chattr +dAS"
flags=$(lsattr "$mnt/plain" | cut -d' ' -f1)
case $flags in *S*d*A*|*S*A*d*|*d*A*S*) ;; *) fail "lsattr after +dAS: $flags" ;; esac
must_fail "chattr +c (not kept)" chattr +c "$mnt/plain"
if command -v setpriv >/dev/null; then
  # Without CAP_LINUX_IMMUTABLE (the kernel's check; the daemon's is root only).
  must_fail "chattr +i without CAP_LINUX_IMMUTABLE" \
    setpriv --inh-caps=-linux_immutable --bounding-set=-linux_immutable chattr +i "$mnt/plain"
fi

# --- RENAME_WHITEOUT -------------------------------------------------------------
printf 'lower' >"$mnt/wsrc"
out=$(python3 - "$mnt" <<'EOF'
import ctypes, os, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
RENAME_WHITEOUT, RENAME_EXCHANGE = 4, 2
AT = -100
if libc.renameat2(AT, f"{d}/wsrc".encode(), AT, f"{d}/wdst".encode(), RENAME_WHITEOUT) != 0:
    print("renameat2:", os.strerror(ctypes.get_errno())); sys.exit()
st = os.lstat(f"{d}/wsrc")
if not stat.S_ISCHR(st.st_mode) or st.st_rdev != 0 or stat.S_IMODE(st.st_mode) != 0:
    print("whiteout is mode %o rdev %d" % (st.st_mode, st.st_rdev)); sys.exit()
if open(f"{d}/wdst").read() != "lower":
    print("renamed file lost its bytes"); sys.exit()
r = libc.renameat2(AT, f"{d}/wdst".encode(), AT, f"{d}/wsrc".encode(),
                   RENAME_WHITEOUT | RENAME_EXCHANGE)
if r == 0 or ctypes.get_errno() != 22:
    print("WHITEOUT|EXCHANGE was not EINVAL"); sys.exit()
print("ok")
EOF
)
[ "$out" = ok ] || fail "RENAME_WHITEOUT: $out"

# --- O_TMPFILE -------------------------------------------------------------------
# linkat(fd, "", ..., AT_EMPTY_PATH) rather than from /proc/self/fd: the
# same link, but this machine's /proc answers EXDEV for that even on tmpfs.
out=$(python3 - "$mnt" <<'EOF'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def link_fd(fd, path):
    if libc.linkat(fd, b"", -100, path.encode(), 0x1000) != 0:  # AT_EMPTY_PATH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
d = sys.argv[1]
try:
    fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o640)
except OSError as e:
    print("O_TMPFILE:", e.strerror); sys.exit()
os.write(fd, b"anonymous")
if os.fstat(fd).st_nlink != 0:
    print("nlink", os.fstat(fd).st_nlink); sys.exit()
if any(n not in ("lost+found", "f", "log", "d", "ad", "plain", "wsrc", "wdst") for n in os.listdir(d)):
    print("a name appeared:", os.listdir(d)); sys.exit()
gone = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)  # closed unnamed: freed
os.write(gone, b"x" * 65536)
os.close(gone)
link_fd(fd, f"{d}/named")
os.close(fd)
if open(f"{d}/named").read() != "anonymous" or os.stat(f"{d}/named").st_nlink != 1:
    print("linked tmpfile is wrong"); sys.exit()
old_umask = os.umask(0o027)  # the kernel leaves the umask to nvfs (FUSE_DONT_MASK)
masked = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o666)
os.umask(old_umask)
if os.fstat(masked).st_mode & 0o7777 != 0o640:
    print("tmpfile mode %o under umask 027" % (os.fstat(masked).st_mode & 0o7777)); sys.exit()
os.close(masked)
excl = os.open(d, os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
try:
    link_fd(excl, f"{d}/never")
    print("O_EXCL tmpfile was linked"); sys.exit()
except OSError:
    pass
os.close(excl)
print("ok")
EOF
)
[ "$out" = ok ] || fail "O_TMPFILE: $out"

# --- statx: the creation time, and chattr's attributes -----------------------
# statx(2) for more than the basic stats makes the kernel send FUSE_STATX
# (kernel 6.6+), which libfuse 3.14 answers ENOSYS: before the transport
# served it, stx_mask had no STATX_BTIME. Its reply also carries the
# STATX_ATTR_* of chattr's flags; kernels up to at least 6.18 drop them
# (fs/fuse/dir.c, fuse_do_statx copies the mask, the stats and btime only),
# so they are checked only where the kernel passes them on: where it shows
# one of nvfs's attributes_mask bits.
statx_py=$(cat <<'EOF'
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
STATX_BASIC_STATS, STATX_BTIME = 0x7ff, 0x800
AT_STATX_FORCE_SYNC, AT_SYMLINK_NOFOLLOW = 0x2000, 0x100
ATTR = {"immutable": 0x10, "append": 0x20, "nodump": 0x40}
def statx(path, flags=0):
    buf = ctypes.create_string_buffer(256)
    if libc.statx(-100, path.encode(), AT_SYMLINK_NOFOLLOW | flags,
                  STATX_BASIC_STATS | STATX_BTIME, buf) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), path)
    mask, = struct.unpack_from("<I", buf, 0)
    attrs, = struct.unpack_from("<Q", buf, 8)
    amask, = struct.unpack_from("<Q", buf, 56)
    bsec, bnsec = struct.unpack_from("<qI", buf, 80)
    csec, cnsec = struct.unpack_from("<qI", buf, 96)
    return mask, attrs, amask, bsec * 10**9 + bnsec, csec * 10**9 + cnsec
EOF
)
out=$(python3 - "$mnt" <<EOF
$statx_py
d = sys.argv[1]
before = time.time_ns() - 2 * 10**9  # the daemon's clock is this machine's
with open(f"{d}/born", "w") as f:
    f.write("x")
os.mkdir(f"{d}/borndir")
os.symlink("born", f"{d}/bornlink")
for p in ("born", "borndir", "bornlink"):
    for flags in (0, AT_STATX_FORCE_SYNC):
        mask, _, _, btime, ctime = statx(f"{d}/{p}", flags)
        if not mask & STATX_BTIME:
            print(f"{p}: no STATX_BTIME in stx_mask {mask:#x}"); sys.exit()
        if (mask & STATX_BASIC_STATS) != STATX_BASIC_STATS:
            print(f"{p}: basic stats missing: {mask:#x}"); sys.exit()
        if not before <= btime <= ctime:
            print(f"{p}: btime {btime} not between {before} and ctime {ctime}"); sys.exit()
first = statx(f"{d}/born")[3]
time.sleep(0.01)
os.chmod(f"{d}/born", 0o600)
with open(f"{d}/born", "a") as f:
    f.write("y")
_, _, _, btime, ctime = statx(f"{d}/born", AT_STATX_FORCE_SYNC)
if btime != first or ctime <= btime:
    print(f"btime moved or ctime did not: {first} -> {btime}, ctime {ctime}"); sys.exit()
with open(f"{d}/born.btime", "w") as f:
    f.write(str(first))
print("ok")
EOF
)
[ "$out" = ok ] || fail "statx btime: $out"
printf x >"$mnt/sx"
# attr_check FILE NAME... : exactly these of chattr's attributes show in
# stx_attributes ("dropped" where the kernel does not pass them on).
attr_check() {
  python3 - "$@" <<EOF
$statx_py
path, want = sys.argv[1], set(sys.argv[2:])
_, attrs, amask, _, _ = statx(path)
if not amask & sum(ATTR.values()):
    print("dropped"); sys.exit()
got = {n for n, bit in ATTR.items() if attrs & bit}
print("ok" if got == want else f"stx_attributes {attrs:#x}, expected {sorted(want)}")
EOF
}
dropped=
for step in "+a:append" "-a:" "+d:nodump" "+i:immutable nodump" "-i:nodump" "-d:"; do
  chattr "${step%%:*}" "$mnt/sx" || fail "chattr ${step%%:*}"
  # shellcheck disable=SC2086
  got=$(attr_check "$mnt/sx" ${step#*:})
  case $got in
    ok) ;;
    dropped) dropped=1 ;;
    *) fail "statx after chattr ${step%%:*}: $got" ;;
  esac
done
[ -z "$dropped" ] ||
  echo "note: this kernel does not pass FUSE_STATX's stx_attributes on (fs/fuse/dir.c, fuse_do_statx): btime checked only"

# --- persistence and fsck ------------------------------------------------------------
unmount_nvfs || fail "unmount"
"$NVFS_FSCK" -n "$image" >"$work/fsck.log" 2>&1 || { fail "fsck after the tests"; cat "$work/fsck.log"; }
mount_nvfs || exit 1
lsattr "$mnt/log" | grep -q '^[^ ]*a[^ ]* ' || fail "+a lost across a remount"
lsattr -d "$mnt/d" | grep -q '^[^ ]*i[^ ]* ' || fail "+i lost across a remount"
[ "$(cat "$mnt/named" 2>/dev/null)" = anonymous ] || fail "linked tmpfile lost across a remount"
out=$(python3 - "$mnt" <<EOF
$statx_py
d = sys.argv[1]
want = int(open(f"{d}/born.btime").read())
mask, _, _, btime, _ = statx(f"{d}/born")
print("ok" if mask & STATX_BTIME and btime == want else f"btime {btime} (mask {mask:#x}), was {want}")
EOF
)
[ "$out" = ok ] || fail "statx btime across a remount: $out"
chattr -a "$mnt/log" && chattr -i "$mnt/d" && chattr -a "$mnt/ad" || fail "clearing the flags"
rm -rf "$mnt"/* || fail "removing everything once the flags are clear"
unmount_nvfs || fail "unmount"
"$NVFS_FSCK" -n "$image" >"$work/fsck.log" 2>&1 || { fail "fsck at the end"; cat "$work/fsck.log"; }

if [ "$failures" -ne 0 ]; then
  echo "mount_attrs: $failures failures"
  exit 1
fi
echo "mount_attrs: ok"
