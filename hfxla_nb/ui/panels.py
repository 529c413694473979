"""The panels of the lower layers' data objects, as HTML (notebooks) and as text (terminals,
nbconvert, logs), and how IPython is told to draw them.

`RuntimeInfo`, `DoctorReport`, `FineTuneResult`, `Predictions` and `MemoryPlan` are plain
data and import nothing from `ui`; `register()` tells IPython's own formatters, by type name,
how to draw each. The package's entry points call it when a shell is running. Every panel is a
plain function of its data, so tests call them directly.

- A result's evaluation metrics as people read them: counts whole, scores to 4 decimals, and
  token classification's per-entity metrics as one grid (entity x precision, recall, F1,
  entities) rather than a long column.
- `Predictions`: `predict`'s answers as a table. The rows and columns are the task's own
  (`Task.prediction_table`); this module only rounds and shortens them for people. The first
  `MAX_ROWS` rows are shown, and a line says how many more there are; the dicts and
  `to_dataframe()` keep every value exact.
- The memory plan: its table (each part per device, the settings, and the changes that would
  make it fit), and the one line shown in the cell before the fork (`show_memory_plan`), in
  the launch panel's mode (a widget replaced by static HTML when the launch ends, an HTML
  output, or a printed line). The fields are read by name: a `MemoryPlan`, or the plain dict
  a `FineTuneResult` keeps. The result's memory row (`memory_row`) says what the cell said.
- `FineTuneResult`: rows of plain text, with the loss chart.
- `DoctorReport`: a row per step, its mark, what it found and its time, then what to do.
- `RuntimeInfo`: every value escaped; secrets were already replaced by "<hidden>".
"""

from __future__ import annotations

import bisect
import html
import re
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from html import escape
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .._words import COUNT_WORDS, is_count, plural  # noqa: F401 - read with the table's rules
from ..runtime.environment import host_name, launch_plan
from . import state as style
from .html import COLORS, SERIES, chart_range, loss_legend_html, sparkline_svg
from .live import HtmlBlock
from .state import (
    AMBER,
    BLUE,
    GREEN,
    HEAD,
    HEAD_NUMBER,
    LABEL,
    MUTED,
    NAME,
    NUMBER,
    RED,
    SMALL,
    TABLE,
    TD,
    TEXT,
    TR,
    aligned_lines,
    badge,
    cell,
    duration,
    heading,
    label_row,
    panel,
    row,
    score,
    sharding_words,
    size,
    table,
    text_color,
    themed,
)
from .state import LABEL as LABEL_CELL

if TYPE_CHECKING:
    from ..runtime import Problem, RuntimeInfo
    from ..runtime.doctor_report import DoctorReport
    from ..train.memory import MemoryPlan as Plan


# -- a result's evaluation metrics --

# The per-entity statistics of token classification (`eval_<TYPE>_<statistic>`), in the
# grid's column order.
ENTITY_COLUMNS = ("precision", "recall", "f1", "entities")
# A kind gets a grid row only when it has these: QA's `eval_has_answer_f1` alone is no entity.
ENTITY_REQUIRED = frozenset({"precision", "recall", "f1"})
_ENTITY_NAME = re.compile(r"^eval_(?P<kind>.+)_(?P<stat>precision|recall|f1|entities)$")


def metric_value(name: str, value: float) -> str:
    """A metric for people: counts as integers (`719`, `12,480`), any other value as
    `ui.state.score` rounds it (the predictions' scores too): 4 decimals (`0.0075`), one for large
    values (`1,234.5`)."""
    if value == value and value not in (float("inf"), float("-inf")) and is_count(name, value):
        return f"{int(value):,}"
    return score(value)


def split_entity_metrics(metrics: dict[str, float]
                         ) -> tuple[list[tuple[str, str]], list[list[str]]]:
    """The metrics as (name, value) rows, with the per-entity ones taken out into a grid.

    Args:
        metrics: the evaluation metrics, name -> value.

    Returns:
        `(rows, grid)`: the other metrics as (name, shown value), in their order; and the grid
        as lists of strings, a header row (`entity`, `precision`, `recall`, `f1`, `entities`)
        first, then one row per entity type in the metrics' order. `grid` is empty when no
        entity type has a precision, a recall and an F1.
    """
    by_kind: dict[str, dict[str, str]] = {}
    for name, value in metrics.items():
        match = _ENTITY_NAME.match(name)
        if match:
            by_kind.setdefault(match["kind"], {})[match["stat"]] = metric_value(name, value)
    kinds = [kind for kind, stats in by_kind.items() if ENTITY_REQUIRED <= stats.keys()]
    gridded = {f"eval_{kind}_{stat}" for kind in kinds for stat in by_kind[kind]}
    rows = [(name, metric_value(name, value)) for name, value in metrics.items()
            if name not in gridded]
    if not kinds:
        return rows, []
    grid = [["entity", *ENTITY_COLUMNS]]
    grid += [[kind, *(by_kind[kind].get(stat, "") for stat in ENTITY_COLUMNS)]
             for kind in kinds]
    return rows, grid


def evaluation_text(metrics: dict[str, float]) -> str:
    """The metrics as lines of aligned text: `name  value` rows, then the entity grid (names
    left, numbers right)."""
    rows, grid = split_entity_metrics(metrics)
    lines = []
    if rows:
        width = max(len(name) for name, _ in rows)
        lines += [f"{name:<{width}}  {value}" for name, value in rows]
    if grid:  # entity names left, numbers right
        lines += aligned_lines(grid, [False] + [True] * (len(grid[0]) - 1))
    return "\n".join(lines)


