"""Generation on XLA for seq2seq evaluation: transformers' `model.generate` against the fixed-
shape greedy loop `fine_tune(task="seq2seq")` evaluates with, same model (the demo BART, its
weights jittered so that it speaks), same padded sources, in one launched worker (one device).

`python -m bench.seq2seq [--rows N] [--tokens T]` prints one JSON object: graphs compiled and
seconds of each side, and whether both generated the same tokens. `generate` grows the decoder
input by one token a step (a new shape each time), so it compiles per token; the fixed-shape
loop compiles the encoder and one step graph, however many tokens.
"""

from __future__ import annotations

import argparse
import json
import time

from . import common


def _model_and_sources(rows: int):
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from hfxla_nb.demo.seq2seq import (
        demo_seq2seq_dataset,
        demo_seq2seq_model_dir,
        demo_seq2seq_tokenizer,
    )

    model = AutoModelForSeq2SeqLM.from_pretrained(demo_seq2seq_model_dir("bart")).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # untrained weights say nothing but </s>
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    texts = [r["en"] for r in demo_seq2seq_dataset(n=max(rows, 20))["train"]["translation"]]
    batch = demo_seq2seq_tokenizer()(texts[:rows], padding="max_length", max_length=8,
                                     return_tensors="pt")
    return model, batch.input_ids, batch.attention_mask


def generation_worker(rows: int, tokens: int, batch_size: int) -> dict:
    """In the launched worker: both ways over the same batches, counted apart."""
    import torch

    from hfxla_nb import _xla
    from hfxla_nb.train.tasks.seq2seq import greedy_generate

    model, ids, mask = _model_and_sources(rows)
    device = _xla.device()
    model.to(device)
    batches = [(ids[i:i + batch_size].to(device), mask[i:i + batch_size].to(device))
               for i in range(0, rows, batch_size)]
    _xla.sync()
    results = {}
    for side in ("generate", "fixed_shape"):
        before = _xla.metric_counts((_xla.COMPILE_TIME,))[_xla.COMPILE_TIME]
        start = time.perf_counter()
        outputs = []
        with torch.no_grad():
            for source, source_mask in batches:
                if side == "generate":
                    out = model.generate(input_ids=source, attention_mask=source_mask,
                                         do_sample=False, num_beams=1, max_new_tokens=tokens,
                                         min_new_tokens=tokens)[:, 1:]
                else:
                    out = greedy_generate(model, source, source_mask, tokens,
                                          sync=lambda state: _xla.sync())
                outputs.append(_xla.to_cpu([out])[0])
        results[side] = {
            "seconds": time.perf_counter() - start,
            "compiles": _xla.metric_counts((_xla.COMPILE_TIME,))[_xla.COMPILE_TIME] - before,
            "tokens": torch.cat(outputs).tolist(),
        }
    same = results["generate"].pop("tokens") == results["fixed_shape"].pop("tokens")
    return {**results, "same_tokens": same}


def host_worker(rows: int, tokens: int, repeats: int) -> dict:
    """In the launched worker: the fixed-shape loop's host CPU per token (this thread's CPU
    time from the encoder to the tokens on the host, over the tokens), its step traced once
    and run by its compiled graph (`generation.StepGraph`, as evaluation and `predict` run
    it) against every step traced, alternating; each side runs once first (its compiles)."""
    import torch

    from hfxla_nb import _xla, patches
    from hfxla_nb.train.tasks.seq2seq import greedy_generate
    from hfxla_nb.train.worker.generation import StepGraph

    model, ids, mask = _model_and_sources(rows)
    device = _xla.device()
    model.to(device)
    source, source_mask = ids.to(device), mask.to(device)
    _xla.sync()

    def capture(state: dict, step: dict, fallbacks: dict):
        return StepGraph.capture(model, state, step, [], [], fallbacks)

    seconds: dict[bool, list[float]] = {True: [], False: []}
    tokens_of = {}
    with torch.no_grad(), patches.applied():  # as a worker's evaluation runs
        for repeat in range(repeats + 1):
            for captured in (False, True) if repeat % 2 else (True, False):
                start = time.thread_time()
                out = greedy_generate(model, source, source_mask, tokens,
                                      sync=lambda state: _xla.sync(),
                                      capture=capture if captured else None)
                tokens_of[captured] = _xla.to_cpu([out])[0].tolist()
                if repeat:
                    seconds[captured].append((time.thread_time() - start) / tokens)
    return {"captured": seconds[True], "traced": seconds[False],
            "same_tokens": tokens_of[True] == tokens_of[False]}


def measure_host(rows: int = 16, tokens: int = 32, repeats: int = 3) -> dict:
    """`host_worker` in one launched worker on one device."""
    import hfxla_nb as hx

    out = hx.notebook_launcher(host_worker, args=(rows, tokens, repeats), num_processes=1,
                               progress=False)
    return {"rows": rows, "tokens": tokens, **out}


def measure(rows: int = 64, tokens: int = 16, batch_size: int = 16) -> dict:
    import hfxla_nb as hx

    out = hx.notebook_launcher(generation_worker, args=(rows, tokens, batch_size),
                               num_processes=1, progress=False)
    return {"rows": rows, "tokens": tokens, "batch_size": batch_size, **out,
            "compile_ratio": out["generate"]["compiles"] / max(out["fixed_shape"]["compiles"], 1),
            "speedup": out["generate"]["seconds"] / out["fixed_shape"]["seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.seq2seq", description=__doc__)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    common.bench_environment()
    print(json.dumps(measure(args.rows, args.tokens, args.batch_size)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
