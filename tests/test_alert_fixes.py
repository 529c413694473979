"""Alerts whose fix fits the cause: each alert is judged from an `XlaSummary` (and, where the
alert names a line, torch_xla's own analysis as `TraceLog` records), as the panels get it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hfxla_nb.observe.alerts import analyze
from hfxla_nb.observe.metrics import XlaSummary
from hfxla_nb.observe.tracing import FETCH_CAUSE, ExecutionSite, Frame, TraceLog
from hfxla_nb.ui import text
from tests.helpers import subprocess_env


def alert(summary: XlaSummary, code: str):
    (found,) = [a for a in analyze(summary) if a.code == code]
    return found


def everything(found) -> str:
    return f"{found.title}\n{found.explanation}\n{found.fix}"


def test_the_attention_mask_check_points_to_fixed_padding_and_hx_patches():
    trace = TraceLog()
    check = Frame("_ignore_bidirectional_mask_sdpa", "/venv/transformers/masking_utils.py", 90)
    trace.executions = (ExecutionSite(FETCH_CAUSE, Frame("train", "/tmp/ipykernel_1/2.py", 12,
                                                          cell=5), check, 20, 1),)
    summary = XlaSummary(steps=20, executions=40, transfers_from_device=20, trace=trace)
    found = alert(summary, "frequent-transfers")
    assert "attention-mask check" in found.explanation
    assert "masking_utils.py:90 `_ignore_bidirectional_mask_sdpa`" in found.explanation
    assert "padding='max_length'" in found.fix and "hx.patches.applied()" in found.fix
    assert "log_every" not in found.fix  # fetching less often does not remove this fetch


def test_a_fetch_elsewhere_keeps_the_fetch_less_often_fix():
    summary = XlaSummary(steps=20, executions=20, transfers_from_device=20, item_calls=20,
                         item_lines=["cell 9, line 7"])
    found = alert(summary, "frequent-transfers")
    assert found.title == "Device-to-host transfers: 20 in 20 steps, .item() at cell 9, line 7"
    assert found.fix.startswith("At cell 9, line 7: fetch values only every N steps")
    assert "hx.patches" not in found.fix


def recompiling(steps: int, dataloader: bool | None = None, **shapes) -> XlaSummary:
    return XlaSummary(steps=steps, compiles=steps, compile_seconds=72.3, executions=steps,
                      execute_seconds=0.5, input_shapes=shapes, dataloader=dataloader)


def test_a_recompile_without_inputs_shows_how_to_name_the_input():
    found = alert(recompiling(12), "frequent-compiles")
    assert "hx.report(step=step, loss=loss, inputs=batch)" in found.explanation
    shapes = {"x": [{"shape": [4 * i, 8], "first": i, "last": i} for i in range(1, 13)]}
    named = alert(recompiling(12, x=shapes["x"]), "frequent-compiles")
    assert "input 'x' had 12 different shapes" in named.explanation
    assert "inputs=" not in named.explanation


def test_drop_last_only_where_a_dataloader_can_be():
    shapes = [{"shape": [4 * i, 8], "first": i, "last": i} for i in range(1, 13)]
    assert "drop_last" not in alert(recompiling(12, False, x=shapes), "frequent-compiles").fix
    known = alert(recompiling(12, True, x=shapes), "frequent-compiles").fix
    assert "use drop_last=True in the DataLoader" in known
    unknown = alert(recompiling(12, None, x=shapes), "frequent-compiles").fix
    assert "if the batches come from a DataLoader, drop_last=True" in unknown


def test_no_warm_up_words_on_a_run_no_longer_than_the_warm_up():
    short = everything(alert(recompiling(8), "frequent-compiles"))
    assert "warm-up" not in short and "a new graph at nearly every step" in short
    longer = recompiling(12)
    longer.compiles_after_warmup, longer.steps_after_warmup = 2, 2
    found = everything(alert(longer, "frequent-compiles"))
    assert "warm-up" not in found and (
        "(torch_xla warns above 0.5; under 3 steps after the first 10, too few to rate)" in found)
    longer = recompiling(16)
    longer.compiles_after_warmup, longer.steps_after_warmup = 6, 6
    found = everything(alert(longer, "frequent-compiles"))
    assert "torch_xla warns above 0.5; 6 of them in the 6 steps after the first 10" in found


def test_one_duration_format_in_the_table_and_the_alert():
    summary = recompiling(12)
    found = alert(summary, "frequent-compiles")
    assert "taking 1 min 12 s." in found.explanation and "72.3" not in found.explanation
    assert "12 compiles (1 min 12 s)" in "\n".join(text.summary_lines(summary))


def test_compiles_after_the_last_step_are_not_rated_per_step():
    # The causal-LM fine-tune's figures: 2 graphs for 45 steps, then 64 while saving.
    summary = XlaSummary(steps=45, compiles=66, compile_seconds=40.0, executions=100,
                         execute_seconds=3.0)
    assert alert(summary, "frequent-compiles").title == "Recompiling: 66 compiles in 45 steps"
    summary.compiles_after_steps, summary.compile_seconds_after_steps = 64, 8.6
    assert [a.code for a in analyze(summary)] == []
    lines = text.summary_lines(summary)
    assert lines[0].startswith("XLA in 45 steps: 66 compiles (40.0 s)")
    assert lines[1] == ("after the last step: 64 of the compiles (8.6 s): saving, evaluation; "
                        "not rated per step")


# -- the README's idiom: report(step=..., loss=...) without inputs= ---------------------------

GROWING = """
import json
import hfxla_nb as hx


