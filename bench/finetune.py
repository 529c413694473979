"""Training throughput: `hfxla_nb.fine_tune` vs `transformers.Trainer` vs a hand-written loop.

Run with `make bench` (or `PJRT_DEVICE=CPU python bench/finetune.py`). Same tiny BERT
(`hfxla_nb.demo`), same data, batch, fixed padding, optimizer (AdamW, linear decay, gradient
clipping at 1.0) and device (one XLA device) for the three; each run is a fresh forked worker
(`hfxla_nb.notebook_launcher`), and the three alternate, `--repeats` times (medians reported),
so a slow moment of a shared machine hits all of them alike.

Measured after `--warmup` steps (the compiling ones): samples per second of the training
loop, graph compilations in the whole run, and graph executions and device-to-host transfers
per steady step, from `torch_xla.debug.metrics`.

- fine_tune: `hfxla_nb.fine_tune(..., max_length=L, eval_dataset=None, output_dir=None)`,
  its own steady-state figures.
- Trainer: `TrainingArguments(optim="adamw_torch", logging_steps=1, ...)`, inputs padded to
  L, timed by a callback from the end of the warm-up step to the end of training.
- hand-written: best-practice torch_xla: `MpDeviceLoader` (uploads in a background thread,
  one `torch_xla.sync()` per step), loss fetched in a step closure every 10 steps, no
  `.item()` in the loop. transformers unpatched, as a user would have it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

METHODS = ("fine_tune", "Trainer", "hand-written")
COUNTED = ("CompileTime", "ExecuteTime", "ExecuteReplicatedTime", "TransferFromDeviceTime")


def _counts():
    from hfxla_nb import _xla

    return _xla.metric_counts(COUNTED)


def _figures(start: dict, steady: dict, end: dict, steps: int, seconds: float, batch: int):
    executions = sum(end[k] - steady[k] for k in ("ExecuteTime", "ExecuteReplicatedTime"))
    return {
        "samples_per_second": steps * batch / seconds,
        "compiles": end["CompileTime"] - start["CompileTime"],
        "executions_per_step": executions / steps,
        "transfers_per_step": (end["TransferFromDeviceTime"] - steady["TransferFromDeviceTime"])
        / steps,
    }


def _tokenized(config: dict):
    from hfxla_nb.demo import demo_dataset, demo_tokenizer

    tokenizer = demo_tokenizer()
    train = demo_dataset(n=config["rows"])["train"]
    encoded = tokenizer(
        list(train["text"]), padding="max_length", truncation=True,
        max_length=config["max_length"], return_tensors="pt",
    )
    import torch

    encoded["labels"] = torch.tensor(list(train["label"]))
    return encoded


def _schedule(optimizer, total: int):
    import torch

    def linear(step: int) -> float:  # transformers' "linear" schedule without warm-up
        return max(0.0, (total - step) / total)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, linear)


def run_trainer(config: dict) -> dict:
    """transformers.Trainer, as the brief asks: adamw_torch, logging_steps=1, fixed padding."""
    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from hfxla_nb import _xla
    from hfxla_nb.demo import demo_model_dir

    encoded = _tokenized(config)
    dataset = Dataset.from_dict({key: value.tolist() for key, value in encoded.items()})
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(demo_model_dir())
    marks = {}

    class Timer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            marks["start"] = _counts()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == config["warmup"]:
                _xla.wait_device_ops()
                marks["steady"] = _counts()
                marks["time"] = time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):
            _xla.wait_device_ops()
            marks["end_time"] = time.perf_counter()
            marks["end"] = _counts()

    args = TrainingArguments(
        output_dir="/tmp/hfxla_nb_bench_trainer",
        per_device_train_batch_size=config["batch_size"],
        max_steps=config["steps"],
        learning_rate=config["learning_rate"],
        optim="adamw_torch",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_drop_last=True,
        seed=0,
    )
    Trainer(model, args, train_dataset=dataset, callbacks=[Timer()]).train()
    steps = config["steps"] - config["warmup"]
    return _figures(marks["start"], marks["steady"], marks["end"], steps,
                    marks["end_time"] - marks["time"], config["batch_size"])


def run_hand_written(config: dict) -> dict:
    """Best-practice torch_xla loop: MpDeviceLoader, one sync per step, loss every 10 steps."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    from transformers import AutoModelForSequenceClassification

    from hfxla_nb import _xla
    from hfxla_nb.demo import demo_model_dir

    encoded = _tokenized(config)
    device = torch_xla.device()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(demo_model_dir()).to(device)
    model.train()
    # weight_decay=0.0 like fine_tune's and Trainer's default (torch's AdamW defaults to 0.01,
    # and on XLA its per-step `param.mul_(1 - lr * wd)` alone made steps 2x slower here).
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["learning_rate"],
                                  weight_decay=0.0)
    scheduler = _schedule(optimizer, config["steps"])
    dataset = torch.utils.data.TensorDataset(
        encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"],
        encoded["labels"],
    )
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True,
                                             num_samples=config["steps"] * config["batch_size"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=config["batch_size"],
                                         sampler=sampler, drop_last=True)
    losses = []
    start = _counts()
    steady = steady_time = None
    for step, (ids, types, mask, labels) in enumerate(pl.MpDeviceLoader(loader, device), 1):
        logits = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            xm.add_step_closure(lambda value: losses.append(value.item()), (loss,))
        if step == config["warmup"]:
            torch_xla.sync()
            _xla.wait_device_ops()
            steady, steady_time = _counts(), time.perf_counter()
    torch_xla.sync()
    _xla.wait_device_ops()
    seconds = time.perf_counter() - steady_time
    return _figures(start, steady, _counts(), config["steps"] - config["warmup"], seconds,
                    config["batch_size"])


