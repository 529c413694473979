"""The metrics layer: snapshots, diffs, summaries and the analyzer, on recorded torch_xla data
and on a real XLA:CPU loop whose input shapes change every step."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from hfxla_nb.events import MetricsSnapshot
from hfxla_nb.observe import alerts as analyzer
from hfxla_nb.observe import metrics
from hfxla_nb.observe import metrics as input_shapes
from hfxla_nb.observe import reader as live_metrics
from tests.helpers import run_python

NS = 1e9


def snap(counters=None, **metric_counts) -> dict:
    """A snapshot in `_xla.metrics_snapshot()` form: name=(count, total_ns, [sample values])."""
    data = {"counters": dict(counters or {}), "metrics": {}, "fallback_ops": []}
    for name, (count, total, samples) in metric_counts.items():
        data["metrics"][name] = {
            "count": count, "total": total, "samples": [(i, v) for i, v in enumerate(samples)]
        }
    data["fallback_ops"] = [n for n in data["counters"] if n.startswith("aten::")]
    return data


def codes(alerts):
    return [alert.code for alert in alerts]


# -- diff and summary ---------------------------------------------------------------------------


def test_diff_subtracts_counters_and_keeps_only_new_samples():
    before = snap({"MarkStep": 3, "UncachedCompile": 2, "aten::_local_scalar_dense": 1},
                  CompileTime=(2, 3 * NS, [1 * NS, 2 * NS]))
    after = snap({"MarkStep": 10, "UncachedCompile": 2, "aten::_local_scalar_dense": 1,
                  "aten::nonzero": 4},
                 CompileTime=(3, 8 * NS, [1 * NS, 2 * NS, 5 * NS]),
                 ExecuteTime=(7, 0.7 * NS, [0.1 * NS] * 7))
    result = metrics.diff(before, after)
    assert result["counters"] == {"MarkStep": 7, "aten::nonzero": 4}
    assert result["metrics"]["CompileTime"]["count"] == 1
    assert result["metrics"]["CompileTime"]["samples"] == [(2, 5 * NS)]
    assert result["fallback_ops"] == ["aten::nonzero"]
    summary = metrics.summarize(result)
    assert summary.steps == 7  # from MarkStep
    assert summary.compiles == 1 and summary.compile_seconds == pytest.approx(5.0)
    assert summary.max_compile_seconds == pytest.approx(5.0)
    assert summary.fallbacks == {"aten::nonzero": 4}
    assert summary.item_calls == 0


def test_summarize_reads_torch_xla_names():
    data = snap(
        {"CachedCompile": 38, "MarkStep": 40, "aten::_local_scalar_dense": 41,
         "aten::nonzero": 2, "ExecuteReplicated": 80},
        CompileTime=(2, 4 * NS, [1.5 * NS, 2.5 * NS]),
        ExecuteReplicatedTime=(80, 2 * NS, [0.025 * NS]),
        TransferFromDeviceTime=(41, 0.01 * NS, []),
        InboundData=(41, 164, []),
        TransferToDeviceTime=(3, 0.001 * NS, []),
        OutboundData=(3, 4096, []),
    )
    summary = metrics.summarize(data, memory={"bytes_used": 1, "bytes_limit": 2})
    assert (summary.compiles, summary.cached_compiles, summary.executions) == (2, 38, 80)
    assert summary.compile_share == pytest.approx(4 / 6)
    assert (summary.transfers_from_device, summary.bytes_from_device) == (41, 164)
    assert (summary.transfers_to_device, summary.bytes_to_device) == (3, 4096)
    assert summary.item_calls == 41
    assert summary.fallbacks == {"aten::nonzero": 2}  # .item() is not a fallback to report
    assert summary.memory == {"bytes_used": 1, "bytes_limit": 2}
    assert summary.per_step(summary.transfers_from_device) == pytest.approx(41 / 40)
    empty = metrics.summarize({})
    assert empty.compiles == 0 and empty.steps is None and empty.compile_share is None


# -- the analyzer on recorded sequences ---------------------------------------------------------


def shapes(name, lengths, batch=16):
    return {name: [{"shape": [batch, n], "first": i, "last": i, "count": 1}
                   for i, n in enumerate(lengths)]}


def test_dynamic_padding_alert_names_the_input_and_its_shapes():
    # The measured case: tiny BERT, dynamic padding, 40 steps -> 17 compiles... at 0.43 per step
    # torch_xla stays silent; 30 compiles in 40 steps crosses its 0.5 threshold.
    summary = metrics.summarize(snap({"MarkStep": 40}, CompileTime=(30, 60 * NS, [2 * NS])))
    summary.input_shapes = shapes("input_ids", [64, 48, 57, 33])
    alerts = analyzer.analyze(summary)
    assert codes(alerts) == ["frequent-compiles"]
    alert = alerts[0]
    assert alert.severity == "warning"
    assert "30 compiles in 40 steps" in alert.title
    assert "input 'input_ids' had 4 different shapes: (16, 64), (16, 48), (16, 57), (16, 33)" in (
        alert.explanation)
    assert "padding='max_length'" in alert.fix


@pytest.mark.parametrize(
    ("compiles", "steps", "expected"),
    [(3, 40, []), (6, 10, []), (7, 12, ["frequent-compiles"]), (6, 12, [])],
)
def test_compile_threshold_is_torch_xlas(compiles, steps, expected):
    summary = metrics.summarize(snap({"MarkStep": steps}, CompileTime=(compiles, NS, [])))
    assert codes(analyzer.analyze(summary)) == expected


def test_compile_cause_without_shapes_points_to_fetches_or_fallbacks():
    fetching = metrics.summarize(snap({"MarkStep": 20}, CompileTime=(20, NS, []),
                                      TransferFromDeviceTime=(20, 1, [])))
    alerts = analyzer.analyze(fetching)
    assert codes(alerts) == ["frequent-compiles", "frequent-transfers"]
    assert "fetched from the device inside the step" in alerts[0].explanation
    silent = metrics.summarize(snap({"MarkStep": 20}, CompileTime=(20, NS, [])))
    assert "PT_XLA_DEBUG_LEVEL=2" in analyzer.analyze(silent)[0].explanation


def test_transfer_fallback_and_slow_alerts():
    summary = metrics.summarize(snap(
        {"MarkStep": 40, "aten::_local_scalar_dense": 41, "aten::nonzero": 40},
        TransferFromDeviceTime=(41, 1, []),
        CompileTime=(1, 301 * NS, [301 * NS]),
        ExecuteTime=(40, 31 * NS, [31 * NS]),
    ))
    alerts = analyzer.analyze(summary)
    assert set(codes(alerts)) == {"frequent-transfers", "cpu-fallback", "slow-compile",
                                  "slow-execution"}
    transfer = next(a for a in alerts if a.code == "frequent-transfers")
    assert "41 in 40 steps" in transfer.title and "41 of them .item() calls" in transfer.explanation
    fallback = next(a for a in alerts if a.code == "cpu-fallback")
    assert "aten::nonzero" in fallback.title and "_local_scalar_dense" not in fallback.title

    quiet = metrics.summarize(snap(
        {"MarkStep": 40, "aten::_local_scalar_dense": 1},
        TransferFromDeviceTime=(1, 1, []),
        CompileTime=(3, 299 * NS, [299 * NS]),
        ExecuteTime=(40, 29 * NS, [29 * NS]),
    ))
    assert analyzer.analyze(quiet) == []


def cycling(name, period, steps, start=1):
    """What a ShapeTracker records for x = randn(8 + step % period, 8) over `steps` steps."""
    tracker = input_shapes.ShapeTracker()
    for step in range(start, start + steps):
        tracker.record(step, {name: (8 + step % period, 8)})
    return tracker.data()


def test_shapes_that_all_compiled_during_warmup_still_get_an_alert():
    # The QA case: 7 cycling shapes, 7 compiles in the first 10 steps, none after: the rate
    # rules stay silent, yet each shape cost a compilation (minutes each on a TPU).
    live = live_metrics.LiveMetrics()
    live.add(MetricsSnapshot(0, 11, snap({"MarkStep": 11}, CompileTime=(7, 2 * NS, []))))
    data = snap({"MarkStep": 150}, CompileTime=(7, 2 * NS, []))
    data["input_shapes"] = cycling("x", 7, 150)
    live.add(MetricsSnapshot(0, 150, data))
    assert live.summary().compiles_after_warmup == 0
    (alert,) = live.alerts()
    # Compiling was all the XLA time there was: a warning, whatever the rate.
    assert alert.code == "shape-changes" and alert.severity == "warning"
    assert alert.title == "Input 'x' took 7 different shapes"
    assert ("Input 'x' had 7 different shapes: (9, 8), (10, 8), (11, 8), (12, 8), (13, 8), "
            "(14, 8), (8, 8).") in alert.explanation  # all 7, not "and 1 more"
    # The steps where the shapes first appeared, not the warm-up's bound.
    assert ("compiled 7 graphs, in steps 1-7, as each new shape first appeared. Compiling "
            "took 100% of the XLA time.") in alert.explanation
    # 'x' is a plain tensor, not a tokenizer output: the fix pads the tensor itself.
    assert "torch.nn.functional.pad" in alert.fix and "bucket" in alert.fix
    assert "tokenizer" not in alert.fix


def test_recompile_severity_follows_its_cost_and_the_fix_names_the_input_kind():
    def recompiled(compile_ns: float, execute_ns: float, name: str):
        live = live_metrics.LiveMetrics()
        live.add(MetricsSnapshot(0, 11, snap({"MarkStep": 11}, CompileTime=(2, NS, []))))
        data = snap({"MarkStep": 60}, CompileTime=(12, compile_ns, []),
                    ExecuteTime=(60, execute_ns, []))
        data["input_shapes"] = cycling(name, 12, 60)
        live.add(MetricsSnapshot(0, 60, data))
        (alert,) = live.alerts()
        return alert

    # The measured case: 12 compiles in 60 steps (under torch_xla's 0.5 per step), compiling
    # 99% of the time. Not "info": it is where the time went.
    costly = recompiled(12 * NS, 0.1 * NS, "x")
    assert (costly.code, costly.severity) == ("recompiled", "warning")
    assert costly.title == "Recompiling: 12 compiles in 60 steps, 10 after warm-up"
    assert "Compiling took 99% of the XLA time." in costly.explanation
    assert "torch.nn.functional.pad" in costly.fix and "tokenizer" not in costly.fix
    # Cheap compiles of a tokenizer's output: worth knowing, and the tokenizer pads.
    cheap = recompiled(0.1 * NS, 12 * NS, "input_ids")
    assert (cheap.code, cheap.severity) == ("recompiled", "info")
    assert "padding='max_length'" in cheap.fix


def test_shape_alert_is_not_repeated_and_a_few_buckets_are_quiet():
    # Recompiling after warm-up: that alert already names the input; no second one.
    summary = metrics.summarize(snap({"MarkStep": 40}, CompileTime=(30, NS, [])))
    summary.input_shapes = cycling("x", 7, 40)
    assert codes(analyzer.analyze(summary)) == ["frequent-compiles"]
    live = live_metrics.LiveMetrics()
    live.add(MetricsSnapshot(0, 11, snap({}, CompileTime=(3, NS, []))))
    data = snap({}, CompileTime=(9, NS, []))
    data["input_shapes"] = cycling("x", 7, 150)
    live.add(MetricsSnapshot(0, 150, data))
    assert codes(live.alerts()) == ["recompiled"]
    # Up to MAX_QUIET_SHAPES shapes (a few bucket lengths, what fine_tune pads to): quiet.
    for period, expected in ((3, []), (4, ["shape-changes"])):
        summary = metrics.summarize(snap({"MarkStep": 150}, CompileTime=(period, NS, [])))
        summary.input_shapes = cycling("x", period, 150)
        assert codes(analyzer.analyze(summary)) == expected
    assert input_shapes.MAX_QUIET_SHAPES == 3


def test_rates_of_rank_threads_are_per_rank_step():
    # 4 rank threads of one process share the counters: 8 compiles in 12 steps of each rank
    # are 8 in 48 rank-steps (each device compiles its own graph), not 0.67 per step.
    data = snap({"MarkStep": 48}, CompileTime=(8, NS, []), TransferFromDeviceTime=(24, 1, []))
    data["process"] = {"pid": 1, "ranks": [0, 1, 2, 3], "rank_steps": 48}
    summary = metrics.summarize(data, steps=12)
    assert (summary.ranks, summary.rank_steps) == (4, 48)
    assert summary.per_step(summary.compiles) == pytest.approx(8 / 48)
    assert analyzer.analyze(summary) == []
    alone = metrics.summarize(snap({}, CompileTime=(8, NS, []),
                                   TransferFromDeviceTime=(24, 1, [])), steps=12)
    assert codes(analyzer.analyze(alone)) == ["frequent-compiles", "frequent-transfers"]


def test_live_metrics_counts_compiles_after_warmup():
    live = live_metrics.LiveMetrics()
    live.add(MetricsSnapshot(0, 1, snap({}, CompileTime=(1, NS, []))))
    live.add(MetricsSnapshot(0, 11, snap({}, CompileTime=(3, NS, []))))
    data = snap({}, CompileTime=(7, NS, []))
    data["input_shapes"] = shapes("pixel_values", [224, 256])
    live.add(MetricsSnapshot(0, 40, data))
    summary = live.summary()
    assert (summary.compiles_after_warmup, summary.steps_after_warmup) == (4, 29)
    alerts = live.alerts()
    assert codes(alerts) == ["recompiled"]
    assert "pixel_values" in alerts[0].explanation
    assert live.ranks() == [0]


# -- shapes ------------------------------------------------------------------------------------


def test_shape_tracker_and_shapes_of():
    batch = {"input_ids": np.zeros((4, 9)), "labels": np.zeros(4), "text": ["a"] * 4}
    found = input_shapes.shapes_of(batch)
    assert found == {"input_ids": (4, 9), "labels": (4,)}
    assert input_shapes.shapes_of(None) == {}
    tracker = input_shapes.ShapeTracker()
    assert tracker.record(1, found) is False
    assert tracker.record(2, found) is False
    assert tracker.record(3, {"input_ids": (4, 12), "labels": (4,)}) is True
    data = tracker.data()
    assert data["input_ids"] == [
        {"shape": [4, 9], "first": 1, "last": 2, "count": 2},
        {"shape": [4, 12], "first": 3, "last": 3, "count": 1},
    ]
    (changed,) = input_shapes.shape_changes(data).items()
    assert changed == ("input_ids", input_shapes.InputShapes([(4, 9), (4, 12)], [1, 3], 2))
    for step in range(40):  # bounded memory however many shapes come
        tracker.record(step, {"input_ids": (4, step + 100)})
    assert len(tracker.data()["input_ids"]) == input_shapes.MAX_SHAPES_PER_INPUT + 1
    pickle.dumps(tracker.data())
    # ... and a true count of the shapes past the listed ones.
    info = input_shapes.input_shapes_of(tracker.data())["input_ids"]
    assert (info.distinct, len(info.shapes), info.more, info.exact) == (42, 16, 26, True)
    assert info.shapes[:3] == [(4, 9), (4, 12), (4, 100)]


@pytest.mark.parametrize(("period", "steps", "distinct"), [(23, 150, 23), (1000, 60, 60)])
def test_shape_count_is_true_past_the_listed_shapes(period, steps, distinct):
    # The QA cases: x = randn(8 + step % period, 8): 23 shapes cycling over 150 steps, or a
    # new shape every step. The tracker listed 16 and counted its overflow as a 17th shape.
    tracker = input_shapes.ShapeTracker()
    for step in range(1, steps + 1):
        tracker.record(step, {"x": (8 + step % period, 8), "y": (8,)})
    info = input_shapes.input_shapes_of(tracker.data())["x"]
    assert (info.distinct, info.more, info.exact) == (distinct, distinct - 16, True)
    assert list(input_shapes.shape_changes(tracker.data())) == ["x"]  # y kept its shape
    assert len(input_shapes.shape_changes(tracker.data())["x"].shapes) == 16  # the listed ones
    summary = metrics.summarize(snap({"MarkStep": steps}, CompileTime=(distinct, NS, [])))
    summary.input_shapes = tracker.data()
    (alert,) = analyzer.analyze(summary)  # 60 in 60 steps: recompiling; 23 in 150: shapes
    assert alert.code == ("frequent-compiles" if distinct == steps else "shape-changes")
    assert (f"'x' had {distinct} different shapes: (9, 8), (10, 8), (11, 8), (12, 8), "
            f"(13, 8), (14, 8) and {distinct - 6} more") in alert.explanation


def test_shape_count_stays_bounded():
    tracker = input_shapes.ShapeTracker()
    extra = input_shapes.MAX_SHAPES_COUNTED + 50
    for step in range(input_shapes.MAX_SHAPES_PER_INPUT + extra):
        tracker.record(step, {"x": (step,)})
    (*listed, overflow) = tracker.data()["x"]
    assert len(listed) == input_shapes.MAX_SHAPES_PER_INPUT
    assert overflow["more"] == input_shapes.MAX_SHAPES_COUNTED and overflow["exact"] is False
    assert len(tracker._unlisted["x"]) == input_shapes.MAX_SHAPES_COUNTED
    info = input_shapes.input_shapes_of(tracker.data())["x"]
    most = input_shapes.MAX_SHAPES_PER_INPUT + input_shapes.MAX_SHAPES_COUNTED
    assert info.count_text() == f"more than {most} different shapes"


@pytest.mark.launch
def test_metrics_module_loads_neither_torch_nor_torch_xla():
    # `metrics` is imported by the notebook before any fork: it must not load torch (slow) or
    # torch_xla (the runtime must stay unstarted). Checked at run time in a fresh interpreter,
    # so an indirect or indented import fails it too.
    loaded = run_python(
        """
        import json, sys
        import hfxla_nb.observe.metrics
        print(json.dumps([name for name in ("torch", "torch_xla") if name in sys.modules]))
        """
    )
    assert loaded == []


# -- the analyzer on a real XLA:CPU loop ---------------------------------------------------------

DYNAMIC_LOOP = """
import json, pickle, torch, torch_xla
import torch_xla.debug.metrics as met
from hfxla_nb import events
from hfxla_nb.observe import reporting
import hfxla_nb as hx

