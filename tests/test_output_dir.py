"""No fine_tune run loses or replaces another's model: `output_dir="auto"` is a new folder for
each run (`hfxla_nb_output/<model>-<start time>`), and a folder that holds a saved model is
written only when named with `overwrite_output_dir=True` (or resumed from), refused before
anything is forked or written otherwise.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, demo
from hfxla_nb.train import FineTuneError, FineTuneResult, prepare_fine_tune
from hfxla_nb.train.preparation import (
    OUTPUT_ROOT,
    check_output_dir,
    claim_output_dir,
    new_output_dir,
    release_output_dir,
)
from hfxla_nb.train.worker import saving

STARTED = datetime(2026, 12, 5, 22, 45, 1)


def rows(n: int = 40) -> list[dict]:
    texts, labels = demo.demo_texts(n)
    return [{"text": t, "label": y} for t, y in zip(texts, labels, strict=True)]


def contents(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder under `folder`, with each file's bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


# ---------------------------------------------------------------------------------------------
# The default folder: new for each run
# ---------------------------------------------------------------------------------------------


def test_the_default_folder_is_named_by_the_model_and_the_start(tmp_path):
    root = tmp_path / "runs"
    first = new_output_dir("tiny-bert", STARTED, root=root)
    assert first == root / "tiny-bert-20261205-224501"
    later = new_output_dir("tiny-bert", datetime(2026, 12, 5, 22, 45, 2), root=root)
    assert later == root / "tiny-bert-20261205-224502"
    # Two runs started in the same second: the second gets the next free name.
    first.mkdir(parents=True)
    assert new_output_dir("tiny-bert", STARTED, root=root) == root / "tiny-bert-20261205-224501-2"
    (root / "tiny-bert-20261205-224501-2").write_text("a file takes the name too")
    assert new_output_dir("tiny-bert", STARTED, root=root) == root / "tiny-bert-20261205-224501-3"
    assert new_output_dir("other", STARTED, root=root) == root / "other-20261205-224501"


def test_check_output_dir_auto_names_a_new_folder_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = check_output_dir("auto", "tiny-bert", started=STARTED)
    assert folder == str(tmp_path / OUTPUT_ROOT / "tiny-bert-20261205-224501")
    assert list(tmp_path.iterdir()) == []  # named, not made: prepare_fine_tune writes nothing
    # Two runs each ask for a folder, then claim it before their fork: different folders.
    one = claim_output_dir(check_output_dir("auto", "tiny-bert", started=STARTED))
    two = claim_output_dir(check_output_dir("auto", "tiny-bert", started=STARTED))
    assert (one, two) == (folder, folder + "-2")
    # A claim races another kernel that took the name after the check: the next name.
    assert claim_output_dir(folder) == folder + "-3"
    assert all(os.path.isdir(path) for path in (one, two, folder + "-3"))
    # A run that fails before saving leaves no empty folder behind, nor an empty root.
    (Path(two) / "checkpoints").mkdir()
    for path in (one, two, folder + "-3"):
        release_output_dir(path)
    assert [p.name for p in (tmp_path / OUTPUT_ROOT).iterdir()] == [Path(two).name]
    release_output_dir(two)  # not empty: kept
    assert os.path.isdir(Path(two) / "checkpoints")


def test_prepare_fine_tune_names_a_new_folder_for_each_run(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = prepare_fine_tune(model_dir, rows(), batch_size=8)
    second = prepare_fine_tune(model_dir, rows(), batch_size=8)
    name = Path(model_dir).name
    for plan in (first, second):
        assert Path(plan.output_dir).parent == tmp_path / OUTPUT_ROOT
        assert Path(plan.output_dir).name.startswith(f"{name}-2")  # <model>-<YYYYmmdd-...>
    assert list(tmp_path.iterdir()) == []  # prepare_fine_tune writes nothing


@pytest.fixture(scope="module")
def two_runs(model_dir, tmp_path_factory):
    """Two real runs with the default output_dir, one after the other in the same working
    folder: a full fine-tune of 2 steps, then one of 3 steps with another learning rate."""
    where = tmp_path_factory.mktemp("two-runs")
    before = os.getcwd()
    os.chdir(where)
    try:
        options = dict(batch_size=8, num_processes=1, progress=False, eval_dataset=rows(16))
        first = hx.fine_tune(model_dir, rows(), max_steps=2, learning_rate=1e-3, **options)
        second = hx.fine_tune(model_dir, rows(), max_steps=3, learning_rate=3e-3, **options)
    finally:
        os.chdir(before)
    return where, first, second


@pytest.mark.launch
def test_two_runs_with_the_default_folder_keep_both_models(two_runs):
    from safetensors.numpy import load_file

    where, first, second = two_runs
    assert first.output_dir != second.output_dir
    assert {Path(r.output_dir).parent for r in (first, second)} == {where / OUTPUT_ROOT}
    # Each result reads its own model, and each folder says it is that run's.
    assert FineTuneResult.load(first.output_dir).steps == first.steps == 2
    assert FineTuneResult.load(second.output_dir).steps == second.steps == 3
    one = load_file(Path(first.output_dir) / "model.safetensors")
    two = load_file(Path(second.output_dir) / "model.safetensors")
    assert any(not np.array_equal(one[name], two[name]) for name in one)
    loaded = first.load_model().state_dict()
    assert all(np.array_equal(loaded[name].numpy(), one[name]) for name in one if name in loaded)
    assert not _xla.runtime_is_initialized()


@pytest.mark.launch
def test_a_third_run_into_a_saved_folder_needs_overwrite_output_dir(two_runs, model_dir):
    where, first, _ = two_runs
    folder = Path(first.output_dir)
    before = contents(folder)
    with pytest.raises(FineTuneError) as refused:
        prepare_fine_tune(model_dir, rows(), batch_size=8, output_dir=folder)
    assert "already holds a saved model" in str(refused.value)
    assert contents(folder) == before
    plan = prepare_fine_tune(model_dir, rows(), batch_size=8, output_dir=folder,
                             overwrite_output_dir=True)
    assert plan.output_dir == str(folder)


# ---------------------------------------------------------------------------------------------
# A folder with a saved model: refused before the fork without overwrite_output_dir=True
# ---------------------------------------------------------------------------------------------


def saved_model(folder: Path) -> None:
    """What `save_pretrained` leaves: config.json and the weights."""
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")


def saved_adapter(folder: Path) -> None:
    (folder / "adapter").mkdir(parents=True)
    (folder / "adapter" / "adapter_config.json").write_text("{}")


def saved_checkpoints(folder: Path) -> None:
    """An interrupted fine_tune's folder: checkpoints, no final model."""
    step = folder / saving.CHECKPOINTS / "checkpoint-2"
    step.mkdir(parents=True)
    (step / saving.STATE_FILE).write_bytes(b"state")
    (step / "config.json").write_text("{}")


