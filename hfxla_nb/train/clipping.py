"""`GradientClipper`: torch_xla's `clip_grad_norm_` (L2), traced with less host work per step.

torch_xla replaces `torch.nn.utils.clip_grad_norm_` with its own: the norm of the gradients'
norms, then every gradient multiplied in place by `min(1, max_norm / (norm + 1e-6))`. On XLA
each in-place `mul_` first runs torch's Python shape check (functionalization). Here the
products are computed out of place and copied in (`_foreach_copy_`): the same ops on the same
values, so the same gradients bit for bit. The two constants (`max_norm`, 1.0) are made anew
each step, as torch_xla does: kept from step 1, they would be that graph's outputs at step 2,
another graph to compile.
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
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        dtype, device = grads[0].dtype, grads[0].device
        limit = torch.tensor(self.max_norm, dtype=dtype, device=device)
        one = torch.tensor(1.0, dtype=dtype, device=device)
        with torch.no_grad():
            # The foreach forms trace the same per-gradient ops from one Python call each
            # (a Python loop over the gradients was most of the clipping's host time).
            total = torch.norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
            coefficient = limit / (total + 1e-6)
            value = torch.where(coefficient < 1, coefficient, one)
            torch._foreach_copy_(grads, torch._foreach_mul(grads, value))
        return total
