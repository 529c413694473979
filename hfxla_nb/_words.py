"""Counted nouns written as a person would ("1 step", "2 steps"), for every layer."""

from __future__ import annotations


def plural(count: float, noun: str, plural_form: str | None = None) -> str:
    """`count` and `noun`, the noun in the plural unless the count is exactly one."""
    word = noun if count == 1 else (plural_form or noun + "s")
    return f"{count:g} {word}" if isinstance(count, float) else f"{count} {word}"
