"""The worker side of `predict`: load the model onto every device, run the task's evaluation
outputs over padded batches (one graph per bucket), decode on the host."""

from __future__ import annotations

import time
from typing import Any

from ... import _xla
from .. import patches
from ..plan import TrainPlan
from .context import WorkerContext
from .evaluate import run_batches


def predict_worker(index: int, plan: TrainPlan) -> dict[str, Any]:
    """Runs in the launched worker: returns the predictions (plain Python), the graphs
    compiled, the seconds taken and the seconds of them spent compiling."""
    if not _xla.is_spmd():
        _xla.use_spmd()  # before any tensor touches the device
    with patches.applied():
        ctx = WorkerContext.load(plan, train=False)
        before, _ = _xla.compile_times()
        start = time.perf_counter()
        batches, fetched = run_batches(ctx, bar="predict")  # the bar says what runs
        predictions = ctx.task.decode(plan.data, batches, fetched)
        seconds = time.perf_counter() - start
        count, times = _xla.compile_times()
        compiles = count - before
        return {"predictions": predictions, "seconds": seconds, "compiles": compiles,
                "compile_seconds": sum(times[len(times) - compiles:]) if compiles else 0.0}
