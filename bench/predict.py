"""Prediction throughput: `hx.predict` (a launched worker, the batch sharded over 4 virtual
XLA:CPU devices, one graph per bucket) against `transformers.pipeline(...)` on the CPU in the
kernel, same model, same inputs, per task; the ratio in one invocation. Question answering
and multiple choice have no pipeline in transformers 5: their CPU side is a forward loop of
32 rows a batch (question answering: the same windows, decoded by the same rules); causal-lm
generates `NEW_TOKENS` tokens per prompt, greedily, on both sides.

`python -m bench.predict [--rows N] [--tasks classification,token-classification,...]` prints
one JSON object per task: rows/s of each side (predict's time in the worker, model loading and
the launch left out, as the pipeline's construction is), the ratio, predict's compiles, and
whether both sides agree on the labels.
"""

from __future__ import annotations

import argparse
import json
import time

from . import common

TASKS = ("classification", "token-classification", "question-answering", "multiple-choice",
         "causal-lm")
#: Tokens generated per prompt (causal-lm).
NEW_TOKENS = 16


def _inputs(task: str, rows: int) -> tuple[str, list, str]:
    """(model folder, inputs, pipeline task name)."""
    from hfxla_nb import demo, demo_tasks

    if task == "classification":
        return demo.demo_model_dir(), demo.demo_texts(rows)[0], "text-classification"
    if task == "token-classification":
        texts = [" ".join(r["tokens"]) for r in demo_tasks.ner_rows(rows)]
        return demo_tasks.ner_model_dir(), texts, "token-classification"
    if task == "multiple-choice":  # transformers has no pipeline: a CPU forward loop instead
        swag = [{k: v for k, v in r.items() if k != "label"} for r in demo_tasks.mc_rows(rows)]
        return demo_tasks.mc_model_dir(), swag, "multiple-choice"
    if task == "causal-lm":
        from hfxla_nb.demo_lm import TEMPLATE, demo_lm_model_dir

        prompts = [TEMPLATE.format(prompt=t, response="").rstrip()
                   for t in demo.demo_texts(rows)[0]]
        return demo_lm_model_dir(), prompts, "text-generation"
    qa = [{"question": r["question"], "context": r["context"]}
          for r in demo_tasks.qa_rows(rows, unanswerable=0.0)]
    return demo_tasks.qa_model_dir(), qa, "question-answering"


def _question_answering_on_cpu(folder: str, rows: list[dict], length: int = 384) -> list[dict]:
    """Each question's answer: the model on the CPU over the same windows (stride a quarter of
    the length), 32 windows a batch, decoded by the rules `predict` uses (transformers 5 has
    no question-answering pipeline)."""
    import numpy as np
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from hfxla_nb.train.question_answering import best_answer, encode_examples

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForQuestionAnswering.from_pretrained(folder).eval()
    contexts = [r["context"] for r in rows]
    encoded, _, mapping, offsets = encode_examples(
        tokenizer, [r["question"] for r in rows], contexts, None, length, length // 4)
    starts, ends = [], []
    for begin in range(0, len(mapping), 32):
        batch = {name: encoded[name][begin:begin + 32]
                 for name in ("input_ids", "attention_mask", "token_type_ids") if name in encoded}
        width = max(len(row) for row in batch["input_ids"])
        tensors = {name: torch.tensor([row + [0] * (width - len(row)) for row in values])
                   for name, values in batch.items()}
        with torch.no_grad():
            output = model(**tensors)
        starts += list(output.start_logits.numpy())
        ends += list(output.end_logits.numpy())
    return [best_answer([(starts[f], ends[f], offsets[f]) for f in np.flatnonzero(mapping == i)],
                        context, True) for i, context in enumerate(contexts)]


def _multiple_choice_on_cpu(folder: str, rows: list[dict]) -> list[int]:
    """The chosen ending of each row: the model on the CPU, 32 rows a batch."""
    import torch
    from transformers import AutoModelForMultipleChoice, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForMultipleChoice.from_pretrained(folder).eval()
    chosen = []
    for start in range(0, len(rows), 32):
        batch = rows[start:start + 32]
        firsts = [r["sent1"] for r in batch for _ in range(4)]
        seconds = [f"{r['sent2']} {r[f'ending{k}']}" for r in batch for k in range(4)]
        encoded = tokenizer(firsts, seconds, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**{k: v.view(len(batch), 4, -1) for k, v in encoded.items()}).logits
        chosen += logits.argmax(-1).tolist()
    return chosen


def measure(task: str, rows: int, devices: int = 4) -> dict:
    import transformers

    import hfxla_nb as hx

    folder, inputs, pipeline_task = _inputs(task, rows)
    if pipeline_task not in ("multiple-choice", "question-answering"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        if pipeline_task == "text-generation":
            tokenizer.padding_side = "left"  # batched generation pads prompts on the left
        pipe = transformers.pipeline(pipeline_task, model=folder, tokenizer=tokenizer,
                                     device="cpu")
    start = time.perf_counter()
    if pipeline_task == "multiple-choice":
        reference = _multiple_choice_on_cpu(folder, inputs)
    elif pipeline_task == "text-generation":
        reference = pipe(inputs, batch_size=32, max_new_tokens=NEW_TOKENS, do_sample=False,
                         return_full_text=False)
    elif pipeline_task == "question-answering":
        reference = _question_answering_on_cpu(folder, inputs)
    else:
        reference = pipe(inputs, batch_size=32)
    pipeline_seconds = time.perf_counter() - start
    options = {"max_new_tokens": NEW_TOKENS} if task == "causal-lm" else {}
    out = hx.predict(folder, inputs, task=task, num_processes=devices, progress=False,
                     batch_size=8 * devices, **options)
    agree = None
    if task == "classification":
        agree = sum(p["label"] == r["label"] for p, r in zip(out, reference, strict=True))
    elif task == "multiple-choice":
        agree = sum(p["label"] == r for p, r in zip(out, reference, strict=True))
    elif task == "question-answering":
        agree = sum(p["answer"] == r["answer"] for p, r in zip(out, reference, strict=True))
    return {"task": task, "rows": rows, "devices": devices,
            "predict_rows_per_second": rows / out.seconds,
            "pipeline_rows_per_second": rows / pipeline_seconds,
            "ratio": pipeline_seconds / out.seconds, "predict_compiles": out.compiles,
            "buckets": out.bucket_lengths, "labels_agree": agree}


def main(argv: list[str] | None = None) -> int:
    common.bench_environment()
    parser = argparse.ArgumentParser(prog="python -m bench.predict", description=__doc__)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args(argv)
    for task in args.tasks.split(","):
        print(json.dumps(measure(task, args.rows)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
