"""The notebook side of a launch: fork the supervisor, relay its output, watch, stop, record.

Runs on the cell's main thread (ipykernel drops display updates from other threads). What the
events mean for the record is `record.RecordKeeper`'s job; this module moves bytes and signals.
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Any

from ..events import Channel, Event, Log, OutputPipes
from ..runtime import compile_cache
from .native_output import NativeRelay
from .processes import stop_group
from .record import LaunchRecord, RecordKeeper

POLL_INTERVAL = 0.1
REFRESH_INTERVAL = 0.25


class Supervision:
    """One launch, from the kernel: `run()` returns when every process of it is gone."""

    def __init__(self, record: LaunchRecord, display: Any, shown_ranks: set[int] | str,
                 timeout: float | None, heartbeat_timeout: float | None) -> None:
        self.record = record
        self.keeper = RecordKeeper(record, timeout, heartbeat_timeout)
        self.display = display
        self.shown_ranks = shown_ranks
        self.timeout = timeout
        self.pid: int | None = None  # the supervisor, until reaped
        self.group: int | None = None  # its process group: every process of the launch
        self.exit_fd: int | None = None  # readable once the supervisor has exited
        said: dict[str, bool] = {}  # native messages already said once in this launch
        self.native = NativeRelay(
            ranks_of=lambda pid: sorted(self.keeper.pid_ranks.get(pid, ())),
            shown=self._shown,
            tagged=record.world > 1,
            rewrite=lambda line: compile_cache.native_line(line, said),
        )

    def run(self, function, args, pass_index, env) -> None:
        from .worker import supervise

        channel = Channel()
        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        start = time.monotonic()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the supervisor; supervise() ends with os._exit
                os.close(out_read)
                os.close(err_read)
                supervise(self.record.strategy, channel, (out_write, err_write), env,
                          self.record.world, function, args, pass_index)
            self.pid = self.group = self.record.process_group = pid
            self.exit_fd = _exit_descriptor(pid)
            os.close(out_write)
            os.close(err_write)
            self.native.add(out_read, "stdout")
            self.native.add(err_read, "stderr")
            self._watch(channel, start)
        except KeyboardInterrupt:
            self._stop("interrupted")
            self.record.outcome = "interrupted"
            self._finish(channel, start)
            print(
                "hfxla_nb: interrupted; every worker process of this launch was stopped. "
                "The kernel is ready for the next launch.",
                file=sys.stderr,
            )
            raise
        except BaseException:
            self._stop("stopped")
            self._finish(channel, start)
            raise
        self._finish(channel, start)

    def failure_message(self) -> str:
        return self.keeper.failure_message()

    def _watch(self, channel: Channel, start: float) -> None:
        last_refresh = 0.0
        while True:
            exit_fds = [] if self.exit_fd is None else [self.exit_fd]
            ready, _, _ = select.select([channel, *self.native.fds(), *exit_fds], [], [],
                                        POLL_INTERVAL)
            for event in channel.receive():  # first: a process's Started names its output
                self._handle(event)
            for fd in ready:
                if fd is not channel and fd != self.exit_fd:
                    self.native.read(fd)
            now = time.monotonic()
            if now - last_refresh >= REFRESH_INTERVAL:
                self.display.refresh()
                last_refresh = now
            if self.keeper.failure is not None:
                self._stop("stopped")
                self.record.outcome = "failed"
                return
            exited = self._supervisor_exited()
            if exited is not None:
                # Whatever the workers sent before exiting is in the channel now (a datagram
                # is queued at the receiver when it is sent).
                for event in channel.receive():
                    self._handle(event)
                if self.keeper.failure is None and not self.keeper.all_finished():
                    self.keeper.mark_unfinished_as_failed(exited)
                self._stop("stopped")  # grandchildren that outlived the supervisor
                self.record.outcome = "finished" if self.keeper.all_finished() else "failed"
                return
            if self.timeout is not None and now - start > self.timeout:
                self._stop("timeout")
                self.record.outcome = "timeout"
                return
            for warning in self.keeper.check_heartbeats(now):
                print(warning, file=sys.stderr)

    def _handle(self, event: Event) -> None:
        self.keeper.handle(event)
        if isinstance(event, Log):
            self._print_log(event)
        elif isinstance(event, OutputPipes):
            self.native.add_process(event)
        else:
            self.display.handle(event)

    # -- output ------------------------------------------------------------------------------

    def _shown(self, ranks: list[int]) -> bool:
        """Whether output of these ranks reaches the cell ([]: the launcher's own)."""
        if self.shown_ranks in ("none", "all"):
            return self.shown_ranks == "all"
        return not ranks or any(rank in self.shown_ranks for rank in ranks)

    def _print_log(self, event: Log) -> None:
        if not self._shown([] if event.rank is None else [event.rank]):
            return
        stream = sys.stderr if event.stream == "stderr" else sys.stdout
        text = event.text
        if self.record.world > 1 and event.rank is not None:
            prefix = f"[rank {event.rank}] "
            text = "".join(prefix + line for line in text.splitlines(keepends=True))
        stream.write(text)
        stream.flush()

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
        self.keeper.mark_stopped(state)
        if self.group is None:
            return
        stop_group(self.group, reap=self._supervisor_exited)
        if self.pid is not None:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None

    def _finish(self, channel: Channel, start: float) -> None:
        if self.exit_fd is not None:
            os.close(self.exit_fd)
            self.exit_fd = None
        try:
            for event in channel.receive():  # what was sent while the launch was stopped
                self._handle(event)
            self.native.close()
        finally:
            channel.close()
        self.record.duration = time.monotonic() - start
        self.keeper.finish()
        try:
            self.display.close(self.record)
        except Exception as error:  # noqa: BLE001 - a drawing bug must not hide the result
            print(f"hfxla_nb: could not draw the final panel: {error}", file=sys.stderr)


def _exit_descriptor(pid: int) -> int | None:
    """A pidfd for `pid` (Linux 5.3+), so that `select` wakes up the moment it exits; None
    where there is none (the watch loop then sees the exit within `POLL_INTERVAL`)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
