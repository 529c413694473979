"""Typed messages from workers to the notebook, and the channel that carries them.

Workers never draw: they send small picklable events; the notebook process turns them into
panels from the cell's main thread. One `Channel` per launch.

The channel is a Unix datagram socket pair made before the fork. Every `send` is one atomic
datagram, so any number of forked processes and threads can write to it without a lock (a
lock held by a worker that gets killed would hang every other writer). Payloads too large for
one datagram travel through a temporary file whose path is sent instead.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import select
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

# Well under the default Unix datagram limit (net.core.wmem_default, ~208 KiB).
_MAX_DATAGRAM = 64 * 1024


@dataclass(frozen=True)
class Event:
    """Base class: every event names the rank that sent it (None: the launcher itself)."""

    rank: int | None


@dataclass(frozen=True)
class Started(Event):
    world: int
    pid: int


@dataclass(frozen=True)
class Progress(Event):
    """`step` of `total` done; `values` are plain floats (loss, lr, ...); `samples` counts the
    samples seen so far; `label` names the bar ("train", a tqdm description, ...).

    `late` marks values fetched for an earlier step and sent later (the training loop's loss,
    read on the fetcher's thread): they are not progress, so the bar keeps the values and
    moves neither its step nor its clock (`observe.reader.advance`).

    `waiting` announces a bar that starts later (the evaluation after training): the panels
    draw it from now on, so they keep their height when it starts; its clock starts with its
    next event. `starts` says when, in words ("after training", "every 10 steps"; None:
    "after training").

    `ended` says why the bar ended before its total ("stopped early at step 50 of 120: ...",
    an `EarlyStoppingCallback`): the panels draw it done where it stopped, its total kept."""

    step: int
    total: int | None
    values: dict[str, float] = field(default_factory=dict)
    samples: int | None = None
    label: str = "train"
    time: float = field(default_factory=time.time)
    late: bool = False
    waiting: bool = False
    starts: str | None = None
    ended: str | None = None


@dataclass(frozen=True)
class MetricsSnapshot(Event):
    """torch_xla counters and metrics (see `_xla.metrics_snapshot`) after `step` steps."""

    step: int
    data: dict[str, Any]
    memory: dict[str, int] | None = None
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Compiled(Event):
    """torch_xla's analysis of a worker process's compilations (`observe.tracing`).

    Attributes:
        pid: the process whose compilations these are (rank threads share one).
        records: compilations since the previous `Compiled` of this process
            (`observe.tracing.CompileRecord`, each sent once).
        executions: every execution site so far (`ExecutionSite`: cumulative counts).
        device: what one device of the process has, when known from the hardware:
            `{"memory": bytes, "name": "a v5e chip"}`.
    """

    pid: int
    records: tuple = ()
    executions: tuple = ()
    device: dict[str, Any] | None = None
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Log(Event):
    stream: str  # "stdout" or "stderr"
    text: str


@dataclass(frozen=True)
class Generated(Event):
    """New text of a generation in a launched worker (`hx.generate(..., stream=True)`), sent
    at its early-stop checks (every `check_every` tokens) and at its end: `texts` holds each
    row's text since the last event ("" for none); `step` tokens of at most `total` done;
    `prompts`, in a generation's first event only, each row's prompt as the model read it."""

    step: int
    total: int
    texts: tuple[str, ...]
    done: bool = False
    prompts: tuple[str, ...] = ()

    def shown(self) -> str:
        """The new text as a cell prints it: one prompt's continues its line (ended by a
        newline when done); several prompts' get a line each, `[i] text`."""
        if len(self.texts) == 1:
            return self.texts[0] + ("\n" if self.done else "")
        return "".join(f"[{i}] {piece}\n" for i, piece in enumerate(self.texts) if piece)


@dataclass(frozen=True)
class LibraryWarning(Event):
    """A Python warning whose reported location is a library's, not the user's code
    (`launch.output`): the notebook folds these into one line per kind."""

    category: str  # "FutureWarning"
    message: str
    filename: str
    lineno: int
    package: str  # "transformers"; "Python" for the standard library


@dataclass(frozen=True)
class Finished(Event):
    result: Any
    duration: float = 0.0


@dataclass(frozen=True)
class Failed(Event):
    exc_type: str
    message: str
    traceback: str
    duration: float = 0.0


@dataclass(frozen=True)
class Heartbeat(Event):
    t: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ProcessExited(Event):
    """A worker process ended without reporting (killed by `signal`, or `os._exit(exitcode)`)."""

    pid: int
    exitcode: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class ProcessesStopped(Event):
    """Processes the launch left running (a server, a process in a session of its own, a
    daemon) that the supervisor stopped before it exited: pid -> "sleep 600 (pid 1234)"."""

    processes: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputPipes(Event):
    """A worker process's own pipes for file descriptors 1 and 2: their read ends travel with
    the datagram (SCM_RIGHTS) and arrive in `fds` as (stdout, stderr), then the file its
    stacks are written into where it has one (`launch.stacks`)."""

    pid: int
    fds: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Spilled:
    """A payload too large for a datagram, left in a file for the receiver to read and delete."""

    path: str


