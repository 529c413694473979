"""The notebook side of a launch: how `LaunchReader` turns worker events into the record and
the error (driven by events alone), the typed states, and how `Supervision` ends a launch
(every exit sets the outcome in one place; real forks for the timeout and a broken loop)."""

from __future__ import annotations

import io
import signal
import socket
import time

import pytest

from hfxla_nb.events import Channel, Failed, ProcessExited, Started
from hfxla_nb.launch import LaunchError, LaunchRecord, RankRecord
from hfxla_nb.launch.processes import LEFTOVER_GRACE, TERMINATE_GRACE, group_processes
from hfxla_nb.launch.supervision import STOPPED_AS, Supervision, failure_message, shows
from hfxla_nb.observe.reader import LaunchReader
from hfxla_nb.states import Outcome, RankState
from hfxla_nb.ui import NullDisplay
from hfxla_nb.ui.live import ConsoleDisplay


def supervision(world: int, **options) -> LaunchReader:
    record = LaunchRecord("replicated", world, [RankRecord(rank) for rank in range(world)])
    return LaunchReader(record, **options)


def test_a_signal_names_every_rank_of_the_dead_process():
    watch = supervision(2)
    for rank in range(2):
        watch.handle(Started(rank=rank, world=2, pid=1234))
    watch.handle(ProcessExited(rank=None, pid=1234, signal=signal.SIGKILL))
    assert [r.exit_state for r in watch.record.ranks] == ["killed", "killed"]
    assert [r.signal for r in watch.record.ranks] == [signal.SIGKILL] * 2
    assert "killed by SIGKILL" in failure_message(watch)
    assert "out-of-memory" in failure_message(watch)
    # torchelastic reads a signal's death as exit code -signal (ChildFailedError.failures).
    error = LaunchError(failure_message(watch), watch.record)
    assert {rank: f.exitcode for rank, f in error.failures.items()} == {0: -9, 1: -9}


def test_a_bare_broken_pool_still_names_the_rank_and_the_likely_cause():
    watch = supervision(1)
    watch.handle(Started(rank=0, world=1, pid=99))
    watch.handle(Failed(None, "BrokenProcessPool", "terminated abruptly", ""))
    assert watch.record.ranks[0].exit_state == "killed"
    assert "rank 0 failed" in failure_message(watch)
    assert "out-of-memory" in failure_message(watch)


def test_the_first_failure_is_the_one_reported():
    watch = supervision(3)
    watch.handle(Failed(2, "ValueError", "first", "Traceback: first"))
    watch.handle(Failed(1, "KeyError", "second", "Traceback: second"))
    message = failure_message(watch)
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
    from hfxla_nb.observe.reader import HEARTBEAT_WARNING

    watch = supervision(1)
    watch.handle(Started(rank=0, world=1, pid=1))
    later = watch.record.ranks[0].last_seen + HEARTBEAT_WARNING + 1
    warnings = watch.check_heartbeats(later)
    assert len(warnings) == 1 and "rank 0 has sent nothing for 61s" in warnings[0]
    assert watch.check_heartbeats(later + 1) == []  # once per rank
    assert watch.record.ranks[0].exit_state == "running" and watch.failure is None


def test_a_rank_that_never_starts_is_named_and_stopped_after_the_startup_grace():
    from hfxla_nb.observe.reader import HEARTBEAT_WARNING, STARTUP_GRACE

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
    assert "rank 1 failed: not started after 61s" in failure_message(watch)
    assert watch.record.ranks[0].exit_state == "running"


def test_a_rank_that_never_starts_gets_a_warning_without_a_heartbeat_timeout():
    from hfxla_nb.observe.reader import HEARTBEAT_WARNING

    watch = supervision(1)
    later = watch.record.ranks[0].last_seen + HEARTBEAT_WARNING + 1
    warnings = watch.check_heartbeats(later)
    assert len(warnings) == 1 and "rank 0 has not started after 61s" in warnings[0]
    assert "timeout=" in warnings[0]
    assert watch.check_heartbeats(later + 1) == []
    assert watch.record.ranks[0].exit_state == "pending" and watch.failure is None


# -- the states, typed ---------------------------------------------------------------------------


def test_the_rank_record_docstring_names_every_state_a_rank_can_end_in():
    missing = [state for state in RankState if f'"{state}"' not in RankRecord.__doc__]
    assert missing == [], "RankRecord.exit_state's docstring leaves out these states"
    missing = [outcome for outcome in Outcome if f'"{outcome}"' not in LaunchRecord.__doc__]
    assert missing == [], "LaunchRecord.outcome's docstring leaves out these outcomes"


def test_states_read_as_their_words_and_a_misspelt_one_is_refused():
    record = LaunchRecord("spmd", 1, [RankRecord(0, exit_state="finished")], outcome="timeout")
    assert record.ranks[0].exit_state is RankState.FINISHED and record.outcome is Outcome.TIMEOUT
    # What a notebook shows and what tests/helpers.py reads back through repr() stay words.
    assert repr(record.ranks[0].exit_state) == "'finished'" and f"{record.outcome}" == "timeout"
    assert "exit_state='finished'" in repr(record.ranks[0])
    assert type(record.to_dataframe().loc[0, "exit_state"]) is str
    with pytest.raises(ValueError, match="finsihed"):
        RankRecord(0, exit_state="finsihed")
    with pytest.raises(ValueError, match="timed out"):
        LaunchRecord("spmd", 1, [RankRecord(0)], outcome="timed out")


