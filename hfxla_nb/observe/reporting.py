"""`hfxla_nb.report`: progress and XLA metrics from inside a training function, with no sync.

```python
def train(index, cfg):
    for step, batch in enumerate(loader, start=1):
        loss = model(**batch).loss
        ...
        hx.report(step=step, loss=loss, total=len(loader), inputs=batch, lr=sched.get_last_lr()[0])
        torch_xla.sync()  # the step closures of `report` run right after this step's graph
```

A device tensor is never read inline: `report` queues a step closure
(`xm.add_step_closure`) on every `log_every`-th step and on the final one, and the closure
copies the values to the host after the graph has run anyway: one transfer per `log_every`
steps at most, no extra execution, no `.item()`. Plain numbers are sent as they are. Events
are throttled by time (a few per second per bar; the final step always goes out). When the
function returns with a last step whose values were not fetched, they are fetched then, every
bar's in one transfer, so each bar ends at its real last step with its real last values.

Each process also sends a `MetricsSnapshot` every `SNAPSHOT_INTERVAL` seconds while steps go
on, just past the warm-up steps, at the final step and when a rank ends: torch_xla's host-side
counters (no device sync), device memory on TPU, and the input shapes seen so far (`inputs=`),
so a recompilation can be explained by the input whose shape changed. The counters belong to
the process, so when several ranks run as threads of one process the snapshot is that of all
of them: it names them and their steps (`data["process"]`) and carries the lowest one as its
rank. The launcher's worker says when each rank starts and ends (`rank_started`,
`rank_ended`), so that a last snapshot goes out when a rank fails and after the last rank of a
process finished, even where no final step was reported.

Outside a launched worker (in the notebook kernel itself), `report` does nothing and costs a
function call, unless a local receiver is installed with `local_events` (`%%xla_metrics`
does that, to learn the step count and input shapes of the cell it measures).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .. import _xla, events
from ..events import MetricsSnapshot, Progress
from ..runtime import compile_cache
from . import metrics
from .metrics import WARMUP_STEPS, ShapeTracker, shapes_of

# -- what report keeps per worker process, and its metrics snapshots --

# Seconds between two MetricsSnapshot events of one process (the panel says "as of step N";
# a few a second keep it close to the bar, and reading the counters is host-side only).
SNAPSHOT_INTERVAL = 0.5


class ProcessState:
    """Per process and channel: the ranks it runs, their steps, when snapshots were sent, and
    the input shapes seen."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.lock = threading.Lock()
        self.last_snapshot: float | None = None
        self.warm_sent = False
        self.shapes = ShapeTracker()
        self.memory_available: bool | None = None
        self.memory: dict[str, int] | None = None
        self.max_step = 0
        self.ranks: set = set()  # ranks started in this process (rank_started)
        self.running: set = set()  # ... and not ended yet
        self.main_label: dict[Any, str] = {}  # rank -> the label it reported first
        self.steps: dict[Any, int] = {}  # rank -> largest step of its main label
        # The compilations when a main bar reached its total ({"step", "compiles",
        # "compile_ns"}): what compiles later (saving, evaluation) is not the step's.
        self.last_step: dict[str, int] | None = None
        # A bar of hfxla_nb's own that counts this process's work when no step is reported
        # ({"label", "step"}: `predict`'s batches), so the metrics count what the bar counts.
        self.bar: dict[str, Any] | None = None

    def all_ranks(self) -> list:
        """The ranks of this process (started, or seen reporting), lowest first."""
        ranks = self.ranks | {rank for rank in self.steps if rank is not None}
        return sorted(ranks)

    def step(self) -> int:
        """The process's step: that of its slowest reporting rank (their main bars)."""
        return min(self.steps.values()) if self.steps else self.max_step

    def rank_steps(self) -> int:
        """Steps of every rank of the process added up (a rank that does not report is
        counted at the slowest reporting rank's step)."""
        if not self.steps:
            return 0
        slowest = min(self.steps.values())
        ranks = self.ranks | set(self.steps)
        return sum(self.steps.get(rank, slowest) for rank in ranks)


