"""What a launch's processes write, brought to the cell: prints, warnings, native output.

- Prints: a worker's `sys.stdout` and `sys.stderr` become `EventStream`s, which send whole
  lines as `Log` events tagged with the rank of the writing thread. `LogSender` sends a line at
  once while the channel has room; when it is full, lines queue in the process and one thread
  sends them as a few large `Log` events (`BATCH_CHARS`), so a chatty function is never paced
  by the cell's output. No line is dropped or cut, each rank's lines stay in order, and memory
  stays bounded (`MAX_QUEUED_CHARS`). Lines still queued when a process is killed are lost, as
  a pipe's buffer is; every normal way out of a worker calls `drain()` first.
- Warnings of libraries the user did not call (located in site-packages or the standard
  library: the user cannot act on where they point) go to the notebook as `LibraryWarning`
  events, kept on the record and said once per kind with a count (`folded_lines`).
- Native output (file descriptors 1 and 2): each process gets its own pipes, whose read ends
  the notebook holds, so what a process wrote just before a crash is still read after it
  died. `NativeRelay` writes whole lines tagged with the process's ranks. XLA's C++ log lines
  are folded: notices and warnings are said at the end of the launch, one line per kind with
  its count; errors are written at once. Every such line is kept (`native_log`).
- `quiet_loading`: library progress bars kept out of the cell while hfxla_nb loads a model in
  the kernel; the user's own `from_pretrained` calls keep theirs.
"""

from __future__ import annotations

import errno
import faulthandler
import io
import os
import re
import sys
import sysconfig
import textwrap
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TextIO

from ..events import Channel, LibraryWarning, Log, OutputPipes, worker_rank
from . import stacks

# -- a process's Log events, sent in order and batched --

# Text per batched `Log`: one datagram once pickled (the channel's limit is 64 KiB).
BATCH_CHARS = 32 * 1024
# Text a process may queue before its writers wait for the notebook.
MAX_QUEUED_CHARS = 8 * 1024 * 1024


class LogSender:
    """The `Log` events of one process: sent at once, or queued and batched while the channel
    is full. Make one per process (`for_process`); any thread of it may call `send`."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: list[tuple[int | None, str, list[str]]] = []  # (rank, stream, texts)
        self._queued_chars = 0
        self._batch_chars = 0  # of the queue's last entry
        self._sending = False  # the sender thread holds a batch taken off the queue
        self._thread: threading.Thread | None = None

    def send(self, rank: int | None, stream: str, text: str) -> None:
        """Send `text` (whole lines, or what the writer flushed) as `rank`'s output on
        `stream` ("stdout" or "stderr"), after everything this process sent before."""
        with self._lock:
            if not self._queue and not self._sending and self._channel.try_send(
                    Log(rank=rank, stream=stream, text=text)):
                return
            while self._queued_chars >= MAX_QUEUED_CHARS:
                self._changed.wait(1.0)
            last = self._queue[-1] if self._queue else None
            if (last is not None and last[0] == rank and last[1] == stream
                    and self._batch_chars + len(text) <= BATCH_CHARS):
                last[2].append(text)
                self._batch_chars += len(text)
            else:
                self._queue.append((rank, stream, [text]))
                self._batch_chars = len(text)
            self._queued_chars += len(text)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hfxla_nb-log-sender",
                                                daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every queued line was handed to the channel (at most `timeout` s: a
        notebook that stopped reading must not hold a worker forever); whether it was."""
        with self._lock:
            return self._changed.wait_for(lambda: not self._queue and not self._sending,
                                          timeout)

    def _run(self) -> None:
        """The sender thread, forever (a daemon): wait for queued lines, take the whole queue
        (writers waiting for room go on) and send one `Log` per entry of it (a run of one
        rank's lines on one stream, up to `BATCH_CHARS`), in order; `drain` learns when
        nothing is queued or being sent."""
        while True:
            with self._lock:
                self._changed.wait_for(lambda: bool(self._queue))
                batch, self._queue = self._queue, []
                self._queued_chars = self._batch_chars = 0
                self._sending = True
                self._changed.notify_all()  # writers waiting for room
            try:
                for rank, stream, texts in batch:
                    self._channel.send(Log(rank=rank, stream=stream, text="".join(texts)))
            finally:
                with self._lock:
                    self._sending = False
                    self._changed.notify_all()