def saved_run(folder: Path) -> None:
    folder.mkdir()
    (folder / saving.RUN_FILE).write_text("{}")


SAVED = {"save_pretrained": saved_model, "adapter": saved_adapter,
         "checkpoints": saved_checkpoints, "fine_tune run": saved_run}


@pytest.mark.parametrize("kind", sorted(SAVED))
def test_a_folder_with_a_saved_model_is_refused_before_the_fork(kind, model_dir, tmp_path,
                                                                no_launch_in_empty_folder):
    folder = tmp_path / "earlier"
    SAVED[kind](folder)
    before = contents(tmp_path)
    with pytest.raises(FineTuneError) as refused:
        hx.fine_tune(model_dir, rows(), batch_size=8, output_dir=folder, progress=False)
    message = str(refused.value)
    assert message.startswith(f"output_dir {folder} already holds a saved model (")
    for fix in ("Pass overwrite_output_dir=True", "pass another output_dir",
                "leave output_dir out: each run then gets a new folder"):
        assert fix in message
    assert contents(tmp_path) == before  # nothing written, no "auto" folder either
    assert not _xla.runtime_is_initialized()


@pytest.mark.parametrize("kind", sorted(SAVED))
def test_overwrite_output_dir_lets_a_named_folder_be_replaced(kind, model_dir, tmp_path):
    folder = tmp_path / "earlier"
    SAVED[kind](folder)
    plan = prepare_fine_tune(model_dir, rows(), batch_size=8, output_dir=folder,
                             overwrite_output_dir=True)
    assert plan.output_dir == str(folder)


