"""How the notebook side turns worker events into the record and the error (no fork)."""

from __future__ import annotations

import signal

from hfxla_nb.events import Failed, ProcessExited, Started
from hfxla_nb.launch import LaunchRecord, RankRecord, _Supervision
from hfxla_nb.ui import NullDisplay


def supervision(world: int) -> _Supervision:
    record = LaunchRecord("replicated", world, [RankRecord(rank) for rank in range(world)])
    return _Supervision(record, NullDisplay(), {0}, None, None)


def test_a_signal_names_every_rank_of_the_dead_process():
    watch = supervision(2)
    for rank in range(2):
        watch._handle(Started(rank=rank, world=2, pid=1234))
    watch._handle(ProcessExited(rank=None, pid=1234, signal=signal.SIGKILL))
    assert [r.exit_state for r in watch.record.ranks] == ["killed", "killed"]
    assert "killed by SIGKILL" in watch.failure_message()
    assert "out-of-memory" in watch.failure_message()


def test_a_bare_broken_pool_still_names_the_rank_and_the_likely_cause():
    watch = supervision(1)
    watch._handle(Started(rank=0, world=1, pid=99))
    watch._handle(Failed(None, "BrokenProcessPool", "terminated abruptly", ""))
    assert watch.record.ranks[0].exit_state == "killed"
    assert "rank 0 failed" in watch.failure_message()
    assert "out-of-memory" in watch.failure_message()


def test_the_first_failure_is_the_one_reported():
    watch = supervision(3)
    watch._handle(Failed(2, "ValueError", "first", "Traceback: first"))
    watch._handle(Failed(1, "KeyError", "second", "Traceback: second"))
    message = watch.failure_message()
    assert message.startswith("rank 2 failed: ValueError: first")
    assert "Traceback: first" in message and "second" not in message
