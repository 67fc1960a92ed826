#!/usr/bin/env python3
"""What a read costs by the kind of its destination (seed 002: the iov_iter
benchmarks of David Howells' thread): nvfs-pread's file mode, random reads
of one data file at 4 KiB, 64 KiB and 1 MiB, along three paths:
  pread        one buffer (the kernel's UBUF iterator)
  preadv       the same buffer as 4 KiB iovecs (IOVEC)
  preadv-page  4 KiB iovecs that all point at one page, the seed's "single
               page replicated across the mapping": the copy's destination
               stays in cache, so what each segment costs shows
At 4 KiB a preadv has one iovec, which the kernel imports as UBUF too: that
row shows what the vectored call adds. The data file is small by default
(16 MiB) so that, random as the reads are, their source stays in the last
level cache too (32 MiB on the machine this was written on); --size makes
it larger. Called by tools/bench.sh --iovec (which builds first).

Targets (tools/lib/targets.py, made as bench.py makes them; images and
tmpfs under /dev/shm):
  tmpfs, ext4-loop, fuse2fs, nvfs-none (cache=none, /dev/fuse),
  nvfs-none-uring (cache=none, FUSE over io_uring), nvfs-page, and
  nvfs-direct (nvfs-pread --direct: nvfs_direct_pread and _preadv in
  process, which copy from the mapping with no kernel and no iov_iter).
Each repetition runs one nvfs-pread per target, the targets' order reversed
every other repetition; within it the three paths are interleaved at each
size, their order reversed every other repetition too. The tables give the
medians over the repetitions: ns per read, and GB/s.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchreport  # noqa: E402
from bench import prepared, pread_command, side_by_side_chosen, side_by_side_parser  # noqa: E402
from benchreport import run  # noqa: E402

KIB, MIB = 1024, 1024 * 1024
PATHS = ["pread", "preadv", "preadv-page"]
SIZES = [("4k", 4 * KIB), ("64k", 64 * KIB), ("1m", MIB)]


def once(t, paths, seconds):
    """{(path, size name): nvfs-pread's record} for one run of every path and
    size on target `t`, `seconds` each."""
    args = ["-r", "1", "-P", "rand", "-D", str(seconds), "-p", ",".join(paths),
            "-b", ",".join(str(bs) for _, bs in SIZES)]
    size_name = {bs: name for name, bs in SIZES}
    out = {}
    for line in run(pread_command(t, *args)).stdout.splitlines():
        rec = json.loads(line)
        out[(rec["path"], size_name[rec["bs"]])] = rec
    return out


def main():
    args = side_by_side_parser(__doc__, 5, 16 * MIB, 1.0, "per path, size and target").parse_args()
    chosen = side_by_side_chosen(args, page_uring=False)
    # target -> (path, size name) -> {"ns": [...], "gbps": [...]}, a figure per repetition
    results = {}
    with prepared(chosen, args.size, "the io_uring target is left out") as chosen:
        for rep in range(args.reps):
            order = chosen if rep % 2 == 0 else list(reversed(chosen))
            paths = PATHS if rep % 2 == 0 else list(reversed(PATHS))
            for t in order:
                print(f"rep {rep + 1}/{args.reps} {t.name}", file=sys.stderr)
                for row, rec in once(t, paths, args.seconds).items():
                    r = results.setdefault(t.name, {}).setdefault(row, {"ns": [], "gbps": []})
                    r["ns"].append(rec["ns_per_op"])
                    r["gbps"].append(rec["gbps"])

    # target -> (path, size name) -> {"ns": median, "gbps": median}
    med = {name: benchreport.medians(by_row) for name, by_row in results.items()}
    rows = {f"{size} {path}": (path, size) for size, _ in SIZES for path in PATHS}

    def cell(key, fmt):
        def text(label, name):
            m = med.get(name, {}).get(rows[label])
            return None if m is None else fmt.format(m[key])
        return text

    names = [t.name for t in chosen]
    print(f"\nrandom reads by destination, medians of {args.reps} repetitions of {args.seconds} s "
          f"per path, data file {args.size // MIB} MiB (tools/bench.sh --iovec)")
    for title, key, fmt in (("ns per read", "ns", "{:.0f}"), ("GB/s", "gbps", "{:.2f}")):
        print(f"\n{title}:")
        print("\n".join(benchreport.grid("size path", list(rows), names, cell(key, fmt))))


if __name__ == "__main__":
    main()
