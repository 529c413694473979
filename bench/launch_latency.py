"""Group 7: what a launch costs. `hx.notebook_launcher` (defaults: replicated, panels,
compilation tracing) vs `torch_xla.distributed.xla_multiprocessing.spawn(fn,
start_method="fork")` vs `accelerate.notebook_launcher(num_processes=1)`, each launching a
trivial function: the time from the call to the function's first line, and of the whole
launch (call to return).

Each side runs in a fresh Python process (a fresh kernel: torch and torch_xla imported, the
launcher imported, nothing launched yet): its first launch, then `LATER` more in the same
process. The sides alternate, one fresh process each per repetition. The fresh processes are
forked from one "zygote" process that imported torch and torch_xla and nothing else (no
launcher, no runtime started): each child is what a fresh interpreter is after those imports,
without paying them again (about 4 s each, 15 times, which no figure measured). Run alone:
`python -m bench.launch_latency --side hx` prints that side's JSON from a truly fresh process.

Then the same in a real Jupyter kernel, as a notebook runs it (`in_kernel`): a fresh kernel
per side and repetition; a cell imports torch and torch_xla, and `import hfxla_nb as hx` or
`import torch_xla.distributed.xla_multiprocessing as xmp`; `THINK` seconds later (a person
takes longer between two cells) the next cell launches a function that does nothing, timed
from the client (execute request to the kernel idle again, the panel drawn), then `LATER`
more cells do the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from . import common

GROUP = "7 launch latency"
THINK = 2.0  # seconds between the import cell and the first launch cell (a person: more)
KERNEL_SIDES = {
    "hx.notebook_launcher": ("import hfxla_nb as hx", "hx.notebook_launcher(nothing)"),
    "xmp.spawn": ("import torch_xla.distributed.xla_multiprocessing as xmp",
                  "xmp.spawn(nothing, start_method='fork')"),
}
SIDES = ("hx.notebook_launcher", "xmp.spawn", "accelerate.notebook_launcher")
LATER = 2


def first_line(index, path):
    """The launched function (xmp.spawn style): when did its first line run?"""
    stamp = time.time()
    with open(path, "w") as file:
        file.write(repr(stamp))


def first_line_accelerate(path):
    """The same, accelerate style (no index)."""
    first_line(0, path)


def launcher(side: str):
    if side == "hx.notebook_launcher":
        import hfxla_nb as hx

        notebook_launcher = hx.notebook_launcher  # imported, as xmp's module is for its side
        return lambda path: notebook_launcher(first_line, args=(path,))
    if side == "xmp.spawn":
        import torch_xla.distributed.xla_multiprocessing as xmp

        return lambda path: xmp.spawn(first_line, args=(path,), start_method="fork")
    from accelerate import notebook_launcher

    return lambda path: notebook_launcher(first_line_accelerate, args=(path,), num_processes=1)


def measure_side(side: str, later: int = LATER) -> dict:
    """In this (fresh) process: the first launch, then `later` more."""
    import torch  # noqa: F401 - a kernel that is about to train has these imported
    import torch_xla  # noqa: F401

    launch = launcher(side)
    out: dict[str, list[float]] = {"first_line": [], "whole": []}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "stamp")
        for _ in range(1 + later):
            if os.path.exists(path):
                os.remove(path)
            started = time.time()
            launch(path)
            ended = time.time()
            with open(path) as file:
                out["first_line"].append(float(file.read()) - started)
            out["whole"].append(ended - started)
    return out


END = "-- end of side --"


def zygote() -> None:
    """`--zygote`: import torch and torch_xla, then for each side named on stdin fork a child
    that runs `measure_side(side)` (its JSON on stdout), wait for it, and print `END`."""
    import torch  # noqa: F401 - what a fresh kernel that is about to train has imported
    import torch_xla  # noqa: F401

    print(END, flush=True)  # ready
    for line in sys.stdin:
        side = line.strip()
        if not side:
            continue
        pid = os.fork()
        if pid == 0:  # the fresh process
            code = 1
            try:
                print(json.dumps(measure_side(side)), flush=True)
                code = 0
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
        print(END, flush=True)


class Zygote:
    """A `--zygote` process: `fresh(side)` forks a fresh process from it."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.launch_latency", "--zygote"], cwd=root,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._read()

    def _read(self) -> list[str]:
        lines = []
        for line in self.process.stdout:
            if line.strip() == END:
                return lines
            lines.append(line.strip())
        raise RuntimeError(f"the zygote ended: {lines[-3:]}")

    def fresh(self, side: str) -> dict:
        """`measure_side(side)` in a fresh process (forked from the zygote)."""
        self.process.stdin.write(side + "\n")
        self.process.stdin.flush()
        lines = self._read()
        found = [line for line in lines if line.startswith("{")]
        if "exit 0" not in lines or not found:
            raise RuntimeError(f"{side} failed: {lines[-3:]}")
        return json.loads(found[-1])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def in_kernel(side: str, later: int = LATER) -> dict[str, list[float]]:
    """`side`'s first launch and `later` more in a fresh Jupyter kernel: each launch cell's
    time from the client (execute to idle), in seconds."""
    from .in_kernel import BenchKernel

    imports, call = KERNEL_SIDES[side]
    kernel = BenchKernel()
    try:
        setup = kernel.run(f"import torch, torch_xla\n{imports}\ndef nothing(index):\n    pass")
        if setup.error:
            raise RuntimeError(f"{side}: {setup.error}")
        time.sleep(THINK)
        cells = []
        for _ in range(1 + later):
            cell = kernel.run(call)
            if cell.error:
                raise RuntimeError(f"{side}: {cell.error}")
            cells.append(cell.seconds)
        return {"cell": cells}
    finally:
        kernel.close()