def evaluation_html(metrics: dict[str, float]) -> str:
    """The metrics as a small two-column table, then the entity grid as a table of its own
    with a header row (the one table style: names left, numbers right)."""
    rows, grid = split_entity_metrics(metrics)
    html = ""
    if rows:
        html += table(row([cell(escape(name), NAME), cell(escape(value), NUMBER)])
                      for name, value in rows)
    if grid:
        head = row(cell(escape(text), HEAD_NUMBER if i else HEAD, "th")
                   for i, text in enumerate(grid[0]))
        html += table((row(cell(escape(text), NUMBER if i else NAME)
                           for i, text in enumerate(line)) for line in grid[1:]), head)
    return html


# -- Predictions --

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
    (`ui.state.score`: 4 decimals), None as an empty cell, texts cut at `limit` characters
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
    which = [i if indexed else answer.get(INPUT_COLUMN)
             for i, answer in enumerate(rows[:MAX_ROWS])]
    known = given is not None and all(isinstance(i, int) and 0 <= i < len(given)
                                      for i in which)
    inputs = [given[i] for i in which] if known else None
    shown = []
    for i, answer in enumerate(rows[:MAX_ROWS]):
        values = [text_cell(answer.get(name), limit) for name in columns]
        named = input_text(inputs[i], limit) if inputs is not None else str(which[i])
        if indexed:
            values = [named, *values]
        elif inputs is not None:
            values[columns.index(INPUT_COLUMN)] = named
        shown.append(values)
    numeric = [inputs is None] * indexed + [
        inputs is None if name == INPUT_COLUMN
        else _is_numeric([answer.get(name) for answer in rows[:MAX_ROWS]]) for name in columns]
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


# -- the memory plan: its table, and its line before the fork --

GIB_BYTES = 2**30  # bytes per GiB
PLAN_LABEL = "memory"
# What introduces the changes of a plan that does not fit (text and HTML).
FIT_HEADING = "What would make it fit, cheapest first (each on top of the ones before):"
# The plan's class, on its box: the line alone (the cell before the fork) or with its changes.
PLAN_CLASS = "hfxla-plan"


def as_plan(plan: Plan | Mapping[str, Any]) -> Plan:
    """A plan to draw: a `MemoryPlan` as it is; the dict a `FineTuneResult` keeps read by its
    keys (its changes too)."""
    if not isinstance(plan, Mapping):
        return plan
    fields = dict(plan)
    fields["changes"] = [SimpleNamespace(**change) for change in fields.get("changes") or ()]
    fields.setdefault("notes", ())
    return SimpleNamespace(**fields)  # type: ignore[return-value]


def _gib(value: float) -> str:
    return size(round(value * GIB_BYTES))


def plan_settings(plan: Plan) -> list[str]:
    """The settings the plan was made for, in words: batch, precision, LoRA or not, sharding,
    gradient checkpointing."""
    return [f"batch {plan.batch_size} x {plan.max_length} tokens", plan.precision,
            f"LoRA r={plan.lora_rank}" if plan.lora_rank else "full fine-tune",
            f"{plan.sharding} sharding",
            "gradient checkpointing" if plan.gradient_checkpointing
            else "no gradient checkpointing"]


def plan_title(plan: Plan) -> str:
    """`Llama on v5e-1 (1 device, 15.48 GiB each): 1.20 GiB per device, fits`."""
    verdict = "fits" if plan.fits else "does not fit"
    return (f"{plan.model} on {plan.hardware} ({plan.devices} device"
            f"{'s' if plan.devices != 1 else ''}, {plan.device_memory_gib:.2f} GiB each): "
            f"{plan.total_gib:.2f} GiB per device, {verdict}")


def plan_rows(plan: Plan) -> list[tuple[str, str, float | None, str]]:
    """The plan's table as data: (part, count, GiB per device or None, note) for the
    parameters, the trainable ones, gradients, optimizer state, activations and the total."""
    return [
        ("parameters", _count(plan.parameters), plan.parameters_gib, ""),
        ("trainable", _count(plan.trainable_parameters), None, ""),
        ("gradients", "", plan.gradients_gib, ""),
        ("optimizer state", "AdamW", plan.optimizer_gib, ""),
        ("activations", "", plan.activations_gib,
         f"(estimate; {plan.activations_full_gib:.2f} without, "
         f"{plan.activations_checkpointed_gib:.2f} with gradient checkpointing)"),
        ("total per device", "", plan.total_gib, f"of {plan.device_memory_gib:.2f}"),
    ]


def plan_table(plan: Plan) -> str:
    """The plan as a small table: the settings, each part per device, the total against the
    device, the notes, and the changes that would make it fit (a `MemoryPlan`'s text)."""
    lines = [plan_title(plan), "  " + ", ".join(plan_settings(plan))]
    for label, count, gib, note in plan_rows(plan):
        line = f"  {label:<18}{count:>8}"
        if gib is not None:
            line += f"  {gib:8.2f} GiB"
        lines.append(f"{line}  {note}" if note else line)
    lines += [f"  note: {note}" for note in plan.notes]
    if plan.changes:
        lines.append(FIT_HEADING)
        lines += [f"  {number}. {change.change} ({change.argument}): "
                  f"{change.total_gib:.2f} GiB per device{', fits' if change.fits else ''}"
                  for number, change in enumerate(plan.changes, start=1)]
    return "\n".join(lines)


def plan_table_html(plan: Plan) -> str:
    """A `MemoryPlan` as a cell's value, as HTML: a panel with the plan's title and settings,
    a table of each part per device (the rows of `plan_table`), the notes, and the changes
    that would make it fit. Not the line `fine_tune` shows before the fork (`plan_html`): a
    cell that shows a plan and then fine-tunes shows that line once."""
    rows = [row([cell(escape(label), LABEL_CELL, "th"), cell(escape(count), NUMBER),
                 cell(f"{gib:.2f} GiB" if gib is not None else "", NUMBER),
                 cell(escape(note), f"{TD}{MUTED}")])
            for label, count, gib, note in plan_rows(plan)]
    verdict = "fits" if plan.fits else "does not fit"
    title = plan_title(plan).rsplit(": ", 1)[0]
    notes = "".join(f'<div style="{MUTED}">note: {escape(note)}</div>' for note in plan.notes)
    changes = ""
    if plan.changes:
        items = "".join(
            f"<li>{escape(change.change)} (<code>{escape(change.argument)}</code>): "
            f"{change.total_gib:.2f} GiB per device{', fits' if change.fits else ''}</li>"
            for change in plan.changes)
        changes = f'{FIT_HEADING}<ol style="margin:0;padding-left:2em">{items}</ol>'
    return panel(f"<div>{heading('memory plan')} {badge(verdict, GREEN if plan.fits else RED)} "
                 f"{escape(title)}</div>"
                 f'<div style="{MUTED}">{escape(", ".join(plan_settings(plan)))}</div>'
                 f"{table(rows)}{notes}{changes}", PLAN_CLASS)


def _count(number: int) -> str:
    """6738415616 -> "6.74B", 4194304 -> "4.19M"."""
    for suffix, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if number >= scale:
            return f"{number / scale:.2f}{suffix}"
    return str(number)


def plan_text(plan: Plan | Mapping[str, Any]) -> str:
    """`plan 1.2 GiB per device (parameters ..., gradients ..., optimizer ..., activations
    ...)`: a plan's figures per device (the words of the result's memory row)."""
    figures = as_plan(plan)
    parts = [f"parameters {_gib(figures.parameters_gib)}",
             f"gradients {_gib(figures.gradients_gib)}",
             f"optimizer {_gib(figures.optimizer_gib)}",
             f"activations {_gib(figures.activations_gib)}"]
    overhead = getattr(figures, "overhead_gib", None)
    if overhead:
        parts.append(f"XLA's program and buffers {_gib(overhead)}")
    return f"plan {_gib(figures.total_gib)} per device ({', '.join(parts)})"


def plan_line(plan: Plan | Mapping[str, Any]) -> str:
    """The plan before the launch: its figures, against what one device has, and what the
    "auto" settings chose and why. `plan 1.2 GiB per device (...) of 15.8 GiB on v5e-1, fits;
    lora="auto": ...`"""
    figures = as_plan(plan)
    verdict = "fits" if getattr(figures, "fits", True) else "does not fit"
    text = (f"{plan_text(figures)} of {_gib(figures.device_memory_gib)} per device on "
            f"{figures.hardware}: {verdict}")
    return "; ".join([text, *(figures.notes or ())])


def plan_html(plan: Plan | Mapping[str, Any]) -> str:
    """`plan_line` as one HTML line, under its heading `memory` (no box: the panels that show
    it put it in theirs, `plan_panel_html` and `plan_table_html`)."""
    return line_html(PLAN_LABEL, plan_line(plan))


def line_html(label: str, words: str) -> str:
    """A line under its heading, in the panels' font (so it reads as one of them, not as
    monospaced output)."""
    return f'<div style="{TEXT}">{heading(label)}&nbsp;&nbsp;{escape(words)}</div>'


def plan_panel_html(plan: Plan | Mapping[str, Any]) -> str:
    """The plan's line as a panel of its own, in the one box: what the cell shows before the
    fork."""
    return panel(plan_html(plan), PLAN_CLASS)


class PlanNotice:
    """One line in the cell before the fork, drawn in one mode ("widgets", "html", "console",
    "none"): what `fine_tune` is preparing, then its memory plan (`show`) in the same place,
    so the cell is never blank while the kernel loads and tokenizes and nothing moves when the
    plan arrives.

    Args:
        plan: the memory plan to show (a `MemoryPlan` or its dict), or None.
        mode: the mode to draw in.
        line: `(html, text)` to show instead of a plan (the preparing line).

    Attributes:
        mode: the mode it was drawn in.
        text: the line, as text (also its `repr()`).
        widget: the `ipywidgets.HTML` while it is live ("widgets" mode), else None.
    """

    def __init__(self, plan: Plan | Mapping[str, Any] | None, mode: str,
                 line: tuple[str, str] | None = None) -> None:
        self.mode = mode
        self.html, self.text = line if line is not None else plan_notice_line(plan)
        self.widget: Any = None
        self._handle: Any = None
        if mode == "console":
            print(self.text, flush=True)
        elif mode == "html":
            from IPython.display import display

            self._handle = display(self._block(), display_id=True)
        elif mode == "widgets":
            import ipywidgets as widgets
            from IPython.display import display

            self.widget = widgets.HTML(value=self.html, layout=widgets.Layout(margin="0px"))
            self._handle = display(self, display_id=True)

    def show(self, html_text: str, text: str) -> None:
        """Draw another line in the same place ("" and "": nothing is left there)."""
        self.html, self.text = html_text, text
        if self.widget is not None:
            self.widget.value = html_text
        elif self._handle is not None:
            self._handle.update(self._block())
        elif self.mode == "console" and text:
            print(text, flush=True)

    def _block(self) -> HtmlBlock:
        return HtmlBlock(self.html, self.text)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if self.widget is None:
            return self._block()._repr_mimebundle_()
        return {"text/plain": self.text,
                "application/vnd.jupyter.widget-view+json": {
                    "version_major": 2, "version_minor": 0, "model_id": self.widget.model_id}}

    def close(self) -> None:
        """When the launch ended: the widget view becomes static HTML with its text form and
        the widget is closed (nothing for a saved notebook to miss); other modes keep theirs."""
        if self.widget is None:
            return
        widget, self.widget = self.widget, None
        if self._handle is not None:
            self._handle.update(self._block())
        widget.close()

    def __repr__(self) -> str:
        return self.text


