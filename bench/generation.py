"""Group 18: generation with the decoding engine (`train/worker/generation.py`) on the demo's
tiny Llama (`hfxla_nb/demo/lm.py`: freshly initialized, so its answers rarely end by
themselves: every row runs `NEW_TOKENS` steps unless the end ids are chosen to end them).

- Throughput: causal-LM `hx.predict` (a launched worker, the prompts sharded over 4 virtual
  XLA:CPU devices, batch 8 per device) against transformers' `model.generate` on the CPU in
  this process (batch 32, left padding), the same prompts and options, greedy and sampling
  (`SAMPLING`); tokens/s of each side, predict's in the worker with its compiles in and out;
  one pair per mode (greedy: the CPU first; sampling: predict first), to keep the group
  within its share of the 15 minutes.
- Graphs per prompt bucket: predict's compiles over its buckets, greedy and sampled (an exact
  contract: 2, the prompt's graph and one decoding step's).
- The limit: one launched worker, one device, `decode` itself as `generate` runs it (the step
  traced once, then run by its compiled graph: `StepGraph`); the wall time per steady step
  (from the first of them to the tokens on the host) against the median of XLA's
  `ExecuteTime` of a step (torch_xla's metrics through `_xla`), in a run that decodes every
  `LIMIT_TOKENS` step.
- Seq2seq decoding (`tasks/seq2seq.py`, evaluation's and `predict`'s loop) on the demo BART
  (`bench/seq2seq.py`): the host CPU per token with the step run by its compiled graph
  against every step traced, alternating, one device.
- The early stop: the same worker; end ids chosen from the batch's own greedy tokens so every
  answer ends within its first tokens, decoded with the default `check_every` (16) and with
  `check_every=LIMIT_TOKENS` (no check before the end: every step runs); executions counted
  exactly, seconds the median of alternating runs.

`python -m bench.generation` prints the worker's figures as JSON.
"""

from __future__ import annotations

import json
import time

from . import common

GROUP = "18 generation"
PROMPTS = 32 if common.QUICK else 64
NEW_TOKENS = 32
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_p": 0.9, "seed": 0}
MODES = {"greedy": {}, "sampling": SAMPLING}
GRAPHS_PER_BUCKET = 2
LIMIT_TARGET = 1.3
# 64 steps: 63 gaps between step ends, the first 13 left out: the last 50, the execution
# samples torch_xla keeps (`_xla.metrics_snapshot`).
LIMIT_ROWS, LIMIT_TOKENS, LIMIT_SKIP = 32, 64, 13
EARLY_REPEATS = 3
HOST_REPEATS = 2
HOST_TARGET = 0.33  # a token's host work at most a third of a traced step's


def _prompts(rows: int) -> tuple[str, list[str]]:
    from hfxla_nb import demo
    from hfxla_nb.demo.lm import TEMPLATE, demo_lm_model_dir

    return demo_lm_model_dir(), [TEMPLATE.format(prompt=t, response="").rstrip()
                                 for t in demo.demo_texts(rows)[0]]


