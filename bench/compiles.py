"""Group 3: graphs compiled on texts of varied lengths (1 to 4 of the demo's reviews joined,
`workloads.varied_rows`), `STEPS` training steps and one evaluation: `fine_tune` with its
length buckets vs `transformers.Trainer` with its default collator (padding per batch) vs
Trainer with every row padded to the longest (truncated at the model's 128 positions).
Counts are deterministic: one run each, compiled with XLA's backend optimizations off
(`common.unoptimized_compiles`: the same graphs, compiled faster).
"""

from __future__ import annotations

from typing import Any

from . import common, workloads

GROUP = "3 compiles"
STEPS, TRAIN_ROWS, EVAL_ROWS, BATCH = 8, 320, 48, 16


def count_fine_tune(model: str, steps: int = STEPS, train_rows: int = TRAIN_ROWS,
                    eval_rows: int = EVAL_ROWS, batch: int = BATCH) -> dict[str, Any]:
    """Graphs `fine_tune` compiled for training and evaluation, and its length buckets."""
    import hfxla_nb as hx

    result = hx.fine_tune(model, workloads.varied_rows(train_rows),
                          eval_dataset=workloads.varied_rows(eval_rows, "validation"),
                          max_steps=steps, batch_size=batch, output_dir=None, progress=False)
    buckets = len(result.bucket_lengths)
    return {"train": result.compiles, "eval": result.eval_compiles, "buckets": buckets,
            "lengths": list(result.bucket_lengths),
            "train_per_bucket": result.compiles / buckets,
            "eval_per_bucket": result.eval_compiles / buckets}


def count_trainer(model: str, dynamic: bool, steps: int = STEPS, train_rows: int = TRAIN_ROWS,
                  eval_rows: int = EVAL_ROWS, batch: int = BATCH) -> dict[str, Any]:
    """Graphs Trainer compiled for `steps` training steps and one `evaluate()`: rows padded
    per batch by its default collator (`dynamic`), or all padded to the longest row."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = list(workloads.varied_rows(train_rows)["text"])
    longest = min(max(len(ids) for ids in tokenizer(texts)["input_ids"]),
                  tokenizer.model_max_length)
    padding = False if dynamic else "max_length"
    config = {"model": model, "batch_size": batch, "warmup": 1, "steps": steps,
              "dynamic": dynamic,
              "data": workloads.tokenized(model, train_rows, longest, padding, varied=True),
              "eval": workloads.tokenized(model, eval_rows, longest, padding, "validation",
                                          varied=True)}
    figures = workloads.launched(workloads.run_trainer, config)
    return {"train": figures["train_compiles"], "eval": figures["eval_compiles"],
            "longest": longest}


def run() -> list[common.Figure]:
    model = workloads.tiny_bert()
    with common.unoptimized_compiles():
        ft = count_fine_tune(model)
        common.say(f"  fine_tune: {ft}")
        dynamic = count_trainer(model, dynamic=True)
        common.say(f"  Trainer, default collator: {dynamic}")
        padded = count_trainer(model, dynamic=False)
        common.say(f"  Trainer, padded to the longest: {padded}")
    setting = (f"tiny BERT, {STEPS} training steps of {BATCH} + one evaluation of {EVAL_ROWS} "
               f"rows; {common.UNOPTIMIZED_NOTE}")
    buckets = f"{ft['buckets']} buckets ({', '.join(map(str, ft['lengths']))} tokens)"
    return [
        common.target_figure(GROUP, "fine_tune training graphs per bucket", ft["train_per_bucket"],
                             "<=", 1, "graphs", 1, f"{ft['train']} in all, {buckets}; {setting}"),
        common.target_figure(GROUP, "fine_tune evaluation graphs per bucket",
                             ft["eval_per_bucket"], "<=", 1, "graphs", 1,
                             f"{ft['eval']} in all; 1 run"),
        common.Figure(GROUP, "Trainer, default collator (padding per batch): training graphs",
                      dynamic["train"], "graphs", note=f"{setting}; 1 run"),
        common.Figure(GROUP, "Trainer, default collator: evaluation graphs", dynamic["eval"],
                      "graphs", note="1 run"),
        common.Figure(GROUP, "Trainer padded to the longest row: training graphs",
                      padded["train"], "graphs",
                      note=f"padded to {padded['longest']} tokens; 1 run"),
        common.Figure(GROUP, "Trainer padded to the longest row: evaluation graphs",
                      padded["eval"], "graphs", note="1 run"),
    ]
