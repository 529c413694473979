"""Mixture-of-experts layers that XLA compiles with static shapes.

transformers runs a MoE model's experts (Mixtral, Qwen3-MoE, OLMoE, GPT-OSS, ...) through one
of its experts implementations. None fits XLA: "grouped_mm" (the default) counts tokens per
expert with `torch.histc` on integers, which has no XLA lowering and whose CPU fallback raises
("histogram_cpu" not implemented for 'Int'); "eager" loops over the experts that received
tokens, picked by `nonzero` (shapes that change with the routing: a graph per step, a device
read in each); "batched_mm" copies each selected expert's weights once per token (a real
model's experts, times its tokens, in memory).

`dense_experts_forward` runs every expert on every token and weighs each result by the token's
routing weight, zero for the experts it was not routed to: the same sum as the other
implementations, with shapes that never change (one graph for training), at `num_experts /
num_experts_per_tok` times the FLOPs of the routed experts. Large MoE models on a TPU want
expert parallelism instead (not done here). `use_dense_experts` switches a model to it by
transformers' own `set_experts_implementation`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The name the implementation is registered under in transformers' `ExpertsInterface`.
DENSE = "xla_dense"


def dense_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor,
                          top_k_index: torch.Tensor, top_k_weights: torch.Tensor
                          ) -> torch.Tensor:
    """Every expert on every token, weighted by the routing (transformers' experts signature).

    Args:
        self: the experts module (`@use_experts_implementation`'s attributes: `has_gate`,
            `has_bias`, `is_transposed`, `has_post_expert_norm`, the projections).
        hidden_states: `[tokens, hidden]`.
        top_k_index, top_k_weights: `[tokens, k]`: each token's experts and their weights.

    Returns:
        `[tokens, hidden]`: the weighted sum of the experts' outputs.
    """
    import torch

    tokens = hidden_states.size(0)
    routing = torch.zeros(tokens, self.num_experts, dtype=top_k_weights.dtype,
                          device=hidden_states.device)
    routing = routing.scatter_add(1, top_k_index, top_k_weights)  # [tokens, experts]
    up_name = "gate_up_proj" if self.has_gate else "up_proj"
    up = _each_expert(hidden_states, getattr(self, up_name), self.is_transposed)
    if self.has_bias:
        up = up + getattr(self, f"{up_name}_bias")
    up = self._apply_gate(up) if self.has_gate else self.act_fn(up)  # [tokens, experts, inner]
    down = _each_expert(up, self.down_proj, self.is_transposed, per_expert_input=True)
    if self.has_bias:
        down = down + self.down_proj_bias
    if self.has_post_expert_norm:
        down = self.post_expert_norm(down)
    weighted = down * routing.unsqueeze(-1).to(down.dtype)
    return weighted.sum(dim=1).to(hidden_states.dtype)


def _each_expert(inputs: torch.Tensor, weight: torch.Tensor, transposed: bool,
                 per_expert_input: bool = False) -> torch.Tensor:
    """`inputs` through every expert's linear layer: `[tokens, experts, out]`. `weight` is
    `[experts, out, in]` (`[experts, in, out]` when `transposed`); `inputs` is `[tokens, in]`,
    or `[tokens, experts, in]` with `per_expert_input`."""
    import torch

    source = "tei" if per_expert_input else "ti"
    pattern = f"{source},eio->teo" if transposed else f"{source},eoi->teo"
    return torch.einsum(pattern, inputs, weight)


def use_dense_experts(model: torch.nn.Module) -> str | None:
    """Switch a MoE model's experts to `dense_experts_forward`; returns a note saying so, or
    None for a model without transformers' switchable experts."""
    config = getattr(model, "config", None)
    current = getattr(config, "_experts_implementation", None)
    switch = getattr(model, "set_experts_implementation", None)
    can_set = getattr(type(model), "_can_set_experts_implementation", None)
    if current is None or switch is None or can_set is None or not can_set():
        return None
    if current == DENSE:
        return None
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(DENSE, dense_experts_forward)
    switch(DENSE)
    return (f"mixture of experts: every expert runs on every token, weighted by its routing "
            f"(static shapes, one graph), instead of transformers' {current!r} experts")
