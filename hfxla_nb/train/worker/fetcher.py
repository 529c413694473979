"""The training loop's loss fetches, run off the training thread: `Fetcher`."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Fetcher:
    """Runs the loop's loss fetches (`log`) one at a time on a thread of their own, in order.

    A fetch in a step closure would wait there for the execution the closure's sync just
    launched, and the next step could not be traced meanwhile. `drain` waits for the fetches
    queued so far (and raises what one raised); `close` drains, then runs the last fetch, if
    any, on the calling thread (after the final sync: nothing is left to overlap).

    Args:
        log: called as `log(step, loss_total, lr)`: reads the running loss (a device tensor)
            and records it.
    """

    def __init__(self, log: Callable[[int, Any, float], None]) -> None:
        self.log = log
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hfxla_nb-fetch")
        self.pending: list[Future] = []

    def submit(self, step: int, loss_total: Any, lr: float) -> None:
        """Queues the fetch of logging point `step` (`loss_total`: the running loss tensor)."""
        self.pending.append(self.pool.submit(self.log, step, loss_total, lr))

    def drain(self) -> None:
        """Waits for the fetches queued so far; raises what one raised."""
        pending, self.pending = self.pending, []
        for future in pending:
            future.result()

    def close(self, last: tuple | None) -> None:
        """Drains, stops the thread, then runs the fetch `last` (`(step, loss_total, lr)`),
        if any, here."""
        try:
            self.drain()
        finally:
            self.pool.shutdown(wait=True)
        if last is not None:
            self.log(*last)
