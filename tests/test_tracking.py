"""Experiment tracking (`report_to=`): what `fine_tune` and `notebook_launcher` write to
TensorBoard and W&B, read back with each library's own reader (TensorBoard's
`EventAccumulator`, `wandb leet inspect --json`), and the refusals before the fork.

W&B runs offline (`WANDB_MODE=offline`, its files in the test's folder): no network.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, demo
from hfxla_nb.events import MetricsSnapshot, Progress
from hfxla_nb.launch import LaunchRefusedError
from hfxla_nb.observe import tracking
from hfxla_nb.observe import tracking as tracking_writers
from hfxla_nb.observe.tracking import Tracker, TrackingSettings, plain
from hfxla_nb.train import FineTuneConfig, FineTuneError
from hfxla_nb.train.preparation import check_output_dir

STEPS = 8
LOG_EVERY = 2


def _offline(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(folder))
    monkeypatch.setenv("WANDB_SILENT", "true")


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of TensorBoard's event files in `log_dir`, by tag: (step, value)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def hparams(log_dir: Path) -> dict[str, object]:
    """The hyper-parameters of TensorBoard's HParams plugin data in `log_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(log_dir))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {name: getattr(value, value.WhichOneof("kind"))
            for name, value in start.hparams.items()}


def wandb_records(folder: Path) -> list[dict]:
    """The records of the one offline W&B run under `folder`, as W&B's own reader prints
    them (`wandb leet inspect --json`)."""
    runs = sorted((folder / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    wandb = Path(sys.executable).with_name("wandb")
    out = subprocess.run([str(wandb), "leet", "inspect", "--json", str(runs[0])],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def wandb_history(records: list[dict]) -> list[dict]:
    return [record["history"]["item"] for record in records if record["type"] == "history"]


def wandb_run(records: list[dict]) -> dict:
    return next(record["run"] for record in records if record["type"] == "run")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


# -- refused before the fork -------------------------------------------------------------------


def test_bad_report_to_is_refused_before_the_fork(monkeypatch, tmp_path, no_launch):
    with pytest.raises(FineTuneError, match="'tensorbord' is not a tracker .*did you mean "
                                           "'tensorboard'"):
        FineTuneConfig(report_to="tensorbord")
    monkeypatch.setitem(tracking.TRACKERS, "wandb",
                        ("wandb_is_not_installed_here", 'pip install "hfxla_nb[wandb]"'))
    with pytest.raises(FineTuneError, match=r'not installed: pip install "hfxla_nb\[wandb\]"'):
        hx.fine_tune("unused", [{"text": "a", "label": "b"}], report_to=["wandb"])
    with pytest.raises(LaunchRefusedError, match=r'pip install "hfxla_nb\[wandb\]"'):
        hx.notebook_launcher(lambda: None, report_to="wandb")
    with pytest.raises(LaunchRefusedError, match="'mlflow' is not a tracker"):
        hx.notebook_launcher(lambda: None, report_to="mlflow")
    with pytest.raises(FineTuneError, match="pass log_dir=<a folder>"):
        FineTuneConfig(report_to="tensorboard", output_dir=None)
    assert not list(tmp_path.iterdir())  # nothing written
    assert not _xla.runtime_is_initialized()


def test_wandb_online_without_a_login_is_refused(monkeypatch, tmp_path, no_launch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)  # no wandb.login() in this kernel
    with pytest.raises(LaunchRefusedError, match="wandb login.*WANDB_MODE=offline"):
        hx.notebook_launcher(lambda: None, report_to="wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking.check_report_to(["wandb", "tensorboard", "wandb"]) == ("wandb",
                                                                            "tensorboard")


def test_a_tracker_that_fails_warns_and_the_others_go_on(tmp_path):
    """Tracking never stops a run: a writer that cannot start is named once, the others
    write; a value fetched later for a step already written is written once."""
    def open_writer(name, settings):
        if name == "wandb":
            raise RuntimeError("no service")
        return tracking_writers.open_writer(name, settings)

    tracker = Tracker(TrackingSettings(("wandb", "tensorboard"), str(tmp_path)), open_writer)
    now = time.time()
    with pytest.warns(RuntimeWarning, match="report_to='wandb' could not start"):
        tracker.handle(Progress(0, 1, 2, {"lr": 0.5}, 4, "train", time=now))
    tracker.handle(Progress(0, 1, 2, {"lr": 0.5, "loss": 2.0}, 4, "train", time=now))
    tracker.handle(Progress(1, 1, 2, {"loss": 9.0}, 4, "train", time=now))  # rank 1: not ours
    for step in range(2, 7):  # 4 samples a second: the bar's steady rate from step 3 on
        tracker.handle(Progress(0, step, 6, {}, 4 * step, "train", time=now + step - 1))
    tracker.handle(Progress(0, 6, 6, {"loss": 1.0}, 24, "train", time=now + 6, late=True))
    for step, count in ((1, 3), (2, 4), (2, 5)):  # the step's latest reading is kept
        data = {"metrics": {"CompileTime": {"count": count, "total": 1e9, "samples": []}}}
        tracker.handle(MetricsSnapshot(0, step, data, time=now + step))
    tracker.close()
    found = scalars(tmp_path)
    assert found["train/lr"] == [(1, 0.5)] and found["train/loss"] == [(1, 2.0), (6, 1.0)]
    assert found["train/samples_per_second"] == [(6, 4.0)]
    assert found["xla/compiles"] == [(1, 3.0), (2, 5.0)]


# -- fine_tune: one tiny run, read back from both trackers --------------------------------------


@pytest.fixture(scope="module")
def tracked(cache, tmp_path_factory):
    """8 steps of the demo classifier's LoRA adapters, logged every 2 steps, to TensorBoard
    and W&B."""
    monkeypatch = pytest.MonkeyPatch()
    folder = tmp_path_factory.mktemp("tracked")
    _offline(monkeypatch, folder / "wandb-dir")
    try:
        config = FineTuneConfig(max_steps=STEPS, batch_size=16, learning_rate=1e-3,
                                log_every=LOG_EVERY, output_dir=folder / "out", progress=False,
                                report_to=["tensorboard", "wandb"], run_name="tiny",
                                project="hfxla-tests", lora=True)  # LoRA: a memory plan
        result = hx.fine_tune(demo.demo_model_dir(cache=cache), demo.demo_dataset(n=240),
                              config)
        yield config, result, folder
    finally:
        monkeypatch.undo()


@pytest.mark.launch
def test_fine_tune_writes_every_figure_to_tensorboard(tracked):
    config, result, folder = tracked
    log_dir = folder / "out" / "runs" / "tiny"  # kept when the final save replaced out/
    found = scalars(log_dir)
    losses = found["train/loss"]
    assert [step for step, _ in losses] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert all(_close(a, b) for (_, a), (_, b) in zip(losses, result.loss_history,
                                                      strict=True))
    rates = [step for step, _ in found["train/lr"]]
    assert rates == [step for step, _ in losses]
    assert all(value > 0 for _, value in found["train/lr"])
    # The bar's steady rate, once it has one (these 8 steps take less than a bar update).
    assert all(value > 0 for _, value in found.get("train/samples_per_second", []))
    for name, value in result.metrics.items():
        assert found[f"eval/{name.removeprefix('eval_')}"] == [(STEPS, pytest.approx(value))]
    assert found["final/samples_per_second"] == [(STEPS, pytest.approx(
        result.samples_per_second))]
    assert found["final/compiles"] == [(STEPS, result.compiles)]
    assert found["final/transfers_per_step"] == [(STEPS, pytest.approx(
        result.transfers_per_step))]
    # The last metrics snapshot: what the launch's record says for rank 0.
    assert found["xla/compiles"][-1][1] == result.xla["compiles"]
    assert found["xla/transfers_from_device"][-1][1] == result.xla["transfers_from_device"]
    # The output folder stays an earlier fine_tune output: the next run there replaces it
    # only when asked to (overwrite_output_dir=True), and the TensorBoard files do not count.
    assert check_output_dir(folder / "out", "tiny-bert", overwrite=True) == str(folder / "out")
    with pytest.raises(FineTuneError, match="already holds a saved model"):
        check_output_dir(folder / "out", "tiny-bert")


@pytest.mark.launch
def test_fine_tune_hyperparameters_are_every_field_and_the_memory_plan(tracked):
    config, result, folder = tracked
    found = hparams(folder / "out" / "runs" / "tiny")
    for field in dataclasses.fields(FineTuneConfig):
        value = plain(getattr(config, field.name))
        expected = "None" if value is None else value
        assert found[field.name] == (float(expected) if isinstance(expected, (bool, int, float))
                                     else expected), field.name
    assert result.memory_plan is not None
    for name, value in result.memory_plan.items():
        assert f"memory/{name}" in found
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert found[f"memory/{name}"] == pytest.approx(value)


@pytest.mark.launch
def test_fine_tune_writes_the_same_to_wandb_offline(tracked):
    config, result, folder = tracked
    records = wandb_records(folder / "wandb-dir")
    run = wandb_run(records)
    assert run["project"] == "hfxla-tests" and run["display_name"] == "tiny"
    written = run["config"]["update"]
    assert {f.name for f in dataclasses.fields(FineTuneConfig)} <= set(written)
    assert written["learning_rate"] == 1e-3 and written["report_to"] == "tensorboard, wandb"
    assert written["memory/total_gib"] == pytest.approx(result.memory_plan["total_gib"])
    rows = wandb_history(records)
    losses = [(row["step"], row["train/loss"]) for row in rows if "train/loss" in row]
    assert [step for step, _ in losses] == [step for step, _ in result.loss_history]
    assert all(_close(a, b) for (_, a), (_, b) in zip(losses, result.loss_history,
                                                      strict=True))
    final = [row for row in rows if "final/compiles" in row]
    assert len(final) == 1 and final[0]["step"] == STEPS
    assert final[0]["final/compiles"] == result.compiles
    for name, value in result.metrics.items():
        assert final[0][f"eval/{name.removeprefix('eval_')}"] == pytest.approx(value)
    assert any("xla/compiles" in row for row in rows)
    assert records[-1] == {**records[-1], "type": "exit"}
    assert records[-1]["exit"].get("exit_code", 0) == 0


# -- notebook_launcher: the values hx.report sends ---------------------------------------------


def _reports(steps: int) -> str:
    import time as clock

    import hfxla_nb as hx

    for step in range(1, steps + 1):
        hx.report(step=step, total=steps, loss=1.0 / step, lr=0.01 * step, samples=4 * step)
        clock.sleep(0.25)  # past report's throttle (0.2 s): every step reaches the notebook
    return "done"


@pytest.mark.launch
def test_the_launchers_report_values_reach_both_trackers(monkeypatch, tmp_path):
    _offline(monkeypatch, tmp_path / "wandb-dir")
    steps = 6
    value = hx.notebook_launcher(_reports, args=(steps,), progress=False,
                                 report_to=["tensorboard", "wandb"], log_dir=tmp_path / "tb",
                                 project="hfxla-tests", run_name="reports",
                                 hparams={"lr": 0.01, "note": "plain floats", "path": tmp_path})
    assert value == "done"
    found = scalars(tmp_path / "tb")
    assert found["train/loss"] == [(s, pytest.approx(1.0 / s)) for s in range(1, steps + 1)]
    assert found["train/lr"] == [(s, pytest.approx(0.01 * s)) for s in range(1, steps + 1)]
    assert hparams(tmp_path / "tb") == {"lr": 0.01, "note": "plain floats",
                                        "path": str(tmp_path)}
    records = wandb_records(tmp_path / "wandb-dir")
    assert wandb_run(records)["config"]["update"]["note"] == "plain floats"
    rows = [(row["step"], row["train/loss"], row["train/lr"]) for row in wandb_history(records)
            if "train/loss" in row]
    assert rows == [(s, pytest.approx(1.0 / s), pytest.approx(0.01 * s))
                    for s in range(1, steps + 1)]
