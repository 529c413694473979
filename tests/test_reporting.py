"""`hfxla_nb.report`: events, throttling, and the contract that it forces no device sync."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hfxla_nb import events, reporting
from hfxla_nb.events import Channel, MetricsSnapshot, Progress
from tests.kernel_helpers import run_python


@pytest.fixture
def channel(monkeypatch):
    """A worker context for this thread: report() sends to this channel."""
    channel = Channel()
    events.attach_worker(channel, 3)
    yield channel
    events.attach_worker(None, None)
    channel.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(reporting.time, "monotonic", clock)
    return clock


def progress(received):
    return [e for e in received if isinstance(e, Progress)]


def test_outside_a_worker_report_is_a_noop():
    assert events.worker_channel() is None
    assert reporting.report(step=1, loss=0.5, total=2) is None
    assert reporting.recorded() == {"steps": 0, "input_shapes": {}, "memory": None}


def test_plain_values_are_sent_throttled_and_final_step_always(channel, clock):
    for step in range(1, 11):
        clock.now += 0.01  # 10 ms per step: far faster than the display needs
        reporting.report(step=step, loss=1.0 / step, total=10, lr=np.float32(0.5), note="text")
    received = progress(channel.receive(timeout=1))
    assert [e.step for e in received] == [1, 10]  # the first and the final
    first, final = received
    assert first.rank == 3 and first.total == 10 and first.label == "train"
    assert final.values == {"loss": pytest.approx(0.1), "lr": 0.5}  # "note" is not a number


def test_steps_count_calls_per_label_and_time_lets_updates_through(channel, clock):
    for _ in range(3):
        clock.now += reporting.MIN_INTERVAL
        reporting.report(samples=32)
    clock.now += reporting.MIN_INTERVAL
    reporting.report(label="eval", accuracy=0.75)
    received = progress(channel.receive(timeout=1))
    assert [(e.label, e.step) for e in received] == [("train", 1), ("train", 2), ("train", 3),
                                                     ("eval", 1)]
    assert received[0].samples == 32 and received[-1].values == {"accuracy": 0.75}


def test_input_shapes_are_recorded(channel, clock):
    reporting.report(step=1, inputs={"input_ids": np.zeros((2, 8)), "ids": [1, 2]})
    reporting.report(step=2, inputs={"input_ids": np.zeros((2, 5))})
    seen = reporting.recorded()
    assert seen["steps"] == 2
    assert [entry["shape"] for entry in seen["input_shapes"]["input_ids"]] == [[2, 8], [2, 5]]


def test_local_events_receive_reports_in_the_kernel(clock):
    received = []
    with reporting.local_events(received.append):
        reporting.report(step=4, loss=2.0, total=4)
        assert reporting.recorded()["steps"] == 4
    reporting.report(step=5, loss=1.0)  # the block ended: nothing more
    assert [(e.rank, e.step, e.values) for e in received] == [(None, 4, {"loss": 2.0})]


def test_report_never_raises_into_training(channel, clock):
    class Broken:
        def items(self):
            raise RuntimeError("boom")

    with pytest.warns(RuntimeWarning, match="report failed"):
        reporting.report(step=1, inputs=Broken())


# -- the transfer contract, measured with torch_xla's own counters -------------------------------

CONTRACT = """
import json, pickle, torch, torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
from hfxla_nb import events, reporting
import hfxla_nb as hx

N, K = 20, 5
dev = torch_xla.device()
w = torch.ones(4, 1, device=dev)

def loop(use_report):
    met.clear_all()
    for step in range(1, N + 1):
        x = torch.full((8, 4), float(step)).to(dev)
        loss = (x @ w).mean()              # = 4 * step, known without fetching it
        if use_report:
            hx.report(step=step, loss=loss, total=N, log_every=K, inputs={"x": x})
        torch_xla.sync()
    xm.wait_device_ops()                   # executions are counted when they complete
    def count(name):
        data = met.metric_data(name)
        return data[0] if data else 0
    return {"transfers": count("TransferFromDeviceTime"), "executions": count("ExecuteTime"),
            "compiles": count("CompileTime"),
            "items": met.counter_value("aten::_local_scalar_dense") or 0}

loop(False)                                 # compile once, so both measured runs are warm
without = loop(False)
channel = events.Channel()
events.attach_worker(channel, 0)
reporting.MIN_INTERVAL = 0.0                # no time throttle: exactly one fetch per K steps
with_report = loop(True)
received = channel.receive(timeout=1)
reporting.MIN_INTERVAL = 10.0               # a slow notebook: time throttles fetches further
throttled = loop(True)
received_throttled = channel.receive(timeout=1)
print(json.dumps({"without": without, "with": with_report, "throttled": throttled,
                  "events": pickle.dumps(received).hex(),
                  "events_throttled": pickle.dumps(received_throttled).hex()}))
"""


@pytest.fixture(scope="module")
def contract():
    result = run_python(CONTRACT)
    result["events"] = pickle.loads(bytes.fromhex(result["events"]))
    result["events_throttled"] = pickle.loads(bytes.fromhex(result["events_throttled"]))
    return result


def test_report_adds_at_most_one_transfer_per_log_every_steps(contract):
    without, with_report = contract["without"], contract["with"]
    assert without["transfers"] == 0
    assert with_report["transfers"] - without["transfers"] == 20 // 5
    # No extra graph execution, no recompilation, no .item().
    assert with_report["executions"] == without["executions"] == 20
    assert with_report["compiles"] == without["compiles"] == 0
    assert with_report["items"] == without["items"] == 0
    # Time throttling only lowers the count (the final step is always fetched).
    assert 1 <= contract["throttled"]["transfers"] <= 20 // 5


def test_fetched_losses_arrive_as_floats_every_log_every_steps(contract):
    losses = {e.step: e.values["loss"] for e in contract["events"]
              if isinstance(e, Progress) and "loss" in e.values}
    assert losses == {5: 20.0, 10: 40.0, 15: 60.0, 20: 80.0}
    final = [e for e in contract["events_throttled"]
             if isinstance(e, Progress) and "loss" in e.values]
    assert final[-1].step == 20 and final[-1].values["loss"] == 80.0


def test_metrics_snapshots_carry_counters_and_input_shapes(contract):
    snapshots = [e for e in contract["events"] if isinstance(e, MetricsSnapshot)]
    assert snapshots, "one rank per process sends snapshots"
    last = snapshots[-1]
    assert last.step == 20 and last.rank == 0
    assert last.data["counters"]["MarkStep"] == 20  # taken after the final step's graph ran
    assert last.data["input_shapes"]["x"] == [{"shape": [8, 4], "first": 1, "last": 20,
                                               "count": 20}]
    assert last.memory is None  # not available on the CPU
