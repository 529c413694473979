"""HTML forms of the panels, built by plain functions (no IPython needed, easy to test).

Every function takes the data of `ui.state` / `metrics` and returns a string of HTML with
inline styles, so it renders the same in Jupyter, Colab, Kaggle, VS Code and nbconvert output.

Colours read on light and dark themes alike: text keeps the theme's own colour (secondary
text is the same colour, dimmed with `opacity`); coloured text takes JupyterLab's theme
variable of the same meaning (`--jp-error-color1`, ...), with a fixed colour for notebooks
without them; fills, borders and chart lines use mid-tone colours that show on both.
"""

from __future__ import annotations

from html import escape

from ..observe.analyzer import Alert
from ..observe.metrics import XlaSummary, shape_changes
from . import text
from .compilations import compilations_html
from .state import BarView, LaunchView

COLORS = {
    "running": "#1f77b4",
    "starting": "#7f7f7f",
    "done": "#2ca02c",
    "finished": "#2ca02c",
    "failed": "#d62728",
    "error": "#d62728",
    "warning": "#e6a700",
    "info": "#1f77b4",
}
# JupyterLab's theme colour for text of each meaning (light and dark themes define them).
_THEME_TEXT = {
    "#1f77b4": "--jp-brand-color1",
    "#2ca02c": "--jp-success-color1",
    "#d62728": "--jp-error-color1",
    "#e6a700": "--jp-warn-color1",
    "#7f7f7f": "--jp-ui-font-color2",
}
_BOX = "font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;line-height:1.4;"
# Secondary text: the theme's text colour, dimmed, so it reads on light and dark backgrounds.
MUTED = "opacity:0.75;"
# The empty part of a progress bar: grey at a quarter strength shows on any background.
TRACK = "rgba(128,128,128,0.25)"


def text_color(color: str) -> str:
    """CSS for text in `color`: JupyterLab's theme colour of the same meaning when the page
    has one (readable on its light and dark themes), else `color` itself. Two declarations,
    so a sanitizer that drops `var()` (untrusted notebooks) keeps the plain one."""
    variable = _THEME_TEXT.get(color)
    return f"color:{color};" + (f"color:var({variable},{color});" if variable else "")


def sparkline_svg(values: list[float], width: int = 180, height: int = 36,
                  color: str = "#1f77b4") -> str:
    """An inline SVG line chart of `values` (at most `width` points); '' for under 2 values."""
    points = [float(v) for v in values if v == v]  # drop NaN
    if len(points) < 2:
        return ""
    if len(points) > width:
        stride = len(points) / width
        points = [points[int(i * stride)] for i in range(width)] + [points[-1]]
    low, high = min(points), max(points)
    span = high - low
    step = (width - 4) / (len(points) - 1)

    def y(value: float) -> float:  # a flat series runs through the middle
        return height / 2 if span == 0 else height - 2 - (value - low) / span * (height - 4)

    coords = " ".join(f"{2 + i * step:.1f},{y(value):.1f}" for i, value in enumerate(points))
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" style="vertical-align:middle">'
        f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/></svg>'
    )


def status_html(view: LaunchView) -> str:
    """The launch's one-line status, colored by state (green finished, red failed)."""
    color = COLORS.get(view.state, "#7f7f7f")
    return (
        f'<div style="{_BOX}padding:4px 8px;border-left:4px solid {color};'
        f'{text_color(color)}font-weight:600">{escape(text.status_line(view))}</div>'
    )


def progress_bar_html(bar: BarView, width: int = 200) -> str:
    """The bar itself: a filled box of fixed width (full when the total is unknown)."""
    fraction = bar.fraction if bar.fraction is not None else 1.0
    color = COLORS.get(bar.state, "#1f77b4")
    return (
        f'<span style="display:inline-block;width:{width}px;min-width:{width}px;height:12px;'
        f'background:{TRACK};border-radius:3px;vertical-align:middle;overflow:hidden">'
        f'<span style="display:block;width:{fraction * 100:.1f}%;height:100%;'
        f'background:{color}"></span></span>'
    )


def bar_stats_html(bar: BarView) -> str:
    """Counts, timing and values next to a bar (also used by the widget renderer)."""
    percent = f" ({bar.fraction * 100:.0f}%)" if bar.fraction is not None else ""
    values = text.values_text(bar.values)
    return (
        f'<span style="{_BOX}"><b>{escape(text.counts_text(bar))}</b>{percent} '
        f'<span style="{MUTED}">{escape(text.timing_text(bar))}</span>'
        + (f" &nbsp; <code>{escape(values)}</code>" if values else "")
        + "</span>"
    )


def bar_html(bar: BarView) -> str:
    """One row: caption, bar (fixed width), stats."""
    mark = {"done": " ✔", "failed": " ✖"}.get(bar.state, "")
    # Caption and bar keep their width; the stats take the rest and wrap when narrow, so
    # every rank's bar has the same width and place.
    return (
        f'<div style="{_BOX}display:flex;align-items:center;column-gap:0.4em">'
        f'<span style="flex:none;min-width:9em;white-space:nowrap">'
        f"{escape(bar.name + mark)}</span>"
        f'<span style="flex:none;line-height:0">{progress_bar_html(bar)}</span>'
        f'<span style="flex:1 1 0;min-width:0">{bar_stats_html(bar)}</span></div>'
    )


