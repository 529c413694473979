"""What runs inside the forked processes of a launch. Workers never draw.

The launcher forks one *supervisor* into a new session (so one signal to its process group
stops everything it started). The supervisor becomes the worker itself (spmd), runs
`xmp.spawn(..., start_method="fork")` (replicated), or forks one process per rank (debug).
The user's function runs between `Started` and `Finished`/`Failed` events, and a heartbeat
thread shows the process is alive. Every path out of a forked process is `os._exit`:
returning would run the kernel's code in the child.

A forked worker behaves like a script: nothing it does reaches the kernel's sockets. After the
fork it still holds what the notebook imported (the IPython shell, ipykernel's streams,
jupyter_client's session, tqdm's notebook bars), and a forked child cannot use the kernel's
sockets. So, in the worker only: the shell is cleared (`display` prints a text form); the
kernel's stream objects write `Log` events; the session sends nothing (widgets stay silent);
every tqdm bar sends `Progress` events instead of drawing; transformers' Trainer picks its
text progress callback.

Each rank also gets the torch.distributed-style variables (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE), so that accelerate's `PartialState()` knows its indexes: accelerate reads
the local one from `LOCAL_RANK` on XLA devices other than a TPU (-1 when unset). Where a
process runs several rank threads (XLA:CPU, TPU v2/v3), `os.environ` answers these four names
per thread.
"""

from __future__ import annotations

import faulthandler
import functools
import itertools
import math
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _xla, patches
from ..events import (
    Channel,
    Failed,
    Finished,
    ProcessesStopped,
    ProcessExited,
    Progress,
    Started,
    attach_worker,
    worker_rank,
)
from ..observe import metrics, reporting, tracing
from ..observe import tracing as user_frames
from ..runtime import compile_cache
from . import output, processes
from .accelerate import forget_thread_state, gloo_world_for_accelerate
from .output import EventStream, drain_output, route_this_process
from .processes import (
    LEFTOVER_GRACE,
    become_subreaper,
    die_with_parent,
    exit_process,
    rank_ended,
    rank_started,
    start_heartbeat,
    stop_descendants,
    watch_kernel,
)

