"""The compilations view of the metrics panel, the graph memory line and the compile cache row.

One row per user line that compiled (from torch_xla's own analysis, `summary.trace`): how many
graphs were compiled there, how many of them were different, the total compile time and the
cause. Then the largest graph's memory need, compared with what one device has on a TPU, and
the persistent compile cache's hits, misses and folder. Plain functions of an `XlaSummary`:
text lines for `text.summary_lines`, HTML for `html.summary_html`.
"""

from __future__ import annotations

from html import escape

from .._words import plural
from ..observe.metrics import XlaSummary
from ..observe.trace_log import CompileRow, TraceLog
from .table_style import HEAD, HEAD_NUMBER, MUTED, NUMBER, TD, cell, heading, row, table
from .units import duration, size

# Rows shown; the rest are counted in one last line.
MAX_ROWS = 8
NONE_COMPILED = "compilations by line: none (every graph ran was compiled before)"
_GIB = 1024**3


def row_cells(row: CompileRow) -> tuple[str, str, str, str, str]:
    """(line, graphs, different, compile time, cause) of one row, as text."""
    return (row.place(), plural(row.compiles, "graph"), f"{row.graphs} different",
            duration(row.compile_time), row.cause_words())


def graph_memory_text(summary: XlaSummary) -> str | None:
    """`the largest graph needs 14.2 GiB (`train` in cell 5, line 12); a v5e chip has 16.0
    GiB`, or None when no compilation reported its sizes."""
    trace: TraceLog | None = summary.trace
    largest = trace.largest() if trace is not None else None
    if largest is None or largest.memory is None:
        return None
    place = largest.where.text() if largest.where is not None else "library code"
    # torch_xla prints sizes in GB with 6 decimals: below about 1 KiB they read 0.
    need = size(largest.memory) if largest.memory >= 1024 else "under 1 KiB"
    line = f"the largest graph needs {need} ({place})"
    live = (summary.memory or {}).get("bytes_limit")
    if live:
        line += f"; the device has {size(live)}"
    elif trace.device_memory:
        line += f"; {trace.device_name or 'one device'} has {size(trace.device_memory)}"
    return line


def cache_text(summary: XlaSummary) -> str | None:
    """`2 hits, 1 miss; 3 entries, 12.0 KiB of 10.0 GiB in /root/.cache/...`, or None."""
    cache = summary.cache
    if not cache:
        return None
    parts = [plural(cache.get("hits", 0), "hit"), plural(cache.get("misses", 0), "miss",
                                                          "misses")]
    if cache.get("unreadable"):
        parts.append(f"{cache['unreadable']} not loadable on XLA:CPU (compiled again)")
    line = ", ".join(parts)
    if cache.get("folder"):
        limit = f" of {size(cache['limit'])}" if cache.get("limit") else ""
        line += (f"; {plural(cache.get('entries', 0), 'entry', 'entries')}, "
                 f"{size(cache.get('bytes', 0))}{limit} in {cache['folder']}")
    return line


def compilation_lines(summary: XlaSummary) -> list[str]:
    """The view as text lines (none when the run was not traced)."""
    lines = []
    trace: TraceLog | None = summary.trace
    if trace is not None and trace.note:
        lines.append(trace.note)
    elif trace is not None and trace.compiles:
        lines.append(f"compilations by line ({plural(trace.compiles, 'graph')} traced):")
        rows = trace.rows()
        for row in rows[:MAX_ROWS]:
            place, graphs, different, seconds, cause = row_cells(row)
            lines.append(f"  {place}: {graphs}, {different}, {seconds}, {cause}")
        if len(rows) > MAX_ROWS:
            lines.append(f"  ... and {plural(len(rows) - MAX_ROWS, 'more line')}")
    elif trace is not None:
        lines.append(NONE_COMPILED)
    memory = graph_memory_text(summary)
    if memory:
        lines.append(f"graph memory: {memory}")
    cache = cache_text(summary)
    if cache:
        lines.append(f"compile cache: {cache}")
    return lines


# The columns that are counts (graphs, different, compile time): right-aligned, never wrapped.
_NUMBERS = (1, 2, 3)


def _cell(value: str, column: int, header: bool = False) -> str:
    """One cell of column `column`. Only the place and the cause may wrap: at 1024 px a long
    place squeezed the counts into "1 / graph" (#28, item 9)."""
    if header:
        return cell(escape(value), HEAD_NUMBER if column in _NUMBERS else HEAD, "th")
    return cell(escape(value), NUMBER if column in _NUMBERS else TD)


def compilations_html(summary: XlaSummary) -> str:
    """The view as HTML: a note, or a table of rows, then graph memory and the cache."""
    parts = []
    trace: TraceLog | None = summary.trace
    if trace is not None and trace.note:
        parts.append(f'<div style="{MUTED}">{escape(trace.note)}</div>')
    elif trace is not None and not trace.compiles:
        parts.append(f'<div style="{MUTED}">{escape(NONE_COMPILED)}</div>')
    elif trace is not None:
        # The header row in the body: JupyterLab's rendered HTML rules a <thead>, the live
        # widget does not, and the two must keep one geometry.
        header = row(_cell(name, column, header=True) for column, name in enumerate((
            "compiled at", "graphs", "different", "compile time", "cause")))
        rows = trace.rows()
        body = [row(_cell(value, column) for column, value in enumerate(row_cells(line)))
                for line in rows[:MAX_ROWS]]
        if len(rows) > MAX_ROWS:
            rest = plural(len(rows) - MAX_ROWS, "more line")
            body.append(row([cell(escape(f"... and {rest}"), TD)]))
        parts.append(
            f"<div>{heading('compilations by line')} "
            f"({escape(plural(trace.compiles, 'graph'))} traced){table([header, *body])}</div>")
    for name, value in (("graph memory", graph_memory_text(summary)),
                        ("compile cache", cache_text(summary))):
        if value:
            parts.append(f'<div><span style="{MUTED}">{escape(name)}</span> '
                         f"{escape(value)}</div>")
    return "".join(parts)
