"""HTML forms of the panels, built by plain functions (no IPython needed, easy to test); and the
static `%%xla_metrics` panel.

Every function takes the data of `ui.state` / `observe.metrics` and returns a string of HTML
with inline styles, so it renders the same in Jupyter, Colab, Kaggle, VS Code and nbconvert
output. The chrome (the panel's box, its heading, the tables, the colours) is `ui.state`'s, the
one style every panel shares: colours are JupyterLab's theme variables of the same meaning,
each with a mid-tone fallback; only the chart lines are plain mid-tone colours.

`MetricsPanel` is what `%%xla_metrics` shows: HTML in notebooks, text elsewhere.
"""

from __future__ import annotations

from html import escape

from ..observe.alerts import Alert
from ..observe.metrics import XlaSummary, shape_changes, xla_exceeds_wall
from ..states import BarState, PanelState
from . import state, text
from .state import (
    AMBER,
    BLUE,
    BOX,
    GREEN,
    GREY,
    MUTED,
    PURPLE,
    RED,
    SMALL,
    TEAL,
    TEXT,
    TRACK,
    BarView,
    LaunchView,
    heading,
    label_row,
    panel,
    table,
    text_color,
    themed,
)
from .text import compilations_html

# -- the panels as HTML --

STATUS_COLORS = {PanelState.STARTING: GREY, PanelState.RUNNING: BLUE,
                 PanelState.FINISHED: GREEN, PanelState.FAILED: RED}
BAR_COLORS = {BarState.RUNNING: BLUE, BarState.DONE: GREEN, BarState.SHORT: AMBER,
              BarState.FAILED: RED, BarState.STOPPED: GREY}
SEVERITY_COLORS = {"error": RED, "warning": AMBER, "info": BLUE}
# Every colour by the word of what it means (a state or an alert severity), for the panels
# that name a meaning rather than hold a state (`panels.result_html`: "warning").
COLORS: dict[str, str] = {**STATUS_COLORS, **BAR_COLORS, **SEVERITY_COLORS}
# One colour per chart series, in every panel (live, final, FineTuneResult): the loss is never
# drawn in the colour of a failure.
SERIES = {"loss": BLUE, "step time": PURPLE, "eval loss": TEAL}
# A part of the panel (a line, the bars, a chart): its text, no box of its own.
_BOX = TEXT
BAR_WIDTH = 150
MONO = "font-family:var(--jp-code-font-family,monospace);font-size:12px;"


def sparkline_svg(values: list[float], width: int = 180, height: int = 36,
                  color: str = SERIES["loss"], dots: list[tuple[float, float]] = ()) -> str:
    """An inline SVG line chart of `values` (at most `width` points); '' for under 2 values.

    Args:
        dots: `(x, value)` points drawn as dots on the line's scale, `x` counted in `values`
            (0: the first value): the evaluation losses on the loss chart
            (`SERIES["eval loss"]`).
    """
    line = [(x, float(v)) for x, v in enumerate(values) if v == v]  # drop NaN
    if len(line) < 2:
        return ""
    if len(line) > width:
        stride = len(line) / width
        line = [line[int(i * stride)] for i in range(width)] + [line[-1]]
    dots = [(float(x), float(v)) for x, v in dots if v == v]
    low, high = chart_range(values, dots)
    span, last = high - low, max(len(values) - 1, 1)

    def xy(x: float, value: float) -> tuple[float, float]:  # flat: through the middle
        y = height / 2 if span == 0 else height - 2 - (value - low) / span * (height - 4)
        return 2 + min(max(x, 0), last) / last * (width - 4), y

    coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in (xy(*point) for point in line))
    circles = "".join(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" '
                      f'fill="{SERIES["eval loss"]}"/>' for px, py in (xy(*dot) for dot in dots))
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" style="vertical-align:middle;width:{width}px;'
        f'height:{height}px;max-width:none">'
        f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>'
        f"{circles}</svg>"
    )


