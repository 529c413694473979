"""`CapturedStep.capture` compiles a traced training step to run again on new data, and
refuses a step that changed a weight in place (a batch norm's running statistics would stop
moving: the compiled graph gives back only the parameters, moments and running loss)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hfxla_nb import _xla
from hfxla_nb.train.worker.captured import Before, CapturedStep, TrainedState
from hfxla_nb.train.worker.optimizer import AdamW


def _traced_step(model: torch.nn.Module):
    """One step traced as the training loop traces it (AdamW's new values held back), and
    what `CapturedStep.capture` takes."""
    device = _xla.device()
    model = model.to(device)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = AdamW(trained, lr=1e-2, foreach=True)
    for p in trained:
        optimizer.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                                  exp_avg_sq=torch.zeros_like(p))
    loss_total = torch.zeros((), device=device)
    batch = SimpleNamespace(tensors=[torch.randn(8, 4).to(device)])
    _xla.sync()
    before = Before.take(trained, optimizer, loss_total, batch)
    optimizer.new_values = {}
    loss = model(batch.tensors[0]).square().mean()
    loss.backward()
    optimizer.step()
    for p in trained:
        p.grad = None
    frozen = list(model.buffers())
    captured = CapturedStep.capture(before, TrainedState(trained, optimizer),
                                    loss_total + loss.detach(), frozen)
    optimizer.new_values = None
    _xla.sync()
    return captured


def test_a_step_that_changes_only_parameters_and_moments_is_compiled():
    torch.manual_seed(0)
    captured = _traced_step(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(),
                                                torch.nn.Linear(4, 1)))
    assert not isinstance(captured, _xla.Declined)


def test_a_step_that_moves_a_batch_norms_statistics_is_traced():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 1))
    assert _traced_step(model) == _xla.Declined(
        "the step changes a weight in place (batch norm's running statistics, or torch_xla's "
        "gradient checkpointing)")