def mark_last_step(process: ProcessState, step: int) -> None:
    """A main bar reached its total: note the compilations so far (a step closure, run after
    the next graph: the last step's own when `report` comes before its sync; in a loop that
    reports after the sync, the first graph after the last step is counted as the step's)."""
    try:
        metric = _xla.metrics_snapshot().get("metrics", {}).get(_xla.COMPILE_TIME) or {}
        with process.lock:
            process.last_step = {"step": step, "compiles": int(metric.get("count", 0)),
                                 "compile_ns": int(metric.get("total", 0))}
    except Exception as error:  # noqa: BLE001 - never break the user's sync
        warnings.warn(f"hfxla_nb.report could not read metrics: {error!r}", RuntimeWarning,
                      stacklevel=2)


def maybe_snapshot(process: ProcessState, send, final: bool, now: float) -> None:
    """Queue a metrics snapshot of this process, every few seconds (from whichever rank thread
    reports when one is due)."""
    if not _xla.runtime_is_initialized():
        return  # no XLA work in this process yet: nothing to measure
    with process.lock:
        warm = not process.warm_sent and process.step() > WARMUP_STEPS
        due = process.last_snapshot is None or now - process.last_snapshot >= SNAPSHOT_INTERVAL
        if not (final or warm or due):
            return
        process.last_snapshot = now
        process.warm_sent = process.warm_sent or warm
    # After the step's graph ran, so the counters include this step's compile and transfers.
    _xla.add_step_closure(send_snapshot, (process, send))


def send_snapshot(process: ProcessState, send) -> None:
    """Send the process's counters now (a step closure, or the end of a rank)."""
    try:
        with process.lock:  # progress first: the counters read next include at least that
            step = process.step()
            progress = process.rank_steps()
            ranks = process.all_ranks()
            last_step = dict(process.last_step) if process.last_step else None
            bar = dict(process.bar) if process.bar else None
        data = _xla.metrics_snapshot()
        data["input_shapes"] = process.shapes.data()
        data["reshards"] = metrics.data()
        data["process"] = {"pid": os.getpid(), "ranks": ranks, "rank_steps": progress}
        if last_step is not None:
            data["process"]["last_step"] = last_step
        if bar is not None:
            data["process"]["bar"] = bar
        data["compile_cache"] = compile_cache.worker_status()
        rank = ranks[0] if ranks else events.worker_rank()
        send(MetricsSnapshot(rank, step, data, memory(process)))
    except Exception as error:  # noqa: BLE001 - never break the user's sync
        warnings.warn(f"hfxla_nb.report could not read metrics: {error!r}", RuntimeWarning,
                      stacklevel=2)


def memory(process: ProcessState) -> dict[str, int] | None:
    """Device memory on TPU; on the CPU it is not available (asked once per process)."""
    if process.memory_available is False:
        return None
    info = None
    if _xla.device_type() not in (None, "CPU"):
        info = _xla.memory_info()
    process.memory_available = info is not None
    process.memory = info
    return info


# -- report: progress and metrics from inside a training function --

# Seconds between two Progress events of one bar (the final step is always sent).
MIN_INTERVAL = 0.2
#: Seconds between hfxla_nb's own loops' progress events (the training loop's, besides
#: logging points and new buckets; decoding's tokens): the bar moves twice a second; each
#: report costs a training step about 1 ms of host time (`bench/host_time.py`), more often
#: it would be most of the loop's own work.
BAR_INTERVAL = max(0.5, MIN_INTERVAL)

_local_sink: Callable[[events.Event], None] | None = None


