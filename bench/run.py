"""`make bench`: every benchmark group, then `bench/results/<date>.json` and `bench/RESULTS.md`.

`python -m bench.run` runs them all; `--groups 1,4` measures the figures numbered 1 and 4 in
RESULTS.md (and those measured in the same runs; the files are written either way, with the
figures measured); a number that names no figure is refused with the list of those that exist.
`BENCH_QUICK=1`: two repetitions instead of five and results under /tmp/hfxla_nb_bench_quick
(for working on the bench, never a result).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # noqa: E402 - after the path (python bench/run.py)

# The figures, numbered as in bench/RESULTS.md's "#" column (and docs/speed.md), and the module that
# measures each (`run() -> list[Figure]`). Some modules measure several figures in the same
# runs: asking for one of them measures them all.
FIGURES = {
    1: ("reporting overhead", "overhead"),
    2: ("syncs", "versus"),
    3: ("compiles on varied lengths", "compiles"),
    4: ("throughput", "versus"),
    5: ("whole run", "versus"),
    6: ("the limit", "limit"),
    7: ("launch latency", "launch_latency"),
    8: ("SPMD", "scaling"),
    9: ("causal LM", "scaling"),
    10: ("tracing cost", "trace_overhead"),
    11: ("LoRA", "lora"),
    12: ("host time", "host_time"),
    13: ("relay throughput", "relay"),
    14: ("predict", "predict_group"),
    15: ("pods", "pods_group"),
    16: ("task compiles", "task_compiles"),
    17: ("images and audio", "media_compiles"),
    18: ("generation", "generation"),
    19: ("notebook loop", "notebook_loop"),
}


# Each module's share of make bench's 15 minutes on an idle 2-core machine, in seconds (what
# its repetitions and steps are sized for): at most 835 s, leaving room for the start (models
# built, about 15 s) and 50 s of margin (a whole run at most ~900 s). A group that takes longer
# is named at the end of the run, and every group's time is written to the results, so the 15
# minutes can be kept as figures are added. The shares are about 1.5x each group's time in
# the whole run of bench/results/2026-12-06.json (560 s; host_time 109 s, versus 87 s), plus
# 15 s each for the host rows of predict_group and generation (a compiled graph against a
# traced one), which that run did not have.
SHARES = {"overhead": 30, "versus": 130, "compiles": 33, "limit": 40, "launch_latency": 55,
          "scaling": 45, "trace_overhead": 60, "lora": 26, "host_time": 120, "relay": 25,
          "predict_group": 45, "pods_group": 40, "task_compiles": 42,
          "media_compiles": 55, "generation": 25, "notebook_loop": 44}


def over_share(seconds: dict[str, float]) -> list[str]:
    """The modules that took longer than their share (`SHARES`), as "versus: 250 s (share
    190 s)"; a module without a share is never named."""
    return [f"{module}: {spent:.0f} s (share {SHARES[module]} s)"
            for module, spent in seconds.items()
            if module in SHARES and spent > SHARES[module]]


def figures_text() -> str:
    """The figures that exist, for `--help` and for a refusal: "1 reporting overhead, ..."."""
    return ", ".join(f"{number} {name}" for number, (name, _) in FIGURES.items())


def chosen_modules(groups: str) -> list[tuple[str, str]]:
    """The modules that measure the figures named in `groups` ("1,4"), each once, in the order
    of the figures: `[(what they measure, module), ...]`.

    Raises:
        ValueError: a number that names no figure, with the figures that exist.
    """
    asked: set[str] = set()
    for part in (p.strip() for p in groups.split(",")):
        if not part:
            continue
        if not part.isdigit() or int(part) not in FIGURES:
            raise ValueError(f"there is no figure {part!r}; the figures are {figures_text()}")
        asked.add(FIGURES[int(part)][1])
    modules: dict[str, list[str]] = {}
    for number, (name, module) in FIGURES.items():  # name all that a module measures
        if module in asked:
            modules.setdefault(module, []).append(f"{number} {name}")
    return [(", ".join(names), module) for module, names in modules.items()]


def numbered(figures: list[common.Figure], module: str) -> list[common.Figure]:
    """`figures` of `module`, each group starting with its figure number (RESULTS.md sorts by
    it): a module that names its group without one ("relay throughput") gets its number."""
    number = min(n for n, (_, m) in FIGURES.items() if m == module)
    for figure in figures:
        if not figure.group.split()[0].isdigit():
            figure.group = f"{number} {figure.group}"
    return figures


def main(argv: list[str] | None = None) -> int:
    common.bench_environment()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default=",".join(map(str, FIGURES)),
                        help=f"comma-separated figure numbers (default: all): {figures_text()}")
    parser.add_argument("--render", metavar="JSON",
                        help="only write bench/RESULTS.md again from a results file")
    args = parser.parse_args(argv)
    if args.render:
        common.say(f"wrote {common.render(args.render, common.BENCH_DIR / 'RESULTS.md')}")
        return 0
    try:
        chosen = chosen_modules(args.groups)
    except ValueError as error:
        parser.error(str(error))  # exits with status 2, the figures that exist named
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
    seconds: dict[str, float] = {}
    for what, name in chosen:
        module = importlib.import_module(f"bench.{name}")
        begin = time.perf_counter()
        common.say(f"== {what} (at {begin - started:.0f} s)")
        try:
            produced = module.run()
        except Exception as error:  # noqa: BLE001 - one failing group must not hide the rest
            common.say(f"   {what} failed: {type(error).__name__}: {error}")
            notes.append(f"Figures {what} failed: {type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}")
            produced = []
        figures += numbered(produced, name)
        for f in produced:
            target = f" (target {f.target}: {common.status_text(f)})" if f.target else ""
            common.say(f"   {f.name}: {common.number_text(f.value, f.unit)}{target}")
        seconds[name] = time.perf_counter() - begin
        common.say(f"   ({seconds[name]:.0f} s)")
    figures.sort(key=lambda f: int(f.group.split()[0]))
    for line in over_share(seconds):
        common.say(f"   over its share of the 15 minutes: {line}")
    json_path, md_path = common.write_results(figures, started, load_start, notes,
                                              group_seconds=seconds)
    common.say(f"wrote {json_path} and {md_path} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
