"""A worker process's heartbeat: one `Heartbeat` per rank running in it, every
`HEARTBEAT_INTERVAL` seconds, so that the notebook tells a frozen process from a busy one."""

from __future__ import annotations

import os
import threading
import time

from ..events import Channel, Heartbeat

HEARTBEAT_INTERVAL = 1.0


class _ActiveRanks:
    """The ranks running in this process, for heartbeats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranks: set[int] = set()

    def add(self, rank: int) -> None:
        with self._lock:
            self._ranks.add(rank)

    def remove(self, rank: int) -> None:
        with self._lock:
            self._ranks.discard(rank)

    def snapshot(self) -> list[int]:
        with self._lock:
            return sorted(self._ranks)


_active = _ActiveRanks()
_heartbeat_pid: int | None = None
_heartbeat_lock = threading.Lock()


def _heartbeat(channel: Channel) -> None:
    """The heartbeat thread: forever (a daemon), every `HEARTBEAT_INTERVAL` s, one `Heartbeat`
    per rank running in this process, so that a frozen process is told from a busy one."""
    while True:
        time.sleep(HEARTBEAT_INTERVAL)
        for rank in _active.snapshot():
            channel.send(Heartbeat(rank=rank))


def start_heartbeat(channel: Channel) -> None:
    """One heartbeat thread in each process that runs ranks (xmp.spawn's pool processes too:
    a forked child has none of its parent's threads)."""
    global _heartbeat_pid
    with _heartbeat_lock:
        if _heartbeat_pid == os.getpid():
            return
        _heartbeat_pid = os.getpid()
        threading.Thread(
            target=_heartbeat, args=(channel,), name="hfxla_nb-heartbeat", daemon=True
        ).start()


def _after_fork_in_child() -> None:
    # A lock that a parent's thread held at the fork stays held in the child forever: the
    # heartbeat's snapshot could leave `_active` locked, and the child's first rank would hang
    # before it even said it started.
    global _active, _heartbeat_lock
    _active = _ActiveRanks()
    _heartbeat_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def rank_started(rank: int) -> None:
    """`rank` runs in this process now: the heartbeat names it."""
    _active.add(rank)


def rank_ended(rank: int) -> None:
    """`rank` ended: the heartbeat no longer names it."""
    _active.remove(rank)
