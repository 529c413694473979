"""A launch dies with its kernel: the supervisor watches the kernel, the workers their parent.

The notebook stops a launch at every end it sees (success, failure, timeout, the stop
button). A kernel that is itself killed (SIGKILL from a crash, the out-of-memory killer, a
forced restart) sees nothing: without this, its launch trains on with no one to report to,
and on a TPU host it keeps the chip's device files open, so the next launch finds the TPU
busy (pytorch/xla #1731, #1217).

- The supervisor (`watch_kernel`) waits on a pidfd of the kernel in a thread. When the kernel
  is gone it stops every process below it (`stop_descendants`: the ranks, and what they
  started in other sessions, which a subreaper keeps below it), writes down what it stopped
  (`runtime.stopped_launches`, shown by the next `%xla_info`) and exits.
- Every other process of the launch asks the kernel for a signal when its parent dies
  (`die_with_parent`), for a supervisor that is itself killed: SIGTERM for a rank below the
  one-host supervisor (the notebook's SIGKILL follows its grace time), SIGKILL on a Ray host.

What this cannot catch: a supervisor killed at the same moment as its kernel (then a rank
whose parent died still gets its SIGTERM, but a rank that ignores SIGTERM and a process in
another session go on, adopted by init), and a main thread that holds the GIL for minutes in
native code (the watch thread needs it).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
import time
from collections.abc import Callable

from ..runtime.stopped_launches import StoppedLaunch, record
from .processes import LEFTOVER_GRACE, describe, stop_descendants

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_INTERVAL = 0.5  # seconds between looks at the parent where there is no pidfd


def die_with_parent(number: int = signal.SIGKILL) -> None:
    """Have the kernel send signal `number` to this process when its parent exits (Linux); a
    no-op elsewhere.

    A rank below a one-host supervisor asks for SIGTERM: the notebook stops a launch with
    SIGTERM to its whole group and SIGKILL after a grace time, and a supervisor that dies of
    that SIGTERM first must not cut a rank's grace short (a rank may handle SIGTERM to save
    its state). The parent-death signal fires when the thread that forked this process ends,
    so call it only in processes forked from their parent's main thread (every fork of a
    launch is).
    """
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, number)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request: nobody to signal it
        os._exit(1)


def watch_parent(on_death: Callable[[int], None]) -> threading.Thread:
    """Call `on_death(parent pid)` from a daemon thread once this process's parent is gone."""
    parent = os.getppid()

    def watch() -> None:
        try:
            descriptor = os.pidfd_open(parent)
        except (AttributeError, OSError):
            descriptor = None
        if os.getppid() == parent:
            if descriptor is not None:
                select.select([descriptor], [], [])  # readable once the parent exited
            while os.getppid() == parent:  # and where there is no pidfd, a poll
                time.sleep(POLL_INTERVAL)
        on_death(parent)

    thread = threading.Thread(target=watch, name="hfxla_nb-parent-watch", daemon=True)
    thread.start()
    return thread


# Held by the watch while it stops an orphaned launch, so that the supervisor's main thread,
# which sees its ranks end and heads for the exit, does not end the process first.
_stopping = threading.Lock()


def exit_process(code: int) -> None:
    """`os._exit(code)`, unless the kernel's death is being handled: then the watch exits."""
    with _stopping:
        os._exit(code)


def watch_kernel() -> threading.Thread:
    """In the supervisor: when the kernel dies, stop the launch, write it down and exit."""
    return watch_parent(_stop_orphaned_launch)


def _stop_orphaned_launch(kernel_pid: int) -> None:
    """Stop every process below this supervisor, note what was stopped, end the process."""
    _stopping.acquire()  # never released: this ends the process
    me = os.getpid()
    processes = [describe(me)]
    try:
        stopped = stop_descendants(grace=LEFTOVER_GRACE)
        processes += [stopped[pid] for pid in sorted(stopped)]
        record(StoppedLaunch(kernel_pid, me, time.time(), processes))
    finally:
        os._exit(1)
