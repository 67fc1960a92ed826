#!/usr/bin/env python3
"""Reads at queue depth, as the seeds measure them: fio's asynchronous
engines on nvfs over both FUSE transports and both cache modes, side by side
with tmpfs, ext4 on a loop device and fuse2fs. Called by tools/bench.sh
--depth (which installs fio and builds first).

Workloads (random reads of one data file, O_DIRECT):
  seed000      fio --ioengine=libaio --bs=4k --iodepth=128 --iodepth_low=96
               --iodepth_batch=16 --numjobs=4 (seed 000's command line)
  seed001-BS   fio --ioengine=io_uring --fixedbufs --registerfiles
               --iodepth=32, BS = 512, 4k, 64k (seed 001: t/io_uring with
               registered buffers and files; FUSE files take no polled I/O)
Targets (tools/lib/targets.py, made as bench.py makes them; images and
tmpfs under /dev/shm):
  tmpfs, ext4-loop, fuse2fs, nvfs-none (cache=none, /dev/fuse),
  nvfs-none-uring (cache=none, FUSE over io_uring), nvfs-page,
  nvfs-page-uring, nvfs-direct (cache=none, fio under
  LD_PRELOAD=libnvfs-direct.so: what a program that reads through libaio or
  io_uring gets with the library loaded).
FUSE over io_uring needs the kernel's global switch: on for the run, the old
value back on every exit. Targets alternate within each repetition; the
table gives median k IOPS, then the ratios issue 32 names, from one run.
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchreport  # noqa: E402
from bench import data_of, prepared, side_by_side_chosen, side_by_side_parser  # noqa: E402
from benchreport import BUILD, run  # noqa: E402

MIB = 1024 * 1024
KIB = 1024

# name -> fio arguments beyond the common ones
WORKLOADS = {
    "seed000": ["--ioengine=libaio", "--bs=4k", "--iodepth=128", "--iodepth_low=96",
                "--iodepth_batch=16", "--numjobs=4", "--group_reporting"],
    "seed001-512": ["--ioengine=io_uring", "--fixedbufs", "--registerfiles", "--bs=512",
                    "--iodepth=32"],
    "seed001-4k": ["--ioengine=io_uring", "--fixedbufs", "--registerfiles", "--bs=4k",
                   "--iodepth=32"],
    "seed001-64k": ["--ioengine=io_uring", "--fixedbufs", "--registerfiles", "--bs=64k",
                    "--iodepth=32"],
}


def once(t, wl, size, seconds):
    """k IOPS of workload `wl` on target `t`, or None if fio refused."""
    cmd = ["fio", "--name=depth", f"--filename={data_of(t)}", "--rw=randread",
           "--direct=1", f"--size={size}", "--time_based", f"--runtime={seconds}",
           "--gtod_reduce=1", "--randrepeat=1", "--norandommap", "--invalidate=0",
           "--output-format=json", "--eta=never", "--thread"] + WORKLOADS[wl]
    env = None
    if t.name.endswith("nvfs-direct"):
        env = dict(os.environ, LD_PRELOAD=os.path.join(BUILD, "libnvfs-direct.so"))
    r = run(cmd, check=False, env=env)
    if r.returncode != 0:
        print(f"{t.name} {wl}: fio failed: {(r.stderr or r.stdout).strip()[:200]}",
              file=sys.stderr)
        return None
    res = json.loads(r.stdout)
    return sum(job["read"]["iops"] for job in res["jobs"]) / 1000.0


def report(results, names, wls):
    med = {k: statistics.median(v) for k, v in results.items() if v}
    print("\nrandom reads at depth, O_DIRECT, median k IOPS:")
    print("\n".join(benchreport.grid(
        "workload", wls, names,
        lambda wl, n: None if (n, wl) not in med else f"{med[(n, wl)]:.0f}")))

    def ratio(a, b):
        x, y = med.get(a), med.get(b)
        return None if x is None or not y else x / y

    rows = [
        ("seed000: nvfs-none-uring / ext4-loop", ratio(("nvfs-none-uring", "seed000"),
                                                        ("ext4-loop", "seed000")), 1.0),
        ("seed000: nvfs-none (/dev/fuse) / ext4-loop", ratio(("nvfs-none", "seed000"),
                                                              ("ext4-loop", "seed000")), 0.8),
    ]
    for wl in wls:
        if wl.startswith("seed001"):
            for n in ("nvfs-none", "nvfs-none-uring"):
                rows.append((f"{wl}: {n} / ext4-loop", ratio((n, wl), ("ext4-loop", wl)), 1.0))
    print("\ntargets (issue 32; this run's medians):")
    for what, value, limit in rows:
        if value is None:
            print(f"  {what:48} {'-':>6}  >= {limit:<4} n/a")
        else:
            verdict = "met" if value >= limit else "MISSED"
            print(f"  {what:48} {value:6.2f}  >= {limit:<4} {verdict}")


def main():
    ap = side_by_side_parser(__doc__, 3, 512 * MIB, 5.0)
    ap.add_argument("--workloads", default="", help="comma-separated subset of " +
                    ",".join(WORKLOADS))
    args = ap.parse_args()
    # nvfs-direct: fio under LD_PRELOAD=libnvfs-direct.so; io_submit and
    # io_uring are not the library's, so its reads take the kernel's path.
    chosen = side_by_side_chosen(args)
    wls = benchreport.pick(list(WORKLOADS), args.workloads, lambda wl: wl)
    results = {}
    with prepared(chosen, args.size, "the io_uring targets are left out") as chosen:
        for rep in range(args.reps):
            for wl in wls:
                for t in chosen:
                    r = once(t, wl, args.size, args.seconds)
                    if r is not None:
                        results.setdefault((t.name, wl), []).append(r)
                        print(f"rep {rep + 1} {wl:12} {t.name:16} {r:8.0f} k IOPS", flush=True)
    report(results, [t.name for t in chosen], wls)


if __name__ == "__main__":
    main()
