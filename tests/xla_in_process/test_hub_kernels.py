"""transformers 5.25 with `kernels` installed kernelizes a model at load and at each
`train()`/`eval()`; `kernels` knows no "xla" device. `hx.patches`' `hub_kernels` leaves a
model on an XLA device with transformers' own layers."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from hfxla_nb import _xla, patches
from hfxla_nb.demo import demo_model_dir


@pytest.fixture
def kernelized(tmp_path, monkeypatch):
    """The demo BERT loaded as a user loads it in the notebook: hub kernels on (the default)."""
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    folder = demo_model_dir(tmp_path / "bert")
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert model.use_kernels  # transformers' default with `kernels` installed
    return folder, model


def test_a_kernelized_model_fails_on_xla_without_the_patch(kernelized):
    _, model = kernelized
    model.to(_xla.device())
    with pytest.raises(ValueError, match="Unsupported device type 'xla'"):
        model.train()


def test_the_patch_trains_and_evaluates_a_kernelized_model_on_xla(kernelized):
    folder, model = kernelized
    device = _xla.device()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(["a fine day", "a dull one"], padding="max_length", max_length=16,
                      return_tensors="pt").to(device)
    with patches.applied() as names:
        assert "hub_kernels" in names
        model.to(device).train()
        loss = model(**batch, labels=torch.tensor([1, 0], device=device)).loss
        loss.backward()
        model.eval()
        _xla.sync()
        assert torch.isfinite(loss.cpu())
    assert "hub_kernels" not in patches.active()


def test_the_launched_worker_loads_models_without_hub_kernels():
    from hfxla_nb.launch import worker

    saved = os.environ.pop("USE_HUB_KERNELS", None)
    try:
        worker._keep_hub_kernels_off_xla()
        assert os.environ["USE_HUB_KERNELS"] == "NO"
        os.environ["USE_HUB_KERNELS"] = "YES"  # a user's own choice is kept
        worker._keep_hub_kernels_off_xla()
        assert os.environ["USE_HUB_KERNELS"] == "YES"
    finally:
        os.environ.pop("USE_HUB_KERNELS", None)
        if saved is not None:
            os.environ["USE_HUB_KERNELS"] = saved
