"""`make bench`: every benchmark group, then `bench/results/<date>.json` and `bench/RESULTS.md`.

`python -m bench.run` runs them all; `--groups 1,4` some (the files are written either way,
with the figures measured). `BENCH_QUICK=1`: two repetitions instead of five and results under
/tmp/hfxla_nb_bench_quick (for working on the bench, never a result).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # noqa: E402 - after the path (python bench/run.py)

# group number -> module (each has `run() -> list[Figure]`)
GROUPS = {
    1: "overhead",
    2: "versus",       # 2 syncs, 4 throughput and 5 whole run: the same alternating runs
    3: "compiles",
    6: "limit",
    7: "launch_latency",
    8: "scaling",      # 8 SPMD and 9 causal LM
}
NAMES = {1: "reporting overhead", 2: "syncs, throughput, whole run (2, 4, 5)",
         3: "compiles on varied lengths", 6: "the limit", 7: "launch latency",
         8: "SPMD and causal LM (8, 9)"}


def main(argv: list[str] | None = None) -> int:
    common.bench_environment()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default=",".join(map(str, GROUPS)),
                        help="comma-separated group numbers (default: all)")
    parser.add_argument("--render", metavar="JSON",
                        help="only write bench/RESULTS.md again from a results file")
    args = parser.parse_args(argv)
    if args.render:
        common.say(f"wrote {common.render(args.render, common.BENCH_DIR / 'RESULTS.md')}")
        return 0
    chosen = [int(g) for g in args.groups.split(",") if g.strip()]
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    # Imported once here, inherited by every forked worker (none of this starts the runtime).
    import torch  # noqa: F401
    import torch_xla  # noqa: F401
    import transformers  # noqa: F401

    from bench import workloads

    for build in workloads.MODELS.values():  # build the cached models before timing anything
        build()
    figures: list[common.Figure] = []
    notes: list[str] = []
    for number in chosen:
        module = importlib.import_module(f"bench.{GROUPS[number]}")
        begin = time.perf_counter()
        common.say(f"== group {number}: {NAMES[number]} (at {begin - started:.0f} s)")
        try:
            produced = module.run()
        except Exception as error:  # noqa: BLE001 - one failing group must not hide the rest
            common.say(f"   group {number} failed: {type(error).__name__}: {error}")
            notes.append(f"Group {number} ({NAMES[number]}) failed: {type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}")
            produced = []
        figures += produced
        for f in produced:
            target = f" (target {f.target}: {common.status_text(f)})" if f.target else ""
            common.say(f"   {f.name}: {common.number_text(f.value, f.unit)}{target}")
        common.say(f"   ({time.perf_counter() - begin:.0f} s)")
    figures.sort(key=lambda f: int(f.group.split()[0]))
    json_path, md_path = common.write_results(figures, started, load_start, notes)
    common.say(f"wrote {json_path} and {md_path} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
