"""Each refusal names its real cause: labels of one class, more devices than the machine
has, a model folder that does not exist. Each is refused through the public API before
anything is forked or written, and no longer blamed on the batch size, the batch split, or an
invalid Hub id.
"""

from __future__ import annotations

import os

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, demo
from hfxla_nb.launch.preflight import MAX_CPU_VIRTUAL_DEVICES, launch_devices
from hfxla_nb.runtime import detect_accelerator
from hfxla_nb.train import FineTuneError


@pytest.fixture
def no_launch_on_a_plain_machine(no_launch_in_empty_folder, monkeypatch):
    """No launch, in an empty working folder whose contents are checked by `nothing_written`,
    and with the device count of a plain machine (no CPU_NUM_DEVICES)."""
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)


def nothing_written(tmp_path) -> None:
    assert list(tmp_path.iterdir()) == []  # no output_dir, no "auto" folder, no file
    assert not _xla.runtime_is_initialized()


def two_class_rows(n: int = 20) -> list[dict]:
    texts, labels = demo.demo_texts(n)
    return [{"text": t, "label": ["negative", "positive"][y]}
            for t, y in zip(texts, labels, strict=True)]


# ---------------------------------------------------------------------------------------------
# 1. Labels of one class
# ---------------------------------------------------------------------------------------------


def test_labels_of_one_class_are_refused_for_that_not_for_the_batch_size(model_dir, tmp_path,
                                                                          no_launch_on_a_plain_machine):
    # 4 rows under the default batch of 8: this was refused as "batch_size = 8 is larger than
    # the 4 training rows".
    rows = [{"text": text, "label": "positive"} for text in ("good", "fine", "great", "nice")]
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(model_dir, rows, output_dir=tmp_path / "out", progress=False)
    message = str(raised.value)
    assert "hold only one class, 'positive', in all 4 rows" in message
    assert "needs at least two classes" in message
    assert "batch_size" not in message and "larger than" not in message
    nothing_written(tmp_path)


def test_a_split_filtered_down_to_one_class_is_refused_not_trained(model_dir, tmp_path,
                                                                   no_launch_on_a_plain_machine):
    # A ClassLabel column of two names with only one of them left: this used to train.
    data = demo.demo_dataset(n=200).filter(lambda row: row["label"] == 1)
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(model_dir, data, batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert "hold only one class, 1 ('positive')" in str(raised.value)
    nothing_written(tmp_path)


# ---------------------------------------------------------------------------------------------
# 2. More devices than the machine has
# ---------------------------------------------------------------------------------------------


def _more_devices_than_the_machine_has(message: str) -> None:
    if detect_accelerator().kind == "tpu":
        assert "asks for more devices than this TPU host has" in message
        return
    assert "num_processes=1000 asks for more XLA devices than this machine has" in message
    assert f"its {os.cpu_count()} CPU core" in message
    assert "as virtual devices (1 now: CPU_NUM_DEVICES is unset)" in message
    assert f"at most {MAX_CPU_VIRTUAL_DEVICES}" in message
    assert "split" not in message and "batch" not in message


def test_notebook_launcher_with_more_processes_than_devices_names_the_device_count(
        tmp_path, no_launch_on_a_plain_machine):
    def train(index):
        return index

    with pytest.raises(hx.LaunchRefusedError) as raised:
        hx.notebook_launcher(train, num_processes=1000, progress=False)
    _more_devices_than_the_machine_has(str(raised.value))
    nothing_written(tmp_path)


def test_fine_tune_checks_the_device_count_before_the_batch_split(model_dir, tmp_path,
                                                                  no_launch_on_a_plain_machine):
    # batch_size=8 over 1000 devices was refused as "does not split evenly over the 1000
    # devices": the split depends on a device count the machine cannot give.
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(model_dir, two_class_rows(), num_processes=1000,
                     output_dir=tmp_path / "out", progress=False)
    _more_devices_than_the_machine_has(str(raised.value))
    nothing_written(tmp_path)


def test_predict_checks_the_device_count_before_the_batch_split(model_dir, tmp_path,
                                                                no_launch_on_a_plain_machine):
    with pytest.raises(FineTuneError) as raised:
        hx.predict(model_dir, ["a text"], batch_size=6, num_processes=1000)
    _more_devices_than_the_machine_has(str(raised.value))
    nothing_written(tmp_path)


def test_a_tpu_host_names_its_cores_for_more_processes_than_it_has():
    assert launch_devices(None, "tpu", 8) == 8
    with pytest.raises(hx.LaunchRefusedError,
                       match="num_processes=16 asks for more devices than this TPU host has: "
                             "this TPU host has 8 cores"):
        launch_devices(16, "tpu", 8)
    assert launch_devices(None, "cpu", 1) == 1 and launch_devices(4, "cpu", 1) == 4


# ---------------------------------------------------------------------------------------------
# 3. A model folder that does not exist
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "folder"), [
    ("./my-model", "my-model"),
    ("../nope/model", "../nope/model"),
    ("models/v1/my-model", "models/v1/my-model"),  # two slashes: no Hub id has them
    ("~/my-model", "home/my-model"),
    ("absolute", "nope/model"),
])
def test_a_missing_model_folder_is_named_with_its_absolute_path(given, folder, model_dir,
                                                                 tmp_path, monkeypatch,
                                                                 no_launch_on_a_plain_machine):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if given == "absolute":
        given = str(tmp_path / "nope" / "model")
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(given, two_class_rows(), output_dir=tmp_path / "out", progress=False)
    message = str(raised.value)
    expected = os.path.abspath(tmp_path / folder)
    assert f"model folder {expected} does not exist (model={given!r}" in message
    assert "Hub id" not in message and "Repo id" not in message
    assert "Hub model id" not in message
    nothing_written(tmp_path)


def test_a_model_path_to_a_file_is_named_a_file(tmp_path, no_launch_on_a_plain_machine):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(FineTuneError, match="is a file, not a folder"):
        hx.fine_tune(str(weights), two_class_rows(), output_dir=tmp_path / "out",
                     progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_only_a_string_shaped_like_a_hub_id_is_called_one(tmp_path, no_launch_on_a_plain_machine):
    # An org/name shape that the Hub's own check refuses locally: no network is asked.
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune("my org/my model", two_class_rows(), output_dir=tmp_path / "out",
                     progress=False)
    message = str(raised.value)
    assert message.startswith("could not load the config of Hub model id 'my org/my model'")
    assert f"no folder {tmp_path / 'my org' / 'my model'} here either" in message
    nothing_written(tmp_path)
