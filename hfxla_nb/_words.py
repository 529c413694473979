"""Words and units that every layer writes the same way.

Counted nouns as a person writes them ("1 step", "2 steps"), and which metrics count things
(`is_count`). The one duration format (`40 µs`, `3.2 s`, `4 min 05 s`) and the one size
format (`82.5 KiB`). The choices that several layers check (`PROGRESS_MODES`).

This module sits below every layer that writes one of these: the panels (through
`ui.state`'s units) and the analyzer's alerts, so a compile time or a transfer's size reads
the same in the table and in the alert.
"""

from __future__ import annotations

# -- counted nouns --

def plural(count: float, noun: str, plural_form: str | None = None) -> str:
    """`count` and `noun`, the noun in the plural unless the count is exactly one."""
    word = noun if count == 1 else (plural_form or noun + "s")
    return f"{count:g} {word}" if isinstance(count, float) else f"{count} {word}"


def series(items: list) -> str:
    """Items joined as a sentence lists them: `0`, `0 and 1`, `0, 1 and 2`."""
    words = [str(item) for item in items]
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"


def ranks_were(ranks: list[int], what: str) -> str:
    """A sentence about some ranks, its noun and verb agreeing with their number:
    `Rank 0 was stopped.`, `Ranks 0, 1 and 2 were stopped.`"""
    subject = "Rank" if len(ranks) == 1 else "Ranks"
    verb = "was" if len(ranks) == 1 else "were"
    return f"{subject} {series(ranks)} {verb} {what}."


# The last word of a metric's name that says it counts things (`eval_rows`, `eval_tokens`,
# `eval_LOC_entities`, seqeval's `support`). A count is shown whole, never `53.0000`.
COUNT_WORDS = frozenset({"rows", "tokens", "samples", "steps", "count", "examples", "entities",
                         "support", "number"})


def is_count(name: str, value: float) -> bool:
    """Whether a metric counts things: the last word of its name is a count word
    (`COUNT_WORDS`) and its value is whole. The one rule every form of the result uses (its
    panels, its model card).

    Args:
        name: the metric's name (`eval_rows`, `eval_LOC_entities`).
        value: its value; a count that is not whole (a mean) is not shown as a count.
    """
    if value != value or value in (float("inf"), float("-inf")):
        return False
    return name.rsplit("_", 1)[-1].lower() in COUNT_WORDS and float(value).is_integer()


# -- durations and sizes --

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


# -- choices that several layers check --

#: How panels are drawn: `progress=` of `notebook_launcher` and `fine_tune`.
PROGRESS_MODES = ("auto", "widgets", "html", "console", "none")