def plan_notice_line(plan: Plan | Mapping[str, Any] | None,
                     prepared: float | None = None) -> tuple[str, str]:
    """The line before the fork, `(html, text)`: the memory plan, and how long the kernel took
    to prepare the run (`prepared` seconds) where known; ("", "") for neither."""
    took = (f"prepared in {style.clock(prepared)} in this process (the model's config, its "
            "tokenizer, the data tokenized)") if prepared is not None else ""
    if plan:
        label, words = PLAN_LABEL, plan_line(plan) + (f"; {took}" if took else "")
    elif took:
        label, words = PREPARING_LABEL, took
    else:
        return "", ""
    return notice_line(label, words)


def notice_line(label: str, words: str) -> tuple[str, str]:
    """A line before the fork, `(html, text)`: in the one box, under its heading."""
    return panel(line_html(label, words), PLAN_CLASS), f"{label}  {words}"


PREPARING_LABEL = "fine_tune"
# What the cell shows from the call's first moment until the plan (or the launch) replaces it:
# loading and tokenizing take seconds in the kernel, and the cell was blank for all of them.
PREPARING = ("preparing in this process: the model's config and tokenizer, the data read and "
             "tokenized (the devices are not touched yet)")


def show_preparing(mode: str | bool = "auto") -> PlanNotice | None:
    """Show that `fine_tune` is preparing, in the launch panel's mode, in notebooks only (a
    terminal gets the plan line alone, as before); None when nothing is drawn. The memory
    plan takes its place (`show_memory_plan(..., notice=)`)."""
    from . import select_mode

    chosen = select_mode(mode)
    if chosen not in ("widgets", "html"):
        return None
    return PlanNotice(None, chosen, notice_line(PREPARING_LABEL, PREPARING))


def show_memory_plan(plan: Plan | Mapping[str, Any] | None, mode: str | bool = "auto",
                     notice: PlanNotice | None = None,
                     prepared: float | None = None) -> PlanNotice | None:
    """Show a fine-tune's memory plan in the cell, in the launch panel's mode.

    Args:
        plan: a `MemoryPlan` (or its `dataclasses.asdict`), or None (nothing is shown).
        mode: as `notebook_launcher(progress=)`: "auto", "widgets", "html", "console", or
            False/"none".
        notice: the preparing line (`show_preparing`): the plan takes its place, with how
            long the preparation took.
        prepared: the seconds the preparation took, said with the plan where `notice` is
            given.

    Returns:
        The `PlanNotice` drawn (call `close()` when the launch ended), or None when there is
        no plan or nothing is drawn.
    """
    from . import select_mode

    if notice is not None:
        notice.show(*plan_notice_line(plan, prepared))
        return notice
    if not plan:
        return None
    chosen = select_mode(mode)
    if chosen == "none":
        return None
    return PlanNotice(plan, chosen)


# -- FineTuneResult --

# Loss entries shown in the text chart; longer histories are sampled down to this many.
TEXT_CHART_WIDTH = 32
SPARK_CHARS = "▁▂▃▄▅▆▇█"
GIB = 2**30


def sampled(values: list[float], width: int) -> list[float]:
    """At most `width` of `values`, evenly spaced, the first and the last kept."""
    if len(values) <= width:
        return list(values)
    stride = (len(values) - 1) / (width - 1)
    return [values[round(i * stride)] for i in range(width)]


def loss_extremes(result: Any) -> tuple[tuple[int, float], tuple[int, float]]:
    """((step, highest loss), (step, lowest loss)) of the logged losses."""
    history = [(step, loss) for step, loss in result.loss_history if loss == loss]
    return (max(history, key=lambda pair: pair[1]), min(history, key=lambda pair: pair[1]))


def loss_scale(result: Any) -> str:
    """`█ 2.3145 at step 4, ▁ 0.1234 at step 44`: the text chart's scale."""
    (high_step, high), (low_step, low) = loss_extremes(result)
    return (f"{SPARK_CHARS[-1]} {high:.4f} at step {high_step}, "
            f"{SPARK_CHARS[0]} {low:.4f} at step {low_step}")


def loss_text_chart(losses: list[float], width: int = TEXT_CHART_WIDTH) -> str:
    """The loss as a line of block characters, lowest `▁`, highest `█`."""
    values = [loss for loss in losses if loss == loss]
    points = sampled(values, width)
    low, high = min(values), max(values)  # the scale of every loss, sampled out or not
    top = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[top // 2 if high == low
                               else round((value - low) / (high - low) * top)]
                   for value in points)


def lora_row(result: Any) -> str | None:
    """`r=8, alpha=16, on all-linear; 73,728 of 1,234,567 parameters trained (5.97%); the
    adapter alone in <output_dir>/adapter`; None for a full fine-tune."""
    lora = result.lora
    if not lora:
        return None
    targets = lora.get("target_modules") or "all-linear"
    if not isinstance(targets, str):
        targets = ", ".join(sorted(targets))
    text = f"r={lora.get('r')}, alpha={lora.get('lora_alpha')}, on {targets}"
    trainable, total = result.trainable_parameters, result.parameters
    if trainable and total:
        text += f"; {trainable:,} of {total:,} parameters trained ({trainable / total:.2%})"
    if result.output_dir:
        text += (f"; the adapter alone in {result.output_dir}/adapter "
                 "(result.load_model(merge=False) loads it on its base)")
    return text


