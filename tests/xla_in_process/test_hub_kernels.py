"""transformers 5.25 with `kernels` installed kernelizes a model at load and at each
`train()`/`eval()`; `kernels` knows no "xla" device. `hx.patches`' `hub_kernels` leaves a
model on an XLA device with transformers' own layers."""

from __future__ import annotations

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


KEPT_FROM_IMPORT = """
    import json, sys
    from hfxla_nb import patches
    patches.keep_hub_kernels_off_xla()  # as a launched worker does, before transformers loads
    before = "transformers.modeling_utils" in sys.modules
    from transformers import modeling_utils
    patched = getattr(modeling_utils.kernelize, "__hfxla_nb_patch__", False)
    with patches.applied():  # fine_tune's block ends: the kept patch stays
        pass
    print(json.dumps({"before": before, "patched": patched, "after_block": patches.active()}))
"""


def test_a_worker_keeps_the_patch_from_transformers_import_on():
    from tests.helpers import run_python

    assert run_python(KEPT_FROM_IMPORT) == {"before": False, "patched": True,
                                            "after_block": ["hub_kernels"]}


FIRST_IMPORT_IN_A_BLOCK = """
    import json
    from hfxla_nb import patches
    patches.keep_hub_kernels_off_xla()
    with patches.applied() as names:  # imports transformers, which applies the kept patch
        print(json.dumps({"names": names}))
"""


def test_a_block_that_first_imports_transformers_in_a_worker_does_not_deadlock():
    """The first `applied()` of a worker imports transformers while it holds the patches'
    lock, and that import applies the kept `hub_kernels` patch on the same thread (a
    tutorial's launch hung there)."""
    from tests.helpers import run_python

    names = run_python(FIRST_IMPORT_IN_A_BLOCK, timeout=60)["names"]
    assert "hub_kernels" in names and "bidirectional_mask" in names
