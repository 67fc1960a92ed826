#!/usr/bin/env python3
"""Metadata benchmark (issue 13.5): the everyday metadata work of a
file system user against tmpfs, ext4 on a loop device and fuse2fs, with nvfs
over both FUSE transports (/dev/fuse and io_uring) in both cache modes, and
optionally an older nvfs build (--baseline) side by side in the same run.
Called by tools/bench.sh --meta (which installs and builds first).

Every target gets a fresh file system per repetition (images under
/dev/shm: nvfs, ext4 on a loop device, fuse2fs on the same kind of ext4
image; tmpfs a directory of /dev/shm), and runs, in this order:
  untar          tar -xf of a generated tree (FILES files in about DIRS
                 directories, some symlinks; the tarball is made once,
                 reproducibly: a seeded generator, fixed times and owners)
  find (cold)    after a remount (ext4: and drop_caches): find DIR
  du -s (warm)   right after
  rm -rf (warm)  of the untarred tree
  create         N files in a fresh directory (open O_CREAT|O_EXCL + close)
  stat (warm)    lstat of each by path, right after
  stat (cold)    after a remount
  unlink         of each
  append+fsync   APPENDS appends of 4 KiB to one file, fsync after each
The per-file loops run in nvfs-metaops (C++), so no interpreter is timed.
Targets alternate within each repetition (the order reverses every other
one); the table gives medians over the repetitions. FUSE over io_uring needs
the kernel's global enable_uring switch: it is turned on for the run and
its old value restored on every exit (also SIGTERM and failures).

--count-requests instead runs one repetition of the FUSE targets with the
kernel's fuse:fuse_request_send tracepoint counted per opcode for the
target's connection (perf stat), and prints the FUSE requests each workload
cost per item: where nvfs's time goes, independent of machine load (needs
perf: Debian's linux-perf).

The tarball stays in BENCH_WORK (/dev/shm/nvfs-bench-meta, 77 MiB at the
default size) for the next run; remove the directory to free it.
"""
import argparse
import io
import json
import os
import random
import statistics
import sys
import tarfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchreport  # noqa: E402  (what the benchmark scripts share)
from targets import Target  # noqa: E402  (one way to make, mount and unmount them)
from benchreport import BUILD, run  # noqa: E402

WORK = os.environ.get("BENCH_WORK", "/dev/shm/nvfs-bench-meta")
MNT = os.environ.get("BENCH_MNT", "/tmp/nvfs-bench-meta")
TRACE = "/sys/kernel/tracing"
IMAGE_SIZE = 1 << 30


def target(name, kind, options="", bindir=BUILD):
    return Target(name, kind, options, bindir, work=WORK, mnt=MNT)


def targets(baseline):
    out = [target("tmpfs", "tmpfs"), target("ext4-loop", "ext4-loop"),
           target("fuse2fs", "fuse2fs")]
    builds = [("nvfs", BUILD)] + ([("base", os.path.abspath(baseline))] if baseline else [])
    for prefix, bindir in builds:
        # A baseline older than FUSE over io_uring (0a8090f, the daemon the
        # issue was filed against) serves /dev/fuse only: base-<cache>, and
        # no io_uring option to pass.
        uring = prefix == "nvfs" or knows_io_uring(bindir)
        for cache in ("none", "page"):
            transports = (("", "off"), ("-uring", "on")) if uring else (("", None),)
            for transport, opt in transports:
                options = f"cache={cache}" + (f",io_uring={opt}" if opt else "")
                out.append(target(f"{prefix}-{cache}{transport}", "nvfs", options, bindir))
    return out


def knows_io_uring(bindir):
    """Whether the daemon in bindir has the io_uring mount option."""
    out = run([os.path.join(bindir, "nvfs"), "--help"], check=False)
    return "io_uring" in (out.stdout or "") + (out.stderr or "")


