"""Group 14: `hx.predict` against `transformers.pipeline(...)` on the CPU, per task
(`bench/predict.py` measures; this turns its runs into figures).

Classification, the target (the tasks issue: >= 3x the CPU pipeline on 4 virtual devices, one
graph per bucket): `CLASSIFICATION_ROWS` texts a run, enough that the launch and the compile
weigh what they weigh for a real input count; `common.REPEATS` alternating pairs (pipeline
then predict, then predict then pipeline, ...), the median of the per-pair ratios. The target
is the whole call's ratio (what a notebook user waits for, the launch and the compile in it);
the ratios in the worker and of the compiled graphs are reported beside it.

The host's work per batch: classification's `predict` run in one worker with each bucket's
later batches by its compiled graph against every batch traced (`predict.measure_host`):
this thread's CPU time per batch, alternating, the median of the per-pair ratios (a target:
at most a third; on a TPU it is what the chip waits for).

The other tasks: one run of `ROWS` inputs each, their graphs per bucket (a target: one; two
for a causal LM, its prompt's and a decoding step's) and
their ratio (reported: their pipelines do more on the host per row than the comparison
measures, and one short run is noisy).
"""

from __future__ import annotations

from . import common

GROUP = "14 predict"
CLASSIFICATION_ROWS = 400 if common.QUICK else 2000
ROWS = 64 if common.QUICK else 128
TARGET = 3.0
HOST_TARGET = 0.33  # a batch's host work at most a third of a traced batch's
HOST_REPEATS = 2 if common.QUICK else 3
#: Graphs per bucket where a task needs more than one: a causal LM's prompt and one decoding
#: step (`train/tasks/causal_lm.py`).
GRAPHS_PER_BUCKET = {"causal-lm": 2}


def _warm_up() -> None:
    """One small run of each side first: the imports and first-time set-up of a process are
    no part of either side's figure."""
    from . import predict

    predict.measure("classification", 8)


def run() -> list[common.Figure]:
    from . import predict

    _warm_up()
    runs = []
    for repeat in range(common.REPEATS):
        measured = predict.measure("classification", CLASSIFICATION_ROWS,
                                   predict_first=repeat % 2 == 1)
        runs.append(measured)
        common.say(f"  [{repeat + 1}/{common.REPEATS}] classification: whole call "
                   f"{measured['call_ratio']:.2f}x, in the worker {measured['ratio']:.2f}x, "
                   f"compiled {measured['compiled_ratio']:.2f}x")
    first = runs[0]
    calls = [m["call_ratio"] for m in runs]
    setting = (f"{CLASSIFICATION_ROWS} texts, the demo's tiny BERT; predict on "
               f"{first['devices']} virtual devices (batch {first['batch_size']}), the pipeline "
               "on the CPU in this process (batch 32); median of "
               f"{len(runs)} alternating pairs")
    median = {key: common.median([m[key] for m in runs]) for key in (
        "predict_call_seconds", "predict_seconds", "predict_compile_seconds",
        "pipeline_call_seconds")}
    seconds = (f"seconds: predict's call {median['predict_call_seconds']:.1f} (in the worker "
               f"{median['predict_seconds']:.1f}, compiling "
               f"{median['predict_compile_seconds']:.1f}), the pipeline's "
               f"{median['pipeline_call_seconds']:.1f}")
    figures = [
        common.target_figure(
            GROUP, "classification: the pipeline's seconds / hx.predict's (whole call)",
            common.median(calls), ">=", TARGET, "x", len(calls),
            f"{setting}; {seconds}; labels agree on {first['labels_agree']} of "
            f"{CLASSIFICATION_ROWS} texts", calls),
        common.Figure(GROUP, "classification: the pipeline's run / predict in the worker "
                      "(compiles in, launch and model loading out)",
                      common.median([m["ratio"] for m in runs]), "x", repeats=len(runs),
                      samples=[m["ratio"] for m in runs], note="the same runs; reported"),
        common.Figure(GROUP, "classification: the pipeline's run / predict's compiled graphs "
                      "(a second call with a persistent compile cache: TPU)",
                      common.median([m["compiled_ratio"] for m in runs]), "x",
                      repeats=len(runs), samples=[m["compiled_ratio"] for m in runs],
                      note="the same runs, predict's compile seconds left out; reported"),
        _per_bucket("classification", first),
        _host_figure(predict.measure_host(CLASSIFICATION_ROWS, HOST_REPEATS)),
    ]
    for task in predict.TASKS:
        if task == "classification":
            continue
        measured = predict.measure(task, ROWS)
        common.say(f"  {task}: {measured['ratio']:.2f}x in the worker, "
                   f"{measured['predict_compiles']} compiles")
        note = (f"{ROWS} inputs, 1 run; predict in the worker {measured['predict_seconds']:.1f} s "
                f"(compiling {measured['predict_compile_seconds']:.1f} s), the CPU side "
                f"{measured['pipeline_seconds']:.1f} s (reported: the pipelines' host-side "
                "post-processing differs per task)")
        if measured.get("labels_agree") is not None:
            note += f"; answers agree on {measured['labels_agree']} of {ROWS}"
        figures.append(common.Figure(
            GROUP, f"{task}: the CPU side's seconds / predict's in the worker",
            measured["ratio"], "x", note=note))
        figures.append(_per_bucket(task, measured))
    return figures


def _host_figure(measured: dict) -> common.Figure:
    batches = measured["batches"]

    def per_batch(side: str) -> str:
        return f"{common.median(measured[side]) / batches * 1000:.2f}"

    return common.compiled_over_traced(
        GROUP, "classification: predict's host CPU per batch, compiled graph / traced",
        measured["captured"], measured["traced"], HOST_TARGET,
        f"this thread's CPU per batch, median: {per_batch('captured')} ms compiled, "
        f"{per_batch('traced')} ms traced; {batches} batches of 32 in "
        f"{measured['buckets']} bucket(s), {CLASSIFICATION_ROWS} texts, 4 virtual devices; "
        f"the same answers: {measured['same']}")


def _per_bucket(task: str, measured: dict) -> common.Figure:
    buckets = len(measured["buckets"])
    return common.target_figure(
        GROUP, f"{task}: predict graphs per bucket", measured["predict_compiles"] / buckets,
        "<=", GRAPHS_PER_BUCKET.get(task, 1), "graphs", 1,
        f"{measured['predict_compiles']} compiles, {buckets} buckets "
        f"({', '.join(map(str, measured['buckets']))} tokens); 1 run")
