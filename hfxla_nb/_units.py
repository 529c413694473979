"""The one duration format (`40 µs`, `3.2 s`, `4 min 05 s`) and the one size format
(`82.5 KiB`), below every layer that writes one: the panels (`ui.units` gives them to them
with the other units) and the analyzer's alerts, so a compile time or a transfer's size
reads the same in the table and in the alert.
"""

from __future__ import annotations


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


def data_size(count: float | None) -> str:
    """Bytes in B, KiB, MiB, GiB (`512 B`, `82.5 KiB`); 'n/a' for None."""
    if count is None:
        return "n/a"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover
