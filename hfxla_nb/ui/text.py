"""Plain-text forms of the panels: console output and every panel's `__repr__`; and the
compilations view of the metrics panel.

Pure functions of the data in `ui.state` and `observe.metrics`; nothing is computed here but
format (the units are `ui.state`'s).

The compilations view: one row per user line that compiled (from torch_xla's own analysis,
`summary.trace`): how many graphs were compiled there, how many of them were different, the
total compile time and the cause. Then the largest graph's memory need, compared with what one
device has on a TPU, and the persistent compile cache's hits, misses and folder. Text lines
for `summary_lines`, HTML for `ui.html.summary_html`.
"""

from __future__ import annotations

from html import escape

from .._words import plural
from ..observe.alerts import Alert
from ..observe.metrics import InputShapes, XlaSummary, shape_changes
from ..observe.reader import StreamedRow
from ..observe.tracing import CompileRow, TraceLog
from ..states import BarState, PanelState, RankState
from .state import (
    HEAD,
    HEAD_NUMBER,
    MUTED,
    NUMBER,
    TD,
    BarView,
    LaunchView,
    cell,
    clock,
    duration,
    heading,
    number,
    rate,
    row,
    size,
    table,
)

# -- the compilations view, the graph memory line, the compile cache row --

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
    place squeezed the counts into "1 / graph"."""
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


# -- the panels as text --

SYMBOLS = {PanelState.FINISHED: "✔", PanelState.FAILED: "✖", PanelState.RUNNING: "…",
           PanelState.STARTING: "…"}
SEVERITY = {"error": "✖", "warning": "⚠", "info": "ℹ"}


# Input shapes listed in a panel row (the alerts name how many there were in all).
SHAPES_SHOWN = 8


def value_parts(values: dict[str, float]) -> list[str]:
    """`["loss=0.4213", "lr=1.7e-4"]`: each value as one unbreakable piece."""
    return [f"{name}={number(value)}" for name, value in values.items()]


def counts_text(bar: BarView) -> str:
    """`40/100` or `40` (the bar itself shows the fraction)."""
    return f"{bar.step}/{bar.total}" if bar.total else f"{bar.step}"


# What each timing figure of a bar counts (the HTML panel's tooltips; the text says "wall").
ELAPSED_MEANS = ("wall-clock time from the bar's first step (a tqdm bar's creation, or the "
                 "start of the loop it shares with one) to its latest update")
COMPILING_MEANS = ("the bar's first step is still running: on XLA it compiles the step's "
                   "graph first, which can take tens of seconds; the clock runs from the "
                   "bar's start")
RATE_MEANS = ("steps (or samples) per second of wall-clock time, the host's work included, "
              "over the steps after the first few, which compile (the steps fine_tune's "
              "samples_per_second counts); over the whole bar for one too short to have them")
ETA_MEANS = "the steps left at the rate after the first few steps, which compile"
LOSS_CHART_MEANS = ("the training loss (the line) at each logged step; dots: the evaluation "
                    "loss at each evaluation during training, on the same scale")
STEP_TIME_MEANS = ("wall-clock time per step between two updates of the bar (the host's "
                   "work included); the XLA metrics' time per step is the device's execution")
STEADY_STEP_TIME_MEANS = ("the median wall-clock time per step over the steps that compiled "
                          "nothing (the host's work included), not the last step's: a step "
                          "that compiled takes many times longer; the XLA metrics' time per "
                          "step is the device's execution")
XLA_STEP_MEANS = ("XLA's execution time (torch_xla's ExecuteTime) per step reported: the "
                  "device's share of a step, without tracing, data loading or waiting; every "
                  "graph executed since the start (the first, slower steps, evaluation and "
                  "saving too) divided by the steps, so it can be larger than the latest wall "
                  "time per step")
WAITING_MEANS = ("when this bar starts: at the first evaluation (during training, or when it "
                 "ends); it is drawn from the start, so the panel keeps its height when it does")
# The tooltip of the wall time per step when XLA's time per step is the larger
# (`xla_exceeds_wall`), then why (`XLA_ABOVE_WALL_MEANS`).
XLA_ABOVE_WALL = "less than XLA's time per step, which counts every graph since the start"
XLA_ABOVE_WALL_MEANS = ("XLA's time per step is every graph's execution time since the start "
                        "(the first, slower steps, and any evaluation or saving graph) divided "
                        "by the steps; the wall time is that of the latest steps. The device "
                        "runs a step's graph while the host traces the next, so neither time "
                        "is part of the other")


def step_time_label(bar: BarView) -> tuple[str, str, float]:
    """The chart's wall time per step: `(label, what it counts, seconds)`. While the bar
    runs, the latest update's; once it ended, the median over the steps that compiled nothing
    (`BarView.steady_step_time`), labelled `median wall time per step`."""
    if bar.steady_step_time is not None:
        return "median wall time per step", STEADY_STEP_TIME_MEANS, bar.steady_step_time
    return "wall time per step", STEP_TIME_MEANS, bar.step_times[-1]


def timing_pieces(bar: BarView) -> list[tuple[str, str]]:
    """`timing_parts`, each with what it counts (for tooltips)."""
    if bar.waiting:  # drawn before it starts, so the panel keeps its height when it does
        if bar.state != BarState.RUNNING:
            return [("not run", WAITING_MEANS)]
        return [(bar.starts or "after training", WAITING_MEANS)]
    if bar.state == BarState.STOPPED:  # the time it ran says nothing about its own work
        return [(f"stopped after {clock(bar.elapsed)}", ELAPSED_MEANS)]
    if bar.compiling:  # no rate or ETA yet: the only figure is how long the first step takes
        return [(f"compiling the first step ({clock(bar.elapsed)} so far)", COMPILING_MEANS)]
    # A bar that ended before its total says so where its count is, as tqdm's bar says its
    # own end: "✔ 50/120" alone would read as cut short, "✔ 50/50" would hide the stop.
    pieces = [("stopped early", bar.ended)] if bar.ended is not None else []
    pieces.append((f"{clock(bar.elapsed)} elapsed", ELAPSED_MEANS))
    if bar.eta is not None and bar.ended is None:
        pieces.append((f"ETA {clock(bar.eta)}", ETA_MEANS))
    rates = []
    if bar.rate is not None:
        rates.append(rate(bar.rate, "it", bar.per_step))
    if bar.samples_rate is not None:
        rates.append(rate(bar.samples_rate, "samples"))
    if rates:
        # What the rate counts (wall clock) is its tooltip: the bar's values stay on one line.
        words = ", ".join(rates)
        if bar.state != BarState.RUNNING:  # an ended bar says which average it shows
            words = f"overall {words}" if bar.rate_over == "whole" else f"{words} after warm-up"
        pieces.append((words, RATE_MEANS))
    return pieces


def timing_parts(bar: BarView) -> list[str]:
    """What a bar's time and speed are, each a piece that reads on its own: while its first
    step runs `compiling the first step (12.0 s so far)`; then `32.0 s elapsed`,
    `ETA 18.0 s`, `3.3 it/s, 53.1 samples/s` (rate and ETA once the first few steps, which
    compile, are over); once it ended `37.3 s elapsed` and `9.8 it/s, 53.1 samples/s after
    warm-up` (the mean over those steps, as `fine_tune`'s result counts it; `overall ...`
    for a bar too short to have them), after `stopped early` where the loop ended before
    its total (`BarView.ended`, the reason its tooltip). Times are wall-clock times (the host's work
    included), not XLA's: the metrics give XLA's execution time per step
    (`executions_text`)."""
    return [piece for piece, _ in timing_pieces(bar)]


def results_first(bar: BarView) -> bool:
    """Whether a bar's values come before its times: an evaluation's metrics
    (`evaluations_on_their_row`) are what its row is read for; after its times they were cut
    off at 1024 px."""
    return bool(bar.values) and all(name.startswith("eval_") for name in bar.values)


def stat_parts(bar: BarView) -> list[str]:
    """Everything shown next to a bar, as pieces that are never broken across lines."""
    if results_first(bar):
        return [counts_text(bar), *value_parts(bar.values), *timing_parts(bar)]
    return [counts_text(bar), *timing_parts(bar), *value_parts(bar.values)]


MARKS = {BarState.DONE: "✔", BarState.FAILED: "✖", BarState.STOPPED: "■"}


def bar_line(bar: BarView, width: int = 20, name_width: int = 0) -> str:
    """One line: `train ✔ |████████| 40/100 · 12.0 s elapsed · ... · loss=0.42`.

    The mark has a place of its own (blank while running), so nothing moves when it appears.
    """
    fraction = bar.fraction
    drawn = ""
    if fraction is not None:
        filled = int(round(fraction * width))
        drawn = "|" + "█" * filled + "░" * (width - filled) + "| "
    mark = MARKS.get(bar.state, " ")
    return f"{bar.name:<{name_width}} {mark} {drawn}" + " · ".join(stat_parts(bar))


def status_line(view: LaunchView) -> str:
    """`✔ launch finished in 12.3 s` (the wall time of the whole launch) and the like; an
    attempt of a call with `max_restarts=` says which: `✔ launch finished in 12.3 s (attempt
    2 of 4)`, `… running for 3.0 s (attempt 2 of 4)`."""
    symbol = SYMBOLS.get(view.state, "")
    ranks = "" if view.world == 1 else f" of {plural(view.world, 'rank')}"
    attempt = f" ({view.attempt})" if view.attempt else ""
    if view.state == PanelState.FINISHED:
        return f"{symbol} launch{ranks} finished in {duration(view.elapsed)}{attempt}"
    if view.state == PanelState.FAILED:
        first = f": {view.errors[0]}" if view.errors else ""
        return f"{symbol} launch{ranks} failed after {duration(view.elapsed)}{attempt}{first}"
    if view.state == PanelState.STARTING:
        who = "" if view.world == 1 else f" {plural(view.world, 'rank')}"
        return f"{symbol} starting{who}, {duration(view.elapsed)}{attempt}"
    line = f"{symbol} running for {duration(view.elapsed)}{attempt}"
    if view.world > 1:
        states = list(view.ranks.values())
        running = sum(state == RankState.RUNNING for state in states)
        done = sum(state == RankState.FINISHED for state in states)
        line += f": {running} of {plural(view.world, 'rank')} running, {done} finished"
    return line


def steps_phrase(summary: XlaSummary, live: bool = False) -> str:
    """`in 60 steps` (a finished stretch of work) or `as of step 41` (a launch that runs);
    `... of its slowest rank` for rank threads sharing a process's counters that are at
    different steps: the process's step is the slowest's (so "in 8 steps" may stand beside
    a bar of rank 0 at step 9). Work a bar counts in batches (`predict`) is said in them:
    `in 1 batch`, beside `predict 1/1`."""
    count, unit = summary.counted()
    if not count:
        return ""
    many = "batches" if unit == "batch" else None
    phrase = f"as of {unit} {count}" if live else f"in {plural(count, unit, many)}"
    if summary.ranks > 1 and summary.rank_steps not in (None, summary.steps * summary.ranks):
        phrase += " of its slowest rank"
    return phrase


def nothing_ran(summary: XlaSummary) -> bool:
    """Whether nothing was compiled or executed (a function that never ran an XLA graph)."""
    return not (summary.compiles or summary.executions or summary.cached_compiles)


def shows_metrics(view: LaunchView) -> bool:
    """Whether a launch panel has an XLA part: once a snapshot came, except at the end of a
    launch that compiled and executed nothing (a function that ran no XLA)."""
    if view.metrics is None:
        return False
    return not (view.done and nothing_ran(view.metrics) and not view.metrics.transfers_to_device)


def compiles_text(summary: XlaSummary) -> str:
    """`2 (1.3 s), 58 cache hits`."""
    text = f"{summary.compiles} ({duration(summary.compile_seconds)})"
    if summary.cached_compiles:
        text += f", {plural(summary.cached_compiles, 'cache hit')}"
    return text


def after_steps_text(summary: XlaSummary) -> str | None:
    """`64 of the compiles (8.6 s): saving, evaluation; not rated per step` (what compiled
    after the last step), or None when nothing did."""
    if not summary.compiles_after_steps:
        return None
    return (f"{summary.compiles_after_steps} of the compiles "
            f"({duration(summary.compile_seconds_after_steps)}): saving, evaluation; not rated "
            "per step")


def executions_text(summary: XlaSummary, live: bool = False) -> str:
    """`30 (451 ms, 15 ms XLA per step)`: the executions, their time and XLA's execution time
    per step reported. At the end of a run with fewer executions than steps reported (a
    failed step: the function reported it, its graph never ran to its end), both counts are
    said: `4 (120 ms) for 5 steps reported: the last step's graph did not run`."""
    text = f"{summary.executions} ({duration(summary.execute_seconds)}"
    count, unit = summary.counted()
    per_step = summary.per_step(summary.execute_seconds) if summary.executions else None
    if unit != "step":  # per batch of the bar that counts the work (`predict`)
        per_step = summary.execute_seconds / count if summary.executions and count else None
    # Only steps that were reported owe a graph each: syncs counted in their place (no
    # step reported, as in `predict`) are not steps, and need not each run one.
    short = (not live and summary.ranks == 1 and summary.steps is not None
             and not summary.steps_from_syncs and 0 < summary.executions < summary.steps)
    if (per_step is not None and (count or 0) > 1 and not summary.compiles_after_steps
            and not short):
        text += f", {duration(per_step)} XLA per {unit}"
    text += ")"
    if short:
        missing = summary.steps - summary.executions
        which = ("the last step's graph" if missing == 1
                 else f"the graphs of the last {missing} steps")
        text += f" for {summary.steps} steps reported: {which} did not run"
    return text


def transfers_text(count: int, seconds: float, nbytes: int | None, items: int = 0) -> str:
    """`6 transfers, 24 B, 6.7 ms` or `none`; `.item()` calls named when there were any."""
    if not count:
        return "none"
    parts = [plural(count, "transfer")]
    if nbytes is not None:
        parts.append(size(nbytes))
    parts.append(duration(seconds))
    text = ", ".join(parts)
    if items:
        text += f", {plural(items, '.item() call')}"
    return text


def summary_lines(summary: XlaSummary | None, title: str = "XLA",
                  live: bool = False) -> list[str]:
    """The XLA metrics panel as lines; one line when nothing was compiled or executed."""
    if summary is None:
        return [f"{title}: none yet"]
    when = steps_phrase(summary, live)
    heading = f"{title} {when}".rstrip()
    if nothing_ran(summary):
        return [f"{heading}: nothing compiled or executed" + (" yet" if live else "")]
    share = summary.compile_share
    share_text = f", compile {share * 100:.0f}% / execute {(1 - share) * 100:.0f}%" if (
        share is not None) else ""
    lines = [
        f"{heading}: {plural(summary.compiles, 'compile')} ({duration(summary.compile_seconds)}), "
        f"{plural(summary.executions, 'execution')} "
        f"{executions_text(summary, live).split(' ', 1)[1]}"
        f"{share_text}",
        *([f"after the last step: {after}"] if (after := after_steps_text(summary)) else []),
        "transfers: device → host "
        + transfers_text(summary.transfers_from_device, summary.transfer_from_device_seconds,
                         summary.bytes_from_device, summary.item_calls)
        + "; host → device "
        + transfers_text(summary.transfers_to_device, summary.transfer_to_device_seconds,
                         summary.bytes_to_device),
    ]
    if summary.fallbacks:
        lines.append("CPU fallbacks: " + ", ".join(
            f"{op} x{count}" for op, count in summary.fallbacks.items()))
    else:
        lines.append("CPU fallbacks: none")
    lines.append("device memory: " + memory_text(summary.memory))
    for name, info in shape_changes(summary.input_shapes).items():
        lines.append(f"input {name!r} shapes: " + shapes_text(info))
    return lines + compilation_lines(summary)


def shapes_text(info: InputShapes) -> str:
    """`(9, 8), (10, 8), …, (16, 8), … (23 shapes in all)`: the first shapes an input had,
    and how many there were when not all are shown."""
    shown = info.shapes[:SHAPES_SHOWN]
    text = ", ".join(str(shape) for shape in shown)
    if info.distinct > len(shown):
        total = f"{info.distinct}" if info.exact else f"over {info.distinct}"
        text += f", … ({total} shapes in all)"
    return text


def metrics_label(ranks: list[int]) -> str:
    """Whose counters a metrics panel shows: `rank 0`, `process of ranks 0-3`, or ''."""
    ranks = sorted(ranks)
    if not ranks:
        return ""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"process of ranks {ranks[0]}-{ranks[-1]}"
    return "process of ranks " + ", ".join(str(rank) for rank in ranks)


def _metrics_whose(view: LaunchView) -> str:
    """` (rank 0)`, ` (process of ranks 0-3)`, or '' in a one-rank launch."""
    ranks = view.metrics_ranks or ([] if view.metrics_rank is None else [view.metrics_rank])
    if view.world == 1 and len(ranks) <= 1:
        return ""
    label = metrics_label(ranks)
    return f" ({label})" if label else ""


def metrics_title(view: LaunchView) -> str:
    """`XLA metrics`, `XLA metrics (rank 0)`, `XLA metrics (process of ranks 0-3)`."""
    return "XLA metrics" + _metrics_whose(view)


def memory_text(memory: dict[str, int] | None) -> str:
    """`1.2 GiB used of 16.0 GiB (peak 2.0 GiB)` or `not available`."""
    if not memory:
        return "not available"
    text = f"{size(memory.get('bytes_used'))} used"
    if memory.get("bytes_limit"):
        text += f" of {size(memory['bytes_limit'])}"
    if memory.get("peak_bytes_used") is not None:
        text += f" (peak {size(memory['peak_bytes_used'])})"
    return text


def alert_lines(alerts: list[Alert]) -> list[str]:
    """Each alert as `⚠ title` + indented explanation and fix."""
    lines = []
    for alert in alerts:
        lines.append(f"{SEVERITY.get(alert.severity, '!')} {alert.title}")
        lines.append(f"    {alert.explanation}")
        lines.append(f"    Fix: {alert.fix}")
    return lines


def metrics_text(summary: XlaSummary | None, alerts: list[Alert]) -> str:
    """The metrics panel (summary and alerts) as text."""
    return "\n".join(summary_lines(summary) + alert_lines(alerts))


# How much of a prompt the panel shows under the bars: its end, which the answer continues.
PROMPT_SHOWN = 60
CURSOR = "▌"  # after a row's text while it is being generated


def prompt_tail(prompt: str, width: int = PROMPT_SHOWN) -> str:
    """The end of `prompt` on one line, at most `width` characters (`…` where cut)."""
    flat = " ".join(prompt.split())
    return flat if len(flat) <= width else "…" + flat[-(width - 1):]


def generation_lines(rows: list[StreamedRow]) -> list[str]:
    """Each generation row as two lines: the prompt's end, then the text so far under it."""
    lines = []
    for streamed in rows:
        lines.append(f"> {prompt_tail(streamed.prompt)}" if streamed.prompt else ">")
        lines.append("  " + " ".join(streamed.text.split("\n"))
                     + ("" if streamed.done else CURSOR))
    return lines


def launch_text(view: LaunchView) -> str:
    """The whole launch panel as text: status, bars, generations, errors, metrics, alerts."""
    lines = [status_line(view)]
    name_width = max((len(bar.name) for bar in view.bars), default=0)
    lines += [bar_line(bar, name_width=name_width) for bar in view.bars]
    lines += generation_lines(view.generations)
    lines += [f"error: {error}" for error in view.errors[1:]]
    lines += view.notes
    if shows_metrics(view):
        lines += summary_lines(view.metrics, "XLA" + _metrics_whose(view), live=not view.done)
    lines += alert_lines(view.alerts)
    return "\n".join(lines)
