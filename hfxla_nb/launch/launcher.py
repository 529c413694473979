"""`notebook_launcher`: train on every core from a notebook cell.

A drop-in for `accelerate.notebook_launcher` (same first four parameters), built for
PyTorch/XLA in a notebook; what it guarantees is in docs/launcher.md, how in
docs/architecture.md ("The path of one `notebook_launcher` launch").

Before it forks, the launcher also shows what the train layer hands it besides the launch
panel (`show_memory_plan`). The train layer never renders (pyproject's import-linter
contracts), so its displays go through this layer to `ui`, with the same `progress=` mode.

The first launch in a kernel is as quick as the next ones. `import hfxla_nb` stays cheap
(public names are resolved lazily); in a Jupyter kernel it schedules `warm_up` on the kernel's
event loop, which imports what a launch needs in the kernel (the launcher, its records and
panels, ipywidgets) while the kernel is idle after the importing cell. It runs in the kernel's
main thread: a thread would import while a launch may fork, and a forked child can inherit a
held import lock. It imports modules only: no process, no XLA runtime. A cell run right after
the import cell waits for it, once (about what the first launch would have spent on it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..observe import tracing, tracking
from ..observe.reader import LaunchReader
from ..observe.tracking import Tracker
from ..runtime import compile_cache as cache
from ..runtime import detect
from ..runtime.environment import one_call
from ..states import Outcome
from ..ui import launch_display
from . import preflight
from .accelerate import AccelerateOptions, check_accelerate_options, say_notes
from .preflight import LaunchPlan, LaunchRefusedError
from .processes import kernel_gains_no_process
from .supervision import POLL_INTERVAL, LaunchRecord, RankRecord, Supervision

if TYPE_CHECKING:
    from ..ui.panels import Plan


# -- notebook_launcher and launch --

__all__ = ["notebook_launcher", "launch", "last_launch", "LaunchOptions", "LaunchRecord",
           "RankRecord"]

_last_record: LaunchRecord | None = None


def last_launch() -> LaunchRecord | None:
    """The record of the most recent launch in this process (also after a failure)."""
    return _last_record


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """`notebook_launcher`'s arguments after `function` and `args`, as `launch` takes them.

    Their defaults are written here, once: `notebook_launcher`'s signature reads them, and
    `LaunchOptions(strategy="spmd")` is a launch with `notebook_launcher`'s defaults but one.
    """

    num_processes: int | None = None
    mixed_precision: str = "no"
    use_port: str | int | None = None
    master_addr: str = "127.0.0.1"
    node_rank: int = 0
    num_nodes: int = 1
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_conf: dict | None = None
    rdzv_id: str = "none"
    max_restarts: int = 0
    monitor_interval: float = POLL_INTERVAL
    log_line_prefix_template: str | None = None
    strategy: str = "replicated"
    timeout: float | None = None
    output: str | Iterable[int] = "main"
    progress: bool | str = "auto"
    heartbeat_timeout: float | None = None
    trace_compiles: bool = True
    compile_cache: bool | str | os.PathLike | None = None
    cluster: str | None = None
    hosts: int | None = None
    report_to: str | Sequence[str] | None = None
    log_dir: str | os.PathLike | None = None
    project: str | None = None
    run_name: str | None = None
    hparams: dict[str, Any] | None = None


_DEFAULTS = LaunchOptions()


def notebook_launcher(
    function: Callable,
    args: Sequence = (),
    num_processes: int | None = _DEFAULTS.num_processes,
    mixed_precision: str = _DEFAULTS.mixed_precision,
    use_port: str | int | None = _DEFAULTS.use_port,
    master_addr: str = _DEFAULTS.master_addr,
    node_rank: int = _DEFAULTS.node_rank,
    num_nodes: int = _DEFAULTS.num_nodes,
    rdzv_backend: str = _DEFAULTS.rdzv_backend,
    rdzv_endpoint: str = _DEFAULTS.rdzv_endpoint,
    rdzv_conf: dict | None = _DEFAULTS.rdzv_conf,
    rdzv_id: str = _DEFAULTS.rdzv_id,
    max_restarts: int = _DEFAULTS.max_restarts,
    monitor_interval: float = _DEFAULTS.monitor_interval,
    log_line_prefix_template: str | None = _DEFAULTS.log_line_prefix_template,
    *,
    strategy: str = _DEFAULTS.strategy,
    timeout: float | None = _DEFAULTS.timeout,
    output: str | Iterable[int] = _DEFAULTS.output,
    progress: bool | str = _DEFAULTS.progress,
    heartbeat_timeout: float | None = _DEFAULTS.heartbeat_timeout,
    trace_compiles: bool = _DEFAULTS.trace_compiles,
    compile_cache: bool | str | os.PathLike | None = _DEFAULTS.compile_cache,
    cluster: str | None = _DEFAULTS.cluster,
    hosts: int | None = _DEFAULTS.hosts,
    report_to: str | Sequence[str] | None = _DEFAULTS.report_to,
    log_dir: str | os.PathLike | None = _DEFAULTS.log_dir,
    project: str | None = _DEFAULTS.project,
    run_name: str | None = _DEFAULTS.run_name,
    hparams: dict[str, Any] | None = _DEFAULTS.hparams,
) -> Any:
    """Run `function` on every XLA device from a notebook cell and return rank 0's result.

    Every parameter of `accelerate.notebook_launcher` is accepted, in its order, so
    `from hfxla_nb import notebook_launcher` replaces `from accelerate import
    notebook_launcher` unchanged; this launcher's own options are keyword-only. The
    function is called as `function(index, *args)` when it takes one more positional argument
    than `args` gives (xmp.spawn style), else as `function(*args)` (accelerate style).

    Args:
        function: the training function. Create the model, move it to the device and train
            inside it; the notebook process must not touch the XLA device before the launch.
        args: positional arguments passed after the index.
        num_processes: on a TPU host, None or the number of cores (all are always used); on a
            machine without a TPU, the number of XLA virtual CPU devices (default 1), or of
            processes for `strategy="debug"` (default 2).
        mixed_precision: "no", "bf16" or "fp16" (not on TPU), as accelerate's
            `ACCELERATE_MIXED_PRECISION` in the workers.
        use_port: TCP port of the gloo rendezvous for `strategy="debug"` (default: a free one,
            not accelerate's "29500"); other strategies need none (a one-line note says so).
        master_addr: the address of that rendezvous (`strategy="debug"`).
        node_rank: this host's rank among `num_nodes`; must be 0 here.
        num_nodes: 1: the launch runs on this host (several hosts: `cluster=`, `hosts=`).
        rdzv_backend: accepted for accelerate's code; a single-host fork launch has no
            torchelastic rendezvous ("static" or "c10d": a note says it is ignored).
        rdzv_endpoint: "host:port" of the debug strategy's rendezvous (wins over
            `master_addr`/`use_port`, as with accelerate's static rendezvous).
        rdzv_conf: accepted; ignored with a note (no torchelastic rendezvous).
        rdzv_id: accepted; ignored with a note.
        max_restarts: relaunch the function after a failure (a rank raised, was killed or
            froze), up to this many times: every rank starts again. Each attempt is on
            `last_launch().attempts`; the launch fails when the last one does.
            `timeout=` and the stop button end the call without a restart.
        monitor_interval: seconds between two looks of the launcher at its workers (exits,
            heartbeats, `timeout`); events and output wake it at once anyway.
        log_line_prefix_template: the prefix of each line a rank prints, with torchelastic's
            fields `${rank}`, `${local_rank}`, `${role_name}` (default: `[rank N] ` when
            there are several ranks). Native output keeps its `[rank N]` tag.
        strategy: "replicated", the default (`xmp.spawn`: one process per chip, one thread
            per core on v2/v3 and on the CPU): the function runs once per device, as
            accelerate's launcher and `xmp.spawn` run it, so their code runs unchanged.
            "spmd": the function runs once, in one process over every device with
            `xr.use_spmd()`, and only what it shards runs on every device; `fine_tune` and
            `predict` use it, since they shard their batches themselves. "debug": N forked
            CPU processes joined by a gloo process group, to rehearse multi-process code
            without a TPU.
        timeout: seconds after which every rank is stopped and `LaunchError` names the ranks
            that stalled (per attempt).
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
        cluster: a Ray cluster's address ("host:port", or "auto": the cluster this machine
            belongs to): run the launch on `hosts` of its nodes, each as it runs here, with
            ranks numbered across hosts (docs/pods.md; needs the `[ray]` extra:
            `pip install -e ".[ray]"`).
        hosts: how many hosts (nodes) of `cluster` to run on.
        report_to: "tensorboard", "wandb" or a list of them: the values the function sends
            with `hx.report(...)` (rank 0's), and XLA's compile and transfer counts, written
            from the notebook process (docs/fine-tune.md, "Tracking").
        log_dir: TensorBoard's folder for the run (default `runs/<date-time>_<host>`).
        project: the W&B project (default `WANDB_PROJECT`, else "hfxla_nb").
        run_name: the run's name (W&B's, and TensorBoard's folder under `runs/`).
        hparams: the run's hyper-parameters, for the trackers (`{"lr": 1e-3, ...}`).

    Returns:
        Rank 0's return value. Every rank's value, exit state and duration are on
        `hfxla_nb.last_launch()`.

    Raises:
        LaunchRefusedError: before forking, when the launch cannot work (the XLA runtime is
            already initialized in this kernel, bad arguments, impossible `num_processes`, a
            compile cache folder that other users can write to, an unknown `report_to` or a
            tracker that is not installed).
        LaunchError: when a rank failed, was killed, or the launch timed out (after the
            last attempt). It is also torch's `ChildFailedError`, as accelerate's failures
            are.
        KeyboardInterrupt: after stopping every worker, when the cell was interrupted.
    """
    given = dict(locals())
    __tracebackhide__ = True  # the cell's traceback ends at the user's call (pytest, IPython)
    value, _ = launch(function, args, LaunchOptions(**{
        name: given[name] for name in LaunchOptions.__dataclass_fields__}))
    return value


def launch(function: Callable, args: Sequence, options: LaunchOptions,
           tracker: Tracker | None = None) -> tuple[Any, LaunchRecord]:
    """`notebook_launcher`'s launch, with its record (what `fine_tune` calls).

    Does what `notebook_launcher` does, `last_launch()` included; also returns the record of
    the launch it made, so a caller reads its own launch's record, not the global one.

    Args:
        function: what every rank runs.
        args: its arguments.
        options: the rest of `notebook_launcher`'s arguments (`LaunchOptions(...)`).
        tracker: follows the launch's events for `report_to=`, opened and closed by the
            caller (`fine_tune`'s); None: the one `options` asks for, if any, closed here.

    Returns:
        Rank 0's return value and the launch's `LaunchRecord` (the last attempt's).

    Raises:
        LaunchRefusedError, LaunchError, KeyboardInterrupt: as `notebook_launcher`.
    """
    __tracebackhide__ = True
    given_tracker = tracker is not None
    pass_index = preflight.check_function(function, args)
    preflight.check_timeout(options.timeout)
    if tracker is None:  # the one `options` ask for: refused here, before any fork
        try:
            tracker = tracking.tracker_for(options.report_to, options.log_dir, options.project,
                                           options.run_name, options.hparams)
        except tracking.TrackingError as error:
            raise LaunchRefusedError(str(error)) from None
    # One look at the host for the launch (or for the `fine_tune` / `predict` that calls it):
    # the checks and the plan share it; the next launch looks again.
    with one_call():
        if tracker is not None and not given_tracker:
            with tracking.closed_after(tracker):
                return _launch(function, args, options, pass_index, tracker)
        return _launch(function, args, options, pass_index, tracker)


def _launch(function: Callable, args: Sequence, options: LaunchOptions, pass_index: bool,
            tracker: Tracker | None) -> tuple[Any, LaunchRecord]:
    """`launch` once its function and tracker are known."""
    __tracebackhide__ = True
    shown_ranks = parse_output(options.output)
    pods = options.cluster is not None or options.hosts is not None
    accelerate = check_accelerate_options(
        options.strategy, use_port=options.use_port, master_addr=options.master_addr,
        node_rank=options.node_rank, num_nodes=options.num_nodes,
        rdzv_backend=options.rdzv_backend, rdzv_endpoint=options.rdzv_endpoint,
        rdzv_conf=options.rdzv_conf, rdzv_id=options.rdzv_id,
        max_restarts=options.max_restarts, monitor_interval=options.monitor_interval,
        log_line_prefix_template=options.log_line_prefix_template, cluster=pods)
    say_notes(accelerate, stacklevel=3)
    if pods:
        if accelerate.line_prefix is not None:  # max_restarts works there (launch.pods)
            warnings.warn("hfxla_nb: log_line_prefix_template applies to single-host "
                          "launches; ignored with cluster=/hosts=.", UserWarning,
                          stacklevel=3)
        from .pods import launch_on_cluster

        close_warm_sessions(options.progress)
        return launch_on_cluster(
            function, tuple(args), pass_index, cluster=options.cluster or "auto",
            hosts=options.hosts or 1, strategy=options.strategy,
            num_processes=options.num_processes, mixed_precision=options.mixed_precision,
            use_port=int(options.use_port) if options.use_port else None,
            timeout=options.timeout, shown_ranks=shown_ranks, progress=options.progress,
            heartbeat_timeout=options.heartbeat_timeout,
            trace_compiles=options.trace_compiles, keep_record=keep_record,
            max_restarts=accelerate.max_attempts - 1, tracker=tracker)
    plan = local_plan(options.strategy, options.num_processes, options.mixed_precision,
                      options.compile_cache, options.trace_compiles)
    closed = close_warm_sessions(options.progress)
    plan = dataclasses.replace(plan, warnings=(*plan.warnings, *closed))  # under the bars
    runs = _Attempts(function, tuple(args), pass_index, plan, accelerate, shown_ranks,
                     options.progress, options.timeout, options.heartbeat_timeout, tracker)
    return runs.run()


def local_plan(strategy: str, num_processes: int | None, mixed_precision: str,
               compile_cache: bool | str | os.PathLike | None,
               trace_compiles: bool) -> LaunchPlan:
    """The checks and the plan of a launch on this host: its world and the workers'
    variables (the compile cache's and the compile trace's switch included)."""
    preflight.check_runtime_not_started()
    preflight.check_backend(strategy)
    info = detect()
    preflight.check_environment(info.accelerator, os.environ)
    plan = preflight.plan_launch(strategy, num_processes, mixed_precision,
                                 info.accelerator.kind, info.accelerator.devices,
                                 info.environment)
    env = dict(plan.env)
    env.update(_cache_env(compile_cache, info, strategy))
    env[tracing.SWITCH] = "1" if trace_compiles else "0"
    return LaunchPlan(plan.strategy, plan.world, env, plan.warnings, plan.collective_notes)


class _Attempts:
    """The attempts of one launch on this host: each one watched to its end, a failed one
    relaunched while `max_restarts=` allows, the last failure raised as `LaunchError`."""

    def __init__(self, function: Callable, args: tuple, pass_index: bool, plan: LaunchPlan,
                 options: AccelerateOptions, shown_ranks: set[int] | str,
                 progress: bool | str, timeout: float | None,
                 heartbeat_timeout: float | None, tracker: Tracker | None = None) -> None:
        self.function, self.args, self.pass_index = function, args, pass_index
        self.plan, self.options, self.shown_ranks = plan, options, shown_ranks
        self.progress, self.timeout, self.heartbeat_timeout = progress, timeout, heartbeat_timeout
        self.tracker = tracker

    def run(self) -> tuple[Any, LaunchRecord]:
        """Rank 0's value and the record of the attempt that finished.

        Raises:
            LaunchError: the last attempt failed, timed out or was stopped.
        """
        __tracebackhide__ = True
        attempts = self.options.max_attempts
        earlier: list[LaunchRecord] = []
        while True:
            record, supervision = self._attempt(earlier)
            if record.ok:
                return record.value, record
            message = supervision.failure_message()
            # Only a failure is retried: `timeout=` and the stop button mean "stop".
            if record.outcome != Outcome.FAILED or record.attempt >= attempts:
                break
            print(f"hfxla_nb: attempt {record.attempt} of {attempts} failed "
                  f"({message.splitlines()[0]}); relaunching every rank (max_restarts="
                  f"{attempts - 1}): attempt {record.attempt + 1} of {attempts}.",
                  file=sys.stderr, flush=True)
            earlier.append(record)
        if attempts > 1:
            message += (f"\n\nThat was attempt {record.attempt} of {attempts} "
                        f"(max_restarts={attempts - 1}); every attempt is on "
                        "hfxla_nb.last_launch().attempts.")
        from .errors import launch_error  # imports torch: only once a launch failed

        raise launch_error(message, record)

    def _attempt(self, earlier: list[LaunchRecord]) -> tuple[LaunchRecord, Supervision]:
        """Run one attempt to its end (every process of it gone)."""
        plan, options = self.plan, self.options
        env = dict(plan.env)
        if plan.strategy == "debug":  # 0: the supervisor binds a free port (`processes.py`)
            address, port = options.rendezvous
            env["MASTER_ADDR"] = address
            env["MASTER_PORT"] = str(port or 0)
        record = LaunchRecord(plan.strategy, plan.world,
                              [RankRecord(rank) for rank in range(plan.world)],
                              attempt=len(earlier) + 1, max_attempts=options.max_attempts,
                              previous_attempts=list(earlier),
                              # Under the bars: as a Python warning it would be a red
                              # UserWarning that points at ipykernel's file for the cell.
                              notes=list(plan.warnings),
                              collective_notes=list(plan.collective_notes))
        reader = LaunchReader(record, self.timeout, self.heartbeat_timeout,
                              follower=self.tracker.handle if self.tracker else None)
        # "attempt 2 of 4" in the panel's status line; only passed with restarts
        shown = {"attempt": record.attempt_text} if record.attempt_text else {}
        display = launch_display(plan.world, self.progress, reader=reader, **shown)
        keep_record(record)
        prefix = options.prefix if options.line_prefix is not None else None
        supervision = Supervision(reader, display, self.shown_ranks, self.timeout,
                                  poll_interval=options.monitor_interval, line_prefix=prefix)
        with kernel_gains_no_process():  # inductor's compile workers (launch/processes.py)
            supervision.run(self.function, self.args, self.pass_index, env)
        return record, supervision


def keep_record(record: LaunchRecord) -> None:
    """Make `record` what `last_launch()` returns."""
    global _last_record
    _last_record = record


def close_warm_sessions(progress: bool | str) -> list[str]:
    """Close the warm sessions of this kernel before a launch takes the devices
    (`launch.sessions`); returns a line for each, for the launch's panel (printed, muted,
    without one). A kernel that never opened one never imports that module."""
    sessions = sys.modules.get("hfxla_nb.launch.sessions")
    if sessions is None:
        return []
    lines = sessions.close_sessions("for this launch")
    sessions.say_notes(lines, progress)
    return lines


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


def parse_output(output: str | Iterable[int]) -> set[int] | str:
    if output in ("main", "all", "none"):
        return {0} if output == "main" else output
    try:
        return {int(rank) for rank in output}
    except (TypeError, ValueError):
        raise LaunchRefusedError(
            f"output={output!r}: use 'main' (rank 0), 'all', 'none' or a list of ranks."
        ) from None


# -- what the cell shows before the fork, besides the launch panel --

def show_preparing(progress: str | bool = "auto") -> Any:
    """Show, in a notebook, that a fine-tune is preparing in the kernel (loading, tokenizing),
    from the call's first moment; the memory plan takes its place (`show_memory_plan`).

    Returns:
        The notice drawn, or None (a terminal, `progress=False`).
    """
    from ..ui.panels import show_preparing as show

    return show(progress)


def show_memory_plan(plan: Plan | None, progress: str | bool = "auto", notice: Any = None,
                     prepared: float | None = None) -> Any:
    """Show a fine-tune's memory plan (plain data) in the cell, drawn like the launch panel.

    Args:
        plan: the `MemoryPlan` the run was checked with, or None (nothing is shown).
        progress: the launch's `progress=` mode.
        notice: the preparing line (`show_preparing`), replaced by the plan.
        prepared: the seconds the preparation took, said in the notice's place.

    Returns:
        An object with `close()` to call once the launch ended (a live widget becomes static
        HTML), or None when nothing was drawn.
    """
    from ..ui.panels import show_memory_plan as show

    return show(plan, progress, notice, prepared)


# -- warm-up: what a launch imports, imported while the kernel is idle --

# What the first launch would otherwise import in the kernel, heaviest last (ipywidgets:
# most of it; measured by bench/launch_latency.py).
MODULES = (
    "hfxla_nb.launch.launcher",
    "hfxla_nb.launch.worker",
    "hfxla_nb.ui",
    "hfxla_nb.ui.live",
    "hfxla_nb.ui.panels",
    "ipywidgets",
)
_scheduled = False


def schedule() -> bool:
    """In a running Jupyter kernel, run `warm_up` once the current cell is done (once per
    process); whether it was scheduled (False outside a kernel's cell)."""
    global _scheduled
    if _scheduled or "ipykernel" not in sys.modules:
        return False
    try:
        loop = asyncio.get_running_loop()  # the kernel's, while a cell runs
    except RuntimeError:
        return False
    loop.call_soon(warm_up)
    _scheduled = True
    return True


def warm_up() -> None:
    """Import `MODULES` (one that fails to import is left to the launch to report)."""
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - a warm-up must never break the kernel
            continue
