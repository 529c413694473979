"""The event channel: atomic datagrams from many forked writers, large payloads spilled."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from hfxla_nb.events import Channel, Failed, Finished, Log, Progress

QUIET = 20.0  # seconds without an event after which the log sender's lines count as lost


@pytest.mark.launch
def test_events_from_many_forked_processes_all_arrive_whole():
    channel = Channel()
    pids = []
    for writer in range(4):
        pid = os.fork()
        if pid == 0:
            for step in range(50):
                channel.send(Progress(rank=writer, step=step, total=50, values={"loss": 1.0}))
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    events = []
    while len(events) < 200:
        batch = channel.receive(timeout=2)
        assert batch, f"only {len(events)} of 200 events arrived"
        events.extend(batch)
    channel.close()
    for writer in range(4):
        steps = [e.step for e in events if e.rank == writer]
        assert steps == list(range(50))  # in order, none lost, none torn


def test_a_large_result_travels_through_a_file_that_is_then_removed():
    channel = Channel()
    big = np.arange(200_000, dtype=np.float64)  # 1.6 MB: far over one datagram
    channel.send(Finished(rank=0, result=big, duration=1.0))
    (event,) = channel.receive(timeout=1)
    assert np.array_equal(event.result, big)
    assert os.listdir(channel._spill_dir) == []
    channel.close()
    assert not os.path.exists(channel._spill_dir)


def test_an_unpicklable_result_becomes_a_failure_that_says_what_to_return():
    channel = Channel()
    channel.send(Finished(rank=2, result=lambda: None))
    (event,) = channel.receive(timeout=1)
    assert isinstance(event, Failed) and event.rank == 2
    assert "cannot be sent back to the notebook" in event.message
    channel.close()


def test_a_worker_sends_quietly_once_the_notebook_side_is_gone():
    """A worker still running when the notebook stopped listening: its sends raise nothing
    and leave nothing behind."""
    channel = Channel()
    channel._reader.close()  # what the notebook's end of a finished launch looks like
    channel.send(Log(rank=0, stream="stdout", text="late\n"))
    channel.send(Finished(rank=0, result=np.zeros(20_000)))  # spilled to a file
    channel.close()
    assert not os.path.exists(channel._spill_dir)


def test_sending_a_small_event_after_close_is_a_quiet_no_op():
    channel = Channel()
    channel.close()
    channel.send(Log(rank=0, stream="stdout", text="late\n"))  # raises nothing
    assert not os.path.exists(channel._spill_dir)  # and writes nothing


def test_sending_a_large_event_after_close_is_a_quiet_no_op():
    channel = Channel()
    channel.close()
    channel.send(Finished(rank=0, result=np.zeros(20_000)))
    assert not os.path.exists(channel._spill_dir)


def _read_lines(channel: Channel, sender, expected: int) -> tuple[dict, list[int]]:
    """Read `channel` until `expected` lines came (while `sender` drains): the lines per rank
    and how many lines each `Log` event held, in the order they came. A lost line shows as
    `QUIET` s of silence (a loaded machine only slows the sender: `drain` may give up waiting
    after its 30 s while lines still go out)."""
    import threading

    received: dict[int, list[str]] = {}
    held: list[int] = []
    drained = threading.Thread(target=sender.drain)
    drained.start()
    heard = time.monotonic()
    while sum(map(len, received.values())) < expected:
        batch = channel.receive(timeout=1)
        if batch:
            heard = time.monotonic()
        assert time.monotonic() - heard < QUIET, f"lines were lost: nothing came for {QUIET} s"
        for event in batch:
            assert isinstance(event, Log) and event.text.endswith("\n")
            held.append(event.text.count("\n"))
            received.setdefault(event.rank, []).extend(event.text.splitlines())
    drained.join()
    channel.close()
    return received, held


def test_log_sender_never_blocks_a_writer_on_a_full_channel_and_keeps_every_line_in_order():
    import threading

    from hfxla_nb.launch.output import LogSender

    channel = Channel()
    sender = LogSender(channel)
    lines = 20_000

    def write(rank):
        for i in range(lines):
            sender.send(rank, "stdout", f"rank {rank} line {i}\n")

    writers = [threading.Thread(target=write, args=(rank,)) for rank in (0, 1)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=30)
        # Nobody reads the channel yet: the writers finished all the same (the lines wait in
        # the process's queue, not in the writer).
        assert not writer.is_alive(), "a writer blocked on the full channel"
    received, _ = _read_lines(channel, sender, 2 * lines)
    for rank in (0, 1):
        assert received[rank] == [f"rank {rank} line {i}" for i in range(lines)]


def test_log_sender_sends_a_flood_of_one_rank_as_few_large_events():
    # One rank per process, as in a worker. (Two writer threads of different ranks, as above,
    # make one event per switch between them: as many as the thread scheduler makes.)
    from hfxla_nb.launch.output import BATCH_CHARS, LogSender

    channel = Channel()
    sender = LogSender(channel)
    lines = [f"rank 0 line {i}\n" for i in range(40_000)]
    for line in lines:
        sender.send(0, "stdout", line)
    received, held = _read_lines(channel, sender, len(lines))
    assert received[0] == [line[:-1] for line in lines]
    # Line by line while the channel had room (its socket buffer: a few hundred short
    # datagrams), then only batches of up to BATCH_CHARS: full ones but for the first (taken
    # while the channel filled) and the last.
    one_by_one = held.index(next(n for n in held if n > 1))
    batches = held[one_by_one:]
    assert one_by_one < 1000 and min(batches) > 1
    batched_chars = sum(map(len, lines[sum(held[:one_by_one]):]))
    assert len(batches) <= batched_chars // BATCH_CHARS + 2
