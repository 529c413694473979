"""Processes of a browser test run, read from /proc: who descends from whom, who is still alive,
and stopping one by its own pid (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import NamedTuple


class Proc(NamedTuple):
    """A process, named by pid *and* start time, so that a reused pid is not taken for it."""

    pid: int
    start: int
    cmdline: str


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks), or None when the process is gone (or a zombie:
    it has exited, only its parent has not read its status yet)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def proc(pid: int) -> Proc | None:
    """The live process `pid`, or None."""
    stat = _stat(pid)
    return None if stat is None else Proc(pid, stat[1], _cmdline(pid))


def descendants(pid: int) -> list[Proc]:
    """Every live process below `pid` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            parents.setdefault(stat[0], []).append(int(entry))
    found, todo = [], list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        if (info := proc(child)) is not None:
            found.append(info)
        todo += parents.get(child, [])
    return found


def alive(process: Proc) -> bool:
    """Whether `process` itself (same pid, same start time) still runs."""
    stat = _stat(process.pid)
    return stat is not None and stat[1] == process.start


def wait_gone(processes: list[Proc], timeout: float) -> list[Proc]:
    """Wait up to `timeout` s for `processes` to end; returns those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in processes if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def stop(process: Proc, grace: float = 5.0) -> None:
    """SIGTERM `process`, SIGKILL it if it outlives `grace` seconds; reap it if it is ours."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not alive(process):
            break
        try:
            os.kill(process.pid, sig)
        except ProcessLookupError:
            break
        wait_gone([process], wait)
    try:  # a child of this process stays a zombie until waited for
        os.waitpid(process.pid, os.WNOHANG)
    except ChildProcessError:
        pass
