"""Where a stuck rank is: a worker process's Python stacks, read from the notebook.

Each worker process registers `faulthandler` for `DUMP_SIGNAL` into an anonymous in-memory
file of its own (`register`); the file's descriptor travels to the kernel with the process's
output pipes. When a rank is quiet past the warning, or is stopped by `timeout=`, by
`heartbeat_timeout=` or by the stop button, the kernel signals the process and reads what
faulthandler wrote (`dump`): every thread's stack, most recent call first. faulthandler writes
from its C signal handler, without the GIL, so a process stuck in native code (an XLA wait,
a collective, a lock) answers too. Linux only (`os.memfd_create`); elsewhere nothing is read.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import time
from typing import IO

from ..observe.tracing import is_launcher, is_library, name_cells

DUMP_SIGNAL = signal.SIGUSR1
WAIT = 2.0  # seconds a process has to write its stacks once signalled
_POLL = 0.02

_files: list[IO[str]] = []  # faulthandler keeps only the descriptor: the file objects live here


def register() -> int | None:
    """Make `DUMP_SIGNAL` write every thread's stack into a new in-memory file, in this
    process; returns the file's descriptor, or None where there is no such file."""
    try:
        fd = os.memfd_create("hfxla_nb-stacks")
    except (AttributeError, OSError):
        return None
    file = os.fdopen(fd, "w", closefd=False)
    faulthandler.register(DUMP_SIGNAL, file=file, all_threads=True, chain=False)
    _files.append(file)
    return fd


def dump(pid: int, fd: int, wait: float = WAIT) -> str:
    """Signal process `pid` and return the stacks it wrote into `fd` (its `register`ed file,
    received by this process); "" when it wrote none within `wait` seconds (it is gone, or
    never registered)."""
    start = os.fstat(fd).st_size
    try:
        os.kill(pid, DUMP_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return ""
    deadline, size = time.monotonic() + wait, start
    while time.monotonic() < deadline:
        time.sleep(_POLL)
        now = os.fstat(fd).st_size
        if now > start and now == size:  # it wrote, and stopped writing
            break
        size = now
    return os.pread(fd, size - start, start).decode("utf-8", "replace")


_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+", re.MULTILINE)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)', re.MULTILINE)
_CELL_FRAME = re.compile(r"^\s*(Cell In\[\d+\], line \d+) in (\S+)", re.MULTILINE)


def threads(text: str) -> list[str]:
    """A dump cut into its threads, each from its "Thread 0x..." line down to its first frame
    in hfxla_nb's launcher: the older frames are the launch's own machinery (and, in the main
    thread, the notebook's cell as it was at the fork). Threads left with no frame (the
    launcher's own) are left out."""
    starts = [match.start() for match in _THREAD.finditer(text)]
    found = []
    for a, b in zip(starts, [*starts[1:], len(text)], strict=True):
        lines = []
        for line in text[a:b].rstrip().splitlines():
            frame = _FRAME.match(line)
            if frame and is_launcher(frame.group(1)):
                break
            lines.append(line)
        if len(lines) > 1:
            found.append("\n".join(lines))
    return found


def user_threads(text: str, cells: dict[str, int]) -> str:
    """The threads of a dump that run the user's code (`threads`), cell files named as
    IPython names them (`Cell In[5], line 3 in train`); every thread when none does."""
    found = threads(text)
    own = [thread for thread in found
           if any(not is_library(path) for path, _, _ in _FRAME.findall(thread))]
    return name_cells("\n".join(own or found), cells)


def innermost_user_frame(text: str) -> str | None:
    """The most recent frame in the user's code of `user_threads`' text ("Cell In[5], line 3
    in train", "train.py, line 3 in train"), or None."""
    frames = sorted([(m.start(), f"{m.group(1)} in {m.group(2)}")
                     for m in _CELL_FRAME.finditer(text)]
                    + [(m.start(), f"{os.path.basename(m.group(1))}, line {m.group(2)} in "
                                   f"{m.group(3)}")
                       for m in _FRAME.finditer(text) if not is_library(m.group(1))])
    return frames[0][1] if frames else None
