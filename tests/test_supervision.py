"""How the notebook side turns worker events into the record and the error (no fork):
`RecordKeeper` is driven by events alone."""

from __future__ import annotations

import signal

from hfxla_nb.events import Failed, ProcessExited, Started
from hfxla_nb.launch import LaunchRecord, RankRecord, RecordKeeper


def supervision(world: int, **options) -> RecordKeeper:
    record = LaunchRecord("replicated", world, [RankRecord(rank) for rank in range(world)])
    return RecordKeeper(record, **options)


def test_a_signal_names_every_rank_of_the_dead_process():
    watch = supervision(2)
    for rank in range(2):
        watch.handle(Started(rank=rank, world=2, pid=1234))
    watch.handle(ProcessExited(rank=None, pid=1234, signal=signal.SIGKILL))
    assert [r.exit_state for r in watch.record.ranks] == ["killed", "killed"]
    assert "killed by SIGKILL" in watch.failure_message()
    assert "out-of-memory" in watch.failure_message()


def test_a_bare_broken_pool_still_names_the_rank_and_the_likely_cause():
    watch = supervision(1)
    watch.handle(Started(rank=0, world=1, pid=99))
    watch.handle(Failed(None, "BrokenProcessPool", "terminated abruptly", ""))
    assert watch.record.ranks[0].exit_state == "killed"
    assert "rank 0 failed" in watch.failure_message()
    assert "out-of-memory" in watch.failure_message()


def test_the_first_failure_is_the_one_reported():
    watch = supervision(3)
    watch.handle(Failed(2, "ValueError", "first", "Traceback: first"))
    watch.handle(Failed(1, "KeyError", "second", "Traceback: second"))
    message = watch.failure_message()
    assert message.startswith("rank 2 failed: ValueError: first")
    assert "Traceback: first" in message and "second" not in message


def test_a_start_read_after_the_stop_leaves_the_rank_stopped():
    watch = supervision(3)
    watch.handle(Started(rank=0, world=3, pid=10))
    watch.handle(Failed(0, "ValueError", "bad batch", "Traceback"))
    watch.mark_stopped("stopped")
    watch.handle(Started(rank=2, world=3, pid=12))  # queued while the launch was stopped
    assert [r.exit_state for r in watch.record.ranks] == ["failed", "stopped", "stopped"]
    assert watch.record.ranks[2].pid == 12


def test_heartbeat_timeout_stops_a_silent_rank_and_a_quiet_one_gets_one_warning():
    watch = supervision(2, heartbeat_timeout=5.0)
    watch.handle(Started(rank=0, world=2, pid=1))
    watch.handle(Started(rank=1, world=2, pid=2))
    now = watch.record.ranks[0].last_seen
    watch.record.ranks[1].last_seen = now + 10  # rank 1 spoke recently, rank 0 did not
    assert watch.check_heartbeats(now + 6) == []
    assert watch.record.ranks[0].exit_state == "timeout"
    assert "no heartbeat for 6s" in watch.record.ranks[0].error
    assert watch.failure is watch.record.ranks[0]
    assert watch.record.ranks[1].exit_state == "running"


def test_a_rank_quiet_past_the_warning_is_named_once_without_a_heartbeat_timeout():
    from hfxla_nb.launch.record import HEARTBEAT_WARNING

    watch = supervision(1)
    watch.handle(Started(rank=0, world=1, pid=1))
    later = watch.record.ranks[0].last_seen + HEARTBEAT_WARNING + 1
    warnings = watch.check_heartbeats(later)
    assert len(warnings) == 1 and "rank 0 has sent nothing for 61s" in warnings[0]
    assert watch.check_heartbeats(later + 1) == []  # once per rank
    assert watch.record.ranks[0].exit_state == "running" and watch.failure is None


def test_a_rank_that_never_starts_is_named_and_stopped_after_the_startup_grace():
    from hfxla_nb.launch.record import HEARTBEAT_WARNING, STARTUP_GRACE

    watch = supervision(2, heartbeat_timeout=3.0)
    watch.handle(Started(rank=0, world=2, pid=1))
    began = watch.record.ranks[1].last_seen  # when the launch began: rank 1 never spoke
    assert watch.check_heartbeats(began + 2) == []
    watch.record.ranks[0].last_seen = began + HEARTBEAT_WARNING  # rank 0 keeps beating
    assert watch.check_heartbeats(began + 30) == []  # 30 s > heartbeat_timeout: still in grace
    assert watch.record.ranks[1].exit_state == "pending" and watch.failure is None
    watch.record.ranks[0].last_seen = began + STARTUP_GRACE + 1
    watch.check_heartbeats(began + STARTUP_GRACE + 1)
    assert watch.record.ranks[1].exit_state == "timeout"
    assert watch.failure is watch.record.ranks[1]
    assert "rank 1 failed: not started after 61s" in watch.failure_message()
    assert watch.record.ranks[0].exit_state == "running"


def test_a_rank_that_never_starts_gets_a_warning_without_a_heartbeat_timeout():
    from hfxla_nb.launch.record import HEARTBEAT_WARNING

    watch = supervision(1)
    later = watch.record.ranks[0].last_seen + HEARTBEAT_WARNING + 1
    warnings = watch.check_heartbeats(later)
    assert len(warnings) == 1 and "rank 0 has not started after 61s" in warnings[0]
    assert "timeout=" in warnings[0]
    assert watch.check_heartbeats(later + 1) == []
    assert watch.record.ranks[0].exit_state == "pending" and watch.failure is None
