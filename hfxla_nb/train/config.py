"""`FineTuneConfig` and `GenerationOptions`: every option of a run, written and checked once.

- `FineTuneConfig`: every option of `fine_tune` and `prepare_fine_tune`.
- The precision a run uses (`resolve_precision`), decided once for the kernel's memory plan
  and the worker alike.
- Which torch_xla metrics a run counts (`COUNTED`): compiles, executions and transfers. The
  names themselves are torch_xla's, written once in `_xla`; this module only chooses.
- `GenerationOptions`: how `generate` and `predict` decode, decided and checked in the kernel.
  The options mean what transformers' `GenerationConfig` means by them (greedy or sampling,
  `temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`, `num_return_sequences`,
  `max_new_tokens`, `eos_token_id`, `stop_strings`). The model's `generation_config.json` is
  the default, a `GenerationConfig` is taken as it is, and keyword arguments override both.
  Everything that cannot work is refused before any fork, saying what to change.
- The prompts: plain texts get the beginning-of-text token, as training saw them; chat
  `messages` go through the tokenizer's chat template with the assistant's turn opened
  (`add_generation_prompt=True`). On the way back, `finished_text` cuts a row at its first
  end-of-text token or stop string.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._words import PROGRESS_MODES
from .._xla import COMPILE_TIME, EXECUTE_TIMES, TRANSFER_FROM_DEVICE_TIME, TRANSFER_TO_DEVICE_TIME
from ..observe.tracking import TrackingError, check_report_to
from .tasks import task_choices

# -- FineTuneConfig: every option of fine_tune --

STRATEGIES = ("spmd", "replicated")
SHARDINGS = ("auto", "data", "fsdp")
PRECISIONS = ("auto", "fp32", "bf16")
METRICS = ("accuracy", "f1", "precision", "recall", "rouge", "bleu")
#: transformers' schedule names (`SchedulerType`) that `fine_tune` runs: each a `LambdaLR`, a
#: rate known before the step, so the rate stays one input of the one training graph.
SCHEDULES = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
             "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr",
             "cosine_warmup_with_min_lr", "warmup_stable_decay")
#: transformers' schedules that read the evaluation metrics: refused, with the reason.
METRIC_SCHEDULES = ("reduce_lr_on_plateau", "greedy")
EVAL_STRATEGIES = ("no", "steps", "epoch")


class FineTuneError(ValueError):
    """`fine_tune` cannot run as asked; raised before anything is forked or written."""


@dataclass
class FineTuneConfig:
    """How `fine_tune` trains, whatever the task (`task=`: classification, causal-lm,
    token-classification, question-answering, masked-lm, multiple-choice, seq2seq). Pass one
    as `config=`, or its fields as keyword arguments. An option that names a task applies to
    that task only.

    Args:
        tokenizer: a tokenizer, name or folder; default: the model's own.
        text_column: the column with the text (token classification: the words, default
            "tokens"; question answering: the question, default "question").
        text_pair_column: classification: a second text column for sentence-pair tasks (NLI,
            paraphrase); question answering: the context (default "context").
        label_column: classification: the column with the labels: class names (str), class
            ids (int), or a `ClassLabel` (token classification: the tags, default
            "ner_tags"; question answering: the answers, default "answers"; multiple choice:
            the right ending's index).
        eval_dataset: evaluation data (same forms as `dataset`); default: the validation or
            test split of a `DatasetDict`, else none.
        max_length: pad (and truncate) every text to this many tokens. Default: a few length
            buckets chosen from the data (one when texts are short), at most the model's
            positions.
        epochs: passes over the training data (may be fractional).
        max_steps: stop after this many optimizer steps (overrides `epochs`).
        batch_size: rows per step over all devices (split across them); the ragged last batch
            of an epoch is dropped.
        learning_rate: peak learning rate of AdamW (`lr_scheduler_type` says how it changes).
        gradient_accumulation_steps: micro-batches of `batch_size` per optimizer step.
        precision: "auto" (bfloat16 autocast on TPU, float32 elsewhere), "bf16" or "fp32".
        strategy: "spmd" (one process, the batch sharded over every device; default) or
            "replicated" (`xmp.spawn`, one process per TPU chip, `xm.optimizer_step`).
        num_processes: devices to use; on a machine without a TPU, the number of virtual XLA
            CPU devices (default `CPU_NUM_DEVICES` or 1). On a TPU always all.
        output_dir: where the model, tokenizer and checkpoints go; "auto" (default): a new
            folder for each run, `hfxla_nb_output/<model name>-<start time>` (e.g.
            `hfxla_nb_output/tiny-bert-20261205-224501`, `-2` after it when two runs start in
            the same second); None: save nothing. A folder you name must be new or empty,
            or hold a saved model with `overwrite_output_dir=True`, or hold the checkpoints
            that `resume_from_checkpoint` continues from.
        overwrite_output_dir: replace the saved model (and the run summary) in the folder
            `output_dir` names; without it a folder that holds a saved model, an adapter or
            checkpoints is refused before anything starts. Resuming into the folder whose
            checkpoints it continues from needs no overwrite.
        save_steps: write a checkpoint every this many steps (model, optimizer, scheduler,
            step, random states) under `output_dir/checkpoints/`.
        fallback_dir: where the trained model goes when writing `output_dir` fails (a full
            disk, a quota, permissions): a folder `hfxla_nb-rescued-...` in it; None
            (default): in the system's temporary folder. `result.save(folder)` copies it.
        resume_from_checkpoint: True (the latest checkpoint in `output_dir`), or a checkpoint
            folder; training continues exactly as if it had not stopped. Pass the same data
            and settings as the interrupted run.
        seed: seeds data order, head initialization, dropout and augmentation.
        augment: image classification: each training image randomly cropped (60-100% of
            its area), resized back and flipped left to right, on the host, a pure function
            of the seed and the step (the same on every rerun); the shapes do not change, so
            neither do the graphs. Other tasks refuse it.
        metrics: classification: "accuracy", "f1", "precision", "recall" (macro averages), or
            functions `f(predictions, labels) -> float | dict`; seq2seq: "rouge", "bleu". The
            other tasks report their own (loss and perplexity for a causal or masked LM,
            seqeval's entity F1, SQuAD's exact match and F1, accuracy over the endings).
        weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
        warmup_steps: linear warm-up steps of the learning rate (a number below 1: that share
            of the steps, as transformers 5 reads it).
        warmup_ratio: the warm-up as a share of the steps (transformers 4's name); pass it or
            `warmup_steps`, not both.
        lr_scheduler_type: how the rate changes, by transformers' names ("linear", the
            default: warm up, then down to 0; "cosine", "cosine_with_restarts", "polynomial",
            "constant", "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr",
            "warmup_stable_decay"), `transformers.get_scheduler`'s rates exactly.
        lr_scheduler_kwargs: the schedule's own options (`{"num_cycles": 2}`,
            `{"min_lr": 1e-6}`), as `TrainingArguments.lr_scheduler_kwargs`.
        eval_strategy: "no" (default: evaluate once, after training), "steps" (every
            `eval_steps` steps, and after the last step) or "epoch" (after each epoch), as
            the Trainer's; each evaluation is in `result.log_history`, the trackers and the
            callbacks' `on_evaluate`.
        eval_steps: steps between evaluations with `eval_strategy="steps"` (default:
            `log_every`; a number below 1: that share of the steps).
        metric_for_best_model: the metric that picks the best evaluation ("loss",
            "accuracy", ...; with or without "eval_"); default "loss" with
            `load_best_model_at_end`.
        greater_is_better: whether a larger metric is better; default: False for a metric
            ending in "loss", True otherwise.
        load_best_model_at_end: the saved model and `result.metrics` are those of the best
            evaluation (its weights are kept on the host when it happens).
        save_total_limit: keep only the newest this many checkpoints (and the best one).
        compute_metrics: the Trainer's `compute_metrics`: a function of a
            `transformers.EvalPrediction` that returns a dict of floats, reported with
            "eval_" (classification of text and images). Its `predictions` are each row's
            log-probabilities (the logits less a constant per row: the same argmax and
            softmax), its `label_ids` the labels.
        callbacks: `transformers.TrainerCallback`s (instances or classes), called in the
            worker on the Trainer's events with the Trainer's `args`, `state` and `control`;
            `transformers.EarlyStoppingCallback` works as it is.
        max_grad_norm: gradient clipping norm (None: no clipping).
        log_every: fetch the loss (one device-to-host transfer) every this many steps.
        progress: True (live panels: widgets, HTML or console, whichever fits), "widgets",
            "html", "console", or False.
        report_to: "tensorboard", "wandb" or a list of them: the run's losses, learning
            rate, evaluation metrics, samples/s, compile and transfer counts, and its
            hyper-parameters (these fields, the memory plan), written from the notebook
            (TensorBoard needs `pip install "hfxla_nb[tensorboard]"`, W&B `"hfxla_nb[wandb]"`).
        log_dir: TensorBoard's folder; default `output_dir/runs/<run_name or date-time_host>`.
        project, run_name: the W&B project (default `WANDB_PROJECT`, else "hfxla_nb") and
            the run's name. W&B's variables are its own (`WANDB_MODE=offline`, `WANDB_DIR`).
        timeout: stop the worker after this many seconds.
        task: "auto" (default), or one of the registered tasks (`tasks.TASKS`):
            "classification", "causal-lm", "token-classification", "question-answering",
            "masked-lm", "multiple-choice", "seq2seq". "auto" takes the task whose head the
            model has (`...ForCausalLM`: "causal-lm", `...ForTokenClassification`, ...; a
            `...ForMaskedLM` stays a classifier), else the task whose columns the training
            data has (`tokens`/`ner_tags`, SQuAD's, SWAG's), else "classification".
        prompt_column, response_column: causal LM on pairs: the prompt is not learned, the
            response is (joined by `template`, or the tokenizer's chat template when it has
            one and no template is given). Without them, `text_column` is the text to learn.
        template: how a prompt and a response become one text, with "{prompt}" and
            "{response}" placeholders; default "{prompt}\n{response}".
        packing: causal LM: concatenate the texts and cut them into rows of `max_length` (no
            padding; default for `text_column` data); False pads each text to `max_length`.
            Pairs are never packed.
        sharding: over several devices: "data" (each device holds the whole model,
            the batch is split), "fsdp" (PyTorch/XLA's FSDPv2: parameters, gradients and
            optimizer state sharded over the devices too), or "auto": "fsdp" when parameters,
            gradients and AdamW state would not fit one device's memory (a causal LM's memory
            plan decides; "data" for the other tasks).
        gradient_checkpointing: recompute each layer in the backward pass with torch_xla's own
            checkpoint (transformers' own is removed by XLA's compiler): less memory, slower.
        trace_compiles: capture PyTorch/XLA's analysis of each compilation for the panel's
            compilations view (the line, cause, graph and memory of each); False turns it off.
        compiled_steps: run each batch shape's later training steps by its first step's
            compiled graph, with no trace (a few milliseconds of host time saved per step),
            where a check proves they compute what the traced steps would; None (default):
            on, unless the environment sets `HFXLA_NB_COMPILED_STEPS=0`; False traces every
            step. `result.compiled_steps` says, per shape, whether its steps were replayed and
            why not.
        compile_cache: the persistent compile cache: None (`hx.configure`'s choice, else on
            for TPU hosts), True, False, or a folder.
        keep_warm: leave the trained model on the devices after the run, in a warm session,
            so that `result.predict`, `generate` and `evaluate` start at once (no process, no
            load, no compile for a shape seen before): None (default) in a Jupyter kernel
            and with `strategy="spmd"` on one host; True or False to decide; a number of
            seconds: warm, and released after that long without a call. It holds the
            devices and their memory until `result.release()`, that idle limit, the next
            launch, or the kernel's end (docs/fine-tune.md, "Warm between cells").
        lora: train LoRA adapters instead of every weight (needs peft: `pip install
            "hfxla_nb[lora]"`): True (rank 8, or 16 from a hidden size of 2048, on every linear
            layer), a `peft.LoraConfig`, a dict of its fields, or "auto" (LoRA only when
            `hx.plan_memory` says the full fine-tune does not fit). The base stays frozen
            (bfloat16 on TPU), the adapters train in float32; `output_dir/adapter` holds the
            adapter (PEFT's format), `output_dir` the merged model.

        source_column, target_column: seq2seq: the source and target text columns (default:
            XSum's "document" / "summary", CNN/DailyMail's "article" / "highlights", ...).
        source_lang, target_lang: seq2seq translation: the language pair to take from a
            "translation" column of `{lang: text}` dicts (WMT's layout), e.g. "en", "fr".
        source_prefix: seq2seq: text put in front of every source (T5: "summarize: ").
        max_target_length: seq2seq: the target length in tokens (end-of-text included) that
            training pads to and evaluation generates; default: the longest target. Targets
            longer than it are refused, not cut.
        push_to_hub: after the run, upload the saved folder (the model, tokenizer and, for
            LoRA, `adapter/`; not the checkpoints) with a model card to the Hugging Face Hub,
            from the notebook process. The token (`hf auth login`, or `HF_TOKEN`) and the Hub
            are checked before training starts; a push that fails after training keeps the
            result and says so (`result.push_to_hub(repo_id)` tries again).
        hub_model_id: the repository: "namespace/name", or "name" in the token's own
            namespace; default: the output folder's name there.
        hub_private_repo: make a new repository private (None: the namespace's default).
    Raises:
        FineTuneError: on construction, for a value that cannot work (the message says what
            to change).
    """

    tokenizer: Any = None
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    eval_dataset: Any = None
    max_length: int | None = None
    epochs: float = 1
    max_steps: int | None = None
    batch_size: int = 8
    learning_rate: float = 2e-5
    gradient_accumulation_steps: int = 1
    precision: str = "auto"
    strategy: str = "spmd"
    num_processes: int | None = None
    output_dir: str | os.PathLike | None = "auto"
    overwrite_output_dir: bool = False
    save_steps: int | None = None
    resume_from_checkpoint: bool | str | os.PathLike | None = None
    seed: int = 0
    augment: bool = False
    metrics: Sequence[str | Callable] = ("accuracy",)
    weight_decay: float = 0.0
    warmup_steps: int | float = 0
    warmup_ratio: float = 0.0
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: Mapping[str, Any] | None = None
    eval_strategy: str = "no"
    eval_steps: int | float | None = None
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None
    load_best_model_at_end: bool = False
    save_total_limit: int | None = None
    callbacks: Sequence[Any] = ()
    compute_metrics: Callable[[Any], Mapping[str, float]] | None = None
    max_grad_norm: float | None = 1.0
    log_every: int = 10
    progress: bool | str = True
    report_to: str | Sequence[str] | None = None
    log_dir: str | os.PathLike | None = None
    project: str | None = None
    run_name: str | None = None
    timeout: float | None = None
    task: str = "auto"
    prompt_column: str | None = None
    response_column: str | None = None
    template: str | None = None
    packing: bool | None = None
    sharding: str = "auto"
    gradient_checkpointing: bool = False
    trace_compiles: bool = True
    compiled_steps: bool | None = None
    compile_cache: bool | str | os.PathLike | None = None
    keep_warm: bool | float | None = None
    lora: Any = False
    source_column: str | None = None
    target_column: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    source_prefix: str | None = None
    max_target_length: int | None = None
    fallback_dir: str | os.PathLike | None = None
    push_to_hub: bool = False
    hub_model_id: str | None = None
    hub_private_repo: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.metrics, str) or callable(self.metrics):
            self.metrics = (self.metrics,)
        self.metrics = tuple(self.metrics)
        self.callbacks = normalized_callbacks(self.callbacks)
        self.validate()

    @classmethod
    def build(cls, config: FineTuneConfig | None, options: Mapping[str, Any]) -> FineTuneConfig:
        """`config` (or the defaults) with `options` applied; unknown names are refused."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [name for name in options if name not in names]
        if unknown:
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, names, n=1)
                hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise FineTuneError(
                f"unknown option {', '.join(hints)}: fine_tune takes the fields of "
                "hx.FineTuneConfig (help(hx.FineTuneConfig) lists them)."
            )
        if config is not None and not isinstance(config, cls):
            raise FineTuneError(f"config must be a hx.FineTuneConfig, got {type(config).__name__}.")
        base = config if config is not None else cls()
        return dataclasses.replace(base, **options) if options else base

    @property
    def rows_per_step(self) -> int:
        return self.batch_size * self.gradient_accumulation_steps

    @property
    def replays_steps(self) -> bool:
        """Whether steps may run by their compiled graph: `compiled_steps`, else the
        environment's `HFXLA_NB_COMPILED_STEPS` ("0", "false", "no" or "off" turn it off)."""
        if self.compiled_steps is not None:
            return bool(self.compiled_steps)
        value = os.environ.get("HFXLA_NB_COMPILED_STEPS", "").strip().lower()
        return value not in ("0", "false", "no", "off")

    def validate(self) -> None:
        """Refuse values that cannot work, with a `FineTuneError` that says what to pass."""
        _check_choices(self)
        for name in ("batch_size", "gradient_accumulation_steps", "log_every"):
            _check_int(name, getattr(self, name))
        for name in ("max_steps", "save_steps"):
            _check_int(name, getattr(self, name), allow_none=True)
        _check_int("max_length", self.max_length, minimum=2, allow_none=True)
        _check_int("max_target_length", self.max_target_length, minimum=2, allow_none=True)
        _check_int("seed", self.seed, minimum=0)
        if not isinstance(self.augment, bool):
            raise FineTuneError(f"augment must be True or False, got {self.augment!r}.")
        if not isinstance(self.overwrite_output_dir, bool):
            raise FineTuneError(f"overwrite_output_dir must be True or False, got "
                                f"{self.overwrite_output_dir!r}.")
        _check_numbers(self)
        _check_tracking(self)
        for metric in self.metrics:
            if not callable(metric) and metric not in METRICS:
                raise FineTuneError(
                    f"unknown metric {metric!r}: use {', '.join(map(repr, METRICS))} or a "
                    "function f(predictions, labels) -> float or dict."
                )
        _check_hub_options(self)
        check_trainer_options(self)
        if self.resume_from_checkpoint is True and self.output_dir is None:
            raise FineTuneError(
                "resume_from_checkpoint=True needs the output_dir of the interrupted run."
            )


def _check_choices(config: FineTuneConfig) -> None:
    if config.strategy not in STRATEGIES:
        raise FineTuneError(
            f"strategy={config.strategy!r} is not supported by fine_tune: use 'spmd' (one "
            "process, the batch sharded over every device; recommended) or 'replicated' "
            "(xmp.spawn, one process per TPU chip)."
        )
    if config.task not in task_choices():
        raise FineTuneError(
            f"task={config.task!r} is not one of {', '.join(map(repr, task_choices()))}: "
            "'auto' picks from the model's architecture (a ...ForCausalLM is 'causal-lm'), "
            "'classification' otherwise."
        )
    if config.sharding not in SHARDINGS:
        raise FineTuneError(
            f"sharding={config.sharding!r} is not one of {', '.join(map(repr, SHARDINGS))}."
        )
    warm = config.keep_warm
    if not (warm is None or isinstance(warm, bool)
            or (isinstance(warm, (int, float)) and warm > 0)):
        raise FineTuneError(
            f"keep_warm={warm!r}: pass True, False, None (warm in a notebook kernel) or the "
            "seconds the model may stay idle before it is released (a number above 0).")
    if warm and config.strategy != "spmd":
        raise FineTuneError(
            f"keep_warm={warm!r} holds the model in one process over every device: use "
            f"strategy='spmd' (the default) with it, not {config.strategy!r}.")
    if config.sharding == "fsdp" and config.strategy != "spmd":
        raise FineTuneError(
            "sharding='fsdp' is FSDPv2, which runs under SPMD: use strategy='spmd' (the "
            "default) with it."
        )
    if (config.prompt_column is None) != (config.response_column is None):
        raise FineTuneError(
            "prompt_column and response_column go together: pass both (the prompt is given, "
            "the response is learned), or neither to learn the whole text_column."
        )
    if config.precision not in PRECISIONS:
        raise FineTuneError(
            f"precision={config.precision!r} is not one of {', '.join(map(repr, PRECISIONS))}: "
            "'auto' uses bfloat16 on TPU and float32 elsewhere; TPUs have no fast float16."
        )
    if not (isinstance(config.progress, bool) or config.progress in PROGRESS_MODES):
        raise FineTuneError(
            f"progress={config.progress!r}: use True, False, 'widgets', 'html' or 'console'."
        )


def _check_hub_options(config: FineTuneConfig) -> None:
    """push_to_hub= and its options (the token and the Hub are checked in `hub.check_hub`)."""
    if not isinstance(config.push_to_hub, bool):
        raise FineTuneError(f"push_to_hub must be True or False, got {config.push_to_hub!r}.")
    if config.hub_model_id is not None and (not isinstance(config.hub_model_id, str)
                                            or not config.hub_model_id.strip("/")):
        raise FineTuneError(f"hub_model_id must be a repository id such as 'name' or "
                            f"'namespace/name', got {config.hub_model_id!r}.")
    if config.hub_private_repo not in (None, True, False):
        raise FineTuneError(
            f"hub_private_repo must be True, False or None, got {config.hub_private_repo!r}.")
    given = [name for name in ("hub_model_id", "hub_private_repo")
             if getattr(config, name) is not None]
    if given and not config.push_to_hub:
        raise FineTuneError(f"{' and '.join(given)} say where push_to_hub=True uploads the "
                            "model: add push_to_hub=True (or drop them).")
    if config.push_to_hub and config.output_dir is None:
        raise FineTuneError("push_to_hub=True uploads the saved model folder, and "
                            "output_dir=None saves none: drop output_dir=None (or pass a folder).")


def _check_tracking(config: FineTuneConfig) -> None:
    """`report_to=`: known trackers, installed (else the pip line), W&B logged in or
    offline, TensorBoard with a folder to write to."""
    try:
        names = check_report_to(config.report_to)
    except TrackingError as error:
        raise FineTuneError(str(error)) from None
    if "tensorboard" in names and config.log_dir is None and config.output_dir is None:
        raise FineTuneError(
            "report_to='tensorboard' writes under output_dir/runs, and output_dir=None saves "
            "nothing: pass log_dir=<a folder> for TensorBoard's event files.")
    for name in ("project", "run_name"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise FineTuneError(f"{name} must be a non-empty string or None, got {value!r}.")


def _check_int(name: str, value: Any, minimum: int = 1, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        more = " or None" if allow_none else ""
        raise FineTuneError(f"{name} must be an integer >= {minimum}{more}, got {value!r}.")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _check_numbers(config: FineTuneConfig) -> None:
    if not _is_number(config.epochs) or not config.epochs > 0:
        raise FineTuneError(f"epochs must be a positive number, got {config.epochs!r}.")
    if not _is_number(config.learning_rate) or not config.learning_rate > 0:
        raise FineTuneError(
            f"learning_rate must be a positive number, got {config.learning_rate!r}."
        )
    if not _is_number(config.weight_decay) or config.weight_decay < 0:
        raise FineTuneError(
            f"weight_decay must be a non-negative number, got {config.weight_decay!r}."
        )
    norm = config.max_grad_norm
    if norm is not None and (not _is_number(norm) or norm <= 0):
        raise FineTuneError(f"max_grad_norm must be a positive number or None, got {norm!r}.")
    timeout = config.timeout
    if timeout is not None and (not _is_number(timeout) or timeout <= 0):
        raise FineTuneError(f"timeout must be a positive number of seconds, got {timeout!r}.")


def normalized_callbacks(callbacks: Any) -> tuple:
    """`callbacks` as a tuple of instances (a class is instantiated, as the Trainer does)."""
    if callbacks is None:
        return ()
    if not isinstance(callbacks, (list, tuple)):
        callbacks = (callbacks,)
    return tuple(callback() if isinstance(callback, type) else callback
                 for callback in callbacks)


def early_stopping(callbacks: tuple) -> bool:
    """Whether one of `callbacks` is transformers' `EarlyStoppingCallback` (or a subclass)."""
    from transformers import EarlyStoppingCallback

    return any(isinstance(callback, EarlyStoppingCallback) for callback in callbacks)


def check_trainer_options(config: Any) -> None:
    """The Trainer-named options of a `FineTuneConfig`, alone (no data yet).

    Raises:
        FineTuneError: the first option that cannot work, saying what to pass.
    """
    _check_schedule(config)
    _check_evaluation(config)
    _check_best_model(config)
    _check_callbacks(config)
    if config.compute_metrics is not None and not callable(config.compute_metrics):
        raise FineTuneError(
            f"compute_metrics must be a function of a transformers.EvalPrediction that returns "
            f"a dict of floats, as the Trainer's; got {config.compute_metrics!r}.")


def _check_schedule(config: Any) -> None:
    name = config.lr_scheduler_type
    if name in METRIC_SCHEDULES:
        raise FineTuneError(
            f"lr_scheduler_type={name!r} changes the rate from the evaluation metrics, and the "
            "rate of a step is decided before the step: use one of "
            f"{', '.join(map(repr, SCHEDULES))}.")
    if name not in SCHEDULES:
        raise FineTuneError(f"lr_scheduler_type={name!r} is not one of transformers' "
                            f"schedules: use one of {', '.join(map(repr, SCHEDULES))}.")
    if config.lr_scheduler_kwargs is not None and not isinstance(
            config.lr_scheduler_kwargs, Mapping):
        raise FineTuneError("lr_scheduler_kwargs must be a dict of the schedule's own options "
                            "(cosine_with_min_lr: {'min_lr': 1e-6}), got "
                            f"{config.lr_scheduler_kwargs!r}.")
    warmup, ratio = config.warmup_steps, config.warmup_ratio
    if not (isinstance(warmup, int) and not isinstance(warmup, bool) and warmup >= 0) and not (
            _is_number(warmup) and 0 <= warmup < 1):
        raise FineTuneError(f"warmup_steps must be a whole number of steps >= 0, or a share "
                            f"of the steps below 1 (0.1: the first tenth), got {warmup!r}.")
    if not _is_number(ratio) or not 0 <= ratio <= 1:
        raise FineTuneError(f"warmup_ratio must be a number from 0 to 1, got {ratio!r}.")
    if ratio and warmup:
        raise FineTuneError(f"warmup_steps={warmup!r} and warmup_ratio={ratio!r} both say how "
                            "long the warm-up is: pass one of them.")


def _check_evaluation(config: Any) -> None:
    strategy, steps = config.eval_strategy, config.eval_steps
    if strategy not in EVAL_STRATEGIES:
        raise FineTuneError(f"eval_strategy={strategy!r}: use 'no' (evaluate once, after "
                            "training), 'steps' (every eval_steps steps) or 'epoch'.")
    if steps is None:
        return
    if strategy != "steps":
        raise FineTuneError(f"eval_steps={steps!r} is for eval_strategy='steps'; with "
                            f"eval_strategy={strategy!r} drop it, or pass eval_strategy='steps'.")
    whole = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1
    if not whole and not (_is_number(steps) and 0 < steps < 1):
        raise FineTuneError(f"eval_steps must be a whole number of steps >= 1, or a share of "
                            f"the steps below 1 (0.25: four evaluations), got {steps!r}.")


def _check_best_model(config: Any) -> None:
    metric, strategy = config.metric_for_best_model, config.eval_strategy
    if metric is not None and (not isinstance(metric, str) or not metric.strip()):
        raise FineTuneError(f"metric_for_best_model must be a metric's name ('accuracy', "
                            f"'loss', ...), got {metric!r}.")
    if config.greater_is_better not in (None, True, False):
        raise FineTuneError(f"greater_is_better must be True, False or None, got "
                            f"{config.greater_is_better!r}.")
    if not isinstance(config.load_best_model_at_end, bool):
        raise FineTuneError(f"load_best_model_at_end must be True or False, got "
                            f"{config.load_best_model_at_end!r}.")
    no_evaluation = ("eval_strategy='no' evaluates only once, after training: pass "
                     "eval_strategy='steps' with eval_steps=N, or eval_strategy='epoch'")
    if config.load_best_model_at_end and strategy == "no":
        raise FineTuneError("load_best_model_at_end=True keeps the best of the evaluations "
                            f"during training, and {no_evaluation}.")
    if metric is not None and strategy == "no":
        raise FineTuneError("metric_for_best_model picks the best of the evaluations during "
                            f"training, and {no_evaluation}.")
    limit = config.save_total_limit
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise FineTuneError(f"save_total_limit must be an integer >= 1 or None, got "
                                f"{limit!r}.")
        if not config.save_steps:
            raise FineTuneError(f"save_total_limit={limit} keeps the newest checkpoints, and "
                                "save_steps=None writes none: pass save_steps=N too.")


def _check_callbacks(config: Any) -> None:
    from transformers import TrainerCallback

    wrong = [callback for callback in config.callbacks
             if not isinstance(callback, TrainerCallback)]
    if wrong:
        raise FineTuneError(
            f"callbacks takes transformers.TrainerCallback instances (or classes), got "
            f"{', '.join(repr(type(c).__name__) for c in wrong)}: subclass "
            "transformers.TrainerCallback and define its on_... methods.")
    if not early_stopping(config.callbacks):
        return
    if config.eval_strategy == "no":
        raise FineTuneError(
            "EarlyStoppingCallback stops when the evaluations stop improving, and "
            "eval_strategy='no' evaluates only after training: pass eval_strategy='steps' with "
            "eval_steps=N (or 'epoch'), and metric_for_best_model='loss' (or 'accuracy', ...).")
    if config.metric_for_best_model is None and not config.load_best_model_at_end:
        raise FineTuneError(
            "EarlyStoppingCallback compares each evaluation's metric_for_best_model with the "
            "best so far: pass metric_for_best_model='loss' (or 'accuracy', ...).")


# -- the precision a run uses --

def resolve_precision(requested: str, device_type: str | None) -> str:
    """The precision a run uses: "auto" is bfloat16 autocast on a TPU (its native fast
    type), float32 elsewhere (XLA on the CPU has no fast bfloat16)."""
    if requested != "auto":
        return requested
    return "bf16" if device_type == "TPU" else "fp32"


# -- the torch_xla metrics a run counts --

EXECUTE = EXECUTE_TIMES
COUNTED = (COMPILE_TIME, *EXECUTE, TRANSFER_FROM_DEVICE_TIME, TRANSFER_TO_DEVICE_TIME)


# -- GenerationOptions: how generate and predict decode, and the prompts --

#: New tokens per prompt when neither the caller nor the generation config says.
DEFAULT_NEW_TOKENS = 32
#: Decoding steps between two checks of whether every row has ended (one small transfer).
DEFAULT_CHECK_EVERY = 16
#: What `generate` accepts beyond `max_new_tokens` and `generation_config`.
OPTION_NAMES = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                "num_return_sequences", "seed", "eos_token_id", "stop_strings", "check_every")
#: What seq2seq's `predict` takes: the draws and the early stop.
SAMPLING_OPTIONS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "seed",
                    "check_every")


class GenerationError(ValueError):
    """A generation option or prompt that cannot work (raised before any fork)."""


@dataclass(frozen=True)
class GenerationOptions:
    """One decoding's settings, plain data (forked into the worker with the plan).

    Attributes:
        max_new_tokens: at most this many tokens per row (fewer when every row ended).
        do_sample: False: the most likely token (greedy); True: a draw from the processed
            distribution.
        temperature, top_k, top_p, min_p: the sampling warpers, as transformers' (None: off).
        repetition_penalty: transformers' `RepetitionPenaltyLogitsProcessor` (None: off).
        num_return_sequences: answers per prompt (sampling only).
        seed: the draws' seed: the same seed gives the same tokens on the same hardware.
        eos_token_ids: the tokens that end a row.
        stop_strings: texts that end a row too (cut there), checked on the host.
        check_every: decoding steps between two checks of whether every row has ended.
    """

    max_new_tokens: int = DEFAULT_NEW_TOKENS
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    num_return_sequences: int = 1
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    check_every: int = DEFAULT_CHECK_EVERY


def model_generation_config(model: Any) -> Any:
    """The model's own `GenerationConfig` (its folder's `generation_config.json`), or None."""
    from transformers import GenerationConfig

    if isinstance(model, (str, os.PathLike)) and (Path(model) / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(os.fspath(model))
    config = getattr(model, "generation_config", None)
    return config if isinstance(config, GenerationConfig) else None


def resolve_options(tokenizer: Any, generation_config: Any = None,
                    max_new_tokens: int | None = None, **overrides: Any) -> GenerationOptions:
    """The options of one call: `overrides` over `generation_config` over the defaults.

    Args:
        tokenizer: the model's tokenizer (its end-of-text token when the config names none).
        generation_config: a `transformers.GenerationConfig` (or None).
        max_new_tokens: tokens per row (default: the config's, else 32).
        overrides: any of `OPTION_NAMES`.

    Returns:
        The checked `GenerationOptions`.

    Raises:
        GenerationError: an unknown option or a value that cannot work, saying what to change.
    """
    unknown = sorted(set(overrides) - set(OPTION_NAMES))
    if unknown:
        raise GenerationError(f"generate() does not take {', '.join(unknown)}; it takes "
                              f"max_new_tokens, generation_config, {', '.join(OPTION_NAMES)}.")
    config = generation_config

    def pick(name: str, default: Any = None) -> Any:
        if overrides.get(name) is not None:
            return overrides[name]
        value = getattr(config, name, None) if config is not None else None
        return default if value is None else value

    new = max_new_tokens if max_new_tokens is not None else pick("max_new_tokens",
                                                                 DEFAULT_NEW_TOKENS)
    eos = pick("eos_token_id", tokenizer.eos_token_id)
    eos = () if eos is None else tuple(int(i) for i in ([eos] if isinstance(eos, int) else eos))
    stops = pick("stop_strings", ())
    seed = pick("seed")
    options = GenerationOptions(
        max_new_tokens=new, do_sample=bool(pick("do_sample", False)),
        temperature=pick("temperature"), top_k=pick("top_k"), top_p=pick("top_p"),
        min_p=pick("min_p"), repetition_penalty=pick("repetition_penalty"),
        num_return_sequences=pick("num_return_sequences", 1),
        seed=random.randrange(2**31) if seed is None else seed, eos_token_ids=eos,
        stop_strings=(stops,) if isinstance(stops, str) else tuple(stops),
        check_every=pick("check_every", DEFAULT_CHECK_EVERY))
    check_options(options)
    return options


def check_options(options: GenerationOptions) -> None:
    """Refuse options that cannot work, saying what to change.

    Raises:
        GenerationError: the first option that is wrong.
    """
    def whole(name: str, value: Any, least: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            what = "a positive integer" if least == 1 else f"an integer >= {least}"
            raise GenerationError(f"{name} must be {what}, got {value!r}.")

    whole("max_new_tokens", options.max_new_tokens, 1)
    whole("num_return_sequences", options.num_return_sequences, 1)
    whole("check_every", options.check_every, 1)
    whole("seed", options.seed, 0)
    if options.top_k is not None:
        whole("top_k", options.top_k, 0)
    if options.top_p is not None and not 0 < options.top_p <= 1:
        raise GenerationError(f"top_p must be in (0, 1], got {options.top_p!r}: pass "
                              "top_p=0.9 (the smallest set of tokens with 90% of the "
                              "probability), or top_p=1.0 to keep every token.")
    if options.min_p is not None and not 0 <= options.min_p <= 1:
        raise GenerationError(f"min_p must be in [0, 1], got {options.min_p!r}.")
    if options.do_sample and options.temperature is not None and options.temperature <= 0:
        raise GenerationError(f"temperature={options.temperature!r} with do_sample=True "
                              "cannot sample: pass a temperature > 0 (1.0 leaves the "
                              "distribution as it is), or do_sample=False for greedy decoding.")
    if options.repetition_penalty is not None and options.repetition_penalty <= 0:
        raise GenerationError("repetition_penalty must be > 0 (1.0: no penalty), got "
                              f"{options.repetition_penalty!r}.")
    if options.num_return_sequences > 1 and not options.do_sample:
        raise GenerationError(
            f"num_return_sequences={options.num_return_sequences} with greedy decoding gives "
            "the same answer every time: pass do_sample=True to draw different answers, or "
            "num_return_sequences=1.")
    if not all(isinstance(text, str) and text for text in options.stop_strings):
        raise GenerationError("stop_strings must be non-empty strings.")


def prompt_rows(tokenizer: Any, prompts: Any = None, messages: Any = None) -> list[list[int]]:
    """Each prompt's token ids: texts after the beginning-of-text token, conversations
    through the tokenizer's chat template with the assistant's turn opened.

    Raises:
        GenerationError: neither or both given, or messages without a chat template.
    """
    if (prompts is None) == (messages is None):
        raise GenerationError("pass prompts (texts) or messages (chat turns), one of them.")
    if messages is None and not isinstance(prompts, str) and (
            is_conversation(prompts) or any(map(is_conversation, prompts))):
        messages, prompts = prompts, None  # chats given as prompts: as predict takes them
    if messages is not None:
        return [list(tokenizer(text, add_special_tokens=False)["input_ids"])
                for text in chat_texts(tokenizer, messages)]
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not texts or not all(isinstance(text, str) for text in texts):
        raise GenerationError("prompts must be a text or a non-empty list of texts.")
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [bos + list(tokenizer(text, add_special_tokens=False)["input_ids"])
            for text in texts]


def is_conversation(value: Any) -> bool:
    """Whether `value` is one chat: a non-empty list of `{"role", "content"}` dicts."""
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(turn, dict) and "role" in turn and "content" in turn
                    for turn in value))


def chat_texts(tokenizer: Any, messages: Any) -> list[str]:
    """Each conversation rendered by the chat template, ending where the assistant speaks.

    Raises:
        GenerationError: not role/content dicts, or a tokenizer without a chat template.
    """
    chats = [messages] if is_conversation(messages) else list(messages or [])
    if not chats or not all(is_conversation(chat) for chat in chats):
        raise GenerationError('messages must be a list of {"role": ..., "content": ...} '
                              "dicts (one conversation), or a list of such lists.")
    if not getattr(tokenizer, "chat_template", None):
        raise GenerationError(
            "messages need a chat template, and this tokenizer has none: set "
            "tokenizer.chat_template to a Jinja template (and pass tokenizer=), save it with "
            "the model, or pass prompts as plain texts.")
    return [tokenizer.apply_chat_template(list(chat), add_generation_prompt=True,
                                          tokenize=False) for chat in chats]


def check_room(rows: list[list[int]], length: int, options: GenerationOptions,
               limit: int | None) -> None:
    """Refuse prompts that, padded to `length`, leave no room for the new tokens.

    Raises:
        GenerationError: naming the longest prompt and the model's positions.
    """
    if limit is not None and length + options.max_new_tokens > limit:
        raise GenerationError(
            f"the prompts ({max(map(len, rows))} tokens, {length} padded) and max_new_tokens="
            f"{options.max_new_tokens} need {length + options.max_new_tokens} positions; the "
            f"model has {limit}. Pass a smaller max_new_tokens, or shorter prompts.")


def finished_text(tokenizer: Any, row: list[int], options: GenerationOptions) -> str:
    """A row's new tokens as text: cut at its first end-of-text token, then at the first stop
    string (the stop string left out)."""
    ends = [row.index(token) for token in options.eos_token_ids if token in row]
    row = row[:min(ends)] if ends else row
    text = tokenizer.decode(row, skip_special_tokens=True)
    return cut_at_stop(text, options.stop_strings)[0]


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to its first stop string, and whether one was found."""
    cuts = [text.index(stop) for stop in stops if stop in text]
    return (text[:min(cuts)], True) if cuts else (text, False)
