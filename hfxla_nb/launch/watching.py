"""What the two watchers of a launch share: on one host `supervision.Supervision`, on the hosts
of a Ray cluster `pods.cluster_launch._Watch`. Which ranks' lines reach the cell, how often the
panel is redrawn, and how a launch ends are decided here once for both.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..states import Outcome, RankState
from .record import RecordKeeper

if TYPE_CHECKING:
    from ..ui import LaunchDisplay

REFRESH_INTERVAL = 0.25  # seconds between two redraws of the panel while a launch runs
# How the ranks still running end, for each way a launch ends ("finished": none is left, but
# processes that outlived the supervisor are stopped all the same).
STOPPED_AS = {
    Outcome.FINISHED: RankState.STOPPED,
    Outcome.FAILED: RankState.STOPPED,
    Outcome.TIMEOUT: RankState.TIMEOUT,
    Outcome.INTERRUPTED: RankState.INTERRUPTED,
}


def shows(shown_ranks: set[int] | str, ranks: list[int]) -> bool:
    """Whether output of these ranks reaches the cell (`[]`: the launcher's own, shown unless
    `shown_ranks` is "none")."""
    if shown_ranks in ("none", "all"):
        return shown_ranks == "all"
    return not ranks or any(rank in shown_ranks for rank in ranks)


def end_launch(keeper: RecordKeeper, display: LaunchDisplay, outcome: Outcome, began: float,
               *, interrupted_line: str, stop: Callable[[], None] | None = None,
               drain: Callable[[], None] | None = None) -> None:
    """The one place a launch ends, however it ended, on one host or several.

    In this order: the ranks still running end in `STOPPED_AS[outcome]`; `stop()` stops what
    is left of the launch; the record's `outcome` is set; `drain()` applies the events sent
    while it was stopped and closes the relays; the record gets its duration (since `began`)
    and every rank's figures; the display draws the final panel (a drawing bug is printed,
    never raised: it must not hide the result); after the stop button, `interrupted_line` is
    printed on stderr.

    Args:
        keeper: the launch's `RecordKeeper` (its record is the one ended).
        display: the launch's panel.
        outcome: how the launch ended (not `Outcome.RUNNING`).
        began: the `time.monotonic()` at which the launch began.
        interrupted_line: what the user reads after the stop button (which processes were
            stopped, and that the kernel is ready).
        stop: stops every process of the launch; None where the caller stops them after this
            returns (a cluster's hosts).
        drain: applies the last events and closes the relays; None where there is none.
    """
    keeper.mark_stopped(STOPPED_AS[outcome])
    if stop is not None:
        stop()
    keeper.record.outcome = outcome
    if drain is not None:
        drain()
    keeper.record.duration = time.monotonic() - began
    keeper.finish()
    try:
        display.close(keeper.record)
    except Exception as error:  # noqa: BLE001 - a drawing bug must not hide the result
        print(f"hfxla_nb: could not draw the final panel: {error}", file=sys.stderr)
    if outcome == Outcome.INTERRUPTED:
        print(interrupted_line, file=sys.stderr)
