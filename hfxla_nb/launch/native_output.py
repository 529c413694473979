"""What native code writes to file descriptors 1 and 2, relayed to the cell per process.

Worker side: each process of a launch gets its own pipes for fds 1 and 2 when its first rank
starts, and hands their read ends to the notebook over the event channel (SCM_RIGHTS). The
notebook holds the read ends, so what a process wrote just before a crash (a segfault's
faulthandler traceback) is still read after it died. Until a process has its own pipes (the
supervisor, xmp.spawn's own messages), fds 1 and 2 go to the launch's shared pipes.

Notebook side: `NativeRelay` reads every pipe, keeps stdout on stdout and stderr on stderr,
and writes whole lines tagged with the ranks of the writing process, filtered like Python
output (`output=`). XLA's C++ log lines (absl/TSL `W ... file.cc:123] text`) are folded:
- its notices and warnings (`I`, `W`: the GSPMD deprecation notice at every SPMD compilation,
  with its raw timestamp) are said at the end of the launch, one muted line per kind with its
  count, as library warnings are (`library_warnings.print_folded`); a user need not know
  `TF_CPP_MIN_LOG_LEVEL` to keep them out of the way (#28 item 4);
- its errors (`E`, `F`) are written at once, the first of a kind wrapped at spaces
  (JupyterLab breaks a long stream line anywhere, mid-word), and the end of the launch says
  how many more times each came.
Every such line is kept, verbatim, on `kept` (`hx.last_launch().native_log`). What is written
at all is still XLA's to decide (`TF_CPP_MIN_LOG_LEVEL`).
"""

from __future__ import annotations

import errno
import faulthandler
import os
import re
import sys
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..events import Channel, OutputPipes
from .library_warnings import MUTED, PLAIN, first_line

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
        channel.send_fds(OutputPipes(rank=rank, pid=os.getpid()), [out_read, err_read])
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
        self.ranks_of = ranks_of
        self.shown = shown
        self.tagged = tagged
        self.rewrite = rewrite
        self.kept: list[str] = [] if kept is None else kept
        self.pipes: dict[int, _Pipe] = {}
        # (severity, source, text) of each XLA log line -> [times seen, stream, the tag of
        # every process that wrote it]
        self.repeats: dict[tuple[str, str, str], list] = {}

    def add(self, fd: int, stream: str, pid: int | None = None, rank: int | None = None) -> None:
        os.set_blocking(fd, False)
        self.pipes[fd] = _Pipe(stream, pid, rank)

    def add_process(self, event: OutputPipes) -> None:
        stdout_fd, stderr_fd = event.fds
        self.add(stdout_fd, "stdout", event.pid, event.rank)
        self.add(stderr_fd, "stderr", event.pid, event.rank)

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
