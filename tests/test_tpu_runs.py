"""Recorded TPU runs (tests/data/tpu_runs): doctor reports rebuilt from public TPU outputs, one
per host, and a `metrics_report()` quoted in an issue. The doctor's panels, its kernel steps,
`%xla_info`'s host name and launch plan, the memory plan and the recompile alert, on each.

Each JSON file names its sources (`source`) and says which facts are derived. Nothing here
starts XLA, a kernel or a process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hfxla_nb import diagnosis
from hfxla_nb.observe.alerts import analyze
from hfxla_nb.observe.metrics import summarize
from hfxla_nb.runtime.doctor_report import DoctorReport
from hfxla_nb.runtime.environment import (
    TPU_GENERATIONS,
    Accelerator,
    accelerator_from_facts,
    host_name,
    launch_plan,
)
from hfxla_nb.runtime.info import RuntimeInfo
from hfxla_nb.train.memory import plan_memory
from hfxla_nb.ui.panels import doctor_html, doctor_text

DATA = Path(__file__).parent / "data"
RUNS = DATA / "tpu_runs"
NAMES = sorted(path.stem for path in RUNS.glob("*.json"))
GIB = 2**30
KERNEL_STEPS = {"versions": diagnosis.versions, "host": diagnosis.host,
                "device files": diagnosis.device_files,
                "environment": diagnosis.environment}
# What each recording says of its host: the doctor's statuses, %xla_info's name, processes.
EXPECT = {
    "colab-v2-8": ("Colab TPU v2-8", {"versions": "ok", "host": "ok", "device files": "ok",
                                      "environment": "ok"}, "4 chips x 2 cores"),
    "kaggle-v3-8-held": ("Kaggle TPU v3-8", {"versions": "ok", "host": "ok",
                                             "device files": "failed", "environment": "ok"},
                         "4 chips x 2 cores"),
    "kaggle-v5e-8": ("Kaggle TPU v5e-8", {"versions": "skipped", "host": "ok",
                                          "device files": "ok", "environment": "warning"},
                     "8 chips, one process per chip"),
    "tpu-vm-v5e-8": ("TPU VM v5e-8", {"versions": "ok", "host": "ok", "device files": "ok",
                                      "environment": "ok"}, "8 chips, one process per chip"),
}


def load(name: str) -> DoctorReport:
    return DoctorReport.from_json((RUNS / f"{name}.json").read_text())


def accelerator_of(report: DoctorReport) -> Accelerator:
    """The `Accelerator` the recording's host check describes (and the holders its device
    files check names)."""
    facts = report.check("host").details
    holders = report.check("device files").details.get("holders", {})
    return Accelerator(kind=facts["kind"], generation=facts["generation"], chips=facts["chips"],
                       cores_per_chip=facts["devices"] // facts["chips"],
                       devices=facts["devices"], hbm_per_chip_gib=facts["hbm_per_chip_gib"],
                       found_by=list(facts["found_by"]), host_cores=facts["host_cores"],
                       holders={int(pid): command for pid, command in holders.items()})


def runtime_of(report: DoctorReport) -> RuntimeInfo:
    """What `detect()` would have found: the recording's accelerator, versions, variables."""
    host = report.check("host").details
    versions = report.check("versions").details.get("versions", {})
    info = RuntimeInfo(accelerator_of(report), host["environment"], dict(versions), False,
                       dict(report.env))
    info.host = host["host"]
    return info


def test_there_are_recorded_runs_and_each_names_its_sources():
    assert NAMES == sorted(EXPECT)
    for name in NAMES:
        report = load(name)
        assert report.source, name
        assert any("github.com/" in line or "tpu_hosts.json" in line for line in report.source)
        assert any(line.startswith("derived: ") for line in report.source), name
        assert DoctorReport.from_json(report.to_json()).to_json() == report.to_json()


@pytest.mark.parametrize("name", NAMES)
def test_each_run_renders_with_its_recorded_statuses(name):
    report = load(name)
    host, statuses, _ = EXPECT[name]
    recorded = {check.name: check.status for check in report.checks}
    assert recorded == {**statuses, "launch": "skipped", "devices": "skipped",
                        "compile cache": "skipped", "fine-tune": "skipped"}
    text, html = doctor_text(report), doctor_html(report)
    assert text.splitlines()[0].startswith(f"hfxla_nb doctor: {report.status_line()} ")
    assert f"{host}: TPU " in text and 'class="hfxla-nb-doctor"' in html
    assert report.ok == (name != "kaggle-v3-8-held")
    for check in report.checks:
        assert f'title="{check.status}"' in html


