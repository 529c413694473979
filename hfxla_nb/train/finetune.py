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
forks the worker (`worker/loop.py`). docs/architecture.md tells how the shapes stay fixed.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from ..launch import LaunchOptions, launch
from ..launch.notices import show_memory_plan
from ..launch.preflight import check_backend
from .config import FineTuneConfig
from .hub import push_after_training
from .kernel.hub import check_hub
from .kernel.prepare import prepare_fine_tune
from .kernel.sources import claim_output_dir, release_output_dir
from .result import FineTuneResult
from .tracking import fine_tune_tracker, finish_tracker
from .worker.loop import train_worker


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
    config = FineTuneConfig.build(config, options)
    check_backend(config.strategy)  # no torch_xla (TorchTPU only): refused before any work
    plan = prepare_fine_tune(model, dataset, config)  # refuses lora= for tasks without it
    hub = check_hub(config, plan.output_dir)  # push_to_hub: the token and the Hub, now
    if config.output_dir == "auto":  # every check passed: the run's new folder is its own now
        plan.output_dir = claim_output_dir(plan.output_dir)
    progress = "auto" if config.progress is True else config.progress
    memory = dataclasses.asdict(plan.memory) if plan.memory is not None else None
    notice = show_memory_plan(plan.memory, progress)  # the plan in the cell before the fork
    tracker = fine_tune_tracker(config, plan)  # report_to= (train/tracking.py)
    try:
        raw, record = launch(train_worker, (plan,), LaunchOptions.with_defaults(
            num_processes=config.num_processes, strategy=config.strategy, progress=progress,
            timeout=config.timeout, trace_compiles=config.trace_compiles,
            compile_cache=config.compile_cache, cluster=cluster, hosts=hosts), tracker=tracker)
    except BaseException:
        if tracker is not None:
            tracker.close(failed=True)
        if config.output_dir == "auto":
            release_output_dir(plan.output_dir)  # a failed run leaves no empty folder behind
        raise
    finally:
        if notice is not None:
            notice.close()
    result = FineTuneResult.from_dict(raw)
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