# -- the supervision loop: every way a launch ends -----------------------------------------------


def test_each_way_a_launch_ends_sets_its_outcome_and_the_state_of_the_ranks_left(capsys):
    """`Supervision._end` (`supervision.end_launch`, as on a cluster) is where every exit of `run`
    goes: the outcome is set there, the ranks still running end in the state of that outcome,
    and the final panel is drawn from it."""
    assert set(STOPPED_AS) == set(Outcome) - {Outcome.RUNNING}
    panels = {}
    for outcome, left in STOPPED_AS.items():
        record = LaunchRecord("debug", 3, [RankRecord(0, exit_state="finished"),
                                           RankRecord(1, exit_state="running"), RankRecord(2)])
        output = io.StringIO()
        reader = LaunchReader(record)
        supervision = Supervision(reader, ConsoleDisplay(3, file=output, reader=reader), "all",
                                  None)
        supervision._end(outcome, Channel(), time.monotonic())
        assert record.outcome is outcome
        said = capsys.readouterr().err
        # Only the stop button gets the line that the kernel is ready.
        assert ("every worker process of this launch was stopped. The kernel is ready for the "
                "next launch." in said) == (outcome == Outcome.INTERRUPTED), said
        assert [r.exit_state for r in record.ranks] == [RankState.FINISHED, left, left]
        panels[outcome] = output.getvalue()
    assert [r.exit_state for r in record.ranks] == ["finished", "interrupted", "interrupted"]
    assert "✖ launch of 3 ranks failed" in panels[Outcome.TIMEOUT]
    assert "timed out" in panels[Outcome.TIMEOUT]
    assert "interrupted" in panels[Outcome.INTERRUPTED]


def _forked_launch(display, timeout=None):
    """A real one-rank launch of `time.sleep(60)` ("debug" strategy: a forked supervisor and a
    forked rank), supervised from this process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    record = LaunchRecord("debug", 1, [RankRecord(0)])
    supervision = Supervision(LaunchReader(record, timeout), display, "all", timeout)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    return record, lambda: supervision.run(time.sleep, (60,), False, env)


@pytest.mark.launch
def test_output_main_all_none_and_a_list_say_whose_lines_reach_the_cell():
    """README: `output="main"` shows rank 0, `"all"` every rank, or a list of ranks; the
    launcher's own lines (no rank) show unless it is "none" (one decision for one host and
    a cluster: `supervision.shows`)."""
    from hfxla_nb.launch.launcher import parse_output

    main, listed = parse_output("main"), parse_output([1, 3])
    assert [shows(main, [rank]) for rank in range(4)] == [True, False, False, False]
    assert [shows(listed, [rank]) for rank in range(4)] == [False, True, False, True]
    assert all(shows("all", [rank]) for rank in range(4))
    assert not any(shows("none", ranks) for ranks in ([], [0], [1]))
    assert shows(main, []) and shows(listed, []) and shows("all", [])
    assert shows(listed, [0, 1])  # a process of several ranks shows if one of them does


def test_the_grace_between_sigterm_and_sigkill_is_the_readmes():
    """README: a failure stops every rank "SIGTERM, then SIGKILL after 3 s"; the supervisor
    stops its leftovers within less, so the notebook's SIGKILL never cuts it short."""
    assert TERMINATE_GRACE == 3.0
    assert LEFTOVER_GRACE < TERMINATE_GRACE


@pytest.mark.launch
@pytest.mark.launch  # forks a real supervisor (`_forked_launch`)
def test_a_launch_past_its_timeout_is_stopped_and_ends_as_timeout():
    record, run = _forked_launch(NullDisplay(), timeout=2.0)
    began = time.monotonic()
    run()
    assert time.monotonic() - began < 30  # not the 60 s the function sleeps
    assert record.outcome == "timeout" and record.ranks[0].exit_state == "timeout"
    assert group_processes(record.process_group) == []


@pytest.mark.launch
@pytest.mark.launch  # forks a real supervisor (`_forked_launch`)
def test_a_launch_whose_watch_raises_is_stopped_and_ends_as_failed():
    """An error in the kernel's own loop (here the panel's refresh) still stops every process
    of the launch and leaves the record ended, not "running"."""


    class BrokenPanel:
        closed_with = None

        def handle(self, event):
            pass

        def refresh(self):
            raise RuntimeError("the panel broke")

        def close(self, record):
            self.closed_with = record

    panel = BrokenPanel()
    record, run = _forked_launch(panel)
    with pytest.raises(RuntimeError, match="the panel broke"):
        run()
    assert record.outcome == "failed" and record.ranks[0].exit_state == "stopped"
    assert panel.closed_with is record
    assert group_processes(record.process_group) == []
