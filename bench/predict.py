"""Prediction throughput: `hx.predict` (a launched worker, the batch sharded over 4 virtual
XLA:CPU devices, one graph per bucket) against `transformers.pipeline(...)` on the CPU in the
kernel, same model, same inputs, per task; the ratio in one invocation. Question answering
and multiple choice have no pipeline in transformers 5: their CPU side is a forward loop of
32 rows a batch (question answering: the same windows, decoded by the same rules); causal-lm
generates `NEW_TOKENS` tokens per prompt, greedily, on both sides; masked-lm is the fill-mask
pipeline (the top 5 tokens of each mask).

Three ratios per run, each the pipeline's seconds over predict's:
- whole call: `hx.predict(...)` from call to return (tokenizing, the launch, loading the
  model in the worker, compiling, predicting, decoding) against building the pipeline and
  running it: what a notebook user waits for;
- in the worker: predict's time in the worker (compiles included; launch and model loading
  left out, as the pipeline's construction is) against the pipeline's run;
- compiled: the same less predict's compile seconds (what a second call costs where a
  persistent compile cache holds the graphs: a TPU; XLA:CPU cannot reload them).

`python -m bench.predict [--rows N] [--tasks classification,token-classification,...]
[--model bert-4x256]` prints one JSON object per task: the seconds and rows/s of each side,
the ratios, predict's compiles, and whether both sides agree on the labels.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from . import common

TASKS = ("classification", "token-classification", "question-answering", "multiple-choice",
         "causal-lm", "masked-lm")
#: Tokens generated per prompt (causal-lm).
NEW_TOKENS = 16


def _inputs(task: str, rows: int, model: str | None = None) -> tuple[str, list, str]:
    """(model folder, inputs, pipeline task name); `model` a classifier's folder instead of
    the demo's tiny BERT (classification)."""
    from hfxla_nb import demo
    from hfxla_nb.demo import tasks as demo_tasks

    if task == "classification":
        return model or demo.demo_model_dir(), demo.demo_texts(rows)[0], "text-classification"
    if task == "masked-lm":
        texts = []
        for text in demo.demo_texts(rows)[0]:
            words = text.split()
            words[min(2, len(words) - 1)] = "[MASK]"
            texts.append(" ".join(words))
        return demo_tasks.mlm_model_dir(), texts, "fill-mask"
    if task == "token-classification":
        texts = [" ".join(r["tokens"]) for r in demo_tasks.ner_rows(rows)]
        return demo_tasks.ner_model_dir(), texts, "token-classification"
    if task == "multiple-choice":  # transformers has no pipeline: a CPU forward loop instead
        swag = [{k: v for k, v in r.items() if k != "label"} for r in demo_tasks.mc_rows(rows)]
        return demo_tasks.mc_model_dir(), swag, "multiple-choice"
    if task == "causal-lm":
        from hfxla_nb.demo.lm import TEMPLATE, demo_lm_model_dir

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

    from hfxla_nb.train.tasks.question_answering import best_answer, encode_examples

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