def loss_legend_html() -> str:
    """What the loss chart draws, visible (not a tooltip only): a line for the training loss
    and a dot for each evaluation's loss (drawn where the run evaluates during training)."""
    line = (f'<svg width="14" height="8" xmlns="http://www.w3.org/2000/svg" '
            f'style="vertical-align:middle;width:14px;height:8px;max-width:none">'
            f'<line x1="1" y1="4" x2="13" y2="4" stroke="{SERIES["loss"]}" '
            f'stroke-width="1.5"/></svg>')
    dot = (f'<svg width="8" height="8" xmlns="http://www.w3.org/2000/svg" '
           f'style="vertical-align:middle;width:8px;height:8px;max-width:none">'
           f'<circle cx="4" cy="4" r="3" fill="{SERIES["eval loss"]}"/></svg>')
    return (f'<span class="hfxla-legend" style="{SMALL}white-space:nowrap">'
            f"{line} train loss &nbsp;{dot} eval loss</span>")


def axis_html(values: list[float], dots: list[tuple[float, float]] = (),
              height: int = 36) -> str:
    """The chart's value axis, beside it: its highest value at the top, its lowest at the
    bottom (the dots' values included, as the line's scale is; their places do not count);
    blank, of the same size, for fewer than 2
    values. Without it the one number after the line (the latest training loss) read as the
    scale, whose bottom was an evaluation's loss."""
    shown = [v for v in values if v == v]
    high, low = ("", "") if len(shown) < 2 else (
        state.number(value) for value in reversed(chart_range(values, dots)))
    return (f'<span class="hfxla-axis" style="{SMALL}line-height:1;display:inline-flex;'
            f"flex-direction:column;justify-content:space-between;height:{height}px;"
            f'min-width:3.2em;text-align:right;vertical-align:middle">'
            f"<span>{escape(high)}</span><span>{escape(low)}</span></span>")


def chart_range(values: list[float], dots: list[tuple[float, float]] = ()) -> tuple[float, float]:
    """The lowest and highest of `values` and the dots' values (NaN left out)."""
    every = [float(v) for v in values if v == v] + [float(v) for _, v in dots if v == v]
    return min(every), max(every)


def status_html(view: LaunchView) -> str:
    """The launch's one-line status, colored by state (green finished, red failed)."""
    color = STATUS_COLORS[view.state]
    return (
        f'<div class="hfxla-status" style="{_BOX}padding:4px 8px;border-left:4px solid;'
        f'{themed("border-left-color", color)}'
        f'{text_color(color)}font-weight:600">{escape(text.status_line(view))}</div>'
    )


def progress_bar_html(bar: BarView, width: int = BAR_WIDTH) -> str:
    """The bar itself: a filled box of fixed width (full when the total is unknown)."""
    fraction = bar.fraction if bar.fraction is not None else 1.0
    color = BAR_COLORS[bar.state]
    aria = f' aria-valuenow="{bar.step}" aria-valuemin="0"'
    if bar.total:
        aria += f' aria-valuemax="{bar.total}"'
    return (
        f'<span class="hfxla-bar-track" role="progressbar"{aria} aria-label="{escape(bar.name)}"'
        f' data-state="{bar.state}" style="display:inline-block;width:{width}px;'
        f'min-width:{width}px;height:12px;background:{TRACK};border-radius:3px;'
        f'vertical-align:middle;overflow:hidden">'
        f'<span style="display:block;width:{fraction * 100:.1f}%;height:100%;'
        f'{themed("background", color)}"></span></span>'
    )


def bar_stats_html(bar: BarView) -> str:
    """Counts, timing and values next to a bar: pieces that each stay whole (`bars_html` keeps
    them on one line, cut at the end where the output is narrow)."""
    timing = [f'<span style="{MUTED}" title="{escape(means)}">{escape(part)}</span>'
              for part, means in text.timing_pieces(bar)]
    values = [f'<span style="{MONO}">{escape(part)}</span>'
              for part in text.value_parts(bar.values)]
    pieces = [f"<b>{escape(text.counts_text(bar))}</b>",
              *(values + timing if text.results_first(bar) else timing + values)]
    dot = f'<span style="{MUTED}">·</span> '
    return " ".join(
        f'<span class="hfxla-stat" style="white-space:nowrap">{dot if i else ""}{piece}</span>'
        for i, piece in enumerate(pieces)
    )