def test_the_broken_host_shows_its_failed_step_and_the_fix():
    report = load("kaggle-v3-8-held")
    failed = [check for check in report.checks if check.status == "failed"]
    assert [check.name for check in failed] == ["device files"]
    assert failed[0].summary.startswith("pid 13 (/usr/bin/python3 -m ipykernel_launcher")
    assert "`kill 13`" in failed[0].fix
    text, html = doctor_text(report), doctor_html(report)
    assert text.splitlines()[0].startswith("hfxla_nb doctor: 3 ok, 4 skipped, 1 failed")
    assert "what to do:\n  device files: Shut down the other notebook's kernel" in text
    assert "<b>device files</b>: Shut down the other notebook&#x27;s kernel" in html


@pytest.mark.parametrize("name", NAMES)
def test_the_doctor_says_of_the_recorded_facts_what_the_recording_says(name):
    report = load(name)
    info = runtime_of(report)
    for step, run in KERNEL_STEPS.items():
        recorded = report.check(step)
        if recorded.status == "skipped":  # a step no public output recorded
            assert recorded.summary.startswith("not recorded: ")
            continue
        check = run(info, dict(report.env))
        assert (check.status, check.summary, check.fix) == (
            recorded.status, recorded.summary, recorded.fix), step


@pytest.mark.parametrize("name", NAMES)
def test_the_host_check_rebuilds_the_accelerator_and_names_the_host(name):
    report = load(name)
    host, _, plan = EXPECT[name]
    facts = report.check("host").details
    accelerator = accelerator_of(report)
    generation = {g.name: g for g in TPU_GENERATIONS}[accelerator.generation]
    assert accelerator.cores_per_chip == generation.cores_per_chip
    assert accelerator.hbm_per_chip_gib == generation.hbm_gib
    assert host_name(accelerator, facts["environment"]) == host == facts["host"]
    assert launch_plan(accelerator, facts["environment"]) == facts["launch_plan"]
    assert facts["launch_plan"].startswith(plan)
    assert report.check("host").summary == f"{host}: {accelerator.description}"


def test_the_kaggle_run_is_tpu_hosts_json_s_environment_as_detection_sees_it():
    """Reused, not duplicated: the recording's host is what detection makes of the recorded
    environment in tests/data/tpu_hosts.json."""
    report = load("kaggle-v5e-8")
    name = report.check("host").details["tpu_hosts"]
    host = json.loads((DATA / "tpu_hosts.json").read_text())[name]
    pci = [(f["device"], f["subsystem_device"]) for f in host["pci"] if f["vendor"] == "0x1ae0"]
    detected = accelerator_from_facts(pci, [f"/dev/{path}" for path in host["dev"]],
                                      host["environ"])
    assert detected == accelerator_of(report)
    assert host_name(detected, "kaggle") == host["expect"]["host"]
    assert report.env["KAGGLE_DATA_PROXY_TOKEN"] == "<hidden>"


def gemma_7b():
    transformers = pytest.importorskip("transformers")
    # google/gemma-7b's published config.json.
    return transformers.GemmaConfig(hidden_size=3072, intermediate_size=24576,
                                    num_hidden_layers=28, num_attention_heads=16,
                                    num_key_value_heads=16, head_dim=256, vocab_size=256000)


@pytest.mark.slow  # loads transformers for the memory plan (about 20 s)
def test_the_memory_plan_has_the_hbm_xla_reported_on_the_recorded_hosts():
    """Colab's v2-8: "HBM capacity 8.00G", "reserved 529.00M" per XLA device (pytorch/xla
    #1735); a v3-8's device: "of 15.48G hbm" (LWM #60, EasyDeL #142)."""
    colab = load("colab-v2-8").check("host").details
    seen = colab["recorded_hbm"]
    plan = plan_memory(gemma_7b(), hardware="v2-8", lora=True, precision="bf16")
    assert plan.devices == colab["devices"] == 8
    assert plan.device_memory_gib == pytest.approx(
        seen["capacity_gib"] - seen["reserved_mib"] / 1024, abs=0.002)
    kaggle = load("kaggle-v3-8-held").check("host").details
    plan = plan_memory(gemma_7b(), hardware="v3-8", lora=True, precision="bf16")
    assert round(plan.device_memory_gib, 2) == kaggle["recorded_hbm"]["usable_gib"] == 15.48


