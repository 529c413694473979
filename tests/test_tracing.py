"""Compilation tracing on real torch_xla: alerts that agree with torch_xla's own analysis, in
launched workers, in `%%xla_metrics`, and the file handling underneath."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hfxla_nb.events import Compiled
from hfxla_nb.observe import tracing
from hfxla_nb.observe.tracing import FETCH_CAUSE
from tests.helpers import Kernel, run_python, subprocess_env

DATA = Path(__file__).parent / "data" / "xla_analysis.log"

# Each program runs as the code of a notebook cell (IPython's file name for it), under what
# `%%xla_metrics` does: tracing.begin_cell, the cell, CellTrace.end, summarize, analyze.
RUNNER = """
import json, sys, torch, torch_xla
from hfxla_nb.observe import alerts, metrics, tracing
CELL = "/tmp/ipykernel_7/1.py"
trace = tracing.begin_cell({CELL: 1})
before = metrics.snapshot()
dev = torch_xla.device()
exec(compile(sys.argv[1], CELL, "exec"), {"torch": torch, "torch_xla": torch_xla, "dev": dev})
log = trace.end()
summary = metrics.summarize(metrics.diff(before, metrics.snapshot()), steps=int(sys.argv[2]))
summary.trace = log
found = alerts.analyze(summary)
print(json.dumps({
    "compiles": summary.compiles, "compile_time": summary.compile_seconds,
    "traced_time": sum(r.compile_time or 0 for r in log.records),
    "timed": sum(r.compile_time is not None for r in log.records),
    "alerts": [[a.code, a.severity, a.title, a.explanation, a.fix] for a in found]}))
"""

PROGRAMS = {
    # A new input shape every step: 6 steps, 6 different graphs at the sync line.
    "recompiling": (6, """\
def step(n):
    x = torch.ones(n, 4, device=dev)
    y = (x * 2).sum()
    torch_xla.sync()
for n in range(2, 8):
    step(n)
"""),
    # Fixed shapes, a value read with .item() inside every step.
    "fetching": (8, """\
w = torch.ones(4, device=dev)
for step in range(8):
    loss = (torch.ones(3, 4, device=dev) * w).sum()
    if loss.item() > 1e9:
        print("large")
    w = w * 0.5
    torch_xla.sync()
"""),
    # A best-practice loop: fixed shapes, no reads.
    "clean": (12, """\
w = torch.ones(4, device=dev)
for step in range(12):
    w = w * 0.5 + (torch.ones(3, 4, device=dev) * w).mean(0)
    torch_xla.sync()
"""),
    # A 2-step function that reads one value once.
    "one-fetch": (2, """\
w = torch.ones(4, device=dev)
for step in range(2):
    w = w * 0.5
    torch_xla.sync()
print(w.sum().item())
"""),
}


def torch_xla_says(path: Path) -> dict:
    """What torch_xla's own analysis file says, read with nothing of hfxla_nb: per block kind,
    (cause, graph hash, first line in the cell)."""
    blocks = {"Compilation": [], "Execution": []}
    for kind in blocks:
        pattern = re.compile(
            rf"^{kind} Analysis: {kind} Cause\n{kind} Analysis:   (?P<cause>.*)\n"
            rf"(?:.*\n)*?{kind} Analysis:   Graph Hash: (?P<hash>\w+)\n"
            rf"(?:.*\n)*?{kind} Analysis: Python Frame Triggered Execution: \n"
            rf"(?:{kind} Analysis:   .*site-packages.*\n)*"
            rf"{kind} Analysis:   (?P<function>\S+) \(/tmp/ipykernel_7/1\.py:(?P<line>\d+)\)",
            re.M)
        blocks[kind] = [(m["cause"], m["hash"], _place(m["function"], int(m["line"])))
                        for m in pattern.finditer(path.read_text())]
    return blocks


def _place(function: str, line: int) -> str:
    return f"cell 1, line {line}" if function == "<module>" else (
        f"`{function}` in cell 1, line {line}")


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    results = {}
    for name, (steps, code) in PROGRAMS.items():
        log = tmp_path_factory.mktemp(name) / "analysis.log"
        result = run_python(RUNNER.replace("sys.argv[1]", repr(code)).replace(
            "int(sys.argv[2])", str(steps)), PT_XLA_DEBUG_LEVEL="2",
            PT_XLA_DEBUG_FILE=str(log))
        results[name] = (steps, result, torch_xla_says(log))
    return results


@pytest.mark.launch
def test_alerts_agree_with_torch_xlas_own_analysis(programs):
    for name, (steps, result, says) in programs.items():
        compiled, executed = says["Compilation"], says["Execution"]
        # The panel counts what torch_xla analysed, and the compile times are its own.
        assert result["compiles"] == len(compiled), name
        assert result["timed"] == len(compiled), name
        assert result["traced_time"] == pytest.approx(result["compile_time"], rel=1e-6), name
        alerts = {code: (title, explanation, fix)
                  for code, _, title, explanation, fix in result["alerts"]}
        lines = {line for cause, _, line in compiled if cause == "user torch_xla.sync"}
        for line in lines:
            graphs = len({h for cause, h, at in compiled if at == line})
            recompiling = graphs >= steps >= 3
            assert ("frequent-compiles" in alerts) is recompiling, name
            if recompiling:
                assert alerts["frequent-compiles"][0] == (
                    f"Recompiling: {line} compiled {graphs} different graphs in {steps} steps")
                assert alerts["frequent-compiles"][2].startswith(f"At {line}: ")
        fetches = [line for cause, _, line in executed if cause.startswith(FETCH_CAUSE)]
        if len(fetches) >= steps >= 3:
            (line,) = set(fetches)
            title, explanation, fix = alerts["frequent-transfers"]
            assert title.endswith(f"values read at {line}"), name
            assert f"{line} ({len(fetches)} times)" in explanation
        else:
            assert "frequent-transfers" not in alerts, name
    # Each program is the case it stands for (not constants: torch_xla's text decides).
    assert {name for name, (_, result, _) in programs.items() if result["alerts"]} == {
        "recompiling", "fetching"}


LAUNCHED = """
import json, os, torch
import hfxla_nb as hx

