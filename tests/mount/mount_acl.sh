#!/bin/bash
# POSIX ACLs on a real mount, with the real tools: setfacl/getfacl (package
# acl), cp -a, rsync -A; the kernel enforcing them for users other than
# root (setpriv), inheritance and the umask, chmod and the mask, set-group-ID
# on setfacl by a user outside the group, persistence across a remount.
# Usage: mount_acl.sh [MOUNT_OPTIONS]   (e.g. cache=page)
set -euo pipefail
. "$(dirname "$0")/mount_lib.sh"

require_fuse
for tool in setfacl getfacl setpriv rsync; do
  command -v "$tool" >/dev/null || { echo "*** SKIPPED: $tool not installed (NVFS_PACKAGES) ***"; exit 77; }
done

options="allow_other${1:+,$1}"
image=$(mktemp /dev/shm/nvfs-acl-XXXXXX)
mnt=$(mktemp -d /tmp/nvfs-acl-mnt-XXXXXX)
scratch=$(mktemp -d /dev/shm/nvfs-acl-scratch-XXXXXX)
cleanup() { stop_nvfs; rm -f "$image"; rm -rf "$scratch"; }
trap cleanup EXIT

fail() { echo "FAIL: $*"; exit 1; }
# Runs a command as uid/gid $1 (no supplementary groups).
as() { local id=$1; shift; setpriv --reuid="$id" --regid="$id" --clear-groups -- "$@"; }
mode_of() { stat -c %a "$1"; }
# getfacl's entries without the "# file:" line, for comparing two files.
acl_of() { getfacl -p "$1" 2>/dev/null | grep -v '^# file:'; }
# unmount_nvfs, after the last file a tool closed is released: the kernel
# drops a closed file's last reference asynchronously, and an unmount in
# that instant is EBUSY.
unmount_settled() {
  for _ in $(seq 50); do
    fusermount3 -u "$mnt" 2>/dev/null && break
    sleep 0.1
  done
  if mountpoint -q "$mnt"; then fail "could not unmount $mnt"; fi
  local status=0
  wait "$daemon_pid" || status=$?
  daemon_pid=
  [ "$status" -eq 0 ] || fail "the nvfs daemon exited with status $status"
}

"$NVFS_MKFS" -q -s 64M "$image"
mount_nvfs
chmod 755 "$mnt"

# --- An access ACL: the mode follows it, the kernel enforces it -----------
echo secret > "$mnt/f"
chmod 600 "$mnt/f"
setfacl -m u:2000:r "$mnt/f"
[ "$(mode_of "$mnt/f")" = 640 ] || fail "setfacl -m u:2000:r on 0600: mode $(mode_of "$mnt/f"), not 640"
getfacl -p "$mnt/f" | grep -qx 'user:2000:r--' || fail "getfacl does not show user:2000:r--"
getfacl -p "$mnt/f" | grep -qx 'mask::r--' || fail "getfacl does not show mask::r--"
as 2000 cat "$mnt/f" >/dev/null || fail "uid 2000 cannot read a file its ACL entry lets it read"
if as 2001 cat "$mnt/f" >/dev/null 2>&1; then fail "uid 2001 read a file no entry lets it read"; fi
# chmod sets the mask: the named entry is cut off, then let in again.
chmod 600 "$mnt/f"
getfacl -p "$mnt/f" | grep -qx 'mask::---' || fail "chmod 600 did not set the mask to ---"
if as 2000 cat "$mnt/f" >/dev/null 2>&1; then fail "uid 2000 read past a mask of ---"; fi
chmod 640 "$mnt/f"
as 2000 cat "$mnt/f" >/dev/null || fail "uid 2000 cannot read after chmod 640 set the mask back"
# Only the owner (or CAP_FOWNER) sets an ACL.
if as 2000 setfacl -m u:2000:rw "$mnt/f" 2>/dev/null; then fail "a non-owner set an ACL"; fi
echo mine > "$mnt/g"
chown 2000:2000 "$mnt/g"
chmod 600 "$mnt/g"
as 2000 setfacl -m u:2001:rw "$mnt/g" || fail "the owner (uid 2000) could not set an ACL"
as 2001 sh -c "echo more >> '$mnt/g'" || fail "uid 2001 cannot write through its ACL entry"
# An ACL the mode says is no ACL: setfacl -b leaves the mode alone.
setfacl -b "$mnt/f"
[ "$(getfacl -p "$mnt/f" | grep -cE '^(user|group):[^:]+:')" = 0 ] || fail "setfacl -b left named entries"
if getfattr -n system.posix_acl_access "$mnt/f" >/dev/null 2>&1; then
  fail "setfacl -b left system.posix_acl_access"
