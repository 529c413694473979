"""Sequence-to-sequence data for `fine_tune(task="seq2seq")`, in the kernel: source and target
texts read from a dataset (XSum-style columns or WMT's `translation` dicts), checked, and
tokenized into fixed shapes.

Each row becomes `[input_ids (L) | attention_mask (L) | labels (T)]` int32: the source padded
to its length bucket L, the target to one length T for the whole run, -100 on the target's
padding (not learned). The model shifts the labels right itself to make the decoder inputs.
Nothing here forks or writes; every refusal is a `DataError` saying what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._words import plural
from .. import batching
from ..batching import Bucket, EncodedData, EncodedSplit
from ..generation_options import GenerationOptions
from ..kernel import data
from ..kernel.data import DataError

IGNORE = -100
#: Source/target column pairs of well-known datasets, tried in order when none is named.
KNOWN_COLUMNS = (
    ("document", "summary"),      # xsum
    ("article", "highlights"),    # cnn_dailymail
    ("dialogue", "summary"),      # samsum
    ("source", "target"),
    ("input", "output"),
    ("text", "summary"),
    ("text", "target"),
)
TRANSLATION_COLUMN = "translation"


@dataclass
class Seq2SeqColumns:
    """Where the texts are: `source_column`/`target_column`, or a language pair of the
    `translation` column; `prefix` goes in front of every source ("summarize: ")."""

    source_column: str | None = None
    target_column: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    prefix: str | None = None

    @property
    def translation(self) -> bool:
        return self.source_lang is not None or self.target_lang is not None


@dataclass
class Seq2SeqData(EncodedData):
    """`EncodedData` with the target length every row is padded to."""

    target_length: int = 0
    text_metrics: tuple[str, ...] = ()
    described: str = ""
    options: GenerationOptions | None = None  # predict's sampling and early stop, if asked


@dataclass
class Pairs:
    """One split's source and target texts (the prefix already in front of each source)."""

    sources: list[str]
    targets: list[str]
    notes: list[str] = field(default_factory=list)


def read_pairs(named: Mapping[str, Any],
               columns: Seq2SeqColumns) -> tuple[dict[str, Pairs], str]:
    """The texts of the training split and the evaluation split (if any), checked.

    Args:
        named: split name -> `datasets.Dataset`, training first (`Splits.named`).
        columns: where the texts are.

    Returns:
        `({split: Pairs}, what)`: train first, and a short description of the columns used
        ("document -> summary", "translation en -> fr").
    """
    if columns.translation and (columns.source_lang is None or columns.target_lang is None):
        raise DataError(
            "source_lang and target_lang go together: pass both, e.g. source_lang='en', "
            "target_lang='fr', for a 'translation' column of {'en': ..., 'fr': ...} dicts."
        )
    if columns.translation and (columns.source_column or columns.target_column):
        raise DataError(
            "pass either source_lang/target_lang (a 'translation' column of dicts, as WMT's "
            "datasets have) or source_column/target_column (two text columns), not both."
        )
    source, target = _column_names(named["train"], columns)
    result = {}
    for split, ds in named.items():
        if columns.translation:
            sources, targets = _translation(ds, split, columns.source_lang, columns.target_lang)
        else:
            _require_columns(ds, split, [source, target])
            sources = data.check_texts(data.column_values(ds, source), source, split)
            targets = data.check_texts(data.column_values(ds, target), target, split)
        prefix = columns.prefix or ""
        result[split] = Pairs([prefix + text for text in sources], list(targets))
    what = (f"{TRANSLATION_COLUMN} {columns.source_lang} -> {columns.target_lang}"
            if columns.translation else f"{source} -> {target}")
    return result, what


def _column_names(ds: Any, columns: Seq2SeqColumns) -> tuple[str | None, str | None]:
    if columns.translation:
        return None, None
    present = list(ds.column_names)
    if (columns.source_column is None) != (columns.target_column is None):
        given = "source_column" if columns.source_column else "target_column"
        other = "target_column" if columns.source_column else "source_column"
        raise DataError(f"{given}= needs {other}= too (the data has the columns "
                        f"{', '.join(map(repr, present))}).")
    if columns.source_column is not None:
        return columns.source_column, columns.target_column
    for source, target in KNOWN_COLUMNS:
        if source in present and target in present:
            return source, target
    if TRANSLATION_COLUMN in present:
        languages = _languages(ds)
        raise DataError(
            f"the data has a {TRANSLATION_COLUMN!r} column (languages: "
            f"{', '.join(map(repr, languages)) or 'unknown'}): pass source_lang= and "
            "target_lang= to say which way to translate."
        )
    raise DataError(
        f"task='seq2seq' needs a source and a target text column, and the train data has "
        f"{', '.join(map(repr, present)) or 'no columns'}. Pass source_column=... and "
        "target_column=... (XSum: 'document' and 'summary'), or source_lang=... and "
        f"target_lang=... for a {TRANSLATION_COLUMN!r} column of dicts (WMT)."
    )


def _require_columns(ds: Any, split: str, needed: list[str | None]) -> None:
    present = list(ds.column_names)
    missing = [name for name in needed if name not in present]
    if missing:
        raise DataError(
            f"the {split} data has no column {' and no column '.join(map(repr, missing))}: "
            f"task='seq2seq' needs the columns {', '.join(map(repr, needed))}, and it has "
            f"{', '.join(map(repr, present)) or 'none'}. Pass source_column=... and "
            "target_column=... with the names of yours."
        )


