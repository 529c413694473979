"""The model card of a pushed fine-tune: `huggingface_hub`'s `ModelCard` with its
`ModelCardData` (README.md's YAML metadata) and a short text.

`provenance` is written in the kernel before the fork (`prepare_fine_tune`) and rides on the
result (`FineTuneResult.provenance`, also in the run summary): the base model, the data by
name or by shape, the training settings, the hardware and hfxla_nb's version. `model_card`
adds what the run did: metrics, steps, graphs compiled.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._version import __version__
from .._words import is_count, plural
from .tasks.registry import TASKS

if TYPE_CHECKING:
    from .config import FineTuneConfig


class FineTuneRun(Protocol):
    """What the card and the push read of a `FineTuneResult` (a Protocol, so that this module
    and `hub.py` do not import `result.py`, which imports them)."""

    output_dir: str | None
    held_model: Any
    hub_url: str | None
    provenance: dict[str, Any]
    task: str
    task_title: str | None
    metrics: dict[str, float]
    notes: list[str]
    steps: int
    epochs: float
    devices: int
    strategy: str
    precision: str
    sharding: str
    compiles: int
    eval_compiles: int
    setup_compiles: int
    bucket_lengths: list[int]
    train_seconds: float
    samples_per_second: float | None
    lora: dict[str, Any] | None

#: The settings of `FineTuneConfig` that the card lists (plain values only).
SETTINGS = ("learning_rate", "epochs", "max_steps", "batch_size", "gradient_accumulation_steps",
            "weight_decay", "warmup_steps", "max_grad_norm", "max_length", "precision",
            "strategy", "sharding", "gradient_checkpointing", "seed")


def hub_name(value: Any) -> str | None:
    """`value` when it names something on the Hub ("org/name", "name") rather than a local
    file or folder; else None."""
    if not isinstance(value, (str, os.PathLike)):
        return None
    name = os.fspath(value)
    local = os.path.exists(os.path.expanduser(name)) or name.startswith((".", "~", "/"))
    return None if local or not name or name.count("/") > 1 else name


def provenance(model: Any, dataset: Any, config: FineTuneConfig, columns: list[str],
               rows: Mapping[str, int], hardware: str) -> dict[str, Any]:
    """Where a run's model comes from, as plain (JSON) data for its model card.

    Args:
        model: `fine_tune`'s model argument (a Hub id, a folder, an instance).
        dataset: its dataset argument (a Hub name is kept; other data by shape only).
        config: the run's options.
        columns: the training data's columns.
        rows: rows per split ({"train": 960, "validation": 120}).
        hardware: the accelerator in one line (`Accelerator.description`).
    """
    config_name = getattr(getattr(model, "config", None), "_name_or_path", None)
    return {
        "base_model": hub_name(model) or hub_name(config_name),
        "dataset": hub_name(dataset),
        "columns": list(columns),
        "rows": {name: int(count) for name, count in rows.items()},
        "settings": {name: getattr(config, name) for name in SETTINGS},
        "hardware": hardware,
        "hfxla_nb_version": __version__,
    }


def _metadata(result: FineTuneRun, repo_id: str) -> dict[str, Any]:
    """The card's own block of the YAML metadata (`hfxla_nb:`): what ran and how."""
    facts = result.provenance
    return {
        "version": facts.get("hfxla_nb_version", __version__),
        "task": result.task,
        "hardware": facts.get("hardware"),
        "devices": result.devices,
        "strategy": result.strategy,
        "precision": result.precision,
        "sharding": result.sharding,
        "graphs_compiled": {"training": result.compiles, "evaluation": result.eval_compiles,
                            "setup": result.setup_compiles},
        "training": {**facts.get("settings", {}), "steps": result.steps,
                     "epochs": result.epochs, "bucket_lengths": list(result.bucket_lengths),
                     "train_seconds": round(result.train_seconds, 2),
                     "samples_per_second": result.samples_per_second},
        "data": {"name": facts.get("dataset"), "columns": facts.get("columns", []),
                 "rows": facts.get("rows", {})},
        "metrics": dict(result.metrics),
        "lora": result.lora,
        "repo_id": repo_id,
    }


def card_data(result: FineTuneRun, repo_id: str) -> Any:
    """The card's `ModelCardData`: base model, data, task, metrics (as `model-index`), tags,
    and hfxla_nb's block."""
    from huggingface_hub import EvalResult, ModelCardData

    facts = result.provenance
    task = TASKS.get(result.task)
    pipeline = (task.pipeline_tag if task is not None else "") or None
    dataset = facts.get("dataset")
    rows = facts.get("rows", {}).get("train")
    described = dataset or (f"local data ({rows} training rows)" if rows else "local data")
    scores = {name: value for name, value in result.metrics.items()
              if not is_count(name, value)}
    evals = [EvalResult(task_type=pipeline or result.task, dataset_type=dataset or "local",
                        dataset_name=described, metric_type=name.removeprefix("eval_"),
                        metric_value=float(value)) for name, value in scores.items()]
    tags = ["hfxla_nb", "xla", result.task] + (["lora", "peft"] if result.lora else [])
    return ModelCardData(
        base_model=facts.get("base_model"), datasets=[dataset] if dataset else None,
        library_name="transformers", pipeline_tag=pipeline, tags=tags,
        model_name=repo_id.split("/")[-1], eval_results=evals or None,
        hfxla_nb=_metadata(result, repo_id))


def model_card(result: FineTuneRun, repo_id: str) -> str:
    """README.md of the repository: the YAML metadata (`card_data`) and a short text."""
    from huggingface_hub import ModelCard

    data = card_data(result, repo_id)
    facts = result.provenance
    base = facts.get("base_model") or "a local model"
    dataset = facts.get("dataset") or "local data"
    settings = facts.get("settings", {})
    title = result.task_title or result.task
    lines = [
        f"# {repo_id.split('/')[-1]}", "",
        f"{title[:1].upper() + title[1:]} fine-tune of {base} on {dataset}, trained with "
        f"hfxla_nb {facts.get('hfxla_nb_version', __version__)}"
        f" (PyTorch/XLA) on {facts.get('hardware') or plural(result.devices, 'XLA device')}.",
        "", "## Evaluation", "",
        *(_table({name: _shown(name, value) for name, value in result.metrics.items()},
                 "metric") if result.metrics else ["No evaluation data."]), "",
        "## Training", "",
        *_table({"steps": result.steps, "epochs": round(result.epochs, 4),
                 **{name: value for name, value in settings.items() if value is not None},
                 "graphs compiled (training, evaluation)":
                     f"{result.compiles}, {result.eval_compiles}"}, "setting"), "",
        "## Use", "",
        "```python", f"from transformers import {_auto_class(result)}", "",
        f"model = {_auto_class(result)}.from_pretrained({repo_id!r})", "```",
    ]
    if result.lora:
        lines += ["", "The LoRA adapter alone (PEFT's format) is in `adapter/`: "
                  f"`PeftModel.from_pretrained(base, {repo_id!r}, subfolder=\"adapter\")`."]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"))


def _auto_class(result: FineTuneRun) -> str:
    task = TASKS.get(result.task)
    return task.auto_class if task is not None and task.auto_class else "AutoModel"


def _shown(name: str, value: float) -> str:
    """A metric as the result's panel shows it: a count whole, a score to 4 decimals."""
    return f"{int(value):,}" if is_count(name, value) else f"{value:.4f}"


def _table(values: Mapping[str, Any], heading: str) -> list[str]:
    """A two-column markdown table: `heading` and value."""
    return [f"| {heading} | value |", "|---|---|",
            *(f"| {name} | {value} |" for name, value in values.items())]