def memory_row(result: Any) -> str | None:
    """`plan 1.2 GiB per device (...), XLA measured 1.0 GiB (the largest graph): 0.83x the
    plan`: the memory plan the run was checked with beside what XLA's analysis of the
    compiled graphs says the largest one needs; None when the run had no plan."""
    plan = result.memory_plan
    if not plan:
        return None
    planned = round(plan["total_gib"] * GIB)
    text = plan_text(plan)  # the words the cell showed before the launch
    measured = result.xla.get("largest_graph_bytes")
    if measured:
        text += (f", XLA measured {size(measured)} (the largest graph): "
                 f"{measured / planned:.2f}x the plan")
    else:
        text += ", XLA measured nothing (trace_compiles=False)"
    return text


def warm_row(result: Any) -> str | None:
    """What the run's warm session holds as the result is drawn: "the trained model on 1
    device, 1.2 GiB of device memory; held until result.release(), 10 min without a call, or
    the kernel's end"; "released ..." once it ended; None for a run that kept nothing."""
    session = getattr(result, "session", None)
    if session is None:
        return None
    if not result.warm:
        return "released: its devices and their memory are free"
    info = session.info()
    memory = ("device memory not reported here" if info.memory is None
              else f"{info.memory / 2**30:.1f} GiB of device memory")
    limit = (f", {duration(info.idle_timeout)} without a call" if info.idle_timeout is not None
             else "")
    return (f"the trained model on {plural(info.devices, 'device')} ({memory}); held until "
            f"result.release(){limit}, or the kernel's end")


def next_step(result: Any) -> str | None:
    """What to do with the result now, as code to type."""
    if not result.output_dir:
        return None
    # A run that ended warm: its model stays on the devices until released (the panel is
    # static HTML: it says where the calls run, not whether the model is warm now).
    where = ("on the model this run left on the devices while result.warm, else in a launched "
             "worker; result.release() frees them" if getattr(result, "session", None)
             else "in a launched worker")
    if result.generates:
        return (f'result.generate(["a prompt"], max_new_tokens=32) continues prompts on the '
                f"devices ({where}); result.load_model() and result.load_tokenizer() give the "
                "model and its tokenizer on the CPU here")
    example = result.predict_example or '["a text"]'
    processor = getattr(result, "processor", None) or "tokenizer"
    load = "load_tokenizer" if processor == "tokenizer" else "load_processor"
    return (f"result.predict({example}) predicts on every XLA device ({where}); "
            f"result.load_model() and result.{load}() give the trained model and its "
            f"{processor} on the CPU here (the XLA runtime stays off, so you can launch again)")


def _time_row(result: Any) -> str:
    """`launch 10.4 s: training loop 7.4 s, evaluation 0.4 s, start-up and saving 2.6 s`:
    what each time counts, so the launch panel's, the bar's and this one agree."""
    parts = [f"training loop {duration(result.train_seconds)}"]
    if result.metrics:
        parts.append(f"evaluation {duration(result.eval_seconds)}")
    launch = result.launch_seconds
    if launch is None:
        return ", ".join(parts)
    rest = launch - result.train_seconds - result.eval_seconds
    if rest > 0:
        parts.append(f"start-up and saving {duration(rest)}")
    return f"launch {duration(launch)}: " + ", ".join(parts)


def _speed_row(result: Any) -> str | None:
    """`493.2 samples/s after warm-up; 205.0 samples/s over the whole training loop`."""
    parts = []
    if result.samples_per_second:
        parts.append(f"{result.samples_per_second:,.1f} samples/s after warm-up (the compiling "
                     "first steps left out)")
    overall = result.samples_per_second_overall
    if overall:
        parts.append(f"{overall:,.1f} samples/s over the whole training loop")
    return "; ".join(parts) or None


def _task_text(result: Any) -> str:
    """`labels ['neg', 'pos']` for a classifier (the task's `shows_labels`); else the task, its
    sharding and checkpointing: `causal LM, fsdp sharding, torch_xla gradient checkpointing`."""
    if result.shows_labels:
        return f"labels {result.label_names}"
    text = f"{result.task_title or result.task}, {result.sharding} sharding"
    if result.gradient_checkpointing:
        text += ", torch_xla gradient checkpointing"
    return text


def mesh_axis(result: Any) -> str:
    """The mesh axis a sharded parameter lies on: the worker's SPMD mesh is `(devices, 1)`,
    its first axis named "fsdp" for FSDPv2 and "data" otherwise (`WorkerContext.axis`)."""
    return "fsdp" if result.sharding == "fsdp" else "data"


