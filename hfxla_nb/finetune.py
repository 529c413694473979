"""`fine_tune`: fine-tune a Hugging Face text classifier on every XLA device, in one call.

```python
import hfxla_nb as hx

result = hx.fine_tune("bert-base-cased", dataset, text_column="text", label_column="label")
result.metrics          # {'eval_accuracy': ..., 'eval_loss': ...}
model = result.load_model()
```

How it works:

1. In the notebook process, without starting the XLA runtime: check every argument, load
   the config and tokenizer, read and validate the texts and labels, tokenize to a few fixed
   shapes (`data.py`). Nothing is written and nothing is forked before all of that passed;
   every refusal says what to change.
2. `notebook_launcher` forks a worker (`training._train_worker`): by default one process in
   SPMD mode with the batch sharded over every device ("data" axis of a data-parallel mesh).
3. The worker (`training.py`) trains with one graph execution and no device-to-host
   transfer per step: the loss is accumulated on the device and fetched once per logging
   interval in a step closure; transformers' per-step mask check is patched out on XLA
   (`patches.py`). It evaluates with padded, weighted batches (exact metrics, no
   recompilation), saves the model and tokenizer atomically and returns a `FineTuneResult`.

Compiled graphs, whatever the number of steps, epochs or text lengths: for training one
first-step graph (it creates the optimizer state) plus one steady graph per length bucket (2
with one bucket), and one evaluation graph per bucket.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoint as ckpt
from . import data as D
from .data import DataError
from .training import TrainPlan, _train_worker, compute_metrics

__all__ = ["fine_tune", "FineTuneResult", "FineTuneError", "prepare_fine_tune", "TrainPlan",
           "compute_metrics"]

STRATEGIES = ("spmd", "replicated")
PRECISIONS = ("auto", "fp32", "bf16")
METRICS = ("accuracy", "f1", "precision", "recall")


class FineTuneError(ValueError):
    """`fine_tune` cannot run as asked; raised before anything is forked or written."""


# ---------------------------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------------------------


@dataclass
class FineTuneResult:
    """What a `fine_tune` run did and where its model is.

    Attributes:
        output_dir: the folder with the trained model and tokenizer (`from_pretrained`-ready).
        loss_history: `(step, mean training loss since the previous entry)` pairs.
        metrics: evaluation metrics (`eval_accuracy`, `eval_loss`, ...); empty without
            evaluation data.
        steps: optimizer steps done in total (including those before a resume).
        epochs: passes over the training data (fractional when `max_steps` cut one short).
        samples_per_second: training throughput after the warm-up (compiling) steps.
        train_seconds: wall time of the training loop.
        compiles: graphs compiled for training (fixed whatever the number of steps).
        eval_compiles: graphs compiled for evaluation.
        executions_per_step: graph executions per training step after the warm-up.
        transfers_per_step: device-to-host transfers per training step after the warm-up
            (the loss fetch once per logging interval).
        label_names: class names, in the order of the model's outputs.
        strategy, devices, precision: how it ran.
        bucket_lengths: the padded sequence lengths used.
        checkpoints: checkpoint folders written by this run.
        resumed_from: the checkpoint this run continued from, if any.
        notes: things worth knowing (truncated rows, dropped rows, patches applied).
    """

    output_dir: str | None
    loss_history: list[tuple[int, float]]
    metrics: dict[str, float]
    steps: int
    epochs: float
    samples_per_second: float | None
    train_seconds: float
    compiles: int
    eval_compiles: int
    executions_per_step: float | None
    transfers_per_step: float | None
    label_names: list[str]
    strategy: str
    devices: int
    precision: str
    bucket_lengths: list[int]
    batch_size: int = 0
    checkpoints: list[str] = field(default_factory=list)
    resumed_from: str | None = None
    eval_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FineTuneResult:
        known = {name for name in cls.__dataclass_fields__}
        values = {key: value for key, value in data.items() if key in known}
        values["loss_history"] = [tuple(pair) for pair in values.get("loss_history", [])]
        return cls(**values)

    @classmethod
    def load(cls, output_dir: str | os.PathLike) -> FineTuneResult:
        """The result of an earlier run, read from its output folder."""
        return cls.from_dict(ckpt.read_json(Path(output_dir) / ckpt.RUN_FILE))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def final_loss(self) -> float | None:
        """The last logged training loss."""
        return self.loss_history[-1][1] if self.loss_history else None

    def load_model(self, **kwargs: Any):
        """The trained model, loaded on the CPU in this process (the XLA runtime stays off).

        Args:
            kwargs: passed to `AutoModelForSequenceClassification.from_pretrained`.
        """
        if self.output_dir is None:
            raise FileNotFoundError("this run saved no model (output_dir was None).")
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification.from_pretrained(self.output_dir, **kwargs)

    def load_tokenizer(self, **kwargs: Any):
        """The tokenizer saved next to the model."""
        if self.output_dir is None:
            raise FileNotFoundError("this run saved no tokenizer (output_dir was None).")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.output_dir, **kwargs)

    # -- display -------------------------------------------------------------------------------

    def _lines(self) -> list[tuple[str, str]]:
        rows = []
        speed = f", {self.samples_per_second:,.1f} samples/s" if self.samples_per_second else ""
        rows.append(
            ("training", f"{self.steps} steps ({self.epochs:.2f} epochs) in "
             f"{self.train_seconds:.1f} s{speed}")
        )
        if self.loss_history:
            first, last = self.loss_history[0][1], self.loss_history[-1][1]
            rows.append(("loss", f"{first:.4f} -> {last:.4f}"))
        if self.metrics:
            rows.append(
                ("evaluation", "  ".join(f"{k}={_number(k, v)}" for k, v in self.metrics.items()))
            )
        per_step = ""
        if self.executions_per_step is not None:
            per_step = (
                f"; per step: {self.executions_per_step:.2f} executions, "
                f"{self.transfers_per_step:.2f} device-to-host transfers"
            )
        rows.append(
            ("XLA", f"{self.compiles} training + {self.eval_compiles} evaluation graphs "
             f"compiled{per_step}")
        )
        rows.append(
            ("setup", f"{self.strategy} over {self.devices} device(s), {self.precision}, "
             f"batch {self.batch_size}, lengths {self.bucket_lengths}, "
             f"labels {self.label_names}")
        )
        if self.resumed_from:
            rows.append(("resumed from", self.resumed_from))
        if self.output_dir:
            rows.append(("saved to", self.output_dir))
        for note in self.notes:
            rows.append(("note", note))
        return rows

    def __str__(self) -> str:
        width = max(len(name) for name, _ in self._lines())
        lines = ["FineTuneResult"]
        lines += [f"  {name:<{width}}  {value}" for name, value in self._lines()]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from .ui.html import sparkline_svg

        chart = sparkline_svg([loss for _, loss in self.loss_history], width=240, height=40)
        cells = "".join(
            f'<tr><th style="text-align:left;padding:2px 12px 2px 0;vertical-align:top">'
            f"{escape(name)}</th><td style=\"text-align:left;padding:2px 0\">{escape(value)}"
            + (f"<br>{chart}" if name == "loss" and chart else "")
            + "</td></tr>"
            for name, value in self._lines()
        )
        return (
            '<div style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">'
            "<b>FineTuneResult</b><table style=\"border-collapse:collapse;margin-top:4px\">"
            f"{cells}</table></div>"
        )


def _number(name: str, value: float) -> str:
    return str(int(value)) if name.endswith("_rows") else f"{value:.4f}"


# ---------------------------------------------------------------------------------------------
# The kernel side: validate and prepare, then launch
# ---------------------------------------------------------------------------------------------


def fine_tune(
    model: Any,
    dataset: Any,
    *,
    tokenizer: Any = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    eval_dataset: Any = None,
    max_length: int | None = None,
    epochs: float = 1,
    max_steps: int | None = None,
    batch_size: int = 8,
    learning_rate: float = 2e-5,
    gradient_accumulation_steps: int = 1,
    precision: str = "auto",
    strategy: str = "spmd",
    num_processes: int | None = None,
    output_dir: str | os.PathLike | None = "auto",
    save_steps: int | None = None,
    resume_from_checkpoint: bool | str | os.PathLike | None = None,
    seed: int = 0,
    metrics: Sequence[str | Callable] = ("accuracy",),
    progress: bool | str = True,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    max_grad_norm: float | None = 1.0,
    log_every: int = 10,
    timeout: float | None = None,
) -> FineTuneResult:
    """Fine-tune a sequence classifier on every XLA device, from one notebook cell.

    Everything is checked and tokenized in the notebook process first, without starting the
    XLA runtime, then a worker is forked by `notebook_launcher`, trains with fixed shapes
    (a constant handful of compiled graphs), evaluates, and saves the model and tokenizer.

    Args:
        model: a model name on the Hub, a local folder (loaded with
            `AutoModelForSequenceClassification.from_pretrained`, the head sized for the
            labels), or a `...ForSequenceClassification` model instance.
        dataset: the training data: a `datasets.Dataset`, a `DatasetDict` (its "train" split;
            "validation" or "test" for evaluation), a dataset name on the Hub, a local file
            or folder, a pandas DataFrame, or a list of dicts.
        tokenizer: a tokenizer, name or folder; default: the model's own.
        text_column: the column with the text.
        text_pair_column: a second text column for sentence-pair tasks (NLI, paraphrase).
        label_column: the column with the labels: class names (str), class ids (int), or a
            `ClassLabel`.
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
        output_dir: where the model, tokenizer and checkpoints go; "auto" (default):
            `hfxla_nb_output/<model name>`; None: save nothing. Must be new, empty, or an
            earlier fine_tune output.
        save_steps: write a checkpoint every this many steps (model, optimizer, scheduler,
            step, random states) under `output_dir/checkpoints/`.
        resume_from_checkpoint: True (the latest checkpoint in `output_dir`), or a checkpoint
            folder; training continues exactly as if it had not stopped. Pass the same data
            and settings as the interrupted run.
        seed: seeds data order, head initialization and dropout.
        metrics: "accuracy", "f1", "precision", "recall" (macro averages), or functions
            `f(predictions, labels) -> float | dict`.
        progress: True (live panels: widgets, HTML or console, whichever fits), "widgets",
            "html", "console", or False.
        weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
        warmup_steps: linear warm-up steps of the learning rate.
        max_grad_norm: gradient clipping norm (None: no clipping).
        log_every: fetch the loss (one device-to-host transfer) every this many steps.
        timeout: stop the worker after this many seconds.

    Returns:
        `FineTuneResult` with the loss history, evaluation metrics, throughput, compile and
        transfer counts, and the output folder (`result.load_model()` loads the model on CPU).

    Raises:
        FineTuneError: before anything is forked or written, for any argument or data that
            cannot work (the message says what to change).
        hfxla_nb.LaunchError: when the worker failed (with its traceback).

    Example:

    ```python
    >>> from hfxla_nb.demo import demo_dataset, demo_model_dir
    >>> result = hx.fine_tune(demo_model_dir(), demo_dataset(), learning_rate=1e-3,
    ...                       batch_size=32, epochs=2)
    >>> result.metrics["eval_accuracy"] > 0.9
    True
    ```
    """
    if progress not in (True, False, "auto", "widgets", "html", "console", "none"):
        raise FineTuneError(
            f"progress={progress!r}: use True, False, 'widgets', 'html' or 'console'."
        )
    plan = prepare_fine_tune(
        model,
        dataset,
        tokenizer=tokenizer,
        text_column=text_column,
        text_pair_column=text_pair_column,
        label_column=label_column,
        eval_dataset=eval_dataset,
        max_length=max_length,
        epochs=epochs,
        max_steps=max_steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        gradient_accumulation_steps=gradient_accumulation_steps,
        precision=precision,
        strategy=strategy,
        num_processes=num_processes,
        output_dir=output_dir,
        save_steps=save_steps,
        resume_from_checkpoint=resume_from_checkpoint,
        seed=seed,
        metrics=metrics,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        max_grad_norm=max_grad_norm,
        log_every=log_every,
    )
    from .launch import notebook_launcher

    raw = notebook_launcher(
        _train_worker,
        args=(plan,),
        num_processes=num_processes,
        strategy=strategy,
        progress="auto" if progress is True else progress,
        timeout=timeout,
    )
    return FineTuneResult.from_dict(raw)


def _fail(message: str) -> FineTuneError:
    return FineTuneError(message)


def _check_int(name: str, value: Any, minimum: int = 1, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        more = " or None" if allow_none else ""
        raise _fail(f"{name} must be an integer >= {minimum}{more}, got {value!r}.")


def _check_options(options: dict[str, Any]) -> None:
    strategy, precision = options["strategy"], options["precision"]
    if strategy not in STRATEGIES:
        raise _fail(
            f"strategy={strategy!r} is not supported by fine_tune: use 'spmd' (one process, the "
            "batch sharded over every device; recommended) or 'replicated' (xmp.spawn, one "
            "process per TPU chip)."
        )
    if precision not in PRECISIONS:
        raise _fail(
            f"precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}: 'auto' "
            "uses bfloat16 on TPU and float32 elsewhere; TPUs have no fast float16."
        )
    _check_int("batch_size", options["batch_size"])
    _check_int("gradient_accumulation_steps", options["gradient_accumulation_steps"])
    _check_int("max_steps", options["max_steps"], allow_none=True)
    _check_int("save_steps", options["save_steps"], allow_none=True)
    _check_int("max_length", options["max_length"], minimum=2, allow_none=True)
    _check_int("log_every", options["log_every"])
    _check_int("warmup_steps", options["warmup_steps"], minimum=0)
    _check_int("seed", options["seed"], minimum=0)
    epochs = options["epochs"]
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not epochs > 0:
        raise _fail(f"epochs must be a positive number, got {epochs!r}.")
    for name in ("learning_rate", "weight_decay"):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
            name == "learning_rate" and value == 0
        ):
            kind = "positive" if name == "learning_rate" else "non-negative"
            raise _fail(f"{name} must be a {kind} number, got {value!r}.")
    norm = options["max_grad_norm"]
    if norm is not None and (isinstance(norm, bool) or not isinstance(norm, (int, float))
                             or norm <= 0):
        raise _fail(f"max_grad_norm must be a positive number or None, got {norm!r}.")
    for metric in options["metrics"]:
        if not callable(metric) and metric not in METRICS:
            raise _fail(
                f"unknown metric {metric!r}: use {', '.join(map(repr, METRICS))} or a function "
                "f(predictions, labels) -> float or dict."
            )
    if options["resume_from_checkpoint"] is not None and options["output_dir"] is None and (
        options["resume_from_checkpoint"] is True
    ):
        raise _fail("resume_from_checkpoint=True needs the output_dir of the interrupted run.")


def _model_source(model: Any) -> tuple[Any, Any, int | None, str]:
    """(what the worker loads, its config, the fixed head size or None, a short name)."""
    if isinstance(model, (str, os.PathLike)):
        source = os.fspath(model)
        path = os.path.expanduser(source)
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise _fail(
                    f"model folder {path} has no config.json; pass a folder written by "
                    "save_pretrained (config.json and weights) or a model name on the Hub."
                )
            source = path
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(source)
        except Exception as error:  # noqa: BLE001 - say what to do, whatever failed
            raise _fail(
                f"could not load the config of model {source!r}: {error}. Pass a local folder "
                "written by save_pretrained, or check the name and the network (no Hub "
                "access: download the model on a machine that has it and copy the folder)."
            ) from None
        return source, config, None, Path(source.rstrip("/")).name or "model"
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "forward"):
        raise _fail(
            f"model must be a model name, a folder, or a transformers model instance; got "
            f"{type(model).__name__}."
        )
    if "ForSequenceClassification" not in type(model).__name__:
        raise _fail(
            f"model is a {type(model).__name__}, which has no classification head. Pass "
            "AutoModelForSequenceClassification.from_pretrained(..., num_labels=N), or the "
            "model's name or folder."
        )
    if any(getattr(p, "device", None) is not None and p.device.type != "cpu"
           for p in model.parameters()):
        raise _fail(
            "the model instance is not on the CPU. Pass it on the CPU (or its name/folder): "
            "the worker moves it to the XLA devices itself."
        )
    name = Path(str(getattr(config, "_name_or_path", "") or "").rstrip("/")).name
    return model, config, int(config.num_labels), name or type(model).__name__


def _load_tokenizer(tokenizer: Any, model: Any, source: Any):
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        if not callable(tokenizer):
            raise _fail(f"tokenizer must be a tokenizer, a name or a folder; got "
                        f"{type(tokenizer).__name__}.")
        return tokenizer
    where = tokenizer
    if where is None:
        if isinstance(source, str):
            where = source
        else:
            where = getattr(model.config, "_name_or_path", None)
            if not where or not os.path.isdir(where):
                raise _fail(
                    "the model instance does not say where its tokenizer is: pass "
                    "tokenizer=AutoTokenizer.from_pretrained(...) (or its name or folder)."
                )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(os.fspath(where))
    except Exception as error:  # noqa: BLE001
        raise _fail(
            f"could not load a tokenizer from {os.fspath(where)!r}: {error}. Pass "
            "tokenizer=... (a tokenizer, a name, or a folder with tokenizer files)."
        ) from None


def _position_limit(config: Any) -> int | None:
    """How many positions the model can embed (None when it does not say)."""
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    # RoBERTa-style models offset positions by padding_idx + 1.
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "longformer",
                                             "data2vec-text", "xmod"):
        pad = getattr(config, "pad_token_id", 1) or 1
        limit -= pad + 1
    return limit


def _check_output_dir(output_dir: Any, model_name: str) -> str | None:
    if output_dir is None:
        return None
    if output_dir == "auto":
        output_dir = os.path.join("hfxla_nb_output", model_name)
    path = Path(os.fspath(output_dir)).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            raise _fail(f"output_dir {path} exists and is a file; pass a folder path.")
        if not os.access(path, os.W_OK | os.X_OK):
            raise _fail(f"output_dir {path} is not writable; pass a folder you can write to.")
        entries = [e for e in os.listdir(path) if not e.startswith(".")]
        ours = {ckpt.RUN_FILE, ckpt.CHECKPOINTS}
        if entries and not (ours & set(entries)):
            raise _fail(
                f"output_dir {path} already holds other files ({', '.join(sorted(entries)[:5])})"
                "; pass a new or empty folder (or an earlier fine_tune output to replace it)."
            )
        return str(path)
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise _fail(
            f"output_dir {path} cannot be created: {parent} is not a writable folder. Pass a "
            "folder you can write to (or output_dir=None to save nothing)."
        )
    return str(path)


def _spmd_devices(num_processes: int | None) -> int:
    from .runtime import detect_accelerator

    accelerator = detect_accelerator()
    if accelerator.kind == "tpu":
        return int(accelerator.devices)
    if num_processes:
        return int(num_processes)
    try:
        return max(1, int(os.environ.get("CPU_NUM_DEVICES") or 1))
    except ValueError:
        return 1


def prepare_fine_tune(
    model: Any,
    dataset: Any,
    *,
    tokenizer: Any = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    eval_dataset: Any = None,
    max_length: int | None = None,
    epochs: float = 1,
    max_steps: int | None = None,
    batch_size: int = 8,
    learning_rate: float = 2e-5,
    gradient_accumulation_steps: int = 1,
    precision: str = "auto",
    strategy: str = "spmd",
    num_processes: int | None = None,
    output_dir: str | os.PathLike | None = "auto",
    save_steps: int | None = None,
    resume_from_checkpoint: bool | str | os.PathLike | None = None,
    seed: int = 0,
    metrics: Sequence[str | Callable] = ("accuracy",),
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    max_grad_norm: float | None = 1.0,
    log_every: int = 10,
) -> TrainPlan:
    """Everything `fine_tune` does before forking, without starting the XLA runtime.

    Same arguments as `fine_tune`. Returns the `TrainPlan` its worker runs; raises
    `FineTuneError` (a `ValueError`) with a message naming the fix for anything that cannot
    work. Writes nothing.
    """
    options = dict(locals())
    if isinstance(metrics, str) or callable(metrics):
        metrics = (metrics,)
    options["metrics"] = tuple(metrics)
    _check_options(options)
    source, config, fixed_labels, model_name = _model_source(model)
    tokenizer = _load_tokenizer(tokenizer, model, source)

    try:
        train_ds, eval_ds, eval_name = D.pick_splits(dataset, eval_dataset)
        splits = {"train": train_ds} if eval_ds is None else {"train": train_ds, eval_name: eval_ds}
        texts, pairs, raw_labels, class_names = {}, {}, {}, {}
        for split, ds in splits.items():
            if len(ds) == 0:
                raise DataError(f"the {split} data is empty: it needs at least one row.")
            D.check_columns(ds, split, [text_column, text_pair_column, label_column])
            texts[split] = D.check_texts(D.column_values(ds, text_column), text_column, split)
            if text_pair_column:
                pairs[split] = D.check_texts(
                    D.column_values(ds, text_pair_column), text_pair_column, split
                )
            raw_labels[split] = D.column_values(ds, label_column)
            class_names[split] = D.class_label_names(ds, label_column)
        label_names, label_ids = D.map_labels(
            raw_labels,
            column=label_column,
            dataset_names=class_names,
            model_names=D.meaningful_label_names(getattr(config, "id2label", None)),
            model_num_labels=fixed_labels,
        )
    except DataError as error:
        raise _fail(str(error)) from None

    limit = _position_limit(config)
    if max_length is not None and limit is not None and max_length > limit:
        raise _fail(
            f"max_length={max_length} is beyond the {limit} positions the model has "
            f"(max_position_embeddings); pass max_length<={limit} (longer texts are truncated)."
        )
    notes: list[str] = []
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if max_length is not None:
        cap = max_length
    else:
        candidates = [limit] if limit else []
        if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 100_000:
            candidates.append(tokenizer_limit)
        cap = min(candidates) if candidates else 512

    encoded, truncated = {}, {}
    for split in texts:
        encoded[split], truncated[split] = D.tokenize(tokenizer, texts[split], pairs.get(split),
                                                      cap)
    input_names = D.input_names_of(tokenizer, encoded["train"])
    rows_per_step = batch_size * gradient_accumulation_steps
    n_train = len(texts["train"])
    if rows_per_step > n_train:
        what = "batch_size" if gradient_accumulation_steps == 1 else (
            "batch_size x gradient_accumulation_steps")
        raise _fail(
            f"{what} = {rows_per_step} is larger than the {n_train} training rows; use "
            f"batch_size <= {n_train // gradient_accumulation_steps} or more data."
        )
    if max_length is not None:
        buckets = [max_length]
    else:
        lengths = [len(row) for split in encoded for row in encoded[split]["input_ids"]]
        train_lengths = [len(row) for row in encoded["train"]["input_ids"]]
        buckets = D.choose_buckets(train_lengths, cap, min_rows=4 * rows_per_step)
        longest = min(cap, D.round_up(max(lengths)))
        if longest > buckets[-1]:
            buckets[-1] = longest  # evaluation rows longer than every training row
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        # Decoder tokenizers (GPT-2 style) have no padding token; the end-of-text token is the
        # usual stand-in, and the model must know it to find each row's last real token.
        pad_id = getattr(tokenizer, "eos_token_id", None)
        notes.append("the tokenizer has no padding token: padding with its end-of-text token")
    pad_values = {
        "input_ids": pad_id if pad_id is not None else 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0) or 0,
    }
    side = getattr(tokenizer, "padding_side", "right") or "right"
    encoded_splits = {
        split: D.encode_split(split, encoded[split], label_ids[split], input_names, buckets,
                              pad_values, side, truncated[split])
        for split in encoded
    }
    train = encoded_splits["train"]
    per_epoch = D.steps_per_epoch(train, rows_per_step)
    if per_epoch == 0:
        raise _fail(
            f"no length bucket has {rows_per_step} training rows for a full step; pass "
            f"max_length=... (one bucket) or a smaller batch_size."
        )
    used = per_epoch * rows_per_step
    if used < n_train:
        notes.append(f"{n_train - used} of {n_train} training rows left out per epoch "
                     "(ragged batches are dropped; a different remainder each epoch)")
    for split in encoded_splits.values():
        if split.truncated:
            notes.append(f"{split.truncated} {split.name} rows truncated to "
                         f"{buckets[-1]} tokens")
    total = int(max_steps) if max_steps is not None else max(1, math.ceil(epochs * per_epoch))

    if strategy == "spmd":
        devices = _spmd_devices(num_processes)
        if batch_size % devices:
            raise _fail(
                f"batch_size={batch_size} does not split evenly over the {devices} devices; "
                f"use a multiple of {devices} (e.g. {devices * max(1, batch_size // devices)})."
            )
    else:
        devices = _spmd_devices(num_processes)
    resolved_dir = _check_output_dir(output_dir, model_name)
    try:
        resume = ckpt.resolve_checkpoint(resume_from_checkpoint, resolved_dir or ".")
    except ValueError as error:
        raise _fail(str(error)) from None
    fingerprint = {
        "train_rows": n_train,
        "batch_size": batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "buckets": list(map(int, buckets)),
        "seed": seed,
        "total_steps": total,
        "labels": list(label_names),
        "train_digest": _digest(train),
    }
    if resume is not None:
        previous = ckpt.read_checkpoint_info(resume).get("fingerprint", {})
        different = sorted(k for k in fingerprint if previous.get(k) != fingerprint[k])
        if different:
            details = ", ".join(f"{k}: {previous.get(k)!r} then, {fingerprint[k]!r} now"
                                for k in different if k != "train_digest")
            if "train_digest" in different:
                details = (details + ", " if details else "") + "the training rows differ"
            raise _fail(
                f"the checkpoint {resume} was written by a run with other settings ({details})."
                " Resume with the same data, batch_size, seed, max_steps/epochs and "
                "max_length, or start a new run without resume_from_checkpoint."
            )
    model_kwargs: dict[str, Any] = {}
    if fixed_labels is None:
        model_kwargs = {
            "num_labels": len(label_names),
            "id2label": dict(enumerate(label_names)),
            "label2id": {name: i for i, name in enumerate(label_names)},
        }
        if int(getattr(config, "num_labels", 0)) != len(label_names):
            model_kwargs["ignore_mismatched_sizes"] = True
        if getattr(config, "pad_token_id", None) is None and pad_id is not None:
            model_kwargs["pad_token_id"] = int(pad_id)
    data = D.EncodedData(
        train=train,
        eval=encoded_splits.get(eval_name) if eval_name else None,
        input_names=input_names,
        bucket_lengths=list(map(int, buckets)),
        label_names=list(label_names),
        notes=notes,
    )
    return TrainPlan(
        model=source,
        model_kwargs=model_kwargs,
        tokenizer=tokenizer,
        data=data,
        batch_size=int(batch_size),
        gradient_accumulation_steps=int(gradient_accumulation_steps),
        learning_rate=float(learning_rate),
        weight_decay=float(weight_decay),
        warmup_steps=int(warmup_steps),
        max_grad_norm=None if max_grad_norm is None else float(max_grad_norm),
        total_steps=total,
        steps_per_epoch=per_epoch,
        precision=precision,
        strategy=strategy,
        output_dir=resolved_dir,
        save_steps=save_steps,
        resume_from=str(resume) if resume is not None else None,
        seed=int(seed),
        metrics=tuple(metrics),
        log_every=int(log_every),
        devices=devices,
        fingerprint=fingerprint,
        save=resolved_dir is not None,
    )


def _digest(split) -> str:
    import hashlib

    digest = hashlib.sha1()
    for bucket in split.buckets:
        digest.update(bucket.inputs.tobytes())
        digest.update(bucket.labels.tobytes())
    return digest.hexdigest()[:16]
