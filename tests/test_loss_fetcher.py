"""The training loop's loss fetcher (`train/worker/loop.py`'s `Fetcher`): a logging point's
loss is fetched off the training thread, in order, all of them before a checkpoint and before
the last one; a failed fetch is raised, not lost."""

from __future__ import annotations

import threading
import time

import pytest

from hfxla_nb.train.worker.loop import Fetcher


def _recorder(delay: float = 0.0):
    seen: list[tuple[int, str]] = []

    def log(step: int, loss_total, lr: float) -> None:
        time.sleep(delay)
        seen.append((step, threading.current_thread().name))

    return seen, log


def test_fetches_run_off_the_calling_thread_in_order_and_drain_waits_for_them():
    seen, log = _recorder(delay=0.1)
    fetcher = Fetcher(log)
    for step in (10, 20, 30):
        fetcher.submit(step, None, 1e-4)
    assert len(seen) < 3  # submit did not wait for the fetches
    fetcher.drain()
    assert [step for step, _ in seen] == [10, 20, 30]
    assert all(name.startswith("hfxla_nb-fetch") for _, name in seen)
    fetcher.close(None)


def test_close_runs_the_last_fetch_on_the_calling_thread_after_the_others():
    seen, log = _recorder(delay=0.02)
    fetcher = Fetcher(log)
    fetcher.submit(10, None, 1e-4)
    fetcher.close((12, None, 1e-4))
    assert seen == [(10, seen[0][1]), (12, threading.current_thread().name)]
    assert seen[0][1] != threading.current_thread().name


def test_a_failed_fetch_is_raised_by_drain():
    def log(step: int, loss_total, lr: float) -> None:
        raise RuntimeError(f"fetch of step {step} failed")

    fetcher = Fetcher(log)
    fetcher.submit(10, None, 1e-4)
    with pytest.raises(RuntimeError, match="step 10"):
        fetcher.drain()
    fetcher.close(None)
