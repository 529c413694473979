"""A launch's process group: who is still alive (read from /proc), and stopping all of it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

TERMINATE_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
KILL_WAIT = 10.0  # how long a SIGKILLed process may take to be gone (a loaded machine)


def stop_group(group: int, reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM to every process of `group`, then SIGKILL to what is left after the grace time.

    `reap` is called while waiting, so a caller can reap its own child (a zombie counts as gone).
    """
    signal_group(group, signal.SIGTERM)
    if _wait_gone(group, TERMINATE_GRACE, reap):
        return
    signal_group(group, signal.SIGKILL)
    # A killed process is not gone at once: return only when none is left running, so that
    # nothing of the launch outlives the call (on a busy machine this takes a moment).
    _wait_gone(group, KILL_WAIT, reap)


def _wait_gone(group: int, seconds: float, reap: Callable[[], object]) -> bool:
    """Wait up to `seconds` for the group to have no live process; whether it has none."""
    deadline = time.monotonic() + seconds
    while group_alive(group):
        if time.monotonic() >= deadline:
            return False
        reap()
        time.sleep(0.05)
    return True


def signal_group(group: int, number: int) -> None:
    try:
        os.killpg(group, number)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(group: int) -> bool:
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
