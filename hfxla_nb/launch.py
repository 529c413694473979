"""`notebook_launcher`: train on every core from a notebook cell.

A drop-in for `accelerate.notebook_launcher` (same first four parameters) that is built for
PyTorch/XLA in a notebook:

- pre-flight checks run before anything is forked, each with a message that says what to do;
- the work runs in a forked supervisor in its own process group (see `worker.py`), so one
  signal stops every process the launch started, and nothing is left running afterwards;
- output, progress and errors of every rank reach the cell, drawn by the notebook process
  from the cell's main thread;
- an error in any rank stops all ranks and raises `LaunchError` with the remote traceback; a
  rank killed by a signal is named with its signal; `timeout` and heartbeats name stalled ranks;
- the kernel's stop button terminates every worker and leaves the kernel usable.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import preflight
from .events import (
    Channel,
    Event,
    Failed,
    Finished,
    Heartbeat,
    Log,
    ProcessExited,
    Progress,
    Started,
)
from .preflight import LaunchRefusedError

__all__ = ["notebook_launcher", "last_launch", "LaunchRecord", "RankRecord", "LaunchError"]

TERMINATE_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
POLL_INTERVAL = 0.1
HEARTBEAT_WARNING = 60.0


@dataclass
class RankRecord:
    """How one rank of a launch went.

    Attributes:
        rank: the rank index.
        pid: the process it ran in (ranks share a process on TPU v2/v3 and XLA:CPU).
        exit_state: "finished", "failed", "killed", "timeout", "interrupted", "stopped"
            (stopped because another rank failed) or "pending" (never started).
        result: the function's return value (finished ranks only).
        error: a one-line description of what went wrong, or None.
        traceback: the remote traceback, when the rank raised.
        duration: seconds from the rank's start to its end.
        last_step: the last step the rank reported, if any.
    """

    rank: int
    pid: int | None = None
    exit_state: str = "pending"
    result: Any = None
    error: str | None = None
    traceback: str = ""
    duration: float = 0.0
    last_step: int | None = None
    last_seen: float = field(default=0.0, repr=False)
    started_at: float = field(default=0.0, repr=False)


@dataclass
class LaunchRecord:
    """Everything about one `notebook_launcher` call (see `last_launch()`).

    Attributes:
        strategy: "replicated", "spmd" or "debug".
        world: number of ranks.
        ranks: one `RankRecord` per rank, in rank order.
        duration: wall-clock seconds of the whole launch.
        outcome: "finished", "failed", "timeout" or "interrupted".
        process_group: the process group of every process the launch started (all gone when
            the launcher returns; `group_processes(process_group)` lists any that are not).
    """

    strategy: str
    world: int
    ranks: list[RankRecord]
    duration: float = 0.0
    outcome: str = "running"
    process_group: int | None = None

    @property
    def ok(self) -> bool:
        """Whether every rank finished."""
        return self.outcome == "finished"

    @property
    def value(self) -> Any:
        """Rank 0's return value (what `notebook_launcher` returns)."""
        return self.ranks[0].result if self.ranks else None

    @property
    def results(self) -> list[Any]:
        """Every rank's return value, in rank order (None where a rank did not finish)."""
        return [rank.result for rank in self.ranks]

    def __str__(self) -> str:
        lines = [
            f"{self.strategy} launch, {self.world} rank(s): {self.outcome} in {self.duration:.1f}s"
        ]
        for rank in self.ranks:
            detail = f" ({rank.error})" if rank.error else ""
            lines.append(f"  rank {rank.rank}: {rank.exit_state}, {rank.duration:.1f}s{detail}")
        return "\n".join(lines)


