"""Sequence classification: a label per row; accuracy, f1, precision, recall.

Kernel side: texts (and text pairs) and labels read from each split and checked, labels mapped
to the model's class ids, texts tokenized into length buckets, the head sized for the labels,
and (with `lora=`) peft's SEQ_CLS settings with the memory plan they were checked with. Also
`predict`'s inputs, bucketed like evaluation rows. Nothing is forked or written there; every
refusal is a `FineTuneError` that says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching, data, preparation
from ..config import FineTuneConfig, FineTuneError
from ..flow import TrainerMetrics
from ..memory import meta_classifier
from ..preparation import Prepared, Splits, TaskContext
from ..worker.evaluate import chance_accuracy, compute_metrics, row_losses
from . import register_task
from .base import MaxLength, Task, classifier_metric_names

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData, EncodedSplit
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Prepared, Splits, TaskContext
    from ..worker.context import Batch, WorkerContext


# -- the kernel side: texts and labels, in length buckets --

#: peft's task type for a sequence classifier: the head is trained whole.
PEFT_TASK_TYPE = "SEQ_CLS"


@dataclass
class Texts:
    """The checked columns of every split (train first), before tokenizing."""

    texts: dict[str, list[str]]
    pairs: dict[str, list[str]]
    label_names: list[str]
    label_ids: dict[str, np.ndarray]
    notes: list[str] = field(default_factory=list)
    #: How the labels are given: "str" (class names) or "int" (class ids).
    label_kind: str = "int"


class ClassifyStream:
    """Rows of a stream as classification rows of one length (`batching.StreamedSplit`'s
    `encode`): texts (and pairs) tokenized, cut and padded to `length`; labels as the class ids
    the kernel chose from the first rows (a class name not among them, or an id out of
    range, is refused with the row it is in).

    Args:
        tokenizer: the tokenizer.
        columns: the text, text pair (or None) and label columns.
        label_names: the classes, by id.
        label_kind: "str" (labels are class names) or "int" (class ids).
        input_names, pads, side: the model inputs, their pad values, the padding side.
        length: the rows' length.
    """

    def __init__(self, tokenizer: Any, columns: tuple[str, str | None, str],
                 label_names: list[str], label_kind: str, input_names: list[str],
                 pads: dict[str, int], side: str, length: int) -> None:
        self.tokenizer, self.columns = tokenizer, columns
        self.ids = {name: i for i, name in enumerate(label_names)}
        self.label_kind, self.input_names = label_kind, input_names
        self.pads, self.side, self.length = pads, side, length
        self.seen = 0

    def reset(self) -> None:
        self.seen = 0

    def __call__(self, rows: list[dict]) -> batching.Bucket:
        text_column, pair_column, label_column = self.columns
        texts = [self._value(row, text_column, i, str) for i, row in enumerate(rows)]
        pairs = ([self._value(row, pair_column, i, str) for i, row in enumerate(rows)]
                 if pair_column else None)
        labels = np.fromiter((self._label(row.get(label_column), i)
                              for i, row in enumerate(rows)), np.int64, len(rows))
        self.seen += len(rows)
        encoded, cut = batching.tokenize(self.tokenizer, texts, pairs, self.length)
        split = batching.encode_split("train", encoded, labels, self.input_names,
                                      [self.length], self.pads, self.side, cut)
        return split.buckets[0]

    def _value(self, row: dict, column: str, i: int, kind: type) -> Any:
        value = row.get(column)
        if not isinstance(value, kind):
            raise data.DataError(
                f"row {self.seen + i} of the streamed training data: column {column!r} holds "
                f"{data.short(value)}, not text. Filter or convert such rows in the stream "
                f"first, e.g. stream.filter(lambda row: isinstance(row[{column!r}], str)).")
        return value

    def _label(self, value: Any, i: int) -> int:
        row = self.seen + i
        if self.label_kind == "str" and isinstance(value, str) and value in self.ids:
            return self.ids[value]
        if (self.label_kind == "int" and isinstance(value, (int, np.integer))
                and not isinstance(value, bool) and 0 <= int(value) < len(self.ids)):
            return int(value)
        raise data.DataError(
            f"row {row} of the streamed training data has the label {data.short(value)}, "
            f"which is not one of the {len(self.ids)} classes taken from the first rows "
            f"({', '.join(map(repr, list(self.ids)[:10]))}). Name every class in the stream "
            "up front: stream.cast_column(label_column, datasets.ClassLabel(names=[...])).")


def streamed_split(stream: Any, config: FineTuneConfig, columns: Texts,
                   input_names: list[str], pads: dict[str, int], side: str, length: int,
                   first: EncodedSplit, tokenizer: Any) -> batching.StreamedSplit:
    """The training split of a streamed dataset, read in the worker (`ClassifyStream`);
    `first`: its first rows as encoded here, which identify it for a resume."""
    encoder = ClassifyStream(
        tokenizer, (config.text_column, config.text_pair_column, config.label_column),
        columns.label_names, columns.label_kind, input_names, pads, side, length)
    columns.notes.append(
        f"the training data is streamed: read and tokenized in the worker as training "
        f"consumes it ({config.rows_per_step} rows of {length} tokens a step, in the "
        f"stream's order; longer rows are cut); its first {data.PEEK_ROWS} rows were checked "
        "before the start")
    return batching.StreamedSplit("train", stream, encoder, length,
                                  digest=preparation.digest(first))


def prepare(splits: Splits, config: FineTuneConfig, context: TaskContext) -> Prepared:
    """Texts and labels read and checked (`read_columns`), tokenized into length buckets,
    the head sized for the labels, LoRA and its memory plan with `lora=`."""
    stream = splits.train if data.is_stream(splits.train) else None
    if stream is not None:  # its first rows stand for it in every check below
        try:
            splits = Splits({**splits.named, "train": data.peek(stream)}, splits.eval_name)
        except data.DataError as error:
            raise FineTuneError(str(error)) from None
    columns = read_columns(splits, config, context, streamed=stream is not None)
    tokenizer = context.tokenizer
    cap = preparation.length_cap(config, context.model_config, tokenizer)
    encoded, truncated = {}, {}
    for split, texts in columns.texts.items():
        # Compact rows (`Ragged`): a corpus's token lists would be most of the kernel's peak.
        encoded[split], truncated[split] = batching.tokenize_compact(
            tokenizer, texts, columns.pairs.get(split), cap)
    if stream is None:
        preparation.check_batch_fits(config, len(columns.texts["train"]))
        buckets = batching.split_buckets(encoded, cap, config.max_length, config.rows_per_step)
    else:  # one length, so one training graph: rows read later that are longer are cut
        longest = max(int(batching.row_lengths(rows["input_ids"]).max(initial=1))
                      for rows in encoded.values())
        buckets = [config.max_length or min(cap, batching.round_up(longest))]
    pad_id = preparation.pad_id(tokenizer, columns.notes)
    input_names = batching.input_names_of(tokenizer, encoded["train"])
    pads, side = _pad_values(tokenizer, pad_id), _padding_side(tokenizer)
    encoded_splits = {
        split: batching.encode_split(split, encoded[split], columns.label_ids[split],
                                     input_names, buckets, pads, side, truncated[split])
        for split in encoded
    }
    if stream is not None:
        encoded_splits["train"] = streamed_split(
            stream, config, columns, input_names, pads, side, int(buckets[0]),
            encoded_splits["train"], tokenizer)
    eval_name = splits.eval_name
    encoded_data = batching.EncodedData(
        train=encoded_splits["train"],
        eval=encoded_splits[eval_name] if eval_name is not None else None,
        input_names=input_names, bucket_lengths=list(map(int, buckets)),
        label_names=list(columns.label_names), notes=columns.notes)
    lora_json, memory = None, None
    if config.lora not in (False, None):
        # The instance given, else the config's classifier built on the meta device (no
        # memory), so that the head peft trains whole is counted.
        labels = context.fixed_labels or len(columns.label_names)
        model = context.instance or meta_classifier(context.model_config, labels)
        lora_json, memory = preparation.lora_and_memory(
            config, model, context.model_config, PEFT_TASK_TYPE, int(buckets[-1]),
            context.devices, columns.notes)
    kwargs = head_kwargs(context.model_config, context.fixed_labels, columns.label_names,
                         pad_id)
    return Prepared(encoded_data, kwargs, lora=lora_json, memory=memory)


def read_columns(splits: Splits, config: FineTuneConfig, context: TaskContext,
                 streamed: bool = False) -> Texts:
    """Texts, pairs and labels of every split, checked; labels mapped to the model's ids.
    `streamed`: the training split is a stream's first rows (the classes they hold may not be
    all of them)."""
    try:
        texts, pairs, raw_labels, class_names = {}, {}, {}, {}
        for split, ds in splits.named.items():
            data.check_columns(ds, split, [config.text_column, config.text_pair_column,
                                           config.label_column])
            texts[split] = data.check_texts(data.column_values(ds, config.text_column),
                                            config.text_column, split)
            if config.text_pair_column:
                pairs[split] = data.check_texts(data.column_values(ds, config.text_pair_column),
                                                config.text_pair_column, split)
            raw_labels[split] = data.column_values(ds, config.label_column)
            class_names[split] = data.class_label_names(ds, config.label_column)
        model_names = data.meaningful_label_names(getattr(context.model_config, "id2label",
                                                          None))
        label_names, label_ids = data.map_labels(
            raw_labels, column=config.label_column, dataset_names=class_names,
            model_names=model_names, model_num_labels=context.fixed_labels)
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    if not streamed:
        check_classes(label_ids["train"], raw_labels["train"], label_names, config.label_column)
    elif len(label_names) < 2:
        raise FineTuneError(
            f"the first {len(raw_labels['train'])} rows of the streamed training data hold "
            f"one class ({label_names[0]!r}) and the model names no others, so the classes "
            "are not known up front. Name them in the stream: stream.cast_column("
            f"{config.label_column!r}, datasets.ClassLabel(names=[...])), or pass an "
            "eval_dataset that holds every class.")
    kind = "str" if isinstance(raw_labels["train"][0], str) else "int"
    return Texts(texts, pairs, list(label_names), label_ids, label_kind=kind)


def check_classes(ids: np.ndarray, raw: list, label_names: list[str], column: str) -> None:
    """Refuse training labels of a single class: a classifier learns nothing from them (its
    loss falls to 0 by always answering that class), whatever the batch size or the head.

    Args:
        ids: the training split's class ids.
        raw: its labels as given (the class named in the message).
        label_names: the class names, by id.
        column: the label column, for the message.
    """
    if len(np.unique(ids)) > 1:
        return
    value, name = raw[0], label_names[int(ids[0])]
    shown = repr(value) if name in (str(value), f"LABEL_{value}") else f"{value!r} ({name!r})"
    raise FineTuneError(
        f"the training labels (column {column!r}) hold only one class, {shown}, in all "
        f"{len(ids)} rows: classification needs at least two classes. Pass training data with "
        "rows of two classes or more (a filter or a split may have kept only one)."
    )


def head_kwargs(model_config: Any, fixed_labels: int | None, label_names: list[str],
                pad_id: int | None) -> dict[str, Any]:
    """`from_pretrained` arguments that size a head for these labels (a loaded instance
    keeps its own)."""
    if fixed_labels is not None:
        return {}
    kwargs: dict[str, Any] = {
        "num_labels": len(label_names),
        "id2label": dict(enumerate(label_names)),
        "label2id": {name: i for i, name in enumerate(label_names)},
    }
    if int(getattr(model_config, "num_labels", 0)) != len(label_names):
        kwargs["ignore_mismatched_sizes"] = True
    if getattr(model_config, "pad_token_id", None) is None and pad_id is not None:
        kwargs["pad_token_id"] = int(pad_id)
    return kwargs


def _pad_values(tokenizer: Any, pad_id: int | None) -> dict[str, int]:
    """What each input is padded with."""
    return {"input_ids": pad_id if pad_id is not None else 0,
            "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0) or 0}


def _padding_side(tokenizer: Any) -> str:
    return getattr(tokenizer, "padding_side", "right") or "right"


def prepare_predict(inputs: list[Any], context: PredictContext,
                    max_length: int | None) -> batching.EncodedData:
    """Texts, or (text, pair) tuples, tokenized and bucketed like evaluation rows."""
    texts, pairs = [], []
    for row, value in enumerate(inputs):
        if isinstance(value, str):
            texts.append(value)
        elif (isinstance(value, (list, tuple)) and len(value) == 2
              and all(isinstance(v, str) for v in value)):
            texts.append(value[0])
            pairs.append(value[1])
        else:
            raise FineTuneError(f"input {row} is a {type(value).__name__}; classification "
                                "predicts on texts or (text, text pair) tuples.")
    if pairs and len(pairs) != len(texts):
        raise FineTuneError("pass every input as a text, or every input as a (text, pair) "
                            "tuple, not both.")
    tokenizer = context.tokenizer
    cap = preparation.length_cap(MaxLength(max_length), context.model_config, tokenizer)
    encoded, cut = batching.tokenize(tokenizer, texts, pairs or None, cap)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    buckets = [max_length] if max_length else batching.choose_buckets(lengths, cap)
    notes: list[str] = []
    pad_id = preparation.pad_id(tokenizer, notes)
    input_names = batching.input_names_of(tokenizer, encoded)
    split = batching.encode_split("predict", encoded, np.zeros(len(texts), np.int64),
                                  input_names, buckets, _pad_values(tokenizer, pad_id),
                                  _padding_side(tokenizer), cut)
    config = context.model_config
    names = [str(config.id2label[i]) for i in sorted(config.id2label, key=int)]
    return batching.EncodedData(train=None, eval=split, input_names=input_names,
                                bucket_lengths=list(map(int, buckets)), label_names=names,
                                notes=notes)


# -- Classification: the task's hooks --

class Classification(Task):
    """Sequence classification: a label per row; accuracy, f1, precision, recall."""

    name = "classification"

    def eval_metric_names(self, config: FineTuneConfig) -> tuple[str, ...] | None:
        """Its loss and the metrics asked for by name (`base.classifier_metric_names`)."""
        return classifier_metric_names(config)

    pipeline_tag = "text-classification"
    eval_ahead = True
    takes_compute_metrics = True
    auto_class = "AutoModelForSequenceClassification"
    head_suffixes = ("ForSequenceClassification",)
    peft_task_type = PEFT_TASK_TYPE
    streams = True
    title = "classification"
    shows_labels = True

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        import torch

        logits = ctx.logits(batch)
        return torch.nn.functional.cross_entropy(logits, batch.tokens[:, -1].long())

    outputs_per_batch = 3

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        logits = ctx.logits(batch)
        losses = row_losses(logits, batch)
        return [logits.argmax(-1), losses, torch.softmax(logits, dim=-1)]

    def _by_row(self, split: Any, batches: list, fetched: list, index: int,
                dtype: Any) -> np.ndarray:
        """One of the eval outputs of every row of `split`, in the split's order."""
        values = None
        for (bucket_index, positions, real), outputs in self.per_batch(batches, fetched):
            array = outputs[index].float().numpy() if dtype is float else outputs[index].numpy()
            if values is None:
                values = np.empty((split.num_rows, *array.shape[1:]), dtype=array.dtype)
            values[split.buckets[bucket_index].rows[positions[:real]]] = array[:real]
        return values

    def chance_accuracy(self, split: EncodedSplit | None) -> float | None:
        """Always predicting `split`'s most frequent label (`evaluate.chance_accuracy`)."""
        return chance_accuracy(split)

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        split, plan = ctx.plan.data.eval, ctx.plan
        predictions = self._by_row(split, batches, fetched, 0, int).astype(np.int64)
        row_losses = self._by_row(split, batches, fetched, 1, float).astype(np.float64)
        labels = np.empty(split.num_rows, dtype=np.int64)
        for bucket in split.buckets:
            labels[bucket.rows] = bucket.labels
        values = {"eval_loss": float(row_losses.mean())}
        probabilities = (self._by_row(split, batches, fetched, 2, float)
                         if any(isinstance(m, TrainerMetrics) for m in plan.metrics) else None)
        values.update(compute_metrics(plan.metrics, predictions, labels,
                                      len(plan.data.label_names), probabilities))
        values["eval_rows"] = float(split.num_rows)
        return values

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each row's label, its probability, and every label's probability."""
        probabilities = self._by_row(data.eval, batches, fetched, 2, float)
        names = data.label_names
        return [{"label": names[int(p.argmax())], "score": float(p.max()),
                 "probabilities": {name: float(v) for name, v in zip(names, p, strict=True)}}
                for p in probabilities]

    # -- kernel side ---------------------------------------------------------------------------

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Texts and labels checked, tokenized into length buckets, the head sized for the
        labels; peft's SEQ_CLS settings and their memory plan with `lora=`."""
        return prepare(splits, config, context)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Texts, or (text, pair) tuples, tokenized and bucketed like evaluation rows."""
        return prepare_predict(inputs, context, max_length)



register_task(Classification())
