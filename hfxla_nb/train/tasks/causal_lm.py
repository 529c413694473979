"""Causal language modelling: next-token prediction, perplexity, and generation for `predict`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..config import FineTuneError
from ..generation_options import OPTION_NAMES
from . import causal_lm_data
from .base import Task
from .registry import register_task

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..kernel.preparation import Prepared, Splits, TaskContext
    from ..predict import PredictContext
    from ..worker.batch import Batch
    from ..worker.context import WorkerContext


class CausalLM(Task):
    """Next-token prediction: labels in the row (-100 where nothing is learned); the loss is
    the mean over learned tokens, evaluation reports it and its perplexity."""

    name = "causal-lm"
    pipeline_tag = "text-generation"
    eval_ahead = True
    auto_class = "AutoModelForCausalLM"
    head_suffixes = ("ForCausalLM", "LMHeadModel")
    peft_task_type = causal_lm_data.PEFT_TASK_TYPE
    predict_rows_per_device = 8  # a key/value cache per row grows with the new tokens
    title = "causal LM"
    continues_prompts = True
    generation_options = OPTION_NAMES

    # -- kernel side (causal_lm_data.py) -----------------------------------------------------

    def check_model(self, model_config: Any, names: list[str]) -> None:
        """Refuse an encoder-decoder model (a name or folder too, before any fork)."""
        if getattr(model_config, "is_encoder_decoder", False):
            what = ", ".join(names) or getattr(model_config, "model_type", "the model")
            raise FineTuneError(
                f"task='causal-lm', but the model ({what}) is an encoder-decoder model: it "
                "learns a target from a source. Use task='seq2seq' with source_column= and "
                "target_column= (or source_lang= and target_lang=), or a decoder-only model.")

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Texts or prompt/response pairs as rows of one length (`causal_lm_data.py`), the
        LoRA settings and the memory plan (`sharding="auto"`, `lora="auto"`)."""
        return causal_lm_data.prepare(splits, config, context)

    def _output(self, ctx: WorkerContext, batch: Batch,
                with_labels: bool) -> tuple[Any, torch.Tensor]:
        inputs = batch.inputs()
        labels = inputs.pop("labels").long()
        with ctx.autocast():
            # No key/value cache while training: nothing reads it, and a layer recomputed by
            # gradient checkpointing would append to it a second time.
            output = ctx.model(**inputs, labels=labels if with_labels else None, use_cache=False)
        return output, labels

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        output, _ = self._output(ctx, batch, with_labels=True)
        return output.loss.float()

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Prompts, padded on the left into buckets (`lm_predict.py`)."""
        from .causal_lm_predict import prepare_prompts

        return prepare_prompts(inputs, context, max_length)

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, str]]:
        """Each prompt's generated text (`predict`)."""
        from .causal_lm_predict import decode_texts

        return decode_texts(data, batches, fetched, self.per_batch)

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        from .causal_lm_predict import GenerationData, generate_on_device

        data = ctx.plan.data
        if isinstance(data, GenerationData):  # predict: generated tokens (and which rows ended)
            tokens, done = generate_on_device(ctx, batch, data.options)
            return [tokens, done]
        output, labels = self._output(ctx, batch, with_labels=False)
        logits = output.logits.float()[:, :-1]
        targets = labels[:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
            reduction="none",
        ).view(targets.shape)
        weights = (targets != -100).float() * batch.weights.float()[:, None]
        return [(losses * weights).sum(-1), weights.sum(-1)]

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        total = tokens = 0.0
        for (_, _, real), sums, counts in zip(batches, fetched[0::2], fetched[1::2],
                                              strict=True):
            total += float(sums.double().numpy()[:real].sum())
            tokens += float(counts.double().numpy()[:real].sum())
        loss = total / max(tokens, 1.0)
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0)),
                "eval_tokens": tokens, "eval_rows": float(ctx.plan.data.eval.num_rows)}


register_task(CausalLM())
