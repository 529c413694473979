"""`GradientClipper`: torch_xla's `clip_grad_norm_` (L2), traced with less host work per step.

torch_xla replaces `torch.nn.utils.clip_grad_norm_` with its own: the norm of the gradients'
norms, then every gradient multiplied in place by `min(1, max_norm / (norm + 1e-6))`. On XLA
each in-place `mul_` first runs torch's Python shape check (functionalization). Here the
products are computed out of place and become the gradients: the same ops on the same values,
so the same gradients bit for bit. torch_xla makes its two constants (`max_norm`, 1.0) with
`torch.tensor(..., device=...)`, an upload per step each; here `torch.full` makes them
scalars of the graph, which torch_xla keeps on the device across steps (a `where` with a
Python scalar would run torch's Python meta kernel of `fill_`).
"""

from __future__ import annotations

import torch


class GradientClipper:
    """Clips the gradients of `parameters` to a total L2 norm of `max_norm`.

    Args:
        parameters: the trained parameters (those without a gradient at a step are skipped).
        max_norm: the largest total norm kept.
    """

    def __init__(self, parameters: list, max_norm: float) -> None:
        self.parameters = list(parameters)
        self.max_norm = float(max_norm)

    def __call__(self) -> torch.Tensor:
        """Clip now; returns the total norm before clipping (a device tensor)."""
        with_grad = [p for p in self.parameters if p.grad is not None]
        if not with_grad:
            return torch.tensor(0.0)
        grads = [p.grad for p in with_grad]
        dtype, device = grads[0].dtype, grads[0].device
        with torch.no_grad():
            # The foreach forms trace the same per-gradient ops from one Python call each
            # (a Python loop over the gradients was most of the clipping's host time).
            total = torch.norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
            limit = torch.full((), self.max_norm, dtype=dtype, device=device)
            coefficient = limit / (total + 1e-6)
            one = torch.full((), 1.0, dtype=dtype, device=device)
            value = torch.where(coefficient < 1, coefficient, one)
            for parameter, clipped in zip(with_grad, torch._foreach_mul(grads, value),
                                          strict=True):
                parameter.grad = clipped
        return total
