"""torch_xla's compilation analysis as records, rows, alerts and panel lines, on recorded text.

`tests/data/xla_analysis.log` is what torch_xla 2.9 wrote with PT_XLA_DEBUG_LEVEL=2 for a
3-step loop in a notebook cell (`/tmp/ipykernel_4242/2031.py`) whose input grows every step and
whose library helper (`fakelib/masking.py`, under dist-packages) reads `mask.all()` in every
step: 6 compilations, 6 executions. Real programs are traced in tests/test_tracing.py.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from hfxla_nb.events import Compiled, MetricsSnapshot
from hfxla_nb.observe import alerts as analyzer
from hfxla_nb.observe import metrics, tracing
from hfxla_nb.observe.reader import LiveMetrics
from hfxla_nb.observe.tracing import (
    CompileRecord,
    Execution,
    Frame,
    TraceLog,
    TraceParser,
    cause_text,
    execution_sites,
    is_library,
    locate,
    tally_executions,
)
from hfxla_nb.ui import html, text
from hfxla_nb.ui import text as compilations
from hfxla_nb.ui.state import LaunchState
from tests.test_runtime import make_tpu_host

RECORDED = (Path(__file__).parent / "data" / "xla_analysis.log").read_text()
CELL = "/tmp/ipykernel_4242/2031.py"
GIB = 1024**3


def parse(data: str, pieces: int = 1, cells=None):
    parser = TraceParser(cells)
    records, executions = [], []
    size = max(len(data) // pieces, 1)
    for start in range(0, len(data), size):
        done, ran = parser.feed(data[start:start + size])
        records += done
        executions += ran
    return records, executions, parser.finish()


def test_recorded_analysis_becomes_records_whatever_the_pieces():
    whole = parse(RECORDED, cells={CELL: 5})
    for pieces in (7, 113, len(RECORDED)):  # down to one character at a time
        assert parse(RECORDED, pieces, cells={CELL: 5}) == whole
    records, executions, pending = whole
    assert len(records) == 6 and len(executions) == 6 and pending == []
    assert [record.index for record in records] == [1, 2, 3, 4, 5, 6]
    fetch, sync = records[0], records[1]
    assert fetch.fetched and fetch.graph_hash == "2ac30edacec08e92b15803d12f534741"
    assert (fetch.inputs, fetch.outputs) == (0, 1)
    assert fetch.where == Frame("train", CELL, 8, cell=5)
    assert fetch.via == Frame("all_kept", "/usr/lib/python3/dist-packages/fakelib/masking.py", 2)
    assert fetch.computation_hash and fetch.sizes == {
        "input": 0, "output": 0, "aliased": 0, "intermediate": 0, "program": 0}
    assert sync.cause == "user torch_xla.sync" and not sync.fetched
    assert sync.where == Frame("train", CELL, 11, cell=5) and sync.via is None  # torch_xla's own
    assert (sync.inputs, sync.outputs) == (1, 4)
    assert [execution.fetched for execution in executions] == [True, False] * 3


def test_frames_name_cells_scripts_and_libraries():
    assert Frame("train", CELL, 12, cell=5).text() == "`train` in cell 5, line 12"
    assert Frame("<module>", CELL, 3, cell=7).text() == "cell 7, line 3"
    assert Frame("train", "/home/user/train.py", 12).text() == "`train` in train.py, line 12"
    assert Frame("f", "/x/masking_utils.py", 9).short() == "masking_utils.py:9 `f`"
    # IPython 7 (Colab) puts the cell number in the file name.
    records, _, _ = parse(RECORDED.replace(CELL, "<ipython-input-9-0a1b2c3d4e5f>"))
    assert records[1].where.text() == "`train` in cell 9, line 11"
    assert is_library("/usr/local/lib/python3.11/site-packages/transformers/trainer.py")
    assert is_library(tracing.__file__)  # hfxla_nb's own frames are not the user's
    assert not is_library(CELL) and not is_library("<string>")
    assert not is_library("/home/user/train.py")
    lib = Frame("fwd", "/usr/lib/python3/site-packages/transformers/modeling_bert.py", 40)
    xla = Frame("sync", "/usr/lib/python3/site-packages/torch_xla/torch_xla.py", 87)
    user = Frame("train", CELL, 4, 5)
    assert locate([xla, lib, user]) == (user, lib)
    assert locate([xla, user]) == (user, None)
    assert locate([xla, lib]) == (None, lib)


def test_a_warm_workers_job_is_never_placed_in_the_cell_that_forked_the_worker():
    """A warm session's worker was forked in an earlier cell, whose frames it still holds
    under the launcher's: a job with no frame of the user's (a warm `generate`) names the
    library line, not that cell."""
    import hfxla_nb.launch.worker as worker
    from hfxla_nb.train.worker import generation

    frames = "\n".join([
        f"Compilation Analysis:   decode_prompts ({generation.__file__}:40)",
        f"Compilation Analysis:   run_rank ({worker.__file__}:369)",
        f"Compilation Analysis:   <module> ({CELL}:2)"])
    text = RECORDED.replace(
        "Compilation Analysis:   all_kept (/usr/lib/python3/dist-packages/fakelib/masking.py:2)\n"
        "Compilation Analysis:   train (/tmp/ipykernel_4242/2031.py:8)\n"
        "Compilation Analysis:   <module> (/home/user/train.py:21)", frames, 1)
    assert text != RECORDED
    records, _, _ = parse(text, cells={CELL: 8})
    assert records[0].where is None  # not "cell 8, line 2": the fine_tune cell
    assert records[0].via == Frame("decode_prompts", generation.__file__, 40)


def test_blocks_that_never_finish_or_lack_sizes():
    # A compilation that failed (no post-compilation block), frames cut at
    # PT_XLA_DEBUG_MAX_FRAME, and sizes torch_xla could not read ("Unknown ").
    text_ = RECORDED.split("Computation hash:")[0]
    records, executions, pending = parse(text_)
    assert records == [] and executions == [] and len(pending) == 1
    assert pending[0].sizes is None and pending[0].memory is None
    unknown = RECORDED.replace("Intermediate tensor size: 0.000000 GB",
                               "Intermediate tensor size: Unknown  GB", 1)
    assert "intermediate" not in parse(unknown)[0][0].sizes
    cut = RECORDED.replace("Compilation Analysis:   <module> (/home/user/train.py:21)",
                           "Compilation Analysis:   ..........")
    assert parse(cut)[0][0].where == Frame("train", CELL, 8)


def test_rows_group_compilations_by_line():
    records, executions, _ = parse(RECORDED, cells={CELL: 5})
    log = TraceLog()
    log.add(records)
    log.add(records[:2])  # sent again: counted once
    log.executions = execution_sites(tally_executions(executions))
    assert log.compiles == 6
    rows = log.rows()
    assert [(row.where.line, row.compiles, row.graphs) for row in rows] == [(8, 3, 3), (11, 3, 3)]
    assert rows[0].place() == "`train` in cell 5, line 8 (via masking.py:2 `all_kept`)"
    assert rows[0].fetched and cause_text(rows[0].cause).startswith("value fetched")
    assert cause_text(rows[1].cause) == "torch_xla.sync()"
    fetches = log.fetch_sites()
    assert [(site.where.line, site.count, site.graphs) for site in fetches] == [(8, 3, 3)]
    assert pickle.loads(pickle.dumps(log)).rows()[0].graphs == 3


def summary_with(trace: TraceLog, *, steps: int, compiles: int, transfers: int = 0,
                 memory=None) -> metrics.XlaSummary:
    data = {"counters": {"MarkStep": steps}, "fallback_ops": [], "metrics": {
        "CompileTime": {"count": compiles, "total": compiles * 1e9, "samples": []},
        "TransferFromDeviceTime": {"count": transfers, "total": 1e3, "samples": []}}}
    summary = metrics.summarize(data, memory=memory)
    summary.trace = trace
    return summary


def recorded_log(steps_cells: int = 5) -> TraceLog:
    records, executions, _ = parse(RECORDED, cells={CELL: steps_cells})
    log = TraceLog()
    log.add(records)
    log.executions = execution_sites(tally_executions(executions))
    return log


def test_the_recompiling_alert_names_the_line_and_what_to_change_there():
    alerts = analyzer.analyze(summary_with(recorded_log(), steps=3, compiles=6))
    alert = next(a for a in alerts if a.code == "frequent-compiles")
    # Both lines compiled 3 different graphs in 3 steps; the one with the most graphs, first.
    assert alert.title == ("Recompiling: `train` in cell 5, line 8 (via masking.py:2 "
                           "`all_kept`) compiled 3 different graphs in 3 steps")
    assert "reading a tensor's value" in alert.explanation
    assert alert.fix.startswith("At `train` in cell 5, line 8 (via masking.py:2 `all_kept`): "
                                "remove the .item()")


def test_a_fetch_in_the_step_is_named_once_rates_have_enough_steps():
    log = TraceLog()
    line = Frame("train", CELL, 14, 5)
    log.executions = execution_sites(tally_executions(
        [Execution(
            "most likely user code trying to access tensor value before torch_xla.sync",
            "h1", line)] * 6))
    warning = analyzer.analyze(summary_with(log, steps=6, compiles=2, transfers=6))
    alert = next(a for a in warning if a.code == "frequent-transfers")
    assert alert.title == ("Device-to-host transfers: 6 in 6 steps, values read at "
                           "`train` in cell 5, line 14")
    assert "`train` in cell 5, line 14 (6 times)" in alert.explanation
    assert alert.fix.startswith("At `train` in cell 5, line 14: fetch values only every N")
    # One fetch in a 2-step run: too few steps for a rate; one per step over 3 steps is one.
    quiet = analyzer.analyze(summary_with(log, steps=2, compiles=1, transfers=1))
    assert "frequent-transfers" not in [a.code for a in quiet]
    quiet = analyzer.analyze(summary_with(log, steps=2, compiles=1, transfers=2))
    assert "frequent-transfers" not in [a.code for a in quiet]
    three = analyzer.analyze(summary_with(log, steps=3, compiles=1, transfers=3))
    assert "frequent-transfers" in [a.code for a in three]


@pytest.mark.parametrize(("steps", "compiles", "graphs_at_line", "flagged"), [
    (6, 6, None, True),     # the %%xla_metrics case of the issue: a new shape every step
    (2, 2, None, False),    # too few steps to say
    (3, 3, 2, False),       # first-step graph + steady graph + a final fetch: the usual start
    (3, 3, 3, True),
    (10, 6, None, False),   # torch_xla's own rule: 0.6 per step but still in warm-up
])
def test_nearly_every_step_compiling_is_flagged_even_in_warm_up(steps, compiles,
                                                                 graphs_at_line, flagged):
    trace = None
    if graphs_at_line is not None:
        trace = TraceLog()
        line = Frame("train", CELL, 9, 5)
        trace.add([CompileRecord(i + 1, "user torch_xla.sync", f"h{min(i, graphs_at_line - 1)}",
                                 where=line) for i in range(compiles)])
    summary = summary_with(trace, steps=steps, compiles=compiles) if trace else (
        metrics.summarize({"counters": {"MarkStep": steps}, "metrics": {
            "CompileTime": {"count": compiles, "total": 1e9, "samples": []}}}))
    codes = [alert.code for alert in analyzer.analyze(summary)]
    assert ("frequent-compiles" in codes) is flagged


# A decoder's training step compiled on a TPU: the post-compilation sizes are those
# pytorch/xla's own debugging guide shows (torch_xla prints GB with 6 decimals).
TPU_STEP = (Path(__file__).parent / "data" / "xla_analysis_tpu_step.log").read_text()


def tpu_step_log(tmp_path, generation: str = "v5e") -> TraceLog:
    records, _, _ = parse(TPU_STEP, cells={"/tmp/ipykernel_81/3412.py": 5})
    log = TraceLog()
    log.add(records)
    device = tracing.device_of(str(make_tpu_host(tmp_path / generation, generation)), {})
    log.device_memory, log.device_name = device["memory"], device["name"]
    return log


def test_graph_memory_against_the_chip_with_recorded_tpu_values(tmp_path):
    log = tpu_step_log(tmp_path)
    step = log.largest()
    assert step.memory == int(round(1.548 * GIB)) + int(round(7.92246 * GIB)) - int(
        round(1.547871 * GIB)) + int(round(12.124478 * GIB)) + int(round(0.02821 * GIB))
    assert cause_text(step.cause) == "MpDeviceLoader step"
    summary = summary_with(log, steps=20, compiles=1)
    line = ("graph memory: the largest graph needs 20.1 GiB (`train_loop_fn` in cell 5, "
            "line 48); a v5e chip has 16.0 GiB")
    assert line in text.metrics_text(summary, [])
    assert "a v5e chip has 16.0 GiB" in html.summary_html(summary)
    alert = analyzer.graph_memory_alert(summary)
    assert alert.code == "graph-memory" and alert.severity == "warning"
    assert alert.title == ("The graph compiled at `train_loop_fn` in cell 5, line 48 needs "
                           "20.1 GiB; a v5e chip has 16.0 GiB")
    for remedy in ("smaller batch", "bfloat16", "torch_xla.utils.checkpoint", "FSDP"):
        assert remedy in alert.fix
    # A v6e chip (32 GiB) has room; a v3 core has 16 GiB of its chip's 32.
    assert analyzer.graph_memory_alert(summary_with(tpu_step_log(tmp_path, "v6e"), steps=20,
                                                    compiles=1)) is None
    v3 = tpu_step_log(tmp_path, "v3")
    assert (v3.device_memory, v3.device_name) == (16 * GIB,
                                                  "a v3 core (32 GiB per chip of 2 cores)")
    # The live memory of the device (xm.get_memory_info on a TPU), when known, wins.
    live = summary_with(log, steps=20, compiles=1,
                        memory={"bytes_used": 1, "bytes_limit": 32 * GIB})
    assert "; the device has 32.0 GiB" in text.metrics_text(live, [])
    assert analyzer.graph_memory_alert(live) is None
    assert tracing.device_of(str(tmp_path / "none"), {}) is None  # no TPU: nothing to compare


def test_the_compilations_view_in_every_panel():
    state = LaunchState(1)
    data = {"counters": {"MarkStep": 3}, "fallback_ops": [], "process": {"pid": 77, "ranks": [0]},
            "metrics": {"CompileTime": {"count": 6, "total": 6e9, "samples": []}}}
    records, executions, _ = parse(RECORDED, cells={CELL: 5})
    timed = [dataclasses.replace(r, compile_time=0.5) for r in records]
    state.handle(Compiled(0, 77, tuple(timed[:4]), execution_sites(tally_executions(executions))))
    state.handle(Compiled(0, 77, tuple(timed[4:]), ()))
    state.handle(MetricsSnapshot(0, 3, data))
    view = state.view()
    lines = text.launch_text(view).splitlines()
    start = lines.index("compilations by line (6 graphs traced):")
    assert lines[start + 1:start + 3] == [
        "  `train` in cell 5, line 8 (via masking.py:2 `all_kept`): 3 graphs, 3 different, "
        "1.5 s, value fetched (.item(), print or if on a tensor)",
        "  `train` in cell 5, line 11: 3 graphs, 3 different, 1.5 s, torch_xla.sync()",
    ]
    assert "graph memory: the largest graph needs under 1 KiB" in lines[start + 3]
    page = html.launch_html(view)
    assert "compilations by line" in page and "<th" in page and "torch_xla.sync()" in page
    assert {a.code for a in view.alerts} >= {"frequent-compiles"}
    # Other processes' compilations stay with their process.
    live = LiveMetrics()
    live.add(Compiled(0, 78, tuple(timed), ()))
    live.add(MetricsSnapshot(0, 3, data))
    assert live.summary().trace is None


def test_a_note_or_nothing_when_not_traced():
    plain = metrics.summarize({"counters": {"MarkStep": 2}})
    assert compilations.compilation_lines(plain) == []
    plain.trace = TraceLog(note=tracing.TOO_LATE)
    assert compilations.compilation_lines(plain) == [tracing.TOO_LATE]
    plain.trace = TraceLog()
    assert compilations.compilation_lines(plain) == [compilations.NONE_COMPILED]
