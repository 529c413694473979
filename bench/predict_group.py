"""Group 14: `hx.predict` against `transformers.pipeline(...)` on the CPU, per task
(`bench/predict.py` measures; this turns its runs into figures). Each repetition runs both
sides of every task once (pipeline, then predict), so the per-repetition ratios pair runs made
at the same moment of a shared machine.

Targets (the tasks issue): >= 3x the CPU pipeline on 4 virtual devices for classification, one
graph per bucket for every task. The other tasks' throughput is reported: their pipelines do
more on the host per row (token alignment, span search) than the comparison measures.
"""

from __future__ import annotations

from . import common

GROUP = "14 predict"
ROWS = 128 if common.QUICK else 256
TARGET = {"classification": 3.0}


def run() -> list[common.Figure]:
    from . import predict

    runs: dict[str, list[dict]] = {task: [] for task in predict.TASKS}
    repeats = min(common.REPEATS, 3)  # 3 tasks x 2 sides each: the 15 minutes of make bench
    for repeat in range(repeats):
        for task in predict.TASKS:
            measured = predict.measure(task, ROWS)
            runs[task].append(measured)
            common.say(f"  [{repeat + 1}/{repeats}] {task}: {measured['ratio']:.2f}x, "
                       f"{measured['predict_compiles']} compiles")
    figures = []
    for task, measured in runs.items():
        ratios = [m["ratio"] for m in measured]
        first = measured[0]
        ours = common.median([m["predict_rows_per_second"] for m in measured])
        theirs = common.median([m["pipeline_rows_per_second"] for m in measured])
        note = (f"{ROWS} rows, rows/s predict {ours:.0f} vs pipeline {theirs:.0f}; "
                f"predict on {first['devices']} virtual devices (its time in the worker), the "
                "pipeline on the CPU in this process")
        if first.get("labels_agree") is not None:
            note += f"; labels agree on {first['labels_agree']} of {ROWS} rows"
        name = f"{task}: predict rows/s / transformers.pipeline rows/s"
        if task in TARGET:
            figures.append(common.target_figure(GROUP, name, common.median(ratios), ">=",
                                                TARGET[task], "x", len(ratios), note, ratios))
        else:
            figures.append(common.Figure(GROUP, name, common.median(ratios), "x",
                                         repeats=len(ratios), samples=ratios,
                                         note=note + " (reported: the pipeline's host-side "
                                         "post-processing differs per task)"))
        buckets = len(first["buckets"])
        figures.append(common.target_figure(
            GROUP, f"{task}: predict graphs per bucket", first["predict_compiles"] / buckets,
            "<=", 1, "graphs", 1, f"{first['predict_compiles']} compiles, {buckets} buckets "
            f"({', '.join(map(str, first['buckets']))} tokens); 1 run"))
    return figures