class _BarState:
    """Per thread and label: how many calls, when things were last sent, the latest progress
    held back by the throttle, and the latest step's device values when no fetch was queued
    for them (both sent when the rank ends)."""

    __slots__ = ("calls", "offset", "last_sent", "last_fetch", "pending", "unfetched")

    def __init__(self) -> None:
        self.calls = 0
        self.offset = 0  # 1 for a loop that counts its steps from 0
        self.last_sent: float | None = None
        self.last_fetch = float("-inf")
        self.pending: Progress | None = None
        self.unfetched: tuple[Progress, list[str], list] | None = None


_process: ProcessState | None = None
_process_lock = threading.Lock()
_thread = threading.local()


def _reset_after_fork() -> None:
    global _process, _thread, _process_lock
    _process = None
    _process_lock = threading.Lock()
    _thread = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _target() -> tuple[Any, Callable[[events.Event], Any]] | None:
    """Where events go: the launch's channel in a worker, else a local sink, else nowhere."""
    channel = events.worker_channel()
    if channel is not None:
        return channel, events.emit
    sink = _local_sink
    if sink is not None:
        return sink, sink
    return None


def _process_state(target: Any) -> ProcessState:
    global _process
    current = _process
    if current is not None and current.target is target:
        return current
    with _process_lock:
        if _process is None or _process.target is not target:
            _process = ProcessState(target)
        return _process


_job = 0  # the warm session's job this process runs (`new_job`)


def _bar_state(target: Any, label: str) -> _BarState:
    if getattr(_thread, "target", None) is not target or getattr(_thread, "job", 0) != _job:
        _thread.target = target
        _thread.job = _job
        _thread.bars = {}
    return _thread.bars.setdefault(label, _BarState())


def report(
    step: int | None = None,
    loss: Any = None,
    *,
    total: int | None = None,
    samples: int | None = None,
    inputs: Any = None,
    log_every: int = 10,
    label: str = "train",
    ended: str | None = None,
    **values: Any,
) -> None:
    """Report training progress from a launched worker, without forcing a device sync.

    Args:
        step: steps done so far, counting from 1; a loop that counts from 0 (its first
            report says `step=0`) is counted as `step + 1` steps done, so every panel, the
            metrics and `last_launch()` agree with a tqdm bar over the same loop. Defaults to
            the number of `report` calls for this `label` in this thread.
        loss: the loss, a device tensor or a number.
        total: the number of steps in the run, for the bar and its ETA.
        samples: samples seen so far by this rank (cumulative, e.g. `step * batch_size`),
            for samples per second.
        inputs: the batch (a dict of tensors such as a tokenizer's output) or a dict
            `name -> tensor`; only shapes are read, to explain recompilations.
        log_every: fetch device tensors every this many steps (and at the final step).
        label: names the bar ("train", "eval", ...); each label has its own bar.
        ended: why the loop ends here, before `total` ("stopped early at step 50 of 120:
            ..."): the panels draw the bar done at `step` of `total`, not cut short.
        values: more scalars to show (`lr=...`, `grad_norm=...`), tensors or numbers.

    Device tensors are copied to the host only in a step closure on every `log_every`-th step,
    after the graph has run, never with `.item()`. Outside a launched worker this is a no-op
    (see `local_events`).

    Example:
        ```python
        def train(index):
            ...
            for step, batch in enumerate(loader, start=1):
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                hx.report(step=step, loss=loss, total=len(loader), inputs=batch, log_every=10)
                torch_xla.sync()

        hx.notebook_launcher(train)
        ```
    """
    target = _target()
    if target is None:
        return
    key, send = target
    try:
        _report(key, send, step, loss, total, samples, inputs, log_every, label, ended,
                values)
    except Exception as error:  # noqa: BLE001 - reporting must never break training
        warnings.warn(f"hfxla_nb.report failed: {error!r}", RuntimeWarning, stacklevel=2)


