"""Console renderer: plain, throttled lines for terminals, scripts and CI logs."""

from __future__ import annotations

import sys
from typing import TextIO

from ..observe.launch_reader import LaunchReader
from ..states import PanelState
from . import text
from .base import PanelDisplay
from .state import LaunchView


class ConsoleDisplay(PanelDisplay):
    """Prints a line per bar that moved, at most every `min_interval` seconds, and the full
    final state (status, bars, XLA metrics, alerts) at the end.

    Args:
        world: number of ranks.
        file: where to print (default: `sys.stdout` at the time of printing).
        per_rank: one bar per rank or one per label (see `LaunchState`).
    """

    min_interval = 5.0

    def __init__(self, world: int, file: TextIO | None = None,
                 per_rank: bool | None = None, attempt: str = "",
                 reader: LaunchReader | None = None) -> None:
        self._file = file
        self._printed: dict[tuple, tuple] = {}
        self._status: PanelState | None = None  # the state of the last status line printed
        self._alerts: set[str] = set()
        super().__init__(world, per_rank=per_rank, attempt=attempt, reader=reader)

    def _print(self, line: str) -> None:
        print(line, file=self._file or sys.stdout, flush=True)

    def _moving(self, view: LaunchView) -> bool:
        return False  # print on news only

    def _draw(self, view: LaunchView) -> None:
        if view.state != self._status and view.state != PanelState.STARTING:
            self._status = view.state
            self._print(text.status_line(view))
        name_width = max((len(bar.name) for bar in view.bars), default=0)
        for bar in view.bars:
            key = (bar.rank, bar.label)
            seen = (bar.step, bar.state, tuple(bar.values.items()))
            if self._printed.get(key) != seen:
                self._printed[key] = seen
                self._print(text.bar_line(bar, name_width=name_width))
        for alert in view.alerts:
            if alert.code not in self._alerts:
                self._alerts.add(alert.code)
                self._print("\n".join(text.alert_lines([alert])))

    def _finish(self, view: LaunchView) -> None:
        self._print(text.launch_text(view))
