"""Fixed shapes for XLA: rows tokenized into a few bucket lengths, and the batches built from them.

XLA compiles one graph per input shape, so:
- every row is padded to one of a few *bucket* lengths (one length when `max_length` is
  given), so training compiles one set of graphs per bucket whatever the text lengths;
- a training step takes `batch_size x gradient_accumulation_steps` rows of one bucket; the
  ragged remainder of each bucket is dropped (a different remainder every epoch);
- evaluation batches keep every row: the last batch of a bucket is filled up with copies of a
  real row whose weight is 0, so evaluation never recompiles and metrics are exact.

A batch is a set of named arrays (`HostBatch`): the token ids, labels and weights packed side
by side in one int32 array, and any further per-row arrays of any dtype (pixel values, audio
features: `Bucket.fields`) packed into one buffer per dtype. The worker uploads them all in
one call per step (`worker.context.Batch`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .data import DataError

#: Bucket lengths are multiples of this (TPU tiles like multiples of 8).
LENGTH_MULTIPLE = 8
#: Below this length one bucket is always used: compiling costs more than padding.
SINGLE_BUCKET_BELOW = 64
MAX_BUCKETS = 3
#: A further bucket must save at least this share of the padded tokens.
MIN_BUCKET_SAVING = 0.2


def round_up(value: float, multiple: int = LENGTH_MULTIPLE) -> int:
    return int(math.ceil(value / multiple) * multiple)


def padded_tokens(lengths: np.ndarray, buckets: Sequence[int]) -> int:
    """Tokens computed when each row is padded to the smallest bucket that holds it."""
    edges = np.asarray(sorted(buckets))
    slots = np.searchsorted(edges, np.minimum(lengths, edges[-1]), side="left")
    return int(edges[slots].sum())


def choose_buckets(
    lengths: Sequence[int],
    cap: int,
    *,
    min_rows: int = 1,
    max_buckets: int = MAX_BUCKETS,
) -> list[int]:
    """A few padded lengths for rows of these lengths, trading padding against compiles.

    One bucket (the longest row, rounded up to a multiple of 8, at most `cap`) unless rows
    are long and varied: each further bucket costs one more set of compiled graphs, so it is
    added only when it saves at least `MIN_BUCKET_SAVING` of the padded tokens and holds at
    least `min_rows` rows.
    """
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), cap)
    top = min(cap, round_up(int(lengths.max()), LENGTH_MULTIPLE))
    buckets = [top]
    if top <= SINGLE_BUCKET_BELOW or max_buckets <= 1:
        return buckets
    candidates = {
        min(cap, max(round_up(float(np.quantile(lengths, q)), 16), 16))
        for q in (0.25, 0.5, 0.75, 0.9)
    } - {top}
    cost = padded_tokens(lengths, buckets)
    while len(buckets) < max_buckets:
        best = None
        for candidate in sorted(candidates - set(buckets)):
            trial = sorted(buckets + [candidate])
            edges = np.asarray(trial)
            counts = np.bincount(np.searchsorted(edges, lengths, side="left"), minlength=len(trial))
            if counts.min() < min_rows:
                continue
            trial_cost = padded_tokens(lengths, trial)
            saves_enough = trial_cost <= cost * (1 - MIN_BUCKET_SAVING)
            if saves_enough and (best is None or trial_cost < best[0]):
                best = (trial_cost, trial)
        if best is None:
            break
        cost, buckets = best
    return sorted(buckets)


@dataclass
class Bucket:
    """Rows of one split padded to one length.

    Attributes:
        length: the padded length.
        inputs: `[rows, length * len(input_names)]` int32, the model inputs side by side.
        labels: `[rows]` int64 class ids, or `[rows, k]` (a label per token, a span's start
            and end): packed after the inputs, `k` columns.
        rows: `[rows]` positions of these rows in the split (to restore the order).
        fields: further per-row arrays by name, each `[rows, ...]` of any dtype (a model
            input when its name is in `EncodedData.input_names`, such as `pixel_values`).
    """

    length: int
    inputs: np.ndarray
    labels: np.ndarray
    rows: np.ndarray
    fields: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class EncodedSplit:
    """One split, tokenized and bucketed."""

    name: str
    buckets: list[Bucket]
    num_rows: int
    truncated: int = 0


#: Rows of a stream read and encoded at a time (one tokenizer call).
STREAM_CHUNK_ROWS = 256


class StreamedSplit:
    """A training split that is read and encoded as training consumes it: rows of a streamed
    dataset (`datasets.IterableDataset`), in the stream's order, turned by `encode` into rows
    of one length. Nothing is read before the worker asks for a step (the kernel holds the
    stream, not its rows); a stream that ends starts again (its next epoch, as Trainer
    does), so `max_steps` decides how long training runs.

    Args:
        name: the split's name ("train").
        source: the stream (anything with `iter()`; `set_epoch` is called when it has one).
        encode: rows (a list of dicts) -> a `Bucket` of any number of rows of `length`; may
            keep state between calls (packing carries the tokens that did not fill a row).
            `encode.reset()`, when it has one, is called when the stream starts again.
        length: the one row length (the training graph's).
        digest: what identifies the data for a resume (the first rows' encoding).
    """

    streamed = True

    def __init__(self, name: str, source: Any, encode: Callable[[list], Bucket], length: int,
                 digest: str = "") -> None:
        self.name = name
        self.source = source
        self.encode = encode
        self.length = int(length)
        self.digest = digest
        self.num_rows = 0  # not known: a stream is not counted
        self.truncated = 0
        self._rows: Any = None
        self._pending: list[Bucket] = []
        self._next_step = 0
        self._epoch = 0

    @property
    def buckets(self) -> list[Bucket]:
        """None: the rows come from `step_rows`."""
        return []

    def step_rows(self, step: int, rows: int) -> Bucket:
        """Step `step`'s `rows` rows, read on from the stream. A step before the next one
        (a resumed run's first, or a repeat) reads the stream again from its start and skips
        the rows of the steps before it, so step `k` always gets the same rows."""
        if step < self._next_step or self._rows is None:
            self._restart(0)
        while self._next_step < step:
            self._take(rows)
            self._next_step += 1
        bucket = self._take(rows)
        self._next_step += 1
        return bucket

    def _restart(self, epoch: int) -> None:
        self._epoch = epoch
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(epoch)  # a shuffled stream's next order
        if epoch == 0 and hasattr(self.encode, "reset"):
            self.encode.reset()
        self._rows = iter(self.source)
        if epoch == 0:  # from the start; a next epoch goes on from the rows still held
            self._pending = []
            self._next_step = 0

    def _take(self, count: int) -> Bucket:
        """The next `count` encoded rows, reading (and encoding) chunks as needed."""
        held = sum(len(bucket) for bucket in self._pending)
        restarted = False
        while held < count:
            chunk = [row for _, row in zip(range(STREAM_CHUNK_ROWS), self._rows, strict=False)]
            if not chunk:
                if restarted:
                    raise DataError(
                        f"the streamed {self.name} data gives no row of {self.length} tokens: "
                        "pass more text, or a smaller max_length.")
                restarted = True
                self._restart(self._epoch + 1)
                continue
            bucket = self.encode(chunk)
            if len(bucket):
                restarted = False
                self._pending.append(bucket)
                held += len(bucket)
        first = self._pending[0]
        if len(first) >= count and len(self._pending) == 1:
            whole = first
        else:
            whole = Bucket(first.length,
                           np.concatenate([b.inputs for b in self._pending]),
                           np.concatenate([b.labels for b in self._pending]),
                           np.arange(held),
                           {name: np.concatenate([b.fields[name] for b in self._pending])
                            for name in first.fields})
        taken = Bucket(whole.length, whole.inputs[:count], whole.labels[:count],
                       np.arange(count), {k: v[:count] for k, v in whole.fields.items()})
        rest = Bucket(whole.length, whole.inputs[count:], whole.labels[count:],
                      np.arange(held - count), {k: v[count:] for k, v in whole.fields.items()})
        self._pending = [rest] if len(rest) else []
        return taken


@dataclass
class EncodedData:
    """Everything the worker needs to build batches; plain NumPy, cheap to fork."""

    train: EncodedSplit
    eval: EncodedSplit | None
    input_names: list[str]
    bucket_lengths: list[int]
    label_names: list[str]
    notes: list[str] = field(default_factory=list)
    #: What a task keeps on the host for decoding (word ids, offsets, answers); any picklable.
    host: Any = None
    #: False: this data's evaluation syncs itself (it generates), so it is not compiled ahead
    #: even where the task's `eval_ahead` says so (a task whose models differ: Whisper).
    eval_ahead: bool = True


def split_buckets(encoded: dict[str, dict], cap: int, max_length: int | None,
                  rows_per_step: int) -> list[int]:
    """The length buckets of a fine-tune whose splits are tokenized (`{split: {"input_ids":
    rows}}`): `[max_length]` when given; else `choose_buckets` of the training rows (each
    bucket holding at least 4 steps' rows), the last widened to the longest row of any split
    (evaluation rows longer than every training row), at most `cap`."""
    if max_length is not None:
        return [int(max_length)]
    train = row_lengths(encoded["train"]["input_ids"])
    buckets = choose_buckets(train, cap, min_rows=4 * rows_per_step)
    longest = max(int(row_lengths(rows["input_ids"]).max(initial=0))
                  for rows in encoded.values())
    buckets[-1] = max(buckets[-1], min(cap, round_up(longest)))
    return buckets


def tokenize(tokenizer, texts: list[str], pairs: list[str] | None, cap: int) -> tuple[dict, int]:
    """Tokenize without padding, truncating to `cap` tokens.

    Returns:
        `(encoded, truncated)`: the tokenizer's output as lists, and how many rows were cut.
    """

    def run(rows_texts, rows_pairs, limit):
        return dict(tokenizer(rows_texts, rows_pairs, truncation=True, max_length=limit,
                              padding=False, return_attention_mask=True))

    # One token of headroom shows which rows are too long; only those are tokenized again.
    encoded = run(texts, pairs, cap + 1)
    long = [i for i, ids in enumerate(encoded["input_ids"]) if len(ids) > cap]
    if long:
        again = run([texts[i] for i in long], [pairs[i] for i in long] if pairs else None, cap)
        for key, values in again.items():
            for i, value in zip(long, values, strict=True):
                encoded[key][i] = value
    return encoded, len(long)


class Ragged:
    """Rows of token ids of different lengths, kept as one flat int32 array and the rows'
    offsets into it: 4 bytes a token, where a list of Python lists holds a list slot and
    (above 256) an int object for each (about 9 times more in a fine-tune of 200k rows).

    Reads like a list of rows: `len(ragged)`, `ragged[i]` (an int32 view), iteration.

    Attributes:
        values: every row's ids, one after the other.
        offsets: `[rows + 1]` int64, row `i` is `values[offsets[i]:offsets[i + 1]]`.
    """

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        self.values = values
        self.offsets = offsets

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]]) -> Ragged:
        """The rows of a list of lists (a tokenizer's output)."""
        lengths = np.fromiter((len(row) for row in rows), np.int64, len(rows))
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((v for row in rows for v in row), np.int32, int(offsets[-1]))
        return cls(values, offsets)

    @classmethod
    def joined(cls, parts: Sequence[Ragged]) -> Ragged:
        """The rows of every part, in order."""
        values = np.concatenate([part.values for part in parts]) if parts else np.zeros(
            0, np.int32)
        starts = np.cumsum([0] + [len(part.values) for part in parts[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [
            part.offsets[1:] + start for part, start in zip(parts, starts, strict=True)])
        return cls(values, offsets)

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> np.ndarray:
        if not -len(self) <= row < len(self):
            raise IndexError(row)
        row %= len(self)
        return self.values[self.offsets[row]:self.offsets[row + 1]]

    def __iter__(self):
        for row in range(len(self)):
            yield self[row]


#: Rows tokenized at a time by `tokenize_compact`: their Python lists are the only ones alive.
TOKENIZE_CHUNK = 4096


def tokenize_compact(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, cap: int,
                     chunk: int = TOKENIZE_CHUNK) -> tuple[dict[str, Ragged], int]:
    """`tokenize`, `chunk` rows at a time, each chunk's lists turned into `Ragged` rows at
    once: the kernel never holds every row as Python lists (a fine-tune's peak memory).

    Returns:
        `(encoded, truncated)`: each of the tokenizer's outputs as `Ragged` rows, and how
        many rows were cut.
    """
    parts: dict[str, list[Ragged]] = {}
    truncated = 0
    for start in range(0, len(texts), chunk):
        stop = start + chunk
        encoded, cut = tokenize(tokenizer, list(texts[start:stop]),
                                list(pairs[start:stop]) if pairs else None, cap)
        truncated += cut
        for key, rows in encoded.items():
            parts.setdefault(key, []).append(Ragged.of(rows))
    return {key: Ragged.joined(values) for key, values in parts.items()}, truncated


def row_lengths(column) -> np.ndarray:
    """The length of each row of a tokenized column (lists or `Ragged`)."""
    if isinstance(column, Ragged):
        return column.lengths()
    return np.fromiter((len(row) for row in column), np.int64, len(column))


def input_names_of(tokenizer, encoded) -> list[str]:
    """The model inputs this tokenizer produces, `input_ids` first."""
    wanted = list(getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"])
    names = [name for name in wanted if name in encoded]
    if "input_ids" not in names:
        raise DataError("the tokenizer does not produce input_ids; pass a text tokenizer.")
    if "attention_mask" not in names and "attention_mask" in encoded:
        names.append("attention_mask")
    return ["input_ids"] + [name for name in names if name != "input_ids"]


def encode_split(
    name: str,
    encoded,
    labels: np.ndarray,
    input_names: list[str],
    buckets: Sequence[int],
    pad_values: Mapping[str, int],
    padding_side: str = "right",
    truncated: int = 0,
) -> EncodedSplit:
    """Pad tokenized rows into buckets (each row to the smallest bucket that holds it).

    `truncated` counts rows the tokenizer already cut; rows longer than the largest bucket are
    cut here (keeping their first tokens) and counted too.
    """
    ids = encoded["input_ids"]
    lengths = row_lengths(ids)
    edges = np.asarray(sorted(buckets))
    truncated = int(truncated) + int((lengths > edges[-1]).sum())
    slots = np.searchsorted(edges, np.minimum(lengths, edges[-1]), side="left")
    result = []
    for slot, length in enumerate(edges):
        rows = np.flatnonzero(slots == slot)
        if len(rows) == 0:
            continue
        length = int(length)
        inputs = np.empty((len(rows), length * len(input_names)), dtype=np.int32)
        for k, input_name in enumerate(input_names):
            block = np.full((len(rows), length), pad_values.get(input_name, 0), dtype=np.int32)
            column = encoded[input_name]
            if isinstance(column, Ragged):
                _fill(block, column, rows, padding_side)
                inputs[:, k * length:(k + 1) * length] = block
                continue
            for i, row in enumerate(rows):
                values = column[row][:length]
                if padding_side == "left":
                    block[i, length - len(values):] = values
                else:
                    block[i, : len(values)] = values
            inputs[:, k * length:(k + 1) * length] = block
        result.append(Bucket(length, inputs, labels[rows], rows))
    return EncodedSplit(name, result, len(ids), truncated)


#: Rows padded at a time by `_fill`: its index arrays are 8 bytes a padded token.
FILL_CHUNK = 16384


def _fill(block: np.ndarray, column: Ragged, rows: np.ndarray, padding_side: str) -> None:
    """`block[i]` = row `rows[i]` of `column`, cut to the block's width, padded on
    `padding_side` (the pad values already in `block`); vectorized, a chunk of rows at a
    time."""
    width = block.shape[1]
    columns = np.arange(width)
    for start in range(0, len(rows), FILL_CHUNK):
        chosen = rows[start:start + FILL_CHUNK]
        begins = column.offsets[chosen]
        lengths = np.minimum(column.offsets[chosen + 1] - begins, width)
        if padding_side == "left":
            shift = width - lengths
            mask = columns[None, :] >= shift[:, None]
            source = begins[:, None] + columns[None, :] - shift[:, None]
        else:
            mask = columns[None, :] < lengths[:, None]
            source = begins[:, None] + columns[None, :]
        target = block[start:start + len(chosen)]
        target[mask] = column.values[source[mask]]


# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------


def steps_per_epoch(split: EncodedSplit, rows_per_step: int) -> int:
    """Optimizer steps in one epoch: full steps of each bucket (the ragged rest is dropped)."""
    return sum(len(bucket) // rows_per_step for bucket in split.buckets)


def epoch_schedule(
    split: EncodedSplit, rows_per_step: int, seed: int, epoch: int
) -> list[tuple[int, np.ndarray]]:
    """The steps of one epoch as `(bucket index, positions in that bucket)`, shuffled.

    A pure function of `(seed, epoch)`, so a resumed run sees the same batches in the same
    order as an uninterrupted one.
    """
    rng = np.random.default_rng([seed, epoch])
    steps = []
    for index, bucket in enumerate(split.buckets):
        order = rng.permutation(len(bucket))
        for k in range(len(bucket) // rows_per_step):
            steps.append((index, order[k * rows_per_step:(k + 1) * rows_per_step]))
    return [steps[i] for i in rng.permutation(len(steps))]


@dataclass(frozen=True)
class FieldSlot:
    """Where a named field lies: columns `start:stop` of uploaded array `buffer` (1 is the
    first buffer after the int32 tokens), each row of shape `shape`."""

    name: str
    buffer: int
    start: int
    stop: int
    shape: tuple[int, ...]


@dataclass
class HostBatch:
    """One batch on the host, as it is uploaded.

    Attributes:
        length: the bucket's padded length.
        tokens: `[..., rows, columns]` int32: inputs side by side, label columns, and (in
            evaluation) a weight column.
        buffers: `[..., rows, columns]` one array per dtype of the bucket's fields.
        slots: where each field lies in `buffers`.
    """

    length: int
    tokens: np.ndarray
    buffers: list[np.ndarray] = field(default_factory=list)
    slots: list[FieldSlot] = field(default_factory=list)


def host_batch(length: int, tokens: np.ndarray, fields: Mapping[str, np.ndarray],
               lead: tuple[int, ...]) -> HostBatch:
    """Packs `fields` (each `[rows, ...]`) into one buffer per dtype, beside `tokens`, every
    array shaped `[*lead, -1, columns]`."""
    groups: dict[np.dtype, list[np.ndarray]] = {}
    slots = []
    for name, values in fields.items():
        values = np.asarray(values)
        flat = values.reshape(len(values), -1)
        group = groups.setdefault(flat.dtype, [])
        start = sum(block.shape[1] for block in group)
        group.append(flat)
        slots.append(FieldSlot(name, list(groups).index(flat.dtype) + 1, start,
                               start + flat.shape[1], values.shape[1:]))
    buffers = [np.concatenate(group, axis=1) for group in groups.values()]
    return HostBatch(length, tokens.reshape(*lead, -1, tokens.shape[-1]),
                     [b.reshape(*lead, -1, b.shape[-1]) for b in buffers], slots)


def train_batch(bucket: Bucket, positions: np.ndarray, micro_batches: int,
                transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
                ) -> HostBatch:
    """Step's batch: tokens `[micro_batches, batch, width + k]` int32 (inputs side by side,
    then the `k` label columns), the bucket's fields likewise `[micro_batches, batch, ...]`;
    one micro-batch drops the leading axis. `transform` (augmentation) changes the picked
    rows' fields, not their shapes."""
    packed = np.concatenate(
        [bucket.inputs[positions], _label_columns(bucket, positions)], axis=1
    )
    lead = (micro_batches,) if micro_batches > 1 else ()
    fields = {name: values[positions] for name, values in bucket.fields.items()}
    if transform is not None:
        fields = transform(fields)
    return host_batch(bucket.length, packed, fields, lead)


def eval_batches(split: EncodedSplit, batch_size: int) -> list[tuple[int, np.ndarray, int]]:
    """Evaluation batches `(bucket index, positions, real rows)`, every row exactly once.

    The last batch of a bucket is filled up to `batch_size` with the bucket's first row; the
    filler rows get weight 0 (see `eval_batch`), so the shapes stay fixed and nothing is lost.
    """
    batches = []
    for index, bucket in enumerate(split.buckets):
        for start in range(0, len(bucket), batch_size):
            positions = np.arange(start, min(start + batch_size, len(bucket)))
            real = len(positions)
            if real < batch_size:
                positions = np.concatenate([positions, np.zeros(batch_size - real, np.int64)])
            batches.append((index, positions, real))
    return batches


def eval_batch_count(split: EncodedSplit, batch_size: int) -> int:
    """How many batches `eval_batches` makes, without making them (one per started
    `batch_size` rows of each bucket)."""
    return sum(-(-len(bucket) // batch_size) for bucket in split.buckets)


def eval_batch(bucket: Bucket, positions: np.ndarray, real: int) -> HostBatch:
    """Tokens `[batch, width + k + 1]` int32: inputs, labels, weight (1 for real rows, 0
    for filler); the bucket's fields `[batch, ...]`."""
    weights = (np.arange(len(positions)) < real).astype(np.int32)
    packed = np.concatenate(
        [
            bucket.inputs[positions],
            _label_columns(bucket, positions),
            weights[:, None],
        ],
        axis=1,
    )
    fields = {name: values[positions] for name, values in bucket.fields.items()}
    return host_batch(bucket.length, packed, fields, ())


def _label_columns(bucket: Bucket, positions: np.ndarray) -> np.ndarray:
    labels = bucket.labels[positions]
    return labels.reshape(len(positions), -1).astype(np.int32)
