"""`fine_tune(task="multiple-choice")`: SWAG-style rows, a context and N endings, one right.

Kernel side: the context is `sent1` (with `sent2`, the start of every ending, as SWAG has it)
or `startphrase`; the endings are the columns `ending0`, `ending1`, ... (as many as the data
has, at least two); `label` is the index of the right ending. Each ending is tokenized as a
pair with its context (Hugging Face's recipe: `sent1`, then `sent2 + " " + ending`), and a
row's endings are padded together to one bucket length: a batch is `rows x choices x length`,
fixed, one graph per bucket. The inputs travel packed as `[rows, names x choices x length]`.

Worker side: `...ForMultipleChoice` scores each ending; the loss is the cross-entropy over a
row's endings; evaluation fetches every row's probabilities, and accuracy is computed on the
host (the same decoding as `predict`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching, data, preparation
from ..config import FineTuneError
from ..preparation import Prepared
from . import register_task
from .base import MaxLength, Task
from .token_classification import pad_values

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Splits, TaskContext
    from ..worker.context import Batch, WorkerContext

ENDING = re.compile(r"^ending(\d+)$")


@dataclass
class ChoiceRows:
    """What the host keeps: the endings of each row (for `predict`'s answer text)."""

    choices: int
    endings: list[list[str]]


def ending_columns(columns: list[str]) -> list[str]:
    """`ending0`, `ending1`, ... in order, as far as they go without a gap."""
    found = {int(m.group(1)) for c in columns if (m := ENDING.match(c))}
    out = []
    while len(out) in found:
        out.append(f"ending{len(out)}")
    return out


def _context_columns(columns: list[str]) -> tuple[str, str | None] | None:
    if "sent1" in columns:
        return "sent1", ("sent2" if "sent2" in columns else None)
    if "startphrase" in columns:
        return "startphrase", None
    return None


def read_rows(rows: Any, split: str, label_column: str | None,
              choices: int | None = None) -> tuple[list[str], list[list[str]], list[int] | None]:
    """Contexts, each row's endings (with `sent2` in front), and the labels of one split
    (a `Dataset` or a list of dicts), checked."""
    columns = list(rows.column_names) if hasattr(rows, "column_names") else list(
        dict.fromkeys(k for row in rows for k in row))
    endings = ending_columns(columns)
    context = _context_columns(columns)
    if context is None or len(endings) < 2 or (label_column and label_column not in columns):
        wanted = ["'sent1' (and 'sent2') or 'startphrase'", "'ending0', 'ending1', ..."]
        if label_column:
            wanted.append(repr(label_column))
        raise FineTuneError(
            f"the {split} data does not have the columns task='multiple-choice' needs: "
            f"{', '.join(wanted)} (SWAG's layout: a context, at least two endings, the index "
            f"of the right one); its columns are: {', '.join(map(repr, columns)) or '(none)'}. "
            "Rename yours with dataset.rename_column(old, new).")
    if choices is not None and len(endings) != choices:
        raise FineTuneError(
            f"the {split} data has {len(endings)} endings per row and the training data "
            f"{choices}; every split needs the same number.")

    def column(name: str) -> list:
        values = list(rows[name]) if hasattr(rows, "column_names") else [r.get(name)
                                                                           for r in rows]
        try:
            return data.check_texts(values, name, split) if name != label_column else values
        except data.DataError as error:
            raise FineTuneError(str(error)) from None

    first, second = context
    contexts = column(first)
    starts = column(second) if second else [""] * len(contexts)
    texts = list(zip(*(column(name) for name in endings), strict=True))
    joined = [[f"{start} {ending}".strip() for ending in row]
              for start, row in zip(starts, texts, strict=True)]
    labels = None
    if label_column:
        raw = column(label_column)
        bad = [i for i, v in enumerate(raw) if isinstance(v, bool) or not isinstance(
            v, (int, np.integer)) or not 0 <= int(v) < len(endings)]
        if bad:
            raise FineTuneError(
                f"{len(bad)} {split} label(s) in {label_column!r} are not the index of an "
                f"ending (0..{len(endings) - 1}); the first is row {bad[0]}: "
                f"{data.short(raw[bad[0]])}. Drop those rows (SWAG's test split has no labels, "
                "-1), e.g. dataset.filter(lambda r: r['label'] >= 0).")
        labels = [int(v) for v in raw]
    return contexts, joined, labels


def encode_choices(tokenizer: Any, contexts: list[str], endings: list[list[str]],
                   cap: int) -> tuple[dict[str, list], int]:
    """Every (context, ending) pair tokenized (at most `cap` tokens); per input name a list of
    rows, each a list of `choices` token lists; and how many rows were cut."""
    choices = len(endings[0]) if endings else 0
    flat_first = [c for c in contexts for _ in range(choices)]
    flat_second = [e for row in endings for e in row]
    encoded, cut = batching.tokenize(tokenizer, flat_first, flat_second, cap)
    grouped = {name: [values[i * choices:(i + 1) * choices] for i in range(len(contexts))]
               for name, values in encoded.items()}
    cut_rows = 0
    if cut:
        lengths = np.asarray([len(ids) for ids in encoded["input_ids"]]).reshape(-1, choices)
        cut_rows = int((lengths >= cap).any(axis=1).sum())
    return grouped, cut_rows


def pack(name: str, grouped: dict[str, list], labels: np.ndarray, input_names: list[str],
         buckets: list[int], pads: dict[str, int]) -> batching.EncodedSplit:
    """Rows padded to the smallest bucket that holds their longest ending: a bucket's inputs
    are `[rows, len(input_names) x choices x length]`, its labels `[rows]`."""
    ids = grouped["input_ids"]
    choices = len(ids[0])
    lengths = np.asarray([max(len(seq) for seq in row) for row in ids], np.int64)
    edges = np.asarray(sorted(buckets))
    slots = np.searchsorted(edges, np.minimum(lengths, edges[-1]), side="left")
    out = []
    for slot, length in enumerate(edges):
        rows = np.flatnonzero(slots == slot)
        if not len(rows):
            continue
        length = int(length)
        width = choices * length
        inputs = np.empty((len(rows), width * len(input_names)), np.int32)
        for k, input_name in enumerate(input_names):
            block = np.full((len(rows), choices, length), pads.get(input_name, 0), np.int32)
            for i, row in enumerate(rows):
                for c, values in enumerate(grouped[input_name][row]):
                    values = values[:length]
                    block[i, c, :len(values)] = values
            inputs[:, k * width:(k + 1) * width] = block.reshape(len(rows), width)
        out.append(batching.Bucket(length, inputs, labels[rows], rows))
    return batching.EncodedSplit(name, out, len(ids), int((lengths > edges[-1]).sum()))


def _as_swag_row(value: dict, row: int) -> dict:
    """One predict input as `sent1`, `sent2` and `ending0..`: from `{"context", "endings"}`,
    `startphrase` or `sent1` (+ `sent2`) rows."""
    if "context" in value and "endings" in value:
        endings = list(value["endings"])
        return {"sent1": value["context"], "sent2": "",
                **{f"ending{i}": e for i, e in enumerate(endings)}}
    first = value.get("sent1", value.get("startphrase"))
    if first is None:
        raise FineTuneError(
            f"input {row} has no context: pass 'sent1' (and 'sent2') or 'startphrase' with "
            f"'ending0', 'ending1', ..., or {{'context': ..., 'endings': [...]}}; it has "
            f"{', '.join(map(repr, value)) or 'nothing'}.")
    second = value.get("sent2", "") if "sent1" in value else ""
    endings = ending_columns(list(value))
    return {"sent1": first, "sent2": second, **{name: value[name] for name in endings}}


class MultipleChoice(Task):
    """A context and N endings, one right: cross-entropy over the endings; accuracy."""

    name = "multiple-choice"
    reported_metrics = ("loss", "accuracy")
    eval_ahead = True
    auto_class = "AutoModelForMultipleChoice"
    head_suffixes = ("ForMultipleChoice",)
    columns = ("ending0", "ending1")
    outputs_per_batch = 2
    title = "multiple choice"

    # -- kernel side -----------------------------------------------------------------------

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Each row's endings paired with its context and padded together to one bucket
        length (`pack`); the right ending's index is the label."""
        eval_name = splits.eval_name
        tokenizer = context.tokenizer
        cap = preparation.length_cap(config, context.model_config, tokenizer)
        grouped, labels, cut, endings, choices = {}, {}, {}, {}, None
        for split, ds in splits.named.items():
            contexts, endings[split], row_labels = read_rows(ds, split, config.label_column,
                                                             choices)
            choices = len(endings[split][0])
            grouped[split], cut[split] = encode_choices(tokenizer, contexts, endings[split],
                                                        cap)
            labels[split] = np.asarray(row_labels, np.int64)
        preparation.check_batch_fits(config, len(labels["train"]))
        if config.max_length is not None:
            buckets = [int(config.max_length)]
        else:
            longest = {split: [max(map(len, row)) for row in g["input_ids"]]
                       for split, g in grouped.items()}
            buckets = batching.choose_buckets(longest["train"], cap,
                                              min_rows=4 * config.rows_per_step)
            top = min(cap, batching.round_up(max(max(v) for v in longest.values())))
            buckets[-1] = max(buckets[-1], top)
        notes: list[str] = []
        pads = pad_values(tokenizer, notes)
        input_names = batching.input_names_of(tokenizer, {k: v for k, v in
                                                          grouped["train"].items()})
        out = {split: pack(split, grouped[split], labels[split], input_names, buckets, pads)
               for split in splits.named}
        for split in splits.named:
            out[split].truncated = max(out[split].truncated, cut[split])
        encoded = batching.EncodedData(
            train=out["train"], eval=out.get(eval_name) if eval_name is not None else None,
            input_names=input_names, bucket_lengths=list(map(int, buckets)),
            label_names=[str(i) for i in range(choices)], notes=notes,
            host=ChoiceRows(choices, endings.get(eval_name, []) if eval_name is not None
                            else []))
        kwargs = {}
        if getattr(context.model_config, "pad_token_id", None) is None:
            kwargs["pad_token_id"] = int(pads["input_ids"])
        return Prepared(encoded, kwargs)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Rows as the training data has them (`sent1`/`sent2` or `startphrase`, `ending0`,
        ...; a `label` is ignored), or `{"context": ..., "endings": [...]}` dicts."""
        rows = []
        for row, value in enumerate(inputs):
            if not isinstance(value, dict):
                raise FineTuneError(
                    f"input {row} is a {type(value).__name__}; multiple-choice predicts on "
                    "dicts: {'sent1': ..., 'sent2': ..., 'ending0': ..., 'ending1': ...} or "
                    "{'context': ..., 'endings': [...]}.")
            rows.append(_as_swag_row(value, row))
        counts = {len(ending_columns(list(r))) for r in rows}
        if len(counts) > 1:
            raise FineTuneError(f"the inputs have different numbers of endings ({sorted(counts)})"
                                "; predict takes one number at a time.")
        contexts, endings, _ = read_rows(rows, "predict", None)
        tokenizer = context.tokenizer
        cap = preparation.length_cap(MaxLength(max_length), context.model_config, tokenizer)
        grouped, cut = encode_choices(tokenizer, contexts, endings, cap)
        longest = [max(map(len, row)) for row in grouped["input_ids"]]
        buckets = [int(max_length)] if max_length else batching.choose_buckets(longest, cap)
        notes: list[str] = []
        input_names = batching.input_names_of(tokenizer, grouped)
        split = pack("predict", grouped, np.zeros(len(rows), np.int64), input_names, buckets,
                     pad_values(tokenizer, notes))
        split.truncated = max(split.truncated, cut)
        choices = len(endings[0])
        return batching.EncodedData(
            train=None, eval=split, input_names=input_names,
            bucket_lengths=list(map(int, buckets)),
            label_names=[str(i) for i in range(choices)], notes=notes,
            host=ChoiceRows(choices, endings))

    # -- worker side -----------------------------------------------------------------------

    def _logits(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        choices = len(ctx.plan.data.label_names)
        length = batch.length
        width = choices * length
        inputs = {name: batch.tokens[:, k * width:(k + 1) * width].reshape(-1, choices, length)
                  for k, name in enumerate(ctx.plan.data.input_names)}
        with ctx.autocast():
            return ctx.model(**inputs).logits.float()  # [rows, choices]

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        import torch

        logits = self._logits(ctx, batch)
        return torch.nn.functional.cross_entropy(logits, batch.tokens[:, -1].long())

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        logits = self._logits(ctx, batch)
        weights = batch.weights.float()
        labels = batch.tokens[:, -2].long()
        losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
        losses = torch.where(weights > 0, losses, torch.zeros_like(losses))
        return [torch.softmax(logits, dim=-1), losses]

    def _probabilities(self, split: Any, batches: list, fetched: list) -> np.ndarray:
        out = None
        for (bucket_index, positions, real), (probabilities, _) in self.per_batch(batches,
                                                                                  fetched):
            array = probabilities.float().numpy()
            if out is None:
                out = np.empty((split.num_rows, array.shape[1]), np.float32)
            out[split.buckets[bucket_index].rows[positions[:real]]] = array[:real]
        return out

    def decode(self, data_: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each row's chosen ending: its index, text, probability, and every ending's."""
        probabilities = self._probabilities(data_.eval, batches, fetched)
        endings = data_.host.endings
        return [{"label": int(p.argmax()), "ending": endings[row][int(p.argmax())]
                 if endings else None, "score": float(p.max()),
                 "probabilities": [float(v) for v in p]}
                for row, p in enumerate(probabilities)]

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        split = ctx.plan.data.eval
        labels = np.empty(split.num_rows, np.int64)
        for bucket in split.buckets:
            labels[bucket.rows] = bucket.labels
        chosen = np.asarray([item["label"] for item in self.decode(ctx.plan.data, batches,
                                                                   fetched)])
        total = sum(float(losses.double().numpy()[:real].sum())
                    for (_, _, real), (_, losses) in self.per_batch(batches, fetched))
        return {"eval_loss": total / max(split.num_rows, 1),
                "eval_accuracy": float((chosen == labels).mean()),
                "eval_rows": float(split.num_rows)}


register_task(MultipleChoice())
