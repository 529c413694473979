"""The hosts users really have (Colab's v5e-1 and v6e-1, Kaggle's v5e-8), from recorded
sysfs/dev trees and variables: what detection, `%xla_info` and the launcher make of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hfxla_nb.launch.preflight import plan_launch
from hfxla_nb.runtime import detect
from hfxla_nb.ui.panels import runtime_text

HOSTS = json.loads((Path(__file__).parent / "data/tpu_hosts.json").read_text())
NAMES = sorted(name for name in HOSTS if not name.startswith("_"))


def build(root: Path, host: dict) -> Path:
    for function in host["pci"]:
        folder = root / "sys/bus/pci/devices" / function["slot"]
        folder.mkdir(parents=True)
        for name in ("vendor", "device", "subsystem_device"):
            (folder / name).write_text(function[name] + "\n")
    for name in host["dev"]:
        path = root / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root


@pytest.mark.parametrize("name", NAMES)
def test_each_host_is_named_and_planned(tmp_path, name, monkeypatch):
    host = HOSTS[name]
    expect = host["expect"]
    monkeypatch.setattr("hfxla_nb._xla.runtime_is_initialized", lambda: False)
    info = detect(sys_root=str(build(tmp_path, host)), environ=dict(host["environ"]))
    accelerator = info.accelerator
    assert (accelerator.kind, accelerator.chips, accelerator.devices) == (
        "tpu", expect["chips"], expect["devices"])
    assert accelerator.hbm_per_chip_gib == expect["hbm"]
    assert info.host == expect["host"]
    text = runtime_text(info)
    assert f"host          {expect['host']}" in text
    assert "placeholder-secret" not in text
    plan = plan_launch("replicated", None, "no", accelerator.kind, accelerator.devices,
                       info.environment)
    assert plan.world == expect["processes"]
    assert plan.env["PJRT_DEVICE"] == "TPU"


def test_colab_one_chip_says_what_the_launcher_is_for(tmp_path, monkeypatch):
    monkeypatch.setattr("hfxla_nb._xla.runtime_is_initialized", lambda: False)
    info = detect(sys_root=str(build(tmp_path, HOSTS["colab-v5e-1"])),
                  environ=dict(HOSTS["colab-v5e-1"]["environ"]))
    assert info.environment == "colab"
    assert info.launch_plan.startswith("one chip, one XLA device: notebook_launcher runs the "
                                       "function in one supervised process")
    # Nothing about the host is wrong; this test machine lacks only libtpu itself.
    wrong = [p.title for p in info.problems if p.severity != "info"]
    assert [title for title in wrong if "libtpu" not in title] == []


def test_kaggle_v5e_8_runs_one_process_per_chip_without_its_multi_host_variables(
        tmp_path, monkeypatch):
    monkeypatch.setattr("hfxla_nb._xla.runtime_is_initialized", lambda: False)
    host = HOSTS["kaggle-v5e-8"]
    info = detect(sys_root=str(build(tmp_path, host)), environ=dict(host["environ"]))
    assert info.environment == "kaggle"
    assert info.launch_plan.startswith("8 chips, one process per chip: notebook_launcher "
                                       "(replicated) starts 8 processes")
    assert "drop Kaggle's TPU_PROCESS_ADDRESSES" in info.launch_plan
    assert "placeholder-secret" not in json.dumps(info.to_dict())
    plan = plan_launch("replicated", None, "no", "tpu", 8, info.environment)
    assert plan.env["TPU_PROCESS_ADDRESSES"] is None and plan.env["CLOUD_TPU_TASK_ID"] is None
    spmd = plan_launch("spmd", None, "no", "tpu", 8, info.environment)
    assert spmd.world == 1
