"""The training's optimizer, its learning-rate schedule and its gradient clipping, traced for XLA
at a fraction of the host cost.

The optimizer's state is made before step 1, so that step 1 already traces the steady graph.

`AdamW` is torch's AdamW (foreach) with its update traced more cheaply. On an XLA tensor,
every in-place op goes through functionalization, which first checks the shapes with torch's
Python meta kernel, once per tensor for each of `lerp_`, `addcmul_` and `addcdiv_`: on a
small model as long as the step's execution (`bench/` measures it). The same ops out of place
skip the check; the parameters' new values are then copied in, and the
moments' new tensors replace the old ones in the state. The graph computes the same ops in the
same order, so the results are `torch.optim.AdamW(foreach=True)`'s, bit for bit, and the
state, `state_dict()` and schedulers are torch's. Only the common case takes this path (float
hyperparameters, no amsgrad, maximize, capturable, differentiable or fused, no complex
parameters, no gradient scaler); anything else is torch's own `step`.

`GradientClipper` is torch_xla's `clip_grad_norm_` (L2) done the same way: the products are
computed out of place and become the gradients (the same gradients, bit for bit), and the two
constants are scalars of the graph (`torch.full`), kept on the device across steps, instead of
an upload per step each.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ... import _xla
from ..plan import TrainPlan

if TYPE_CHECKING:
    import torch

    from .context import WorkerContext


# -- the optimizer and schedule, their state made before step 1 --

def make_optimizer(model: torch.nn.Module, plan: TrainPlan
                   ) -> tuple[AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `model`'s trainable parameters (no weight decay on biases and norms) and
    the plan's schedule by `transformers.get_scheduler` (`lr_scheduler_type`, default
    "linear": warm up, then decay to 0 at the last step).

    The rate reaches the step as a host number (`group["lr"]`), one scalar input of the one
    training graph: a new rate each step is a new input value, never a new graph
    (`_graph_scalar` keeps a rate of exactly 0 an input too)."""
    from transformers import get_scheduler

    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        skip = parameter.ndim < 2 or "LayerNorm" in name or "layer_norm" in name
        (no_decay if skip else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": plan.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    # foreach: the multi-tensor update traces far fewer ops per step than the per-parameter
    # loop torch picks for XLA by default (same arithmetic, same results); `AdamW`
    # traces it out of place, skipping torch's Python shape checks (~4x less host time).
    optimizer = AdamW(groups, lr=plan.learning_rate, foreach=True)
    settings = plan.trainer
    scheduler = get_scheduler(settings.lr_scheduler_type, optimizer,
                              num_warmup_steps=plan.warmup_steps,
                              num_training_steps=plan.total_steps,
                              scheduler_specific_kwargs=dict(settings.lr_scheduler_kwargs))
    return optimizer, scheduler


def _graph_scalar(value: float) -> float:
    """`value`, or for 0 and 1 the next double towards them from below/above, which float32
    rounds back to 0 and 1: the same arithmetic. torch_xla bakes the Python scalars 0 and +-1
    into the graph as constants and uploads any other one as an input, so a rate of exactly 0
    (the first warm-up step of transformers' schedules) would otherwise compile a graph of
    its own."""
    if value == 0.0:
        return -5e-324  # the smallest negative double; float32: -0.0
    if abs(value) == 1.0:
        return math.nextafter(value, 0.0)
    return value


def make_first_step_steady(ctx: WorkerContext, optimizer: AdamW,
                           loss_total: torch.Tensor) -> None:
    """Make on the device, before step 1, everything that step 1 would otherwise create,
    so that step 1 traces the steady graph and training compiles one graph per bucket.

    AdamW's state (`step` on the host, `exp_avg` and `exp_avg_sq` zeros like each
    parameter, with its sharding) is what torch creates lazily in the first
    `optimizer.step()`; a resumed run brings its own, loaded from the checkpoint. Under
    SPMD every tensor the step reads gets an explicit sharding, as a graph's outputs have.
    The zeros are made by one small graph here, outside the training's compile count."""
    import torch

    states = []
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state[parameter]
            if not state:
                state.update(step=torch.tensor(0.0, dtype=torch.float32),
                             exp_avg=torch.zeros_like(parameter),
                             exp_avg_sq=torch.zeros_like(parameter))
            for name in ("exp_avg", "exp_avg_sq"):
                if ctx.spmd and _xla.sharding_spec(state[name]) == "":
                    _xla.share_sharding(state[name], parameter)
                states.append(state[name])
    if ctx.spmd:
        _xla.replicate_unsharded([*ctx.model.parameters(), *states, loss_total], ctx.mesh)
    _xla.sync()


# -- AdamW: torch's update, out of place --

class AdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` whose foreach update is traced out of place (same results).

    Attributes:
        last_numbers: the last `step`'s numbers as uploaded (`_count`), or None.
        new_values: None: `step` copies the new values into the parameters. A dict: `step`
            leaves the parameters as they are and puts each one's new value there (by the
            parameter's `id`), for a step whose graph is captured (`captured.py`):
            a value copied into a parameter by the trace stays held with it after the
            compiled graph's output replaced it, and the next sync would run it.
    """

    last_numbers: torch.Tensor | None = None
    new_values: dict[int, torch.Tensor] | None = None

    def __init__(self, params: Any, **settings: Any) -> None:
        # `count_step`'s parts, by the parameters a compiled step updates.
        self._counters: dict[tuple[int, ...] | None, list[tuple]] = {}
        super().__init__(params, **settings)

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
            parts = []
            for group in self.param_groups:
                params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps = [], [], [], [], [], []
                has_complex = self._init_group(group, params, grads, exp_avgs, exp_avg_sqs,
                                               max_sqs, steps)
                if has_complex:
                    raise NotImplementedError("complex parameters: use torch.optim.AdamW")
                if params:
                    parts += _parts(group, params, grads, exp_avgs, exp_avg_sqs, steps)
            self._counters.clear()  # this step may count some parameters and not others
            numbers, self.last_numbers = _count([(group, steps, False, params[0].device)
                                                 for group, (params, *_, steps), _, _ in parts])
            if self.last_numbers is not None:  # each number a 0-d slice of the one upload
                numbers = [tuple(self.last_numbers[3 * k + j] for j in range(3))
                           for k in range(len(numbers))]
            for part, each in zip(parts, numbers, strict=True):
                _update(self.state, part, each, self.new_values)
        return loss

    def count_step(self, updated: list | None = None) -> torch.Tensor | None:
        """Count a step on the host for every trained parameter (`updated`: for these, the
        ones the step updates; one without a gradient is skipped, as `step` skips it), as
        `step` does before its update, and return the step's numbers as `step` gives them to
        the device (one tensor); None where they are not one tensor. For a step whose update
        runs by its compiled graph.

        The parts (`_parts`) and their step counters are found once per set of parameters:
        a part whose counters all hold one value keeps one value, as each step adds 1 to
        every one of them. A traced `step` or a loaded state may count some parameters and
        not others, so both forget what was found."""
        key = None if updated is None else tuple(id(p) for p in updated)
        counters = self._counters.get(key)
        if counters is None:
            ids = None if key is None else set(key)
            parts = []
            for group in self.param_groups:
                params = [p for p in group["params"]
                          if p.requires_grad and (ids is None or id(p) in ids)]
                if params:
                    states = [self.state[p] for p in params]
                    parts += _parts(group, params, [None] * len(params),
                                    [state["exp_avg"] for state in states],
                                    [state["exp_avg_sq"] for state in states],
                                    [state["step"] for state in states])
            counters = self._counters[key] = [
                (group, steps, len({float(step) for step in steps}) == 1, params[0].device)
                for group, (params, *_, steps), _, _ in parts]
        return _count(counters)[1]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's `load_state_dict`; the step counters found by `count_step` are forgotten."""
        self._counters.clear()
        super().load_state_dict(state_dict)


def _same_or_each(values: list[float]) -> float | list[float]:
    """One scalar when every tensor's is the same (the usual case: every parameter had a
    gradient at every step), else one per tensor. On XLA each distinct scalar of a step is a
    graph input uploaded on its own; the same value divides or multiplies the same way."""
    first = values[0]
    return first if all(value == first for value in values) else values


def _parts(group: dict[str, Any], params: list, grads: list, exp_avgs: list,
           exp_avg_sqs: list, steps: list) -> list[tuple]:
    """A group's tensors split by device and dtype, as torch's foreach update splits them:
    `(group, (params, grads, exp_avgs, exp_avg_sqs, steps), indices into params)` each."""
    grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype(
        [params, grads, exp_avgs, exp_avg_sqs, steps], with_indices=True)
    return [(group, tensors, params, indices) for tensors, indices in grouped.values()]


def _count(counters: list[tuple]) -> tuple[list[tuple], torch.Tensor | None]:
    """Count the step of each part's parameters (on the host) and return each part's three
    numbers (the decay factor, the step size and the second moment's bias correction) and
    the tensor they were uploaded in (None: host numbers).

    Args:
        counters: per part, `(group, its step counters, whether they all hold one value,
            its parameters' device)`; where they hold one value, one of them is read.

    They change every step (the rate, the step count), so they reach the device as data:
    where every part's are one value each, one uploaded float32 tensor holds them all (one
    transfer per step; a graph run again by its key takes the next step's tensor).
    Otherwise they stay host numbers, lists per tensor, and nothing is uploaded."""
    numbers = []
    for group, steps, same, _ in counters:
        if steps[0].is_cpu:  # as torch's AdamW counts host steps
            torch._foreach_add_(steps, torch.tensor(1.0, device="cpu"), alpha=1.0)
        else:
            torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        lr, weight_decay = group["lr"], group["weight_decay"]
        step_values = [float(steps[0])] if same else [float(step) for step in steps]
        step_size = _same_or_each([(lr / (1 - beta1 ** step)) * -1 for step in step_values])
        bias_sqrt = _same_or_each([(1 - beta2 ** step) ** 0.5 for step in step_values])
        numbers.append((1 - lr * weight_decay, step_size, bias_sqrt))
    if not numbers or not all(isinstance(n, float) for each in numbers for n in each):
        return numbers, None
    uploaded = torch.tensor([n for each in numbers for n in each], dtype=torch.float32)
    return numbers, uploaded.to(counters[0][3])


def _update(state: dict, part: tuple, numbers: tuple,
            new_values: dict[int, torch.Tensor] | None = None) -> None:
    """torch's `_multi_tensor_adam` (capturable=False, decoupled weight decay) on one part,
    op for op, with the in-place foreach ops written out of place: the parameters' new
    values are copied in, the moments' new tensors replace the old ones in `state` (a copy
    would only add ops to trace). `numbers`: `_count`'s, tensors or host numbers;
    `new_values`: `AdamW.new_values`."""
    group, (device_params, device_grads, device_avgs, device_sqs, _), params, indices = part
    beta1, beta2 = group["betas"]
    eps, weight_decay = group["eps"], group["weight_decay"]
    decay, step_size, bias_sqrt = numbers
    uploaded = isinstance(decay, torch.Tensor)
    new_params = device_params
    if weight_decay != 0:
        new_params = torch._foreach_mul(device_params,
                                        decay if uploaded else _graph_scalar(decay))
    new_avgs = torch._foreach_lerp(device_avgs, device_grads, 1 - beta1)
    new_sqs = torch._foreach_mul(device_sqs, beta2)
    new_sqs = torch._foreach_addcmul(new_sqs, device_grads, device_grads, 1 - beta2)
    denominator = torch._foreach_sqrt(new_sqs)
    denominator = torch._foreach_div(denominator, bias_sqrt)
    denominator = torch._foreach_add(denominator, eps)
    if uploaded:
        # addcdiv's own lowering on XLA: input + (tensor1 / tensor2) * value.
        quotient = torch._foreach_div(new_avgs, denominator)
        new_params = torch._foreach_add(new_params, torch._foreach_mul(quotient, step_size))
    else:
        step_size = ([_graph_scalar(size) for size in step_size]
                     if isinstance(step_size, list) else _graph_scalar(step_size))
        new_params = torch._foreach_addcdiv(new_params, new_avgs, denominator, step_size)
    if new_values is None:
        torch._foreach_copy_(device_params, new_params)
    else:
        new_values.update({id(p): value for p, value in zip(device_params, new_params,
                                                            strict=True)})
    for index, avg, square in zip(indices, new_avgs, new_sqs, strict=True):
        moments = state[params[index]]
        moments["exp_avg"], moments["exp_avg_sq"] = avg, square


# -- gradient clipping, out of place --

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
