#!/usr/bin/env python3
"""Side-by-side benchmark of durable writes: direct writes through
libnvfs-direct against nvfs through the mount, tmpfs, ext4 on a loop device
and the in-process floor. Called by tools/bench.sh --writes (which installs
and builds first).

Targets (made as bench.py makes its own, tools/lib/targets.py):
  inproc       a file under /dev/shm mapped in process, written with memcpy:
               what a store and its persistence cost (tmpfs: the store alone)
  nvfs-direct  nvfs (cache=none) written through libnvfs-direct's C API
  nvfs-none    nvfs cache=none through the mount (/dev/fuse)
  nvfs-page    nvfs cache=page through the mount
  tmpfs        /dev/shm itself
  ext4-loop    ext4 on a loop device over a /dev/shm file
Through the kernel every write is durable on return (O_DSYNC; appends add
fdatasync), as every nvfs write is. Workloads (tools/pwrite_bench.cpp):
rand-4k, append-4k, seq-1m, rand-4k-2t; and fio's psync engine (4 KiB random
writes, sync=dsync) on every target, on nvfs-direct under
LD_PRELOAD=libnvfs-direct.so. Targets alternate within each repetition; the
table gives medians and the ratios the issue's targets name, from one run.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchreport  # noqa: E402
from bench import MNT, WORK, nvfs_options, setup, target  # noqa: E402  (bench.py's targets)
from benchreport import BUILD, run  # noqa: E402

MIB = 1024 * 1024
WORKLOADS = ["rand-4k", "append-4k", "seq-1m", "rand-4k-2t", "fio-rand-4k"]


def targets():
    return [
        ("inproc", None, "inproc"),
        ("nvfs-direct", target("nvfs-direct", "nvfs", nvfs_options("map", "none", direct=True)),
         "direct"),
        ("nvfs-none", target("nvfs-none", "nvfs", nvfs_options("map", "none")), "kernel"),
        ("nvfs-page", target("nvfs-page", "nvfs", nvfs_options("map", "page")), "kernel"),
        ("tmpfs", target("tmpfs", "tmpfs"), "kernel"),
        ("ext4-loop", target("ext4-loop", "ext4-loop"), "kernel"),
    ]


def path_of(name, target):
    if target is None:
        return os.path.join(WORK, "inproc-" + name)
    return os.path.join(target.dir, "w-" + name)


def once(name, target, mode, wl, size, seconds):
    path = path_of(wl, target)
    if wl == "fio-rand-4k":
        if target is None:
            return None
        cmd = ["fio", "--name=w", f"--filename={path}", "--rw=randwrite", "--bs=4k",
               f"--size={size}", "--ioengine=psync", "--sync=dsync", "--time_based",
               f"--runtime={seconds}", "--output-format=json", "--gtod_reduce=1",
               "--norandommap", "--randrepeat=1", "--iomem_align=4096", "--eta=never",
               "--thread", "--invalidate=0"]
        env = None
        if mode == "direct":
            env = dict(os.environ, LD_PRELOAD=os.path.join(BUILD, "libnvfs-direct.so"))
        res = json.loads(run(cmd, env=env).stdout)
        return {"iops": res["jobs"][0]["write"]["iops"]}
    out = run([os.path.join(BUILD, "pwrite-bench"), mode, wl, path, str(seconds), str(size)]).stdout
    r = json.loads(out)
    return {"iops": r["ops"] / r["seconds"], "ns": r["ns_per_op"], "gbps": r["gbps"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchreport.add_reps(ap, 5)
    ap.add_argument("--size", type=int, default=64 * MIB, help="bytes each file spans")
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    args = ap.parse_args()
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(MNT, exist_ok=True)
    source = os.path.join(WORK, "source")
    with open(source, "wb") as f:
        f.write(b"s" * 4096)
    tl = targets()
    for _, t, _ in tl:
        if t is not None:
            setup(t, args.size, source)
    results = {}  # (target, wl) -> [figures]
    try:
        for rep in range(args.reps):
            for wl in WORKLOADS:
                for name, t, mode in tl:
                    r = once(name, t, mode, wl, args.size, args.seconds)
                    if r is not None:
                        results.setdefault((name, wl), []).append(r)
                    # Each workload starts from a file of its own.
                    p = path_of(wl, t)
                    for q in (p, p + ".2"):
                        if os.path.exists(q):
                            os.unlink(q)
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    finally:
        for _, t, _ in tl:
            if t is not None:
                t.destroy()
        for wl in WORKLOADS:
            for q in (path_of(wl, None), path_of(wl, None) + ".2"):
                with contextlib.suppress(OSError):
                    os.unlink(q)
        with contextlib.suppress(OSError):
            os.unlink(source)
        for d in [t.dir for _, t, _ in tl if t is not None] + [MNT, WORK]:
            with contextlib.suppress(OSError):
                os.rmdir(d)  # only if empty: still mounted, or another run's, it stays

    def med(name, wl, key):
        vals = [r[key] for r in results.get((name, wl), []) if key in r]
        return statistics.median(vals) if vals else None

    names = [n for n, _, _ in tl]
    print(f"Durable writes, medians of {args.reps} runs of {args.seconds} s, files of "
          f"{args.size // MIB} MiB (tools/bench.sh --writes)\n")
    rows = []
    for wl in WORKLOADS:
        key = "gbps" if wl == "seq-1m" else "iops"
        cells = []
        for n in names:
            v = med(n, wl, key)
            cells.append("-" if v is None else (f"{v:.2f} GB/s" if key == "gbps" else
                                                 f"{v / 1000:.0f} k"))
        rows.append([wl] + cells)
    print("\n".join(benchreport.markdown_table(["workload"] + names, rows)))
    print()

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    d, i = "nvfs-direct", "inproc"
    checks = [
        ("rand-4k: direct ns / in-process memcpy+persist ns (<= 1.5)",
         ratio(med(d, "rand-4k", "ns"), med(i, "rand-4k", "ns")), lambda x: x <= 1.5),
        ("rand-4k: direct IOPS / nvfs cache=none IOPS (>= 20)",
         ratio(med(d, "rand-4k", "iops"), med("nvfs-none", "rand-4k", "iops")), lambda x: x >= 20),
        ("rand-4k: direct IOPS / tmpfs pwrite IOPS (> 1)",
         ratio(med(d, "rand-4k", "iops"), med("tmpfs", "rand-4k", "iops")), lambda x: x > 1),
        ("append-4k: direct IOPS / nvfs cache=none IOPS (>= 5)",
         ratio(med(d, "append-4k", "iops"), med("nvfs-none", "append-4k", "iops")), lambda x: x >= 5),
        ("append-4k: direct IOPS / ext4-loop fdatasync IOPS (> 1)",
         ratio(med(d, "append-4k", "iops"), med("ext4-loop", "append-4k", "iops")), lambda x: x > 1),
        ("seq-1m: direct GB/s / in-process GB/s (>= 0.8)",
         ratio(med(d, "seq-1m", "gbps"), med(i, "seq-1m", "gbps")), lambda x: x >= 0.8),
        ("rand-4k-2t / rand-4k, direct (>= 1.8)",
         ratio(med(d, "rand-4k-2t", "iops"), med(d, "rand-4k", "iops")), lambda x: x >= 1.8),
        ("rand-4k-2t / rand-4k, in process (the machine's own scaling)",
         ratio(med(i, "rand-4k-2t", "iops"), med(i, "rand-4k", "iops")), lambda x: True),
        ("fio psync rand-4k: direct (preload) IOPS / nvfs cache=none IOPS",
         ratio(med(d, "fio-rand-4k", "iops"), med("nvfs-none", "fio-rand-4k", "iops")), lambda x: True),
    ]
    for what, value, ok in checks:
        if value is None:
            print(f"  {what}: not measured")
        else:
            print(f"  {what}: {value:.2f} {'ok' if ok(value) else 'MISSED'}")


if __name__ == "__main__":
    main()
