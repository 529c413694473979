"""What differs between fine-tuning tasks: `Task` (the hooks every task fills in), and the two
first tasks, `Classification` and `CausalLM`. Tasks are found by name in `registry.TASKS`.

A batch `x` is one packed int32 tensor: the inputs side by side (`run.inputs(x, length)`
splits them), then the label columns (one for a class id, `length` for a label per token,
two for a span), then (evaluation) a weight column (0 for filler rows).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .evaluate import compute_metrics
from .registry import TASKS, register_task

__all__ = ["TASKS", "Task", "Classification", "CausalLM", "register_task"]


class Task:
    """One fine-tuning task. Subclass it, fill in the hooks, `register_task(MyTask())`.

    Kernel side (before the fork; may import transformers, writes nothing):
        prepare(dataset, config, context) -> TrainPlan: read and check the data (refusing
            with `FineTuneError` and what to do), tokenize it into fixed-shape buckets
            (`batching.Bucket`; labels of any width per row), keep what the host needs later
            (offsets, word ids, answers) in `EncodedData.host`, and build the plan with
            `prepare.build_plan`. None (the default) is the classification path.
        prepare_predict(inputs, context, max_length) -> EncodedData: the same for `predict`'s
            inputs (labels unknown: zeros).

    Worker side (`run` is the worker's run: `run.model`, `run.torch`, `run.inputs(x, length)`,
    `run.logits(x, length)`, `run.autocast()`, `run.plan`):
        train_loss(run, x, length) -> scalar tensor.
        eval_outputs(run, x, length) -> tensors kept on the device for one fetch at the end
            (filler rows have weight `x[:, -1] == 0`).
        eval_metrics(run, batches, fetched) -> {"eval_...": float}; `fetched` holds each
            batch's `eval_outputs`, in order, on the host.
        decode(data, batches, fetched) -> one plain-Python prediction per input row (or
            example); evaluation's metrics and `predict` both go through it.
    """

    name = ""
    #: The transformers Auto class a model name or folder is loaded with.
    auto_class = ""
    #: Model class name endings that mean this task (task="auto" and model instances).
    head_suffixes: tuple[str, ...] = ()
    #: Whether task="auto" picks this task from the model's head (False: explicit only).
    pick_by_head = True
    #: Dataset columns that mean this task (task="auto" with a model without a task head).
    columns: tuple[str, ...] = ()
    #: Outputs per batch of `eval_outputs` (to split `fetched` by batch).
    outputs_per_batch = 2

    def prepare(self, dataset: Any, config: Any, context: Any) -> Any:
        return None

    def prepare_predict(self, inputs: Any, context: Any, max_length: int | None) -> Any:
        raise NotImplementedError(f"predict is not available for task {self.name!r} yet.")

    def train_loss(self, run: Any, x: Any, length: int) -> Any:
        raise NotImplementedError

    def eval_outputs(self, run: Any, x: Any, length: int) -> list[Any]:
        raise NotImplementedError

    def eval_metrics(self, run: Any, batches: list, fetched: list) -> dict[str, float]:
        raise NotImplementedError

    def decode(self, data: Any, batches: list, fetched: list) -> list[Any]:
        raise NotImplementedError(f"predict is not available for task {self.name!r} yet.")

    def splits(self, dataset: Any, config: Any) -> tuple[dict[str, Any], str | None]:
        """For `prepare`: the splits to read, training first (`{"train": ..., name: ...}`,
        from `data.pick_splits`), and the evaluation split's name (None: no evaluation).

        Raises:
            FineTuneError: the data has no training split, or an unusable evaluation one.
        """
        from . import data
        from .config import FineTuneError

        try:
            train, evaluation, eval_name = data.pick_splits(dataset, config.eval_dataset)
        except data.DataError as error:
            raise FineTuneError(str(error)) from None
        if evaluation is None:
            return {"train": train}, None
        return {"train": train, eval_name: evaluation}, eval_name

    def per_batch(self, batches: list, fetched: list) -> list[tuple[Any, list]]:
        """`(batch, its fetched outputs)` pairs."""
        k = self.outputs_per_batch
        return [(batch, fetched[i * k:(i + 1) * k]) for i, batch in enumerate(batches)]


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
        from . import batching, steps
        from .config import FineTuneError

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
        cap = steps.length_cap(_MaxLength(max_length), context.model_config, tokenizer)
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


class _MaxLength:
    """The one field `steps.length_cap` reads."""

    def __init__(self, max_length: int | None) -> None:
        self.max_length = max_length


class CausalLM(Task):
    """Next-token prediction: labels in the row (-100 where nothing is learned); the loss is
    the mean over learned tokens, evaluation reports it and its perplexity."""

    name = "causal-lm"
    auto_class = "AutoModelForCausalLM"
    head_suffixes = ("ForCausalLM", "LMHeadModel")

    def _output(self, run: Any, x: Any, length: int, with_labels: bool) -> Any:
        inputs = run.inputs(x, length)
        labels = inputs.pop("labels").long()
        with run.autocast():
            # No key/value cache while training: nothing reads it, and a layer recomputed by
            # gradient checkpointing would append to it a second time.
            output = run.model(**inputs, labels=labels if with_labels else None, use_cache=False)
        return output, labels

    def train_loss(self, run: Any, x: Any, length: int) -> Any:
        output, _ = self._output(run, x, length, with_labels=True)
        return output.loss.float()

    def prepare_predict(self, inputs: Any, context: Any, max_length: int | None) -> Any:
        """Prompts, padded on the left into buckets (`lm_predict.py`)."""
        from .lm_predict import prepare

        return prepare(inputs, context, max_length)

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, str]]:
        """Each prompt's generated text (`predict`)."""
        from .lm_predict import decode

        return decode(data, batches, fetched, self.per_batch)

    def eval_outputs(self, run: Any, x: Any, length: int) -> list[Any]:
        from .lm_predict import GenerationData, generate_on_device

        torch = run.torch
        data = run.plan.data
        if isinstance(data, GenerationData):  # predict: generated tokens (and last positions)
            tokens, positions = generate_on_device(run, x, length, data.max_new_tokens)
            return [tokens, positions]
        output, labels = self._output(run, x, length, with_labels=False)
        logits = output.logits.float()[:, :-1]
        targets = labels[:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
            reduction="none",
        ).view(targets.shape)
        weights = (targets != -100).float() * x[:, -1].float()[:, None]
        return [(losses * weights).sum(-1), weights.sum(-1)]

    def eval_metrics(self, run: Any, batches: list, fetched: list) -> dict[str, float]:
        total = tokens = 0.0
        for (_, _, real), sums, counts in zip(batches, fetched[0::2], fetched[1::2],
                                              strict=True):
            total += float(sums.double().numpy()[:real].sum())
            tokens += float(counts.double().numpy()[:real].sum())
        loss = total / max(tokens, 1.0)
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0)),
                "eval_tokens": tokens, "eval_rows": float(run.plan.data.eval.num_rows)}


register_task(Classification())
register_task(CausalLM())
