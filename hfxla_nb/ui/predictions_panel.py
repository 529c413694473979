"""The `Predictions` panel: `predict`'s answers as a table, as HTML (notebooks) and as text.

The rows and columns are the task's own (`Predictions.table()`, from `Task.prediction_table`:
labels and scores, entities with their spans, answers, generated text); this module only
rounds and shortens them for people. The first `MAX_ROWS` rows are shown, and a line says how
many more there are. The dicts and `to_dataframe()` keep every value exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from .._words import plural
from . import table_style as style
from .table_style import aligned_lines
from .units import duration, score

#: Rows shown; a longer table says how many more `to_dataframe()` has.
MAX_ROWS = 20
#: Characters of a text cell (generated text, a masked LM's sequence) before it is cut.
TEXT_CELL_CHARS = 48
HTML_CELL_CHARS = 300
#: The index column added when a task's table has none, so each row names its input.
INPUT_COLUMN = "input"
#: What an empty table says (token classification that found no entity in any input).
NO_ROWS = "(no rows: nothing found)"


def text_cell(value: Any, limit: int = TEXT_CELL_CHARS) -> str:
    """One value of the table for people: floats rounded as the evaluation's metrics are
    (`units.score`: 4 decimals), None as an empty cell, texts cut at `limit` characters
    (`…` says so), lists item by item.

    Args:
        value: a value of a prediction's row (plain Python).
        limit: the most characters a text keeps.
    """
    if value is None:
        return ""
    if value == "":  # an answer that is no answer (SQuAD v2): said, not an empty cell
        return '""'
    if isinstance(value, float):
        return score(value)
    if isinstance(value, (list, tuple)):
        text = ", ".join(text_cell(item, limit) for item in value)
    elif isinstance(value, dict):
        text = ", ".join(f"{key}: {text_cell(item, limit)}" for key, item in value.items())
    else:
        text = str(value)
    text = " ".join(text.split())  # a newline of a generated text would break the row
    return text if len(text) <= limit else text[:limit - 1] + "…"


#: The side, in pixels, of an image input's thumbnail in the HTML table.
THUMBNAIL = 32


def _image_size(value: Any) -> tuple[int, int] | None:
    """(width, height) of an image input (a PIL image, or an array of height x width
    [x channels]), else None."""
    size = getattr(value, "size", None)
    if isinstance(size, tuple) and len(size) == 2 and hasattr(value, "mode"):  # PIL
        return int(size[0]), int(size[1])
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) in (2, 3):
        return int(shape[1]), int(shape[0])
    return None


def input_text(value: Any, limit: int = TEXT_CELL_CHARS) -> str:
    """An input as its table cell names it: the text (cut as `cell` cuts), `image 32x32` for
    an image, `audio, 16000 samples` for a waveform."""
    size = _image_size(value)
    if size is not None:
        return f"image {size[0]}x{size[1]}"
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) == 1:
        return f"audio, {shape[0]} samples"
    if isinstance(value, dict) and getattr(value.get("array"), "shape", None) is not None:
        return input_text(value["array"], limit)  # datasets' Audio: {"array", "sampling_rate"}
    return text_cell(value, limit)


def input_html(value: Any, limit: int = HTML_CELL_CHARS) -> str:
    """An input as HTML: an image's thumbnail (`THUMBNAIL` px, its size as the tooltip),
    else `input_text`, escaped."""
    words = input_text(value, limit)
    if _image_size(value) is None:
        return escape(words)
    try:
        import base64
        import io

        import numpy as np
        from PIL import Image

        image = value if hasattr(value, "mode") else Image.fromarray(
            np.asarray(value).astype(np.uint8) if np.asarray(value).dtype != np.uint8
            else np.asarray(value))
        image = image.convert("RGB")
        image.thumbnail((THUMBNAIL, THUMBNAIL))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
    except Exception:  # noqa: BLE001 - no Pillow, an odd array: the words say what it was
        return escape(words)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (f'<img src="data:image/png;base64,{data}" alt="{escape(words)}" '
            f'title="{escape(words)}" style="max-width:{THUMBNAIL}px;max-height:{THUMBNAIL}px;'
            'vertical-align:middle">')


@dataclass
class ShownTable:
    """The shown part of the predictions' table, as strings.

    Attributes:
        columns: the column names (an `input` index first when the task's table has none).
        rows: the first `MAX_ROWS` rows, as shown values.
        more: how many rows are left out.
        numeric: for each column, whether its values are numbers (aligned right).
        per_input: whether the table has one row per input (else the task's own rows: one
            per entity found, per candidate token, each naming its input).
        inputs: for each shown row, the input it names (when the predictions know their
            inputs; the HTML draws an image's thumbnail from it), else None.
    """

    columns: list[str]
    rows: list[list[str]]
    more: int
    numeric: list[bool]
    per_input: bool
    inputs: list[Any] | None = None

    @property
    def total(self) -> int:
        return len(self.rows) + self.more


def shown_table(predictions: Any, limit: int = TEXT_CELL_CHARS) -> ShownTable:
    """What the panel shows of `predictions.table()`: its first `MAX_ROWS` rows, rounded and
    cut (`cell`), each row named by its input.

    Args:
        predictions: a `Predictions`.
        limit: the most characters of a text cell.
    """
    rows, columns = predictions.table()
    indexed = INPUT_COLUMN not in columns
    names = [INPUT_COLUMN, *columns] if indexed else list(columns)
    given = getattr(predictions, "inputs", None)
    # Each row's input: its own index (a row per input), or the one the task's row names.
    which = [i if indexed else row.get(INPUT_COLUMN) for i, row in enumerate(rows[:MAX_ROWS])]
    known = given is not None and all(isinstance(i, int) and 0 <= i < len(given)
                                      for i in which)
    inputs = [given[i] for i in which] if known else None
    shown = []
    for i, row in enumerate(rows[:MAX_ROWS]):
        values = [text_cell(row.get(name), limit) for name in columns]
        named = input_text(inputs[i], limit) if inputs is not None else str(which[i])
        if indexed:
            values = [named, *values]
        elif inputs is not None:
            values[columns.index(INPUT_COLUMN)] = named
        shown.append(values)
    numeric = [inputs is None] * indexed + [
        inputs is None if name == INPUT_COLUMN
        else _is_numeric([row.get(name) for row in rows[:MAX_ROWS]]) for name in columns]
    return ShownTable(names, shown, max(len(rows) - MAX_ROWS, 0), numeric, indexed, inputs)


def _is_numeric(values: list[Any]) -> bool:
    """Whether a column holds numbers (None aside): it is aligned right, as numbers are."""
    present = [value for value in values if value is not None]
    return bool(present) and all(isinstance(value, (int, float)) and not isinstance(value, bool)
                                 for value in present)


def predictions_heading(predictions: Any, table: ShownTable) -> str:
    """`Predictions: 3 inputs (classification), 1 graph compiled, 520 ms in the worker`; the
    table's rows too when they are not one per input (one per entity found, ...)."""
    what = plural(len(predictions), "input")
    if not table.per_input:
        what += f", {plural(table.total, 'row')}"
    text = f"Predictions: {what} ({predictions.task or 'no task'})"
    text += f", {plural(predictions.compiles, 'graph')} compiled"
    if predictions.seconds:
        text += f", {duration(predictions.seconds)} in the worker"
    return text


def footer(more: int) -> str:
    """What the table leaves out, and where every value is whole and exact."""
    left_out = f"... {plural(more, 'more row')}; " if more else ""
    return f"{left_out}values rounded here; to_dataframe() has every row, exact"


def predictions_text(predictions: Any) -> str:
    """The predictions as aligned text (numbers right): the heading, the table, the footer."""
    table = shown_table(predictions)
    lines = [predictions_heading(predictions, table)]
    if not table.rows:
        return "\n".join([*lines, f"  {NO_ROWS}"])
    lines += [("  " + line).rstrip()
              for line in aligned_lines([table.columns, *table.rows], table.numeric)]
    lines.append(f"  {footer(table.more)}")
    return "\n".join(lines)


def predictions_html(predictions: Any) -> str:
    """The predictions as an HTML table under their heading, the footer under it, in the one
    box (numbers right-aligned)."""
    shown = shown_table(predictions, HTML_CELL_CHARS)
    head = style.row(
        style.cell(escape(name), style.HEAD_NUMBER if numeric else style.HEAD, "th")
        for name, numeric in zip(shown.columns, shown.numeric, strict=True))
    where = shown.columns.index(INPUT_COLUMN)
    body = [style.row(style.cell(input_html(shown.inputs[r]) if shown.inputs is not None
                                 and c == where else escape(text),
                                 style.NUMBER if numeric else style.TD)
                      for c, (text, numeric) in enumerate(zip(line, shown.numeric,
                                                              strict=True)))
            for r, line in enumerate(shown.rows)]
    html = style.table(body, head) if shown.rows else f"<div>{NO_ROWS}</div>"
    note = (f'<div style="{style.SMALL}">{escape(footer(shown.more))}</div>'
            if shown.rows else "")
    title = style.heading(escape(predictions_heading(predictions, shown)))
    return style.panel(title + html + note, "hfxla-predictions")
