"""`hfxla_nb.report`: events, throttling, and the contract that it forces no device sync."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hfxla_nb import events
from hfxla_nb.events import Channel, MetricsSnapshot, Progress
from hfxla_nb.observe import reporting
from hfxla_nb.observe import reporting as process
from tests.helpers import Clock, run_python


@pytest.fixture
def channel(monkeypatch):
    """A worker context for this thread: report() sends to this channel."""
    channel = Channel()
    events.attach_worker(channel, 3)
    yield channel
    events.attach_worker(None, None)
    channel.close()


@pytest.fixture
def clock(monkeypatch):
    # Near 0, not at T0: there `now + MIN_INTERVAL - now` rounds below MIN_INTERVAL, and a
    # report one interval later would be held back.
    clock = Clock(start=100.0)
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
from hfxla_nb import events
from hfxla_nb.observe import reporting
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


@pytest.mark.launch
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


@pytest.mark.launch
def test_fetched_losses_arrive_as_floats_every_log_every_steps(contract):
    losses = {e.step: e.values["loss"] for e in contract["events"]
              if isinstance(e, Progress) and "loss" in e.values}
    assert losses == {5: 20.0, 10: 40.0, 15: 60.0, 20: 80.0}
    final = [e for e in contract["events_throttled"]
             if isinstance(e, Progress) and "loss" in e.values]
    assert final[-1].step == 20 and final[-1].values["loss"] == 80.0


@pytest.mark.launch
def test_metrics_snapshots_carry_counters_and_input_shapes(contract):
    snapshots = [e for e in contract["events"] if isinstance(e, MetricsSnapshot)]
    assert snapshots, "one rank per process sends snapshots"
    last = snapshots[-1]
    assert last.step == 20 and last.rank == 0
    assert last.data["counters"]["MarkStep"] == 20  # taken after the final step's graph ran
    assert last.data["input_shapes"]["x"] == [{"shape": [8, 4], "first": 1, "last": 20,
                                               "count": 20}]
    assert last.memory is None  # not available on the CPU


# -- the end of a rank: held-back progress and the process's final metrics --------------------


class FakeXla:
    """torch_xla as report() and the worker use it, without torch_xla: a process-wide counter
    that every `sync()` bumps, then runs the step closures queued in that thread."""

    def __init__(self, monkeypatch, initialized=True):
        import threading

        self.syncs = 0
        self.initialized = initialized
        self.lock = threading.Lock()
        self.local = threading.local()
        monkeypatch.setattr(reporting._xla, "runtime_is_initialized", lambda: self.initialized)
        monkeypatch.setattr(reporting._xla, "metrics_snapshot", self.snapshot)
        monkeypatch.setattr(reporting._xla, "add_step_closure", self.add_step_closure)
        monkeypatch.setattr(reporting._xla, "sync", self.sync)
        monkeypatch.setattr(reporting._xla, "device_type", lambda: "CPU")
        self.waited = 0
        monkeypatch.setattr(reporting._xla, "wait_device_ops", self.wait_device_ops)

    def wait_device_ops(self):
        assert self.initialized
        self.waited += 1

    def add_step_closure(self, closure, args=()):
        self.local.__dict__.setdefault("closures", []).append((closure, args))

    def sync(self):
        with self.lock:
            self.syncs += 1
        closures, self.local.closures = self.local.__dict__.get("closures", []), []
        for closure, args in closures:
            closure(*args)

    def snapshot(self):
        assert self.initialized, "the runtime must never be started for a snapshot"
        return {"counters": {"MarkStep": self.syncs}, "metrics": {}, "fallback_ops": []}


def run_ranks(channel, functions):
    """Run `functions[rank]` as rank threads of this process, through the worker's run_rank."""
    import threading

    from hfxla_nb.launch import worker

    threads = [threading.Thread(target=worker.run_rank,
                                args=(channel, rank, len(functions), function, (), True))
               for rank, function in enumerate(functions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    events.attach_worker(None, None)
    received = []
    while True:
        batch = channel.receive(timeout=0.5)
        if not batch:
            return received
        received += batch


@pytest.fixture
def worker_channel():
    channel = Channel()
    yield channel
    events.attach_worker(None, None)
    channel.close()


def test_a_failing_rank_sends_its_last_progress_and_metrics(monkeypatch, worker_channel):
    xla = FakeXla(monkeypatch)
    monkeypatch.setattr(process, "SNAPSHOT_INTERVAL", 1000.0)  # one periodic snapshot only

    def train(index):
        for step in range(1, 41):  # no total: no final step for report() to know of
            reporting.report(step=step, loss=1.0 / step)
            xla.sync()
        raise ValueError("boom at step 40")

    received = run_ranks(worker_channel, [train])
    kinds = [type(event).__name__ for event in received]
    assert kinds[-1] == "Failed"
    last_metrics = max(i for i, kind in enumerate(kinds) if kind == "MetricsSnapshot")
    final = received[last_metrics]
    # Sent before Failed (which makes the launcher stop the process), at the failing step.
    assert last_metrics < len(kinds) - 1
    assert final.step == 40 and final.data["counters"]["MarkStep"] == 40
    assert final.rank == 0 and final.data["process"]["ranks"] == [0]
    assert xla.waited == 0  # after a failure the device may be what failed: no wait on it
    bars = [event for event in received if isinstance(event, Progress)]
    assert bars[-1].step == 40  # the step the throttle held back is sent too


def test_the_last_rank_thread_of_a_process_sends_its_final_metrics(monkeypatch,
                                                                   worker_channel):
    import time

    xla = FakeXla(monkeypatch)

    def train(index):
        if index == 0:
            time.sleep(0.2)  # rank 1 reports first: the snapshots are still the process's
        for step in range(1, 21):
            reporting.report(step=step, total=20)
            xla.sync()
            time.sleep(0.002 * (4 - index) ** 2)  # rank 0 slowest... rank 3 fastest
        return index

    received = run_ranks(worker_channel, [train] * 4)
    snapshots = [event for event in received if isinstance(event, MetricsSnapshot)]
    assert snapshots
    # Whichever thread sent it, a snapshot names the process's ranks and its lowest rank.
    assert {event.rank for event in snapshots} <= {0, 1}
    final = snapshots[-1]
    assert final.rank == 0 and final.data["process"]["ranks"] == [0, 1, 2, 3]
    # After every rank's work and once the device finished it (executions are counted when
    # they complete): all of the process's syncs, sent before the last Finished.
    assert xla.waited == 1
    assert final.data["counters"]["MarkStep"] == xla.syncs >= 80
    assert final.data["process"]["rank_steps"] == 80 and final.step == 20
    finished = [i for i, event in enumerate(received) if type(event).__name__ == "Finished"]
    assert len(finished) == 4 and received.index(final) < finished[-1]


def test_no_snapshot_and_no_runtime_when_the_function_used_no_xla(monkeypatch,
                                                                  worker_channel):
    xla = FakeXla(monkeypatch, initialized=False)

    def train(index):
        for step in range(1, 6):
            reporting.report(step=step, loss=0.5)
        return "done"

    received = run_ranks(worker_channel, [train])
    assert not [event for event in received if isinstance(event, MetricsSnapshot)]
    assert type(received[-1]).__name__ == "Finished" and xla.initialized is False
    assert [event.step for event in received if isinstance(event, Progress)][-1] == 5


# -- the last step's values, fetched when the function returns --------------------------------

FINAL_FETCH = """
import json, os, pickle, torch, torch_xla
import torch_xla.debug.metrics as met
from hfxla_nb import events
from hfxla_nb.launch import worker
from hfxla_nb.observe import reporting
import hfxla_nb as hx

worker.route_this_process = lambda *args, **kwargs: None  # keep this process's stdout
reporting.MIN_INTERVAL = 0.0                # no time throttle: one fetch per K steps exactly
K = 5
dev = torch_xla.device()
w = torch.ones(4, 1, device=dev)

def steps_from_zero(index):                 # what `enumerate(loader)` gives: 0 ... 22
    for i in range(23):
        x = torch.full((8, 4), float(i)).to(dev)
        y = x @ w
        hx.report(step=i, loss=y.mean(), log_every=K, inputs={"x": x}, peak=y.max())
        torch_xla.sync()
    return "done"

def ends_on_a_fetch(index):                 # 1 ... 20: the last step is fetched as usual
    for step in range(1, 21):
        x = torch.full((8, 4), float(step)).to(dev)
        hx.report(step=step, loss=(x @ w).mean(), log_every=K)
        torch_xla.sync()
    return "done"

def transfers():
    data = met.metric_data("TransferFromDeviceTime")
    return data[0] if data else 0

results = {}
for function in (steps_from_zero, ends_on_a_fetch):
    channel = events.Channel()
    before = transfers()
    worker.run_rank(channel, 0, 1, function, (), True)
    received = []
    while batch := channel.receive(timeout=0.5):
        received += batch
    results[function.__name__] = {"transfers": transfers() - before,
                                  "events": pickle.dumps(received).hex()}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def final_fetch():
    result = run_python(FINAL_FETCH)
    for case in result.values():
        case["events"] = pickle.loads(bytes.fromhex(case["events"]))
    return result


@pytest.mark.launch
def test_the_last_steps_values_are_fetched_once_when_the_function_returns(final_fetch):
    short = final_fetch["steps_from_zero"]
    # Counted from 0, so 1 ... 23 steps done: steps 5, 10, 15, 20 fetched in step closures,
    # then step 23 after the function returned: exactly one more transfer, for both values.
    assert short["transfers"] == 4 + 1
    bars = [e for e in short["events"] if isinstance(e, Progress)]
    assert bars[0].step == 1  # step=0 is the first step done
    last = bars[-1]
    assert (last.step, last.total, last.values) == (23, None, {"loss": 88.0, "peak": 88.0})
    # Its final metrics snapshot comes after that fetch and counts it.
    snapshot = [e for e in short["events"] if isinstance(e, MetricsSnapshot)][-1]
    assert short["events"].index(snapshot) > short["events"].index(last)
    assert snapshot.data["metrics"]["TransferFromDeviceTime"]["count"] >= 5


@pytest.mark.launch
def test_a_last_step_already_fetched_costs_nothing_more(final_fetch):
    exact = final_fetch["ends_on_a_fetch"]
    assert exact["transfers"] == 20 // 5  # no extra fetch at the end
    losses = [(e.step, e.values.get("loss")) for e in exact["events"]
              if isinstance(e, Progress) and "loss" in e.values]
    assert losses[-1] == (20, 80.0)
