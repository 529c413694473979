"""The base of every live launch renderer: follows events, throttles drawing.

Like fastprogress's progress-bar base class, timing and throttling live here once; a renderer
implements only `_open`, `_draw(view)` and `_finish(view)` and gets nothing but the data of a
`LaunchView` to draw.
"""

from __future__ import annotations

import time
from typing import Any

from ..observe.launch_reader import LaunchReader
from . import text
from .state import LaunchState, LaunchView


class PanelDisplay:
    """A `LaunchDisplay` that draws a `LaunchState` and redraws at most every `min_interval`.

    Args:
        world: number of ranks.
        per_rank: one bar per rank (default when `world <= 4`) or one per label.
        attempt: "attempt 2 of 4" for an attempt of a call with `max_restarts=`, else "":
            the status line says it.
        reader: the launch's reader, whose record and metrics the panel draws (the launcher
            applies every event to it); None: the panel reads the events `handle` gets itself.
    """

    min_interval: float = 0.25
    # Whether the panel draws streamed generations under its bars (`LaunchDisplay`).
    draws_generations: bool = False

    def __init__(self, world: int, per_rank: bool | None = None, attempt: str = "",
                 reader: LaunchReader | None = None) -> None:
        self.state = LaunchState(world, per_rank=per_rank, attempt=attempt, reader=reader)
        self._last_draw = float("-inf")
        self._drawn_changes = -1
        self._closed = False
        self._open()

    def handle(self, event: Any) -> None:
        """Take an event (read by the panel's own reader only: the launcher's has it
        already); the next `refresh` draws it."""
        self.state.handle(event)

    def refresh(self, force: bool = False) -> None:
        """Redraw if something changed (or clocks moved) and `min_interval` has passed."""
        if self._closed:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.min_interval:
            return
        view = self.state.view()
        if not force and self.state.changes == self._drawn_changes and not self._moving(view):
            return
        self._last_draw = now
        self._drawn_changes = self.state.changes
        self._draw(view)

    def close(self, record: Any = None) -> None:
        """Draw the final state from the launch's record; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self.state.close(record)
        self._finish(self.state.view())

    @property
    def view(self) -> LaunchView:
        """What the panel shows now."""
        return self.state.view()

    def __repr__(self) -> str:
        return text.launch_text(self.state.view())

    # -- for renderers --------------------------------------------------------------------------

    def _moving(self, view: LaunchView) -> bool:
        """Whether a redraw without news is worth it (elapsed times and ETAs tick)."""
        return not view.done

    def _open(self) -> None:
        """Show the empty panel."""

    def _draw(self, view: LaunchView) -> None:
        """Draw `view`."""
        raise NotImplementedError

    def _finish(self, view: LaunchView) -> None:
        """Draw the final `view`."""
        self._draw(view)
