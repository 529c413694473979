"""Units for people: durations, clock times, rates, sizes and values, each as a short string.

The formatting every panel shares (`text`, `html`, `compilations`, `finetune_panel`): plain
functions of numbers, below the panels that use them.
"""

from __future__ import annotations

from .._units import data_size, duration
from ..observe.bars import seconds_per_step

__all__ = ["duration", "number", "score", "size", "rate", "clock"]


def number(value: float) -> str:
    """A value to show, in at most 6 characters (a sign aside): up to 4 significant digits
    (`0.4213`, `12.35`, `0.0014`), or 2 in short scientific form for very small or large
    values (`1.7e-4`, `2.5e6`)."""
    if value == 0:
        return "0"
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if 1e-3 <= abs(value) < 1e5:
        for digits in (4, 3, 2):
            text = f"{value:.{digits}g}"
            if "e" not in text and len(text.lstrip("-")) <= 6:
                return text
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def score(value: float) -> str:
    """A score or metric in a table (predictions' scores, the evaluation's metrics): the one
    rounding rule of hfxla_nb's tables, 4 decimals (`0.9877`, `0.5000`, `12.3457`), one for
    1000 and more (`1,234.5`), so a column of them lines up."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"


def size(count: int | None) -> str:
    """Bytes in B, KiB, MiB, GiB; 'n/a' for None (`_units.data_size`, as the alerts say it)."""
    return data_size(count)


def rate(value: float | None, unit: str, per_step: bool | None = None) -> str:
    """`12.3 it/s`, `1,030 samples/s` (whole, with a thousands comma, from 1000 on), or
    `1.20 s/it` for slow steps.

    Args:
        value: per second.
        unit: what is counted ("it": steps, which may read per step; "samples").
        per_step: for steps, the unit the bar chose (`BarView.per_step`); None: the same rule
            (`observe.bars.seconds_per_step`) for this value alone. The choice is never made
            here, so a bar keeps one unit for its whole run.
    """
    if value is None or value <= 0:
        return f"? {unit}/s"
    if unit == "it" and (seconds_per_step(value) if per_step is None else per_step):
        return f"{1 / value:.2f} s/{unit}"
    if value >= 999.5:  # 3 significant digits would read `1.03e+03`
        return f"{value:,.0f} {unit}/s"
    return f"{value:.3g} {unit}/s"


def clock(seconds: float | None) -> str:
    """A bar's time, short: `850 ms`, `12.0 s`, then `1:05` (min:s) and `1:02:05`."""
    if seconds is None or seconds < 59.95:
        return duration(seconds)
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}:{secs:02d}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