_sender: LogSender | None = None
_sender_pid: int | None = None
_sender_lock = threading.Lock()


def for_process(channel: Channel) -> LogSender:
    """This process's sender for `channel` (a forked child gets its own: a parent's thread,
    lock and queue do not survive a fork)."""
    global _sender, _sender_pid
    with _sender_lock:
        if _sender is None or _sender_pid != os.getpid() or _sender._channel is not channel:
            _sender, _sender_pid = LogSender(channel), os.getpid()
        return _sender


def drain() -> None:
    """Wait until this process's queued output was sent (before its last events or its exit)."""
    sender = _sender
    if sender is not None and _sender_pid == os.getpid():
        sender.drain()


def _after_fork_in_child() -> None:
    # The lock may have been held by a parent's thread at the fork: a child starts afresh.
    global _sender, _sender_pid, _sender_lock
    _sender, _sender_pid, _sender_lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- a worker's stdout and stderr as Log events --

class EventStream(io.TextIOBase):
    """A text stream that sends what a worker prints to the notebook, in whole lines.

    Partial lines wait for their newline or an explicit `flush()` (tqdm and `print(...,
    flush=True)` flush), per thread, so lines from rank threads never interleave. Whole
    lines go to this process's `LogSender`, which sends them at once or, while the
    notebook catches up, in batches: `flush()` never waits for the notebook (a logging
    handler flushes every record); `drain_output()` does, before a rank's last events.
    """

    def __init__(self, channel: Channel, name: str, fd: int) -> None:
        super().__init__()
        self._channel = channel
        self._name = name
        self._fd = fd
        self._local = threading.local()

    @property
    def name(self) -> str:
        return f"<hfxla_nb {self._name}>"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        # faulthandler and subprocess need a real descriptor: the pipe the notebook reads.
        return self._fd

    def write(self, text: str) -> int:
        buffer = getattr(self._local, "buffer", "") + text
        cut = buffer.rfind("\n") + 1
        if cut:
            self._send(buffer[:cut])
            buffer = buffer[cut:]
        self._local.buffer = buffer
        return len(text)

    def flush(self) -> None:
        buffer = getattr(self._local, "buffer", "")
        if buffer:
            self._local.buffer = ""
            self._send(buffer)

    def _send(self, text: str) -> None:
        for_process(self._channel).send(worker_rank(), self._name, text)


def drain_output() -> None:
    """Hand every partial line of this thread to the sender and wait until this process's
    output was sent: before `Finished`/`Failed` and before the process exits."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream: nothing to send
            pass
    drain()


# -- library warnings, folded into one line per kind --

# Folders whose files are libraries' code, not the user's.
LIBRARY_FOLDERS = ("site-packages", "dist-packages")
# Characters of a warning's message shown on its folded line.
MESSAGE_WIDTH = 100
# The package a standard library location is named as.
STANDARD_LIBRARY = "Python"


def _standard_library() -> str:
    return str(PurePath(sysconfig.get_paths()["stdlib"]))


def library_package(filename: str) -> str | None:
    """The library a warning's location belongs to ("transformers"; `STANDARD_LIBRARY` for the
    standard library), or None when it is the user's code (a cell, any other file)."""
    parts = PurePath(filename).parts
    for index, part in enumerate(parts):
        if part in LIBRARY_FOLDERS:
            top = parts[index + 1] if index + 1 < len(parts) else part
            # `six.py` is the package `six`; `torch/nn/modules/module.py` is `torch`.
            return top[:-3] if top.endswith(".py") else top
    stdlib = _standard_library()
    if filename.startswith(stdlib + "/"):
        return STANDARD_LIBRARY
    return None


