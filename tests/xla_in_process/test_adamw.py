"""`hfxla_nb.train.worker.optimizer.AdamW`: torch's foreach AdamW traced out of place gives torch's
results bit for bit on XLA, keeps torch's state, and leaves uncommon settings to torch."""

from __future__ import annotations

import cProfile
import pstats

import pytest
import torch

from hfxla_nb import _xla
from hfxla_nb.train.worker.optimizer import AdamW


def _train(cls, steps: int = 3, **options):
    """A few updates of two parameter groups (decayed and not) on the XLA device; the
    parameters, the optimizer's state and the optimizer."""
    device = _xla.device()
    torch.manual_seed(0)
    params = [torch.randn(8, 8).to(device).requires_grad_() for _ in range(3)]
    params += [torch.randn(8).to(device).requires_grad_() for _ in range(2)]
    optimizer = cls([{"params": params[:3], "weight_decay": 0.01},
                     {"params": params[3:], "weight_decay": 0.0}], lr=1e-2, foreach=True,
                    **options)
    for step in range(steps):
        for k, p in enumerate(params):
            p.grad = p.detach() * (0.1 * (step + 1)) + 0.01 * k
        optimizer.step()
        _xla.sync()
    state = [(optimizer.state[p]["exp_avg"].cpu(), optimizer.state[p]["exp_avg_sq"].cpu(),
              float(optimizer.state[p]["step"])) for p in params]
    return [p.detach().cpu() for p in params], state, optimizer


def test_same_results_as_torch_bit_for_bit_and_the_same_state():
    theirs, their_state, torch_optimizer = _train(torch.optim.AdamW)
    ours, our_state, optimizer = _train(AdamW)
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours, strict=True))
    for (avg_a, sq_a, step_a), (avg_b, sq_b, step_b) in zip(their_state, our_state, strict=True):
        assert torch.equal(avg_a, avg_b) and torch.equal(sq_a, sq_b) and step_a == step_b == 3.0
    # torch's state_dict: a checkpoint of one loads into the other.
    assert isinstance(optimizer, torch.optim.AdamW)
    torch_optimizer.load_state_dict(optimizer.state_dict())


def test_no_python_shape_check_per_tensor_in_the_update():
    """The in-place lerp_/addcmul_/addcdiv_ of torch's update run torch's Python meta kernels
    (functionalization's shape check) once per tensor; the out-of-place update runs none."""

    def meta_calls(cls) -> int:
        profile = cProfile.Profile()
        profile.enable()
        _train(cls, steps=2)
        profile.disable()
        stats = pstats.Stats(profile).stats
        return sum(calls for (path, _, name), (_, calls, *_rest) in stats.items()
                   if path.endswith("_meta_registrations.py") and name in ("lerp", "addcmul",
                                                                           "addcdiv"))

    assert meta_calls(torch.optim.AdamW) >= 2 * 3 * 5  # 2 steps, 3 ops, 5 tensors
    assert meta_calls(AdamW) == 0


@pytest.mark.parametrize("options", [{"amsgrad": True}, {"maximize": True}])
def test_uncommon_settings_are_torch_own_step(options):
    theirs, _, _ = _train(torch.optim.AdamW, steps=2, **options)
    ours, _, _ = _train(AdamW, steps=2, **options)
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours, strict=True))