# The stats of a bar: one line whatever their length, cut with an ellipsis where the output
# is too narrow (the whole line is the cell's tooltip). Wrapping between the pieces made the
# panel taller for the steps whose figures were longer ("ETA 542 ms") and shorter again
# after; tabular figures keep the pieces' widths steady as the numbers change.
STATS_STYLE = ("min-width:0;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;"
               "font-variant-numeric:tabular-nums;")


def bars_html(bars: list[BarView]) -> str:
    """Every bar, one grid row each: caption, mark, bar (fixed width), stats. The caption
    column is as wide as the widest caption and the mark has its own column, so bars line up
    and do not move when a mark appears; the stats take the rest of the row, on one line
    (`STATS_STYLE`)."""
    if not bars:
        return ""
    cells = []
    cell = f"{_BOX}white-space:nowrap;min-height:1.4em;"  # one line, also when empty
    for bar in bars:
        mark = text.MARKS.get(bar.state, "")
        color = BAR_COLORS[bar.state]
        cells += [
            f'<span class="hfxla-bar-name" style="{cell}">{escape(bar.name)}</span>',
            f'<span class="hfxla-bar-mark" style="{cell}{text_color(color)}">{mark}</span>',
            f'<span style="{_BOX}display:flex;align-items:center;height:1.4em">'
            f"{progress_bar_html(bar)}</span>",
            f'<span class="hfxla-bar-stats" style="{_BOX}{STATS_STYLE}" '
            f'title="{escape(" · ".join(text.stat_parts(bar)))}">{bar_stats_html(bar)}</span>',
        ]
    return (
        f'<div class="hfxla-bars" style="{_BOX}display:grid;grid-template-columns:max-content '
        f'1.1em {BAR_WIDTH}px minmax(0,1fr);column-gap:0.4em;row-gap:2px;align-items:start;'
        f'margin:2px 0">{"".join(cells)}</div>'
    )


# The wall time per step's label box, in em: "median wall time per step" at the panels' font.
STEP_LABEL_EM = 13.5


def chart_html(bars: list[BarView], summary: XlaSummary | None = None) -> str:
    """Loss and step-time sparklines of the first bar that has them; '' when none has. With
    the launch's `summary`, a wall time per step below XLA's time per step says why.

    A bar's chart line is drawn from its first value on, its sparklines blank boxes of their
    size until two points exist: the line appearing a few steps in moved the panel's height
    (by 36 px at step 10)."""
    # A run that evaluates during training announces its evaluation bar from the start: the
    # legend names the dots from then on, so the chart's width stays when the first arrives.
    evaluates = any(bar.label == "eval" or bar.evaluations for bar in bars)
    for bar in bars:
        if not (bar.losses or bar.step_times):
            continue
        parts = []
        if bar.losses:
            parts.append(  # a legend where there are dots to tell from the line
                f'<span style="{MUTED}" title="{escape(text.LOSS_CHART_MEANS)}">loss</span> '
                f"{axis_html(bar.losses, bar.evaluations)} "
                f"{_sparkline_or_blank(bar.losses, SERIES['loss'], dots=bar.evaluations)} "
                f"{escape(state.number(bar.losses[-1]))}"
                + (f" {loss_legend_html()}" if evaluates else "")
            )
        if bar.step_times:
            label, means, seconds = text.step_time_label(bar)
            # The label's box fits the longer of its two texts ("median wall time per step"
            # once the bar ended): the live and the final chart wrap alike.
            parts.append(  # wall clock: the metrics' "XLA per step" is the device's share
                f'<span style="{MUTED}display:inline-block;min-width:{STEP_LABEL_EM}em" '
                f'title="{escape(means)}">{escape(label)}</span> '
                f"{_sparkline_or_blank(bar.step_times, SERIES['step time'])} "
                f"{escape(state.duration(seconds))}"
                + _above_wall_html(summary, seconds, means)
            )
        # each chart wraps as a whole when the output is narrow
        return (
            f'<div class="hfxla-chart" style="{_BOX}"><span style="{MUTED}">'
            f"{escape(bar.name)}:</span> "
            + " &nbsp; ".join(f'<span style="display:inline-block;white-space:nowrap">'
                              f"{part}</span>" for part in parts)
            + "</div>"
        )
    return ""


