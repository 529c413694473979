"""Groups 2, 4 and 5, from the same alternating runs: `fine_tune` vs `transformers.Trainer`
(default logging; `logging_steps=1` with transformers' notebook callback) vs the hand-written
loop. Tiny BERT, the same demo rows padded to 64 tokens, batch 16, one XLA device, one epoch.

- 2 syncs: device-to-host transfers and executions per steady step (counts: deterministic;
  the median of the runs, which agree).
- 4 throughput: steady-state samples/s, fine_tune / Trainer and / the hand-written loop, per
  pair of runs.

`Trainer logging_steps=1` runs once, after the alternating runs: its rows are counts
(deterministic; compiled with `common.unoptimized_compiles`, which changes no count), and its
throughput, compared from one run, would not be a median of pairs
(make bench's 15 minutes; figure 1 measures what per-step reporting costs).
- 5 whole run: wall time of the whole call, tokenizing, launching, compiling, one epoch and
  an evaluation included: fine_tune / Trainer with default logging (both evaluate).
"""

from __future__ import annotations

import time

from hfxla_nb.train.worker.loop import STEADY_AFTER_STEPS

from . import common, workloads

SYNCS, SPEED, WHOLE = "2 syncs", "4 throughput", "5 whole run"
TRAIN_ROWS, EVAL_ROWS, BATCH, LENGTH, LOG_EVERY, WARMUP = 400, 48, 16, 64, 10, 5
STEADY_AFTER = STEADY_AFTER_STEPS  # the steps fine_tune's steady-state figures leave out


