"""A launch's generations as they stream in (`Generated` events): each row's prompt and its
text so far, for the panels to draw under the prompt (`hx.generate(..., stream=True)`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..events import Generated


@dataclass
class StreamedRow:
    """One row of a generation: its prompt, the text generated so far, whether it ended."""

    prompt: str
    text: str = ""
    done: bool = False


class StreamedText:
    """The rows of each rank's latest generation, as its `Generated` events left them."""

    def __init__(self) -> None:
        self.by_rank: dict[int | None, list[StreamedRow]] = {}

    def add(self, event: Generated) -> None:
        """Apply one event: a generation's first event (it names the prompts) starts new
        rows; a later one adds each row's new text."""
        rows = self.by_rank.get(event.rank)
        if event.prompts or rows is None or len(rows) != len(event.texts):
            prompts = event.prompts or ("",) * len(event.texts)
            rows = self.by_rank[event.rank] = [StreamedRow(prompt) for prompt in prompts]
        for row, piece in zip(rows, event.texts, strict=False):
            row.text += piece
            row.done = event.done

    def rows(self) -> list[StreamedRow]:
        """The rows the panels show: the lowest rank's (every rank generates alike)."""
        if not self.by_rank:
            return []
        rank = min(self.by_rank, key=lambda r: (r is None, r or 0))
        return [StreamedRow(row.prompt, row.text, row.done) for row in self.by_rank[rank]]
