"""Group 15: past one host (`bench/pods.py` measures: 2 local Ray nodes vs a local launch,
`strategy="debug"`, 2 processes per host). Ray binds 127.0.0.1 only in a network namespace of
its own, so `bench/pods.py` measures in a child process under `unshare -n` (root, or a user
namespace where allowed: `pods.measure_isolated`); where that cannot start, the figure says why.

No targets: the pods issue asks for the figures only (the first measurement of a new path;
Ray's cluster start, outside any launch, is reported beside them).
"""

from __future__ import annotations

import subprocess

from . import common, pods

GROUP = "15 pods"


WHY = ("reported: both Ray nodes run on this one 2-core machine, so the ratio is Ray's own "
       "cost here, not a pod's (no target until real hosts measure it)")


def run() -> list[common.Figure]:
    try:
        m = pods.measure_isolated(timeout=600)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
        return [common.Figure(GROUP, "Ray launch, 2 hosts / local launch", None, "x",
                              note=f"not measured: {error}")]
    local, ray = m["local"], m["ray_2_hosts"]
    start = f"Ray's 2-node cluster started in {m['cluster_start_s']:.1f} s (not in a launch)"
    return [
        common.Figure(GROUP, "trivial function: launch on 2 Ray hosts / local launch",
                      m["launch_ratio_ray_vs_local"], "x", repeats=len(local["launch_s"]),
                      note=f"best of {len(local['launch_s'])}: Ray {ray['launch_best_s']:.2f} s, "
                      f"local {local['launch_best_s']:.2f} s; {start}; {WHY}"),
        common.Figure(GROUP, "events/s to the notebook: 2 Ray hosts / local",
                      m["events_ratio_ray_vs_local"], "x",
                      note=f"{ray['events_per_s']} vs {local['events_per_s']} printed lines/s "
                      f"relayed into the cell, 1 run; {WHY}"),
    ]
