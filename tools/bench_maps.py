#!/usr/bin/env python3
"""Side-by-side benchmark of shared mappings (issue 31, direct maps): what
mmap of a file costs on nvfs through the kernel, on nvfs under
LD_PRELOAD=libnvfs-direct.so (a direct map: the file's own blocks mapped
from the namespace), on tmpfs, on ext4 on a loop device, and in process.
Called by tools/bench.sh --maps (which builds first).

Targets (tools/lib/targets.py, made as bench.py makes them; images and
tmpfs under /dev/shm), each holding the same data file:
  inproc       a copy of the data file in the work directory (/dev/shm),
               mapped in process: the floor a direct map of the namespace
               is held to (on tmpfs, the same mechanism as the tmpfs target)
  tmpfs        the tmpfs target's data file
  ext4-loop    ext4 on a loop device over a /dev/shm file
  nvfs-none    nvfs cache=none, the kernel's mmap through the mount
  nvfs-page    nvfs cache=page, the kernel's mmap through the mount
  nvfs-direct  nvfs cache=none, the same program under
               LD_PRELOAD=libnvfs-direct.so
Rows (tools/mapbench.cpp, one nvfs-mapbench run each; ns, medians):
  first touch read/write  mmap of a 2 MiB window at a random offset, one 8-byte
                          load (store) on a random page in it, munmap: ns per
                          iteration, the mmap call included
  warm read               random 4 KiB memcpy out of a whole-file mapping
                          whose every page was touched first
  warm write, persisted   random 4 KiB memcpy into it, then persisted: msync
                          (MS_SYNC, the page) through the kernel (tmpfs,
                          ext4-loop, nvfs-none, nvfs-page), the CPU's cache
                          flush (clwb/clflushopt/clflush + sfence) on the
                          namespace's own mapping (inproc, nvfs-direct)
  warm write, no persist  the same, the memcpy alone, on every target
  pmem2 copy + persist    libpmem2 maps the file (pmem2_map_new, PAGE
                          granularity at least) and persists each 4 KiB copy
                          with its own persist function: an unmodified
                          libpmem2 program, on every target
The warm and pmem2 rows time 16 copies per read of the clock (--batch 16:
the clock moved in steps of 10-20 ns on the VM this was written on, a
4 KiB copy in cache costs about 50); first touch times each iteration
alone.
Each run also says what backs its mapping (/proc/self/maps): "kernel" (the
file itself) or "direct" (another file: the namespace's image). A target
that should map directly (nvfs-direct) and maps through the kernel, or one
that should not and does, is flagged in the tables and its ratios marked,
never reported silently. Targets alternate within each repetition (their
order reversed every other one); the tables give medians over the
repetitions, then the ratios issue 31 names, from one run.
"""
import json
import os
import signal
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import benchreport  # noqa: E402
from bench import WORK, data_of, prepared, side_by_side, side_by_side_parser  # noqa: E402
from benchreport import BUILD, run  # noqa: E402
from targets import with_baseline  # noqa: E402

MIB = 1024 * 1024
MAP_TARGETS = ("tmpfs", "ext4-loop", "nvfs-none", "nvfs-page", "nvfs-direct")
BATCH = 16  # copies per read of the clock in the warm and pmem2 rows

# row name -> (nvfs-mapbench mode and options; None: chosen by target)
ROWS = {
    "first touch read": ["first-touch"],
    "first touch write": ["first-touch", "--write"],
    "warm read": ["warm-read"],
    "warm write, persisted": None,
    "warm write, no persist": ["warm-write", "--persist", "none"],
    "pmem2 copy + persist": ["pmem2"],
}


class InProc:
    """The in-process floor: a copy of the data file in WORK, mapped by the
    program itself (no mount)."""
    name = "inproc"
    kind = "inproc"

    def __init__(self):
        self.path = os.path.join(WORK, "inproc.img")


def is_direct(t):
    return t.name.endswith("nvfs-direct")


def path_of(t):
    return t.path if isinstance(t, InProc) else data_of(t)


def expected_backing(t):
    return "direct" if is_direct(t) else "kernel"


def short_backing(backing):
    """mapbench's backing ("kernel", "direct (backed by PATH)", ...) in one word."""
    return backing.split(" ", 1)[0] if backing else "?"


