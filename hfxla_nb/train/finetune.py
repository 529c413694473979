"""`fine_tune`: fine-tune a Hugging Face model on every XLA device, in one call, for any
registered task (classification, causal-lm, token-classification, question-answering,
masked-lm, multiple-choice, seq2seq).

```python
result = hx.fine_tune("bert-base-cased", dataset, text_column="text", label_column="label")
result.metrics          # {'eval_accuracy': ..., 'eval_loss': ...}
model = result.load_model()
result = hx.fine_tune(llama, pairs, prompt_column="prompt", response_column="response")
result.generate("A prompt")                    # task "causal-lm", from the architecture
```

In the kernel `prepare_fine_tune` checks and tokenizes everything; then `notebook_launcher`
forks the worker (`worker/loop.py`). docs/fine-tune.md ("What one call does") tells how the
shapes stay fixed.

With `report_to=`, the run's tracker (`observe.tracking.Tracker`) follows the launch's events
in the notebook process, as the panels do, and gets the run's hyper-parameters and final
figures; the worker sends nothing more for it.

Warnings are attributed to the user's call, not to hfxla_nb's internals (`warn_user`). A fixed
`stacklevel` would point at whichever of our functions sits there; here the level is counted
to the first frame outside Python, installed packages and hfxla_nb: the line the user can
change.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import time
import warnings
from typing import Any

from ..launch import LaunchOptions, launch
from ..launch.launcher import show_memory_plan, show_preparing
from ..launch.preflight import check_backend
from ..launch.sessions import Session
from ..observe.tracing import is_library
from ..observe.tracking import (
    HParam,
    Tracker,
    TrackingSettings,
    check_report_to,
    default_log_dir,
    plain,
)
from ..runtime.environment import in_notebook, one_call
from .config import FineTuneConfig, FineTuneError
from .flow import take_back
from .hub import check_hub, push_after_training
from .memory import MemoryPlan
from .plan import TrainPlan
from .preparation import claim_output_dir, release_output_dir
from .prepare import prepare_fine_tune
from .result import FineTuneResult
from .worker.loop import train_worker
from .worker.saving import RUNS

# -- report_to=: the run's tracker, its hyper-parameters, its final figures --

#: The result's figures written when the run ends, as `final/<name>`.
FINAL_FIGURES = ("samples_per_second", "samples_per_second_overall", "executions_per_step",
                 "transfers_per_step", "uploads_per_step", "compiles", "eval_compiles",
                 "setup_compiles", "train_seconds", "eval_seconds")


def fine_tune_tracker(config: FineTuneConfig, plan: TrainPlan) -> Tracker | None:
    """The run's tracker (None without `report_to`): TensorBoard's files in `log_dir`, else
    `output_dir/runs/<run_name or date-time_host>`; every `FineTuneConfig` field and the
    memory plan as hyper-parameters."""
    names = check_report_to(config.report_to)  # checked when the config was made
    if not names:
        return None
    log_dir = config.log_dir
    if log_dir is None and plan.save:
        log_dir = default_log_dir(os.path.join(plan.output_dir, RUNS), config.run_name)
    return Tracker(TrackingSettings(
        names, os.fspath(log_dir) if log_dir is not None else None, config.project,
        config.run_name, fine_tune_hparams(config, plan.memory)))


def fine_tune_hparams(config: FineTuneConfig, memory: MemoryPlan | None) -> dict[str, HParam]:
    """Every field of `config` by its name, and the memory plan's as `memory/<field>` (its
    changes as one line), as plain values (`observe.tracking.plain`)."""
    values = {field.name: plain(getattr(config, field.name))
              for field in dataclasses.fields(config)}
    if memory is not None:
        for field in dataclasses.fields(memory):
            value: Any = getattr(memory, field.name)
            if field.name == "changes":
                value = "; ".join(f"{change.change}: {change.total_gib:.2f} GiB"
                                  + ("" if change.fits else " (does not fit)")
                                  for change in value)
            values[f"memory/{field.name}"] = plain(value)
    return values


def final_figures(result: FineTuneResult) -> dict[str, float]:
    """What the run measured, for the trackers' last step and summary: the evaluation
    metrics as `eval/<name>` (`eval_accuracy`: `eval/accuracy`), and `final/<figure>` for
    each of `FINAL_FIGURES` the run has."""
    figures: dict[str, float] = {}
    for name, value in (result.metrics or {}).items():
        if _number(value):
            figures["eval/" + (name[5:] if name.startswith("eval_") else name)] = value
    for name in FINAL_FIGURES:
        value = getattr(result, name, None)
        if _number(value):
            figures[f"final/{name}"] = value
    return figures


def finish_tracker(tracker: Tracker | None, result: FineTuneResult) -> None:
    """The run ended: its final figures written at its last step, every tracker closed."""
    if tracker is None:
        return
    try:
        tracker.finish(result.steps, final_figures(result))
    finally:
        tracker.close()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- fine_tune: prepare in the kernel, launch the worker, return the result --

def fine_tune(
    model: Any, dataset: Any, config: FineTuneConfig | None = None, *,
    cluster: str | None = None, hosts: int | None = None, **options: Any
) -> FineTuneResult:
    """Fine-tune a model for one task on every XLA device, from one notebook cell.

    Everything is checked and tokenized in the notebook process first, without starting the
    XLA runtime, then a worker is forked by `notebook_launcher`, trains with fixed shapes
    (a constant handful of compiled graphs), evaluates, and saves the model and tokenizer.

    Args:
        model: a model name on the Hub, a local folder, or a model instance on the CPU. The
            task (`task=`, default "auto") is the one its head names (`...ForCausalLM`: a
            causal language model, on `text_column` or on `prompt_column` /
            `response_column` pairs; `...ForTokenClassification`, `...ForQuestionAnswering`,
            `...ForMultipleChoice`, `...ForConditionalGeneration`: seq2seq), else the one the
            training data's columns name, else classification (loaded with
            `AutoModelForSequenceClassification`, the head sized for the labels). Masked LM
            is asked for by name (`task="masked-lm"`).
        dataset: the training data: a `datasets.Dataset`, a `DatasetDict` (its "train" split;
            "validation" or "test" for evaluation), a dataset name on the Hub, a local file
            or folder, a pandas DataFrame, or a list of dicts.
        config: a `hx.FineTuneConfig`; keyword arguments override its fields.
            Each run saves to a new folder by default (`hfxla_nb_output/<model>-<start
            time>`); a folder you name that holds a saved model is replaced only with
            `overwrite_output_dir=True`.
        cluster: a Ray cluster's address ("host:port", or "auto"): train on `hosts` hosts of
            it, as `notebook_launcher(cluster=, hosts=)` runs a function (docs/pods.md).
        hosts: how many hosts of `cluster` to train on (a v5e-16 slice has 4).
        options: any field of `hx.FineTuneConfig` (`epochs`, `batch_size`, `learning_rate`,
            `max_length`, `output_dir`, `save_steps`, `resume_from_checkpoint`, ...; see
            `help(hx.FineTuneConfig)`).

    Returns:
        `FineTuneResult` with the loss history, evaluation metrics (the task's: accuracy for
        a classifier, loss and perplexity for a causal or masked LM, entity F1, exact match,
        ROUGE or BLEU, ...), throughput, compile and transfer counts, and the output folder
        (`result.load_model()` loads the model on the CPU, `result.predict(inputs)` predicts
        on the devices; for a causal LM `result.generate(prompts)` continues prompts).

    Raises:
        FineTuneError: before anything is forked or written, for any argument or data that
            cannot work (the message says what to change); `DiskSpaceError` when
            `output_dir`'s disk has less free space than the run would write. A final save
            that fails anyway raises nothing: the model goes to a fallback folder (else stays
            in the result), `result.save_error` says so, `result.save(folder)` writes it.
        hfxla_nb.LaunchError: when the worker failed (with its traceback).

    With `push_to_hub=True` the saved folder and a model card go to the Hugging Face Hub
    after the launch (docs/fine-tune.md, "The Hub"); a missing token or an unreachable Hub is
    a `FineTuneError` before anything is forked.

    Example:

    ```python
    >>> from hfxla_nb.demo import demo_dataset, demo_model_dir
    >>> result = hx.fine_tune(demo_model_dir(), demo_dataset(), learning_rate=1e-3,
    ...                       batch_size=32, epochs=2)
    >>> result.metrics["eval_accuracy"] > 0.9
    True
    ```
    """
    # One look at the host for the whole call: the checks, the plan and the launch share it.
    with one_call():
        config = FineTuneConfig.build(config, options)
        if config.keep_warm and (cluster is not None or hosts is not None):
            raise FineTuneError(
                "keep_warm=True holds the model on this host's devices; a cluster=/hosts= run "
                "ends with its workers (pass keep_warm=False).")
        check_backend(config.strategy)  # no torch_xla (TorchTPU only): refused before any work
        progress = "auto" if config.progress is True else config.progress
        preparing, start = show_preparing(progress), time.monotonic()  # never a blank cell
        try:
            plan = prepare_fine_tune(model, dataset, config)  # refuses lora= where unsupported
            hub = check_hub(config, plan.output_dir)  # push_to_hub: the token and the Hub, now
        except BaseException:
            if preparing is not None:  # the refusal is what the cell shows
                preparing.show("", "")
                preparing.close()
            raise
        if config.output_dir == "auto":  # every check passed: the run's new folder is its own now
            plan.output_dir = claim_output_dir(plan.output_dir)
        memory = dataclasses.asdict(plan.memory) if plan.memory is not None else None
        # The plan in the cell before the fork, in the preparing line's place.
        notice = show_memory_plan(plan.memory, progress, preparing, time.monotonic() - start)
        tracker = fine_tune_tracker(config, plan)  # report_to=: the run's tracker, or None
        options = LaunchOptions(
            num_processes=config.num_processes, strategy=config.strategy, progress=progress,
            timeout=config.timeout, trace_compiles=config.trace_compiles,
            compile_cache=config.compile_cache, cluster=cluster, hosts=hosts)
        session = warm_session(config, options, plan)
        try:
            if session is None:
                raw, record = launch(train_worker, (plan,), options, tracker=tracker)
            else:
                raw, record = session.call(train_worker, (plan,), tracker=tracker)
        except BaseException:
            if session is not None:
                session.close()  # it holds no trained model
            if tracker is not None:
                tracker.close(failed=True)
            if config.output_dir == "auto":
                release_output_dir(plan.output_dir)  # a failed run leaves no empty folder behind
            raise
        finally:
            if notice is not None:
                notice.close()
        if session is not None and not raw.pop("warm", False):
            session.close()  # the worker kept nothing
            session = None
        take_back(config.callbacks, raw.pop("callback_states", None))
        result = FineTuneResult.from_dict(raw)
        result.session, result.config = session, config
        raw.pop("held_model", None)  # weights in memory: the result's, not hx.last_launch()'s too
        if result.save_error:  # the run ended, its model elsewhere: said first, in one line
            print(result.save_error, flush=True)
        result.memory_plan = memory
        # what the launch panel showed, as data on the result: this launch's record
        result.launch_seconds = record.duration
        metrics = record.ranks[0].metrics if record.ranks else None
        result.xla = metrics.to_dict() if metrics is not None else {}
        if hub is not None:  # in the kernel, after the atomic save; a failure is a note
            push_after_training(result, hub)
        finish_tracker(tracker, result)
        return result


def warm_session(config: FineTuneConfig, options: LaunchOptions,
                 plan: TrainPlan) -> Session | None:
    """The warm session the run trains in, so that its model stays on the devices
    (`keep_warm`: by default in a notebook kernel, with `strategy="spmd"` on one host); None:
    an ordinary launch, its worker gone with the run."""
    one_host = options.cluster is None and options.hosts is None
    warm = config.keep_warm
    if warm is None:
        warm = in_notebook() and config.strategy == "spmd" and one_host
    if not warm or not one_host:  # keep_warm=True with cluster= was refused before any work
        return None
    plan.keep_warm = True
    folder = os.path.basename((plan.output_dir or "").rstrip(os.sep)) or "not saved"
    name = f"model of fine_tune ({folder})"
    idle = None if isinstance(warm, bool) else float(warm)  # keep_warm=<seconds>
    return Session(options, name=name, idle_timeout=idle, holds_model=True)


def _signature_with_options(function: Any) -> inspect.Signature:
    """`function`'s signature with every `FineTuneConfig` field as a keyword (for shift-tab
    and `help()`); the fields stay written once, in the dataclass."""
    signature = inspect.signature(function)
    fixed = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
    defaults = FineTuneConfig.__dataclass_fields__
    keywords = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                          annotation=f.type)
        for f in dataclasses.fields(FineTuneConfig) if f.name in defaults
    ]
    return signature.replace(parameters=fixed + keywords)


fine_tune.__signature__ = _signature_with_options(fine_tune)  # type: ignore[attr-defined]
prepare_fine_tune.__signature__ = _signature_with_options(prepare_fine_tune)  # type: ignore


# -- warnings attributed to the user's call --

def user_stacklevel(skip: int = 0) -> int:
    """The `stacklevel` for a `warnings.warn` made `skip` frames above the caller of this
    function that points at the first frame of the user's code (the outermost frame when the
    whole stack is library code)."""
    frame, level = sys._getframe(1 + skip), 1
    while frame.f_back is not None and is_library(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn(message, category)`, shown at the user's line that led here."""
    # +1 for this function's own frame, between warnings.warn and its caller.
    warnings.warn(message, category, stacklevel=user_stacklevel(skip=1) + 1)