def _sparkline_or_blank(values: list[float], color: str, width: int = 180,
                        height: int = 36, dots: list[tuple[float, float]] = ()) -> str:
    """`sparkline_svg`, or an empty box of its size while there are fewer than 2 points."""
    return sparkline_svg(values, width, height, color, [
        (before - 1, loss) for before, loss in dots]) or (
        f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" '
        f'style="vertical-align:middle;width:{width}px;height:{height}px;max-width:none"></svg>')


# An "i" in a circle, drawn: the ⓘ character is a missing-glyph box with Debian's default
# fonts. In the text's colour (currentColor), one text line high, the same width everywhere.
INFO_ICON = (
    '<svg width="12" height="12" viewBox="0 0 12 12" xmlns="http://www.w3.org/2000/svg" '
    'role="img" aria-label="what this counts" '
    'style="vertical-align:-1px;width:12px;height:12px;max-width:none">'
    '<circle cx="6" cy="6" r="5.3" fill="none" stroke-width="1.2" style="stroke:currentColor"/>'
    '<rect x="5.35" y="5" width="1.3" height="4.2" style="fill:currentColor"/>'
    '<circle cx="6" cy="3.2" r="0.85" style="fill:currentColor"/></svg>')


def _above_wall_html(summary: XlaSummary | None, wall_seconds: float,
                     means: str = text.STEP_TIME_MEANS) -> str:
    """A muted info icon (`INFO_ICON`) after the wall time per step, always there: its
    tooltip says what the wall time counts, and, when XLA's time per step is the larger, why
    (`XLA_ABOVE_WALL`).
    Words that came and went beside it made the live chart line wrap and the panel grow by a
    line while they were shown."""
    if xla_exceeds_wall(summary, wall_seconds):
        means = f"{text.XLA_ABOVE_WALL}: {text.XLA_ABOVE_WALL_MEANS}"
    return f' <span style="{MUTED}" title="{escape(means)}">{INFO_ICON}</span>'


def _row(name: str, value: str, means: str | None = None) -> str:
    """A row of the metrics table; `means` (what the figure counts) as the value's tooltip."""
    return label_row(name, escape(value), means, tag="td")


def summary_html(summary: XlaSummary | None, title: str = "XLA metrics",
                 live: bool = False) -> str:
    """The metrics table: compiles, executions, transfers, fallbacks, memory, input shapes;
    one line when nothing was compiled or executed."""
    if summary is None:
        return f'<div style="{_BOX}{MUTED}">{escape(title)}: none yet</div>'
    title_line = f"{title} {text.steps_phrase(summary, live)}".rstrip()
    if text.nothing_ran(summary):
        return (f'<div style="{_BOX}">{heading(escape(title_line))}: nothing compiled or '
                "executed" + (" yet" if live else "") + "</div>")
    share = summary.compile_share
    rows = [
        _row("compiles", text.compiles_text(summary)),
        *([_row("after the last step", after)] if (after := text.after_steps_text(summary))
          else []),
        _row("executions", text.executions_text(summary, live), text.XLA_STEP_MEANS),
    ]
    if share is not None:
        rows.append(_row("time share", f"compile {share * 100:.0f}% / execute "
                                       f"{(1 - share) * 100:.0f}%"))
    rows += [
        _row("device → host", text.transfers_text(
            summary.transfers_from_device, summary.transfer_from_device_seconds,
            summary.bytes_from_device, summary.item_calls)),
        _row("host → device", text.transfers_text(
            summary.transfers_to_device, summary.transfer_to_device_seconds,
            summary.bytes_to_device)),
        _row("CPU fallbacks", ", ".join(f"{op} x{count}" for op, count in
                                        summary.fallbacks.items()) or "none"),
        _row("device memory", text.memory_text(summary.memory)),
    ]
    for name, info in shape_changes(summary.input_shapes).items():
        rows.append(_row(f"input '{name}'", text.shapes_text(info)))
    return (
        f'<div style="{_BOX}">{heading(escape(title_line))}{table(rows)}'
        f"{compilations_html(summary)}</div>"
    )