class LaunchError(RuntimeError):
    """A launched function failed. `record` holds every rank's state; the message carries the
    failing rank, its exception and its remote traceback."""

    def __init__(self, message: str, record: LaunchRecord) -> None:
        super().__init__(message)
        self.record = record


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

    Returns:
        Rank 0's return value. Every rank's value, exit state and duration are on
        `hfxla_nb.last_launch()`.

    Raises:
        LaunchRefusedError: before forking, when the launch cannot work (the XLA runtime is
            already initialized in this kernel, bad arguments, impossible `num_processes`).
        LaunchError: when a rank failed, was killed, or the launch timed out.
        KeyboardInterrupt: after stopping every worker, when the cell was interrupted.
    """
    global _last_record
    pass_index = preflight.check_function(function, args)
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise LaunchRefusedError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    shown_ranks = _parse_output(output)
    preflight.check_runtime_not_started()

    from .runtime import detect

    info = detect()
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
    if strategy == "debug":
        env["MASTER_ADDR"] = "127.0.0.1"
        env["MASTER_PORT"] = str(use_port or _free_port())

    from .ui import launch_display

    display = launch_display(plan.world, progress)
    record = LaunchRecord(strategy, plan.world, [RankRecord(rank) for rank in range(plan.world)])
    _last_record = record
    supervision = _Supervision(record, display, shown_ranks, timeout, heartbeat_timeout)
    supervision.run(function, tuple(args), pass_index, env)
    if record.ok:
        return record.value
    raise LaunchError(supervision.failure_message(), record)


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


class _Supervision:
    """The notebook side of a launch: fork, relay, watch, stop, record. Main thread only."""

    def __init__(self, record, display, shown_ranks, timeout, heartbeat_timeout) -> None:
        self.record = record
        self.display = display
        self.shown_ranks = shown_ranks
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.pid: int | None = None  # the supervisor, until reaped
        self.group: int | None = None  # its process group: every process of the launch
        self.failure: RankRecord | None = None
        self.pid_ranks: dict[int, set[int]] = {}
        self.warned_silent: set[int] = set()
        self.native_output = b""

    # -- running ---------------------------------------------------------------------------

    def run(self, function, args, pass_index, env) -> None:
        from .worker import supervise

        channel = Channel()
        output_read, output_write = os.pipe()
        start = time.monotonic()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the supervisor; supervise() ends with os._exit
                os.close(output_read)
                supervise(
                    self.record.strategy,
                    channel,
                    output_write,
                    env,
                    self.record.world,
                    function,
                    args,
                    pass_index,
                )
            self.pid = self.group = self.record.process_group = pid
            os.close(output_write)
            os.set_blocking(output_read, False)
            self._watch(channel, output_read, start)
        except KeyboardInterrupt:
            self._stop("interrupted")
            self.record.outcome = "interrupted"
            self._finish(channel, output_read, start)
            print(
                f"hfxla_nb: interrupted; every worker process of this launch was stopped "
                f"({self.record.world} rank(s)). The kernel is ready for the next launch.",
                file=sys.stderr,
            )
            raise
        except BaseException:
            self._stop("stopped")
            self._finish(channel, output_read, start)
            raise
        self._finish(channel, output_read, start)

    def _watch(self, channel: Channel, output_read: int, start: float) -> None:
        import select

        last_refresh = 0.0
        while True:
            ready, _, _ = select.select([channel, output_read], [], [], POLL_INTERVAL)
            if output_read in ready:
                self._relay_native(output_read)
            for event in channel.receive():
                self._handle(event)
            now = time.monotonic()
            if now - last_refresh >= 0.25:
                self.display.refresh()
                last_refresh = now
            if self.failure is not None:
                self._stop("stopped")
                self.record.outcome = "failed"
                return
            exited = self._supervisor_exited()
            if exited is not None:
                # Whatever the workers sent before exiting is in the channel now.
                for event in channel.receive(timeout=0.05):
                    self._handle(event)
                if self.failure is None and not self._all_finished():
                    self._mark_unfinished_as_failed(exited)
                self._stop("stopped")  # grandchildren that outlived the supervisor
                self.record.outcome = "finished" if self._all_finished() else "failed"
                return
            if self.timeout is not None and now - start > self.timeout:
                self._stop("timeout")
                self.record.outcome = "timeout"
                return
            self._check_heartbeats(now)

    def _handle(self, event: Event) -> None:
        now = time.monotonic()
        rank_record = self._rank(event.rank)
        if rank_record is not None:
            rank_record.last_seen = now
        if isinstance(event, Log):
            self._print_log(event)
            return
        if isinstance(event, Started) and rank_record is not None:
            rank_record.pid = event.pid
            rank_record.exit_state = "running"
            rank_record.started_at = now
            self.pid_ranks.setdefault(event.pid, set()).add(event.rank)
        elif isinstance(event, Progress) and rank_record is not None:
            if event.label == "train" or rank_record.last_step is None:
                rank_record.last_step = event.step
        elif isinstance(event, Finished) and rank_record is not None:
            rank_record.exit_state = "finished"
            rank_record.result = event.result
            rank_record.duration = event.duration
        elif isinstance(event, Failed):
            self._record_failure(rank_record, event)
        elif isinstance(event, ProcessExited):
            self._record_exit(event)
        elif isinstance(event, Heartbeat):
            pass
        self.display.handle(event)

    def _record_failure(self, rank_record: RankRecord | None, event: Failed) -> None:
        if rank_record is None:  # the supervisor itself failed (e.g. xmp.spawn raised)
            if self.failure is not None:
                return  # the cause was already reported by a rank or a ProcessExited
            rank_record = next((r for r in self.record.ranks if r.exit_state != "finished"), None)
            if rank_record is None:
                return
            if "BrokenProcessPool" in event.exc_type:
                rank_record.exit_state = "killed"
                rank_record.error = (
                    "its process ended abruptly without reporting: a signal (SIGKILL from the "
                    "out-of-memory killer is the usual one: check host memory) or os._exit()"
                )
                self.failure = rank_record
                return
        rank_record.exit_state = "failed"
        rank_record.error = f"{event.exc_type}: {event.message}"
        rank_record.traceback = event.traceback
        rank_record.duration = event.duration
        if self.failure is None:
            self.failure = rank_record

    def _record_exit(self, event: ProcessExited) -> None:
        ranks = self.pid_ranks.get(event.pid)
        if not ranks:
            ranks = {r.rank for r in self.record.ranks if r.exit_state in ("running", "pending")}
        if event.signal is not None:
            name = signal.Signals(event.signal).name
            reason = f"killed by {name}"
            hint = _signal_hint(event.signal)
        else:
            reason = f"exited with code {event.exitcode} before returning"
            hint = "(os._exit() or a native library ended the process)"
        for rank in sorted(ranks):
            rank_record = self._rank(rank)
            if rank_record is None or rank_record.exit_state in ("finished", "failed"):
                continue
            rank_record.exit_state = "killed"
            rank_record.error = f"process {event.pid} {reason} {hint}".strip()
            rank_record.duration = time.monotonic() - (rank_record.started_at or time.monotonic())
            if self.failure is None:
                self.failure = rank_record

    def _mark_unfinished_as_failed(self, status: int) -> None:
        for rank_record in self.record.ranks:
            if rank_record.exit_state in ("running", "pending"):
                rank_record.exit_state = "failed"
                rank_record.error = (
                    f"the rank never reported a result (the launch's supervisor exited with "
                    f"status {status})"
                )
                if self.failure is None:
                    self.failure = rank_record

    def _check_heartbeats(self, now: float) -> None:
        for rank_record in self.record.ranks:
            if rank_record.exit_state != "running":
                continue
            silent = now - rank_record.last_seen
            if self.heartbeat_timeout is not None and silent > self.heartbeat_timeout:
                rank_record.exit_state = "timeout"
                rank_record.error = f"no heartbeat for {silent:.0f}s: the process is frozen"
                self.failure = self.failure or rank_record
            elif silent > HEARTBEAT_WARNING and rank_record.rank not in self.warned_silent:
                self.warned_silent.add(rank_record.rank)
                print(
                    f"hfxla_nb: rank {rank_record.rank} has sent nothing for {silent:.0f}s "
                    "(a long compile, or a frozen process).",
                    file=sys.stderr,
                )

    # -- output ------------------------------------------------------------------------------

    def _print_log(self, event: Log) -> None:
        if self.shown_ranks == "none":
            return
        if (
            event.rank is not None
            and self.shown_ranks != "all"
            and event.rank not in self.shown_ranks
        ):
            return
        stream = sys.stderr if event.stream == "stderr" else sys.stdout
        text = event.text
        if self.record.world > 1 and event.rank is not None:
            prefix = f"[rank {event.rank}] "
            text = "".join(prefix + line for line in text.splitlines(keepends=True))
        stream.write(text)
        stream.flush()

    def _relay_native(self, fd: int) -> None:
        """What native code wrote to file descriptors 1 and 2, whole lines at a time."""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as error:
                if error.errno == errno.EBADF:
                    return
                raise
            if not chunk:
                break
            self.native_output += chunk
        if self.shown_ranks == "none":
            self.native_output = b""
            return
        cut = self.native_output.rfind(b"\n") + 1
        if cut:
            sys.stderr.write(self.native_output[:cut].decode(errors="replace"))
            sys.stderr.flush()
            self.native_output = self.native_output[cut:]

    # -- stopping ----------------------------------------------------------------------------

    def _supervisor_exited(self) -> int | None:
        if self.pid is None:
            return None
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            return None
        self.pid = None
        return os.waitstatus_to_exitcode(status)

    def _stop(self, state: str) -> None:
        """Stop every process of the launch: SIGTERM to its group, then SIGKILL."""
        for rank_record in self.record.ranks:
            if rank_record.exit_state in ("running", "pending"):
                rank_record.exit_state = state
        if self.group is None:
            return
        _signal_group(self.group, signal.SIGTERM)
        deadline = time.monotonic() + TERMINATE_GRACE
        while time.monotonic() < deadline and _group_alive(self.group):
            self._supervisor_exited()
            time.sleep(0.05)
        if _group_alive(self.group):
            _signal_group(self.group, signal.SIGKILL)
        if self.pid is not None:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None

    def _finish(self, channel: Channel, output_read: int, start: float) -> None:
        try:
            self._relay_native(output_read)
            if self.native_output:
                sys.stderr.write(self.native_output.decode(errors="replace") + "\n")
                self.native_output = b""
        finally:
            os.close(output_read)
            channel.close()
        self.record.duration = time.monotonic() - start
        try:
            self.display.close(self.record)
        except Exception as error:  # noqa: BLE001 - a drawing bug must not hide the result
            print(f"hfxla_nb: could not draw the final panel: {error}", file=sys.stderr)

    def _rank(self, rank: int | None) -> RankRecord | None:
        if rank is None or not 0 <= rank < len(self.record.ranks):
            return None
        return self.record.ranks[rank]

    def _all_finished(self) -> bool:
        return all(rank.exit_state == "finished" for rank in self.record.ranks)

    # -- the error the cell raises -------------------------------------------------------------

    def failure_message(self) -> str:
        record = self.record
        if record.outcome == "timeout":
            stalled = [
                f"rank {r.rank} "
                + (f"at step {r.last_step}" if r.last_step is not None else "before its first step")
                for r in record.ranks
                if r.exit_state == "timeout"
            ]
            return (
                f"the launch timed out after {self.timeout:g}s and was stopped. Still running: "
                f"{', '.join(stalled) or 'none'}. Every worker process was terminated."
            )
        failed = self.failure or next((r for r in record.ranks if r.error), None)
        if failed is None:
            return f"the launch ended without a result ({record.outcome})."
        others = [r.rank for r in record.ranks if r.exit_state == "stopped"]
        stopped = f" Ranks {others} were stopped." if others else ""
        message = f"rank {failed.rank} failed: {failed.error}.{stopped}"
        if failed.traceback:
            traceback = failed.traceback.rstrip()
            message += f"\n\nRemote traceback (rank {failed.rank}):\n{traceback}"
        return message


def _signal_hint(number: int) -> str:
    if number == signal.SIGKILL:
        return (
            "- with no traceback this is most often the out-of-memory killer: check host "
            "memory (free -h, dmesg), and lower the batch size or model size"
        )
    if number == signal.SIGSEGV:
        return "- a crash in native code; the traceback printed above shows where"
    if number == signal.SIGABRT:
        return "- a native library aborted; its message is printed above"
    return ""


def _signal_group(group: int, number: int) -> None:
    try:
        os.killpg(group, number)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(group: int) -> bool:
    """Whether any non-zombie process of the process group is still running (from /proc)."""
    return bool(group_processes(group))


def group_processes(group: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `group`, read from /proc."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == group and state not in ("Z", "X"):
            pids.append(int(name))
    return pids
