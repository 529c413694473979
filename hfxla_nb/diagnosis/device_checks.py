"""What the doctor runs in launched workers (never in the kernel: its XLA runtime stays unstarted).
Each function returns plain data; none draws.
"""

from __future__ import annotations

import os
import time
from typing import Any

#: The bf16 matmul's largest error relative to fp32's largest value that is still right:
#: bf16 keeps 8 bits of mantissa (2^-8 = 0.4%), and a sum of 256 products rounds a few times.
BF16_TOLERANCE = 2e-2
#: The matmul's side.
MATMUL_SIDE = 256


def process_facts() -> dict[str, Any]:
    """A trivial launched function: its pid and rank (the launch itself is the check)."""
    return {"pid": os.getpid(), "rank": int(os.environ.get("RANK", "0"))}


def every_device() -> dict[str, Any]:
    """One compile and execution over every device (SPMD: one program, the batch sharded),
    an all-reduce (the sum of a sharded tensor), a bf16 matmul against fp32, device memory."""
    import torch

    from .. import _xla

    began = time.perf_counter()
    devices = _xla.global_device_count()
    dev = _xla.device()
    mesh = _xla.data_parallel_mesh()
    rows = 4 * devices
    values = torch.arange(rows * 8, dtype=torch.float32).reshape(rows, 8).to(dev)
    _xla.mark_sharding(values, mesh, ("data", None))
    total = values.sum()  # every device's part, reduced across the mesh
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(MATMUL_SIDE, MATMUL_SIDE, generator=generator) for _ in range(2))
    a, b = a.to(dev), b.to(dev)
    full = a @ b
    half = (a.to(torch.bfloat16) @ b.to(torch.bfloat16)).to(torch.float32)
    error = (half - full).abs().max() / full.abs().max()
    _xla.sync()
    total, error = (float(t) for t in _xla.to_cpu([total, error]))
    compiles, compile_seconds = _xla.compile_times()
    return {"devices": devices, "sum": total, "expected_sum": float(sum(range(rows * 8))),
            "bf16_error": error, "memory": _xla.memory_info(dev), "compiles": compiles,
            "compile_seconds": sum(compile_seconds), "device_type": _xla.device_type(),
            "seconds": time.perf_counter() - began}


def compile_and_count(folder: str) -> dict[str, Any]:
    """A small graph compiled with the persistent compile cache at `folder`: what XLA says it
    compiled and found in the cache (TPU: the second process finds the first one's entry)."""
    import torch

    from .. import _xla

    dev = _xla.device()
    x = torch.ones(64, 64, device=dev)
    y = (x @ x).sum()
    _xla.sync()
    float(_xla.to_cpu([y])[0])
    counters = _xla.metrics_snapshot().get("counters", {})
    return {key: int(counters.get(name, 0))
            for key, name in _xla.PERSISTENT_CACHE_COUNTERS.items()}
