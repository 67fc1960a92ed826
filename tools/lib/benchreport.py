"""What the benchmark scripts share (tools/bench.py: reads; bench_meta.py:
metadata work; bench_walks.py: walks of a tree): running a command, the
mount table, dropping the kernel's caches, waiting for a FUSE daemon to let
go of its image, the kernel's switch for FUSE over io_uring, the options
every script takes (--reps, --targets, --baseline, --json-out), medians over
repetitions, and the table forms they print (fixed-width columns, a grid of
rows by targets, and markdown). Each script keeps which targets it runs, its
workloads and what it checks; how a target is made, mounted and unmounted is
targets.py's, and the run around the read benchmarks' measurements (the
data file, the targets made and removed) bench.py's prepared().
"""
import os
import signal
import statistics
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NVFS_BUILD", os.path.join(TOP, "build"))


# --- the machine ------------------------------------------------------------

def run(cmd, check=True, capture=True, **kw):
    res = subprocess.run(cmd, check=False, text=True,
                         stdout=subprocess.PIPE if capture else None,
                         stderr=subprocess.PIPE if capture else None, **kw)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def wait_released(path, timeout=10, interval=0.02):
    # A FUSE daemon releases its image (and nvfs the namespace's lock) as it
    # exits, after the unmount returned; the next mount needs both gone.
    deadline = time.time() + timeout
    while time.time() < deadline:
        if run(["fuser", "-s", path], check=False).returncode != 0:
            return
        time.sleep(interval)


class UringSwitch:
    """The kernel's switch for FUSE over io_uring, which is global: on for
    the run, the old value back on every exit. `targets` that need it are
    dropped (with a line on stderr saying `left_out`) when the kernel has
    no switch. Use: filter the targets with keep(), then on() inside the
    run's try and off() in its finally. SIGTERM (and with `hup`, SIGHUP) is
    made an exception so that the finally runs."""
    KNOB = "/sys/module/fuse/parameters/enable_uring"

    def __init__(self, targets, uses_uring, left_out, hup=False):
        self.old = None
        self.kept = targets
        if any(uses_uring(t) for t in targets):
            if not os.path.exists(self.KNOB):
                print(f"no {self.KNOB}: {left_out}", file=sys.stderr)
                self.kept = [t for t in targets if not uses_uring(t)]
            else:
                with open(self.KNOB) as f:
                    self.old = f.read().strip()
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
                if hup:
                    signal.signal(signal.SIGHUP, lambda *_: sys.exit(1))

    def keep(self):
        return self.kept

    def on(self):
        if self.old is not None:
            with open(self.KNOB, "w") as f:
                f.write("Y\n")

    def off(self):
        if self.old is not None:
            with open(self.KNOB, "w") as f:
                f.write(self.old + "\n")


# --- the command line -------------------------------------------------------

def add_reps(ap, default):
    ap.add_argument("--reps", type=int, default=default)


def add_targets(ap):
    ap.add_argument("--targets", default="", help="comma-separated subset of target names")


def add_baseline(ap, help="a directory with another build's nvfs and mkfs.nvfs: every nvfs "
                 "target also runs as base-<name> on it, alternating with this build's"):
    ap.add_argument("--baseline", default="", help=help)


# Where the scripts leave their raw figures by default: beside the build,
# never in the images' directory under /dev/shm (which a run leaves empty).
RESULTS = os.path.join(BUILD, "bench-results")


def add_json_out(ap, name):
    """--json-out, RESULTS/`name` by default."""
    ap.add_argument("--json-out", default=os.path.join(RESULTS, name))


def open_out(path):
    """`path` opened for writing, its directory made first."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "w")


def pick(items, names, name=lambda item: item.name):
    """The items whose name is in `names` (comma-separated; all if empty),
    in their own order."""
    if not names:
        return items
    wanted = set(names.split(","))
    return [item for item in items if name(item) in wanted]


# --- the figures ------------------------------------------------------------

def medians(table):
    """{a: {b: [figure per repetition]}} -> {a: {b: median}} (None where
    there is no figure)."""
    return {a: {b: (statistics.median(v) if v else None) for b, v in row.items()}
            for a, row in table.items()}


def fixed_row(cells, widths, sep=" "):
    """One line of a fixed-width table: each cell (a string) padded to its
    width, right-aligned for a positive width, left for a negative one."""
    return sep.join(f"{c:>{w}}" if w > 0 else f"{c:<{-w}}" for c, w in zip(cells, widths))


def grid(corner, rows, columns, cell):
    """The lines of a fixed-width table, indented by two spaces: a line per
    row, a column per column name, `corner` above the rows' names;
    `cell(row, column)` is a cell's text (None shows as "-")."""
    widths = [-max(len(x) for x in [corner, *rows])] + [max(9, len(c)) for c in columns]
    return ["  " + fixed_row([corner, *columns], widths)] + [
        "  " + fixed_row([r] + [cell(r, c) or "-" for c in columns], widths) for r in rows]


def markdown_table(header, rows):
    """The lines of a markdown table: `header` and each row lists of cells."""
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
            ["| " + " | ".join(row) + " |" for row in rows])
