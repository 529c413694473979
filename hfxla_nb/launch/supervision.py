"""The notebook side of a launch: fork the supervisor, relay its output, watch, stop, record.

Runs on the cell's main thread (ipykernel drops display updates from other threads). What the
events mean for the record is `observe.launch_reader.LaunchReader`'s job; this module moves
bytes and signals.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..events import Channel, Event, Generated, LibraryWarning, Log, OutputPipes
from ..observe.launch_reader import LaunchReader
from ..runtime import compile_cache
from ..states import Outcome
from .failure import failure_message
from .native_output import NativeRelay
from .processes import stop_group
from .watching import LaunchWatch, end_launch, shows

if TYPE_CHECKING:
    from ..ui import LaunchDisplay

POLL_INTERVAL = 0.1


class Supervision(LaunchWatch):
    """One launch, from the kernel: `run()` returns when every process of it is gone."""

    def __init__(self, reader: LaunchReader, display: LaunchDisplay,
                 shown_ranks: set[int] | str, timeout: float | None,
                 poll_interval: float = POLL_INTERVAL,
                 line_prefix: Callable[[int], str] | None = None) -> None:
        """`reader`: the one reader of the launch's events (it holds the record);
        `poll_interval`: the longest wait between two looks at the workers (accelerate's
        `monitor_interval`); `line_prefix`: rank -> the prefix of its printed lines
        (`log_line_prefix_template`), instead of `[rank N] ` when there are several ranks."""
        super().__init__(reader, display, shown_ranks, timeout)
        record = reader.record
        self.poll_interval = poll_interval
        self.line_prefix = line_prefix
        self.pid: int | None = None  # the supervisor, until reaped
        self.group: int | None = None  # its process group: every process of the launch
        self.exit_fd: int | None = None  # readable once the supervisor has exited
        said: dict[str, bool] = {}  # native messages already said once in this launch
        self.native = NativeRelay(
            ranks_of=lambda pid: sorted(self.reader.pid_ranks.get(pid, ())),
            shown=self._shown,
            tagged=record.world > 1,
            rewrite=lambda line: compile_cache.native_line(line, said),
            kept=record.native_log,
        )

    def run(self, function: Callable[..., Any], args: tuple[Any, ...], pass_index: bool,
            env: dict[str, str | None]) -> None:
        """Fork the launch's supervisor, watch it until the launch ends, stop what is left.

        The launch ends in one of three ways; for each, the record's `outcome` is set in one
        place, `_end` (`watching.end_launch`), and the ranks still running end in the state
        `watching.STOPPED_AS` gives it:

        - `_watch` returns it: "finished" (the supervisor exited and every rank finished),
          "failed" (a rank failed, was killed or went silent, or the supervisor exited
          without every rank's result; ranks still running end "stopped") or "timeout"
          (`timeout` passed; ranks still running end "timeout").
        - `KeyboardInterrupt` (the kernel's stop button): "interrupted" (ranks still running
          end "interrupted"); a line tells the user the kernel is ready, and the interrupt
          is raised again.
        - any other exception (the fork failed, a display or relay bug): "failed" (ranks still
          running end "stopped"); the exception is raised again.

        Whichever it is, every process of the launch is stopped (SIGTERM to its process
        group, then SIGKILL) and reaped, the events still queued are applied, and then the
        record gets its duration and every rank's XLA figures and the display draws the final
        panel from it. `run` returns (or raises) when no process of the launch is left.

        Args:
            function: the user's function, run in the forked workers (never pickled).
            args: its arguments.
            pass_index: whether it is called as `function(index, *args)`.
            env: the variables the workers set before torch_xla starts (None: unset it).

        Raises:
            KeyboardInterrupt: the kernel was interrupted (after the launch was stopped).
        """
        from .worker import supervise

        channel = Channel()
        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        start = time.monotonic()
        outcome = Outcome.FAILED  # what an exception leaves
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
            outcome = self._watch(channel, start)
        except KeyboardInterrupt:
            outcome = Outcome.INTERRUPTED
            raise
        finally:
            self._end(outcome, channel, start)

    def failure_message(self) -> str:
        """What the cell's `LaunchError` says (`failure.failure_message`)."""
        return failure_message(self.reader)

    def _watch(self, channel: Channel, start: float) -> Outcome:
        """Relay events and output until the launch ends; return how it ended.

        Each turn waits up to `poll_interval` for an event, native output or the supervisor's
        exit, applies the events to the record and prints the logs, relays the output, then
        ends the turn (`LaunchWatch._turn_end`, as on a cluster): it redraws the panel at most
        every `REFRESH_INTERVAL` and looks for an end, in this order:

        - a failure is known (a `Failed` event, a `ProcessExited` by a signal or an exit code,
          a rank silent past `heartbeat_timeout`): "failed";
        - the supervisor exited: the events its workers sent before are applied; if no
          failure is known, ranks without a result become "failed" ("never reported a
          result"); "finished" when every rank finished, else "failed";
        - `timeout` passed: "timeout".

        Otherwise ranks quiet past `HEARTBEAT_WARNING` are named once on stderr.

        The state changes made here are the ranks' only (through `LaunchReader`): "pending"
        -> "running" on `Started`; -> "finished", "failed" or "killed" on `Finished`,
        `Failed`, `ProcessExited`; "running" or "pending" -> "timeout" past
        `heartbeat_timeout`; -> "failed" when the supervisor exited without their result.
        It neither sets the launch's outcome nor stops a process: `run` does, from the value
        returned. A `KeyboardInterrupt` in the wait goes up to `run` as it is.
        """
        while True:
            exit_fds = [] if self.exit_fd is None else [self.exit_fd]
            ready, _, _ = select.select([channel, *self.native.fds(), *exit_fds], [], [],
                                        self.poll_interval)
            for event in channel.receive():  # first: a process's Started names its output
                self._handle(event)
            for fd in ready:
                if fd is not channel and fd != self.exit_fd:
                    self.native.read(fd)
            outcome = self._turn_end(start, lambda: self._exited_and_drained(channel))
            if outcome is not None:
                return outcome

    def _exited_and_drained(self, channel: Channel) -> int | None:
        """The supervisor's exit status once it exited, with the events its workers sent
        before applied (they are in the channel now: a datagram is queued at the receiver
        when it is sent); None while it runs."""
        exited = self._supervisor_exited()
        if exited is not None:
            for event in channel.receive():
                self._handle(event)
        return exited

    def _handle(self, event: Event) -> None:
        self.reader.handle(event)
        if isinstance(event, Log):
            self._print_log(event)
        elif isinstance(event, LibraryWarning):
            self.record.warnings.append(event)  # said, folded, at the end of the launch
        elif isinstance(event, Generated):
            self._take_generated(event)
        elif isinstance(event, OutputPipes):
            self.native.add_process(event)
        else:
            self.display.handle(event)

    # -- output ------------------------------------------------------------------------------

    def _shown(self, ranks: list[int]) -> bool:
        """Whether output of these ranks reaches the cell ([]: the launcher's own)."""
        return shows(self.shown_ranks, ranks)

    def _print_log(self, event: Log) -> None:
        if not self._shown([] if event.rank is None else [event.rank]):
            return
        stream = sys.stderr if event.stream == "stderr" else sys.stdout
        text = event.text
        prefix = ""
        if event.rank is not None and self.line_prefix is not None:
            prefix = self.line_prefix(event.rank)
        elif self.record.world > 1 and event.rank is not None:
            prefix = f"[rank {event.rank}] "
        if prefix:
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

    def _stop(self) -> None:
        """Stop every process of the launch (SIGTERM to its group, then SIGKILL) and reap the
        supervisor."""
        if self.group is None:
            return
        # Also what left the group (a new session, a daemon): named on the record.
        self.reader.note_stopped(stop_group(self.group, reap=self._supervisor_exited))
        if self.pid is not None:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None

    def _end(self, outcome: Outcome, channel: Channel, start: float) -> None:
        """The one place a launch ends (`watching.end_launch`, as on a cluster): stop what is
        left, set the record's outcome, apply the last events, draw the final panel."""
        end_launch(
            self.reader, self.display, outcome, start,
            stop=self._stop,  # grandchildren that outlived the supervisor too
            drain=lambda: self._drain(channel),
            interrupted_line=("hfxla_nb: interrupted; every worker process of this launch was "
                              "stopped. The kernel is ready for the next launch."),
        )

    def _drain(self, channel: Channel) -> None:
        """Apply the events sent while the launch was stopped, close the channel and the
        output relay."""
        if self.exit_fd is not None:
            os.close(self.exit_fd)
            self.exit_fd = None
        try:
            for event in channel.receive():  # what was sent while the launch was stopped
                self._handle(event)
            self._say_library_warnings()
            self.native.close()
        finally:
            channel.close()


def _exit_descriptor(pid: int) -> int | None:
    """A pidfd for `pid` (Linux 5.3+), so that `select` wakes up the moment it exits; None
    where there is none (the watch loop then sees the exit within `POLL_INTERVAL`)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
