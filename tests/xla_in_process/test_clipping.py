"""`hfxla_nb.train.worker.optimizer.GradientClipper`: torch_xla's `clip_grad_norm_` bit for bit on
XLA, without torch's Python shape check per gradient."""

from __future__ import annotations

import cProfile
import pstats

import pytest
import torch

from hfxla_nb import _xla
from hfxla_nb.train.worker.optimizer import GradientClipper


def _clip(clip, max_norm: float, steps: int = 3):
    """Gradients and norms of a few clipped steps; the calls of torch's Python meta kernels
    (functionalization's in-place shape check) while clipping."""
    device = _xla.device()
    torch.manual_seed(0)
    params = [torch.randn(6, 6).to(device).requires_grad_() for _ in range(3)]
    params.append(torch.randn(6).to(device).requires_grad_())
    clipper = GradientClipper(params, max_norm)
    grads, norms = [], []
    profile = cProfile.Profile()
    for step in range(steps):
        for k, p in enumerate(params):
            p.grad = (torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) * 0.01
                      * (step + 1) * (k + 1)).to(device)
        _xla.sync()
        profile.enable()
        norm = clipper() if clip == "ours" else torch.nn.utils.clip_grad_norm_(params, max_norm)
        profile.disable()
        _xla.sync()
        grads.append([p.grad.cpu() for p in params])
        norms.append(norm.cpu())
    checks = sum(stats[1] for (path, _, _), stats in pstats.Stats(profile).stats.items()
                 if path.endswith("_meta_registrations.py"))
    return grads, norms, checks


@pytest.mark.parametrize("max_norm", [1.0, 1000.0])  # clipping, and a norm already below
def test_same_gradients_as_torch_xla_without_python_shape_checks(max_norm):
    theirs, their_norms, their_checks = _clip("torch_xla", max_norm)
    ours, our_norms, our_checks = _clip("ours", max_norm)
    for a, b in zip(theirs, ours, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(their_norms, our_norms, strict=True))
    assert their_checks >= 3 * 4  # 3 steps, 4 gradients multiplied in place
    assert our_checks == 0
