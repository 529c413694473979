"""Plain-text forms of the panels: console output and every panel's `__repr__`.

Pure functions of the data in `ui.state` and `metrics`; nothing is computed here but format.
"""

from __future__ import annotations

from ..observe.analyzer import Alert
from ..observe.metrics import InputShapes, XlaSummary, shape_changes
from .state import BarView, LaunchView

SYMBOLS = {"finished": "✔", "failed": "✖", "running": "…", "starting": "…"}
SEVERITY = {"error": "✖", "warning": "⚠", "info": "ℹ"}


# Input shapes listed in a panel row (the alerts name how many there were in all).
SHAPES_SHOWN = 8


def duration(seconds: float | None) -> str:
    """`40 µs`, `3.5 ms`, `24 ms`, `3.2 s`, `4 min 05 s`, `1 h 02 min`; '?' for None."""
    if seconds is None:
        return "?"
    seconds = max(float(seconds), 0.0)
    if seconds == 0:
        return "0 s"
    milliseconds = seconds * 1000
    if milliseconds < 0.9995:
        return f"{milliseconds * 1000:.0f} µs"
    if milliseconds < 9.95:
        return f"{milliseconds:.1f} ms"
    if milliseconds < 999.5:
        return f"{milliseconds:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def number(value: float) -> str:
    """A value to show: 4 significant digits, scientific for very small/large ones."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4g}"


def size(count: int | None) -> str:
    """Bytes in B, KiB, MiB, GiB; 'n/a' for None."""
    if count is None:
        return "n/a"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover


def rate(value: float | None, unit: str) -> str:
    """`12.3 it/s`, or `1.2 s/it` for slow ones."""
    if value is None or value <= 0:
        return f"? {unit}/s"
    if value < 1 and unit == "it":
        return f"{1 / value:.2f} s/{unit}"
    return f"{value:.3g} {unit}/s"


def values_text(values: dict[str, float]) -> str:
    """`loss=0.4213 lr=1.000e-04`."""
    return " ".join(f"{name}={number(value)}" for name, value in values.items())


def counts_text(bar: BarView) -> str:
    """`40/100` or `40`."""
    return f"{bar.step}/{bar.total}" if bar.total else f"{bar.step}"


def timing_text(bar: BarView) -> str:
    """`12.0 s elapsed, ETA 18.0 s, 3.3 it/s, 53.1 samples/s`."""
    parts = [f"{duration(bar.elapsed)} elapsed"]
    if bar.state == "running" and bar.total:
        parts.append(f"ETA {duration(bar.eta)}")
    parts.append(rate(bar.rate, "it"))
    if bar.samples_rate is not None:
        parts.append(rate(bar.samples_rate, "samples"))
    return ", ".join(parts)


def bar_line(bar: BarView, width: int = 20) -> str:
    """One line: `train [rank 0] |████░░░░| 40/100 40% 12.0 s elapsed, ... loss=0.42`."""
    fraction = bar.fraction
    if fraction is None:
        drawn = ""
        percent = ""
    else:
        filled = int(round(fraction * width))
        drawn = "|" + "█" * filled + "░" * (width - filled) + "| "
        percent = f" {fraction * 100:.0f}%"
    mark = {"done": " ✔", "failed": " ✖"}.get(bar.state, "")
    line = f"{bar.name}{mark} {drawn}{counts_text(bar)}{percent} {timing_text(bar)}"
    if bar.values:
        line += " | " + values_text(bar.values)
    return line


def status_line(view: LaunchView) -> str:
    """`✔ finished: 2 ranks in 12.3 s` and the like."""
    symbol = SYMBOLS.get(view.state, "")
    ranks = f"{view.world} rank{'s' if view.world != 1 else ''}"
    if view.state == "finished":
        return f"{symbol} finished: {ranks} in {duration(view.elapsed)}"
    if view.state == "failed":
        first = f": {view.errors[0]}" if view.errors else ""
        return f"{symbol} failed after {duration(view.elapsed)}{first}"
    states = list(view.ranks.values())
    done = sum(state == "finished" for state in states)
    running = sum(state == "running" for state in states)
    return (
        f"{symbol} {view.state}: {running} of {ranks} running, {done} finished, "
        f"{duration(view.elapsed)}"
    )


def summary_lines(summary: XlaSummary | None) -> list[str]:
    """The XLA metrics panel as lines."""
    if summary is None:
        return ["XLA metrics: none yet"]
    steps = f" in {summary.steps} steps" if summary.steps else ""
    share = summary.compile_share
    share_text = f", compile {share * 100:.0f}% / execute {(1 - share) * 100:.0f}%" if (
        share is not None) else ""
    lines = [
        f"XLA{steps}: {summary.compiles} compiles ({duration(summary.compile_time)}), "
        f"{summary.executions} executions ({duration(summary.execute_time)}){share_text}",
        f"transfers: {summary.transfers_from_device} from device "
        f"({size(summary.bytes_from_device)}, {duration(summary.transfer_from_device_time)}), "
        f"{summary.transfers_to_device} to device ({size(summary.bytes_to_device)}, "
        f"{duration(summary.transfer_to_device_time)}); .item() calls: {summary.item_calls}",
    ]
    if summary.fallbacks:
        lines.append("CPU fallbacks: " + ", ".join(
            f"{op} x{count}" for op, count in summary.fallbacks.items()))
    else:
        lines.append("CPU fallbacks: none")
    lines.append("device memory: " + memory_text(summary.memory))
    for name, info in shape_changes(summary.input_shapes).items():
        lines.append(f"input {name!r} shapes: " + shapes_text(info))
    from .compilations import compilation_lines  # it formats with this module

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
    """` (rank 0)`, ` (process of ranks 0-3)` or ''."""
    ranks = view.metrics_ranks or ([] if view.metrics_rank is None else [view.metrics_rank])
    label = metrics_label(ranks)
    return f" ({label})" if label else ""


def metrics_title(view: LaunchView) -> str:
    """`XLA metrics (rank 0)`, `XLA metrics (process of ranks 0-3)`."""
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


def launch_text(view: LaunchView) -> str:
    """The whole launch panel as text: status, bars, errors, metrics, alerts."""
    lines = [status_line(view)]
    lines += [bar_line(bar) for bar in view.bars]
    lines += [f"error: {error}" for error in view.errors[1:]]
    lines += view.notes
    if view.metrics is not None:
        metrics = summary_lines(view.metrics)
        metrics[0] = metrics[0] + _metrics_whose(view)
        lines += metrics
    lines += alert_lines(view.alerts)
    return "\n".join(lines)
