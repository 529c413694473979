"""Sharding annotations that copied a tensor to the host, counted by the line that made them.

`xs.mark_sharding(x, mesh, spec)` on a tensor that an operation of the step already used makes
torch_xla copy `x` to the host and back, sharded, every step it runs. torch_xla's analysis has
no block for it (no graph runs), so the transfer alert could only guess: it blamed `.item()`,
print and Trainer logging (#28 item 3). In an SPMD worker, `watch` wraps `xs.mark_sharding`
(`_xla.watch_mark_sharding`); each call that copied is counted under its user frame, and the
counts travel with the metrics snapshots (`data()` -> the snapshot's "reshards").
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Mapping
from typing import Any

from .. import _xla
from .compile_records import Frame
from .user_frames import locate

_lock = threading.Lock()
_counts: dict[tuple[str, str, int, int | None], int] = {}  # (function, file, line, cell) -> n
_pid: int | None = None


def watch(cells: Mapping[str, int] | None = None) -> None:
    """From now on, count in this process each `xs.mark_sharding` that copied its tensor to the
    host, under the user's line that called it (`cells` names notebook cells)."""
    global _pid
    names = dict(cells or {})
    with _lock:
        if _pid == os.getpid():
            return
        _pid = os.getpid()
        _counts.clear()

    def copied(transfers: int) -> None:
        stack = traceback.extract_stack()[:-2]  # without this function and the wrapper
        frames = [Frame(entry.name, entry.filename, entry.lineno or 0,
                        names.get(entry.filename)) for entry in reversed(stack)]
        where, via = locate(frames)
        frame = where or via
        if frame is None:
            return
        key = (frame.function, frame.file, frame.line, frame.cell)
        with _lock:
            _counts[key] = _counts.get(key, 0) + transfers

    _xla.watch_mark_sharding(copied)


def data() -> list[dict[str, Any]]:
    """The counts so far (plain data, for a snapshot): one dict per line, most first."""
    with _lock:
        if _pid != os.getpid():
            return []
        items = sorted(_counts.items(), key=lambda item: -item[1])
    return [{"function": function, "file": file, "line": line, "cell": cell, "count": count}
            for (function, file, line, cell), count in items]


def sites(snapshot_reshards: list[dict[str, Any]] | None) -> list[tuple[Frame, int]]:
    """A snapshot's "reshards" back as (frame, copies), most first; malformed entries skipped."""
    found = []
    for entry in snapshot_reshards or []:
        try:
            frame = Frame(str(entry["function"]), str(entry["file"]), int(entry["line"]),
                          None if entry.get("cell") is None else int(entry["cell"]))
            found.append((frame, int(entry["count"])))
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(found, key=lambda pair: -pair[1])
