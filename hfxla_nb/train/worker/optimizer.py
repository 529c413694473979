"""The training's optimizer and learning-rate schedule, and their state made before step 1."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _xla
from ..plan import TrainPlan

if TYPE_CHECKING:
    import torch

    from .adamw import AdamW
    from .context import WorkerContext


def make_optimizer(model: torch.nn.Module, plan: TrainPlan
                   ) -> tuple[AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `model`'s trainable parameters (no weight decay on biases and norms) and
    transformers' "linear" schedule (warm up, then decay to 0 at the last step)."""
    import torch

    from .adamw import AdamW  # imports torch: only in the worker

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
    # loop torch picks for XLA by default (same arithmetic, same results); adamw.AdamW
    # traces it out of place, skipping torch's Python shape checks (~4x less host time).
    optimizer = AdamW(groups, lr=plan.learning_rate, foreach=True)
    total, warmup = plan.total_steps, plan.warmup_steps

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


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
