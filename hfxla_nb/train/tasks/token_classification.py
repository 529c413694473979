"""`fine_tune(task="token-classification")`: a tag per word (NER, POS), conll2003-shaped data.

Kernel side: words (`tokens`, a list of strings per row) and their tags (`ner_tags`, a
`ClassLabel` sequence as `load_dataset("conll2003")` gives, or lists of strings) are checked,
tokenized as pre-split words, and each word's tag is put on its first sub-token (-100, which
the loss skips, on the other sub-tokens and on special tokens and padding). Rows are padded
into length buckets like classification's, the labels a `length`-wide block of the batch.

Worker side: cross-entropy over labelled tokens; evaluation fetches the predicted tag of every
token and decodes, on the host, the tag of each word from its first sub-token. Metrics are
entity-level precision, recall and F1 by seqeval's rules (the `seqeval` package, its default
conlleval mode), per entity type too, and the token accuracy over words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import token_classification_data
from .base import Task
from .registry import register_task
from .token_classification_data import (  # noqa: F401 - the task's names, read from here too
    IGNORE,
    TAGS_COLUMN,
    WORD_PATTERN,
    WORDS_COLUMN,
    WordRows,
    encode_blocks,
    encode_words,
    pad_values,
    tag_names_of,
)

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..kernel.preparation import Prepared, Splits, TaskContext
    from ..predict import PredictContext
    from ..worker.batch import Batch
    from ..worker.context import WorkerContext


class TokenClassification(Task):
    """A tag per word: cross-entropy on each word's first sub-token; seqeval's entity F1."""

    name = "token-classification"
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
        the head sized for the tags (`token_classification_data.py`)."""
        return token_classification_data.prepare(splits, config, context)

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
        return token_classification_data.prepare_predict(inputs, context, max_length)

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
