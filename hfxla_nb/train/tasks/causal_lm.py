"""Causal language modelling: next-token prediction, perplexity, and generation for `predict`."""

from __future__ import annotations

import math
from typing import Any

from .base import Task
from .registry import register_task


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
        from .causal_lm_predict import prepare

        return prepare(inputs, context, max_length)

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, str]]:
        """Each prompt's generated text (`predict`)."""
        from .causal_lm_predict import decode

        return decode(data, batches, fetched, self.per_batch)

    def eval_outputs(self, run: Any, x: Any, length: int) -> list[Any]:
        from .causal_lm_predict import GenerationData, generate_on_device

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


register_task(CausalLM())
