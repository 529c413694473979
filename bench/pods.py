"""Past one host, what it costs: a trivial function launched on 2 local Ray nodes
(`cluster=`, `hosts=2`) vs the same launch on this host, and events per second from a worker to
the notebook through Ray vs locally. Both with `strategy="debug"`, 2 processes per host.

Ray binds 127.0.0.1 only inside a network namespace of its own, so no bench traffic leaves
the loopback. `measure_isolated()` (what bench/pods_group.py, figure 15, calls) measures in a
child process that it starts in such a namespace (`unshare -n` as root, `unshare -rn`
otherwise, loopback up) and returns the raw figures; `python -m bench.pods` does the same and
prints them, and `python -m bench.pods --inside` (already in a namespace) measures there. The
cluster is started once (its start is reported, not counted in a launch).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import common

REPEATS = 2 if common.QUICK else 3
LINES = 3000
ROOT = Path(__file__).resolve().parent.parent


def trivial():
    return 1


def chatty(lines):
    import torch.distributed as dist

    if dist.get_rank() == 0:
        start = time.time()
        for index in range(lines):
            print(f"line {index}")
        return time.time() - start
    return 0.0


class _Cell(io.StringIO):
    """The cell's stdout: when the first and the last relayed line arrived."""

    first = last = None

    def write(self, text):
        if "line " in text:
            self.last = time.monotonic()
            self.first = self.first or self.last
        return super().write(text)


def _launch(hx, function, args, **where):
    """Seconds from the call to its return, and the cell's stdout."""
    out = _Cell()
    start = time.monotonic()
    with contextlib.redirect_stdout(out):
        hx.notebook_launcher(function, args, strategy="debug", num_processes=2,
                             progress=False, **where)
    return time.monotonic() - start, out


def measure() -> dict:
    """The figures, as a dict (`--inside`); only inside a network namespace of its own."""
    if [name for _, name in socket.if_nameindex()] != ["lo"]:
        sys.exit("run inside `unshare -n` with the loopback up (see the module docstring)")
    import ray
    from ray.cluster_utils import Cluster

    import hfxla_nb as hx

    start = time.monotonic()
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    nodes.add_node(num_cpus=2)
    nodes.wait_for_nodes()
    cluster_start = time.monotonic() - start
    sides = {"local": {}, "ray_2_hosts": {"cluster": nodes.address, "hosts": 2}}
    figures: dict = {"cluster_start_s": round(cluster_start, 2)}
    try:
        for name, where in sides.items():
            times = [_launch(hx, trivial, (), **where)[0] for _ in range(REPEATS)]
            _, cell = _launch(hx, chatty, (LINES,), **where)
            assert cell.getvalue().count("line ") == LINES, name
            figures[name] = {"launch_s": [round(t, 2) for t in times],
                             "launch_best_s": round(min(times), 2),
                             # Log events relayed into the cell, first to last line.
                             "events_per_s": round((LINES - 1) / (cell.last - cell.first))}
        figures["launch_ratio_ray_vs_local"] = round(
            figures["ray_2_hosts"]["launch_best_s"] / figures["local"]["launch_best_s"], 2)
        figures["events_ratio_ray_vs_local"] = round(
            figures["ray_2_hosts"]["events_per_s"] / figures["local"]["events_per_s"], 2)
    finally:
        ray.shutdown()
        nodes.shutdown()
    return figures


def measure_isolated(timeout: float = 1200) -> dict:
    """`measure()` in a child process in a network namespace of its own; its dict.

    Raises:
        RuntimeError: the namespace could not be made (no root, no user namespaces) or the
            measurement failed (its stderr's end).
    """
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    inner = f"ip link set lo up && exec {shlex.quote(sys.executable)} -m bench.pods --inside"
    done = subprocess.run([*unshare, "sh", "-c", inner], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"bench.pods in `{' '.join(unshare)}` exited {done.returncode}: "
                           f"{done.stderr.strip()[-800:]}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--inside" in argv:
        print(json.dumps(measure()))
        return
    print(json.dumps(measure_isolated(), indent=1))  # bench/pods_group.py makes the figures


if __name__ == "__main__":
    main()