def _report(key, send, step, loss, total, samples, inputs, log_every, label, ended,
            values) -> None:
    rank = events.worker_rank()
    bar = _bar_state(key, label)
    process = _process_state(key)
    bar.calls += 1
    if step is not None and bar.calls == 1 and int(step) == 0:
        bar.offset = 1  # `for i in range(n): ... report(step=i)`: i + 1 steps are done
    step = bar.calls if step is None else int(step) + bar.offset
    total = int(total) if total is not None else None
    samples = int(samples) if samples is not None else None
    final = ended is not None or (total is not None and step >= total)
    with process.lock:
        process.max_step = max(process.max_step, step)
        main = process.main_label.setdefault(rank, label) == label
        if main:
            process.steps[rank] = max(process.steps.get(rank, 0), step)
    if main and final and (step == total or ended) and _xla.runtime_is_initialized():
        # After the step's graph (the next sync: `report` then `sync`, as documented), so
        # its compilation is the step's.
        _xla.add_step_closure(mark_last_step, (process, step))
    if loss is not None:
        values = {"loss": loss, **values}
    plain, device = _split(values)
    if inputs is not None:
        shapes = shapes_of(inputs)
        if shapes:
            process.shapes.record(step, shapes)

    now = time.monotonic()
    every = max(int(log_every), 1)
    event = Progress(rank, step, total, plain, samples, label, ended=ended)
    bar.unfetched = None
    if device and (final or (step % every == 0 and now - bar.last_fetch >= MIN_INTERVAL)):
        bar.last_fetch = now
        _xla.add_step_closure(_send_fetched, (send, event, list(device), list(device.values())))
    elif device:  # fetched when the rank ends, if no later step comes
        bar.unfetched = (event, list(device), list(device.values()))
    if final or bar.last_sent is None or now - bar.last_sent >= MIN_INTERVAL:
        bar.last_sent = now
        bar.pending = None
        send(event)
    else:
        bar.pending = event
    maybe_snapshot(process, send, final, now)