def _on_cpu(folder: str, inputs: list, pipeline_task: str) -> tuple[list, float]:
    """The CPU side's answers and its seconds (the pipeline's construction included)."""
    import transformers

    start = time.perf_counter()
    if pipeline_task not in ("multiple-choice", "question-answering"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        if pipeline_task == "text-generation":
            tokenizer.padding_side = "left"  # batched generation pads prompts on the left
        pipe = transformers.pipeline(pipeline_task, model=folder, tokenizer=tokenizer,
                                     device="cpu")
    built = time.perf_counter()
    if pipeline_task == "multiple-choice":
        reference = _multiple_choice_on_cpu(folder, inputs)
    elif pipeline_task == "text-generation":
        reference = pipe(inputs, batch_size=32, max_new_tokens=NEW_TOKENS, do_sample=False,
                         return_full_text=False)
    elif pipeline_task == "question-answering":
        reference = _question_answering_on_cpu(folder, inputs)
    else:
        reference = pipe(inputs, batch_size=32)
    end = time.perf_counter()
    return reference, end - built, end - start


def host_worker(index: int, plan: Any, repeats: int) -> dict:
    """In a launched worker: `predict`'s host CPU per batch (this thread's CPU time over the
    batches, the fetch and the decoding), each bucket's later batches run by its compiled
    graph against every batch traced, alternating, the model loaded once. Each side runs once
    first (its compile, and the first batch's trace, stay out)."""
    import dataclasses

    from hfxla_nb import _xla, patches
    from hfxla_nb.train.worker.context import WorkerContext
    from hfxla_nb.train.worker.evaluate import predictions

    if not _xla.is_spmd():
        _xla.use_spmd()
    plans = {capture: dataclasses.replace(plan, capture_steps=capture) for capture in (True, False)}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    answers = {}
    with patches.applied():  # as `predict_worker` runs
        ctx = WorkerContext.load(plan, train=False)
        for repeat in range(repeats + 1):
            for capture in (False, True) if repeat % 2 else (True, False):
                ctx.plan = plans[capture]
                start = time.thread_time()
                answers[capture] = predictions(ctx)["predictions"]
                if repeat:
                    seconds[capture].append(time.thread_time() - start)
    return {"captured": seconds[True], "traced": seconds[False],
            "same": answers[True] == answers[False]}


def measure_host(rows: int, repeats: int, devices: int = 4, batch_size: int = 32) -> dict:
    """`host_worker` on the demo's tiny BERT classifier over `rows` texts: the host CPU per
    batch of each side, and whether both predicted the same."""
    import hfxla_nb as hx
    from hfxla_nb.train.predict import prepare_predict

    folder, inputs, _ = _inputs("classification", rows)
    plan = prepare_predict(folder, inputs, num_processes=devices, batch_size=batch_size)
    out = hx.notebook_launcher(host_worker, args=(plan, repeats), num_processes=devices,
                               strategy="spmd", progress=False)
    from hfxla_nb.train import batching

    return {**out, "batches": batching.eval_batch_count(plan.data.eval, batch_size),
            "buckets": len(plan.data.bucket_lengths)}


def measure(task: str, rows: int, devices: int = 4, model: str | None = None,
            predict_first: bool = False, batch_size: int | None = None) -> dict:
    """One run of both sides on the same inputs (`predict_first`: predict, then the CPU;
    alternate it over repetitions); predict's default batch size unless told."""
    import hfxla_nb as hx

    folder, inputs, pipeline_task = _inputs(task, rows, model)
    options = {"max_new_tokens": NEW_TOKENS} if task == "causal-lm" else {}

    def predict() -> tuple[list, float]:
        start = time.perf_counter()
        out = hx.predict(folder, inputs, task=task, num_processes=devices, progress=False,
                         batch_size=batch_size, **options)
        return out, time.perf_counter() - start

    if predict_first:
        out, call_seconds = predict()
        reference, pipeline_seconds, pipeline_call_seconds = _on_cpu(folder, inputs,
                                                                     pipeline_task)
    else:
        reference, pipeline_seconds, pipeline_call_seconds = _on_cpu(folder, inputs,
                                                                     pipeline_task)
        out, call_seconds = predict()
    agree = None
    if task == "classification":
        agree = sum(p["label"] == r["label"] for p, r in zip(out, reference, strict=True))
    elif task == "multiple-choice":
        agree = sum(p["label"] == r for p, r in zip(out, reference, strict=True))
    elif task == "question-answering":
        agree = sum(p["answer"] == r["answer"] for p, r in zip(out, reference, strict=True))
    elif task == "masked-lm":
        agree = sum(p["masks"][0][0]["token"] == r[0]["token"]
                    for p, r in zip(out, reference, strict=True))
    compiled = out.seconds - out.compile_seconds
    return {"task": task, "rows": rows, "devices": devices, "model": folder,
            "predict_call_seconds": call_seconds, "predict_seconds": out.seconds,
            "predict_compile_seconds": out.compile_seconds,
            "pipeline_call_seconds": pipeline_call_seconds,
            "pipeline_seconds": pipeline_seconds,
            "predict_rows_per_second": rows / out.seconds,
            "pipeline_rows_per_second": rows / pipeline_seconds,
            "call_ratio": pipeline_call_seconds / call_seconds,
            "ratio": pipeline_seconds / out.seconds,
            "compiled_ratio": pipeline_seconds / compiled,
            "predict_compiles": out.compiles, "buckets": out.bucket_lengths,
            "batch_size": batch_size or "default",
            "labels_agree": agree}


def main(argv: list[str] | None = None) -> int:
    common.bench_environment()
    parser = argparse.ArgumentParser(prog="python -m bench.predict", description=__doc__)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--model", choices=("tiny", "bert-4x256"), default="tiny",
                        help="classification's model: the demo's tiny BERT or a config-built "
                        "BERT 4x256")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=None)
    args = parser.parse_args(argv)
    from . import workloads

    model = workloads.bert_4x256() if args.model == "bert-4x256" else None
    for repeat in range(args.repeats):
        for task in args.tasks.split(","):
            print(json.dumps(measure(task, args.rows, model=model,
                                     predict_first=repeat % 2 == 1,
                                     batch_size=args.batch_size)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
