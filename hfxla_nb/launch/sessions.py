"""Warm sessions: worker processes that stay on the devices between cells.

```python
s = hx.session(num_processes=4)
s.run(load_model, "my-folder")       # what a run leaves in the workers stays
s.run(generate, "Once upon a time")  # no fork, no runtime start, no load; cached graphs
s.close()
```

A session forks its workers as `notebook_launcher` does (the supervisor, its ranks, the same
relay, panels, errors and stop button), but its ranks do not run one function and exit: each
waits for the next job on a pipe of its own (`worker.serve_rank`). `Session.run` sends one
job (the function and its arguments, by cloudpickle: a function defined in a later cell
reaches the workers) and watches it like a launch until every rank ended it; the workers
stay. `fine_tune` in a notebook leaves its model warm in one (`FineTuneResult.predict`,
`generate`, `evaluate`; docs/fine-tune.md, "Warm between cells").

One owner of the devices: a session holds them and their memory. Opening a session, a launch
or a `fine_tune` closes the sessions open in this kernel first, each with one muted line. A
crash, the stop button, `timeout=` or a rank left running after another failed ends the
session's workers (what they held is lost); the next run starts new ones and says so. The
kernel's death stops them, as it stops a launch's (`processes.watch_kernel`).
"""

from __future__ import annotations

import atexit
import functools
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._words import duration, plural
from ..events import Channel
from ..observe.reader import LaunchReader
from ..observe.tracking import Tracker
from ..runtime import detect_accelerator
from ..states import Outcome
from ..ui import launch_display
from .launcher import LaunchOptions, keep_record, local_plan, parse_output
from .output import MUTED, PLAIN, NativeRelay
from .preflight import LaunchPlan, LaunchRefusedError, check_function, launch_devices
from .processes import kernel_gains_no_process, stop_group
from .supervision import LaunchRecord, RankRecord, Supervision
from .worker import Job, JobPipes, cell_numbers, code_files, dump_job

# Seconds a closed session's workers have to exit on their own (their job pipes closed)
# before they are stopped.
CLOSE_GRACE = 2.0

__all__ = ["Session", "session", "open_sessions", "close_sessions", "say_notes",
           "SessionInfo"]


@dataclass
class _Workers:
    """The processes of a session, while they live: the supervisor (the group's leader), the
    channel and output pipes they send on, and the write end of each rank's job pipe."""

    channel: Channel
    relay: NativeRelay
    pid: int | None
    group: int
    exit_fd: int | None
    job_pipes: list[int]
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class SessionInfo:
    """What `%xla_info` and `hx.detect()` say of an open session.

    Attributes:
        name: what it is ("session", or "fine_tune's model (<folder>)").
        strategy: "spmd", "replicated" or "debug".
        devices: the ranks (devices) it runs on.
        pids: its processes now.
        runs: jobs run so far.
        idle_seconds: seconds since its last job ended (None while one runs).
        memory: the device memory its last job left in use, in bytes (None where the device
            does not say: XLA on the CPU).
        holds_model: it holds a `fine_tune`'s model (`Session`'s argument).
        idle_timeout: seconds without a run before its workers exit, or None.
    """

    name: str
    strategy: str
    devices: int
    pids: list[int]
    runs: int
    idle_seconds: float | None
    memory: int | None
    holds_model: bool = False
    idle_timeout: float | None = None

    def what(self) -> str:
        """Which session it is, in a few words: "session (spmd on 2 devices, 3 runs)"."""
        return (f"{self.name} ({self.strategy} on {plural(self.devices, 'device')}, "
                f"{plural(self.runs, 'run')})")

    def __str__(self) -> str:
        idle = "running" if self.idle_seconds is None else f"idle {duration(self.idle_seconds)}"
        if self.idle_timeout is not None and self.idle_seconds is not None:
            idle += f" of {duration(self.idle_timeout)} before it is released"
        memory = "" if self.memory is None else f", {self.memory / 2**30:.1f} GiB of device memory"
        return (f"{self.name}: {self.strategy} on {plural(self.devices, 'device')}, "
                f"{plural(self.runs, 'run')}, {idle}{memory} (pids "
                f"{', '.join(map(str, self.pids))})")