def alerts_html(alerts: list[Alert]) -> str:
    """Each alert as a box with a coloured edge and symbol: title, explanation, fix (the text
    itself in the theme's colour, readable on light and dark backgrounds)."""
    boxes = []
    for alert in alerts:
        color = SEVERITY_COLORS.get(alert.severity, AMBER)
        boxes.append(
            f'<div style="{_BOX}border-left:4px solid;{themed("border-left-color", color)}'
            'padding:2px 8px;margin:4px 0">'
            f'<b><span style="{text_color(color)}">'
            f"{escape(text.SEVERITY.get(alert.severity, '!'))}</span> "
            f"{escape(alert.title)}</b><br>{escape(alert.explanation)}<br>"
            f"<i>Fix:</i> {escape(alert.fix)}</div>"
        )
    return "".join(boxes)


def metrics_html(summary: XlaSummary | None, alerts: list[Alert],
                 title: str = "XLA metrics", live: bool = False) -> str:
    """The metrics panel: table and alerts."""
    return (f'<div class="hfxla-metrics" style="{_BOX}">{summary_html(summary, title, live)}'
            f"{alerts_html(alerts)}</div>")


def note_html(line: str, color: str = RED) -> str:
    """An error (red) or a note (amber) line under the bars."""
    return f'<div style="{_BOX}{text_color(color)}">{escape(line)}</div>'


def notes_html(view: LaunchView) -> str:
    """The errors after the first (the status names that one) and the notes."""
    return ("".join(note_html(line) for line in view.errors[1:])
            + "".join(note_html(line, AMBER) for line in view.notes))


def generations_html(view: LaunchView) -> str:
    """Each row of a streamed generation: the prompt's end (muted), the text so far under it
    ('' without one)."""
    rows = []
    for row in view.generations:
        answer = escape(row.text) + ("" if row.done else text.CURSOR)
        rows.append(f'<div style="{MUTED}{MONO}">{escape(text.prompt_tail(row.prompt))}</div>'
                    f'<div style="{MONO}white-space:pre-wrap;padding-left:1em">{answer}</div>')
    return f'<div class="hfxla-generations" style="{_BOX}">{"".join(rows)}</div>' if rows else ""


def view_metrics_html(view: LaunchView) -> str:
    """The launch's metrics panel ('' before the first snapshot, and at the end of a launch
    that ran no XLA)."""
    if not text.shows_metrics(view):
        return ""
    return metrics_html(view.metrics, view.alerts, text.metrics_title(view), live=not view.done)


def launch_html(view: LaunchView) -> str:
    """The whole launch panel: status, bars, chart, errors, metrics and alerts (what the live
    widget panel shows too, part by part)."""
    parts = [status_html(view), bars_html(view.bars) + generations_html(view),
             chart_html(view.bars, view.metrics) + notes_html(view),
             view_metrics_html(view)]
    return f'<div class="hfxla-launch" style="{PANEL}">{"".join(parts)}</div>'


# The panel's own box, every panel's (`state.BOX`); the live widget panel draws the same
# border and padding around its parts (`live.PANEL_LAYOUT`), so both lay out alike.
PANEL = BOX


# -- the static %%xla_metrics panel --

class MetricsPanel:
    """What a piece of XLA work compiled, executed, transferred and fell back on, with alerts.

    Displays as HTML in a notebook; `repr()` is the same content as text.
    """

    def __init__(self, summary: XlaSummary, alerts: list[Alert], title: str = "XLA metrics",
                 note: str | None = None):
        self.summary = summary
        self.alerts = list(alerts)
        self.title = title
        self.note = note  # one line under the panel (what the cell changed in the kernel)

    def _repr_html_(self) -> str:
        note = note_html(f"ℹ {self.note}", BLUE) if self.note else ""
        # The one box around the table the launch panel holds without one of its own.
        return panel(metrics_html(self.summary, self.alerts, self.title) + note,
                     "hfxla-metrics-panel")

    def __repr__(self) -> str:
        note = f"\nℹ {self.note}" if self.note else ""
        return f"{self.title}\n{text.metrics_text(self.summary, self.alerts)}{note}"