def test_an_empty_or_new_folder_needs_no_overwrite(model_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "logs" / saving.RUNS).mkdir(parents=True)  # TensorBoard's files only
    for name in ("empty", "new", "logs"):
        plan = prepare_fine_tune(model_dir, rows(), batch_size=8, output_dir=tmp_path / name)
        assert plan.output_dir == str(tmp_path / name)


def test_overwrite_output_dir_is_a_known_option_checked_as_the_others(model_dir, tmp_path,
                                                                      no_launch_in_empty_folder):
    with pytest.raises(FineTuneError, match="overwrite_output_dir must be True or False"):
        hx.fine_tune(model_dir, rows(), output_dir=tmp_path / "out", overwrite_output_dir="yes")
    with pytest.raises(FineTuneError, match="did you mean 'overwrite_output_dir'"):
        hx.fine_tune(model_dir, rows(), output_dir=tmp_path / "out", overwrite_output=True)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Resuming writes the folder it resumes from
# ---------------------------------------------------------------------------------------------


def test_resuming_into_the_folder_of_the_checkpoints_needs_no_overwrite(tmp_path):
    folder = tmp_path / "interrupted"
    saved_checkpoints(folder)
    step = folder / saving.CHECKPOINTS / "checkpoint-2"
    for resume in (True, step, folder):
        assert check_output_dir(folder, "tiny-bert", resume=resume) == str(folder)
    # Checkpoints of another folder: resuming from them does not make this one writable.
    other = tmp_path / "other"
    saved_checkpoints(other)
    with pytest.raises(FineTuneError, match="already holds a saved model"):
        check_output_dir(folder, "tiny-bert", resume=other / saving.CHECKPOINTS)
    with pytest.raises(FineTuneError, match="already holds a saved model"):
        check_output_dir(folder, "tiny-bert", resume=None)


def test_resume_true_without_output_dir_names_the_folder_to_pass(tmp_path, monkeypatch):
    """The default folder is new, so it holds no checkpoint: the refusal names the newest
    folder of this model that holds some."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FineTuneError) as refused:
        check_output_dir("auto", "tiny-bert", resume=True)
    assert "pass the interrupted run's folder as output_dir, or the checkpoint" in str(
        refused.value)
    older, newer = (tmp_path / OUTPUT_ROOT / f"tiny-bert-2026120{d}-000000" for d in (4, 5))
    (tmp_path / OUTPUT_ROOT).mkdir()
    saved_checkpoints(older)
    saved_checkpoints(newer)
    os.utime(older, (1, 1))
    with pytest.raises(FineTuneError) as refused:
        check_output_dir("auto", "tiny-bert", resume=True)
    assert f"(the newest with checkpoints here: output_dir={str(newer)!r})" in str(refused.value)


def test_the_demos_default_to_a_new_folder_under_demo_output(tmp_path, monkeypatch):
    """Running a demo again keeps the model an earlier run saved (`make demo` twice)."""
    monkeypatch.chdir(tmp_path)
    folder = Path(demo.demo_output_dir("auto", "tiny-bert"))
    assert folder.parent == Path("demo_output") and folder.name.startswith("tiny-bert-2")
    folder.mkdir(parents=True)
    assert demo.demo_output_dir("auto", "tiny-bert") != str(folder)
    for given in (None, tmp_path / "mine", "mine"):
        assert demo.demo_output_dir(given, "tiny-bert") == given
