"""A full disk never costs the trained model: `fine_tune` refuses, before the fork, an output
folder whose disk has less free space than the run writes; a final save that fails anyway
(here: a real tmpfs out of inodes, which the free-space check cannot see) goes to a fallback
folder, else stays in the result, and the run ends normally.

The file systems are real tmpfs mounts (root, or CAP_SYS_ADMIN); the tests that need one are
skipped, saying why, where mounting is not allowed.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, demo
from hfxla_nb.train import FineTuneResult
from hfxla_nb.train.memory import (
    ADAMW_BYTES,
    ADAPTER_BYTES,
    MARGIN_BYTES,
    SMALL_FILES_BYTES,
    DiskSpaceError,
    checkpoints_written,
    estimate_output,
    refusal,
    size,
    tokenizer_bytes,
)
from hfxla_nb.train.worker.saving import rescue_folder, write_failure

MNT_DETACH = 2  # umount2's flag: detach now, even while a file is open there


@pytest.fixture
def tmpfs(tmp_path):
    """A function that mounts a tmpfs with mount options (`size=256k`, `nr_inodes=3`) on a
    new folder under `tmp_path` and returns it; every mount is detached after the test."""
    libc = ctypes.CDLL(None, use_errno=True)
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        target = tmp_path / name
        target.mkdir()
        if libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", 0, options.encode()) != 0:
            error = ctypes.get_errno()
            pytest.skip(f"cannot mount a tmpfs here ({os.strerror(error)}): these tests need "
                        "root or CAP_SYS_ADMIN")
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        libc.umount2(os.fsencode(target), MNT_DETACH)


def _parameters(model_dir: str) -> int:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    return sum(parameter.numel() for parameter in model.parameters())


def _weights(folder: str) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def _bytes_in(folder: str) -> int:
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


# -- the estimate: pure numbers --------------------------------------------------------------


def test_a_full_fine_tune_writes_its_model_in_its_dtype_and_the_tokenizer():
    need = estimate_output(parameters=1_000_000, bytes_per_parameter=2, vocab=32_000)
    assert need.model == 2_000_000 and need.adapter == 0 and need.checkpoints == 0
    assert need.tokenizer == tokenizer_bytes(32_000) == 32_000 * 100 + 64 * 1024
    assert need.total == 2_000_000 + need.tokenizer + SMALL_FILES_BYTES
    assert need.needed == need.total + int(need.total * 0.05) + MARGIN_BYTES
    assert need.parts() == "the model 1.9 MiB, the tokenizer 3.1 MiB"


def test_lora_writes_the_adapter_and_the_merged_model_and_checkpoints_the_adapter():
    need = estimate_output(parameters=7_000_000, bytes_per_parameter=2, trainable=40_000,
                           lora=True, vocab=1000, checkpoints=3)
    assert need.model == 14_000_000  # the merged model, in the base's dtype
    assert need.adapter == 40_000 * ADAPTER_BYTES  # float32 adapters
    # A LoRA checkpoint: the adapter, the tokenizer, AdamW's 2 fp32 moments per adapter weight.
    assert need.checkpoint == (40_000 * ADAPTER_BYTES + need.tokenizer + 40_000 * ADAMW_BYTES
                               + SMALL_FILES_BYTES)
    assert need.total == (14_000_000 + need.adapter + need.tokenizer + SMALL_FILES_BYTES
                          + 3 * need.checkpoint)
    assert "merged model" in need.parts() and "the adapter" in need.parts()
    assert "3 checkpoints of" in need.parts()


def test_each_checkpoint_kept_adds_the_model_and_adamws_state():
    without = estimate_output(parameters=1_000_000, bytes_per_parameter=4, vocab=100)
    kept = estimate_output(parameters=1_000_000, bytes_per_parameter=4, vocab=100,
                           checkpoints=checkpoints_written(100, 30))
    assert kept.checkpoints == 3  # steps 30, 60, 90: every one is kept
    one = 1_000_000 * 4 + without.tokenizer + 1_000_000 * ADAMW_BYTES + SMALL_FILES_BYTES
    assert kept.checkpoint == one
    assert kept.total == without.total + 3 * one
    assert checkpoints_written(60, 30) == 2  # the last step's checkpoint too
    assert checkpoints_written(60, None) == 0
    assert checkpoints_written(60, 30, start_step=30) == 1  # resumed: only the new ones
    assert checkpoints_written(100, 40, start_step=50) == 1  # step 80


def test_the_refusal_gives_needed_free_where_and_what_to_do():
    need = estimate_output(parameters=1_000_000, bytes_per_parameter=4, vocab=100,
                           checkpoints=2)
    text = refusal(need, "/data/out", Path("/data"), 512 * 1024)
    assert text.startswith(f"output_dir /data/out needs about {size(need.needed)} (")
    assert "but only 512 KiB is free on /data's file system, so nothing was started" in text
    assert "another output_dir=" in text and "free space there" in text
    assert "fewer checkpoints (a larger save_steps, or save_steps=None)" in text
    no_checkpoints = refusal(estimate_output(1000, 4), "/data/out", Path("/data"), 0)
    assert "checkpoints" not in no_checkpoints
    assert [size(n) for n in (512, 2048, 3 * 1024**2 // 2, 5 * 1024**3)] == [
        "512 B", "2 KiB", "1.5 MiB", "5.0 GiB"]


def test_a_failed_write_is_told_from_a_bug_and_the_default_fallback_is_the_temp_folder():
    from safetensors import SafetensorError

    disk_full = SafetensorError('Error while serializing: I/O error: No space left on device '
                                '(os error 28) at path "/x/.tmpOB9OCc"')
    assert write_failure(disk_full) == "No space left on device (os error 28)"
    assert write_failure(PermissionError(13, "Permission denied")) == (
        "Permission denied (os error 13)")
    assert write_failure(ValueError("a bug (os error 28)")) is None
    first, second = rescue_folder(None, "tiny"), rescue_folder(None, "tiny")
    try:
        assert first != second and first.parent == Path(tempfile.gettempdir())
        assert first.name.startswith("hfxla_nb-rescued-tiny-") and first.is_dir()
    finally:
        first.rmdir()
        second.rmdir()


# -- real file systems ----------------------------------------------------------------------


def test_a_disk_too_small_is_refused_before_anything_is_forked_or_written(
        model_dir, tmpfs, no_launch):
    small = tmpfs("small", "size=256k")
    with pytest.raises(DiskSpaceError) as raised:
        hx.fine_tune(model_dir, demo.demo_dataset(n=200), output_dir=small / "out",
                     max_steps=2, batch_size=8, progress=False)
    text = str(raised.value)
    # The model's own parameters (with the head fine_tune gives it), 4 bytes each.
    assert f"the model {size(_parameters(model_dir) * 4)}" in text
    assert f"output_dir {small / 'out'} needs about " in text
    assert f"but only 256 KiB is free on {small}'s file system, so nothing was started" in text
    assert "another output_dir=" in text
    assert os.listdir(small) == []  # nothing written
    assert not _xla.runtime_is_initialized()


@pytest.mark.launch
def test_a_save_that_fails_after_training_goes_to_the_fallback_folder(
        model_dir, tmpfs, tmp_path, capsys):
    # Room for the bytes (the check passes) but 3 inodes: the save's temporary folder and
    # config.json, then model.safetensors fails with ENOSPC, as on a full disk.
    full = tmpfs("full", "size=64m,nr_inodes=3")
    result = hx.fine_tune(model_dir, demo.demo_dataset(n=200), output_dir=full / "out",
                          fallback_dir=tmp_path / "rescued", max_steps=2, batch_size=8,
                          progress=False)
    folder = Path(result.output_dir)
    line = (f"hfxla_nb: could not save to {full / 'out'}: No space left on device (os error "
            f"28); the trained model was saved to {folder} instead (result.save(folder) "
            "writes it where you want)")
    assert result.save_error == line and result.notes[0] == line
    assert line in capsys.readouterr().out.splitlines()
    assert folder.parent == tmp_path / "rescued"
    assert folder.name.startswith("hfxla_nb-rescued-out-")
    assert os.listdir(full) == []  # no half-written folder left on the full disk
    assert result.steps == 2 and result.held_model is None
    from transformers import AutoModelForSequenceClassification

    AutoModelForSequenceClassification.from_pretrained(folder)  # loadable as it is
    assert FineTuneResult.load(folder).output_dir == str(folder)
    vocab = len(result.load_tokenizer())
    assert _bytes_in(folder) <= estimate_output(_parameters(model_dir), 4, vocab=vocab).total
    kept = result.save(tmp_path / "kept")
    assert result.output_dir == kept == str(tmp_path / "kept")
    AutoModelForSequenceClassification.from_pretrained(kept)
    saved, rescued = _weights(kept), _weights(str(folder))
    assert saved.keys() == rescued.keys()
    assert all((saved[name] == rescued[name]).all() for name in saved)
    assert FineTuneResult.load(kept).output_dir == kept


@pytest.mark.launch
def test_a_save_that_fails_twice_keeps_the_model_in_the_result(
        model_dir, tmpfs, tmp_path, capsys):
    full = tmpfs("full", "size=64m,nr_inodes=3")  # the fallback there fails as well
    result = hx.fine_tune(model_dir, demo.demo_dataset(n=200), output_dir=full / "out",
                          fallback_dir=full / "rescued", max_steps=2, batch_size=8,
                          progress=False)
    assert result.output_dir is None and result.held_model is not None
    assert result.save_error.startswith(
        f"hfxla_nb: could not save to {full / 'out'}: No space left on device (os error 28), "
        f"nor to {full / 'rescued'}/hfxla_nb-rescued-out-")
    assert result.save_error.endswith(
        ": No space left on device (os error 28); the trained model is held in memory in the "
        "result (result.save(folder) writes it where you want)")
    assert result.save_error in capsys.readouterr().out.splitlines()
    assert "saved to memory" in repr(result)
    assert result.to_dict()["held_model"] is None  # plain data: the tensors left out
    held = {name: tensor.clone() for name, tensor in result.held_model.state_dict.items()}
    in_memory = result.load_model()  # from the held weights, on the CPU
    assert all((in_memory.state_dict()[name] == held[name]).all() for name in held)
    kept = result.save(tmp_path / "kept")
    assert result.output_dir == kept and result.held_model is None
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(kept)
    AutoTokenizer.from_pretrained(kept)
    state = model.state_dict()
    assert all((state[name] == held[name]).all() for name in held if name in state)
    trained_away = _weights(model_dir)  # the starting weights: training changed them
    assert any((state[name] != trained_away[name]).any() for name in trained_away)
    assert FineTuneResult.load(kept).steps == 2


META_IMPORTS = '''
import sys

import torch
from transformers import GPT2Config, LlamaConfig

from hfxla_nb.train.memory import meta_classifier, meta_model

seen = []


class Watch:
    def find_spec(self, name, path=None, target=None):
        if torch.get_default_device().type == "meta":
            seen.append(name)


sys.meta_path.insert(0, Watch())
meta_classifier(GPT2Config(n_layer=1, n_embd=8, n_head=2), 2)
meta_model(LlamaConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=16,
                       num_attention_heads=2, num_key_value_heads=2, vocab_size=32))
print("imported on meta:", seen)
'''


@pytest.mark.launch
def test_no_module_is_first_imported_on_the_meta_device():
    # On torch 2.8 a model class's first import under torch.device("meta") (transformers ->
    # accelerate -> torch_xla -> torch._dynamo) dies in a circular import: the disk check and
    # the memory plan import the class before they build on the meta device.
    import subprocess
    import sys

    from tests.helpers import subprocess_env

    done = subprocess.run([sys.executable, "-c", META_IMPORTS], capture_output=True, text=True,
                          timeout=300, env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported on meta: []" in done.stdout, done.stdout[-3000:]
