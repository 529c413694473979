"""HTML renderer: one output updated in place (`display_id`), for notebooks without widgets."""

from __future__ import annotations

from typing import Any

from . import html, text
from .base import PanelDisplay
from .state import LaunchView


class HtmlBlock:
    """A displayable with an HTML form and a text form (for terminals and nbconvert)."""

    def __init__(self, html_text: str, plain: str) -> None:
        self.html = html_text
        self.plain = plain

    def _repr_html_(self) -> str:
        return self.html

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": self.html, "text/plain": self.plain}

    def __repr__(self) -> str:
        return self.plain


class HtmlDisplay(PanelDisplay):
    """Draws the launch as HTML in one output, replaced with `DisplayHandle.update`."""

    min_interval = 0.5
    draws_generations = True  # each prompt with its text so far, under the bars

    def _open(self) -> None:
        from IPython.display import display

        self._handle = display(self._block(self.state.view()), display_id=True)

    @staticmethod
    def _block(view: LaunchView) -> HtmlBlock:
        return HtmlBlock(html.launch_html(view), text.launch_text(view))

    def _draw(self, view: LaunchView) -> None:
        if self._handle is not None:
            self._handle.update(self._block(view))