def run_fine_tune(config: dict) -> dict:
    import hfxla_nb as hx
    from hfxla_nb.demo import demo_dataset, demo_model_dir

    result = hx.fine_tune(
        demo_model_dir(),
        demo_dataset(n=config["rows"])["train"],
        max_length=config["max_length"],
        max_steps=config["steps"],
        batch_size=config["batch_size"],
        learning_rate=config["learning_rate"],
        strategy=config["strategy"],
        output_dir=None,
        progress=False,
        log_every=10,
    )
    return {
        "samples_per_second": result.samples_per_second,
        "compiles": result.compiles,
        "executions_per_step": result.executions_per_step,
        "transfers_per_step": result.transfers_per_step,
    }


def _launched(function, config: dict) -> dict:
    import hfxla_nb as hx

    def work(index):
        return function(config)

    return hx.notebook_launcher(work, progress=False, strategy="replicated", num_processes=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--strategy", default="spmd", help="fine_tune's strategy")
    args = parser.parse_args(argv)
    config = {
        "rows": 3000, "steps": args.steps, "warmup": args.warmup,
        "batch_size": args.batch_size, "max_length": args.max_length, "learning_rate": 1e-4,
        "strategy": args.strategy,
    }
    from hfxla_nb.demo import demo_model_dir

    demo_model_dir()  # build the cached model before timing anything
    runners = {
        "fine_tune": lambda: run_fine_tune(config),
        "Trainer": lambda: _launched(run_trainer, config),
        "hand-written": lambda: _launched(run_hand_written, config),
    }
    results: dict[str, list[dict]] = {method: [] for method in METHODS}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for method in METHODS:
            figures = runners[method]()
            results[method].append(figures)
            print(f"[{repeat + 1}/{args.repeats}] {method:<12} "
                  f"{figures['samples_per_second']:8.1f} samples/s", flush=True)

    def median(method: str, key: str) -> float:
        return statistics.median(r[key] for r in results[method])

    reference = median("fine_tune", "samples_per_second")
    print()
    print(f"Tiny BERT (2 layers, hidden 64), batch {args.batch_size}, padded to "
          f"{args.max_length}, {args.steps} steps ({args.warmup} warm-up), one XLA device "
          f"({os.environ.get('PJRT_DEVICE')}); medians of {args.repeats} alternating runs; "
          f"fine_tune strategy={args.strategy}.")
    print()
    print("| method | samples/s | fine_tune speed-up | compiles | executions/step | "
          "transfers/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for method in METHODS:
        speed = median(method, "samples_per_second")
        print(f"| {method} | {speed:.1f} | {reference / speed:.2f}x | "
              f"{median(method, 'compiles'):.0f} | {median(method, 'executions_per_step'):.2f} | "
              f"{median(method, 'transfers_per_step'):.2f} |")
    print()
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