def make_tree_tar(path, files, dirs, seed=13):
    """A source-tree-like tree, the same bytes every time: directories
    nested up to three deep, file sizes log-normal around 2 KiB (capped
    at 256 KiB), one symlink per hundred files; fixed times and owners."""
    rng = random.Random(seed)
    names = ["."]
    for i in range(dirs):
        parent = rng.choice(names[-50:] if len(names) > 50 else names)
        if parent.count("/") >= 3:
            parent = "."
        names.append(f"{parent}/d{i:04d}")
    mtime = 1_700_000_000
    pattern = bytes(rng.getrandbits(8) for _ in range(1 << 16)) * 4  # 256 KiB
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        def add(name, kind, size=0, target=""):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "root", "root"
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "link":
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, target
                tar.addfile(info)
            else:
                info.mode, info.size = 0o644, size
                start = rng.randrange(0, 1 << 16)
                tar.addfile(info, io.BytesIO(pattern[start:start + size]))
        for d in names[1:]:
            add(f"tree/{d[2:]}", "dir")
        for i in range(files):
            d = rng.choice(names)
            base = "tree" if d == "." else f"tree/{d[2:]}"
            size = min(int(rng.lognormvariate(7.6, 1.0)), 256 * 1024 - (1 << 16))
            if i % 100 == 99:
                add(f"{base}/l{i:05d}", "link", target=f"f{i - 1:05d}.c")
            else:
                add(f"{base}/f{i:05d}.c", "file", size)
    os.rename(tmp, path)


# How each workload's command runs: timed (the default), or under perf
# stat counting FUSE requests (--count-requests, RequestCounter.run).
def plain_runner(t, name, cmd):
    t0 = time.perf_counter()
    out = run(cmd).stdout
    elapsed = time.perf_counter() - t0
    if cmd[0].endswith("nvfs-metaops"):
        return float(out.split()[2])  # the tool's own clock: no process start-up
    return elapsed


# The daemon's CPU per workload: what each costs the FUSE server, which the
# other engineers' load on the machine inflates far less than wall time.
DAEMON_CPU = {}  # target -> workload -> [seconds per repetition]


def measuring_runner(t, name, cmd):
    before = t.daemon_cpu()
    elapsed = plain_runner(t, name, cmd)
    if before is not None:
        if name == "create":
            time.sleep(0.2)  # its RELEASEs, sent in the background
        after = t.daemon_cpu()
        DAEMON_CPU.setdefault(t.name, {}).setdefault(name, []).append(after - before)
    return elapsed


def metaops_cmd(op, where, n):
    return [os.path.join(BUILD, "nvfs-metaops"), op, where, str(n)]


# (name, items for "per item" figures or None, unit) in the order they run.
WORKLOADS = [
    ("untar", "files", "s"),
    ("find (cold)", None, "ms"),
    ("du -s (warm)", None, "ms"),
    ("rm -rf (warm)", "files", "ms"),
    ("create", "n", "us"),
    ("stat (warm)", "n", "us"),
    ("stat (cold)", "n", "us"),
    ("unlink", "n", "us"),
    ("append 4K+fsync", "appends", "us"),
]


def run_target(t, args, tarball, runner=measuring_runner):
    """One repetition on `t`, a fresh file system: {workload: seconds}."""
    res = {}
    # ext4 formatted on the image file, before its loop device is set up,
    # as this table's figures always were (targets.py, make).
    t.make(IMAGE_SIZE, inodes=args.files + args.dirs + args.n + 1000, mkfs_through_loop=False)
    try:
        res["untar"] = runner(t, "untar", ["tar", "-xf", tarball, "-C", t.dir])
        t.remount()
        tree = os.path.join(t.dir, "tree")
        res["find (cold)"] = runner(t, "find (cold)", ["find", tree, "-fprint", "/dev/null"])
        res["du -s (warm)"] = runner(t, "du -s (warm)", ["du", "-s", tree])
        res["rm -rf (warm)"] = runner(t, "rm -rf (warm)", ["rm", "-rf", tree])
        d = os.path.join(t.dir, "many")
        os.mkdir(d)
        res["create"] = runner(t, "create", metaops_cmd("create", d, args.n))
        res["stat (warm)"] = runner(t, "stat (warm)", metaops_cmd("stat", d, args.n))
        t.remount()
        res["stat (cold)"] = runner(t, "stat (cold)", metaops_cmd("stat", d, args.n))
        res["unlink"] = runner(t, "unlink", metaops_cmd("unlink", d, args.n))
        res["append 4K+fsync"] = runner(t, "append 4K+fsync",
                                        metaops_cmd("append", os.path.join(t.dir, "log"),
                                                    args.appends))
    finally:
        t.destroy()
    return res


def per_item(name, args):
    return {"files": args.files, "n": args.n, "appends": args.appends, None: 1}[
        next(w[1] for w in WORKLOADS if w[0] == name)]