def result_rows(result: Any) -> list[tuple[str, str]]:
    """(label, text) rows of a `FineTuneResult`; warnings first."""
    rows = [("warning", warning) for warning in result.warnings]
    rows.append(("training", f"{plural(result.steps, 'step')} "
                             f"({plural(round(result.epochs, 2), 'epoch')})"
                 + (f"; {result.stop_reason}" if result.stop_reason else "")))
    rows.append(("time", _time_row(result)))
    speed = _speed_row(result)
    if speed:
        rows.append(("throughput", speed))
    if result.loss_history:
        first, last = result.loss_history[0][1], result.loss_history[-1][1]
        steps = (f" over steps {result.loss_history[0][0]}-{result.loss_history[-1][0]}"
                 if len(result.loss_history) > 1 else "")
        rows.append(("loss", f"{first:.4f} -> {last:.4f}{steps}"))
    if result.metrics:
        rows.append(("evaluation", evaluation_text(result.metrics)))
    if result.kept_best and result.best_metric is not None:
        rows.append(("kept", f"the best model (load_best_model_at_end): step "
                             f"{result.best_step}, {result.best_metric_name} "
                             f"{result.best_metric:.4f}; the evaluation above is that model's"))
    per_step = ""
    if result.executions_per_step is not None:
        per_step = (f"; per step after warm-up: {result.executions_per_step:.2f} executions, "
                    f"{result.transfers_per_step:.2f} device-to-host transfers")
    setup = ""
    if result.setup_compiles:  # the XLA metrics count them too: say which they are
        setup = (f"; and {result.setup_compiles} before step 1 (AdamW's first state), "
                 f"{result.compiles + result.eval_compiles + result.setup_compiles} in all")
    rows.append(("XLA", f"{result.compiles} training + {result.eval_compiles} evaluation graphs "
                 f"compiled{per_step}{setup}"))
    replay = compiled_steps_text(result.compiled_steps)
    if replay:
        rows.append(("steps", replay))
    traced = [f"{shape}: {how}" for shape, how in result.compiled_evaluation.items()
              if how != "replayed"]
    if traced:  # evaluation batches replay as steps do: said only where they did not
        rows.append(("eval batches", "\n".join(traced)))
    what = _task_text(result)
    rows.append(("setup", f"{result.strategy} over {plural(result.devices, 'device')}, "
                 f"{result.precision}, batch {result.batch_size}, lengths "
                 f"{result.bucket_lengths}, {what}"))
    adapter = lora_row(result)
    if adapter:
        rows.append(("LoRA", adapter))
    memory = memory_row(result)
    if memory:
        rows.append(("memory", memory))
    for name, spec in list(result.parameter_sharding.items())[:2]:
        if not result.shows_labels or "devices=" in spec:
            rows.append(("layout", f"{name}: {sharding_words(spec, mesh_axis(result))}"))
    if result.resumed_from:
        rows.append(("resumed from", result.resumed_from))
    if result.output_dir:
        rows.append(("saved to", result.output_dir))
    rows += [("note", note) for note in result.notes]
    lease = warm_row(result)
    if lease:
        rows.append(("warm", lease))
    hint = next_step(result)
    if hint:
        rows.append(("next", hint))
    return rows


def compiled_steps_text(compiled_steps: dict[str, str]) -> str | None:
    """Per batch shape, whether its later steps ran by the first step's compiled graph, or
    were traced and why (one line per traced shape); None when the run says nothing."""
    if not compiled_steps:
        return None
    replayed = [shape for shape, how in compiled_steps.items() if how == "replayed"]
    lines = []
    if replayed:
        lines.append(f"{', '.join(replayed)}: later steps run by the first step's compiled "
                     "graph (no trace)")
    lines += [f"{shape}: {how}" for shape, how in compiled_steps.items() if how != "replayed"]
    return "\n".join(lines)


def result_text(result: Any) -> str:
    rows = result_rows(result)
    width = max(len(name) for name, _ in rows)
    lines = ["FineTuneResult"]
    for name, value in rows:
        first, *more = value.split("\n")  # a table (evaluation) continues under its first line
        lines.append(f"  {name:<{width}}  {first}")
        lines += [f"  {'':<{width}}  {line}" for line in more]
        if name == "loss" and len(result.loss_history) > 1:
            chart = loss_text_chart([loss for _, loss in result.loss_history])
            lines.append(f"  {'':<{width}}  {chart}  ({loss_scale(result)})")
    return "\n".join(lines)


CHART_WIDTH, CHART_HEIGHT = 240, 40
# The chart's scale: small secondary text, on one line.
_SCALE = SMALL + "line-height:1;"


def loss_chart_html(result: Any) -> str:
    """The loss chart with its scale: the highest and lowest loss beside it, the first and
    last step under it, and what the line and the dots are where there are evaluations; ''
    for fewer than 2 losses."""
    history = [(step, loss) for step, loss in result.loss_history if loss == loss]
    losses, dots = [loss for _, loss in history], evaluation_dots(result, history)
    chart = sparkline_svg(losses, width=CHART_WIDTH, height=CHART_HEIGHT, color=SERIES["loss"],
                          dots=dots)
    if not chart:
        return ""
    low, high = chart_range(losses, dots)
    # The one table, its cells tight around the chart: the scale sits against the line.
    edge = "border:none;padding:0 4px 0 0;background:transparent;"
    return (
        f'<table style="{TABLE}"><tbody>'
        f'<tr style="{TR}"><td style="{edge}{_SCALE}text-align:right;'
        f'vertical-align:top">{high:.4f}</td><td rowspan="2" style="{edge}">{chart}'
        f'</td></tr><tr style="{TR}"><td style="{edge}{_SCALE}'
        f'text-align:right;vertical-align:bottom">{low:.4f}</td></tr>'
        f'<tr style="{TR}"><td style="{edge}"></td><td style="{edge}">'
        f"{step_axis_html(history[0][0], history[-1][0])}</td></tr>"
        + (f'<tr style="{TR}"><td style="{edge}"></td><td style="{edge}">'
           f"{loss_legend_html()}</td></tr>" if dots else "")
        + "</tbody></table>"
    )


def evaluation_dots(result: Any, history: list[tuple[int, float]]) -> list[tuple[float, float]]:
    """`(x, eval_loss)` of each evaluation during training in `result.log_history`, `x`
    counted in `history`'s losses (between two logged steps: in proportion)."""
    steps, dots = [step for step, _ in history], []
    for entry in getattr(result, "log_history", None) or []:
        if "eval_loss" not in entry or not steps or entry.get("step", 0) < steps[0]:
            continue
        step = entry["step"]
        before = bisect.bisect_right(steps, step) - 1
        x = float(before)
        if steps[before] != step and before + 1 < len(steps):
            x += (step - steps[before]) / (steps[before + 1] - steps[before])
        dots.append((x, float(entry["eval_loss"])))
    return dots


def step_axis_html(first: int, last: int) -> str:
    """The chart's step axis: `step <first>` under its left end, `step <last>` under its right.

    A row of two elements spread apart (flex, `space-between`, a gap), with a space between
    them: where the styles are dropped (a sanitizer, a copy as text) the labels still read
    `step 10 step 60`, never `step 10step 60`.
    """
    return (f'<div style="display:flex;justify-content:space-between;gap:12px;'
            f'width:{CHART_WIDTH}px;{_SCALE}"><span>step {first}</span> '
            f"<span>step {last}</span></div>")


