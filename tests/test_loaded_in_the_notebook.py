"""A model loaded at the top of the notebook, before any launch, trains in a launched worker.

This is accelerate's `notebook_launcher` pattern (its docs and Hugging Face's example
notebooks): load once in the notebook, train inside the launched function. With the `kernels`
package installed (transformers 5.25 requires it), transformers loads every model with hub
kernels on and kernelizes it again at each `train()`/`eval()` for the model's device; a worker
must leave such a model on XLA with transformers' own layers, and never raise.
"""

from __future__ import annotations

import pytest

from tests.helpers import kernel_fixture, run_ok

pytestmark = [pytest.mark.kernel, pytest.mark.launch]

# The notebook's first cell: imports and the model, before anything is launched.
kernel = kernel_fixture("""
    import copy
    import hfxla_nb
    import hfxla_nb as hx
    from hfxla_nb.demo import demo_dataset, demo_model_dir
    from transformers import AutoModelForSequenceClassification
    model = AutoModelForSequenceClassification.from_pretrained(demo_model_dir())
    loaded_with_kernels = model.use_kernels

    def train_a_step(index):
        import torch
        import torch_xla
        from hfxla_nb import patches
        device = torch_xla.device()
        # Rank threads of one process share the notebook's object: each trains its own copy.
        mine = copy.deepcopy(model).to(device)
        mine.train()
        batch = torch.arange(32, device=device).reshape(2, 16) % 50 + 5
        loss = mine(input_ids=batch, labels=torch.tensor([0, 1], device=device)).loss
        loss.backward()
        torch.optim.SGD(mine.parameters(), lr=0.1).step()
        mine.eval()
        return {"loss": float(loss.cpu()), "training": mine.training,
                "use_kernels": mine.use_kernels, "patches": patches.active()}
    """, fork_quiet=True)


def _trained(answers: dict) -> None:
    for answer in answers:
        assert answer["training"] is False and answer["loss"] > 0, answer
        assert answer["patches"] == ["hub_kernels"]  # the worker keeps transformers' layers


def test_the_model_was_loaded_with_hub_kernels_on(kernel):
    # What makes the tests below fail without the worker's patch: transformers' default
    # where `kernels` is installed (transformers 5.25 requires it; older stacks lack it).
    pytest.importorskip("kernels")
    assert kernel.value("loaded_with_kernels") is True


@pytest.mark.parametrize("processes", [1, 2])
def test_a_model_loaded_in_the_notebook_trains_and_evaluates_in_the_launched_function(
        kernel, processes):
    run_ok(kernel, f"hx.notebook_launcher(train_a_step, num_processes={processes},"
                   " progress=False)", timeout=300)
    answers = kernel.value("[rank.result for rank in hx.last_launch().ranks]")
    assert len(answers) == processes
    _trained(answers)
    assert kernel.value("hfxla_nb._xla.runtime_is_initialized()") is False


def test_a_model_loaded_in_the_notebook_trains_in_a_session_run(kernel):
    run_ok(kernel, """
        s = hx.session(num_processes=1)
        try:
            answers = [s.run(train_a_step) for _ in range(2)]
        finally:
            s.close()
        """, timeout=300)
    _trained(kernel.value("answers"))


def test_fine_tune_given_the_model_instance_loaded_in_the_notebook_trains_it(kernel):
    run_ok(kernel, """
        result = hx.fine_tune(model, demo_dataset(n=64), max_steps=4, batch_size=8,
                              learning_rate=1e-3, progress=False, output_dir=None)
        """, timeout=300)
    losses = kernel.value("[loss for _, loss in result.loss_history]")
    assert losses and all(loss == loss for loss in losses)  # trained: logged, none NaN
    run_ok(kernel, "result.release()")