def show(value_s, unit, items):
    if unit == "s":
        return f"{value_s:.2f} s"
    if unit == "ms":
        return f"{value_s * 1e3:.0f} ms"
    return f"{value_s * 1e6 / items:.1f} us"


class RequestCounter:
    """FUSE requests of one connection, per opcode, while a command runs:
    perf stat of the kernel's fuse:fuse_request_send tracepoint, one
    filtered counter per opcode (this kernel has no tracefs histograms).
    Requests the kernel sends in the background (RELEASE, FORGET) are
    counted if they are sent before the command ends."""
    OPS = {1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 4: "SETATTR", 5: "READLINK", 6: "SYMLINK",
           8: "MKNOD", 9: "MKDIR", 10: "UNLINK", 11: "RMDIR", 12: "RENAME", 13: "LINK", 14: "OPEN",
           15: "READ", 16: "WRITE", 17: "STATFS", 18: "RELEASE", 20: "FSYNC", 21: "SETXATTR",
           22: "GETXATTR", 23: "LISTXATTR", 24: "REMOVEXATTR", 25: "FLUSH", 27: "OPENDIR",
           28: "READDIR", 29: "RELEASEDIR", 30: "FSYNCDIR", 34: "ACCESS", 35: "CREATE",
           42: "BATCH_FORGET", 43: "FALLOCATE", 44: "READDIRPLUS", 45: "RENAME2", 52: "STATX"}

    def __init__(self):
        self.rows = {}  # target -> workload -> {opcode: count}
        # perf finds the tracepoint through tracefs: mounted for the run if
        # it is not (and unmounted after, close()).
        self.mounted_tracefs = False
        if not os.path.isdir(os.path.join(TRACE, "events")):
            run(["mount", "-t", "tracefs", "nodev", TRACE])
            self.mounted_tracefs = True

    def close(self):
        if self.mounted_tracefs:
            run(["umount", TRACE], check=False)

    def run(self, t, name, cmd):
        conn = t.connection()
        out = os.path.join(WORK, "perf-stat.txt")
        perf = ["perf", "stat", "-a", "-x,", "-o", out]
        for op in self.OPS:
            perf += ["-e", "fuse:fuse_request_send",
                     "--filter", f"connection == {conn} && opcode == {op}"]
        t0 = time.perf_counter()
        run(perf + ["--"] + cmd)
        elapsed = time.perf_counter() - t0
        counts = {}
        with open(out) as f:
            values = [line.split(",")[0] for line in f if "fuse_request_send" in line]
        for op, v in zip(self.OPS, values):
            if v.isdigit() and int(v) > 0:
                counts[op] = int(v)
        self.rows.setdefault(t.name, {})[name] = counts
        return elapsed

    def report(self, args):
        for target, rows in self.rows.items():
            print(f"\n{target}: FUSE requests per item (per file, per append)")
            for name, ops in rows.items():
                items = per_item(name, args)
                total = sum(ops.values())
                detail = ", ".join(f"{self.OPS[op]} {c / items:.2f}"
                                   for op, c in sorted(ops.items(), key=lambda kv: -kv[1]))
                print(f"  {name:16} {total / items:7.2f}  {detail}")


