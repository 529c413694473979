"""The evaluation metrics of a result as people read them: counts whole, scores to 4 decimals,
and the per-entity metrics of token classification as one grid (entity x precision, recall,
F1, entities) rather than a long column.

Plain functions of a `{name: value}` dict, shared by the result's text and HTML forms
(`finetune_panel.py`).
"""

from __future__ import annotations

import re
from html import escape

from .._words import COUNT_WORDS, is_count  # noqa: F401 - read with the table's rules
from .table_style import HEAD, HEAD_NUMBER, NAME, NUMBER, aligned_lines, cell, row, table
from .units import score

# The per-entity statistics of token classification (`eval_<TYPE>_<statistic>`), in the
# grid's column order.
ENTITY_COLUMNS = ("precision", "recall", "f1", "entities")
# A kind gets a grid row only when it has these: QA's `eval_has_answer_f1` alone is no entity.
ENTITY_REQUIRED = frozenset({"precision", "recall", "f1"})
_ENTITY_NAME = re.compile(r"^eval_(?P<kind>.+)_(?P<stat>precision|recall|f1|entities)$")


def metric_value(name: str, value: float) -> str:
    """A metric for people: counts as integers (`719`, `12,480`), any other value as
    `units.score` rounds it (the predictions' scores too): 4 decimals (`0.0075`), one for large
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
