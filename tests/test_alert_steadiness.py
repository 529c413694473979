"""The live panel's compile alert holds still: an SPMD loop whose input
changes shape for its first five steps, then keeps it, read snapshot by snapshot as the panel
reads it. Once the changing input and the line that compiled a graph per shape are known,
every snapshot shows the same alert, whatever the compile rate does."""

from __future__ import annotations

from hfxla_nb.observe.alerts import analyze
from hfxla_nb.observe.metrics import XlaSummary
from hfxla_nb.observe.tracing import CompileRecord, Frame, TraceLog

LINE = Frame("train", "/tmp/ipykernel_1/27.py", 27, cell=2)
CHANGING = 6  # steps 1-6 see a new shape of x; the later ones the last shape again


def snapshot(step: int, changing: int = CHANGING) -> XlaSummary:
    """What the panel has at `step`: one compile per new shape at LINE, the shapes seen."""
    compiles = min(step, changing)
    trace = TraceLog()
    trace.add([CompileRecord(i, "user torch_xla.sync", f"hash{i}", where=LINE)
               for i in range(1, compiles + 1)])
    shapes = [{"shape": [8 + i, 8], "first": i, "last": i if i < changing else step}
              for i in range(1, compiles + 1)]
    return XlaSummary(steps=step, compiles=compiles, compile_seconds=2.0 * compiles,
                      executions=step, execute_seconds=0.01 * step, input_shapes={"x": shapes},
                      compiles_after_warmup=max(0, compiles - 3) if step > 3 else None,
                      steps_after_warmup=step - 3 if step > 3 else None, trace=trace)


def compile_alerts(step: int, changing: int = CHANGING) -> list[tuple[str, str]]:
    return [(a.code, a.title.split(" compiled ")[0]) for a in analyze(snapshot(step, changing))
            if a.code in {"frequent-compiles", "recompiled", "shape-changes"}]


def test_the_compile_alert_is_one_and_the_same_from_first_to_last_snapshot():
    # From step 3 (3 graphs in 3 steps: a new graph every step) to the end.
    seen = [compile_alerts(step) for step in range(3, 40)]
    assert all(len(alerts) == 1 for alerts in seen), seen
    assert {alerts[0] for alerts in seen} == {
        ("frequent-compiles", "Recompiling: `train` in cell 2, line 27")}


def test_its_numbers_follow_the_run_and_it_still_names_the_input():
    (late,) = [a for a in analyze(snapshot(39)) if a.code == "frequent-compiles"]
    assert late.title == ("Recompiling: `train` in cell 2, line 27 compiled 6 different graphs "
                          "in 39 steps")
    assert "input 'x' had 6 different shapes" in late.explanation
    assert late.fix.startswith("At `train` in cell 2, line 27: ")
    # While torch_xla's rate rule fires it is a warning; after, its cost decides.
    (early,) = [a for a in analyze(snapshot(5)) if a.code == "frequent-compiles"]
    assert early.severity == "warning"


def test_a_few_buckets_compiled_in_the_warm_up_raise_no_alert():
    # Three length buckets (fine_tune's most), each compiled once in the first steps: the
    # steady alert is for inputs of many shapes only.
    assert all(compile_alerts(step, changing=3) == [] for step in range(7, 40))


def growing(step: int) -> XlaSummary:
    """A loop reporting only step and loss (no `inputs=`) whose batch grows every 8 steps: a
    new graph at LINE in steps 1, 2 and every 8th, read as the panel reads it (the warm-up
    snapshot at step 11)."""
    new = [s for s in range(1, step + 1) if s in (1, 2) or s % 8 == 0]
    trace = TraceLog()
    trace.add([CompileRecord(i, "user torch_xla.sync", f"hash{i}", where=LINE)
               for i in range(1, len(new) + 1)])
    warm = len([s for s in new if s <= 11]) if step > 11 else None
    return XlaSummary(steps=step, compiles=len(new), compile_seconds=2.0 * len(new),
                      executions=step, execute_seconds=0.01 * step, trace=trace,
                      compiles_after_warmup=len(new) - warm if warm is not None else None,
                      steps_after_warmup=step - 11 if warm is not None else None,
                      warmup_compiles=warm)


def test_without_inputs_the_trace_alone_raises_the_same_alert_to_the_end():
    seen = [[(a.code, a.severity, a.title.split(" compiled ")[0]) for a in analyze(growing(step))
             if a.code in {"frequent-compiles", "recompiled", "shape-changes"}]
            for step in range(3, 80)]
    first = next(index for index, alerts in enumerate(seen) if alerts)
    # Quiet while the warm-up explains the graphs; from the first graph after it, one alert.
    assert first + 3 == 16 and not any(seen[:first])
    assert all(alerts == [("frequent-compiles", "warning", "Recompiling: `train` in cell 2, "
                           "line 27")] for alerts in seen[first:]), seen[first:]


def test_a_cell_without_steps_that_compiled_five_graphs_at_one_line_gets_the_alert():
    # `%%xla_metrics` over a cell reports no step: the trace alone names the line, and the
    # alert says how many graphs, with no rate and no "in 0 steps".
    trace = TraceLog()
    trace.add([CompileRecord(i, "user torch_xla.sync", f"hash{i}", where=LINE)
               for i in range(1, 6)])
    cell = XlaSummary(steps=None, compiles=5, compile_seconds=1.0, executions=5,
                      execute_seconds=0.01, trace=trace)
    (alert,) = [a for a in analyze(cell) if a.code == "frequent-compiles"]
    assert alert.title == "Recompiling: `train` in cell 2, line 27 compiled 5 different graphs"
    assert alert.explanation.startswith("XLA compiled 5 graphs, taking "), alert.explanation


def test_a_trace_ahead_of_the_counters_never_counts_more_graphs_at_a_line_than_in_all():
    # The trace's compilations and the counters' snapshots reach the panel apart: a snapshot
    # read before the sixth graph's counter moved, with the trace already holding it.
    behind = snapshot(20)
    behind.compiles -= 1
    (found,) = [a for a in analyze(behind) if a.code == "frequent-compiles"]
    assert f"6 of the 6 graphs end at {LINE.text()}" in found.explanation, found.explanation


def test_the_alert_keeps_its_length_when_the_rate_after_the_warm_up_arrives():
    # Past the 10 warm-up steps the alert says how many graphs the steps after them compiled:
    # a clause of its own, from the warm-up snapshot (read a step late) 3 steps on. Said in
    # as many words before the figure exists, the live alert keeps its lines.
    lengths = {}
    for step in range(11, 40):
        summary = snapshot(step, changing=30)
        if step > 11:  # the warm-up snapshot, read at step 11
            summary.compiles_after_warmup = min(step, 30) - 10
            summary.steps_after_warmup = step - 11
        else:
            summary.compiles_after_warmup = summary.steps_after_warmup = None
        (found,) = [a for a in analyze(summary) if a.code == "frequent-compiles"]
        lengths[step] = len(found.explanation)
    assert max(lengths.values()) - min(lengths.values()) <= 10, lengths