def result_html(result: Any) -> str:
    """The result in the one box: its heading, then a row per `result_rows` entry (the loss
    with its chart, the evaluation as its own table, warnings in the warning colour)."""
    chart = loss_chart_html(result)

    def value_html(name: str, value: str) -> str:
        if name == "evaluation":
            return evaluation_html(result.metrics)
        # The code to type (`result.load_model()`, ...), as code.
        text = re.sub(r"(result\.\w+\([^)]*\))", r"<code>\1</code>", escape(value))
        return text + (chart if name == "loss" else "")

    def line(name: str, value: str) -> str:
        warn = text_color(COLORS["warning"]) + "font-weight:600;" if name == "warning" else ""
        return row([cell(escape(name), LABEL + warn, "th"),
                    cell(value_html(name, value), TD + warn)])

    rows = [line(name, value) for name, value in result_rows(result)]
    return panel(heading("FineTuneResult") + table(rows), "hfxla-result")


# -- DoctorReport --

_CHECK_COLORS = {"ok": GREEN, "warning": AMBER, "failed": RED, "timed out": RED}
_REPORT_WIDTH = 100


def _status_color(report: DoctorReport) -> str:
    if not report.ok:
        return RED
    return AMBER if any(check.status == "warning" for check in report.checks) else GREEN


def _mark_html(status: str, mark: str) -> str:
    color = _CHECK_COLORS.get(status)
    style = themed("color", color) if color else MUTED
    return f'<span style="{style}" title="{html.escape(status)}">{mark}</span>'


def doctor_html(report: DoctorReport) -> str:
    """The report as an HTML panel: a row per step, then what to do."""
    rows = [row([cell(_mark_html(check.status, check.mark), NAME),
                 cell(html.escape(check.name), NAME),
                 cell(html.escape(check.summary)),
                 cell(f"{check.seconds:.1f} s", NUMBER)])
            for check in report.checks]
    fixes = "".join(f"<li><b>{html.escape(check.name)}</b>: {html.escape(check.fix)}</li>"
                    for check in report.checks if check.fix)
    todo = (f'<div style="margin-top:4px">{heading("What to do")}'
            f'<ul style="margin:2px 0 0 0;padding-left:18px">{fixes}</ul></div>'
            if fixes else "")
    note = (f'<div style="{MUTED}">hfxla_nb {html.escape(report.version)}, '
            f"{html.escape(report.created)}, {report.seconds:.1f} s; "
            "<code>.to_markdown()</code> for an issue, <code>.to_json()</code> as data</div>")
    return panel(f'<div style="margin-bottom:4px">{heading("hfxla_nb doctor")} '
                 f"{badge(report.status_line(), _status_color(report))}</div>"
                 f"{table(rows)}{todo}{note}", "hfxla-nb-doctor")


