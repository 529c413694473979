"""`fine_tune(task="token-classification")`: a tag per word (NER, POS), conll2003-shaped data.

Kernel side (for training and `predict`): words (`tokens`, a list of strings per row) and
their tags (`ner_tags`, a `ClassLabel` sequence as `load_dataset("conll2003")` gives, or lists
of strings) are checked, tokenized as pre-split words, and each word's tag is put on its first
sub-token (-100, which the loss skips, on the other sub-tokens and on special tokens and
padding). Rows are padded into length buckets like classification's, the labels a
`length`-wide block of the batch.

Worker side: cross-entropy over labelled tokens; evaluation fetches the predicted tag of every
token and decodes, on the host, the tag of each word from its first sub-token. Metrics are
entity-level precision, recall and F1 by seqeval's rules (the `seqeval` package, its default
conlleval mode), per entity type too, and the token accuracy over words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching, data, preparation
from ..config import FineTuneConfig, FineTuneError
from ..preparation import Prepared, Splits, TaskContext
from . import register_task
from .base import MaxLength, Task
from .classification import head_kwargs

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Prepared, Splits, TaskContext
    from ..worker.context import Batch, WorkerContext


# -- the kernel side: words and their tags --

IGNORE = -100
WORDS_COLUMN = "tokens"
TAGS_COLUMN = "ner_tags"
#: How `predict` splits a plain text into words: runs of word characters, or one symbol.
WORD_PATTERN = re.compile(r"\w+|[^\w\s]")


@dataclass
class WordRows:
    """What the host keeps per row of a split to decode tags back to words."""

    words: list[list[str]]
    first_tokens: list[np.ndarray]  # per row: the position of each kept word's first sub-token
    tags: list[list[str]] | None  # the reference tags (evaluation), None for predict
    spans: list[list[tuple[int, int]]] | None = None  # predict: each word's characters
    texts: list[str] | None = None  # predict: the texts as given


def _columns(config: Any) -> tuple[str, str]:
    """The words and tags columns: the config's, or conll2003's names when left at default."""
    words = config.text_column if config.text_column != "text" else WORDS_COLUMN
    tags = config.label_column if config.label_column != "label" else TAGS_COLUMN
    return words, tags


def _check_columns(ds: Any, split: str, words: str, tags: str) -> None:
    present = list(ds.column_names)
    missing = [c for c in (words, tags) if c not in present]
    if missing:
        raise FineTuneError(
            f"the {split} data has no column {' and no '.join(map(repr, missing))}; its columns "
            f"are: {', '.join(map(repr, present)) or '(none)'}. task='token-classification' "
            f"needs a column of word lists ({words!r}) and one of tag lists ({tags!r}), one tag "
            "per word: pass text_column=... (the words) and label_column=... (the tags) with "
            "the names of yours."
        )


def tag_names_of(ds: Any, column: str) -> list[str] | None:
    """The names of a `Sequence(ClassLabel)` column (conll2003's `ner_tags`), else None."""
    feature = ds.features.get(column) if hasattr(ds, "features") else None
    inner = getattr(feature, "feature", None)
    if inner is None and isinstance(feature, list) and feature:
        inner = feature[0]
    names = getattr(inner, "names", None)
    return list(names) if names else None


def _check_rows(words: list, tags: list, split: str, words_column: str,
                tags_column: str) -> None:
    """Every row: a list of strings, and as many tags as words; say how many do not."""
    for row, value in enumerate(words):
        if isinstance(value, str):
            raise FineTuneError(
                f"row {row} of {words_column!r} ({split}) is a string ({value[:40]!r}), not a "
                "list of words: split it first, e.g. dataset.map(lambda r: {"
                f"{words_column!r}: r[{words_column!r}].split()}})."
            )
        if not isinstance(value, (list, tuple)) or not all(isinstance(w, str) for w in value):
            raise FineTuneError(
                f"row {row} of {words_column!r} ({split}) must be a list of words (strings); "
                f"it is {data.short(value)}."
            )
    bad = [row for row, (w, t) in enumerate(zip(words, tags, strict=True))
           if not isinstance(t, (list, tuple)) or len(t) != len(w)]
    if bad:
        row = bad[0]
        got = (f"{len(tags[row])} tags" if isinstance(tags[row], (list, tuple))
               else f"a {type(tags[row]).__name__}")
        raise FineTuneError(
            f"{len(bad)} {split} row(s) have tags that do not match their words (one tag per "
            f"word in {tags_column!r}); the first is row {row}: {len(words[row])} words, {got}. "
            "Fix or drop those rows, e.g. dataset.filter(lambda r: len(r[tags]) == "
            "len(r[words]))."
        )


def _tag_ids(raw: dict[str, list], names_from_data: list[str] | None,
             model_names: list[str] | None, column: str) -> tuple[list[str], dict[str, list]]:
    """Tag names and every row's tags as ids."""
    values = [tag for rows in raw.values() for row in rows for tag in row]
    kinds = {data.value_kind(v) for v in values}
    if kinds - {"int", "str"} or len(kinds) > 1:
        raise FineTuneError(
            f"tags in {column!r} must be all tag names (str) or all tag ids (int); found "
            f"{', '.join(sorted(kinds))}."
        )
    if kinds == {"str"}:
        present = set(values)
        if model_names and present <= set(model_names):
            names = list(model_names)
        else:
            names = sorted(present, key=lambda t: (t != "O", t[2:], t))  # "O" first, B- before I-
        index = {name: i for i, name in enumerate(names)}
        return names, {split: [[index[t] for t in row] for row in rows]
                       for split, rows in raw.items()}
    names = names_from_data or model_names
    highest = max(values, default=0)
    if names is None:
        names = [f"LABEL_{i}" for i in range(highest + 1)]
    if highest >= len(names) or min(values, default=0) < 0:
        raise FineTuneError(
            f"tag id {highest if highest >= len(names) else min(values)} in {column!r} is out "
            f"of range: the tags are {len(names)} ({', '.join(names[:6])}...)."
        )
    return list(names), {split: [list(map(int, row)) for row in rows]
                         for split, rows in raw.items()}


def _first_tokens(word_ids: list[int | None]) -> np.ndarray:
    """Positions of each word's first sub-token, in word order."""
    first, previous = [], None
    for position, word in enumerate(word_ids):
        if word is not None and word != previous:
            first.append(position)
        previous = word
    return np.asarray(first, dtype=np.int64)


def encode_words(tokenizer: Any, words: list[list[str]], tag_ids: list[list[int]] | None,
                 cap: int) -> tuple[dict, list[np.ndarray], int]:
    """Tokenize pre-split words (at most `cap` tokens) and put each word's tag on its first
    sub-token. Returns the tokenizer's output with "labels", the first sub-token positions of
    each row, and how many rows lost words to truncation."""
    if not getattr(tokenizer, "is_fast", False):
        raise FineTuneError(
            "task='token-classification' needs a fast tokenizer (it maps sub-tokens back to "
            "words): pass tokenizer=AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=cap,
                        padding=False, return_attention_mask=True)
    firsts, labels, cut = [], [], 0
    for row in range(len(words)):
        word_ids = encoded.word_ids(row)
        first = _first_tokens(word_ids)
        firsts.append(first)
        cut += len(first) < len(words[row])
        label = np.full(len(word_ids), IGNORE, dtype=np.int64)
        if tag_ids is not None:
            label[first] = np.asarray(tag_ids[row][:len(first)], dtype=np.int64)
        labels.append(label)
    result = {key: list(value) for key, value in encoded.items()}
    result["labels"] = labels
    return result, firsts, cut


def encode_blocks(name: str, encoded: dict, input_names: list[str], label_name: str,
                  buckets: list[int], pad_values: dict[str, int], side: str,
                  truncated: int) -> batching.EncodedSplit:
    """Bucket rows whose labels are one token-aligned block (`label_name`, padded with -100):
    the block becomes the bucket's `[rows, length]` labels."""
    split = batching.encode_split(name, encoded, np.zeros(len(encoded["input_ids"]), np.int64),
                                  [*input_names, label_name], buckets,
                                  {**pad_values, label_name: IGNORE}, side, truncated)
    k = len(input_names)
    for bucket in split.buckets:
        bucket.labels = bucket.inputs[:, k * bucket.length:].astype(np.int64)
        bucket.inputs = np.ascontiguousarray(bucket.inputs[:, :k * bucket.length])
    return split


def pad_values(tokenizer: Any, notes: list[str]) -> dict[str, int]:
    pad_id = preparation.pad_id(tokenizer, notes)
    return {"input_ids": pad_id if pad_id is not None else 0,
            "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0) or 0}


def prepare(splits: Splits, config: FineTuneConfig, context: TaskContext) -> Prepared:
    """Words and tags checked, each word's tag on its first sub-token, rows bucketed;
    the head sized for the tags."""
    words_column, tags_column = _columns(config)
    eval_name = splits.eval_name
    words, raw_tags, names_from_data = {}, {}, None
    for split, ds in splits.named.items():
        _check_columns(ds, split, words_column, tags_column)
        words[split] = [list(row) if isinstance(row, (list, tuple)) else row
                        for row in ds[words_column]]
        raw_tags[split] = list(ds[tags_column])
        _check_rows(words[split], raw_tags[split], split, words_column, tags_column)
        names_from_data = names_from_data or tag_names_of(ds, tags_column)
    model_names = data.meaningful_label_names(getattr(context.model_config, "id2label",
                                                      None))
    names, tag_ids = _tag_ids(raw_tags, names_from_data, model_names, tags_column)
    if context.fixed_labels is not None and len(names) > context.fixed_labels:
        raise FineTuneError(
            f"the tags need {len(names)} classes, but the model's head has "
            f"{context.fixed_labels} outputs. Create it with num_labels={len(names)}, or "
            "pass the model's name or folder so fine_tune can size the head.")
    tokenizer = context.tokenizer
    cap = preparation.length_cap(config, context.model_config, tokenizer)
    notes: list[str] = []
    encoded, host, cut = {}, {}, {}
    for split in splits.named:
        encoded[split], firsts, cut[split] = encode_words(tokenizer, words[split],
                                                          tag_ids[split], cap)
        host[split] = WordRows(words[split], firsts,
                               [[names[i] for i in row] for row in tag_ids[split]])
    preparation.check_batch_fits(config, len(words["train"]))
    buckets = batching.split_buckets(encoded, cap, config.max_length, config.rows_per_step)
    pads = pad_values(tokenizer, notes)
    input_names = batching.input_names_of(tokenizer, encoded["train"])
    side = getattr(tokenizer, "padding_side", "right") or "right"
    encoded_splits = {split: encode_blocks(split, encoded[split], input_names, "labels",
                                           buckets, pads, side, cut[split])
                      for split in splits.named}
    encoded_data = batching.EncodedData(
        train=encoded_splits["train"],
        eval=encoded_splits.get(eval_name) if eval_name is not None else None,
        input_names=input_names, bucket_lengths=list(map(int, buckets)),
        label_names=list(names), notes=notes,
        host={"eval": host.get(eval_name) if eval_name is not None else None},
    )
    kwargs = head_kwargs(context.model_config, context.fixed_labels, names,
                         pads["input_ids"])
    return Prepared(encoded_data, kwargs)


def prepare_predict(inputs: list[Any], context: PredictContext,
                    max_length: int | None) -> batching.EncodedData:
    """Texts (split into words by `WORD_PATTERN`) or lists of words, encoded like
    evaluation rows (labels unknown)."""
    texts, words, spans = [], [], []
    for row, value in enumerate(inputs):
        if isinstance(value, str):
            found = list(WORD_PATTERN.finditer(value))
            texts.append(value)
            words.append([m.group() for m in found])
            spans.append([m.span() for m in found])
        elif isinstance(value, (list, tuple)) and all(isinstance(w, str) for w in value):
            row_spans, at = [], 0
            for word in value:
                row_spans.append((at, at + len(word)))
                at += len(word) + 1
            texts.append(" ".join(value))
            words.append(list(value))
            spans.append(row_spans)
        else:
            raise FineTuneError(
                f"input {row} is a {type(value).__name__}; token-classification predicts "
                "on texts (str) or lists of words.")
    tokenizer = context.tokenizer
    cap = preparation.length_cap(MaxLength(max_length), context.model_config, tokenizer)
    encoded, firsts, cut = encode_words(tokenizer, words, None, cap)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    buckets = ([max_length] if max_length else
               batching.choose_buckets(lengths, cap, min_rows=1))
    notes: list[str] = []
    input_names = batching.input_names_of(tokenizer, encoded)
    split = encode_blocks("predict", encoded, input_names, "labels", buckets,
                          pad_values(tokenizer, notes),
                          getattr(tokenizer, "padding_side", "right") or "right", cut)
    return batching.EncodedData(
        train=None, eval=split, input_names=input_names,
        bucket_lengths=list(map(int, buckets)), label_names=_model_tags(context),
        notes=notes, host={"eval": WordRows(words, firsts, None, spans, texts)})


def _model_tags(context: Any) -> list[str]:
    id2label = context.model_config.id2label
    return [str(id2label[key]) for key in sorted(id2label, key=int)]


# -- TokenClassification: the task's hooks --

class TokenClassification(Task):
    """A tag per word: cross-entropy on each word's first sub-token; seqeval's entity F1."""

    name = "token-classification"
    reported_metrics = ("loss", "precision", "recall", "f1", "accuracy")
    pipeline_tag = "token-classification"
    eval_ahead = True
    auto_class = "AutoModelForTokenClassification"
    head_suffixes = ("ForTokenClassification",)
    columns = (WORDS_COLUMN, TAGS_COLUMN)
    outputs_per_batch = 4
    title = "token classification"

    # -- kernel side -----------------------------------------------------------------------

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Words and tags checked, each word's tag on its first sub-token, rows bucketed;
        the head sized for the tags (`prepare`)."""
        return prepare(splits, config, context)

    def prediction_table(self, predictions: list[dict[str, Any]]
                         ) -> tuple[list[dict[str, Any]], list[str] | None]:
        """One row per entity found: its input, type, text, character span and score."""
        rows = [{"input": i, **entity} for i, item in enumerate(predictions)
                for entity in item.get("entities", [])]
        return rows, ["input", "entity", "text", "start", "end", "score"]

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Texts (split into words by `WORD_PATTERN`) or lists of words, encoded like
        evaluation rows (labels unknown)."""
        return prepare_predict(inputs, context, max_length)

    # -- worker side -----------------------------------------------------------------------

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        import torch

        logits = ctx.logits(batch)
        labels = batch.tokens[:, -batch.length:].long()
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        logits = ctx.logits(batch)
        labels = batch.tokens[:, -batch.length - 1:-1].long()
        weights = batch.weights.float()
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
            reduction="none").view(labels.shape)
        counted = (labels != IGNORE).float() * weights[:, None]
        probabilities = torch.softmax(logits, dim=-1)
        best, predicted = probabilities.max(dim=-1)
        return [predicted, best, (losses * counted).sum(-1), counted.sum(-1)]

    def decode(self, data_: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each row's words with their predicted tags and probabilities (and, for predict,
        the entities with their character spans)."""
        split, rows_info, names = data_.eval, data_.host["eval"], data_.label_names
        tags: list[Any] = [None] * split.num_rows
        scores: list[Any] = [None] * split.num_rows
        for (bucket_index, positions, real), (predicted, best, _, _) in self.per_batch(
                batches, fetched):
            rows = split.buckets[bucket_index].rows[positions[:real]]
            predicted, best = predicted.numpy(), best.float().numpy()
            for i, row in enumerate(rows):
                first = rows_info.first_tokens[row]
                tags[row] = [names[int(t)] for t in predicted[i, first]]
                scores[row] = [float(s) for s in best[i, first]]
        out = []
        for row in range(split.num_rows):
            words = rows_info.words[row][:len(tags[row])]
            item: dict[str, Any] = {"words": words, "tags": tags[row], "scores": scores[row]}
            if rows_info.spans is not None:
                item["entities"] = entities(tags[row], scores[row], rows_info.spans[row],
                                            rows_info.texts[row])
            out.append(item)
        return out

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        total = tokens = 0.0
        for _, (_, _, sums, counts) in self.per_batch(batches, fetched):
            total += float(sums.double().sum())
            tokens += float(counts.double().sum())
        decoded = self.decode(ctx.plan.data, batches, fetched)
        references = ctx.plan.data.host["eval"].tags
        truth = [references[row][:len(item["tags"])] for row, item in enumerate(decoded)]
        values = {"eval_loss": total / max(tokens, 1.0)}
        values.update(seqeval_metrics(truth, [item["tags"] for item in decoded]))
        values["eval_rows"] = float(ctx.plan.data.eval.num_rows)
        return values


def seqeval_metrics(truth: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall, F1 (micro over entities, seqeval's default rules), per
    entity type too (`eval_<TYPE>_f1`, ...), and the accuracy over words."""
    from seqeval.metrics import accuracy_score, classification_report

    report = classification_report(truth, predicted, output_dict=True, zero_division=0)
    overall = report.get("micro avg", {})
    values = {
        "eval_precision": float(overall.get("precision", 0.0)),
        "eval_recall": float(overall.get("recall", 0.0)),
        "eval_f1": float(overall.get("f1-score", 0.0)),
        "eval_accuracy": float(accuracy_score(truth, predicted)),
    }
    for kind, scores in report.items():
        if kind.endswith(" avg"):
            continue
        for key, name in (("precision", "precision"), ("recall", "recall"), ("f1-score", "f1"),
                          ("support", "entities")):
            values[f"eval_{kind}_{name}"] = float(scores[key])
    return values


def entities(tags: list[str], scores: list[float], spans: list[tuple[int, int]],
             text: str) -> list[dict[str, Any]]:
    """The entities of one row by seqeval's rules, each with its type, text, character span
    and mean word probability."""
    from seqeval.metrics.sequence_labeling import get_entities

    out = []
    for kind, first, last in get_entities(list(tags)):
        start, end = spans[first][0], spans[last][1]
        out.append({"entity": kind, "text": text[start:end], "start": start, "end": end,
                    "score": float(np.mean(scores[first:last + 1]))})
    return out


register_task(TokenClassification())