def command(t, row, seconds):
    args = ROWS[row]
    if args is None:
        persist = "clflush" if isinstance(t, InProc) or is_direct(t) else "msync"
        args = ["warm-write", "--persist", persist]
    batch = [] if args[0] == "first-touch" else ["--batch", str(BATCH)]
    return [os.path.join(BUILD, "nvfs-mapbench"), args[0], path_of(t), *args[1:],
            "--seconds", str(seconds), *batch]


def env_of(t):
    if not is_direct(t):
        return None
    lib = os.path.join(t.bindir, "libnvfs-direct.so")
    if not os.path.exists(lib):
        lib = os.path.join(BUILD, "libnvfs-direct.so")
    return dict(os.environ, LD_PRELOAD=lib)


def once(t, row, seconds):
    """nvfs-mapbench's record for `row` on target `t`, or None if it failed."""
    r = run(command(t, row, seconds), check=False, env=env_of(t))
    if r.returncode != 0:
        print(f"{t.name} {row}: nvfs-mapbench failed: {(r.stderr or r.stdout).strip()[:200]}",
              file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(results, names, expected, args):
    """Prints the tables and the ratios; `results` is {(target, row): [record]}."""
    med = {k: statistics.median(r["median_ns"] for r in v) for k, v in results.items() if v}
    backings = {k: sorted({r["backing"] for r in v}) for k, v in results.items() if v}
    persists = {k: sorted({r["persist"] for r in v}) for k, v in results.items() if v}
    granularity = {k: sorted({r["granularity"] for r in v}) for k, v in results.items() if v}

    def off(name, row):
        """Whether the mapping of `name` in `row` was not what the target is for."""
        b = backings.get((name, row))
        return b is not None and any(short_backing(x) != expected[name] for x in b)

    def ns_cell(row, name):
        m = med.get((name, row))
        if m is None:
            return None
        text = f"{m:.0f}" if m >= 100 else f"{m:.1f}"
        return text + (" !" if off(name, row) else "")

    rows = list(ROWS)
    print(f"\nshared mappings, median ns per operation over {args.reps} repetitions of "
          f"{args.seconds} s, data file {args.size // MIB} MiB (tools/bench.sh --maps)")
    print("\n".join(benchreport.grid("row", rows, names, ns_cell)))
    print("  first touch: mmap + 8-byte load/store + munmap of a 2 MiB window; the rest: one\n"
          "  random 4 KiB memcpy. Persisted: msync (MS_SYNC) on tmpfs, ext4-loop, nvfs-none,\n"
          "  nvfs-page; the CPU's cache flush + sfence on inproc and nvfs-direct (the\n"
          "  namespace's own flush); pmem2: libpmem2's persist function for the mapping's\n"
          "  granularity. '!' marks a mapping backed otherwise than the target is for.")

    print("\nwhat backed each mapping (/proc/self/maps; kernel: the file itself, "
          "direct: the namespace):")
    print("\n".join(benchreport.grid(
        "row", rows, names,
        lambda row, name: None if (name, row) not in backings else
        "/".join(short_backing(b) for b in backings[(name, row)]) +
        (" !" if off(name, row) else ""))))
    for title, by, row in (("warm write persisted by", persists, "warm write, persisted"),
                           ("pmem2 store granularity", granularity, "pmem2 copy + persist")):
        said = [f"{name} {'/'.join(by[(name, row)])}" for name in names if (name, row) in by]
        print(f"  {title}: {', '.join(said)}")
    steps = sorted({r["clock_step_ns"] for v in results.values() for r in v})
    if steps:
        print(f"  the clock's smallest step seen: "
              f"{steps[0] if steps[0] == steps[-1] else f'{steps[0]}-{steps[-1]}'} ns")
    flagged = sorted({name for name, row in backings if off(name, row)})
    for name in flagged:
        which = [row for row in rows if off(name, row)]
        seen = sorted({b for row in which for b in backings[(name, row)]})
        print(f"  FLAGGED {name}: expected a {expected[name]} mapping, got "
              f"{'; '.join(seen)} (rows: {'; '.join(which)})")

    def ratio(a, b, row):
        x, y = med.get((a, row)), med.get((b, row))
        return None if x is None or not y else x / y

    checks = []  # (what, value, limit or None, row, the targets in it)
    for row, limit in (("first touch read", 1.5), ("first touch write", 1.5),
                       ("warm read", 1.1), ("warm write, no persist", 1.1)):
        checks.append((f"{row}: nvfs-direct / tmpfs", ratio("nvfs-direct", "tmpfs", row),
                       limit, row, ("nvfs-direct", "tmpfs")))
    checks.append(("warm write, persisted: nvfs-direct / inproc (both cache flushes)",
                   ratio("nvfs-direct", "inproc", "warm write, persisted"), None,
                   "warm write, persisted", ("nvfs-direct", "inproc")))
    checks.append(("warm write, persisted: nvfs-direct (flush) / tmpfs (msync)",
                   ratio("nvfs-direct", "tmpfs", "warm write, persisted"), None,
                   "warm write, persisted", ("nvfs-direct", "tmpfs")))
    for other in ("tmpfs", "inproc"):
        checks.append((f"pmem2 copy + persist: nvfs-direct / {other}",
                       ratio("nvfs-direct", other, "pmem2 copy + persist"), None,
                       "pmem2 copy + persist", ("nvfs-direct", other)))
    for row in rows:
        for other in ("nvfs-none", "nvfs-page"):
            checks.append((f"{row}: nvfs-direct / {other}", ratio("nvfs-direct", other, row),
                           None, row, ("nvfs-direct", other)))

    print("\nratios (ns over ns: lower is faster; issue 31's targets, this run's medians):")
    for what, value, limit, row, pair in checks:
        bound = f"<= {limit:<4}" if limit is not None else " " * 7
        if value is None:
            print(f"  {what:66} {'-':>7}  {bound} n/a")
            continue
        if any(off(name, row) for name in pair):
            verdict = "NOT AS MAPPED (flagged above)"
        elif limit is None:
            verdict = ""
        else:
            verdict = "met" if value <= limit else "MISSED"
        print(f"  {what:66} {value:7.2f}  {bound} {verdict}".rstrip())


def main():
    ap = side_by_side_parser(__doc__, 5, 64 * MIB, 1.0, "per row and target")
    benchreport.add_json_out(ap, "maps.json")
    args = ap.parse_args()
    if args.size < 2 * MIB or args.size % (2 * MIB):
        ap.error("--size: a multiple of 2 MiB (first touch maps 2 MiB windows)")
    mounts = [t for t in side_by_side(page_uring=False) if t.name in MAP_TARGETS]
    chosen = with_baseline(benchreport.pick(mounts, args.targets), args.baseline)
    inproc = [InProc()] if not args.targets or "inproc" in args.targets.split(",") else []
    results = {}  # (target, row) -> [nvfs-mapbench record per repetition]
    # SIGTERM as an exception: prepared()'s cleanup unmounts every target.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with prepared(chosen, args.size, "") as kept:
        everyone = inproc + kept
        try:
            if inproc:
                with open(inproc[0].path, "wb") as f:
                    for _ in range(0, args.size, MIB):
                        f.write(os.urandom(MIB))
            for rep in range(args.reps):
                order = everyone if rep % 2 == 0 else list(reversed(everyone))
                for row in ROWS:
                    for t in order:
                        rec = once(t, row, args.seconds)
                        if rec is None:
                            continue
                        results.setdefault((t.name, row), []).append(rec)
                        print(f"rep {rep + 1} {row:24} {t.name:12} {rec['median_ns']:10.1f} ns  "
                              f"{rec['backing']}", file=sys.stderr, flush=True)
        finally:
            if inproc and os.path.exists(inproc[0].path):
                os.unlink(inproc[0].path)
    names = [t.name for t in everyone]
    with benchreport.open_out(args.json_out) as f:
        json.dump({"reps": args.reps, "seconds": args.seconds, "size": args.size,
                   "results": [{"target": n, "row": row, "runs": v}
                               for (n, row), v in results.items()]}, f, indent=1)
    report(results, names, {t.name: expected_backing(t) for t in everyone}, args)
    print(f"\nraw figures: {args.json_out}")


if __name__ == "__main__":
    main()
