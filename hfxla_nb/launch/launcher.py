"""`notebook_launcher`: train on every core from a notebook cell.

A drop-in for `accelerate.notebook_launcher` (same first four parameters), built for
PyTorch/XLA in a notebook; what it guarantees and how is in docs/architecture.md.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..observe import tracing
from ..runtime import compile_cache as cache
from ..runtime import detect
from ..ui import launch_display
from . import preflight
from .preflight import LaunchRefusedError
from .record import LaunchError, LaunchRecord, RankRecord
from .supervision import Supervision

__all__ = ["notebook_launcher", "last_launch", "LaunchRecord", "RankRecord", "LaunchError"]

_last_record: LaunchRecord | None = None


def last_launch() -> LaunchRecord | None:
    """The record of the most recent launch in this process (also after a failure)."""
    return _last_record


def notebook_launcher(
    function: Callable,
    args: Sequence = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int | None = None,
    *,
    strategy: str = "replicated",
    timeout: float | None = None,
    output: str | Iterable[int] = "main",
    progress: bool | str = "auto",
    heartbeat_timeout: float | None = None,
    trace_compiles: bool = True,
    compile_cache: bool | str | os.PathLike | None = None,
) -> Any:
    """Run `function` on every XLA device from a notebook cell and return rank 0's result.

    The first four parameters keep `accelerate.notebook_launcher`'s names and meaning, so
    `from hfxla_nb import notebook_launcher` replaces `from accelerate import
    notebook_launcher` unchanged. The function is called as `function(index, *args)` when it
    takes one more positional argument than `args` gives (xmp.spawn style), else as
    `function(*args)` (accelerate style).

    Args:
        function: the training function. Create the model, move it to the device and train
            inside it; the notebook process must not touch the XLA device before the launch.
        args: positional arguments passed after the index.
        num_processes: on a TPU host, None or the number of cores (all are always used); on a
            machine without a TPU, the number of XLA virtual CPU devices (default 1), or of
            processes for `strategy="debug"` (default 2).
        mixed_precision: "no", "bf16" or "fp16" (not on TPU), as accelerate's
            `ACCELERATE_MIXED_PRECISION` in the workers.
        use_port: TCP port of the gloo rendezvous for `strategy="debug"` (default: a free one).
        strategy: "replicated" (`xmp.spawn`: one process per chip, one thread per core on
            v2/v3 and on the CPU), "spmd" (one process over every device with `xr.use_spmd()`;
            recommended for data parallel training) or "debug" (N forked CPU processes joined by
            a gloo process group, to rehearse multi-process code without a TPU).
        timeout: seconds after which every rank is stopped and `LaunchError` names the ranks
            that stalled.
        output: whose printed output reaches the cell: "main" (rank 0 and the launcher),
            "all" (every rank, prefixed with its rank), "none", or a list of ranks.
        progress: "auto", "widgets", "html", "console" or False: how the panels are drawn.
        heartbeat_timeout: stop the launch when a rank's process sends no heartbeat for this
            many seconds (a frozen process); by default only a warning is printed after 60 s.
            A rank that has not started yet (the runtime's start) is given at least 60 s.
        trace_compiles: capture PyTorch/XLA's analysis of every compilation in the workers
            (`PT_XLA_DEBUG_LEVEL=2`, never shown raw) for the panel's compilations view: the
            line, cause, graph and memory of each compilation. False turns it off.
        compile_cache: the persistent compile cache: None (what `hx.configure` chose, else on
            for TPU hosts), True, False, or a folder (see `hx.configure`).

    Returns:
        Rank 0's return value. Every rank's value, exit state and duration are on
        `hfxla_nb.last_launch()`.

    Raises:
        LaunchRefusedError: before forking, when the launch cannot work (the XLA runtime is
            already initialized in this kernel, bad arguments, impossible `num_processes`, a
            compile cache folder that other users can write to).
        LaunchError: when a rank failed, was killed, or the launch timed out.
        KeyboardInterrupt: after stopping every worker, when the cell was interrupted.
    """
    global _last_record
    pass_index = preflight.check_function(function, args)
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise LaunchRefusedError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    shown_ranks = _parse_output(output)
    preflight.check_runtime_not_started()

    info = detect()
    preflight.check_environment(info.accelerator, os.environ)
    plan = preflight.plan_launch(
        strategy,
        num_processes,
        mixed_precision,
        info.accelerator.kind,
        info.accelerator.devices,
        info.environment,
    )
    for message in plan.warnings:
        warnings.warn(message, UserWarning, stacklevel=2)
    env = dict(plan.env)
    env.update(_cache_env(compile_cache, info, strategy))
    env[tracing.SWITCH] = "1" if trace_compiles else "0"
    if strategy == "debug":
        env["MASTER_ADDR"] = "127.0.0.1"
        env["MASTER_PORT"] = str(use_port or _free_port())

    display = launch_display(plan.world, progress)
    record = LaunchRecord(strategy, plan.world, [RankRecord(rank) for rank in range(plan.world)])
    _last_record = record
    supervision = Supervision(record, display, shown_ranks, timeout, heartbeat_timeout)
    supervision.run(function, tuple(args), pass_index, env)
    if record.ok:
        return record.value
    raise LaunchError(supervision.failure_message(), record)


def _cache_env(setting: Any, info: Any, strategy: str) -> dict[str, str | None]:
    """The workers' compile cache variables; an unsafe folder refuses the launch."""
    try:
        settings = cache.resolve(setting, accelerator=info.accelerator,
                                 environment=info.environment, versions=info.versions,
                                 environ=os.environ)
    except cache.CompileCacheRefusedError as error:
        raise LaunchRefusedError(str(error)) from None
    accelerator = info.accelerator
    processes = strategy == "debug" or (
        strategy == "replicated" and accelerator.kind == "tpu" and accelerator.chips > 1)
    return cache.worker_env(settings, per_process=processes)


def _parse_output(output: str | Iterable[int]) -> set[int] | str:
    if output in ("main", "all", "none"):
        return {0} if output == "main" else output
    try:
        return {int(rank) for rank in output}
    except (TypeError, ValueError):
        raise LaunchRefusedError(
            f"output={output!r}: use 'main' (rank 0), 'all', 'none' or a list of ranks."
        ) from None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