def _split(values: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """Plain floats now, and scalar device tensors to fetch later."""
    plain: dict[str, float] = {}
    device: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if _xla.is_xla_tensor(value):
            if value.numel() == 1:
                device[name] = value
            continue
        try:
            plain[name] = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            continue  # not a scalar: nothing to show
    return plain, device


def _send_fetched(send, progress: Progress, names: list[str], tensors: list) -> None:
    """Step closure: the graph has run, so the values are there; one transfer for all."""
    try:
        fetched = _xla.to_cpu(tensors)
        values = dict(progress.values)
        for name, value in zip(names, fetched, strict=True):
            values[name] = float(value.detach().float())
        send(dataclasses.replace(progress, values=values))
    except Exception as error:  # noqa: BLE001 - a closure error would break the user's sync
        warnings.warn(f"hfxla_nb.report could not fetch values: {error!r}", RuntimeWarning,
                      stacklevel=2)


def count_in_bar(label: str, step: int) -> None:
    """The work of this process is counted in the steps of bar `label` (its `step` so far),
    not in torch_xla's syncs: for hfxla_nb's own bars sent without `report` (`predict`'s
    batches), so the metrics panel counts what the bar counts ("in 1 batch" beside
    `predict 1/1`, not the 3 syncs of loading, running and fetching)."""
    target = _target()
    if target is None:
        return
    process = _process_state(target[0])
    with process.lock:
        process.bar = {"label": label, "step": int(step)}


def new_job() -> None:
    """A warm session's next job starts in this process: its steps, bars and input shapes
    are counted from none, as in a new process."""
    global _process, _job
    with _process_lock:
        _process = None
        _job += 1  # each rank thread's bars start again (`_bar_state`)


def rank_started(rank: int) -> None:
    """The launcher's worker: `rank` starts running in this process (after `attach_worker`)."""
    target = _target()
    if target is None:
        return
    process = _process_state(target[0])
    with process.lock:
        process.ranks.add(rank)
        process.running.add(rank)


def rank_ended(rank: int, failed: bool = False) -> None:
    """The launcher's worker, on `rank`'s thread: its function returned (after its last step
    closures ran) or raised. Sends the progress the throttle held back, then the process's
    final metrics snapshot: at once when the rank failed (the launch is about to stop every
    rank), else when it is the last rank of the process to end, once the device finished the
    work queued (executions are counted when they complete). Never starts the XLA runtime."""
    target = _target()
    if target is None:
        return
    key, send = target
    if getattr(_thread, "target", None) is key:
        # After a failure the device may be what failed: send what is known, fetch nothing.
        _send_last_steps(send, fetch=not failed)
    process = _process_state(key)
    with process.lock:
        process.running.discard(rank)
        last = not process.running
    if not (failed or last):
        return
    try:
        if not _xla.runtime_is_initialized():
            return  # no XLA work in this process: nothing to measure, and do not start it
    except Exception:  # noqa: BLE001 - a broken torch_xla: nothing to read either
        return
    if not failed:  # after a failure the device may be what failed: do not wait on it
        try:
            _xla.wait_device_ops()
        except Exception as error:  # noqa: BLE001 - the rank's outcome matters more
            warnings.warn(f"hfxla_nb could not wait for the device: {error!r}",
                          RuntimeWarning, stacklevel=2)
    send_snapshot(process, send)


def _send_last_steps(send, fetch: bool) -> None:
    """The last step of each of this thread's bars, where the panel lacks it: progress held
    back by the throttle, and device values no closure fetched (a last step that was not a
    `log_every`-th one). Those are fetched now, all bars' in one transfer: the function has
    returned and its last graph ran (the launcher synced)."""
    bars = list(_thread.bars.values())
    fetched: dict[int, Progress] = {}
    waiting = [bar for bar in bars if bar.unfetched is not None] if fetch else []
    if waiting:
        tensors = [tensor for bar in waiting for tensor in bar.unfetched[2]]
        try:
            values = iter(_xla.to_cpu(tensors))
            for bar in waiting:
                event, names, _ = bar.unfetched
                merged = dict(event.values)
                merged.update({name: float(next(values).detach().float()) for name in names})
                fetched[id(bar)] = dataclasses.replace(event, values=merged)
        except Exception as error:  # noqa: BLE001 - the rank's outcome matters more
            warnings.warn(f"hfxla_nb.report could not fetch the last values: {error!r}",
                          RuntimeWarning, stacklevel=2)
    for bar in bars:
        last = fetched.get(id(bar))
        if bar.pending is not None and (last is None or bar.pending.step != last.step):
            send(bar.pending)
        if last is not None:
            send(last)
        bar.pending = bar.unfetched = None


def recorded() -> dict[str, Any]:
    """What `report` recorded in this process for the current receiver (the launch's channel
    or the `local_events` callback): `{"steps": largest step, "input_shapes": ShapeTracker
    data, "memory": last device memory or None}`."""
    target = _target()
    process = _process
    if target is None or process is None or process.target is not target[0]:
        return {"steps": 0, "input_shapes": {}, "memory": None}
    return {"steps": process.max_step, "input_shapes": process.shapes.data(),
            "memory": process.memory}


@contextmanager
def local_events(callback: Callable[[events.Event], Any]) -> Iterator[None]:
    """Within the block, `report` calls made outside a launched worker go to `callback`.

    This is how code run in the kernel itself (for example under `%%xla_metrics`) can use
    `report`: the same throttling and step closures apply, and `callback` receives the
    `Progress` and `MetricsSnapshot` events on the thread that called `report` (or that ran
    the step closure, i.e. called `torch_xla.sync()`).

    Example:
        ```python
        seen = []
        with local_events(seen.append):
            train_in_kernel()
        ```
    """
    global _local_sink
    previous = _local_sink
    _local_sink = callback
    try:
        yield
    finally:
        _local_sink = previous
