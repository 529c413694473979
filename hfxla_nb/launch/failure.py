"""What the cell's `LaunchError` says about a launch that failed or timed out."""

from __future__ import annotations

import re

from .._words import ranks_were
from ..observe.hbm import explain_hbm_exhaustion
from ..observe.launch_reader import LaunchReader
from ..observe.user_frames import is_library
from ..states import Outcome, RankState


def failure_message(reader: LaunchReader) -> str:
    """The first failure, its traceback, and the ranks stopped because of it (or, after
    `timeout=`, the ranks that were still running).

    Args:
        reader: the reader of the launch that ended.
    """
    record = reader.record
    if record.outcome == Outcome.TIMEOUT:
        stalled = [
            f"rank {r.rank} "
            + (f"at step {r.last_step}" if r.last_step is not None else "before its first step")
            for r in record.ranks
            if r.exit_state == RankState.TIMEOUT
        ]
        return (
            f"the launch timed out after {reader.timeout:g}s and was stopped. Still running: "
            f"{', '.join(stalled) or 'none'}. Every worker process was terminated."
        )
    failed = reader.failure or next((r for r in record.ranks if r.error), None)
    if failed is None:
        return f"the launch ended without a result ({record.outcome})."
    others = [r.rank for r in record.ranks if r.exit_state == RankState.STOPPED]
    stopped = f" {ranks_were(others, 'stopped')}" if others else ""
    error = failed.error or ""
    message = f"rank {failed.rank} failed: {error}{'' if error.endswith('.') else '.'}"
    message += stopped
    if failed.traceback:
        # Whole, as Python prints it: it ends with the exception line.
        message += f"\n\nRemote traceback (rank {failed.rank}):\n{failed.traceback.rstrip()}"
    # XLA's allocator text is a wall of figures: said first in one line with its fixes
    # (the whole text stays below, and on the record).
    explanation = explain_hbm_exhaustion(f"{error}\n{failed.traceback or ''}",
                                         where=_user_line(failed.traceback or ""))
    return message if explanation is None else f"{explanation}\n\n{message}"


def _user_line(traceback: str) -> str | None:
    """The innermost frame of a remote traceback that is the user's code ("file:line", or
    "Cell In[5], line 12" for a notebook cell), or None (`observe.user_frames.is_library`
    decides what is not theirs)."""
    frames = re.findall(r'^\s*(?:File "([^"]+)", line (\d+)|(Cell In\[\d+\], line \d+))',
                        traceback, flags=re.MULTILINE)
    for path, line, cell in reversed(frames):
        if cell:
            return cell
        if not is_library(path):
            return f"{path}:{line}"
    return None
