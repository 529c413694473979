"""Relay throughput: a function that prints a flood of short lines, launched from a real
Jupyter kernel by `hx.notebook_launcher` and by `xmp.spawn(fn, start_method="fork")`, and run
in the kernel itself: the time from executing the cell to the kernel being idle again with
every line received by the client (a notebook's view of "done"). The sides alternate in one
kernel. Every line must arrive, or the run is refused.

The figure: hx.notebook_launcher's time over xmp.spawn's (target <= 2: the relay must not set
the function's pace). Run alone: `python -m bench.relay` prints the figures.
"""

from __future__ import annotations

import textwrap

from . import common

GROUP = "relay throughput"
# Each repetition prints 3 x LINES lines through ipykernel. xmp.spawn's side relays about 500
# lines/s here (ipykernel's own relay of forked output): 2,000 lines keep it at ~4 s a run, 5
# pairs within make bench's 15 minutes, while hx's side (well under a second) stays far from
# the target either way; the rate, not the count, is what the figure compares.
LINES = 1_000 if common.QUICK else 2_000
REPEATS = common.REPEATS

SETUP = textwrap.dedent(
    """
    import hfxla_nb as hx
    import torch, torch_xla
    import torch_xla.distributed.xla_multiprocessing as xmp

    def flood(index, lines):
        for i in range(lines):
            print(f"line {i} of the flood")
    """
)
SIDES = {
    "hx.notebook_launcher": "hx.notebook_launcher(flood, args=({lines},))",
    "xmp.spawn": "xmp.spawn(flood, args=({lines},), start_method='fork')",
    "in the kernel": "flood(0, {lines})",
}


def measure(lines: int = LINES, repeats: int = REPEATS) -> dict[str, list[float]]:
    """Seconds per side and repetition, in one fresh kernel (sides alternating); "lost": the
    most lines of one xmp.spawn run that never reached the cell (ipykernel 7 relays a forked
    child's prints through a socket of its own; hx's must all arrive)."""
    from .in_kernel import BenchKernel

    kernel = BenchKernel()
    lost: dict[str, int] = {}
    try:
        setup = kernel.run(SETUP)
        if setup.error:
            raise RuntimeError(f"setup failed: {setup.error}")

        def side(name: str, call: str):
            def run() -> float:
                cell = kernel.run(call.format(lines=lines))
                arrived = cell.stdout.count(" of the flood\n")
                if cell.error or (arrived != lines and name != "xmp.spawn"):
                    raise RuntimeError(f"{call}: {cell.error or ''} {arrived} of {lines} lines "
                                       f"arrived")
                lost[name] = max(lost.get(name, 0), lines - arrived)
                return cell.seconds
            return run

        results = common.alternate({name: side(name, call) for name, call in SIDES.items()},
                                   repeats, common.say)
        results["lost"] = [lost.get("xmp.spawn", 0)]
        return results
    finally:
        kernel.close()


def run() -> list[common.Figure]:
    """The relay figure: `hx.notebook_launcher` time / `xmp.spawn` time for LINES lines."""
    results = measure()
    hx, xmp, own = (results[name] for name in SIDES)
    ratios = common.ratios(hx, xmp)
    note = (f"{LINES:,} lines of ~20 characters, cell start to idle with every line received: "
            f"hx {common.median(hx):.2f} s, xmp.spawn {common.median(xmp):.2f} s, printed in the "
            f"kernel itself {common.median(own):.2f} s; xmp.spawn lost up to "
            f"{results['lost'][0]:,} lines (ipykernel's own relay of forked output), hx none")
    return [common.target_figure(
        GROUP, f"{LINES:,} printed lines: hx.notebook_launcher time / xmp.spawn time",
        common.median(ratios), "<=", 2.0, "x", len(ratios), note, ratios)]


def main() -> int:
    common.bench_environment()
    for figure in run():
        common.say(f"{figure.name}: {figure.value:.3f} {figure.unit} (target {figure.target}, "
                   f"met: {figure.met}); {figure.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