def on_cpu(folder: str, prompts: list[str], options: dict) -> dict:
    """transformers' `generate` on the CPU, 32 prompts a batch (model loading left out):
    its seconds and the steps each batch ran (`NEW_TOKENS` unless every row ended)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"  # batched generation pads prompts on the left
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    if "seed" in options:
        torch.manual_seed(options["seed"])
    drawn = {k: v for k, v in options.items() if k != "seed"}
    steps = []
    start = time.perf_counter()
    with torch.no_grad():
        for begin in range(0, len(prompts), 32):
            encoded = tokenizer(prompts[begin:begin + 32], return_tensors="pt", padding=True)
            out = model.generate(**encoded, max_new_tokens=NEW_TOKENS, **drawn)
            steps.append(out.shape[1] - encoded["input_ids"].shape[1])
    return {"seconds": time.perf_counter() - start, "steps": steps}


def measure_predict(mode: str, predict_first: bool) -> dict:
    """One pair: `hx.predict` on 4 devices and `on_cpu`, the same prompts and options."""
    import hfxla_nb as hx

    folder, prompts = _prompts(PROMPTS)
    options = MODES[mode]

    def predict():
        return hx.predict(folder, prompts, task="causal-lm", num_processes=4, progress=False,
                          max_new_tokens=NEW_TOKENS, **options)

    if predict_first:
        out, cpu = predict(), on_cpu(folder, prompts, options)
    else:
        cpu = on_cpu(folder, prompts, options)
        out = predict()
    tokens = PROMPTS * NEW_TOKENS
    compiled = out.seconds - out.compile_seconds
    return {"mode": mode, "tokens": tokens, "cpu_steps": cpu["steps"],
            "cpu_tokens_per_second": tokens / cpu["seconds"],
            "predict_tokens_per_second": tokens / out.seconds,
            "compiled_tokens_per_second": tokens / compiled,
            "ratio": cpu["seconds"] / out.seconds, "compiled_ratio": cpu["seconds"] / compiled,
            "predict_seconds": out.seconds, "compile_seconds": out.compile_seconds,
            "cpu_seconds": cpu["seconds"], "compiles": out.compiles,
            "buckets": list(out.bucket_lengths)}


# ---------------------------------------------------------------------------------------------
# In one launched worker (one device): the limit and the early stop
# ---------------------------------------------------------------------------------------------


def _executions() -> tuple[int, list[float]]:
    """(executions so far, the seconds of the latest ones torch_xla holds, oldest first)."""
    from hfxla_nb import _xla

    metrics = _xla.metrics_snapshot()["metrics"]
    count, samples = 0, []
    for name in _xla.EXECUTE_TIMES:
        if name in metrics:
            count += metrics[name]["count"]
            samples += [value / 1e9 for _, value in metrics[name]["samples"]]
    return count, samples


def end_ids(tokens: list[list[int]], within: int = 6) -> list[int]:
    """At most 8 token ids such that (most) rows hold one of them in their first `within`
    tokens: a batch whose answers end early, picked from its own greedy tokens."""
    chosen: list[int] = []
    for row in tokens:
        if not any(token in chosen for token in row[:within]) and len(chosen) < 8:
            chosen.append(row[min(2, len(row) - 1)])
    return chosen


def decoding_worker(config: dict) -> dict:
    """In a launched worker: the limit run (every step, timed per step), then the early stop
    (end ids from the limit run's tokens) against every step, alternating."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfxla_nb import _xla, patches
    from hfxla_nb.train.config import resolve_options
    from hfxla_nb.train.worker.generation import DecodeHooks, decode, left_padded

    folder, prompts = _prompts(config["rows"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    device = _xla.device()
    model = AutoModelForCausalLM.from_pretrained(folder).to(device).eval()
    rows = [[tokenizer.bos_token_id, *tokenizer(p, add_special_tokens=False)["input_ids"]]
            for p in prompts]
    ids, mask, length = left_padded(tokenizer, rows, 16)
    ids, mask = ids.to(device), mask.to(device)
    times: list[float] = []
    cpu: list[float] = []  # this thread's CPU time at each step's end: the host's work

    def stepped() -> None:
        times.append(time.perf_counter())
        cpu.append(time.thread_time())

    # Each step's end, as `generate` runs it (its graph run by its key after the first), or
    # with every step traced (the baseline of the host's work per token).
    hooks = {capture: DecodeHooks(sync=lambda tensors: _xla.sync(), fetch=_xla.to_cpu,
                                  tokenizer=tokenizer, capture=capture, on_step=stepped)
             for capture in (True, False)}

    def run(capture: bool = True, **options) -> dict:
        settings = resolve_options(tokenizer, None, config["tokens"], **options)
        times.clear()
        cpu.clear()
        compiles = _xla.metric_counts((_xla.COMPILE_TIME,))[_xla.COMPILE_TIME]
        executions = _executions()[0]
        start = time.perf_counter()
        with torch.no_grad(), patches.applied():
            decoded = decode(model, ids, mask, settings, hooks[capture])
        tokens = _xla.to_cpu([decoded.tokens])[0]  # the end's one transfer, as generate's
        end = time.perf_counter()
        seconds = end - start
        count, samples = _executions()
        steady = cpu[config["skip"]:]
        return {"seconds": seconds, "steps": decoded.steps, "checks": decoded.checks,
                "executions": count - executions, "samples": samples,
                "compiles": _xla.metric_counts((_xla.COMPILE_TIME,))[_xla.COMPILE_TIME]
                - compiles, "walls": [b - a for a, b in zip(times, times[1:], strict=False)],
                "host": common.median([b - a for a, b in zip(steady, steady[1:],
                                                             strict=False)]),
                "marks": list(times), "end": end, "tokens": tokens.tolist()}

    every = config["tokens"]
    first = run(check_every=every)  # compiles the bucket's 2 graphs
    limit = run(check_every=every)
    # The host's CPU per token, each step run by its compiled graph against every step traced
    # (the traced steps sync a graph of their own: compiled by a first run, left out).
    runs = {True: [limit], False: [run(False, check_every=every)]}
    for _ in range(HOST_REPEATS):
        for capture in (False, True):
            runs[capture].append(run(capture, check_every=every))
    host = {"captured": [r["host"] for r in runs[True]],
            "traced": [r["host"] for r in runs[False][1:]],
            # A traced step reaches the device after its trace, which it never waits behind:
            # its `ExecuteTime` is the execution itself.
            "execute": common.median([common.median(r["samples"][-LIMIT_TOKENS // 2:])
                                      for r in runs[False][1:]])}
    ends = end_ids(limit["tokens"])
    sides: dict[str, list[dict]] = {"early": [], "every": []}
    for _ in range(config["repeats"]):
        sides["early"].append(run(eos_token_id=ends))
        sides["every"].append(run(eos_token_id=ends, check_every=every))
    return _summary(config, first, limit, sides, ends) | {"rows": len(rows), "bucket": length,
                                                          "host": host}


def _summary(config: dict, first: dict, limit: dict, sides: dict[str, list[dict]],
             ends: list[int]) -> dict:
    """The worker's figures as plain data (the token lists and samples left behind)."""
    steady = limit["walls"][config["skip"]:]
    # The steady steps' wall from the first of them to the tokens on the host: a step handed
    # to the device returns before it ran, so the last ones finish only by the fetch.
    marks = limit["marks"][config["skip"]:]
    wall = (limit["end"] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else None
    later = limit["compiles"] + sum(m["compiles"] for side in sides.values() for m in side)
    for side in sides.values():
        for measured in side:
            del measured["tokens"], measured["samples"], measured["walls"], measured["marks"]
    return {"first_compiles": first["compiles"], "later_compiles": later,
            "wall": wall,
            "steady_steps": len(steady), "ends": ends,
            "ended_by": {within: sum(any(t in ends for t in row[:within])
                                     for row in limit["tokens"]) for within in (6, 16)},
            "executions_per_step": limit["executions"] / limit["steps"], "sides": sides}


def measure_decoding() -> dict:
    from . import workloads

    return workloads.launched(decoding_worker, {
        "rows": LIMIT_ROWS, "tokens": LIMIT_TOKENS, "skip": LIMIT_SKIP,
        "repeats": EARLY_REPEATS})


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def _throughput_figures(mode: str, runs: list[dict]) -> list[common.Figure]:
    first = runs[0]

    def med(key: str) -> float | None:
        return common.median([m[key] for m in runs])

    setting = (f"{PROMPTS} prompts x {NEW_TOKENS} new tokens, {mode}"
               + (f" ({', '.join(f'{k}={v}' for k, v in SAMPLING.items())})"
                  if mode == "sampling" else "")
               + f"; predict on 4 virtual devices (batch 8 each), transformers' generate on "
               f"the CPU (batch 32, steps run {first['cpu_steps']}); 1 pair "
               f"({'predict' if mode == 'sampling' else 'the CPU'} first); reported: one pair, "
               "so the ratio is noisy")
    tokens = (f"tokens/s: predict {med('predict_tokens_per_second'):.0f} in the worker "
              f"({med('compiled_tokens_per_second'):.0f} compiles out; compiling "
              f"{med('compile_seconds'):.1f} of {med('predict_seconds'):.1f} s), generate "
              f"{med('cpu_tokens_per_second'):.0f}")
    buckets = len(first["buckets"])
    return [
        common.Figure(GROUP, f"causal-LM predict, {mode}: tokens/s / transformers generate "
                      "on the CPU (compiles in)", med("ratio"), "x", repeats=len(runs),
                      samples=[m["ratio"] for m in runs], note=f"{setting}; {tokens}"),
        common.Figure(GROUP, f"causal-LM predict, {mode}: tokens/s / transformers generate "
                      "on the CPU (compiles out)", med("compiled_ratio"), "x",
                      repeats=len(runs), samples=[m["compiled_ratio"] for m in runs],
                      note="the same runs, predict's compile seconds left out (a second call "
                      "with a persistent compile cache: TPU); reported"),
        common.Figure(GROUP, f"causal-LM predict, {mode}: graphs per prompt bucket",
                      first["compiles"] / buckets, "graphs", f"== {GRAPHS_PER_BUCKET}",
                      all(m["compiles"] == GRAPHS_PER_BUCKET * buckets for m in runs), 1,
                      f"{first['compiles']} compiles, {buckets} bucket"
                      f"{'s' if buckets != 1 else ''} ({', '.join(map(str, first['buckets']))} "
                      "tokens); 1 run"),
    ]


def _decoding_figures(m: dict) -> list[common.Figure]:
    execute = m["host"]["execute"]
    ratio = m["wall"] / execute if m["wall"] and execute else None
    note = (f"{m['wall'] * 1000:.2f} ms wall vs {execute * 1000:.2f} ms executing per "
            f"step ({m['executions_per_step']:.2f} executions/step), {m['rows']} prompts "
            f"(bucket {m['bucket']}), {LIMIT_TOKENS} steps, one device, greedy, each step "
            f"after the first run by its compiled graph (StepGraph); the wall of the last "
            f"{m['steady_steps']} steps to the tokens on the host; the execution: the median "
            "ExecuteTime of the traced runs' steps (the compiled steps are queued ahead of "
            "the device, so their own ExecuteTime counts the wait in the queue)")
    if ratio is not None and ratio > LIMIT_TARGET:
        note += ("; why: a step of this tiny model executes in less time than the host "
                 "takes to hand it over (the inputs' upload and the run call), and both share "
                 "the 2 cores")
    early, every = m["sides"]["early"], m["sides"]["every"]
    early_s = common.median([r["seconds"] for r in early])
    every_s = common.median([r["seconds"] for r in every])
    saved = common.ratios([r["seconds"] for r in every], [r["seconds"] for r in early])
    setting = (f"{m['rows']} prompts, max_new_tokens={LIMIT_TOKENS}, greedy; end ids "
               f"{m['ends']} (from the batch's own tokens: {m['ended_by'][16]} of {m['rows']} "
               f"answers end by their 16th token, {m['ended_by'][6]} by their 6th)")
    captured, traced = m["host"]["captured"], m["host"]["traced"]
    host_note = (f"this thread's CPU per steady step, median: {common.median(captured) * 1000:.2f}"
                 f" ms with each step run by its compiled graph (StepGraph), "
                 f"{common.median(traced) * 1000:.2f} ms with every step traced (transformers' "
                 f"Llama forward and the processors); {m['rows']} prompts, {LIMIT_TOKENS} steps, "
                 f"one device, greedy")
    return [
        common.compiled_over_traced(GROUP, "tiny Llama decoding: host CPU per token, compiled "
                                    "step / traced step", captured[-len(traced):], traced,
                                    HOST_TARGET, host_note),
        common.target_figure(GROUP, "tiny Llama decoding: wall / XLA execution time per step",
                             ratio, "<=", LIMIT_TARGET, "x", m["steady_steps"], note),
        common.Figure(GROUP, "tiny Llama decoding: graphs per prompt bucket",
                      m["first_compiles"], "graphs", f"== {GRAPHS_PER_BUCKET}",
                      m["first_compiles"] == GRAPHS_PER_BUCKET and m["later_compiles"] == 0,
                      1, f"the first decoding compiled {m['first_compiles']}, the "
                      f"{1 + 2 * EARLY_REPEATS} later ones (other end ids, check_every) "
                      f"{m['later_compiles']}; 1 run"),
        common.Figure(GROUP, "early stop (check_every 16): executions, every step / "
                      "stopped early", every[0]["executions"] / early[0]["executions"], "x",
                      repeats=1, note=f"{setting}: {early[0]['executions']} executions "
                      f"({early[0]['steps']} steps, {early[0]['checks']} check"
                      f"{'s' if early[0]['checks'] != 1 else ''}) against "
                      f"{every[0]['executions']} ({every[0]['steps']} steps); equal in every "
                      "run; reported"),
        common.Figure(GROUP, "early stop (check_every 16): seconds, every step / stopped "
                      "early", common.median(saved), "x", repeats=len(saved), samples=saved,
                      note=f"{every_s:.2f} s against {early_s:.2f} s (compiled before; "
                      f"medians of {len(early)} alternating runs); reported"),
    ]


def _seq2seq_figure(m: dict) -> common.Figure:
    return common.compiled_over_traced(
        GROUP, "demo BART seq2seq decoding: host CPU per token, compiled step / traced step",
        m["captured"], m["traced"], HOST_TARGET,
        f"this thread's CPU per token (the encoder and the first step's trace in), median: "
        f"{common.median(m['captured']) * 1000:.2f} ms compiled, "
        f"{common.median(m['traced']) * 1000:.2f} ms traced; {m['rows']} rows, {m['tokens']} "
        f"tokens, one device; the same tokens: {m['same_tokens']}")


def run() -> list[common.Figure]:
    from . import seq2seq

    figures = _decoding_figures(measure_decoding())
    figures.append(_seq2seq_figure(seq2seq.measure_host(repeats=HOST_REPEATS + 1)))
    for mode in MODES:
        measured = measure_predict(mode, predict_first=mode == "sampling")
        common.say(f"  {mode}: {measured['ratio']:.2f}x compiles in, "
                   f"{measured['compiled_ratio']:.2f}x out, {measured['compiles']} compiles")
        figures += _throughput_figures(mode, [measured])
    return figures


def main() -> int:
    common.bench_environment()
    print(json.dumps(measure_decoding()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
