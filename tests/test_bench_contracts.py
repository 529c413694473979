"""The counted contracts `make bench` compares against, from the bench's own code.

Nothing timed is read here: only compiles, executions and device-to-host transfers, which are
deterministic, of the bench's hand-written loop and its `transformers.Trainer` run
(`bench/workloads.py`), at tiny sizes. `fine_tune`'s own counts are held by
`tests/test_finetune.py` (compile, transfer and per-bucket contracts). Timings stay in
`make bench`.
"""

from __future__ import annotations

import pytest

from bench import common, workloads
from hfxla_nb import _xla

pytestmark = pytest.mark.launch


@pytest.fixture(scope="module")
def tiny():
    model = workloads.tiny_bert()
    return model, workloads.tokenized(model, 128, 32)


def test_the_hand_written_loop_syncs_once_per_step_through_transformers_mask_check(tiny):
    model, data = tiny
    figures = workloads.launched(workloads.run_hand_written, {
        "model": model, "data": data, "steps": 8, "warmup": 3, "batch_size": 8})
    # The step's graph, and the one transformers' `padding_mask.all()` check cuts and fetches:
    # two executions and one transfer per step, even in best-practice torch_xla code.
    assert figures["compiles"] == 3
    assert figures["executions_per_step"] == 2.0
    assert figures["transfers_per_step"] == 1.0
    assert not _xla.runtime_is_initialized()


def test_trainer_logging_every_step_syncs_many_times_per_step(tiny):
    model, data = tiny
    figures = workloads.launched(workloads.run_trainer, {
        "model": model, "data": data, "steps": 6, "warmup": 3, "batch_size": 8,
        "logging_steps": 1})
    assert figures["steps"] == 6 and figures["train_compiles"] == 8
    assert figures["transfers_per_step"] == 12.0
    assert figures["executions_per_step"] == pytest.approx(23 / 3)


def test_results_say_not_met_for_a_target_missed(tmp_path):
    figures = [
        common.target_figure("1 x", "ratio", 0.9, ">=", 0.98, "x", 5, "why"),
        common.target_figure("2 y", "count", 1.0, "<=", 1.0, "", 1),
        common.Figure("8 z", "rate", 3.0, "steps/s", repeats=5),
    ]
    json_path, md_path = common.write_results(figures, 0.0, 0.5, out_dir=tmp_path)
    text = md_path.read_text()
    assert json_path.is_file() and "Targets: 1 of 2 met." in text
    rows = [line for line in text.splitlines() if line.startswith("| 1 x")]
    assert rows == ["| 1 x | ratio | 0.90x | >= 0.98 | **not met** | 5 | why |"]
    assert "| 2 y | count | 1.00 | <= 1 | met | 1 |  |" in text
    assert "| 8 z | rate | 3.00 steps/s | - | reported | 5 |  |" in text
