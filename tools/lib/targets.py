"""The file systems the benchmarks compare, made, mounted and unmounted one
way (tools/bench.py, bench_meta.py, bench_walks.py, bench_writes.py,
bench_depth.py, bench_iovec.py).

A Target is one of:
  nvfs       mkfs.nvfs and the nvfs daemon from `bindir` (a baseline build's,
             or this one's), mounted with `options` (-o);
  fuse2fs    ext4 on an image file, served by fuse2fs -o fakeroot[,options];
  ext4-loop  ext4 on a loop device over an image file, mounted by the kernel;
  tmpfs      a directory in `work` (under /dev/shm in every script).
Images live in `work` (NAME.img), mount points in `mnt` (NAME). A target
either makes its own file system (make: format, then mount; destroy removes
it) or mounts one made elsewhere (`image`: mount and unmount only).

Unmounting is the same for every FUSE target: fusermount3 -u, retried for up
to 30 s (after many creates the kernel keeps the mount busy until each
background RELEASE is answered), then a lazy unmount; then a wait until no
process holds the image any more (the daemon releases the namespace's lock
and its mapping as it exits, after umount returned; the next mount of it
needs both gone).
"""
import os
import shutil
import time

from benchreport import BUILD, drop_caches, mounted, run, wait_released

KINDS = ("nvfs", "fuse2fs", "ext4-loop", "tmpfs")
UNMOUNT_PATIENCE = 30  # seconds of fusermount3 -u before a lazy unmount


class Target:
    def __init__(self, name, kind, options="", bindir=BUILD, *, work, mnt, image=None):
        if kind not in KINDS:
            raise ValueError(f"{name}: unknown kind {kind}")
        self.name, self.kind, self.options, self.bindir = name, kind, options, bindir
        self.work, self.mnt = work, mnt
        self.dir = os.path.join(work, "tmpfs") if kind == "tmpfs" else os.path.join(mnt, name)
        self.owns_image = image is None
        self.image = image if image is not None else os.path.join(work, name + ".img")
        self.loop = None

    def like(self, name, bindir):
        """The same target, named `name`, on the binaries in `bindir` (a
        baseline build)."""
        return Target(name, self.kind, self.options, bindir, work=self.work, mnt=self.mnt,
                      image=None if self.owns_image else self.image)

    def option(self, key):
        """The value of mount option `key` in `options` (None if absent;
        "" for a flag)."""
        for opt in self.options.split(","):
            k, _, v = opt.partition("=")
            if k == key:
                return v
        return None

    @property
    def uses_uring(self):
        return self.option("io_uring") == "on"

    def make(self, size, inodes=None, mkfs_through_loop=True):
        """A fresh file system of `size` bytes (nvfs: at least `inodes`
        inodes), mounted. ext4-loop is formatted through its loop device
        (mke2fs then writes the journal, as on a device), or, with
        `mkfs_through_loop` False, on the image file before the loop device
        is set up (mke2fs leaves the journal's blocks as holes in /dev/shm)."""
        if self.kind == "tmpfs":
            shutil.rmtree(self.dir, ignore_errors=True)
            os.makedirs(self.dir)
            return
        if self.kind == "nvfs":
            cmd = [os.path.join(self.bindir, "mkfs.nvfs"), "-q", "-f", "-s", str(size)]
            if inodes is not None:
                cmd += ["-N", str(inodes)]
            run(cmd + [self.image])
        else:
            run(["truncate", "-s", str(size), self.image])
            if self.kind == "ext4-loop" and mkfs_through_loop:
                self.loop = run(["losetup", "-f", "--show", self.image]).stdout.strip()
                run(["mkfs.ext4", "-q", "-F", self.loop])
            else:
                run(["mkfs.ext4", "-q", "-F", self.image])
                if self.kind == "ext4-loop":
                    self.loop = run(["losetup", "-f", "--show", self.image]).stdout.strip()
        self.mount()

    def mount(self):
        if self.kind == "tmpfs":
            return
        os.makedirs(self.dir, exist_ok=True)
        if self.kind == "nvfs":
            cmd = [os.path.join(self.bindir, "nvfs"), self.image, self.dir]
            if self.options:
                cmd += ["-o", self.options]
            run(cmd)
        elif self.kind == "fuse2fs":
            run(["fuse2fs", self.image, self.dir, "-o",
                 "fakeroot" + ("," + self.options if self.options else "")])
        elif self.kind == "ext4-loop":
            run(["mount", self.loop, self.dir])

    def unmount(self, check=True):
        """Unmounts (see above). `check`: a failed umount of ext4-loop raises."""
        if self.kind == "tmpfs" or not mounted(self.dir):
            return
        if self.kind == "ext4-loop":
            run(["umount", self.dir], check=check)
            return
        deadline = time.time() + UNMOUNT_PATIENCE
        while run(["fusermount3", "-u", self.dir], check=False).returncode != 0:
            if time.time() > deadline:
                run(["fusermount3", "-uz", self.dir], check=False)
                break
            time.sleep(0.1)
        wait_released(self.image)

    def remount(self):
        """What the next workload finds is in no kernel cache."""
        if self.kind == "tmpfs":
            return  # nothing to reread: tmpfs is its caches
        self.unmount()
        if self.kind == "ext4-loop":
            drop_caches()
        self.mount()

    def destroy(self):
        """Unmounts and removes what make() made; never raises for a
        failed unmount, so that every target of a run is cleaned up."""
        self.unmount(check=False)
        if self.loop:
            run(["losetup", "-d", self.loop], check=False)
            self.loop = None
        if self.kind == "tmpfs":
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.owns_image and os.path.exists(self.image):
            os.unlink(self.image)

    def daemon_cpu(self):
        """CPU seconds (user + system, all threads) the FUSE daemon serving
        this target has used so far, or None (no daemon)."""
        if self.kind not in ("nvfs", "fuse2fs"):
            return None
        pids = run(["fuser", self.image], check=False).stdout.split()
        total = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid.strip()}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
            except (OSError, ValueError, IndexError):
                pass
        return total / os.sysconf("SC_CLK_TCK")

    def connection(self):
        """The FUSE connection id the kernel's tracepoints name (fc->dev)."""
        d = os.stat(self.dir).st_dev
        return (os.major(d) << 20) | os.minor(d)


def with_baseline(targets, baseline):
    """`targets`, and with `baseline` (a directory holding another build's
    nvfs and mkfs.nvfs) each nvfs target again on it, as base-<name>."""
    if not baseline:
        return list(targets)
    bindir = os.path.abspath(baseline)
    return list(targets) + [t.like("base-" + t.name, bindir) for t in targets if t.kind == "nvfs"]
