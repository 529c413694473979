"""Group 19: the notebook loop, warm against cold (docs/fine-tune.md, "Warm between cells").

Train, then try: `fine_tune` of the demo's tiny Llama (`TRAIN_STEPS` steps), then `CALLS`
`result.predict` and `CALLS` `result.generate`, each of 2 prompts and `NEW_TOKENS` new tokens,
as a person tries prompts in the next cells. Two sides, alternating, in this process (the
notebook's place: the workers fork from it):

- warm: `keep_warm=True`: the trained model stays on the devices; every call is a job of the
  worker that trained it.
- cold: what a call cost before warm sessions: `keep_warm=False`; each `predict` launches a
  worker that starts the runtime, loads the saved model and compiles, and `generate` decodes
  on the CPU in this process (`device="cpu"`, the cold path of that time).

Figures: each call's seconds (the first call and the median of the later ones), the target
that the later warm calls take at most `LATER_TARGET` seconds; the calls after training, warm
over cold (target `LOOP_TARGET`); the whole loop, training included (reported: training takes
the same time on both sides). On a TPU the cold side also pays the TPU runtime's start and
the weights' load from disk per call: not measured here (no TPU).
"""

from __future__ import annotations

import time

from . import common

GROUP = "19 notebook loop"
TRAIN_STEPS = 30
CALLS = 3
NEW_TOKENS = 8
PROMPTS = ["the movie was", "a great day for"]
LATER_TARGET = 0.3
LOOP_TARGET = 0.3
REPEATS = 1 if common.QUICK else 2


def loop(warm: bool, folder: str, steps: int = TRAIN_STEPS, calls: int = CALLS) -> dict:
    """One notebook loop: train, then `calls` predicts and generates; the seconds of each."""
    import hfxla_nb as hx
    from hfxla_nb.demo.lm import demo_lm_dataset, demo_lm_model_dir

    start = time.perf_counter()
    result = hx.fine_tune(demo_lm_model_dir(), demo_lm_dataset(400), max_steps=steps,
                          batch_size=8, progress=False, keep_warm=warm, output_dir=folder,
                          overwrite_output_dir=True)
    trained = time.perf_counter()
    assert result.warm == warm
    predicts, generates, texts = [], [], []
    for _ in range(calls):
        begin = time.perf_counter()
        out = result.predict(PROMPTS, max_new_tokens=NEW_TOKENS, progress=False)
        predicts.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        texts.append(result.generate(PROMPTS, max_new_tokens=NEW_TOKENS, progress=False,
                                     device="xla" if warm else "cpu"))
        generates.append(time.perf_counter() - begin)
    end = time.perf_counter()
    result.release()
    return {"train": trained - start, "calls": end - trained, "loop": end - start,
            "predict": predicts, "generate": generates, "texts": texts,
            "predicted": [row["generated_text"] for row in out]}


def run() -> list[common.Figure]:
    import tempfile

    runs: dict[str, list[dict]] = {"warm": [], "cold": []}
    with tempfile.TemporaryDirectory() as folder:
        # Each side's first-time set-up of this process (imports, the demo's files) first:
        # no part of either side's figures.
        loop(True, f"{folder}/warm-up", steps=2, calls=1)
        loop(False, f"{folder}/warm-up", steps=2, calls=1)
        for repeat in range(REPEATS):
            order = ("warm", "cold") if repeat % 2 == 0 else ("cold", "warm")
            for side in order:
                runs[side].append(loop(side == "warm", f"{folder}/{side}"))
                done = runs[side][-1]
                common.say(f"  [{repeat + 1}/{REPEATS}] {side}: train {done['train']:.1f} s, "
                           f"calls {done['calls']:.2f} s")
    warm, cold = runs["warm"], runs["cold"]
    same = all(w["texts"] == c["texts"] and w["predicted"] == c["predicted"]
               for w, c in zip(warm, cold, strict=True))
    figures = []
    for call in ("predict", "generate"):
        for side, measured in (("warm", warm), ("cold", cold)):
            first = common.median([m[call][0] for m in measured])
            later = common.median([t for m in measured for t in m[call][1:]])
            how = ("a job of the worker that trained it" if side == "warm" else
                   "a launched worker: runtime, load, compile" if call == "predict" else
                   "on the CPU in this process (device='cpu')")
            figures.append(common.Figure(
                GROUP, f"result.{call}, {side}: first call", first, "s",
                repeats=len(measured), note=f"{how}; reported"))
            note = f"{how}; calls 2 to {CALLS} of each loop"
            if side == "warm":
                figures.append(common.target_figure(
                    GROUP, f"result.{call}, warm: later calls", later, "<=", LATER_TARGET,
                    "s", (CALLS - 1) * len(measured), note))
            else:
                figures.append(common.Figure(GROUP, f"result.{call}, cold: later calls",
                                             later, "s", repeats=(CALLS - 1) * len(measured),
                                             note=note + "; reported"))
    calls = common.ratios([m["calls"] for m in warm], [m["calls"] for m in cold])
    figures.append(common.target_figure(
        GROUP, "the calls after training, warm / cold", common.median(calls), "<=",
        LOOP_TARGET, "x", len(calls),
        f"{CALLS} predicts and {CALLS} generates of {len(PROMPTS)} prompts, {NEW_TOKENS} new "
        f"tokens; warm {common.median([m['calls'] for m in warm]):.2f} s vs cold "
        f"{common.median([m['calls'] for m in cold]):.2f} s; the same texts on both sides: "
        f"{'yes' if same else 'NO'}", calls))
    whole = common.ratios([m["loop"] for m in warm], [m["loop"] for m in cold])
    figures.append(common.Figure(
        GROUP, "the whole loop (fine_tune of 30 steps included), warm / cold",
        common.median(whole), "x", repeats=len(whole), samples=whole,
        note=f"training {common.median([m['train'] for m in warm]):.1f} s warm vs "
             f"{common.median([m['train'] for m in cold]):.1f} s cold (the same work); "
             "reported: on a TPU each cold call also starts the TPU runtime and reads the "
             "weights from disk (not measured here)"))
    return figures