def train(shapes):
    import torch_xla
    dev = torch_xla.device()
    w = torch.zeros(8, device=dev)
    for step, rows in enumerate(shapes, start=1):
        x = torch.ones(rows, 8).to(dev)
        w = w + (x @ torch.ones(8, 8, device=dev)).mean(0)
        hx.report(step=step, total=len(shapes))
        torch_xla.sync()
    return os.environ.get("PT_XLA_DEBUG_LEVEL")

traced = hx.notebook_launcher(train, args=([3, 4, 5, 6, 7, 8],), progress="console")
plain = hx.notebook_launcher(train, args=([3, 3, 3],), progress="console", trace_compiles=False)
print(json.dumps({"traced": traced, "plain": plain}))
"""


@pytest.mark.launch
def test_a_launched_recompiling_loop_shows_its_line_and_no_raw_analysis(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LAUNCHED)
    env = {name: value for name, value in subprocess_env().items()
           if not name.startswith("PT_XLA_")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"traced": "2", "plain": None}
    _, first, second = done.stdout.split("✔ launch finished")
    assert "compilations by line (6 graphs traced):" in first
    assert "  `train` in train.py, line 13: 6 graphs, 6 different," in first
    assert "Recompiling: `train` in train.py, line 13 compiled 6 different graphs in 6 steps" in (
        first)
    assert "compilations by line" not in second
    assert "Compilation Analysis" not in out and "Execution Analysis" not in out


@pytest.mark.kernel
def test_xla_metrics_traces_the_cell_or_says_in_one_line_why_not():
    kernel = Kernel()
    try:
        kernel.run("%load_ext hfxla_nb")
        kernel.run("def step(n):\n    import torch, torch_xla\n"
                   "    x = torch.ones(n, 4, device=torch_xla.device())\n"
                   "    torch_xla.sync()\n")
        cell = kernel.run("%%xla_metrics\nfor n in range(2, 8):\n    step(n)\n")
        panel = cell.displays[-1]["data"]["text/plain"]
        assert "  `step` in cell 2, line 4: 6 graphs, 6 different," in panel
        assert "Recompiling: `step` in cell 2, line 4 compiled 6 different graphs in 6 steps" in (
            panel)
        again = kernel.run("%%xla_metrics\nstep(3)\nstep(3)\n").displays[-1]["data"]
        assert "compilations by line: none" in again["text/plain"]
        assert "compilations by line" in again["text/html"]
        assert "Compilation Analysis" not in cell.text + kernel.log()
    finally:
        kernel.close()
    late = Kernel()
    try:
        late.run("%load_ext hfxla_nb")
        late.run("import torch, torch_xla\nx = torch.ones(2, device=torch_xla.device()) * 2\n"
                 "torch_xla.sync()")
        panel = late.run("%%xla_metrics\ny = x * 3\ntorch_xla.sync()\n").displays[-1]["data"]
        assert tracing.TOO_LATE in panel["text/plain"]
        assert "XLA in 1 step: 1 compile" in panel["text/plain"]  # today's view, still there
    finally:
        late.close()


# -- the file and the events, without a launch ---------------------------------------------------


def test_file_tail_rotates_without_losing_a_block(tmp_path, monkeypatch):
    monkeypatch.setattr(tracing, "ROTATE_BYTES", 2000)
    path = tmp_path / "analysis.log"
    tail = tracing.FileTail(str(path), owned=True)
    recorded = DATA.read_text()
    blocks = recorded.split("\n\n")
    read = ""
    for block in blocks:  # torch_xla appends each block, reopening the file by name
        with open(path, "a") as file:
            file.write(block + "\n\n")
        read += tail.read()
    read += tail.read() + tail.read()
    assert read == "\n\n".join(blocks) + "\n\n"
    # Rotated as it went: what is left on disk is at most one rotation's worth.
    left = [p.stat().st_size for p in tmp_path.iterdir()]
    assert sum(left) < 2000 + 1500 and len(recorded) > 10000
    tail.remove()
    assert list(tmp_path.iterdir()) == []


def test_the_process_tracer_sends_each_compilation_once(tmp_path, monkeypatch):
    path = tmp_path / "analysis.log"
    sent = []
    tracer = tracing.ProcessTracer(tracing.FileTail(str(path), owned=True), sent.append,
                                   {"/tmp/ipykernel_4242/2031.py": 5}, {"memory": 1, "name": "x"})
    tracer.ranks.add(0)
    recorded = DATA.read_text()
    half = recorded.index("Compilation Analysis: Compilation Cause", 5000)
    path.write_text(recorded[:half])
    tracer.poll()
    with open(path, "a") as file:
        file.write(recorded[half:])
    tracer.poll()
    tracer.poll(final=True)
    assert all(isinstance(event, Compiled) for event in sent)
    indexes = [record.index for event in sent for record in event.records]
    assert indexes == [1, 2, 3, 4, 5, 6]
    assert sent[-1].executions and sum(site.count for site in sent[-1].executions) == 6
    assert sent[0].device == {"memory": 1, "name": "x"} and sent[0].pid == os.getpid()
