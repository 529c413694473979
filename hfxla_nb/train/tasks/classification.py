"""Sequence classification: a label per row; accuracy, f1, precision, recall."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..worker.evaluate import compute_metrics
from .base import MaxLength, Task
from .registry import register_task


class Classification(Task):
    """Sequence classification: a label per row; accuracy, f1, precision, recall."""

    name = "classification"
    auto_class = "AutoModelForSequenceClassification"
    head_suffixes = ("ForSequenceClassification",)

    def train_loss(self, run: Any, x: Any, length: int) -> Any:
        logits = run.logits(x, length)
        return run.torch.nn.functional.cross_entropy(logits, x[:, -1].long())

    outputs_per_batch = 3

    def eval_outputs(self, run: Any, x: Any, length: int) -> list[Any]:
        torch = run.torch
        logits = run.logits(x, length)
        weights = x[:, -1].float()
        losses = torch.nn.functional.cross_entropy(logits, x[:, -2].long(), reduction="none")
        # Filler rows weigh 0; `where` keeps a NaN of a filler row out of the sum.
        losses = torch.where(weights > 0, losses, torch.zeros_like(losses))
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

    def eval_metrics(self, run: Any, batches: list, fetched: list) -> dict[str, float]:
        split, plan = run.plan.data.eval, run.plan
        predictions = self._by_row(split, batches, fetched, 0, int).astype(np.int64)
        row_losses = self._by_row(split, batches, fetched, 1, float).astype(np.float64)
        labels = np.empty(split.num_rows, dtype=np.int64)
        for bucket in split.buckets:
            labels[bucket.rows] = bucket.labels
        values = {"eval_loss": float(row_losses.mean())}
        values.update(compute_metrics(plan.metrics, predictions, labels,
                                      len(plan.data.label_names)))
        values["eval_rows"] = float(split.num_rows)
        return values

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each row's label, its probability, and every label's probability."""
        probabilities = self._by_row(data.eval, batches, fetched, 2, float)
        names = data.label_names
        return [{"label": names[int(p.argmax())], "score": float(p.max()),
                 "probabilities": {name: float(v) for name, v in zip(names, p, strict=True)}}
                for p in probabilities]

    def prepare_predict(self, inputs: Any, context: Any, max_length: int | None) -> Any:
        """Texts, or (text, pair) tuples, tokenized and bucketed like evaluation rows."""
        from .. import batching
        from ..config import FineTuneError
        from ..kernel import steps

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
        cap = steps.length_cap(MaxLength(max_length), context.model_config, tokenizer)
        encoded, cut = batching.tokenize(tokenizer, texts, pairs or None, cap)
        lengths = [len(ids) for ids in encoded["input_ids"]]
        buckets = [max_length] if max_length else batching.choose_buckets(lengths, cap)
        notes: list[str] = []
        pad_id = steps.pad_id(tokenizer, notes)
        split = batching.encode_split(
            "predict", encoded, np.zeros(len(texts), np.int64),
            batching.input_names_of(tokenizer, encoded), buckets,
            {"input_ids": pad_id if pad_id is not None else 0,
             "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0) or 0},
            getattr(tokenizer, "padding_side", "right") or "right", cut)
        config = context.model_config
        names = [str(config.id2label[i]) for i in sorted(config.id2label, key=int)]
        return batching.EncodedData(train=None, eval=split,
                                    input_names=batching.input_names_of(tokenizer, encoded),
                                    bucket_lengths=list(map(int, buckets)), label_names=names,
                                    notes=notes)



register_task(Classification())
