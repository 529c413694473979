"""Prediction throughput: `hx.predict` (a launched worker, the batch sharded over 4 virtual
XLA:CPU devices, one graph per bucket) against `transformers.pipeline(...)` on the CPU in the
kernel, same model, same inputs, per task; the ratio in one invocation.

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

TASKS = ("classification", "token-classification", "question-answering")


def _inputs(task: str, rows: int) -> tuple[str, list, str]:
    """(model folder, inputs, pipeline task name)."""
    from hfxla_nb import demo, demo_tasks

    if task == "classification":
        return demo.demo_model_dir(), demo.demo_texts(rows)[0], "text-classification"
    if task == "token-classification":
        texts = [" ".join(r["tokens"]) for r in demo_tasks.ner_rows(rows)]
        return demo_tasks.ner_model_dir(), texts, "token-classification"
    qa = [{"question": r["question"], "context": r["context"]}
          for r in demo_tasks.qa_rows(rows, unanswerable=0.0)]
    return demo_tasks.qa_model_dir(), qa, "question-answering"


def measure(task: str, rows: int, devices: int = 4) -> dict:
    import transformers

    import hfxla_nb as hx

    folder, inputs, pipeline_task = _inputs(task, rows)
    pipe = transformers.pipeline(pipeline_task, model=folder, tokenizer=folder, device="cpu")
    start = time.perf_counter()
    if pipeline_task == "question-answering":
        reference = pipe(question=[r["question"] for r in inputs],
                         context=[r["context"] for r in inputs], batch_size=32)
    else:
        reference = pipe(inputs, batch_size=32)
    pipeline_seconds = time.perf_counter() - start
    out = hx.predict(folder, inputs, task=task, num_processes=devices, progress=False,
                     batch_size=8 * devices)
    agree = None
    if task == "classification":
        agree = sum(p["label"] == r["label"] for p, r in zip(out, reference, strict=True))
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
