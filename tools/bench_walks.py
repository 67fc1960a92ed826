#!/usr/bin/env python3
"""Metadata benchmark: walks of a populated tree through nvfs, with the
kernel's entry and attribute caches as long as the mount (the default) and
with the 1 s timeouts of earlier versions (entry_timeout=1,attr_timeout=1, which
also turn off the kernel's listing cache, as before),
in both cache modes, against tmpfs. Called by tools/bench.sh --walks (which
installs and builds first).

Every target holds the same tree (nvfs-populate: FILES files in DIRS
directories; one image, remounted with each target's options; tmpfs gets a
copy). A repetition mounts each target in turn, walks the tree once (cold,
right after the mount), then, for each workload, waits IDLE seconds (longer
than the old timeouts: what a user meets who runs `git status` or `make`
again a moment later) and times the workload once. The table gives medians
over the repetitions and the ratio of the old timeouts' time to the new one's
from the same run.

To add a workload: a (name, function(dir) -> None) pair in WORKLOADS. To add
a target: one in targets() (kind nvfs: its -o options; tools/lib/targets.py).
"""
import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchreport  # noqa: E402  (what the benchmark scripts share)
from benchreport import BUILD, run  # noqa: E402
from targets import Target  # noqa: E402  (one way to mount and unmount them)

WORK = os.environ.get("BENCH_WORK", "/dev/shm/nvfs-bench-walks")
MNT = os.environ.get("BENCH_MNT", "/tmp/nvfs-bench-walks")


IMAGE = os.path.join(WORK, "meta.img")  # one tree, mounted by every nvfs target


def target(name, kind, options="", bindir=BUILD):
    return Target(name, kind, options, bindir, work=WORK, mnt=MNT, image=IMAGE)


def targets(baseline):
    old = "entry_timeout=1,attr_timeout=1"
    base = []
    if baseline:
        # An older daemon, with its own defaults (it may know no timeout option).
        base = [target("base-none", "nvfs", "", baseline),
                target("base-page", "nvfs", "cache=page", baseline)]
    return base + [
        target("nvfs-none-1s", "nvfs", old),
        target("nvfs-none", "nvfs", ""),
        target("nvfs-page-1s", "nvfs", "cache=page," + old),
        target("nvfs-page", "nvfs", "cache=page"),
        target("tmpfs", "tmpfs"),
    ]


def walk_find(d):
    # find -printf '%s' stats every name (fstatat), as make and rsync would.
    run(["find", d, "-printf", "%s\n"])


def walk_lstat(d):
    for top, dirs, files in os.walk(d):
        for name in files:
            os.lstat(os.path.join(top, name))


def walk_du(d):
    run(["du", "-s", d])


# Every file's path relative to a target's root, listed once before timing:
# the files a build or `git status` checks by name, without listing a
# directory (no READDIRPLUS to refresh the kernel's names in bulk).
KNOWN = []


def stat_known(d):
    for rel in KNOWN:
        os.lstat(os.path.join(d, rel))


# (name, function(dir)); each timed once per repetition after IDLE seconds.
WORKLOADS = [
    ("find -printf %s", walk_find),
    ("lstat every file (python)", walk_lstat),
    ("du -s", walk_du),
    ("lstat known paths (python)", stat_known),
]


def timed(fn, d):
    t0 = time.perf_counter()
    fn(d)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--dirs", type=int, default=200)
    benchreport.add_reps(ap, 5)
    ap.add_argument("--idle", type=float, default=1.5,
                    help="seconds between the cold walk and each timed workload")
    benchreport.add_targets(ap)
    benchreport.add_baseline(ap, "a directory holding an older nvfs daemon: adds targets "
                             "base-none and base-page (same image, same run)")
    benchreport.add_json_out(ap, "walks-results.json")
    args = ap.parse_args()

    chosen = benchreport.pick(targets(args.baseline), args.targets)
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(MNT, exist_ok=True)
    run([os.path.join(BUILD, "mkfs.nvfs"), "-q", "-f", "-s", "1G", "-N",
         str(args.files + args.dirs + 1000), IMAGE])
    run([os.path.join(BUILD, "nvfs-populate"), "-n", str(args.files), "-d", str(args.dirs), IMAGE])
    times = {t.name: {w: [] for w, _ in [("cold find", None)] + WORKLOADS} for t in chosen}
    try:
        tmpfs = next((t for t in chosen if t.kind == "tmpfs"), None)
        if tmpfs is not None:
            # The same tree: copied out of an nvfs mount.
            src = target("nvfs-copy", "nvfs")
            src.mount()
            shutil.rmtree(tmpfs.dir, ignore_errors=True)
            shutil.copytree(src.dir, tmpfs.dir, symlinks=True)
            src.unmount()
        for rep in range(args.reps):
            for t in chosen:
                t.mount()
                try:
                    if t.kind == "tmpfs":
                        run(["sh", "-c", "echo 2 > /proc/sys/vm/drop_caches"], check=False)
                    times[t.name]["cold find"].append(timed(walk_find, t.dir))
                    if not KNOWN:
                        for top, _, files in os.walk(t.dir):
                            KNOWN.extend(os.path.relpath(os.path.join(top, f), t.dir)
                                         for f in files)
                    for name, fn in WORKLOADS:
                        time.sleep(args.idle)
                        times[t.name][name].append(timed(fn, t.dir))
                finally:
                    t.unmount()
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    finally:
        for t in chosen:
            t.destroy()  # the nvfs targets' shared image stays for the unlink below
        os.unlink(IMAGE)

    med = benchreport.medians(times)
    columns = [t.name for t in chosen]
    print(f"\nmetadata walks of {args.files} files in {args.dirs} directories, "
          f"median of {args.reps} (ms), {args.idle:g} s idle before each timed walk")
    widths = [-28] + [14] * len(columns)
    print(benchreport.fixed_row(["workload"] + columns, widths, sep=""))
    for w in times[columns[0]]:
        print(benchreport.fixed_row([w] + [f"{med[c][w] * 1000:.1f}" for c in columns], widths,
                                    sep=""))
    for mode in ("none", "page"):
        new = f"nvfs-{mode}"
        for old, what in ((f"nvfs-{mode}-1s", "1 s timeouts"), (f"base-{mode}", "baseline")):
            if old in med and new in med:
                print(f"\ncache={mode}: {what} / this daemon's defaults")
                for w in med[old]:
                    print(f"  {w:28}{med[old][w] / med[new][w]:8.2f}x")
    with benchreport.open_out(args.json_out) as f:
        json.dump({"args": vars(args), "times_s": times, "median_s": med}, f, indent=1)
    print(f"\nraw figures: {args.json_out}")


if __name__ == "__main__":
    main()