def count_requests(chosen, args, tarball):
    counter = RequestCounter()
    try:
        for t in chosen:
            if t.kind in ("nvfs", "fuse2fs"):
                run_target(t, args, tarball, counter.run)
    finally:
        counter.close()
    counter.report(args)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20000, help="files in the untarred tree")
    ap.add_argument("--dirs", type=int, default=1000, help="directories in the untarred tree")
    ap.add_argument("-n", type=int, default=10000, help="creates, stats and unlinks")
    ap.add_argument("--appends", type=int, default=1000, help="4 KiB appends, each fsynced")
    benchreport.add_reps(ap, 5)
    benchreport.add_targets(ap)
    benchreport.add_baseline(ap, "a directory with an older build's nvfs and mkfs.nvfs: adds "
                             "targets base-<cache>[-uring] beside nvfs-<cache>[-uring] "
                             "(base-<cache> only, compared with both, if that daemon has no "
                             "io_uring)")
    ap.add_argument("--count-requests", action="store_true",
                    help="one repetition counting FUSE requests per item (kernel tracepoint)")
    benchreport.add_json_out(ap, "meta-results.json")
    ap.add_argument("--md-out", default=os.path.join(benchreport.RESULTS, "meta-results.md"))
    args = ap.parse_args()

    chosen = benchreport.pick(targets(args.baseline), args.targets)
    uring = benchreport.UringSwitch(chosen, lambda t: t.uses_uring,
                                    "the io_uring targets are left out", hup=True)
    chosen = uring.keep()
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(MNT, exist_ok=True)
    tarball = os.path.join(WORK, f"tree-{args.files}-{args.dirs}.tar")
    if not os.path.exists(tarball):
        make_tree_tar(tarball, args.files, args.dirs)

    times = {t.name: {w[0]: [] for w in WORKLOADS} for t in chosen}
    try:
        uring.on()
        if args.count_requests:
            count_requests(chosen, args, tarball)
            return
        for rep in range(args.reps):
            order = chosen if rep % 2 == 0 else list(reversed(chosen))
            for t in order:
                for name, seconds in run_target(t, args, tarball).items():
                    times[t.name][name].append(seconds)
                print(f"rep {rep + 1}/{args.reps} {t.name} done", file=sys.stderr)
    finally:
        for t in chosen:
            t.destroy()
        uring.off()

    med = benchreport.medians(times)
    columns = [t.name for t in chosen]
    load = os.getloadavg()
    lines = [f"Metadata, medians of {args.reps} alternating repetitions (one run); tree of "
             f"{args.files} files in {args.dirs} directories; create/stat/unlink: {args.n} "
             f"files; {args.appends} appends. Load average at the end: "
             f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (2 CPUs).", ""]
    rows = []
    for name, _, unit in WORKLOADS:
        items = per_item(name, args)
        per = " (per file)" if unit == "us" else ""
        rows.append([f"{name}{per}"] + [show(med[c][name], unit, items) for c in columns])
    lines += benchreport.markdown_table(["workload"] + columns, rows)
    # The targets: every nvfs row >= 1.4x the baseline's (its time
    # over ours) and within 3x ext4 on the loop device.
    checks = []
    for c in columns:
        if not c.startswith("nvfs-"):
            continue
        base = "base-" + c[len("nvfs-"):]
        if base not in med and base.endswith("-uring"):
            base = base[:-len("-uring")]  # a baseline with /dev/fuse only
        for name, _, _ in WORKLOADS:
            mine = med[c][name]
            speedup = med[base][name] / mine if base in med else None
            vs_ext4 = mine / med["ext4-loop"][name] if "ext4-loop" in med else None
            checks.append((c, name, speedup, vs_ext4))
    if checks:
        rows = []
        for c, name, speedup, vs_ext4 in checks:
            s = "-" if speedup is None else f"{speedup:.2f}{'' if speedup >= 1.4 else ' MISSED'}"
            e = "-" if vs_ext4 is None else f"{vs_ext4:.2f}{'' if vs_ext4 <= 3 else ' MISSED'}"
            rows.append([c, name, s, e])
        lines += [""] + benchreport.markdown_table(
            ["target", "workload", "today's / this (>= 1.4)", "this / ext4-loop (<= 3)"], rows)
    if DAEMON_CPU:
        fuse = [c for c in columns if c in DAEMON_CPU]
        lines += ["", "Daemon CPU (user + system, all its threads; clock ticks of 10 ms), medians:",
                  ""]
        rows = []
        for name, _, unit in WORKLOADS:
            items = per_item(name, args)
            cells = []
            for c in fuse:
                v = statistics.median(DAEMON_CPU[c].get(name, [0]))
                cells.append(f"{v * 1e6 / items:.1f} us" if unit == "us" or items > 1
                             else f"{v * 1e3:.0f} ms")
            per = " (per item)" if items > 1 else ""
            rows.append([f"{name}{per}"] + cells)
        lines += benchreport.markdown_table(["workload"] + fuse, rows)
    text = "\n".join(lines)
    print("\n" + text)
    with benchreport.open_out(args.md_out) as f:
        f.write(text + "\n")
    with benchreport.open_out(args.json_out) as f:
        json.dump({"args": vars(args), "loadavg": load, "times_s": times, "median_s": med,
                   "daemon_cpu_s": DAEMON_CPU}, f, indent=1)
    print(f"\nmarkdown: {args.md_out}\nraw figures: {args.json_out}")


if __name__ == "__main__":
    main()
