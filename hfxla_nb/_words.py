"""Counted nouns written as a person would ("1 step", "2 steps"), for every layer."""

from __future__ import annotations


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