def install(channel: Channel) -> None:
    """Send this process's library warnings to the notebook (in a worker; workers never draw).

    Python's filters still decide which warnings are issued at all; only where an issued one
    goes changes. A warning of the user's own code goes to Python's own `showwarning`."""
    shown = warnings.showwarning
    if getattr(shown, "_hfxla_nb", False):
        return  # already installed in this process (a forked child inherits it)

    def showwarning(message: Warning | str, category: type[Warning], filename: str,
                    lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
        package = library_package(str(filename))
        if package is None or file is not None:  # the user's, or written to a file on purpose
            shown(message, category, filename, lineno, file, line)
            return
        channel.send(LibraryWarning(rank=worker_rank(), category=category.__name__,
                                    message=str(message), filename=str(filename),
                                    lineno=int(lineno), package=package))

    showwarning._hfxla_nb = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning


def first_line(message: str) -> str:
    """The message's first line, cut at a space to `MESSAGE_WIDTH` characters (a cell line
    that the browser need not wrap)."""
    lines = message.strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) <= MESSAGE_WIDTH and len(lines) <= 1:
        return text
    cut = text[:MESSAGE_WIDTH].rsplit(" ", 1)[0] if len(text) > MESSAGE_WIDTH else text
    return cut + " …"


# ANSI faint: a folded library warning is muted.
MUTED, PLAIN = "\x1b[2m", "\x1b[0m"


def folded_lines(caught: Sequence[LibraryWarning],
                 shown: Callable[[int | None], bool] = lambda rank: True) -> list[str]:
    """One line per kind of library warning (package, category, message), in the order each
    kind first came, with how many times it came from the ranks `shown` lets through:
    "transformers FutureWarning ×2: `x` is deprecated … (hx.last_launch().warnings has them
    all)"."""
    counts: dict[tuple[str, str, str], int] = {}
    for warning in caught:
        if shown(warning.rank):
            key = (warning.package, warning.category, warning.message)
            counts[key] = counts.get(key, 0) + 1
    return [f"{package} {category} ×{count}: {first_line(message)} "
            "(hx.last_launch().warnings has them all)"
            for (package, category, message), count in counts.items()]


def print_folded(caught: Sequence[LibraryWarning],
                 shown: Callable[[int | None], bool] = lambda rank: True) -> None:
    """Write `folded_lines` to stderr, muted (ANSI faint): the user's own output stays as it
    is, the libraries' is one quiet line per kind. On one host and on a cluster alike."""
    lines = folded_lines(caught, shown)
    if lines:
        sys.stderr.write("".join(f"{MUTED}{line}{PLAIN}\n" for line in lines))
        sys.stderr.flush()


# -- native output: file descriptors 1 and 2, relayed per process --

_routed_pid: int | None = None

# A C++ log line of XLA, TSL or torch_xla: `2026-12-01 22:15:33.746046: W external/xla/...
# sharding_propagation.cc:3120] text` (TSL) or `W1201 22:15:33.746046  123 file.cc:45] text`
# (absl/glog).
XLA_LOG_LINE = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<tsl>[IWEF]) "
    r"|(?P<absl>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ )"
    r"(?P<source>\S+:\d+)\] (?P<text>.*)$")
SEVERITY_WORDS = {"I": "message", "W": "warning", "E": "error", "F": "fatal error"}
# Severities said at the launch's end, one folded line per kind; errors are written at once.
HELD = ("I", "W")
# Width at which a folded log line is wrapped (at spaces only), so the browser never has to.
WRAP_WIDTH = 100
# Lines kept verbatim on the record (a runaway logger must not fill the kernel's memory).
KEPT_MAX = 10_000
_route_lock = threading.Lock()


def route_this_process(channel: Channel, rank: int | None = None) -> None:
    """Give this process its own pipes for fds 1 and 2 (once per process, any thread).

    `rank` names the process's rank until its `Started` event says which ranks it runs."""
    global _routed_pid
    with _route_lock:
        if _routed_pid == os.getpid():
            return
        _routed_pid = os.getpid()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        stack_fd = stacks.register()  # where this process is, when the notebook asks
        channel.send_fds(OutputPipes(rank=rank, pid=os.getpid()),
                         [out_read, err_read] + ([] if stack_fd is None else [stack_fd]))
        os.dup2(out_write, 1)
        os.dup2(err_write, 2)
        for fd in (out_read, err_read, out_write, err_write):
            os.close(fd)
        # A crash in native code still leaves a traceback, now on this process's own pipe.
        faulthandler.enable(file=os.fdopen(os.dup(2), "w", closefd=False), all_threads=True)


