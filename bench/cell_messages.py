"""The messages of one executed cell, read from a real Jupyter kernel: how the bench's kernel
(`bench/in_kernel.py`) and the tests' (`tests/helpers.py`) both drive one, written once. Here
in bench/ because tests may import the bench (tests/test_bench_contracts.py does) and the bench
never imports the tests."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any


def cell_messages(client: Any, msg_id: str, poll: float) -> Iterator[tuple[str, dict] | None]:
    """Each iopub message of the execute request `msg_id`, as `(msg_type, content)`, in the
    order the kernel sent them, until the kernel is idle again (that status ends the
    iteration: every message of the cell was received); None after `poll` seconds without one,
    so that the caller can give up or press the stop button. Messages of other requests are
    passed over.

    Args:
        client: a started `jupyter_client` blocking client.
        msg_id: what `client.execute` returned.
        poll: the longest wait for one message, in seconds.
    """
    while True:
        try:
            message = client.get_iopub_msg(timeout=poll)
        except queue.Empty:
            yield None
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "status" and content["execution_state"] == "idle":
            return
        yield kind, content
