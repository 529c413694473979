"""`FineTuneConfig`: every option of `fine_tune` and `prepare_fine_tune`, written once."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._choices import PROGRESS_MODES
from ..observe.tracking import TrackingError, check_report_to
from .tasks.registry import task_choices

STRATEGIES = ("spmd", "replicated")
SHARDINGS = ("auto", "data", "fsdp")
PRECISIONS = ("auto", "fp32", "bf16")
METRICS = ("accuracy", "f1", "precision", "recall", "rouge", "bleu")


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
        learning_rate: peak learning rate of AdamW (linear decay to 0).
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
        warmup_steps: linear warm-up steps of the learning rate.
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
        task: "auto" (default), or one of the registered tasks (`tasks.registry.TASKS`):
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
        compile_cache: the persistent compile cache: None (`hx.configure`'s choice, else on
            for TPU hosts), True, False, or a folder.
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
    warmup_steps: int = 0
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
    compile_cache: bool | str | os.PathLike | None = None
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

    def validate(self) -> None:
        """Refuse values that cannot work, with a `FineTuneError` that says what to pass."""
        _check_choices(self)
        for name in ("batch_size", "gradient_accumulation_steps", "log_every"):
            _check_int(name, getattr(self, name))
        for name in ("max_steps", "save_steps"):
            _check_int(name, getattr(self, name), allow_none=True)
        _check_int("max_length", self.max_length, minimum=2, allow_none=True)
        _check_int("max_target_length", self.max_target_length, minimum=2, allow_none=True)
        _check_int("warmup_steps", self.warmup_steps, minimum=0)
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
    """push_to_hub= and its options (the token and the Hub are checked in `kernel/hub.py`)."""
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
