"""`FineTuneResult`: what a `fine_tune` run did and where its model is (plain data).

It is drawn by `hfxla_nb.ui.panels` (HTML in a notebook, text elsewhere). It also holds:

- a trained model whose final save failed twice (a full disk): kept in the kernel as CPU
  tensors (`HeldModel`) and written later where the user says (`FineTuneResult.save(folder)`),
  as is a model saved to a fallback folder;
- signs that a run learned nothing (accuracy at chance, a loss that barely fell), each with
  its likely causes (`learning_warnings`): plain logic that the worker runs and the result
  carries.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..launch.output import quiet_loading
from .config import FineTuneError
from .memory import on_meta
from .tasks import TASKS
from .worker import saving as ckpt

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from ..observe.tracking import Tracker
    from ..states import BaseLaunchRecord
    from .config import FineTuneConfig
    from .plan import TrainPlan


# -- the warm session holding a trained model on the devices --

class WarmSession(Protocol):
    """What a result asks of the warm session whose worker holds its model
    (`hfxla_nb.launch.sessions.Session`; the worker side is `worker/warm.py`)."""

    closed: bool

    @property
    def alive(self) -> bool: ...

    def call(self, function: Callable, args: tuple = (), kwargs: dict | None = None,
             tracker: Tracker | None = None,
             progress: bool | str | None = None) -> tuple[Any, BaseLaunchRecord]: ...

    def close(self) -> None: ...


# -- a trained model held in the kernel --

@dataclass
class HeldModel:
    """The trained model in memory, as the worker returned it.

    Attributes:
        state_dict: the model's state on the CPU (with LoRA: the adapters merged in).
        config: its transformers config.
        tokenizer: the tokenizer the run used.
    """

    state_dict: dict[str, torch.Tensor]
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase | None = None

    def model(self, auto_class: str, **kwargs: Any) -> PreTrainedModel:
        """The model on the CPU, built from the config by `transformers.<auto_class>` with the
        held weights (buffers that are not saved, such as position ids, made as usual).

        Args:
            auto_class: the task's Auto class name ("AutoModelForSequenceClassification").
            kwargs: passed to `from_config`.
        """
        import transformers

        model = getattr(transformers, auto_class).from_config(self.config, **kwargs)
        model.load_state_dict(self.state_dict, strict=False, assign=True)
        model.tie_weights()  # assigned one by one, tied weights are two tensors again
        return model.eval()

    def write(self, folder: Path, auto_class: str) -> None:
        """`save_pretrained` files of the model and the tokenizer into `folder`."""
        import transformers

        # only the class and the config: the weights are ours
        shell = on_meta(getattr(transformers, auto_class), self.config)
        shell.save_pretrained(folder, state_dict=self.state_dict)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(folder)


def save_model(folder: str | os.PathLike, summary: dict[str, Any], auto_class: str,
               output_dir: str | None, held: HeldModel | None) -> Path:
    """Write a run's model to `folder`, atomically: a copy of `output_dir` (a fallback
    folder), or the `held` model; with the run's `summary` (its `output_dir` the new folder).

    Args:
        folder: a new or empty folder.
        summary: the result's data (`FineTuneResult.to_dict()`).
        auto_class: the task's Auto class name.
        output_dir: the folder the model is in now, or None when it is `held`.
        held: the model in memory, or None.

    Returns:
        The folder, absolute.

    Raises:
        FileNotFoundError: there is no model to write.
        FileExistsError: `folder` exists and is not empty.
    """
    target = Path(os.fspath(folder)).expanduser().absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not an empty folder; pass a new one.")
    if held is None and output_dir is None:
        raise FileNotFoundError("this run saved no model (output_dir was None).")
    with ckpt.atomic_folder(target) as tmp:
        if held is not None:
            with quiet_loading():  # no "Writing model shards" bar left in the cell
                held.write(tmp, auto_class)
        else:
            shutil.copytree(output_dir, tmp, dirs_exist_ok=True)
        ckpt.write_json(tmp / ckpt.RUN_FILE, {**summary, "output_dir": str(target)})
    return target


# -- signs that a run learned nothing --

# Evaluation accuracy within this of always predicting the most frequent label is "at chance".
CHANCE_MARGIN = 0.02
# A training loss that fell by less than this share from its first logged value learned little.
MIN_LOSS_DROP = 0.05


def learning_warnings(loss_history: list, metrics: dict[str, float],
                      chance: float | None) -> list[str]:
    """Signs that a fine-tune learned nothing, each with its likely causes.

    Args:
        loss_history: `(step, loss)` pairs as logged.
        metrics: the evaluation metrics (`eval_accuracy` is read).
        chance: the accuracy of always predicting the most frequent label.
    """
    signs = []
    accuracy = metrics.get("eval_accuracy")
    if accuracy is not None and chance is not None and accuracy <= chance + CHANCE_MARGIN:
        signs.append(f"the evaluation accuracy {accuracy:.3f} is at chance level ({chance:.3f} "
                     "by always predicting the most frequent label)")
    if len(loss_history) >= 2:
        first, last = float(loss_history[0][1]), float(loss_history[-1][1])
        if first > 0 and (first - last) / first < MIN_LOSS_DROP:
            signs.append(f"the training loss fell only {max(first - last, 0) / first:.0%} "
                         f"({first:.3f} -> {last:.3f})")
    if not signs:
        return []
    return ["The model learned little: " + " and ".join(signs) + ". Likely causes: a learning "
            "rate too low (or so high that the loss cannot fall), too few epochs or steps, or "
            "labels that do not match the texts (a wrong label_column, shuffled labels)."]


# -- FineTuneResult: what the run did and where its model is --

@dataclass
class FineTuneResult:
    """What a `fine_tune` run did and where its model is.

    Attributes:
        output_dir: the folder with the trained model and tokenizer (`from_pretrained`-ready):
            the one asked for, or, when writing it failed, the fallback folder the model went
            to instead; None when nothing was saved or the model is `held_model`.
        save_error: when the final save failed: one line that says why, and where the model
            is instead (the result's first note too); None when it went where asked.
        held_model: the trained model in memory (`HeldModel`), when the final save failed in
            the fallback folder too; `save(folder)` writes it.
        loss_history: `(step, mean training loss since the previous entry)` pairs.
        metrics: evaluation metrics (`eval_accuracy`, `eval_loss`, ...); empty without
            evaluation data.
        steps: optimizer steps done in total (including those before a resume).
        epochs: passes over the training data (fractional when `max_steps` cut one short).
        samples_per_second: training throughput after the warm-up (compiling) steps.
        samples_per_second_overall: training throughput over the whole training loop,
            compiling steps included (a bar too short for a warm-up shows it as "overall").
        train_seconds: wall time of the training loop (checkpoints left out).
        eval_seconds: wall time of the evaluation.
        launch_seconds: wall time of the whole launch: start-up, model loading, training,
            evaluation and saving (what the launch panel's status line says).
        compiles: graphs compiled for training (fixed whatever the number of steps).
        eval_compiles: graphs compiled for evaluation.
        eval_compiled_ahead: of those, how many compiled while training ran (beside the first
            step's compile), so that evaluation started with its graphs ready.
        setup_compiles: graphs compiled before step 1 (AdamW's first state, made by one small
            graph so that step 1 traces the steady graph); the XLA metrics count them too.
        executions_per_step: graph executions per training step after the warm-up.
        transfers_per_step: device-to-host transfers per training step after the warm-up
            (the loss fetch once per logging interval).
        uploads_per_step: host-to-device transfers per training step after the warm-up (the
            batch, every field of it in one transfer).
        host_ms_per_step: the training thread's CPU per training step after the warm-up, in
            milliseconds (evaluations, checkpoints and the replay's checks left out): what the
            host spends on a step, which a TPU that runs the step faster waits for.
        label_names: class names, in the order of the model's outputs.
        strategy, devices, precision: how it ran.
        bucket_lengths: the padded sequence lengths used.
        checkpoints: checkpoint folders written by this run.
        resumed_from: the checkpoint this run continued from, if any.
        notes: things worth knowing (truncated rows, dropped rows, patches applied).
        task: the task's name ("classification", "causal-lm", "token-classification",
            "question-answering", "masked-lm", "multiple-choice", "seq2seq").
        task_title, shows_labels, generates, predict_example, processor: what the task says
            of itself for the result's panel (`Task.title`, `Task.shows_labels`,
            `Task.continues_prompts`, `Task.predict_example`, `Task.processor`); filled from
            the task when not given.
        sharding: "data" (parameters replicated) or "fsdp" (FSDPv2: parameters sharded).
        gradient_checkpointing: whether layers were recomputed with torch_xla's checkpoint.
        parameter_sharding: the first parameters' SPMD sharding specs, name -> spec
            (`{devices=[4,1]0,1,2,3}`: split in 4 along the first dimension).
        chance_accuracy: the evaluation accuracy of always predicting the most frequent label.
        warnings: signs the model learned nothing (accuracy at chance level, a loss that
            barely fell), each with its likely causes; empty when none.
        xla: the launch's final XLA figures for the worker (`RankMetrics.to_dict()`:
            compiles, executions, transfers, their times, step times, alerts), when known.
        lora: the LoRA settings (peft `LoraConfig` fields) of a LoRA run, else None; its
            adapter is in `output_dir/adapter`, the merged model in `output_dir`.
        trainable_parameters, parameters: what was trained, of how many (None when unknown).
        memory_plan: the `MemoryPlan` the run was checked and decided with (a causal LM's),
            as a dict; `hx.plan_memory` gives one without training.
        provenance: where the model comes from, for its model card: the base model, the
            data (a Hub name, or its columns and rows), the settings, the hardware,
            hfxla_nb's version (`hub.provenance`).
        hub_url: the Hub repository the model was pushed to (`push_to_hub`), else None.
        log_history: `transformers.Trainer`'s `state.log_history`: a dict per training log
            (`loss`, `learning_rate`, `epoch`, `step`), per evaluation (`eval_loss`,
            `eval_accuracy`, ..., `epoch`, `step`) and the training's summary
            (`train_runtime`, `train_loss`, ...), in the order they happened.
        best_metric, best_step: `metric_for_best_model`'s best value and the step of that
            evaluation (None without `metric_for_best_model`).
        best_model_checkpoint: the checkpoint written at the best evaluation, if any.
        stopped_early: a callback stopped the training (`control.should_training_stop`)
            before its last step; `steps` says where.
        stop_reason: why, in a sentence ("stopped early at step 50 of 120: eval_accuracy did
            not improve for 2 evaluations (EarlyStoppingCallback)"), or None.
        kept_best: the saved (and warm) model is the best evaluation's
            (`load_best_model_at_end`), at `best_step`.
        best_metric_name: the metric `best_metric` is a value of (`metric_for_best_model`).
        compiled_steps: each batch shape of the training ("32x48") -> "replayed" (its later
            steps ran by the first step's compiled graph, with no trace), or "traced: " and
            why not (`compiled_steps=False`, LayerDrop, an op run on the CPU while tracing,
            a host value that differs between steps, ...).
        compiled_evaluation: each batch shape of the evaluation ("32x48") -> "replayed" (its
            later batches ran by the first batch's compiled graph), or "traced: " and why
            not, by the same rules as the training's steps; none for a shape of one batch.
        session: the warm session whose worker holds the trained model on the devices
            (`keep_warm`), or None; `warm` says whether it still does, `release()` frees it.
        config: the run's `FineTuneConfig` (what `evaluate` encodes new data with), or None
            for a result read from its folder.
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
    eval_compiled_ahead: int = 0
    notes: list[str] = field(default_factory=list)
    task: str = "classification"
    sharding: str = "data"
    gradient_checkpointing: bool = False
    parameter_sharding: dict[str, str] = field(default_factory=dict)
    samples_per_second_overall: float | None = None
    launch_seconds: float | None = None
    chance_accuracy: float | None = None
    warnings: list[str] = field(default_factory=list)
    xla: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] | None = None
    trainable_parameters: int | None = None
    parameters: int | None = None
    memory_plan: dict[str, Any] | None = None
    task_title: str | None = None
    shows_labels: bool | None = None
    generates: bool | None = None
    predict_example: str | None = None
    processor: str | None = None
    uploads_per_step: float | None = None
    host_ms_per_step: float | None = None
    setup_compiles: int = 0
    save_error: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    hub_url: str | None = None
    log_history: list[dict[str, Any]] = field(default_factory=list)
    best_metric: float | None = None
    best_step: int | None = None
    best_model_checkpoint: str | None = None
    stopped_early: bool = False
    stop_reason: str | None = None
    kept_best: bool = False
    best_metric_name: str | None = None
    compiled_steps: dict[str, str] = field(default_factory=dict)
    compiled_evaluation: dict[str, str] = field(default_factory=dict)
    held_model: HeldModel | None = field(default=None, repr=False, compare=False)
    session: WarmSession | None = field(default=None, repr=False, compare=False)
    config: FineTuneConfig | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        task = TASKS.get(self.task)
        if task is None:  # a task not registered in this process: say nothing of it
            return
        given = {"task_title": task.title or task.name, "shows_labels": task.shows_labels,
                 "generates": task.continues_prompts, "predict_example": task.predict_example,
                 "processor": task.processor}
        for name, value in given.items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FineTuneResult:
        known = {name for name in cls.__dataclass_fields__}
        values = {key: value for key, value in data.items() if key in known}
        values["loss_history"] = [tuple(pair) for pair in values.get("loss_history", [])]
        if isinstance(values.get("held_model"), dict):  # as the worker returns it
            values["held_model"] = HeldModel(**values["held_model"])
        return cls(**values)

    @classmethod
    def load(cls, output_dir: str | os.PathLike) -> FineTuneResult:
        """The result of an earlier run, read from its output folder."""
        return cls.from_dict(ckpt.read_json(Path(output_dir) / ckpt.RUN_FILE))

    def to_dict(self) -> dict[str, Any]:
        """The result as plain data (a model held in memory left out)."""
        return asdict(dataclasses.replace(self, held_model=None, session=None, config=None))

    def save(self, folder: str | os.PathLike) -> str:
        """Write the trained model, its tokenizer and the run summary to `folder` (new or
        empty): from wherever the model is (the output folder, a fallback folder, or memory).
        The result then points there (`output_dir`), and a model held in memory is let go.

        Args:
            folder: where the model goes.

        Returns:
            The folder, absolute.

        Raises:
            FileNotFoundError: this run saved no model (output_dir was None).
            FileExistsError: `folder` exists and is not empty.
        """
        target = save_model(folder, self.to_dict(), self._auto_class(),
                            self.output_dir, self.held_model)
        self.output_dir, self.held_model = str(target), None
        return str(target)

    def push_to_hub(self, repo_id: str | None = None, private: bool | None = None) -> str:
        """Upload the saved folder (model, tokenizer, for LoRA `adapter/`; not the
        checkpoints) with a model card (README.md) to the Hugging Face Hub, from this process.

        Args:
            repo_id: "namespace/name", or "name" in the token's namespace; default: the output
                folder's name there.
            private: make a new repository private (None: the namespace's default).

        Returns:
            The repository's address (also `hub_url`).

        Raises:
            hfxla_nb.train.hub.HubError: no token (`hf auth login`, or `HF_TOKEN`), an
                unreachable Hub, no saved folder, or a failed upload; the message says why.
        """
        from .hub import hub_target, push_result

        name = Path(self.output_dir).name if self.output_dir else "model"
        return push_result(self, hub_target(repo_id, private, name))

    def figures(self) -> dict[str, Any]:
        """The run's numbers as one flat dict: throughput, times, graphs, evaluation metrics,
        the final loss and the XLA figures (`xla_compiles`, ...); lists and texts left out."""
        row: dict[str, Any] = {
            name: getattr(self, name) for name in (
                "steps", "epochs", "samples_per_second", "samples_per_second_overall",
                "train_seconds", "eval_seconds", "launch_seconds", "compiles", "eval_compiles",
                "executions_per_step", "transfers_per_step", "uploads_per_step",
                "host_ms_per_step", "devices",
                "strategy", "precision", "batch_size", "chance_accuracy")
        }
        row["final_loss"] = self.final_loss
        row["learned"] = not self.warnings
        row.update(self.metrics)
        for name, value in self.xla.items():
            if isinstance(value, (int, float)) or value is None:
                row[f"xla_{name}"] = value
        return row

    def to_dataframe(self) -> Any:
        """`figures()` as a one-row `pandas.DataFrame` (pandas imported only here), so runs
        can be compared with `pandas.concat([r.to_dataframe() for r in results])`."""
        import pandas

        return pandas.DataFrame([self.figures()])

    @property
    def final_loss(self) -> float | None:
        """The last logged training loss."""
        return self.loss_history[-1][1] if self.loss_history else None

    def _model_config(self) -> PretrainedConfig:
        """The trained model's transformers config (held, or read from `output_dir`)."""
        if self.held_model is not None:
            return self.held_model.config
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.output_dir)

    def _auto_class(self) -> str:
        """The transformers Auto class the trained model loads with: the task's
        (`Task.auto_class_for` of the model's config, which speech recognition reads:
        `AutoModelForCTC` or, for Whisper, `AutoModelForSpeechSeq2Seq`)."""
        task = TASKS[self.task]
        config = self.held_model.config if self.held_model is not None else None
        if (config is None and self.output_dir is not None
                and os.path.isfile(os.path.join(self.output_dir, "config.json"))):
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(self.output_dir)
        return task.auto_class_for(config) if config is not None else task.auto_class

    def load_model(self, merge: bool = True, **kwargs: Any):
        """The trained model, loaded on the CPU in this process (the XLA runtime stays off).

        Args:
            merge: for a LoRA run: True (default) the merged model, an ordinary model;
                False the base with the adapter from `output_dir/adapter` (a `PeftModel`).
            kwargs: passed to `from_pretrained` of the task's Auto class (`Task.auto_class`:
                `AutoModelForSequenceClassification`, `AutoModelForCausalLM`, ...).
        """
        auto_class = self._auto_class()  # the task's own model class
        if self.held_model is not None and merge:
            return self.held_model.model(auto_class)
        if self.output_dir is None:
            raise FileNotFoundError("this run saved no model (output_dir was None).")
        import transformers

        with quiet_loading():  # no "Loading weights 100% 21/21" bar left in the cell
            if self.lora and not merge:
                from .lora import load_adapter_model

                return load_adapter_model(self.output_dir, getattr(transformers, auto_class),
                                          **kwargs)
            return getattr(transformers, auto_class).from_pretrained(self.output_dir, **kwargs)

    # -- warm between cells --

    @property
    def warm(self) -> bool:
        """Whether the trained model is on the devices now, in this result's warm session."""
        return self.session is not None and not self.session.closed and self.session.alive

    def release(self) -> None:
        """Free the devices and their memory: the warm session holding the model ends (the
        saved model stays; the next `predict` or `generate` starts a worker again). Prints
        what it freed; nothing when the model was not warm."""
        if self.session is None:
            return
        if self.warm:
            info = self.session.info()
            memory = "" if info.memory is None else f" ({info.memory / 2**30:.1f} GiB)"
            print(f"hfxla_nb: released the {info.name}: {info.devices} device"
                  f"{'' if info.devices == 1 else 's'} and their memory{memory} are free.")
        self.session.close()

    def evaluate(self, dataset: Any, batch_size: int | None = None,
                 progress: bool | str = "auto") -> dict[str, float]:
        """The task's evaluation metrics of the trained model on `dataset` (rows with the
        columns the run trained on), computed as `fine_tune` computes them after training.

        Runs in the warm session: no process, no load, no compile for a batch shape seen.

        Args:
            dataset: what `fine_tune` takes for data (a `Dataset`, a DataFrame, a list of
                dicts, a file, ...): every row is evaluated.
            batch_size: rows per batch (default the run's).
            progress: the run's panel ("auto", False, ...).

        Raises:
            FineTuneError: the model is not warm (its session was released or closed: use
                `fine_tune` again, or `hx.predict` with the saved folder), or the data
                cannot be encoded as the run's was.
        """
        from .worker import warm

        if not self.warm:
            raise FineTuneError(
                "evaluate() runs on the model a fine_tune left warm on the devices, and this "
                "result's model is not warm (released, closed by a later launch, or trained "
                "outside a notebook: fine_tune(..., keep_warm=True) keeps it).")
        plan = evaluation_plan(self, dataset, batch_size)
        value, _ = self.session.call(warm.evaluate, (plan,), progress=progress)
        return value

    def generate(self, prompts: str | list[str] | None = None,
                 max_new_tokens: int | None = None, *, messages: Any = None,
                 generation_config: Any = None, bucket: int = 16, stream: bool = False,
                 device: str = "xla", progress: bool | str = "auto",
                 **options: Any) -> list[str] | list[list[str]]:
        """Continue each prompt with the fine-tuned causal LM: `hx.generate`'s decoding and
        arguments, greedy by default.

        On the devices: in the warm session when the model is warm (no process, no load; two
        graphs per prompt bucket, compiled once for the session), else in a launched worker
        that loads the saved model. `device="cpu"` decodes on the CPU in this process
        instead (the XLA runtime stays off; the same tokens); so does a model held in
        memory (its save failed).

        Args:
            prompts: a prompt or a list of prompts (for models trained on pairs, the prompt
                side of the template, e.g. `template.split("{response}")[0].format(prompt=p)`).
            max_new_tokens: at most this many tokens per prompt (default: the generation
                config's, else 32).
            messages: instead of prompts, chat turns rendered by the tokenizer's chat template.
            generation_config: a `transformers.GenerationConfig` (default: the model's own).
            bucket: prompts are padded on the left to a multiple of this, as on XLA.
            stream: print each row's new text every `check_every` tokens and at the end,
                as `hx.generate`'s launch prints it (default False here).
            device: "xla" (the devices) or "cpu" (this process).
            progress: the run's panel on the devices ("auto", False, ...).
            options: `do_sample`, `temperature`, `top_k`, `top_p`, `min_p`,
                `repetition_penalty`, `num_return_sequences`, `seed`, `eos_token_id`,
                `stop_strings`, `check_every` (`docs/tasks.md`).

        Returns:
            The new text of each prompt, without the prompt (a list of texts per prompt when
            `num_return_sequences` > 1).

        Raises:
            GenerationError: an option or a prompt that cannot work, before the model loads.
        """
        if not self.generates:
            raise ValueError("generate() is for causal-LM results; this run was a "
                             f"{self.task} fine-tune (use load_model() and predict).")
        if device not in ("xla", "cpu"):
            raise ValueError(f"device={device!r}: pass 'xla' (the devices) or 'cpu'.")
        import torch

        from .config import check_room, model_generation_config, prompt_rows, resolve_options
        from .preparation import position_limit
        from .worker.generation import (
            Streamer,
            cpu_hooks,
            generate_rows,
            left_padded,
            print_generated,
            shown_prompts,
            texts_of,
        )

        tokenizer = self.load_tokenizer()
        config = generation_config or (model_generation_config(self.output_dir)
                                       if self.output_dir else None)
        settings = resolve_options(tokenizer, config, max_new_tokens, **options)
        rows = prompt_rows(tokenizer, prompts, messages)
        # Refused here, before any worker runs (the worker checks again, as on the CPU).
        _, _, length = left_padded(tokenizer, rows, bucket, settings.num_return_sequences)
        check_room(rows, length, settings, position_limit(self._model_config()))
        if device == "xla" and self.warm:
            from .worker import warm

            texts, _ = self.session.call(
                warm.generate, (rows, settings, bucket, stream, shown_prompts(prompts)),
                progress=progress)
            return texts
        if device == "xla" and self.output_dir is not None:
            from ..launch import LaunchOptions, launch
            from .preparation import device_count
            from .worker.generation import generate as on_device

            worker = functools.partial(on_device, self.output_dir, prompts, max_new_tokens,
                                       messages=messages, generation_config=config,
                                       bucket=bucket, stream=stream, **options)
            texts, _ = launch(worker, (), LaunchOptions(
                num_processes=device_count(None), strategy="spmd", progress=progress))
            return texts
        model = self.load_model()
        model.eval()
        streamer = Streamer(tokenizer, settings, print_generated) if stream else None
        with torch.no_grad():
            decoded = generate_rows(model, tokenizer, rows, settings, bucket,
                                    cpu_hooks(tokenizer, streamer))
        if streamer is not None:
            streamer.send(decoded.tokens[:, :decoded.steps].tolist(), decoded.steps, done=True)
        return texts_of(tokenizer, decoded.tokens, settings, len(rows))

    def predict(self, inputs: Any, batch_size: int | None = None, **options: Any) -> Any:
        """Predict with the fine-tuned model on every XLA device, in a launched worker, with
        evaluation's post-processing (`hx.predict`; `help(hx.predict)` for the options).

        Returns:
            `Predictions`: one plain-Python dict per input, and `to_dataframe()`.
        """
        from .predict import predict

        return predict(self, inputs, batch_size=batch_size, **options)

    def load_processor(self, **kwargs: Any):
        """What the inputs were encoded with, saved next to the model: the tokenizer of a text
        model, the image processor of an image model, the feature extractor (or processor) of
        an audio model (`processor` says which)."""
        if self.processor in (None, "tokenizer"):
            return self.load_tokenizer(**kwargs)
        if self.held_model is not None and self.held_model.tokenizer is not None:
            return self.held_model.tokenizer
        if self.output_dir is None:
            raise FileNotFoundError(f"this run saved no {self.processor} (output_dir was None).")
        import transformers

        auto = {"image processor": "AutoImageProcessor",
                "feature extractor": "AutoFeatureExtractor"}.get(self.processor, "AutoProcessor")
        return getattr(transformers, auto).from_pretrained(self.output_dir, **kwargs)

    def load_tokenizer(self, **kwargs: Any):
        """The tokenizer saved next to the model."""
        if self.held_model is not None and self.held_model.tokenizer is not None:
            return self.held_model.tokenizer
        if self.output_dir is None:
            raise FileNotFoundError("this run saved no tokenizer (output_dir was None).")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.output_dir, **kwargs)

    def __repr__(self) -> str:
        # Counts (eval_rows, eval_tokens) whole, however large; other values to 4 digits.
        metrics = ", ".join(f"{k}={int(v)}" if float(v).is_integer() else f"{k}={v:.4g}"
                            for k, v in self.metrics.items())
        return (f"<FineTuneResult: {self.steps} steps, {metrics or 'no evaluation'}, "
                f"saved to {self.output_dir or self._unsaved()}>")

    def _unsaved(self) -> str:
        return "memory (result.save(folder) writes it)" if self.held_model else "None"


# -- evaluate: new data encoded as the run's --

def evaluation_plan(result: FineTuneResult, dataset: Any,
                    batch_size: int | None = None) -> TrainPlan:
    """What `FineTuneResult.evaluate` runs on the warm model: `dataset` encoded as the run
    encoded its evaluation data (its columns, lengths, labels and metrics; the saved model's
    tokenizer and config), without training, saving or tracking.

    Raises:
        FineTuneError: the run's settings are not known (a result loaded from its folder), or
            the data cannot be encoded as the run's was (the message says why).
    """
    if result.config is None or result.output_dir is None:
        raise FineTuneError("evaluate() needs the run's settings and its saved folder: "
                            "evaluate the result fine_tune returned in this kernel.")
    config = dataclasses.replace(
        result.config, task=result.task, eval_dataset=dataset, output_dir=None,
        overwrite_output_dir=False, resume_from_checkpoint=None, max_steps=1,
        batch_size=batch_size or result.config.batch_size, gradient_accumulation_steps=1,
        eval_strategy="no", eval_steps=None, load_best_model_at_end=False,
        metric_for_best_model=None, callbacks=(), report_to=None, push_to_hub=False,
        keep_warm=False, lora=False, tokenizer=None, num_processes=result.devices)
    from .prepare import prepare_fine_tune

    plan = prepare_fine_tune(result.output_dir, dataset, config)
    plan.keep_warm = False
    return plan