def kernel_figures(repeats: int) -> list[common.Figure]:
    """First and later launches in a real kernel: hx.notebook_launcher - xmp.spawn."""
    results = common.alternate({side: (lambda s=side: in_kernel(s)) for side in KERNEL_SIDES},
                               repeats, common.say)
    figures = []
    for first in (True, False):
        hx, xmp = ([r["cell"][0] if first else common.median(r["cell"][1:]) for r in
                    results[side]] for side in KERNEL_SIDES)
        differences = [a - b for a, b in zip(hx, xmp, strict=True)]
        when = "first launch" if first else f"later launches ({LATER} each)"
        note = (f"cell execute to idle, {THINK:g} s after the import cell: hx "
                f"{common.median(hx):.2f} s, xmp.spawn {common.median(xmp):.2f} s")
        figures.append(common.target_figure(
            GROUP, f"{when} in a real Jupyter kernel: hx.notebook_launcher - xmp.spawn",
            common.median(differences), "<=", 0.1, "s", len(differences), note, differences))
    return figures


def run() -> list[common.Figure]:
    kernel = kernel_figures(min(common.REPEATS, 3))
    forks = Zygote()
    try:
        results = common.alternate({side: (lambda s=side: forks.fresh(s)) for side in SIDES},
                                   common.REPEATS, common.say)
    finally:
        forks.close()
    n = common.REPEATS
    figures = []

    def values(side: str, key: str, first: bool) -> list[float]:
        return [r[key][0] if first else common.median(r[key][1:]) for r in results[side]]

    for first in (True, False):
        when = "first launch in a fresh process" if first else f"later launches ({LATER} each)"
        for key, what in (("first_line", "call to first line"), ("whole", "whole launch")):
            hx = values("hx.notebook_launcher", key, first)
            xmp = values("xmp.spawn", key, first)
            acc = values("accelerate.notebook_launcher", key, first)
            differences = [a - b for a, b in zip(hx, xmp, strict=True)]
            note = (f"a fresh process per side and repetition (forked from one that imported "
                    f"torch and torch_xla only); hx {common.median(hx):.2f} s, xmp.spawn "
                    f"{common.median(xmp):.2f} s, "
                    f"accelerate {common.median(acc):.3f} s (accelerate runs the function in the "
                    "calling process with num_processes=1 off Colab and Kaggle)")
            figures.append(common.target_figure(
                GROUP, f"{what}, {when}: hx.notebook_launcher - xmp.spawn",
                common.median(differences), "<=", 0.1, "s", n, note, differences))
    return kernel + figures


def main(argv: list[str] | None = None) -> int:
    common.bench_environment()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=SIDES)
    parser.add_argument("--zygote", action="store_true",
                        help="fork a fresh process per side named on stdin (make bench's)")
    parser.add_argument("--kernel", action="store_true",
                        help="only the real-kernel figures, printed")
    parser.add_argument("--repeats", type=int, default=min(common.REPEATS, 3),
                        help="fresh kernels per side for --kernel (make bench: %(default)s)")
    args = parser.parse_args(argv)
    if args.kernel:
        for figure in kernel_figures(args.repeats):
            print(f"{figure.name}: {figure.value:+.3f} {figure.unit} (target {figure.target}, "
                  f"met: {figure.met}); {figure.note}", flush=True)
        return 0
    if args.zygote:
        zygote()
        return 0
    if args.side is None:
        parser.error("--side, --zygote or --kernel")
    result = measure_side(args.side)
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