def chart_html(bars: list[BarView]) -> str:
    """Loss and step-time sparklines of the first bar that has them; '' when none has."""
    for bar in bars:
        parts = []
        if len(bar.losses) >= 2:
            parts.append(
                f'<span style="{MUTED}">loss</span> '
                f"{sparkline_svg(bar.losses, color=COLORS['failed'])} "
                f"{escape(text.number(bar.losses[-1]))}"
            )
        if len(bar.step_times) >= 2:
            parts.append(
                f'<span style="{MUTED}">step time</span> '
                f"{sparkline_svg(bar.step_times, color=COLORS['running'])} "
                f"{escape(text.duration(bar.step_times[-1]))}"
            )
        if parts:  # each chart wraps as a whole when the output is narrow
            return (
                f'<div style="{_BOX}"><span style="{MUTED}">{escape(bar.name)}:</span> '
                + " &nbsp; ".join(f'<span style="display:inline-block;white-space:nowrap">'
                                  f"{part}</span>" for part in parts)
                + "</div>"
            )
    return ""


def _row(name: str, value: str) -> str:
    return (
        f'<tr><td style="text-align:left;padding:1px 10px 1px 0;{MUTED}">{escape(name)}</td>'
        f'<td style="text-align:left;padding:1px 0">{escape(value)}</td></tr>'
    )


def summary_html(summary: XlaSummary | None, title: str = "XLA metrics") -> str:
    """The metrics table: compiles, executions, transfers, fallbacks, memory, input shapes."""
    if summary is None:
        return f'<div style="{_BOX}{MUTED}">{escape(title)}: none yet</div>'
    per_step = ""
    if summary.steps:
        per_step = f" in {summary.steps} steps"
    share = summary.compile_share
    rows = [
        _row("compiles", f"{summary.compiles} ({text.duration(summary.compile_time)}), "
                         f"{summary.cached_compiles} cache hits"),
        _row("executions", f"{summary.executions} ({text.duration(summary.execute_time)})"),
    ]
    if share is not None:
        rows.append(_row("time share", f"compile {share * 100:.0f}% / execute "
                                       f"{(1 - share) * 100:.0f}%"))
    rows += [
        _row("device → host", f"{summary.transfers_from_device} transfers, "
                              f"{text.size(summary.bytes_from_device)}, "
                              f"{text.duration(summary.transfer_from_device_time)}; "
                              f".item() calls: {summary.item_calls}"),
        _row("host → device", f"{summary.transfers_to_device} transfers, "
                              f"{text.size(summary.bytes_to_device)}, "
                              f"{text.duration(summary.transfer_to_device_time)}"),
        _row("CPU fallbacks", ", ".join(f"{op} x{count}" for op, count in
                                        summary.fallbacks.items()) or "none"),
        _row("device memory", text.memory_text(summary.memory)),
    ]
    for name, info in shape_changes(summary.input_shapes).items():
        rows.append(_row(f"input '{name}'", text.shapes_text(info)))
    return (
        f'<div style="{_BOX}"><b>{escape(title)}{escape(per_step)}</b>'
        f'<table style="border-collapse:collapse;margin:2px 0">{"".join(rows)}</table>'
        f"{compilations_html(summary)}</div>"
    )


def alerts_html(alerts: list[Alert]) -> str:
    """Each alert as a box with a coloured edge and symbol: title, explanation, fix (the text
    itself in the theme's colour, readable on light and dark backgrounds)."""
    boxes = []
    for alert in alerts:
        color = COLORS.get(alert.severity, COLORS["warning"])
        boxes.append(
            f'<div style="{_BOX}border-left:4px solid {color};padding:2px 8px;margin:4px 0">'
            f'<b><span style="{text_color(color)}">'
            f"{escape(text.SEVERITY.get(alert.severity, '!'))}</span> "
            f"{escape(alert.title)}</b><br>{escape(alert.explanation)}<br>"
            f"<i>Fix:</i> {escape(alert.fix)}</div>"
        )
    return "".join(boxes)


def metrics_html(summary: XlaSummary | None, alerts: list[Alert],
                 title: str = "XLA metrics") -> str:
    """The metrics panel: table and alerts."""
    return f"<div>{summary_html(summary, title)}{alerts_html(alerts)}</div>"


def note_html(line: str) -> str:
    """An error or note line under the bars (red)."""
    return f'<div style="{_BOX}{text_color(COLORS["failed"])}">{escape(line)}</div>'


def launch_html(view: LaunchView) -> str:
    """The whole launch panel: status, bars, chart, errors, metrics and alerts."""
    parts = [status_html(view)]
    parts += [bar_html(bar) for bar in view.bars]
    parts.append(chart_html(view.bars))
    parts += [note_html(line) for line in view.errors[1:] + view.notes]
    if view.metrics is not None:
        parts.append(metrics_html(view.metrics, view.alerts, text.metrics_title(view)))
    return f'<div class="hfxla-launch">{"".join(parts)}</div>'