reporting.SNAPSHOT_INTERVAL = 0.0   # a snapshot every step, to see every compile
channel = events.Channel()
events.attach_worker(channel, 0)
dev = torch_xla.device()
torch.manual_seed(0)
emb = torch.nn.Embedding(50, 8).to(dev)
head = torch.nn.Linear(8, 2).to(dev)
opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.1)
lengths = [5, 7, 9, 6, 8, 11, 5, 12, 13, 10, 14, 15, 7, 16]   # dynamic padding
received = []
for step, length in enumerate(lengths, start=1):
    batch = {"input_ids": torch.randint(0, 50, (4, length)).to(dev),
             "labels": torch.randint(0, 2, (4,)).to(dev)}
    loss = torch.nn.functional.cross_entropy(head(emb(batch["input_ids"]).mean(1)),
                                             batch["labels"])
    loss.backward(); opt.step(); opt.zero_grad()
    hx.report(step=step, loss=loss, total=len(lengths), inputs=batch)
    torch_xla.sync()
    received += channel.receive()
received += channel.receive()
print(json.dumps({"compiles": met.metric_data("CompileTime")[0],
                  "markstep": met.counter_value("MarkStep"),
                  "events": pickle.dumps(received).hex()}))
"""


@pytest.mark.launch
def test_real_dynamic_padding_loop_alert_names_changing_input():
    result = run_python(DYNAMIC_LOOP)
    received = pickle.loads(bytes.fromhex(result["events"]))
    snapshots = [e for e in received if isinstance(e, MetricsSnapshot)]
    assert snapshots and snapshots[-1].step == 14
    live = live_metrics.LiveMetrics()
    for event in snapshots:
        live.add(event)
    summary = live.summary()
    # The panel's numbers are torch_xla's own.
    assert summary.compiles == result["compiles"] >= 12
    assert summary.steps == 14
    changed = input_shapes.shape_changes(summary.input_shapes)
    assert list(changed) == ["input_ids"]  # labels kept their shape
    assert (4, 5) in changed["input_ids"].shapes and (4, 16) in changed["input_ids"].shapes
    alerts = live.alerts()
    compile_alert = next(a for a in alerts if a.code == "frequent-compiles")
    assert "input 'input_ids' had 12 different shapes: (4, 5), (4, 7), (4, 9)" in (
        compile_alert.explanation)
    # report() fetched the loss in step closures only: no per-step transfer alert.
    assert "frequent-transfers" not in codes(alerts)
    assert summary.transfers_from_device <= 2 and summary.item_calls == 0


def test_summary_from_namespace_events():
    # LiveMetrics takes anything shaped like a MetricsSnapshot (duck-typed).
    live = live_metrics.LiveMetrics()
    live.add(SimpleNamespace(rank=1, step=5, data=snap({"MarkStep": 5}), memory=None))
    assert live.summary().steps == 5 and live.alerts() == []