def doctor_text(report: DoctorReport) -> str:
    """The report as text: a line per step (wrapped), then what to do."""
    lines = [f"hfxla_nb doctor: {report.status_line()} ({report.seconds:.1f} s, "
             f"hfxla_nb {report.version}, {report.created})"]
    grid = [[check.mark, check.name, f"{check.seconds:.1f} s"] for check in report.checks]
    heads = aligned_lines(grid, [False, False, True])
    for head, check in zip(heads, report.checks, strict=True):
        lines += textwrap.wrap(check.summary, width=_REPORT_WIDTH, initial_indent=f"  {head}  ",
                               subsequent_indent=" " * (len(head) + 4),
                               break_on_hyphens=False)
    fixes = [check for check in report.checks if check.fix]
    if fixes:
        lines.append("what to do:")
        for check in fixes:
            lines += textwrap.wrap(f"{check.name}: {check.fix}", width=_REPORT_WIDTH,
                                   initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


# -- RuntimeInfo --

# The palette every panel shares (JupyterLab's theme colours, these as their fallbacks).
_PROBLEM_COLORS = {"error": RED, "warning": AMBER, "info": BLUE, "ok": GREEN}
_TEXT_WIDTH = 100
_LABEL_WIDTH = 13
# Joins "name version" pairs so that text wrapping never splits one.
_NBSP = "\u00a0"


def status_line(info: RuntimeInfo) -> str:
    """The status: "OK", or the problem counts ("1 error, 2 warnings"); info notes count as OK."""
    counts = {severity: 0 for severity in ("error", "warning", "info")}
    for problem in info.problems:
        counts[problem.severity] = counts.get(problem.severity, 0) + 1
    parts = [
        f"{counts[name]} {name}{'' if counts[name] == 1 else 's'}"
        for name in ("error", "warning")
        if counts[name]
    ]
    return ", ".join(parts) if parts else "OK"


def _runtime_state(info: RuntimeInfo) -> str:
    if info.runtime_initialized:
        return "started in this process (the launcher cannot fork)"
    return "not started in this process (ready to launch)"


def _versions(info: RuntimeInfo) -> list[str]:
    return [f"{name} {value or 'not installed'}" for name, value in info.versions.items()]


def _facts(info: RuntimeInfo) -> list[tuple[str, str]]:
    accelerator = info.accelerator
    facts = [
        ("host", info.host or host_name(accelerator, info.environment)),
        ("accelerator", accelerator.description),
        ("found by", ", ".join(accelerator.found_by) or "nothing"),
        ("launcher", info.launch_plan or launch_plan(accelerator, info.environment)),
        ("runs in", info.environment),
        ("XLA runtime", _runtime_state(info)),
    ]
    if info.compile_cache:
        facts.append(("compile cache", info.compile_cache))
    if accelerator.holders:
        holders = ", ".join(f"{pid} ({name})" for pid, name in sorted(accelerator.holders.items()))
        facts.append(("TPU held by", holders))
    return facts


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------


def _text_row(label: str, value: str) -> list[str]:
    indent = " " * (2 + _LABEL_WIDTH + 1)
    lines = textwrap.wrap(
        value,
        width=_TEXT_WIDTH,
        initial_indent=f"  {label:<{_LABEL_WIDTH}} ",
        subsequent_indent=indent,
        break_on_hyphens=False,
    ) or [f"  {label}"]
    return [line.replace(_NBSP, " ") for line in lines]


def _text_problem(problem: Problem) -> list[str]:
    tag = f"[{problem.severity}]"
    lines = textwrap.wrap(
        problem.title,
        width=_TEXT_WIDTH,
        initial_indent=f"  {tag:<10}",
        subsequent_indent=" " * 12,
    )
    label = "fix: " if problem.severity != "info" else ""
    lines += textwrap.wrap(
        problem.fix,
        width=_TEXT_WIDTH,
        initial_indent=" " * 12 + label,
        subsequent_indent=" " * (12 + len(label)),
        break_on_hyphens=False,
    )
    return lines


def runtime_text(info: RuntimeInfo) -> str:
    """A readable multi-line text panel of `info`.

    Example:
        ```
        hfxla_nb runtime: OK
          accelerator   CPU: 1 virtual XLA device on 2 host cores
          ...
        ```
    """
    lines = [f"hfxla_nb runtime: {status_line(info)}"]
    for label, value in _facts(info):
        lines += _text_row(label, value)
    versions = ", ".join(item.replace(" ", _NBSP) for item in _versions(info))
    lines += _text_row("versions", versions)
    env = ", ".join(f"{name}={value}" for name, value in info.env.items()) or "(none set)"
    lines += _text_row("env", env)
    if info.problems:
        lines.append("problems:")
        for problem in info.problems:
            lines += _text_problem(problem)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------


def _fix_label(problem: Problem) -> str:
    """The "Fix: " label before what to do about an error or a warning; none before a note
    ("info"): it is information, with nothing to fix."""
    return "" if problem.severity == "info" else "<b>Fix:</b> "


def _html_problem(problem: Problem) -> str:
    color = _PROBLEM_COLORS.get(problem.severity, _PROBLEM_COLORS["info"])
    return (
        '<li style="list-style:none;margin:4px 0;padding:4px 8px;border-left:4px solid;'
        f'{themed("border-left-color", color)}">'
        f"{badge(problem.severity, color)} {html.escape(problem.title)}"
        f'<div style="margin-top:2px;{MUTED}">{_fix_label(problem)}{html.escape(problem.fix)}'
        "</div>"
        "</li>"
    )


def runtime_html(info: RuntimeInfo) -> str:
    """An HTML panel of `info`: the one box and table every panel uses (`ui.state.panel`,
    `ui.state.table`)."""
    status = status_line(info)
    if status == "OK":
        status_color = _PROBLEM_COLORS["ok"]
    else:
        status_color = _PROBLEM_COLORS["warning" if info.ok else "error"]
    rows = [label_row(label, html.escape(value)) for label, value in _facts(info)]
    rows.append(label_row("versions", html.escape(" · ".join(_versions(info)))))
    if info.env:
        env = "<br>".join(
            f"<code>{html.escape(name)}={html.escape(value)}</code>"
            for name, value in info.env.items()
        )
    else:
        env = "(none set)"
    rows.append(label_row("env", env))
    problems = ""
    if info.problems:
        problems = (
            '<ul style="margin:6px 0 0 0;padding:0">'
            + "".join(_html_problem(problem) for problem in info.problems)
            + "</ul>"
        )
    return panel(
        f'<div style="margin-bottom:4px">{heading("hfxla_nb runtime")} '
        f"{badge(status, status_color)}</div>{table(rows)}{problems}",
        "hfxla-nb-runtime",
    )


class RuntimePanel:
    """A `RuntimeInfo` drawn as a panel: HTML in a notebook, text from `repr()`."""

    def __init__(self, info: RuntimeInfo) -> None:
        self.info = info

    def _repr_html_(self) -> str:
        return runtime_html(self.info)

    def __repr__(self) -> str:
        return runtime_text(self.info)


# -- IPython's formatters, told how to draw each --

# (module, class name) -> (html, text) renderers
RENDERERS: dict[tuple[str, str], tuple[Callable[[Any], str], Callable[[Any], str]]] = {
    ("hfxla_nb.runtime.info", "RuntimeInfo"): (runtime_html, runtime_text),
    ("hfxla_nb.runtime.doctor_report", "DoctorReport"): (doctor_html, doctor_text),
    ("hfxla_nb.train.result", "FineTuneResult"): (result_html, result_text),
    ("hfxla_nb.train.memory", "MemoryPlan"): (plan_table_html, plan_table),
    ("hfxla_nb.train.predict", "Predictions"): (predictions_html, predictions_text),
}


def register(shell: Any = None) -> bool:
    """Teach the running IPython shell (or `shell`) to draw hfxla_nb's data objects.

    Returns False when there is no shell (a plain script): nothing to do then.
    """
    if shell is None:
        ipython = sys.modules.get("IPython")  # never import IPython just to find no shell
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    formatters = shell.display_formatter.formatters
    for (module, name), (html_of, text_of) in RENDERERS.items():
        formatters["text/html"].for_type_by_name(module, name, html_of)
        formatters["text/plain"].for_type_by_name(module, name, _pretty(text_of))
    return True


def _pretty(text_of: Callable[[Any], str]) -> Callable[[Any, Any, bool], None]:
    def printer(obj: Any, p: Any, cycle: bool) -> None:
        p.text(text_of(obj))

    return printer
