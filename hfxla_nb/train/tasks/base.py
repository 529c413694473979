"""What differs between fine-tuning tasks: `Task`, the hooks every task fills in. Each task is a
module of this package (`classification.py` is the smallest); tasks are found by name in
`tasks.TASKS`.

A batch (`worker.context.Batch`) is a set of named tensors: `batch.tokens`, one int32 tensor
holding the token inputs side by side, then the label columns (one for a class id, `length`
for a label per token, two for a span), then (evaluation) a weight column (`batch.weights`, 0
for filler rows); and fields of any dtype by name (`batch["pixel_values"]`) from
`Bucket.fields`. `batch.inputs()` gives the model inputs by name. Every tensor of a batch goes
up in one call: one transfer (under SPMD, one per array: `worker/context.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import TASKS, plain_prediction_table, register_task

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..batching import EncodedData, EncodedSplit
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Prepared, Splits, TaskContext
    from ..worker.context import Batch, WorkerContext

__all__ = ["TASKS", "Task", "register_task"]


class Task:
    """One fine-tuning task. Subclass it, fill in the hooks, `register_task(MyTask())`.

    Kernel side (before the fork; may import transformers, writes nothing):
        check_model(model_config, names): refuse a model the task cannot train (default:
            none refused); `names` are its class or architecture names.
        load_processor(given, model, source): what encodes the inputs (default: the
            tokenizer; an audio or image task: its feature extractor or image processor),
            carried as `plan.tokenizer` and saved with the model.
        prepare(splits, config, context) -> Prepared: read and check the picked splits
            (`preparation.Splits`, none empty; refusing with `FineTuneError` and what
            to do), tokenize them into fixed-shape buckets (`batching.Bucket`; labels of any
            width per row, further inputs of any dtype in `Bucket.fields`), keep what the
            host needs later (offsets, word ids, answers) in `EncodedData.host`; return them
            with the `from_pretrained` arguments, and the LoRA settings and memory plan where
            the task has them (`preparation.lora_and_memory`).
            `prepare_fine_tune` builds the plan from it.
        prepare_predict(inputs, context, max_length) -> EncodedData: the same for `predict`'s
            inputs (labels unknown: zeros).
        prediction_table(predictions) -> (rows, columns): `Predictions.to_dataframe`'s table.

    Worker side (`ctx` is the worker's `worker.context.WorkerContext`: `ctx.plan`,
    `ctx.model`, `ctx.mesh`, `ctx.logits(batch)`,
    `ctx.autocast()`; a hook imports torch itself and calls `hfxla_nb._xla` for XLA's own
    operations):
        train_loss(ctx, batch) -> scalar tensor.
        eval_outputs(ctx, batch) -> tensors kept on the device for one fetch at the end
            (filler rows have `batch.weights == 0`).
        eval_metrics(ctx, batches, fetched) -> {"eval_...": float}; `fetched` holds each
            batch's `eval_outputs`, in order, on the host.
        decode(data, batches, fetched) -> one plain-Python prediction per input row (or
            example); evaluation's metrics and `predict` both go through it.
        augment(fields, rng) -> fields: a training batch's fields changed on the host
            (`augment=True`; a task with `augments`), shapes kept.
    """

    name = ""
    #: The metrics (without "eval_") its evaluation reports besides "rows"; None when they
    #: are known only once it ran (`metric_for_best_model` is then checked at that time).
    reported_metrics: tuple[str, ...] | None = None
    #: The Hub's pipeline tag for the model card ("text-classification"); "" when none fits
    #: (the Hub then reads it from the model's architecture).
    pipeline_tag = ""
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
    #: Whether the evaluation's graphs compile while training compiles its first step
    #: (`worker.evaluate.EvalAhead`): only for an evaluation of one graph per bucket that
    #: syncs nothing itself (seq2seq's decoding syncs once per token). False: they compile
    #: when evaluation starts.
    eval_ahead = False
    #: peft's task type for `lora=` ("SEQ_CLS", "CAUSAL_LM"); None: `lora=` is refused.
    peft_task_type: str | None = None
    #: Rows per device of `predict`'s default batch; None: as many as fit the inputs (up to
    #: `predict.ROWS_PER_DEVICE`). Tasks that generate keep a cache per row: fewer.
    predict_rows_per_device: int | None = None
    #: The task in words, for the result's setup row ("causal LM").
    title = ""
    #: Whether the result's setup row names the labels (a classifier's story) rather than the
    #: sharding; its parameter layout is then shown only when it is sharded.
    shows_labels = False
    #: Whether `FineTuneResult.generate` continues prompts with the trained model.
    continues_prompts = False
    #: The generation options its `predict` takes (`do_sample`, `temperature`, ...); none by
    #: default (`predict` refuses them before any fork).
    generation_options: tuple[str, ...] = ()
    #: What the result's "next" row passes to `result.predict(...)`.
    predict_example = '["a text"]'
    #: Whether `augment=True` is taken (its `augment` changes training batches).
    augments = False
    #: Whether its evaluation calls a Trainer-style `compute_metrics` (`flow.TrainerMetrics`)
    #: with each row's log-probabilities; False: the option is refused before any work.
    takes_compute_metrics = False
    #: Whether its `prepare` takes a streamed training split (`datasets.IterableDataset`,
    #: `data.is_stream`), read in the worker as training consumes it
    #: (`batching.StreamedSplit`); False: such data is refused before any work.
    streams = False
    #: What `load_processor` loads, saved next to the model: "tokenizer", "image processor",
    #: "feature extractor" or "processor" (a tokenizer and a feature extractor). The result's
    #: "next" row names the load call that fits (`FineTuneResult.load_processor`).
    processor = "tokenizer"
    #: Whether its models read token sequences (attention masks, packed rows): only then does
    #: the result note the patches of transformers' sequence masking applied for XLA.
    reads_sequences = True


    def eval_metric_names(self, config: FineTuneConfig) -> tuple[str, ...] | None:
        """The metrics (without "eval_") this run's evaluation reports, or None when they are
        known only once it ran."""
        return self.reported_metrics
    def check_model(self, model_config: Any, names: list[str]) -> None:
        """Refuse, with `FineTuneError`, a model this task cannot train (none by default)."""

    def auto_class_for(self, model_config: Any) -> str:
        """The transformers Auto class a model of this config loads with: `auto_class` by
        default; a task whose models differ in kind says which (speech recognition: CTC
        models or Whisper's encoder-decoder)."""
        return self.auto_class

    def claims_model(self, model_config: Any) -> bool:
        """Whether task="auto" picks this task for a model of this config before the other
        tasks whose head endings its class name also has (wav2vec2's
        `...ForSequenceClassification` is an audio classifier, not a text one). False by
        default: the first task whose ending matches is picked."""
        return False

    def load_processor(self, given: Any, model: Any, source: Any) -> Any:
        """What the data is encoded with (`TaskContext.tokenizer`, saved next to the model),
        loaded in the kernel: by default the tokenizer (`given`: `tokenizer=`, else the
        model's own, `preparation.load_tokenizer`). An audio or image task loads its
        feature extractor or image processor here instead."""
        from .. import preparation

        return preparation.load_tokenizer(given, model, source)

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        raise NotImplementedError(f"task {self.name!r} has no prepare.")

    def prediction_table(self, predictions: list[dict[str, Any]]
                         ) -> tuple[list[dict[str, Any]], list[str] | None]:
        """`Predictions.to_dataframe`'s rows and columns (None: the rows' keys): one row per
        input, each prediction's "probabilities" left out."""
        return plain_prediction_table(predictions)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        raise NotImplementedError(f"predict is not available for task {self.name!r} yet.")

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        raise NotImplementedError

    def eval_metrics(self, ctx: WorkerContext, batches: list,
                     fetched: list) -> dict[str, float]:
        raise NotImplementedError

    def augment(self, fields: dict[str, np.ndarray],
                rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A training batch's fields changed on the host, their shapes kept (`augment=True`,
        only for a task with `augments`); draws from `rng` only. By default: unchanged."""
        return fields

    def chance_accuracy(self, split: EncodedSplit | None) -> float | None:
        """The evaluation accuracy of a guess that ignores the input (the result's
        `chance_accuracy`, which the learning warnings compare with), or None where the
        task has no such figure (the default)."""
        return None

    def decode(self, data: Any, batches: list, fetched: list) -> list[Any]:
        raise NotImplementedError(f"predict is not available for task {self.name!r} yet.")

    def per_batch(self, batches: list, fetched: list) -> list[tuple[Any, list]]:
        """`(batch, its fetched outputs)` pairs."""
        k = self.outputs_per_batch
        return [(batch, fetched[i * k:(i + 1) * k]) for i, batch in enumerate(batches)]


class MaxLength:
    """The one field `preparation.length_cap` reads."""

    def __init__(self, max_length: int | None) -> None:
        self.max_length = max_length


def classifier_metric_names(config: FineTuneConfig) -> tuple[str, ...] | None:
    """What a classifier's evaluation reports: its loss and the metrics asked for by name (a
    metric function's names are known only once it ran)."""
    if any(callable(metric) for metric in config.metrics) or config.compute_metrics is not None:
        return None
    return ("loss", *config.metrics)