# -- each rank's torch.distributed variables --

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def rank_variables(rank: int, local_rank: int, world: int,
                   local_world: int | None = None) -> dict[str, str]:
    """The four variables of one rank."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world if local_world is None else local_world)}


def tpu_rank_variables(environ: Mapping[str, str]) -> dict[str, str] | None:
    """A TPU process's variables from those torch_xla sets in each process of `xmp.spawn`
    (`PJRT_LOCAL_PROCESS_RANK`/`_COUNT`, `CLOUD_TPU_TASK_ID`: the process's index in the
    slice, `TPU_PROCESS_BOUNDS`: the slice's processes as a mesh); None where they are not
    set (not a TPU process of xmp.spawn)."""
    local = environ.get("PJRT_LOCAL_PROCESS_RANK")
    if local is None or not local.strip().isdigit():
        return None
    local_rank = int(local)
    local_world = int(environ.get("PJRT_LOCAL_PROCESS_COUNT", "1") or 1)
    task = environ.get("CLOUD_TPU_TASK_ID", "")
    rank = int(task) if task.strip().isdigit() else local_rank
    bounds = environ.get("TPU_PROCESS_BOUNDS", "")
    try:
        world = math.prod(int(dim) for dim in bounds.split(",")) if bounds else local_world
    except ValueError:
        world = local_world
    return rank_variables(rank, local_rank, max(world, rank + 1), local_world)


def set_process_variables(variables: Mapping[str, str]) -> None:
    """The variables of a process that runs exactly one rank."""
    os.environ.update(variables)


class _PerThreadEnviron(dict):
    """`os.environ`'s storage (bytes -> bytes), answering `NAMES` with the calling rank
    thread's own values; every other name, and other threads, as before."""

    local = threading.local()

    def __getitem__(self, key: bytes) -> bytes:
        values = getattr(self.local, "values", None)
        if values is not None and key in values:
            return values[key]
        return super().__getitem__(key)


def set_thread_variables(variables: Mapping[str, str]) -> None:
    """The variables of the calling rank thread (a process running several ranks): Python
    code reading `os.environ` in this thread sees them; the process's own values (the
    first rank's) are what native code and other threads see."""
    storage = getattr(os.environ, "_data", None)
    if not isinstance(storage, dict):  # another Python's os.environ: the process's only
        for name, value in variables.items():
            os.environ.setdefault(name, value)
        return
    if not isinstance(storage, _PerThreadEnviron):
        storage = _PerThreadEnviron(storage)
        os.environ._data = storage  # type: ignore[attr-defined]
    for name, value in variables.items():
        os.environ.setdefault(name, value)  # the names exist for iteration and copies
    _PerThreadEnviron.local.values = {
        os.environ.encodekey(name): os.environ.encodevalue(value)  # type: ignore[attr-defined]
        for name, value in variables.items()}


# -- script mode: nothing reaches the kernel's sockets --

#: A bar reports at most this often (tqdm's own refresh is throttled too); its end always.
BAR_INTERVAL = 0.2


def leave_the_notebook(channel: Channel) -> None:
    """Make this (forked) process a script as far as notebook machinery goes."""
    _forget_shell()
    _route_kernel_streams()
    _silence_kernel_session()
    _bars_become_events(channel)
    _text_progress_for_trainer()


def cell_numbers() -> dict[str, int]:
    """IPython's file name of each notebook cell -> its execution count (`In [5]`), so that a
    frame in a cell can be named "cell 5"; {} outside IPython (IPython 7 puts the count in
    the name itself: `<ipython-input-5-...>`)."""
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    shell = getattr(getattr(shell_module, "InteractiveShell", None), "_instance", None)
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return {str(name): int(count) for name, count in names.items()} if names else {}


def _forget_shell() -> None:
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    if shell_module is not None:
        shell_module.InteractiveShell.clear_instance()


def _route_kernel_streams() -> None:
    """ipykernel's `OutStream`s (held by loggers and libraries since the kernel started)
    write into this process's `sys.stdout` / `sys.stderr` instead of the kernel's socket."""
    iostream = sys.modules.get("ipykernel.iostream")
    if iostream is None:
        return

    def write(self: Any, text: str) -> int:
        target = sys.stderr if getattr(self, "name", "") == "stderr" else sys.stdout
        if isinstance(target, iostream.OutStream):  # never loop back into the kernel
            return len(text)
        return target.write(text)

    iostream.OutStream.write = write
    iostream.OutStream.flush = lambda self: None


def _silence_kernel_session() -> None:
    """Messages to the kernel's sockets (display data, comm and widget messages) are dropped
    before jupyter_client would warn about them."""
    session = sys.modules.get("jupyter_client.session")
    if session is not None:
        session.Session.send = lambda self, *args, **kwargs: None


def _bars_become_events(channel: Channel) -> None:
    """Patch tqdm's classes themselves, so that every bar, including subclasses defined by
    libraries at import time and names bound in notebook cells, sends `Progress` events."""
    try:
        import tqdm.std as std
    except ImportError:
        return
    devnull = open(os.devnull, "w")  # noqa: SIM115 - one for the life of the process
    original_init = std.tqdm.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("display", None)  # tqdm.notebook's own argument
        kwargs["file"] = devnull
        self._hfxla_sent = 0.0
        original_init(self, *args, **kwargs)

    def display(self: Any, msg: str | None = None, pos: int | None = None, **_: Any) -> bool:
        now = time.monotonic()
        finished = self.total is not None and self.n >= self.total
        if not finished and now - getattr(self, "_hfxla_sent", 0.0) < BAR_INTERVAL:
            return True
        self._hfxla_sent = now
        channel.send(_bar_event(self))
        return True

    def close(self: Any) -> None:
        if not getattr(self, "disable", True) and not getattr(self, "_hfxla_closed", False):
            self._hfxla_closed = True
            channel.send(_bar_event(self))
        original_close(self)

    original_close = std.tqdm.close
    std.tqdm.__init__ = __init__
    std.tqdm.display = display
    std.tqdm.close = close
    notebook = sys.modules.get("tqdm.notebook")
    if notebook is not None:
        # The notebook bar would build widgets: it behaves as the (patched) text bar instead.
        for name in ("__init__", "display", "close", "clear", "reset", "__iter__", "update",
                     "__repr__"):
            setattr(notebook.tqdm_notebook, name, getattr(std.tqdm, name))


def _bar_event(bar: Any) -> Progress:
    values = {}
    postfix = getattr(bar, "postfix", None)
    if isinstance(postfix, dict):
        values = {k: float(v) for k, v in postfix.items() if _is_number(v)}
    return Progress(
        rank=worker_rank(),
        step=int(bar.n),
        total=int(bar.total) if bar.total else None,
        values=values,
        label=str(bar.desc or "tqdm").rstrip(": ") or "tqdm",
    )


def _text_progress_for_trainer() -> None:
    """transformers chose `NotebookProgressCallback` at import, in the kernel; in a worker
    it would display HTML nobody sees. Its text callback uses tqdm, which reports events."""
    trainer = sys.modules.get("transformers.trainer")
    callbacks = sys.modules.get("transformers.trainer_callback")
    if trainer is not None and callbacks is not None:
        trainer.DEFAULT_PROGRESS_CALLBACK = callbacks.ProgressCallback


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool)