class Channel:
    """One-way, many-writer, one-reader event channel between forked processes.

    Make it in the notebook process before forking; workers call `send`, the notebook calls
    `receive`. Closing it in the notebook ends every later `send` with a quiet no-op.
    """

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._reader.setblocking(False)
        self._spill_dir = tempfile.mkdtemp(prefix="hfxla_nb-")

    def scratch_path(self, name: str) -> str:
        """A file path for workers to write to, removed with the channel when the launch ends
        (also when the worker that wrote it was killed)."""
        return os.path.join(self._spill_dir, name)

    def send(self, event: Event) -> None:
        """Send one event (from any worker process or thread). Never raises on a closed channel."""
        try:
            payload = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # noqa: BLE001 - an unpicklable result must not kill a rank
            payload = pickle.dumps(_unpicklable(event, error))
        if len(payload) > _MAX_DATAGRAM:
            try:
                fd, path = tempfile.mkstemp(dir=self._spill_dir, suffix=".pkl")
            except OSError:
                return  # closed: the spill folder is gone with the notebook side's interest
            with os.fdopen(fd, "wb") as file:
                file.write(payload)
            payload = pickle.dumps(_Spilled(path))
        try:
            self._writer.send(payload)
        except OSError:
            pass  # the notebook side is gone: nobody is listening any more

    def try_send(self, event: Event) -> bool:
        """Send a small event only if the channel has room now; whether it was sent (or the
        notebook side is gone: nothing to wait for). Never blocks, never spills to a file."""
        payload = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) > _MAX_DATAGRAM:
            return False
        try:
            self._writer.send(payload, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            pass  # the notebook side is gone: nobody is listening any more
        return True

    def send_fds(self, event: Event, fds: list[int]) -> None:
        """Send a small event with open file descriptors; the receiver gets copies of them in
        the event's `fds` (the sender may close its own right after)."""
        try:
            socket.send_fds(self._writer, [pickle.dumps(event)], fds)
        except OSError:
            pass

    def receive(self, timeout: float = 0.0) -> list[Event]:
        """Every event waiting now, or the first ones to arrive within `timeout` seconds."""
        events: list[Event] = []
        ready, _, _ = select.select([self._reader], [], [], max(timeout, 0.0))
        if not ready:
            return events
        while True:
            try:
                payload, fds, _, _ = socket.recv_fds(self._reader, _MAX_DATAGRAM + 1024, 4)
            except (BlockingIOError, InterruptedError):
                return events
            except OSError:
                return events
            event = pickle.loads(payload)
            if fds:
                event = dataclasses.replace(event, fds=tuple(fds))
            if isinstance(event, _Spilled):
                path = event.path
                with open(path, "rb") as file:
                    event = pickle.load(file)
                os.unlink(path)
            events.append(event)

    def fileno(self) -> int:
        """The reading end, for `select` together with other sources."""
        return self._reader.fileno()

    def close(self) -> None:
        """Close both ends and remove spilled payloads."""
        for sock in (self._reader, self._writer):
            try:
                sock.close()
            except OSError:
                pass
        for name in os.listdir(self._spill_dir) if os.path.isdir(self._spill_dir) else []:
            os.unlink(os.path.join(self._spill_dir, name))
        try:
            os.rmdir(self._spill_dir)
        except OSError:
            pass


def _unpicklable(event: Event, error: Exception) -> Event:
    if isinstance(event, Finished):
        return Failed(
            rank=event.rank,
            exc_type="PicklingError",
            message=(
                f"the function returned a value that cannot be sent back to the notebook "
                f"({type(event.result).__name__}: {error}). Return plain data (numbers, dicts, "
                f"CPU tensors), or save large objects to a file and return its path."
            ),
            traceback="",
            duration=event.duration,
        )
    if isinstance(event, Progress):
        return dataclasses.replace(event, values={})
    return Log(rank=event.rank, stream="stderr", text=f"[hfxla_nb] could not send {event!r}\n")


# ---------------------------------------------------------------------------------------------
# The worker side: which channel and rank the code running in this thread reports to
# ---------------------------------------------------------------------------------------------

_worker_channel: Channel | None = None
_worker_local = threading.local()


def attach_worker(channel: Channel | None, rank: int | None) -> None:
    """Called by the launcher in a worker (process or rank thread) before the user's function."""
    global _worker_channel
    _worker_channel = channel
    _worker_local.rank = rank


def worker_channel() -> Channel | None:
    """The launch's channel when called inside a launched worker, else None."""
    return _worker_channel


def worker_rank() -> int | None:
    """This thread's rank inside a launched worker, else None."""
    return getattr(_worker_local, "rank", None)


def emit(event: Event) -> bool:
    """Send `event` if running inside a launched worker; returns whether it was sent."""
    channel = _worker_channel
    if channel is None:
        return False
    channel.send(event)
    return True
