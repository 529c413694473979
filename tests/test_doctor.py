"""`hx.doctor()` and `%xla_doctor`: every step on XLA:CPU (passing, or "tpu only" with the
reason), each failure path with its line and what to do, the report's markdown without
secrets and its JSON read back, in a real kernel as a magic."""

from __future__ import annotations

import json
import time

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, diagnosis
from hfxla_nb import diagnosis as kernel_steps
from hfxla_nb.runtime.doctor_report import Check, DoctorReport
from hfxla_nb.runtime.info import detect
from hfxla_nb.ui.panels import doctor_html, doctor_text
from tests.helpers import Kernel, error_of, run_notebook, stderr_of, stdout_of
from tests.test_runtime import holds, make_tpu_host


@pytest.fixture(scope="module")
def report():
    """One whole doctor run on this machine (XLA:CPU), as a user would call it."""
    return hx.doctor(time_limit=300)  # a loaded 2-core machine: the steps' limits x3.3


@pytest.mark.launch
def test_every_step_passes_here_or_says_it_needs_a_tpu(report):
    assert [check.name for check in report.checks] == [name for name, _, _ in diagnosis.STEPS]
    statuses = {check.name: check.status for check in report.checks}
    assert statuses == {"versions": "ok", "host": "ok", "device files": "tpu only",
                        "environment": "ok", "launch": "ok", "devices": "ok",
                        "compile cache": "tpu only", "fine-tune": "ok"}, doctor_text(report)
    assert report.ok and not _xla.runtime_is_initialized()  # every XLA step ran in workers


@pytest.mark.launch
def test_the_launched_steps_say_what_they_measured(report):
    devices = report.check("devices").details
    assert devices["sum"] == devices["expected_sum"] and devices["memory"] is None
    assert devices["bf16_error"] < 2e-2 and devices["device_type"] == "CPU"
    tuned = report.check("fine-tune").details
    assert tuned["compiles"] == len(tuned["buckets"]) and tuned["eval_compiles"] >= 1
    assert tuned["samples_per_second"] > 0
    assert "cannot load them back" in report.check("compile cache").summary


@pytest.mark.launch
def test_the_report_reads_back_from_its_json_and_renders(report):
    again = DoctorReport.from_json(report.to_json())
    assert again.to_markdown() == report.to_markdown()
    assert json.loads(report.to_json())["checks"][0]["name"] == "versions"
    html, text = doctor_html(report), doctor_text(report)
    assert 'class="hfxla-nb-doctor"' in html and "fine-tune" in html
    assert text.splitlines()[0].startswith("hfxla_nb doctor: 6 ok, 2 tpu only")
    assert repr(report).startswith("<DoctorReport: 6 ok, 2 tpu only in ")


def test_a_step_past_its_limit_is_timed_out_and_the_run_goes_on():
    def stuck(info, limit):
        time.sleep(30)

    began = time.perf_counter()
    check = diagnosis.run_step("launch", stuck, detect(), limit=0.5, grace=0.5)
    assert time.perf_counter() - began < 5
    assert check.status == "timed out" and "not done in 0 s" in check.summary
    assert "time_limit=300" in check.fix


def test_a_step_that_raises_is_failed_with_its_error():
    def broken(info, limit):
        raise OSError("disk gone")

    check = diagnosis.run_step("devices", broken, detect(), limit=5)
    assert check.status == "failed" and check.summary == "OSError: disk gone"


def test_a_held_device_file_names_the_process_and_the_command(tmp_path):
    make_tpu_host(tmp_path, "v5e", chips=4)
    holds(tmp_path, 4242, "/dev/vfio/0", comm="python3")
    environ = {"PJRT_DEVICE": "TPU"}
    check = kernel_steps.device_files(detect(sys_root=str(tmp_path), environ=environ), environ)
    assert check.status == "failed" and "4242 (python3)" in check.summary
    assert "kill 4242" in check.fix
    assert check.details["holders"] == {"4242": "python3"}


def test_versions_that_do_not_pair_are_failed_with_the_fix(tmp_path):
    info = detect(sys_root=str(tmp_path), environ={"PJRT_DEVICE": "CPU"})
    info.versions.update(torch="2.9.0", torch_xla="2.8.0")
    check = kernel_steps.versions(info, {"PJRT_DEVICE": "CPU"})
    assert check.status == "failed" and "do not match" in check.summary
    assert "torch_xla" in check.fix and check.details["versions"]["torch_xla"] == "2.8.0"


@pytest.mark.launch
def test_the_markdown_hides_secrets(tmp_path):
    environ = {"PJRT_DEVICE": "CPU", "HF_TOKEN": "hf_abcdefSECRET", "XLA_FLAGS": "--x=1"}
    info = detect(sys_root=str(tmp_path), environ=environ)
    report = DoctorReport([kernel_steps.environment(info, environ)], 0.1, "now", "0.1.0",
                          env=dict(info.env))
    markdown = report.to_markdown()
    assert "hf_abcdefSECRET" not in markdown and "SECRET" not in report.to_json()
    assert "HF_TOKEN=<hidden>" in markdown and "XLA_FLAGS=--x=1" in markdown


@pytest.mark.launch
def test_unknown_steps_are_refused_with_the_list():
    with pytest.raises(ValueError, match="no step 'gpu'; the steps are 'versions'"):
        hx.doctor(steps=("gpu",))
    with pytest.raises(ValueError, match="status must be one of"):
        Check("x", "fine", "")


@pytest.mark.kernel
def test_the_magic_in_a_real_kernel_shows_the_report_and_its_markdown():
    outputs = run_notebook(["%load_ext hfxla_nb",
                            "%xla_doctor --steps versions,host",
                            "%xla_doctor --steps versions --markdown",
                            "%xla_doctor --steps nothing"], timeout=120)
    shown = stdout_of(outputs[1]) + str(outputs[1])
    assert "hfxla-nb-doctor" in shown and "versions" in shown
    assert "skipped" in shown  # the steps not asked for
    assert "## hfxla_nb doctor: 1 ok, 7 skipped" in stdout_of(outputs[2])
    # IPython shows a UsageError as one line, without a traceback.
    assert stderr_of(outputs[3]).startswith("UsageError: no step 'nothing'")
    assert error_of(outputs[1]) is None


@pytest.mark.kernel
def test_the_magic_shows_its_progress_as_text_and_clears_it():
    kernel = Kernel()
    try:
        kernel.run_ok("%load_ext hfxla_nb")
        cell = kernel.run_ok("%xla_doctor --steps versions,host", timeout=180)
    finally:
        kernel.close()
    shown = [bundle["data"].get("text/plain", "") for bundle in cell.displays + cell.updates]
    steps = [text for text in shown if "hfxla_nb doctor: step" in text]
    assert steps and steps[0] == "hfxla_nb doctor: step 1 of 8, versions ...", shown
    # Text without a string's quotes, and the line ends empty: no stray `''` above the report.
    assert not any(text.startswith(("'", '"')) for text in shown), shown
    assert cell.updates[-1]["data"] == {"text/plain": ""}, cell.updates
