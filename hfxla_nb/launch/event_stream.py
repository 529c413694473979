"""A worker's `sys.stdout` and `sys.stderr`: what it prints goes to the notebook as `Log`
events, in whole lines tagged with the rank of the thread that wrote them."""

from __future__ import annotations

import io
import sys
import threading

from ..events import Channel, worker_rank
from . import log_sender


class EventStream(io.TextIOBase):
    """A text stream that sends what a worker prints to the notebook, in whole lines.

    Partial lines wait for their newline or an explicit `flush()` (tqdm and `print(...,
    flush=True)` flush), per thread, so lines from rank threads never interleave. Whole
    lines go to this process's `log_sender.LogSender`, which sends them at once or, while the
    notebook catches up, in batches: `flush()` never waits for the notebook (a logging
    handler flushes every record); `drain_output()` does, before a rank's last events.
    """

    def __init__(self, channel: Channel, name: str, fd: int) -> None:
        super().__init__()
        self._channel = channel
        self._name = name
        self._fd = fd
        self._local = threading.local()

    @property
    def name(self) -> str:
        return f"<hfxla_nb {self._name}>"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        # faulthandler and subprocess need a real descriptor: the pipe the notebook reads.
        return self._fd

    def write(self, text: str) -> int:
        buffer = getattr(self._local, "buffer", "") + text
        cut = buffer.rfind("\n") + 1
        if cut:
            self._send(buffer[:cut])
            buffer = buffer[cut:]
        self._local.buffer = buffer
        return len(text)

    def flush(self) -> None:
        buffer = getattr(self._local, "buffer", "")
        if buffer:
            self._local.buffer = ""
            self._send(buffer)

    def _send(self, text: str) -> None:
        log_sender.for_process(self._channel).send(worker_rank(), self._name, text)


def drain_output() -> None:
    """Hand every partial line of this thread to the sender and wait until this process's
    output was sent: before `Finished`/`Failed` and before the process exits."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream: nothing to send
            pass
    log_sender.drain()
