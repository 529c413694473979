"""Transfer causes found, not guessed: an SPMD loop that shards its input
after using it copies the input to the host every step; the transfer alert names
`xs.mark_sharding` and the line, not `.item()`, print or Trainer logging. A loop that shards
its input before using it transfers nothing and gets no alert. Real launches on XLA:CPU."""

from __future__ import annotations

import inspect

import pytest

import hfxla_nb as hx
from hfxla_nb.observe.alerts import analyze
from hfxla_nb.observe.metrics import XlaSummary
from hfxla_nb.observe.tracing import Frame

STEPS = 6


def sharded_loop(after_use: bool) -> int:
    """An SPMD step over 4 CPU devices that shards `x` after (or before) `x * 2` uses it."""
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    mesh = xs.Mesh(np.arange(4), (4, 1), ("data", "model"))
    device = torch_xla.device()
    weight = torch.randn(64, 64, device=device)
    for step in range(1, STEPS + 1):
        x = torch.randn(32, 64).to(device)
        if after_use:
            doubled = x * 2
            xs.mark_sharding(x, mesh, ("data", None))  # SHARDED HERE
        else:
            xs.mark_sharding(x, mesh, ("data", None))
            doubled = x * 2
        loss = (x @ weight).sum() + doubled.sum()
        torch_xla.sync()
        del loss
        hx.report(step=step, total=STEPS)  # no value read: the copies are the only transfers
    return STEPS


def marked_line() -> int:
    source, first = inspect.getsourcelines(sharded_loop)
    return first + next(i for i, line in enumerate(source) if "SHARDED HERE" in line)


@pytest.mark.launch
@pytest.mark.parametrize("after_use", [True, False], ids=["after-use", "before-use"])
def test_a_tensor_sharded_after_use_is_named_with_its_line(after_use, monkeypatch):
    monkeypatch.setenv("CPU_NUM_DEVICES", "4")
    hx.notebook_launcher(sharded_loop, args=(after_use,), strategy="spmd", progress=False)
    metrics = hx.last_launch().ranks[0].metrics
    codes = {alert["code"]: alert for alert in metrics.to_dict()["alerts"]}
    if not after_use:
        assert "frequent-transfers" not in codes, codes
        return
    alert = codes["frequent-transfers"]
    place = f"`sharded_loop` in test_transfer_causes.py, line {marked_line()}"
    assert alert["title"].endswith(f"by mark_sharding at {place}"), alert["title"]
    assert f"{place} ({STEPS} times)" in alert["explanation"]
    assert "8.0 KiB a step" in alert["explanation"]  # 32 x 64 float32: the whole of x
    for guess in (".item()", "print", "Trainer"):
        assert guess not in alert["explanation"]
    assert alert["fix"].startswith(f"At {place}: call xs.mark_sharding")


def test_the_reshard_alert_counts_other_transfers_apart():
    line = Frame("train", "/tmp/ipykernel_1/27.py", 14, cell=2)
    summary = XlaSummary(steps=10, executions=10, transfers_from_device=13,
                         bytes_from_device=10 * 84480, reshards=[(line, 10)])
    (alert,) = [a for a in analyze(summary) if a.code == "frequent-transfers"]
    assert alert.title == ("Device-to-host transfers: 13 in 10 steps, by mark_sharding at "
                           "`train` in cell 2, line 14")
    assert "82.5 KiB a step" in alert.explanation
    assert "The other 3 transfers came from elsewhere (value reads)." in alert.explanation