@dataclass
class _Pipe:
    stream: str  # "stdout" or "stderr"
    pid: int | None  # None: the launch's shared pipe
    rank: int | None = None  # the process's rank as it said when handing the pipe over
    pending: bytes = field(default=b"", repr=False)


class NativeRelay:
    """The notebook's end of every native-output pipe of one launch.

    Args:
        ranks_of: pid -> the ranks that process runs (known once it sent `Started`).
        shown: whether output of these ranks reaches the cell (`output=`); called with [] for
            a process whose ranks are not known.
        tagged: whether lines get a rank tag (more than one rank in the launch).
        rewrite: each line -> the line to write instead, or None to drop it (known noise of
            native libraries said once in plain words).
        kept: where every XLA C++ log line shown is kept verbatim (the record's
            `native_log`); a new list when not given.
    """

    def __init__(self, ranks_of: Callable[[int], list[int]],
                 shown: Callable[[list[int]], bool], tagged: bool,
                 rewrite: Callable[[str], str | None] | None = None,
                 kept: list[str] | None = None) -> None:
        self.pipes: dict[int, _Pipe] = {}
        self.stack_files: dict[int, int] = {}  # pid -> its stacks' file (`launch.stacks`)
        # (severity, source, text) of each XLA log line -> [times seen, stream, the tag of
        # every process that wrote it]
        self.repeats: dict[tuple[str, str, str], list] = {}
        self.follow(ranks_of, shown, tagged, rewrite, kept)

    def follow(self, ranks_of: Callable[[int], list[int]],
               shown: Callable[[list[int]], bool], tagged: bool,
               rewrite: Callable[[str], str | None] | None = None,
               kept: list[str] | None = None) -> None:
        """Relay for a launch (the arguments are the class's): for a warm session's next job,
        the same pipes of the same processes, with the new job's record."""
        self.ranks_of = ranks_of
        self.shown = shown
        self.tagged = tagged
        self.rewrite = rewrite
        self.kept: list[str] = [] if kept is None else kept

    def add(self, fd: int, stream: str, pid: int | None = None, rank: int | None = None) -> None:
        os.set_blocking(fd, False)
        self.pipes[fd] = _Pipe(stream, pid, rank)

    def add_process(self, event: OutputPipes) -> None:
        stdout_fd, stderr_fd, *stack_fd = event.fds
        self.add(stdout_fd, "stdout", event.pid, event.rank)
        self.add(stderr_fd, "stderr", event.pid, event.rank)
        if stack_fd:
            self.stack_files[event.pid] = stack_fd[0]

    def fds(self) -> list[int]:
        return list(self.pipes)

    def read(self, fd: int) -> None:
        """Read what is there; write its whole lines; close the pipe at its end."""
        pipe = self.pipes.get(fd)
        if pipe is None:
            return
        ended = False
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as error:
                if error.errno != errno.EBADF:
                    raise
                ended = True
                break
            if not chunk:
                ended = True
                break
            pipe.pending += chunk
        cut = pipe.pending.rfind(b"\n") + 1
        if cut:
            self._write(pipe, pipe.pending[:cut])
            pipe.pending = pipe.pending[cut:]
        if ended:
            self._close(fd)

    def close(self) -> None:
        """Read what is left in every pipe, write it (a last partial line too), close them;
        then say each XLA notice and warning once, muted, with its count, and how many more
        times each XLA error came."""
        for fd in list(self.pipes):
            self.read(fd)
            if fd in self.pipes:
                self._close(fd)
        for fd in self.stack_files.values():
            os.close(fd)
        self.stack_files.clear()
        self._say_repeats()

    def settle(self) -> None:
        """What `close` says, with the pipes left open: a warm session's job ended, and its
        processes stay for the next one."""
        for fd in list(self.pipes):
            self.read(fd)
        self._say_repeats()

    def _say_repeats(self) -> None:
        for (severity, source, text), (count, stream, tags) in self.repeats.items():
            tag = tags[0] if len(tags) == 1 else ""  # several processes: none is the one
            if severity in HELD:
                source_file = source.rsplit("/", 1)[-1]
                line = (f"{tag} " if tag else "") + (
                    f"XLA {SEVERITY_WORDS[severity]} ×{count} ({source_file}): "
                    f"{first_line(text)} (hx.last_launch().native_log has them all)")
                # Wrapped at spaces, as an error is: the browser would break it mid-word.
                wrapped = textwrap.wrap(line, WRAP_WIDTH, subsequent_indent="    ",
                                        break_long_words=False, break_on_hyphens=False)
                self._emit("stderr", "".join(f"{MUTED}{part}{PLAIN}\n" for part in wrapped))
            elif count > 1:
                more = "time" if count == 2 else "times"
                line = (f"(the same XLA {SEVERITY_WORDS[severity]} {count - 1} more {more}; "
                        "all on hx.last_launch().native_log)\n")
                self._emit(stream, f"{tag} {line}" if tag else line)
        self.repeats.clear()

    def _close(self, fd: int) -> None:
        pipe = self.pipes.pop(fd)
        if pipe.pending:
            self._write(pipe, pipe.pending + b"\n")
        try:
            os.close(fd)
        except OSError:
            pass

    def _write(self, pipe: _Pipe, data: bytes) -> None:
        ranks = self.ranks_of(pipe.pid) if pipe.pid is not None else []
        if not ranks and pipe.rank is not None:
            ranks = [pipe.rank]
        if not self.shown(ranks):
            return
        text = data.decode(errors="replace")
        if self.rewrite is not None:
            rewritten = (self.rewrite(line) for line in text.splitlines(keepends=True))
            text = "".join(line for line in rewritten if line is not None)
            if not text:
                return
        tag = _tag(ranks, pipe.pid) if self.tagged and pipe.pid is not None else ""
        text = "".join(self._fold(line, pipe.stream, tag)
                       for line in text.splitlines(keepends=True))
        if text:
            self._emit(pipe.stream, text)

    def _fold(self, line: str, stream: str, tag: str) -> str:
        """What to write for one line: nothing for an XLA notice or warning (counted, said at
        the end); an XLA error the first time, wrapped at spaces, nothing when it repeats
        (counted); any other line as it is. Tagged when `tag`."""
        match = XLA_LOG_LINE.match(line.rstrip("\n"))
        if match is None:
            return f"{tag} {line}" if tag else line
        if len(self.kept) < KEPT_MAX:
            self.kept.append(line.rstrip("\n"))
        severity = match.group("tsl") or match.group("absl")
        key = (severity, match.group("source"), match.group("text"))
        seen = self.repeats.get(key)
        if seen is not None:
            seen[0] += 1
            if tag not in seen[2]:
                seen[2].append(tag)
            return ""
        self.repeats[key] = [1, stream, [tag]]
        if severity in HELD:
            return ""  # said once, folded, at the launch's end (`close`)
        indent = " " * (len(tag) + 5) if tag else "    "
        wrapped = textwrap.wrap(line.rstrip("\n"), WRAP_WIDTH, subsequent_indent=indent,
                                break_long_words=False, break_on_hyphens=False)
        lines = wrapped or [line.rstrip("\n")]
        if tag:
            lines[0] = f"{tag} {lines[0]}"
        return "\n".join(lines) + "\n"

    @staticmethod
    def _emit(stream: str, text: str) -> None:
        target = sys.stderr if stream == "stderr" else sys.stdout
        target.write(text)
        target.flush()


def _tag(ranks: list[int], pid: int) -> str:
    """`[rank 2]`, `[ranks 0-3]` (rank threads of one process), or `[pid 1234]` when unknown."""
    if len(ranks) == 1:
        return f"[rank {ranks[0]}]"
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"[ranks {ranks[0]}-{ranks[-1]}]"
    if ranks:
        return "[ranks " + ",".join(map(str, ranks)) + "]"
    return f"[pid {pid}]"


# -- library progress bars kept out of the cell --

@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' and huggingface_hub's progress bars off within the block, each restored
    to its own state after it (even when the block raises)."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from huggingface_hub.utils import disable_progress_bars as hub_disable
    from huggingface_hub.utils import enable_progress_bars as hub_enable
    from transformers.utils import logging as hf_logging

    transformers_on = hf_logging.is_progress_bar_enabled()
    hub_on = not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # also turns the hub's bars off
    try:
        yield
    finally:
        if transformers_on:
            hf_logging.enable_progress_bar()  # also turns the hub's bars on
        if hub_on:
            hub_enable()
        else:
            hub_disable()
