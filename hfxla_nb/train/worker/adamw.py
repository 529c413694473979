"""`AdamW`: torch's AdamW (foreach), its update traced for XLA at a fraction of the host cost.

On an XLA tensor, every in-place op goes through functionalization, which first runs the op on
meta tensors to check the shapes; for `lerp_`, `addcmul_` and `addcdiv_` that check is torch's
Python meta kernel, about 0.1 ms per tensor. torch's foreach AdamW calls those three in place
on every parameter each step: about 23 ms of Python per step for the demo's tiny BERT (41
tensors), as long as the step's execution. The same ops out of place skip the check; the
parameters' new values are then copied in (`_foreach_copy_`, which checks in C++) and the
moments' new tensors replace the old ones in the state (no copy to trace). The graph computes
the same ops in the same order, so the results are those of `torch.optim.AdamW(foreach=True)`,
bit for bit, and the state, `state_dict()` and schedulers are torch's.

Only the common case takes this path (float hyperparameters, no amsgrad, maximize, capturable,
differentiable or fused, no complex parameters, no gradient scaler); anything else is torch's
own `step`.
"""

from __future__ import annotations

from typing import Any

import torch


class AdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` whose foreach update is traced out of place (same results)."""

    def _plain(self, group: dict[str, Any]) -> bool:
        return (group.get("foreach") is True and not group["amsgrad"] and not group["maximize"]
                and not group["capturable"] and not group["differentiable"]
                and not group.get("fused") and group.get("decoupled_weight_decay", True)
                and all(isinstance(group[k], float) for k in ("lr", "eps", "weight_decay"))
                and all(isinstance(beta, float) for beta in group["betas"])
                and getattr(self, "grad_scale", None) is None
                and getattr(self, "found_inf", None) is None
                and hasattr(self, "_init_group"))

    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        """One update of every parameter group; torch's own step for uncommon settings."""
        if not all(self._plain(group) for group in self.param_groups):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps = [], [], [], [], [], []
                has_complex = self._init_group(group, params, grads, exp_avgs, exp_avg_sqs,
                                               max_sqs, steps)
                if has_complex:
                    raise NotImplementedError("complex parameters: use torch.optim.AdamW")
                if params:
                    _update(self.state, params, grads, exp_avgs, exp_avg_sqs, steps, group)
        return loss


def _same_or_each(values: list[float]) -> float | list[float]:
    """One scalar when every tensor's is the same (the usual case: every parameter had a
    gradient at every step), else one per tensor. On XLA each distinct scalar of a step is a
    graph input uploaded on its own; the same value divides or multiplies the same way."""
    first = values[0]
    return first if all(value == first for value in values) else values


def _update(state: dict, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list,
            steps: list, group: dict[str, Any]) -> None:
    """torch's `_multi_tensor_adam` (capturable=False, decoupled weight decay), op for op,
    with the in-place foreach ops written out of place: the parameters' new values are
    copied in, the moments' new tensors replace the old ones in `state` (a copy would only
    add ops to trace)."""
    beta1, beta2 = group["betas"]
    lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
    grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype(
        [params, grads, exp_avgs, exp_avg_sqs, steps], with_indices=True)
    for (device_params, device_grads, device_avgs, device_sqs, device_steps), indices in (
            grouped.values()):
        if device_steps[0].is_cpu:
            torch._foreach_add_(device_steps, torch.tensor(1.0, device="cpu"), alpha=1.0)
        else:
            torch._foreach_add_(device_steps, 1)
        new_params = device_params
        if weight_decay != 0:
            new_params = torch._foreach_mul(device_params, 1 - lr * weight_decay)
        new_avgs = torch._foreach_lerp(device_avgs, device_grads, 1 - beta1)
        new_sqs = torch._foreach_mul(device_sqs, beta2)
        new_sqs = torch._foreach_addcmul(new_sqs, device_grads, device_grads, 1 - beta2)
        step_values = [float(step) for step in device_steps]
        bias_correction1 = [1 - beta1 ** step for step in step_values]
        bias_correction2 = [1 - beta2 ** step for step in step_values]
        step_size = [(lr / bc) * -1 for bc in bias_correction1]
        bias_correction2_sqrt = [bc ** 0.5 for bc in bias_correction2]
        denominator = torch._foreach_sqrt(new_sqs)
        denominator = torch._foreach_div(denominator, _same_or_each(bias_correction2_sqrt))
        denominator = torch._foreach_add(denominator, eps)
        new_params = torch._foreach_addcdiv(new_params, new_avgs, denominator,
                                            _same_or_each(step_size))
        torch._foreach_copy_(device_params, new_params)
        for index, avg, square in zip(indices, new_avgs, new_sqs, strict=True):
            moments = state[params[index]]
            moments["exp_avg"], moments["exp_avg_sq"] = avg, square