fi
if as 2000 cat "$mnt/f" >/dev/null 2>&1; then fail "uid 2000 read after setfacl -b"; fi
setfacl -m u::rw,g::r,o::- "$mnt/f"
[ "$(mode_of "$mnt/f")" = 640 ] || fail "setfacl of base entries only did not set the mode"

# --- Set-group-ID: cleared by a setfacl of an owner outside the group -----
echo x > "$mnt/sgid"
chown 2000:3000 "$mnt/sgid"
chmod 2770 "$mnt/sgid"
as 2000 setfacl -m u:2001:r "$mnt/sgid"
[ "$(mode_of "$mnt/sgid")" = 770 ] || fail "setfacl by uid 2000 outside group 3000 kept set-group-ID ($(mode_of "$mnt/sgid"))"
echo x > "$mnt/sgid-root"
chown 2000:3000 "$mnt/sgid-root"
chmod 2770 "$mnt/sgid-root"
setfacl -m u:2001:r "$mnt/sgid-root"
[ "$(mode_of "$mnt/sgid-root")" = 2770 ] || fail "setfacl by root (CAP_FSETID) cleared set-group-ID"
# fstests generic/375's case: base entries only (so no ACL is stored), on a
# directory, by its owner outside and then inside the owning group.
mkdir "$mnt/sgid-dir"
chown 2000:3000 "$mnt/sgid-dir"
chmod 2755 "$mnt/sgid-dir"
as 2000 setfacl -m u::rwx,g::rwx,o::rwx "$mnt/sgid-dir"
[ "$(mode_of "$mnt/sgid-dir")" = 777 ] || fail "base-entry setfacl outside the group kept set-group-ID ($(mode_of "$mnt/sgid-dir"))"
chmod 2755 "$mnt/sgid-dir"
setpriv --reuid=2000 --regid=3000 --clear-groups -- setfacl -m u::rwx,g::rwx,o::rwx "$mnt/sgid-dir"
[ "$(mode_of "$mnt/sgid-dir")" = 2777 ] || fail "base-entry setfacl inside the group cleared set-group-ID ($(mode_of "$mnt/sgid-dir"))"

# --- Default ACLs: inherited, and the umask not applied under one ---------
mkdir "$mnt/plain" "$mnt/d"
chmod 777 "$mnt/plain" "$mnt/d"
setfacl -d -m u:2000:rwx,g::rx,o::rx "$mnt/d"
(umask 077; touch "$mnt/plain/file"; mkdir "$mnt/plain/dir")
[ "$(mode_of "$mnt/plain/file")" = 600 ] || fail "umask 077 without a default ACL: $(mode_of "$mnt/plain/file")"
[ "$(mode_of "$mnt/plain/dir")" = 700 ] || fail "umask 077 mkdir without a default ACL: $(mode_of "$mnt/plain/dir")"
(umask 077; touch "$mnt/d/file"; mkdir "$mnt/d/sub"; mkfifo "$mnt/d/fifo")
[ "$(mode_of "$mnt/d/file")" = 664 ] || fail "create under a default ACL: mode $(mode_of "$mnt/d/file"), not 664 (umask applied?)"
[ "$(mode_of "$mnt/d/sub")" = 775 ] || fail "mkdir under a default ACL: mode $(mode_of "$mnt/d/sub"), not 775"
[ "$(mode_of "$mnt/d/fifo")" = 664 ] || fail "mknod under a default ACL: mode $(mode_of "$mnt/d/fifo"), not 664"
getfacl -p "$mnt/d/file" | grep -qx 'user:2000:rwx.*#effective:rw-' ||
  getfacl -p "$mnt/d/file" | grep -q '^user:2000:rwx' || fail "the new file has no user:2000 entry"