@pytest.mark.slow  # loads transformers for the memory plan (about 20 s)
def test_gemma_7b_does_not_fit_a_16_gib_device_as_xla_said():
    """EasyDeL #142: gemma-7b's bf16 weights alone are "arguments 15.90G" of "15.48G hbm";
    the plan's frozen bf16 base is the same 15.90 GiB, and no fine-tune of it fits."""
    seen = load("kaggle-v3-8-held").check("host").details["recorded_hbm"]
    assert seen["model"] == "google/gemma-7b"
    plan = plan_memory(gemma_7b(), hardware="v3-8", lora=True, precision="bf16")
    assert round(2 * plan.parameters / GIB, 2) == seen["arguments_gib"] == 15.90
    assert plan.parameters_gib > seen["usable_gib"] and not plan.fits
    assert not plan_memory(gemma_7b(), hardware="v3-8", precision="bf16").fits


# ---------------------------------------------------------------------------------------------
# A quoted metrics report, read as hfxla_nb reads torch_xla's metrics
# ---------------------------------------------------------------------------------------------

_UNITS_NS = {"m": 60e9, "s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}
_BYTES = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}


def _quantity(text: str) -> float:
    """A report's value in ns ("02m44s963ms609.866us") or bytes ("3.44KB"), else a number."""
    text = text.strip()
    size = re.fullmatch(r"([\d.]+)(B|KB|MB|GB|TB)", text)
    if size:
        return float(size.group(1)) * _BYTES[size.group(2)]
    parts = re.findall(r"([\d.]+)(ms|us|ns|m|s)", text)
    if parts and "".join(number + unit for number, unit in parts) == text:
        return sum(float(number) * _UNITS_NS[unit] for number, unit in parts)
    return float(text)


def parse_metrics_report(text: str) -> tuple[dict, int | None]:
    """`met.metrics_report()`'s text as `_xla.metrics_snapshot()`'s dict (no samples: the
    text has only percentiles), and the step its "[MetricsData; step=N]" line names."""
    counters, metrics, step, current = {}, {}, None, None
    for line in text.splitlines():
        if match := re.match(r"\[MetricsData; step=(\d+)\]", line):
            step = int(match.group(1))
        elif match := re.match(r"(Metric|Counter): (\S+)", line):
            kind, name = match.groups()
            current = metrics.setdefault(name, {"count": 0, "total": 0.0, "samples": []}) \
                if kind == "Metric" else name
        elif match := re.match(r"\s+(TotalSamples|Accumulator|Counter|Value): (.+)", line):
            key, value = match.groups()
            if key == "Value":
                counters[current] = int(value)
            elif key == "TotalSamples":
                current["count"] = int(value)
            else:  # "Accumulator" (older reports: "Counter"), the metric's total
                current["total"] = _quantity(value)
    return {"counters": counters, "metrics": metrics, "fallback_ops": []}, step


def test_the_quoted_metrics_report_reads_as_torch_xlas_counts():
    text = (RUNS / "metrics/pytorch_xla_1368_colab.txt").read_text()
    assert text.startswith("# https://github.com/pytorch/xla/issues/1368 ")
    snapshot, step = parse_metrics_report(text)
    assert step == 9
    assert snapshot["metrics"]["CompileTime"]["count"] == 92
    assert snapshot["metrics"]["CompileTime"]["total"] == pytest.approx(164_963_609_866)
    assert snapshot["metrics"]["ExecuteTime"] == {"count": 108, "total": 3_486_882_675,
                                                  "samples": []}
    assert _quantity("3.44KB") == pytest.approx(3522.56)


def test_the_quoted_report_of_92_compiles_in_9_steps_raises_the_recompile_alert():
    """The issue's reading ("CompileTime is increasing per step") as the analyzer says it."""
    snapshot, step = parse_metrics_report(
        (RUNS / "metrics/pytorch_xla_1368_colab.txt").read_text())
    summary = summarize(snapshot, steps=step)
    assert (summary.compiles, summary.executions, summary.steps) == (92, 108, 9)
    assert summary.compile_seconds == pytest.approx(164.96, abs=0.01)
    alerts = analyze(summary)
    assert [alert.code for alert in alerts] == ["frequent-compiles"]
    alert = alerts[0]
    assert (alert.severity, alert.title) == ("warning", "Recompiling: 92 compiles in 9 steps")
    assert "XLA compiled 10.22 graphs per step (a new graph at nearly every step)" in \
        alert.explanation