def sides(model: str) -> dict:
    train_data = workloads.demo_rows(TRAIN_ROWS)
    eval_data = workloads.demo_rows(EVAL_ROWS, "validation")

    def timed(function):
        def side():
            started = time.perf_counter()
            figures = function()
            figures["wall_seconds"] = time.perf_counter() - started
            return figures
        return side

    def fine_tune():
        import hfxla_nb as hx

        result = hx.fine_tune(model, train_data, eval_dataset=eval_data, max_length=LENGTH,
                              batch_size=BATCH, epochs=1, learning_rate=1e-4, output_dir=None,
                              progress=False, log_every=LOG_EVERY)
        return {"samples_per_second": result.samples_per_second,
                "compile_seconds": result.xla.get("compile_seconds"),
                "train_seconds": result.train_seconds, "eval_seconds": result.eval_seconds,
                "executions_per_step": result.executions_per_step,
                "transfers_per_step": result.transfers_per_step,
                "compiles": result.compiles, "eval_compiles": result.eval_compiles,
                "steps": result.steps}

    def trainer(**options):
        def run():
            config = {"model": model, "batch_size": BATCH, "warmup": WARMUP,
                      "data": workloads.tokenized(model, TRAIN_ROWS, LENGTH), **options}
            if options.get("eval"):
                config["eval"] = workloads.tokenized(model, EVAL_ROWS, LENGTH, split="validation")
            return workloads.launched(workloads.run_trainer, config)
        return run

    # Tokenized once: the hand-written side's wall time is no figure (Trainer's is: it
    # tokenizes in every run, as fine_tune does).
    hand_data = workloads.tokenized(model, TRAIN_ROWS, LENGTH)

    def hand_written():
        config = {"model": model, "batch_size": BATCH, "warmup": WARMUP,
                  "steps": TRAIN_ROWS // BATCH, "data": hand_data}
        return workloads.launched(workloads.run_hand_written, config)

    return {
        "fine_tune": timed(fine_tune),
        "Trainer": timed(trainer(eval=True)),
        "hand-written": timed(hand_written),
    }, {"Trainer logging_steps=1": timed(trainer(logging_steps=1, notebook=True))}


def _counts_note(runs: list[dict], key: str) -> str:
    values = {round(r[key], 4) for r in runs if r.get(key) is not None}
    why = "reported: the other side's count, beside fine_tune's targeted one"
    if len(runs) == 1:
        return f"1 run (a count: deterministic), {common.UNOPTIMIZED_NOTE}; {why}"
    return ("equal in every run" if len(values) <= 1 else f"varied: {sorted(values)}") + f"; {why}"


def run() -> list[common.Figure]:
    model = workloads.tiny_bert()
    alternating, once = sides(model)
    results = common.alternate(alternating, common.REPEATS, common.say)
    with common.unoptimized_compiles():  # its rows are counts only
        results.update(common.alternate(once, 1, common.say))
    n = common.REPEATS
    figures: list[common.Figure] = []
    ft = results["fine_tune"]
    executions = common.median([r["executions_per_step"] for r in ft])
    transfers = common.median([r["transfers_per_step"] for r in ft])
    steps = ft[0]["steps"]
    steady = steps - STEADY_AFTER
    # fine_tune fetches the loss at every log_every-th step and at the last one.
    points = sum(1 for k in range(STEADY_AFTER + 1, steps + 1) if k % LOG_EVERY == 0 or k == steps)
    figures.append(common.target_figure(
        SYNCS, f"fine_tune transfers per logging point (log_every={LOG_EVERY})",
        transfers * steady / points if transfers is not None else None, "<=", 1, "", n,
        f"{transfers * steady:.0f} device-to-host transfers in its {steady} steady steps "
        f"({transfers:.3f} per step), which hold {points} loss fetches (every {LOG_EVERY}th step "
        f"and the last); {_counts_note(ft, 'transfers_per_step')}"))
    figures.append(common.target_figure(
        SYNCS, "fine_tune executions per step", executions, "<=", 1.0, "", n,
        f"graph executions per steady step; {_counts_note(ft, 'executions_per_step')}"))
    for side in ("Trainer", "Trainer logging_steps=1", "hand-written"):
        runs = results[side]
        label = {"Trainer": "Trainer (default logging)",
                 "Trainer logging_steps=1": "Trainer logging_steps=1 + NotebookProgressCallback",
                 "hand-written": "hand-written loop"}[side]
        for key, what in (("transfers_per_step", "transfers"),
                          ("executions_per_step", "executions")):
            figures.append(common.Figure(
                SYNCS, f"{label}: {what} per step", common.median([r[key] for r in runs]), "",
                repeats=len(runs), note=_counts_note(runs, key)))
    rates = {side: [r["samples_per_second"] for r in runs] for side, runs in results.items()}
    for side, target in (("Trainer", 1.25), ("hand-written", 1.10)):
        pairs = common.ratios(rates["fine_tune"], rates[side])
        note = (f"samples/s {common.median(rates['fine_tune']):.0f} vs "
                f"{common.median(rates[side]):.0f}; steady state (after each one's warm-up), "
                f"batch {BATCH}, padded to {LENGTH}, one epoch of {TRAIN_ROWS} rows")
        figures.append(common.target_figure(SPEED, f"fine_tune samples/s / {side}",
                                            common.median(pairs), ">=", target, "x",
                                            len(pairs), note, pairs))
    ft_compile = common.median([r["compile_seconds"] for r in ft])
    trainer_compile = common.median([r["compile_seconds"] for r in results["Trainer"]])
    walls = common.ratios([r["wall_seconds"] for r in ft],
                          [r["wall_seconds"] for r in results["Trainer"]])
    compiles = common.median([r["compiles"] + r["eval_compiles"] for r in ft])
    trainer_compiles = common.median([r["train_compiles"] + r.get("eval_compiles", 0)
                                      for r in results["Trainer"]])
    figures.append(common.target_figure(
        WHOLE, "fine_tune wall time / Trainer (default logging), one epoch + evaluation",
        common.median(walls), "<=", 0.6, "x", len(walls),
        f"{common.median([r['wall_seconds'] for r in ft]):.1f} s vs "
        f"{common.median([r['wall_seconds'] for r in results['Trainer']]):.1f} s, tokenizing, "
        f"launch, compiles, {TRAIN_ROWS} rows and an evaluation on {EVAL_ROWS} included; "
        f"fine_tune compiled {compiles:.0f} graphs in {ft_compile:.1f} s, Trainer "
        f"{trainer_compiles:.0f} in {trainer_compile:.1f} s of training", walls))
    return figures