getfacl -p "$mnt/d/file" | grep -qx 'mask::rw-' || fail "the new file's mask is not rw-"
getfacl -pd "$mnt/d/sub" | grep -qx 'user:2000:rwx' ||
  fail "the new directory did not get the default ACL as its own"
as 2000 sh -c "echo w >> '$mnt/d/file'" || fail "uid 2000 cannot write the inherited file"
# fstests generic/444's case: a set-group-ID directory with a default ACL
# hands down both, whatever the creator's group.
mkdir "$mnt/sgid-def"
setfacl -d -m u:2001:rwx "$mnt/sgid-def"
chown 2000:2000 "$mnt/sgid-def"
chmod 2755 "$mnt/sgid-def"
as 2000 mkdir "$mnt/sgid-def/in-group"
setpriv --reuid=2000 --regid=2001 --clear-groups -- mkdir "$mnt/sgid-def/other-group"
for sub in in-group other-group; do
  [ "$(stat -c %A "$mnt/sgid-def/$sub")" = drwxrwsr-x ] ||
    fail "mkdir $sub in a set-group-ID directory with a default ACL: $(stat -c %A "$mnt/sgid-def/$sub")"
done
(umask 077; touch "$mnt/d/sub/deep")
getfacl -p "$mnt/d/sub/deep" | grep -q '^user:2000:rwx' || fail "not inherited two levels down"

# --- cp -a and rsync -A keep them -----------------------------------------
cp -a "$mnt/d" "$mnt/d-cp"
rsync -aA "$mnt/d/" "$mnt/d-rsync/"
for f in file sub sub/deep fifo; do
  [ "$(acl_of "$mnt/d/$f")" = "$(acl_of "$mnt/d-cp/$f")" ] || fail "cp -a changed the ACL of $f"
  [ "$(acl_of "$mnt/d/$f")" = "$(acl_of "$mnt/d-rsync/$f")" ] || fail "rsync -A changed the ACL of $f"
done
[ "$(getfacl -pd "$mnt/d-cp" | grep -v '^# file:')" = "$(getfacl -pd "$mnt/d" | grep -v '^# file:')" ] ||
  fail "cp -a lost the default ACL"
# Into nvfs from tmpfs (which has ACLs) and back.
echo t > "$scratch/t"
setfacl -m u:2002:rw,g:3000:r "$scratch/t"
cp -a "$scratch/t" "$mnt/t"
[ "$(acl_of "$scratch/t")" = "$(acl_of "$mnt/t")" ] || fail "cp -a from tmpfs changed the ACL"
rsync -aA "$mnt/d/" "$scratch/back/"
[ "$(acl_of "$mnt/d/file")" = "$(acl_of "$scratch/back/file")" ] || fail "rsync -A to tmpfs changed the ACL"

# --- Durable: the same after a remount, and fsck finds nothing ------------
before=$(cd "$mnt" && getfacl -pR . 2>/dev/null)
unmount_settled
"$NVFS_FSCK" -n "$image" >/dev/null || fail "fsck.nvfs -n found problems"
mount_nvfs
after=$(cd "$mnt" && getfacl -pR . 2>/dev/null)
[ "$before" = "$after" ] || fail "the ACLs changed across a remount"
as 2000 cat "$mnt/d/file" >/dev/null || fail "uid 2000 cannot read the inherited file after a remount"
unmount_settled
echo "mount-acl${1:+ ($1)}: ok"
