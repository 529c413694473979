"""What a worker process prints, sent to the notebook in order, batched while the notebook
catches up, so a chatty function is never paced by the cell's output.

Each line printed in a worker becomes text of a `Log` event. Sent one datagram per line, a
flood of short lines makes the worker wait on the notebook, which writes (and ipykernel
flushes) one message per event. `LogSender` sends a line at once while the channel has room
(no added latency for a quiet function); when the channel is full (its socket buffer: a few
hundred short datagrams), lines are queued in the process and a sender thread sends them as
few large `Log` events: consecutive lines of one rank and stream joined, up to `BATCH_CHARS`
each.

Guarantees: no line is dropped, lines stay whole (a `Log`'s text only holds what its writer
handed over, whole lines unless the writer flushed a partial one) and in the order each
rank wrote them (one queue per process, sent by one thread). The writer blocks only when
`MAX_QUEUED_CHARS` are waiting (memory stays bounded for a function that prints forever).
Lines still queued when a process is killed by a signal or leaves with `os._exit` are lost,
as a pipe's buffered output is; every normal way out of a worker calls `drain()` first.
"""

from __future__ import annotations

import os
import threading

from ..events import Channel, Log

# Text per batched `Log`: one datagram once pickled (the channel's limit is 64 KiB).
BATCH_CHARS = 32 * 1024
# Text a process may queue before its writers wait for the notebook.
MAX_QUEUED_CHARS = 8 * 1024 * 1024


class LogSender:
    """The `Log` events of one process: sent at once, or queued and batched while the channel
    is full. Make one per process (`for_process`); any thread of it may call `send`."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: list[tuple[int | None, str, list[str]]] = []  # (rank, stream, texts)
        self._queued_chars = 0
        self._batch_chars = 0  # of the queue's last entry
        self._sending = False  # the sender thread holds a batch taken off the queue
        self._thread: threading.Thread | None = None

    def send(self, rank: int | None, stream: str, text: str) -> None:
        """Send `text` (whole lines, or what the writer flushed) as `rank`'s output on
        `stream` ("stdout" or "stderr"), after everything this process sent before."""
        with self._lock:
            if not self._queue and not self._sending and self._channel.try_send(
                    Log(rank=rank, stream=stream, text=text)):
                return
            while self._queued_chars >= MAX_QUEUED_CHARS:
                self._changed.wait(1.0)
            last = self._queue[-1] if self._queue else None
            if (last is not None and last[0] == rank and last[1] == stream
                    and self._batch_chars + len(text) <= BATCH_CHARS):
                last[2].append(text)
                self._batch_chars += len(text)
            else:
                self._queue.append((rank, stream, [text]))
                self._batch_chars = len(text)
            self._queued_chars += len(text)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hfxla_nb-log-sender",
                                                daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every queued line was handed to the channel (at most `timeout` s: a
        notebook that stopped reading must not hold a worker forever); whether it was."""
        with self._lock:
            return self._changed.wait_for(lambda: not self._queue and not self._sending,
                                          timeout)

    def _run(self) -> None:
        """The sender thread, forever (a daemon): wait for queued lines, take the whole queue
        (writers waiting for room go on) and send one `Log` per entry of it (a run of one
        rank's lines on one stream, up to `BATCH_CHARS`), in order; `drain` learns when
        nothing is queued or being sent."""
        while True:
            with self._lock:
                self._changed.wait_for(lambda: bool(self._queue))
                batch, self._queue = self._queue, []
                self._queued_chars = self._batch_chars = 0
                self._sending = True
                self._changed.notify_all()  # writers waiting for room
            try:
                for rank, stream, texts in batch:
                    self._channel.send(Log(rank=rank, stream=stream, text="".join(texts)))
            finally:
                with self._lock:
                    self._sending = False
                    self._changed.notify_all()


_sender: LogSender | None = None
_sender_pid: int | None = None
_sender_lock = threading.Lock()


def for_process(channel: Channel) -> LogSender:
    """This process's sender for `channel` (a forked child gets its own: a parent's thread,
    lock and queue do not survive a fork)."""
    global _sender, _sender_pid
    with _sender_lock:
        if _sender is None or _sender_pid != os.getpid() or _sender._channel is not channel:
            _sender, _sender_pid = LogSender(channel), os.getpid()
        return _sender


def drain() -> None:
    """Wait until this process's queued output was sent (before its last events or its exit)."""
    sender = _sender
    if sender is not None and _sender_pid == os.getpid():
        sender.drain()


def _after_fork_in_child() -> None:
    # The lock may have been held by a parent's thread at the fork: a child starts afresh.
    global _sender, _sender_pid, _sender_lock
    _sender, _sender_pid, _sender_lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