_open: list[Session] = []  # the sessions of this kernel whose workers live, oldest first


class Session:
    """Worker processes that keep what they hold on the devices between runs (`hx.session`).

    Args:
        options: how the workers are launched (`LaunchOptions`: `num_processes`, `strategy`,
            `mixed_precision`, `output`, `progress`, `timeout` per run, `heartbeat_timeout`,
            `trace_compiles`, `compile_cache`).
        idle_timeout: seconds a session waits for its next run before its workers exit (None:
            until `close()` or the kernel's end).
        name: what `%xla_info` calls it.
        holds_model: it holds a `fine_tune`'s model (freed by the result's `release()`), not
            what runs of `hx.session` left (freed by the session's `close()`).

    Raises:
        LaunchRefusedError: the launch it would make cannot work (as `notebook_launcher`).
    """

    def __init__(self, options: LaunchOptions, idle_timeout: float | None = None,
                 name: str = "session", holds_model: bool = False) -> None:
        if options.cluster is not None or options.hosts is not None:
            raise LaunchRefusedError(
                "sessions run on this host: a session on a cluster would need one Ray actor "
                "per host held between runs, which hfxla_nb does not build. Use "
                "notebook_launcher(cluster=..., hosts=...) for each run there.")
        if idle_timeout is not None and not idle_timeout > 0:
            raise LaunchRefusedError(
                f"idle_timeout={idle_timeout!r}: pass a number of seconds above 0, or None.")
        self.options = options
        self.idle_timeout = idle_timeout
        self.name = name
        self.holds_model = holds_model
        self.shown_ranks = parse_output(options.output)
        self.plan: LaunchPlan = local_plan(options.strategy, options.num_processes,
                                           options.mixed_precision, options.compile_cache,
                                           options.trace_compiles)
        accelerator = detect_accelerator()
        self.devices = launch_devices(options.num_processes, accelerator.kind,
                                      accelerator.devices)
        self.runs = 0
        self.closed = False
        self.last_record: LaunchRecord | None = None
        self._workers: _Workers | None = None
        self._idle_since: float | None = None
        self._ended: str | None = None  # why the last workers ended, said at the next run
        # The notebook's functions as the workers were forked with them (`_unsendable`).
        self._forked_code: dict[str, Any] = {}

    # -- running ---------------------------------------------------------------------------

    def run(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run `function(*args, **kwargs)` on every rank, as `notebook_launcher` runs it, in
        the session's workers; return rank 0's value.

        The function is called with the rank's index first when it takes one more positional
        argument than given (xmp.spawn style). It and its arguments are pickled (by
        cloudpickle, where installed: a function or class from a later cell goes by value).
        What it leaves in the workers stays for the next run: module state, and the
        notebook's names it sets with `global`.

        Raises:
            LaunchRefusedError: before anything runs: the session is closed, the function
                cannot be called with these arguments, or cannot be pickled.
            LaunchError: a rank failed (its traceback; the session stays usable when every
                rank ended), the run timed out, or the workers died.
            KeyboardInterrupt: the stop button (the session's workers are stopped).
        """
        __tracebackhide__ = True
        value, _ = self.call(function, args, kwargs)
        return value

    def call(self, function: Callable, args: tuple = (), kwargs: dict | None = None,
             tracker: Tracker | None = None,
             progress: bool | str | None = None) -> tuple[Any, LaunchRecord]:
        """`run`, with the run's record (what `fine_tune` and a warm result call).

        Args:
            function, args, kwargs: what every rank runs.
            tracker: follows the run's events (`report_to=`), opened and closed by the
                caller.
            progress: this run's panel (None: the session's `progress=`).
        """
        __tracebackhide__ = True
        kwargs = dict(kwargs or {})
        if self.closed:
            raise LaunchRefusedError(
                f"this {self.name} was closed; open a new one (hx.session(...)).")
        pass_index = check_function(functools.partial(function, **kwargs), tuple(args))
        job = Job(self.runs + 1, function, tuple(args), kwargs, pass_index, cell_numbers(),
                  code_files(function))
        if self._workers is not None and not self.alive:
            self._forget_workers()
        # New workers get their first job by the fork; running ones by a pickle.
        if self._workers is not None:
            refused = _unsendable(function, self._forked_code)
            if refused:
                raise LaunchRefusedError(refused)
        payload = None if self._workers is None else _pickled(job)
        notes = []
        if self._workers is None:
            self._forked_code = _notebook_code()
            if not _has_cloudpickle():
                notes.append(
                    f"hfxla_nb: cloudpickle is not installed: this {self.name}'s later runs "
                    "read the notebook's values as they were now, and a function defined "
                    "or changed after now is refused (pip install \"hfxla_nb[session]\").")
        if self._ended is not None:
            notes.append(f"hfxla_nb: {self._ended}; new workers started for this "
                         f"{self.name} (what the old ones held is gone).")
            self._ended = None
        if self._workers is None:
            notes += close_sessions("for this run", keep=self)
        shown = self.options.progress if progress is None else progress
        say_notes(notes, shown)
        return self._run_job(job, payload, tracker, shown, notes)

    def _run_job(self, job: Job, payload: bytes | None, tracker: Tracker | None,
                 progress: bool | str, notes: list[str]) -> tuple[Any, LaunchRecord]:
        __tracebackhide__ = True
        plan = self.plan
        record = LaunchRecord(plan.strategy, plan.world,
                              [RankRecord(rank) for rank in range(plan.world)],
                              notes=(list(plan.warnings) if self._workers is None else [])
                              + notes,
                              collective_notes=list(plan.collective_notes))
        reader = LaunchReader(record, self.options.timeout, self.options.heartbeat_timeout,
                              follower=tracker.handle if tracker is not None else None)
        display = launch_display(plan.world, progress, reader=reader)
        keep_record(record)
        self.last_record = record
        watch = _SessionRun(reader, display, self.shown_ranks, self.options.timeout,
                            poll_interval=self.options.monitor_interval,
                            relay=self._workers.relay if self._workers else None)
        self._idle_since = None
        self.runs = job.number
        try:
            with kernel_gains_no_process():
                watch.run_job(self, job, payload)
        finally:
            self._idle_since = time.monotonic()
            if watch.usable:
                self._workers = watch.workers
            else:  # stopped by the run's end (or never started)
                # The run's own workers' pipes: new ones are not the session's yet.
                for fd in watch.workers.job_pipes if watch.workers is not None else ():
                    _close(fd)
                self._workers = None
                self._ended = watch.ended_because()
                _forget(self)
        if record.ok:
            return record.value, record
        from .errors import launch_error  # imports torch: only once a run failed

        message = watch.failure_message()
        if self._workers is not None:
            message += (f"\n\nThe {self.name} is still usable: every rank ended, and what the "
                        "workers hold stays.")
        raise launch_error(message, record)

    def _start(self, watch: _SessionRun, first: Job) -> _Workers:
        """Fork the session's workers (by `watch`, the first run's), each rank with the read
        end of its job pipe; the kernel keeps the write ends. `first`, their first job, goes
        by the fork's memory: never pickled (a fine_tune's plan holds its whole data)."""
        pipes = [os.pipe() for _ in range(self.plan.world)]
        writes = [write for _, write in pipes]
        others = tuple(fd for other in _open for fd in (other.job_pipes()))
        channel = Channel()
        env = dict(self.plan.env)
        if self.plan.strategy == "debug":
            env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", "0"
        try:
            watch.fork(channel, env, None, (), False,
                        jobs=JobPipes(tuple(read for read, _ in pipes), self.idle_timeout,
                                      first),
                        closed=(*writes, *others))
        except BaseException:
            for read, write in pipes:
                os.close(read)
                os.close(write)
            channel.close()
            raise
        for read, write in pipes:
            os.close(read)
            os.set_blocking(write, False)
        workers = _Workers(channel, watch.native, watch.pid, watch.group, watch.exit_fd, writes)
        _open.append(self)
        return workers

    # -- state -----------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the session's workers are running now (False before its first run)."""
        workers = self._workers
        if workers is None or workers.pid is None:
            return False
        try:
            pid, _ = os.waitpid(workers.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return pid == 0

    def job_pipes(self) -> list[int]:
        """The write ends of the ranks' job pipes (a new fork must not hold them)."""
        return list(self._workers.job_pipes) if self._workers is not None else []

    def info(self) -> SessionInfo:
        """What `%xla_info` says of this session."""
        from .processes import group_processes

        workers = self._workers
        pids = group_processes(workers.group) if workers is not None else []
        metrics = self.last_record.ranks[0].metrics if (
            self.last_record is not None and self.last_record.ranks) else None
        memory = getattr(metrics, "memory", None) if metrics is not None else None
        used = memory.get("bytes_used") if isinstance(memory, dict) else None
        idle = None if self._idle_since is None else time.monotonic() - self._idle_since
        return SessionInfo(self.name, self.plan.strategy, self.devices, pids, self.runs,
                           idle, used, self.holds_model, self.idle_timeout)

    # -- ending ----------------------------------------------------------------------------

    def close(self) -> None:
        """End the session: its workers exit and free the devices and their memory (what they
        held is gone). Closing a closed session does nothing."""
        self.closed = True
        self._end_workers()

    def _end_workers(self) -> None:
        """Close the job pipes (every rank's loop ends), give the workers `CLOSE_GRACE`
        seconds to exit, then stop what is left of their process group."""
        workers = self._workers
        if workers is None:
            return
        for fd in workers.job_pipes:
            os.close(fd)
        workers.job_pipes = []
        deadline = time.monotonic() + CLOSE_GRACE
        while workers.pid is not None and time.monotonic() < deadline:
            watched = [workers.channel, *workers.relay.fds()] + (
                [workers.exit_fd] if workers.exit_fd is not None else [])
            select.select(watched, [], [], 0.05)
            workers.channel.receive()  # nothing of a closed session is shown
            for fd in workers.relay.fds():
                _discard(fd)
            workers.pid = _reaped(workers.pid)
        stop_group(workers.group, reap=lambda: _reaped(workers.pid))
        if workers.pid is not None:
            try:
                os.waitpid(workers.pid, 0)
            except ChildProcessError:
                pass
        self._forget_workers()

    def _forget_workers(self) -> None:
        """Let go of the workers' descriptors (they exited or were stopped)."""
        workers = self._workers
        if workers is None:
            return
        if workers.pid is not None and _reaped(workers.pid) is None:
            self._ended = "the workers had exited"
            if self.idle_timeout is not None:
                self._ended = (f"the workers exited after {duration(self.idle_timeout)} idle "
                               "(idle_timeout=)")
        for fd in [*workers.job_pipes, *workers.relay.fds()]:
            _close(fd)
        if workers.exit_fd is not None:
            _close(workers.exit_fd)
        workers.channel.close()
        self._workers = None
        _forget(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "warm" if self.alive else "not started"
        return (f"<Session {self.name!r}: {self.plan.strategy} on "
                f"{plural(self.devices, 'device')}, {state}, {plural(self.runs, 'run')}>")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SessionRun(Supervision):
    """One run of a session, watched as a launch is: it ends when every rank ended the job
    (the workers stay) or when the workers died; a run that cannot leave them usable (the
    stop button, `timeout=`, a rank still running after another failed) stops them."""

    usable = False

    workers: _Workers | None = None

    def run_job(self, session: Session, job: Job, payload: bytes | None) -> None:
        """Start the workers if need be (`payload` None: `job` is their first, handed over by
        the fork), send the job, watch it to its end. `usable` then says whether the
        workers stay (else they were stopped)."""
        start = time.monotonic()
        outcome = Outcome.FAILED  # what an exception leaves
        workers = session._workers
        path = None
        try:
            if workers is None:
                workers = session._start(self, job)
            else:
                self.pid, self.group, self.exit_fd = workers.pid, workers.group, workers.exit_fd
                self.record.process_group = workers.group
            self.workers = workers
            if payload is not None:
                path = workers.channel.scratch_path(f"job-{job.number}.pkl")
                with open(path, "wb") as file:
                    file.write(payload)
                for fd in workers.job_pipes:
                    try:
                        os.write(fd, path.encode() + b"\n")
                    except OSError:
                        pass  # that rank is gone: the watch sees its process end
            outcome = self._watch(workers.channel, start)
        except KeyboardInterrupt:
            outcome = Outcome.INTERRUPTED
            raise
        finally:
            self._end(outcome, workers.channel if workers else None, start)
            if path is not None:
                _close_file(path)
            if workers is not None:
                workers.pid = self.pid

    def ended_because(self) -> str:
        """Why the workers ended, for the next run's line."""
        outcome = self.record.outcome
        if outcome == Outcome.INTERRUPTED:
            return "the last run was interrupted and its workers stopped"
        if outcome == Outcome.TIMEOUT:
            return "the last run timed out and its workers were stopped"
        return "the last run's workers ended (see its error)"

    def _exited_and_drained(self, channel: Channel) -> int | None:
        """The supervisor's exit status once it exited; 0 once every rank ended the job (the
        workers stay); None while the job runs."""
        status = super()._exited_and_drained(channel)
        if status is not None:
            return status
        if not any(rank.exit_state.active for rank in self.record.ranks):
            return 0
        return None

    def _end(self, outcome: Outcome, channel: Channel | None, start: float) -> None:
        """End the run as a launch ends (`end_launch`); the workers stay only when every rank
        ended the job and the supervisor lives."""
        from .supervision import end_launch

        self.usable = (channel is not None and outcome in (Outcome.FINISHED, Outcome.FAILED)
                       and self.pid is not None and self._supervisor_exited() is None
                       and not any(rank.exit_state.active for rank in self.record.ranks))
        if channel is None:  # the fork itself failed
            end_launch(self.reader, self.display, outcome, start, interrupted_line="")
            return
        if self.usable:
            end_launch(self.reader, self.display, outcome, start,
                       drain=lambda: self._settle(channel), interrupted_line="")
            return
        where = self.stacks_of_unfinished(outcome)
        end_launch(
            self.reader, self.display, outcome, start,
            stop=self._stop, drain=lambda: self._drain(channel),
            interrupted_line=("hfxla_nb: interrupted; the session's workers were stopped "
                              "(what they held is gone). The next run starts new ones; the "
                              "kernel is ready." + where))

    def _settle(self, channel: Channel) -> None:
        """Apply the events sent by the end of the job and relay the output written by then;
        the channel and the pipes stay open for the next job."""
        for event in channel.receive():
            self._handle(event)
        self._say_library_warnings()
        self.native.settle()


def _has_cloudpickle() -> bool:
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        return False
    return True


def _notebook_code() -> dict[str, Any]:
    """The code object of each function the notebook (`__main__`) defines now."""
    import sys
    import types

    main = sys.modules.get("__main__")
    return {} if main is None else {
        name: value.__code__ for name, value in vars(main).items()
        if isinstance(value, types.FunctionType) and value.__module__ == "__main__"}


def _unsendable(function: Callable, forked: dict[str, Any]) -> str | None:
    """Why a run cannot send `function` to running workers (None: it can). Without
    cloudpickle a notebook function goes by name, and the workers hold the one they were
    forked with: a function defined or changed since would run its old body."""
    if _has_cloudpickle():
        return None
    target = function.func if isinstance(function, functools.partial) else function
    if getattr(target, "__module__", None) != "__main__":
        return None
    if forked.get(getattr(target, "__name__", "")) is getattr(target, "__code__", None):
        return None
    return (f"{getattr(target, '__name__', 'this function')} was defined or changed after this "
            "session's workers started, and without cloudpickle they would run the body they "
            "were started with: pip install \"hfxla_nb[session]\" (then restart the kernel), "
            "or close the session (s.close()) so that the next run starts new workers.")


def _pickled(job: Job) -> bytes:
    """The job as bytes, or a refusal that says what could not be pickled."""
    try:
        return dump_job(job)
    except Exception as error:  # noqa: BLE001 - whatever pickling raised, said plainly
        if _has_cloudpickle():
            hint = ("Pass what the workers can rebuild instead (a folder, a model name, "
                    "plain data), or create the object inside the function.")
        else:
            hint = ("A function or class defined in the notebook needs cloudpickle: "
                    "pip install 'hfxla_nb[session]'.")
        raise LaunchRefusedError(
            f"a session's run sends its function and arguments to the workers, and they "
            f"could not be pickled: {error}. {hint}") from None


def _reaped(pid: int | None) -> int | None:
    """`pid` while it runs; None once it exited (reaped now) or is not a child."""
    if pid is None:
        return None
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return pid if done == 0 else None


def _discard(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _close_file(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _forget(session: Session) -> None:
    if session in _open:
        _open.remove(session)


# -- the sessions of this kernel --

def open_sessions() -> list[SessionInfo]:
    """What each session open in this kernel holds now, oldest first (`%xla_info`)."""
    return [each.info() for each in list(_open) if each.alive]


def close_sessions(why: str, keep: Session | None = None) -> list[str]:
    """Close every session open in this kernel but `keep`; returns one line for each warm
    one, that says so and `why` ("for this launch"): the new run's panel shows them under its
    bars (`say_notes`)."""
    lines = []
    for each in list(_open):
        if each is keep:
            continue
        warm = each.alive
        what = each.info().what() if warm else ""
        each._end_workers()
        each._ended = f"its workers were closed {why}"
        if warm:
            lines.append(f"hfxla_nb: closed the warm {what} {why}: one owner of the "
                         "devices at a time (its next run starts new workers).")
    return lines


def say_notes(lines: list[str], progress: bool | str) -> None:
    """Print `lines`, muted, where no panel shows them under its bars (`progress=False`)."""
    if progress is False:
        for line in lines:
            print(f"{MUTED}{line}{PLAIN}", flush=True)


@atexit.register
def _close_at_exit() -> None:
    """The kernel (or script) is exiting: its sessions' workers exit with it, and their
    scratch folders go (a killed kernel's workers are stopped by `processes.watch_kernel`)."""
    for each in list(_open):
        each.close()


def session(num_processes: int | None = None, strategy: str = "replicated", *,
            mixed_precision: str = "no", output: str = "main", progress: bool | str = "auto",
            timeout: float | None = None, heartbeat_timeout: float | None = None,
            trace_compiles: bool = True, compile_cache: bool | str | os.PathLike | None = None,
            idle_timeout: float | None = None) -> Session:
    """Open a warm session: worker processes that keep what they hold on the devices between
    cells (`s.run(function, ...)`; `s.close()`).

    Args:
        num_processes, strategy, mixed_precision, output, progress, heartbeat_timeout,
            trace_compiles, compile_cache: as `notebook_launcher`'s.
        timeout: seconds after which a run is stopped (with the session's workers).
        idle_timeout: seconds without a run after which the workers exit and free the
            devices (None: they stay until `close()` or the kernel's end).

    Returns:
        The `Session`; its workers start with its first run (after the sessions open in this
        kernel are closed: one owner of the devices).

    Raises:
        LaunchRefusedError: the launch it would make cannot work (as `notebook_launcher`).
    """
    return Session(LaunchOptions(
        num_processes=num_processes, strategy=strategy, mixed_precision=mixed_precision,
        output=output, progress=progress, timeout=timeout, heartbeat_timeout=heartbeat_timeout,
        trace_compiles=trace_compiles, compile_cache=compile_cache), idle_timeout=idle_timeout)