def train(inputs):
    import torch, torch_xla
    device = torch_xla.device()
    weight = torch.ones(8, 8, device=device)
    for step in range(1, 41):
        x = torch.ones(2 + step // 8, 8).to(device)  # the batch grows every 8 steps
        loss = (x @ weight).mean()
        weight = weight - 0.01 * loss
        hx.report(step=step, total=40, loss=loss, inputs={"x": x} if inputs else None)
        torch_xla.sync()


found = {}
for inputs in (False, True):
    hx.notebook_launcher(train, args=(inputs,), num_processes=1, progress="console")
    found[str(inputs)] = hx.last_launch().ranks[0].metrics.alerts
print(json.dumps(found))
"""


@pytest.mark.launch
def test_a_launched_loop_that_recompiles_warns_with_its_line_whether_or_not_it_reports_inputs(
        tmp_path):
    # The batch grows every 8 steps, so the step's line compiles a new graph every 8 steps:
    # fewer than torch_xla's 0.5 per step, nearly all the XLA time. Reporting only step and
    # loss used to raise no alert: the trace alone names the line.
    script = tmp_path / "train.py"
    script.write_text(GROWING)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=subprocess_env(), cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    line = "`train` in train.py, line 15"
    for inputs, alerts in found.items():
        (recompiling,) = [a for a in alerts if a["code"] == "frequent-compiles"]
        assert recompiling["severity"] == "warning", (inputs, recompiling)
        assert recompiling["title"].startswith(f"Recompiling: {line} compiled "), recompiling
        assert recompiling["title"].endswith(" different graphs in 40 steps"), recompiling
        assert recompiling["fix"].startswith(f"At {line}: "), recompiling
    # inputs= adds the input whose shape changed; without it, the way to name it.
    reported = next(a for a in found["True"] if a["code"] == "frequent-compiles")
    assert "input 'x' had 6 different shapes" in reported["explanation"], reported
    bare = next(a for a in found["False"] if a["code"] == "frequent-compiles")
    assert "inputs=" in bare["explanation"], bare
    assert "⚠ Recompiling: " + line in done.stdout.split("✔ launch finished")[1], done.stdout


def test_frequent_fetches_name_fine_tunes_log_every_too():
    # fine_tune(log_every=1) fetches the loss every step from its own loop: no line of the
    # user's to name, and the fix is fine_tune's option, not only report's.
    summary = XlaSummary(steps=20, executions=20, transfers_from_device=22)
    found = alert(summary, "frequent-transfers")
    assert found.fix.startswith("Fetch values only every N steps: fine_tune(..., log_every=N), "
                                "hfxla_nb.report(loss=loss, log_every=N)"), found.fix


def test_a_callback_is_blamed_only_where_values_were_read_most():
    callback = Frame("on_step_end", "/tmp/ipykernel_1/3.py", 7, cell=3)
    library = Frame("_fetch", "/venv/somelib/metrics.py", 40)
    trace = TraceLog()
    trace.executions = (ExecutionSite(FETCH_CAUSE, callback, None, 20, 1),)
    found = alert(XlaSummary(steps=20, executions=40, transfers_from_device=20, trace=trace),
                  "frequent-transfers")
    assert found.title.endswith("values read by a TrainerCallback at `on_step_end` in cell 3, "
                                "line 7"), found.title
    # Library code read values more often: the title names it, and no callback is blamed.
    trace.executions = (ExecutionSite(FETCH_CAUSE, None, library, 30, 1),
                        ExecutionSite(FETCH_CAUSE, callback, None, 20, 1))
    found = alert(XlaSummary(steps=20, executions=60, transfers_from_device=50, trace=trace),
                  "frequent-transfers")
    assert found.title.endswith(", values read at library code"), found.title
    assert "TrainerCallback" not in everything(found)