def _languages(ds: Any) -> list[str]:
    """The languages of a `translation` column: its feature's, else those of the first rows."""
    feature = ds.features.get(TRANSLATION_COLUMN) if hasattr(ds, "features") else None
    languages = getattr(feature, "languages", None)
    if languages:
        return list(languages)
    seen: dict[str, None] = {}
    for value in ds.select(range(min(len(ds), 100)))[TRANSLATION_COLUMN]:
        if isinstance(value, Mapping):
            seen.update(dict.fromkeys(k for k, v in value.items() if v is not None))
    return sorted(seen)


def _translation(ds: Any, split: str, source_lang: str, target_lang: str):
    _require_columns(ds, split, [TRANSLATION_COLUMN])
    values = data.column_values(ds, TRANSLATION_COLUMN)
    languages = _languages(ds)
    sources, targets, missing = [], [], []
    for row, value in enumerate(values):
        if not isinstance(value, Mapping):
            raise DataError(
                f"row {row} of column {TRANSLATION_COLUMN!r} ({split}) holds a "
                f"{type(value).__name__}, not a dict of texts by language such as "
                f"{{{source_lang!r}: '...', {target_lang!r}: '...'}}."
            )
        pair = (value.get(source_lang), value.get(target_lang))
        if pair[0] is None or pair[1] is None:
            missing.append(row)
            continue
        sources.append(pair[0])
        targets.append(pair[1])
    if missing:
        absent = [lang for lang in (source_lang, target_lang) if lang not in languages]
        which = (f"has no {' and no '.join(map(repr, absent))}" if absent
                 else f"lacks {source_lang!r} or {target_lang!r} in {plural(len(missing), 'row')}"
                      f" (the first: row {missing[0]})")
        raise DataError(
            f"the {TRANSLATION_COLUMN!r} column ({split}) {which}: its languages are "
            f"{', '.join(map(repr, languages)) or 'none'}. Pass source_lang= and target_lang= "
            "from those."
        )
    data.check_texts(sources, f"{TRANSLATION_COLUMN}.{source_lang}", split)
    data.check_texts(targets, f"{TRANSLATION_COLUMN}.{target_lang}", split)
    return sources, targets


# ---------------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------------


def tokenize_targets(tokenizer: Any, targets: list[str]) -> list[list[int]]:
    """Target token ids with the tokenizer's end-of-text token (its target side when it has
    one, as Marian's tokenizers do)."""
    return [list(ids) for ids in tokenizer(text_target=targets)["input_ids"]]


def target_length(splits: Mapping[str, list[list[int]]], requested: int | None,
                  limit: int | None) -> int:
    """The one length every target is padded to: `requested`, or the longest target rounded
    up to a multiple of 8. Refused when targets would be cut."""
    longest = max(len(ids) for rows in splits.values() for ids in rows)
    if requested is None:
        if limit is not None and longest > limit:
            raise DataError(
                f"the longest target has {longest} tokens, beyond the {limit} positions the "
                "model's decoder has; shorten the targets (or use a model with more positions)."
            )
        length = batching.round_up(longest)
        return min(length, limit) if limit is not None else length
    if limit is not None and requested > limit:
        raise DataError(f"max_target_length={requested} is beyond the {limit} positions the "
                        f"model's decoder has; pass max_target_length<={limit}.")
    for split, rows in splits.items():
        cut = sum(len(ids) > requested for ids in rows)
        if cut:
            raise DataError(
                f"{cut} of {plural(len(rows), f'{split} target')} are longer than "
                f"max_target_length={requested} tokens and would be cut (the longest has "
                f"{longest}, end-of-text token included). Pass max_target_length="
                f"{batching.round_up(longest)}, or shorten or drop those rows first."
            )
    return int(requested)


def encode_split(name: str, sources: dict, targets: list[list[int]], buckets: list[int],
                 length: int, pad_id: int, truncated: int) -> EncodedSplit:
    """Rows `[input_ids | attention_mask | labels]`, each source in the smallest bucket that
    holds it (longer ones cut and counted), the labels padded to `length` with -100."""
    ids = sources["input_ids"]
    lengths = np.fromiter((len(row) for row in ids), np.int64, len(ids))
    edges = np.asarray(sorted(buckets))
    truncated = int(truncated) + int((lengths > edges[-1]).sum())
    slots = np.searchsorted(edges, np.minimum(lengths, edges[-1]), side="left")
    result = []
    for slot, width in enumerate(edges):
        rows = np.flatnonzero(slots == slot)
        if len(rows) == 0:
            continue
        width = int(width)
        inputs = np.zeros((len(rows), 2 * width + length), dtype=np.int32)
        inputs[:, :width] = pad_id
        inputs[:, 2 * width:] = IGNORE
        for i, row in enumerate(rows):
            source = ids[row][:width]
            inputs[i, :len(source)] = source
            inputs[i, width:width + len(source)] = 1
            target = targets[row]
            inputs[i, 2 * width:2 * width + len(target)] = target
        result.append(Bucket(width, inputs, np.zeros(len(rows), dtype=np.int64), rows))
    return EncodedSplit(name, result, len(ids), truncated)


def label_block(bucket: Bucket, target_length: int) -> np.ndarray:
    """A bucket's labels `[rows, target_length]` (-100 on padding)."""
    return bucket.inputs[:, 2 * bucket.length:2 * bucket.length + target_length]