def finish_like_a_script(failed: bool = False) -> None:
    """What a script's exit does that the worker's `os._exit` skips: a W&B run left open is
    finished, and W&B's service process stopped (W&B's `atexit` hook does both in a script).
    The Trainer's `report_to="wandb"` never finishes its run: without this, the run's data
    was lost with the worker, its service killed with the launch's processes. W&B is not
    imported here: only a worker that imported it has a run to finish."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None)
    if run is None:
        return
    try:
        run.finish(exit_code=1 if failed else 0)
        wandb.teardown()
    except Exception as error:  # noqa: BLE001 - the function's outcome matters more
        print(f"hfxla_nb: could not finish the W&B run: {error!r}", file=sys.stderr)


# -- the worker: ranks, the supervisor and its strategies --

# The notebook's cell file names -> execution counts, read before the shell is cleared.
_cells: dict[str, int] = {}


def prepare_process(channel: Channel, output_fds: tuple[int, int],
                    env: dict[str, str | None]) -> None:
    """Turn a freshly forked process into a worker: output, environment, notebook state."""
    os.dup2(output_fds[0], 1)
    os.dup2(output_fds[1], 2)
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    sys.stdout = EventStream(channel, "stdout", 1)
    sys.stderr = EventStream(channel, "stderr", 2)
    # A crash in native code still leaves a Python traceback in the cell.
    faulthandler.enable(file=os.fdopen(os.dup(2), "w", closefd=False), all_threads=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _avoid_forked_openmp_pool()
    # transformers 5.25 kernelizes a model (hub kernels) at load and at each `train()`/`eval()`
    # for its device; `kernels` knows no "xla" device. Models loaded here or in the notebook
    # before the fork keep transformers' own layers on XLA (hfxla_nb.patches says how).
    patches.keep_hub_kernels_off_xla()
    global _cells
    _cells = cell_numbers()
    leave_the_notebook(channel)


def _avoid_forked_openmp_pool() -> None:
    """Keep torch's CPU ops out of the OpenMP thread pool inherited from the notebook.

    GNU OpenMP is not fork-safe: when the kernel already ran parallel CPU ops (building a
    model, tokenizing into tensors), a forked child hangs in its first parallel region, for
    example inside a CPU-to-XLA copy. PyTorch's DataLoader workers do the same. XLA's own
    computations use XLA's thread pool, not this one.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _run_backward_on_this_thread() -> None:
    """Run autograd's backward passes on the thread that calls them, not on its device threads.

    A backward pass in the notebook before the launch (a quick model trained on the CPU) starts
    the autograd engine's device threads there, with one queue per device the kernel sees: none
    for XLA, whose runtime the kernel never starts. A forked worker inherits that engine, and
    its first backward on an XLA device fails (INTERNAL ASSERT, `device_ready_queues_`).
    Without the engine's threads the backward runs on the caller's thread: the same graph for
    XLA, which only traces it. The setting is per thread, so each rank's thread makes it.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.autograd.set_multithreading_enabled(False)


def run_rank(
    channel: Channel, rank: int, world: int, function: Callable, args: tuple, pass_index: bool,
    keep: bool = False,
) -> Any:
    """Run the user's function as `rank`, reporting its start and its outcome.

    `keep`: the process stays for the next job of a warm session (its compile tracer too)."""
    route_this_process(channel)
    attach_worker(channel, rank)
    output.install(channel)  # after attach: each warning names its rank
    start_heartbeat(channel)
    _run_backward_on_this_thread()
    rank_started(rank)
    compile_cache.start_in_worker(rank)  # before the function's first compilation
    tracing.start_in_worker(channel, rank, _cells)
    reporting.rank_started(rank)
    channel.send(Started(rank=rank, world=world, pid=os.getpid()))
    start = time.monotonic()
    try:
        result = function(rank, *args) if pass_index else function(*args)
    except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        drain_output()  # what it printed arrives before its failure
        # The metrics as they were when it failed, before Failed makes the launcher stop us.
        tracing.rank_ended(rank, keep=keep)
        reporting.rank_ended(rank, failed=True)
        finish_like_a_script(failed=True)
        channel.send(
            Failed(
                rank=rank,
                exc_type=type(error).__name__,
                message=str(error),
                traceback=user_traceback(error),
                duration=time.monotonic() - start,
            )
        )
        return None
    finally:
        rank_ended(rank)
    _run_pending_step_closures()
    compile_cache.finish_in_worker()
    tracing.rank_ended(rank, keep=keep)
    reporting.rank_ended(rank)  # the last rank of this process sends its final metrics
    finish_like_a_script()
    drain_output()
    channel.send(Finished(rank=rank, result=result, duration=time.monotonic() - start))
    return result


def user_traceback(error: BaseException) -> str:
    """`error`'s traceback from the user's function down: the first frame, `run_rank`'s own
    call of the function, is the launcher's and says nothing about the error. Notebook cells
    are named as IPython names them ("Cell In[5], line 12")."""
    frames = error.__traceback__
    text = "".join(traceback.format_exception(type(error), error,
                                              frames.tb_next if frames else None))
    return user_frames.name_cells(text, _cells)


def _run_pending_step_closures() -> None:
    """Run step closures queued after the function's last sync (`report`'s final values)."""
    if not _xla.runtime_is_initialized():
        return  # the function never used XLA: do not start the runtime now
    try:
        _xla.sync()
    except Exception as error:  # noqa: BLE001 - the function's result matters more
        print(f"hfxla_nb: could not run the last step closures: {error}", file=sys.stderr)


# -- a warm session's ranks: one job after another --

@dataclass(frozen=True)
class Job:
    """One `Session.run`: what every rank calls, and the notebook's cells as of now (a frame in
    a cell run after the session started is named by its cell too)."""

    number: int
    function: Callable
    args: tuple
    kwargs: dict
    pass_index: bool
    cells: dict[str, int]
    filenames: dict[str, str] = field(default_factory=dict)  # `code_files`


@dataclass(frozen=True)
class JobPipes:
    """How the ranks of a warm session receive their jobs: one pipe per rank (its read end,
    indexed by rank), and the seconds a rank waits for a job before the session ends (None:
    until the notebook closes it)."""

    fds: tuple[int, ...]
    idle_timeout: float | None = None
    first: Job | None = None  # the first job, handed over by the fork (never pickled)


def code_files(function: Callable) -> dict[str, str]:
    """The file (a notebook cell's name) of a notebook function's code, and of the notebook
    functions it names: cloudpickle sends code as `<dynamic-code>`, and tracebacks and the
    compile trace name cells by these files. "" is the function's own."""
    if not isinstance(function, types.FunctionType) or function.__module__ != "__main__":
        return {}
    files = {"": function.__code__.co_filename}
    for name in function.__code__.co_names:
        value = function.__globals__.get(name)
        if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
            files[name] = value.__code__.co_filename
    return files


def dump_job(job: Job) -> bytes:
    """`job` as bytes, by cloudpickle where it is installed: a function or class defined in a
    notebook cell goes by value (plain pickle names it, and the workers were forked before
    the cell ran).

    Raises:
        pickle.PicklingError, TypeError, AttributeError: what cannot be pickled."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)


def _read_jobs(fd: int, idle_timeout: float | None) -> Iterator[Job]:
    """The jobs the notebook sends on `fd` (each a line `<path>`: the pickled job's file),
    until it closes the pipe or none comes within `idle_timeout` seconds."""
    pending = b""
    while True:
        while b"\n" not in pending:
            ready, _, _ = select.select([fd], [], [], idle_timeout)
            if not ready:
                return  # idle past the limit: the session ends
            chunk = os.read(fd, 4096)
            if not chunk:
                return  # the notebook closed the session
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        with open(line.decode(), "rb") as file:
            yield pickle.load(file)


_job_lock = threading.Lock()
_job_number = 0  # the job this process runs (its rank threads start it once)


def _begin_job(job: Job) -> None:
    """The first rank of this process to start `job` makes its figures start from none, as in
    a new process: XLA's counters, the steps and bars, the compilations and reshards. The
    notebook sends a job only once every rank ended the one before, so no rank is running."""
    global _job_number
    with _job_lock:
        if _job_number == job.number:
            return
        first = _job_number == 0
        _job_number = job.number
        _cells.update(job.cells)
        if first:
            return
        if _xla.runtime_is_initialized():
            _xla.rebase_metrics()
        reporting.new_job()
        tracing.new_job(_cells)
        metrics.new_job()


def _in_file(code: types.CodeType, filename: str) -> types.CodeType:
    """`code`, and the code it defines (nested functions, lambdas), as read from `filename`."""
    consts = tuple(_in_file(const, filename) if isinstance(const, types.CodeType) else const
                   for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _rebuilt(function: types.FunctionType, names: dict[str, Any],
             filename: str | None) -> types.FunctionType:
    """`function` with `names` as its globals, its code read from `filename` when given."""
    code = function.__code__ if filename is None else _in_file(function.__code__, filename)
    rebuilt = types.FunctionType(code, names, function.__name__, function.__defaults__,
                                 function.__closure__)
    rebuilt.__kwdefaults__ = function.__kwdefaults__
    rebuilt.__qualname__ = function.__qualname__
    rebuilt.__dict__.update(function.__dict__)
    return rebuilt


# The notebook names a session's job rebound in this worker (`global x; x = ...`): the next
# jobs read the worker's value, not the notebook's. The values the notebook sent are told
# apart by identity (rank threads of one process each merge their own copy of a job).
_set_by_jobs: set[str] = set()
_sent: set[int] = set()


def in_notebook_namespace(function: Callable, filenames: Mapping[str, str]) -> Callable:
    """A function defined in a notebook cell, as it runs in a session's worker: its globals
    are the worker's copy of the notebook's names, so what one job sets with `global` the next
    one reads. The names the function was sent with (their values in the notebook when the
    run started) join them, as a plain launch would see them, except a name a job rebound in
    the workers: that keeps the job's value. `filenames`: the cells the code was read from
    (`code_files`)."""
    main = sys.modules.get("__main__")
    if (not isinstance(function, types.FunctionType) or function.__module__ != "__main__"
            or main is None or function.__globals__ is vars(main)):
        return function
    names = vars(main)
    for name, value in function.__globals__.items():
        if isinstance(value, types.FunctionType) and name in filenames:
            value = _rebuilt(value, names, filenames[name])
        code = isinstance(value, (types.FunctionType, type, types.ModuleType))
        if code or name not in _set_by_jobs:
            names[name] = value
            _sent.add(id(value))
    return _rebuilt(function, names, filenames.get(""))


def _bindings() -> dict[str, int]:
    """What each notebook name of this worker is bound to now (by identity)."""
    main = sys.modules.get("__main__")
    return {} if main is None else {name: id(value) for name, value in vars(main).items()}


def _note_rebound(before: Mapping[str, int]) -> None:
    """Remember the notebook names a job bound anew since `before` (`_bindings()`)."""
    for name, identity in _bindings().items():
        if before.get(name) != identity and identity not in _sent:
            _set_by_jobs.add(name)


def serve_rank(channel: Channel, rank: int, world: int, jobs: JobPipes) -> None:
    """A warm session's rank: run each job the notebook sends, as `run_rank` runs a launch's
    function, until the notebook closes the session (or it is idle past its limit)."""
    processes.serves_jobs()
    first = [jobs.first] if jobs.first is not None else []
    for job in itertools.chain(first, _read_jobs(jobs.fds[rank], jobs.idle_timeout)):
        _begin_job(job)
        function = in_notebook_namespace(job.function, job.filenames)
        if job.kwargs:
            function = functools.partial(function, **job.kwargs)
        before = _bindings()
        try:
            run_rank(channel, rank, world, function, job.args, job.pass_index, keep=True)
        finally:
            _note_rebound(before)


def _run_ranks(channel: Channel, rank: int, world: int, function: Callable | None,
               args: tuple, pass_index: bool, jobs: JobPipes | None) -> None:
    """A launch's rank runs its function once; a session's serves its jobs."""
    if jobs is None:
        run_rank(channel, rank, world, function, args, pass_index)
    else:
        serve_rank(channel, rank, world, jobs)


# ---------------------------------------------------------------------------------------------
# Strategies: each runs in the supervisor and never returns
# ---------------------------------------------------------------------------------------------

# Set in the supervisor before xmp.spawn forks, so the user's function never has to be
# pickled (closures and lambdas defined in a notebook cannot be).
_replicated_job: tuple | None = None


def _replicated_entry(index: int) -> None:
    channel, world, function, args, pass_index, supervisor, jobs = _replicated_job
    if os.getpid() != supervisor:  # a pool process of xmp.spawn, not the supervisor itself
        die_with_parent(signal.SIGTERM)  # for a supervisor killed (processes.py)
    variables = tpu_rank_variables(os.environ)  # torch_xla's, in a TPU process
    if _xla.process_device_count() == 1:
        set_process_variables(
            variables or rank_variables(_xla.global_ordinal(), index, world))
    else:  # rank threads of one process (XLA:CPU, TPU v2/v3): each has its own
        set_thread_variables(
            rank_variables(_xla.global_ordinal(), index, world))
        forget_thread_state()  # a pool thread may have run another rank before
    _run_ranks(channel, index, world, function, args, pass_index, jobs)


def set_rank_variables(rank: int, local_rank: int, world: int) -> None:
    """The torch.distributed-style variables, for a process that runs exactly one rank.

    accelerate reads LOCAL_RANK on XLA devices other than a TPU (for `accelerator.print`,
    `is_local_main_process`); rank threads sharing one process cannot have one each."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=os.environ.get("LOCAL_WORLD_SIZE", str(world)))


def supervise(
    strategy: str,
    channel: Channel,
    output_fds: tuple[int, int],
    env: dict[str, str],
    world: int,
    function: Callable | None,
    args: tuple,
    pass_index: bool,
    jobs: JobPipes | None = None,
) -> None:
    """Body of the forked supervisor. Ends the process; never returns.

    With `jobs` (a warm session) the ranks run no function of their own: each runs the jobs
    its pipe brings, until the notebook closes them."""
    code = 0
    child_reported: threading.Event | None = None
    try:
        os.setsid()
        # Orphans of the launch become this process's children, whatever session they moved
        # to, so that the end of the launch stops them too (processes.py says why here).
        become_subreaper()
        watch_kernel()  # a kernel that dies takes its launch with it (processes.py)
        prepare_process(channel, output_fds, env)
        if strategy == "spmd":
            _xla.use_spmd()
            metrics.watch(_cells)  # a tensor sharded after use: named by its line
            set_rank_variables(0, 0, 1)
            _run_ranks(channel, 0, world, function, args, pass_index, jobs)
        elif strategy == "replicated":
            global _replicated_job
            _replicated_job = (channel, world, function, args, pass_index, os.getpid(), jobs)
            child_reported = _watch_children(channel)
            _xla.spawn(_replicated_entry)
        else:
            code = _run_debug(channel, world, function, args, pass_index, env, jobs)
    except BaseException as error:  # noqa: BLE001 - report everything, then leave
        if child_reported is not None:
            # xmp.spawn's pool saw a child die (BrokenProcessPool): let the watcher report
            # its signal or exit code before this process exits.
            child_reported.wait(2.0)
        channel.send(
            Failed(
                rank=None,
                exc_type=type(error).__name__,
                message=str(error),
                traceback="".join(traceback.format_exception(error)),
            )
        )
        code = 1
    finally:
        # The notebook stops the launch's group (SIGTERM) as soon as it learns of a failure,
        # which is while this process stops its leftovers: it must not die before naming them
        # (its SIGKILL follows). Ignored for the whole process: a mask is per thread, and a
        # signal sent to the process goes to any thread that does not block it (torch_xla's,
        # the relays'), which then ends the process before it named them (a rare failure
        # under load).
        _ignore_sigterm()
        _stop_leftovers(channel)
        drain_output()
        exit_process(code)


def _ignore_sigterm() -> None:
    """Ignore SIGTERM in every thread of this process (a mask where this is not the main
    thread, which cannot set a handler)."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _stop_leftovers(channel: Channel) -> None:
    """Stop what the launch started that still runs below the supervisor (a server, a
    process in a session of its own, a daemon) and name them to the notebook."""
    try:
        stopped = stop_descendants(grace=LEFTOVER_GRACE)
    except Exception as error:  # noqa: BLE001 - the notebook's stop is the fallback
        print(f"hfxla_nb: could not stop the launch's remaining processes: {error}",
              file=sys.stderr)
        return
    if stopped:
        channel.send(ProcessesStopped(rank=None, processes=stopped))


def _watch_children(channel: Channel) -> threading.Event:
    """Report pool processes of xmp.spawn that die by a signal or `os._exit`.

    The pool reaps its dead child and only raises a bare `BrokenProcessPool`. This thread keeps
    a reference to every multiprocessing child of the supervisor and reads its exit status
    either without reaping it (`waitid(..., WNOWAIT)`) or, when the pool was faster, from the
    `returncode` the pool's reaping stored on the same object, so the notebook learns why.
    Returns an event set once such a death has been reported.
    """
    import multiprocessing.process

    reported = threading.Event()

    def returncode(process) -> int | None:
        """A dead child's return code (negative: the signal), or None while it runs."""
        popen = getattr(process, "_popen", None)
        if popen is None:
            return None
        if popen.returncode is not None:  # already reaped by the pool
            return popen.returncode
        try:
            info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return None  # reaped between the two looks: returncode is set next round
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def watch() -> None:
        """Forever (a daemon), every 0.02 s: note each new multiprocessing child, and send
        one `ProcessExited` (by `_exit_event`) for each that ended, once."""
        watched: dict[int, Any] = {}
        while True:
            for process in list(multiprocessing.process._children):
                watched.setdefault(process.pid, process)
            for pid, process in list(watched.items()):
                code = returncode(process)
                if code is None:
                    continue
                del watched[pid]
                event = _exit_event(pid, code)
                if event is not None:
                    channel.send(event)
                    reported.set()
            time.sleep(0.02)

    threading.Thread(target=watch, name="hfxla_nb-child-watch", daemon=True).start()
    return reported


def _exit_event(pid: int, returncode: int) -> ProcessExited | None:
    """The event for a worker process that ended abnormally (`returncode` as in
    `subprocess`/`multiprocessing`: negative for a signal), or None for a clean exit."""
    if returncode < 0:
        return ProcessExited(rank=None, pid=pid, signal=-returncode)
    if returncode > 0:
        return ProcessExited(rank=None, pid=pid, exitcode=returncode)
    return None


def _run_debug(
    channel: Channel,
    world: int,
    function: Callable,
    args: tuple,
    pass_index: bool,
    env: dict[str, str],
    jobs: JobPipes | None = None,
) -> int:
    """Fork `world` CPU processes joined by a gloo process group; wait for all of them. The
    group's store is this process's (`processes.py`), on the port asked for (`MASTER_PORT`;
    0: a free one), held until the ranks are gone."""
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")  # master_addr / rdzv_endpoint
    # Ranks forked before the store opens: its server thread, running at a fork, left a lock
    # held that the rank's store client waited on forever. The port comes by `ports`.
    ports, port_write = os.pipe()
    pids = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(port_write)
                die_with_parent(signal.SIGTERM)
                set_rank_variables(rank, rank, world)
                route_this_process(channel, rank)  # gloo's own messages carry the rank too
                if (port := processes.read_port(ports)) is None:  # the supervisor says why
                    os._exit(1)
                processes.join_gloo(rank, world, address, port)
                gloo_world_for_accelerate()  # PartialState(): this group, not XLA's 1 process
                _run_ranks(channel, rank, world, function, args, pass_index, jobs)
            except BaseException as error:  # noqa: BLE001
                channel.send(Failed(rank, type(error).__name__, str(error), traceback.format_exc()))
                code = 1
            finally:
                drain_output()
                os._exit(code)
        pids[pid] = rank
    os.close(ports)
    try:
        store = processes.open_store(int(env["MASTER_PORT"]))
    except BaseException:
        os.close(port_write)  # the ranks leave; the error is the launch's
        raise
    os.environ["MASTER_PORT"] = str(store.port)  # the supervisor's (and accelerate's) view
    processes.send_port(port_write, int(store.port), world)
    worst = 0
    while pids:
        pid, status = os.wait()
        if pids.pop(pid, None) is None:
            continue  # an orphan this subreaper adopted: `_stop_leftovers` names it
        event = _exit_event(pid, os.waitstatus_to_exitcode(status))
        if event is not None:
            channel.send(event)
            worst = 1
    return worst
