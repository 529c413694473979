"""The training step run by its compiled graph: traced once per batch shape, then run by its
key for every later step.

Tracing a step (the forward, the backward, clipping, AdamW) costs the host milliseconds per
layer and per parameter, and cutting the graph (`torch_xla.sync()`) walks and hashes all of it
again: on a TPU, whose step takes a few milliseconds, the chip waits for Python. The traced
graph is the same at every step of a bucket: only its data changes (the batch, AdamW's step
numbers, the random seed, and the parameters, moments and running loss the previous step
left). So the first step of a batch shape is traced as always, its graph's key and inputs are
read and it is compiled under that key (torch_xla's cached-graph API, as its Dynamo bridge
uses it); that step and every later one of the shape then run the compiled program on the
current data, and its outputs become the parameters' data (`_xla.replace_data`: no op
traced), AdamW's moments and the running loss. The device computes what the traced step would
have, with the seed each sync moves on, so the losses are the traced loop's.

Where a step cannot be run so (torch's own AdamW step, gradients all-reduced across processes
by `optimizer_step`, a parameter left without a gradient, a weight changed in place by the
step: batch norm's statistics, torch_xla's gradient checkpointing; an output whose sharding
differs from its input's), that shape's steps are traced as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import _xla

if TYPE_CHECKING:
    import torch

    from .context import Batch
    from .optimizer import AdamW


@dataclass
class Before:
    """What a step about to be traced reads, taken before the trace: an update in place
    gives a tensor a new id, and the graph names its inputs by the ids they had.

    Attributes:
        roles: torch_xla's tensor id -> the input's role: ("param", i), ("avg", i),
            ("square", i), ("loss",), ("batch", j).
        shardings: the sharding of each output to come, in the outputs' order.
    """

    roles: dict[int, tuple]
    shardings: list[str]

    @classmethod
    def take(cls, trained: list, optimizer: AdamW, loss_total: torch.Tensor,
             batch: Batch) -> Before:
        """The roles of the parameters, their moments, the running loss and the batch."""
        roles: dict[int, tuple] = {}
        moments = [optimizer.state[p] for p in trained]
        avgs, squares = [m["exp_avg"] for m in moments], [m["exp_avg_sq"] for m in moments]
        for name, tensors in (("param", trained), ("avg", avgs), ("square", squares),
                              ("batch", batch.tensors)):
            roles.update({_xla.tensor_id(t): (name, i) for i, t in enumerate(tensors)})
        roles[_xla.tensor_id(loss_total)] = ("loss",)
        shardings = [_xla.sharding_spec(t) for t in (*trained, *avgs, *squares, loss_total)]
        return cls(roles, shardings)


class CapturedStep:
    """One batch shape's training step, compiled, run on each step's data.

    Args:
        key: the graph's key.
        slots: each input in order: a role of `Before`, ("numbers",), ("seed",), or
            ("tensor", t): a frozen weight or a constant, passed as it is.
        trained: the trained parameters, in the outputs' order.
        optimizer: the AdamW whose moments the outputs are.
    """

    def __init__(self, key: bytes, slots: list[tuple], trained: list,
                 optimizer: AdamW) -> None:
        self.key, self.slots, self.trained, self.optimizer = key, slots, trained, optimizer

    @classmethod
    def capture(cls, before: Before, trained: list, optimizer: AdamW,
                loss_total: torch.Tensor, frozen: list) -> tuple[CapturedStep, list] | None:
        """The traced step's graph, compiled, and the inputs it was traced on; None where it
        cannot be run again on new data (the traced step is then synced as always).

        Args:
            before: what the step read, taken before its trace.
            trained: the trained parameters (their new values traced).
            optimizer: the AdamW that traced the update (the parameters' new values in
                `new_values`, its moments' in its state, its step numbers in `last_numbers`).
            loss_total: the new running loss (traced).
            frozen: the model's other parameters and buffers (inputs passed as they are).
        """
        numbers, values = optimizer.last_numbers, optimizer.new_values or {}
        if numbers is None or any(id(p) not in values for p in trained):
            return None  # host numbers (constants, another graph each step), or no gradient
        moments = [optimizer.state[p] for p in trained]
        outputs = [*(values[id(p)] for p in trained), *(m["exp_avg"] for m in moments),
                   *(m["exp_avg_sq"] for m in moments), loss_total]
        # The program returns each traced output once, in order: an output the step did not
        # compute (a parameter without a gradient) or one named twice would shift the rest.
        if len({id(t) for t in outputs}) < len(outputs) or not all(_xla.pending(outputs)):
            return None
        # A weight the step changed in place is not an output: a batch norm's running
        # statistics would stop moving, and torch_xla's checkpoint (its optimization barrier
        # on the parameters) would leave traced values that read buffers given away.
        if any(_xla.pending([*trained, *frozen])):
            return None
        roles = dict(before.roles)
        roles[_xla.tensor_id(numbers)] = ("numbers",)
        seed = _xla.seed_input_id()
        try:
            _, ids, inputs = _xla.graph_inputs(outputs, frozen)
            slots = [roles.get(tensor_id) or (("seed",) if tensor_id == seed else ("tensor", t))
                     for tensor_id, t in zip(ids, inputs, strict=True)]
            # The parameters' and moments' buffers go to their new values, as a traced step's
            # in-place updates do: one copy of each in memory. Not the running loss: a
            # logging point's fetch reads it after the next step ran.
            key = _xla.compile_graph(outputs, [t for slot, t in zip(slots, inputs, strict=True)
                                               if slot[0] in ("param", "avg", "square")])
        except Exception:  # noqa: BLE001 - the traced step then runs as it is
            return None
        return cls(key, slots, list(trained), optimizer), inputs

    def run(self, batch: Batch, numbers: torch.Tensor, loss_total: torch.Tensor,
            inputs: list | None = None) -> torch.Tensor:
        """Run the step on the current parameters and moments, `batch`, `numbers` (AdamW's,
        from `count_step`) and the device's seed; put the outputs in place and return the
        new running loss. `inputs`: the traced step's own (its first run)."""
        if inputs is None:
            inputs = [self._input(slot, batch, numbers, loss_total) for slot in self.slots]
        # One step in flight: a run returns before it ran, and the host, no longer tracing,
        # would queue step after step, each with its own new parameters and moments.
        _xla.wait_device_ops()
        outputs = _xla.run_compiled(self.key, inputs)
        count = len(self.trained)
        for parameter, value in zip(self.trained, outputs[:count], strict=True):
            _xla.replace_data(parameter, value)
        for i, parameter in enumerate(self.trained):
            moments = self.optimizer.state[parameter]
            moments["exp_avg"], moments["exp_avg_sq"] = outputs[count + i], outputs[2 * count + i]
        return outputs[-1]

    def shardings(self, loss_total: torch.Tensor) -> list[str]:
        """The sharding of each output as the last run left it, in the outputs' order."""
        moments = [self.optimizer.state[p] for p in self.trained]
        return [_xla.sharding_spec(t) for t in (*self.trained, *(m["exp_avg"] for m in moments),
                                                 *(m["exp_avg_sq"] for m in moments),
                                                 loss_total)]

    def _input(self, slot: tuple, batch: Batch, numbers: torch.Tensor,
               loss_total: torch.Tensor) -> Any:
        role = slot[0]
        if role == "param":
            return self.trained[slot[1]]
        if role in ("avg", "square"):
            moments = self.optimizer.state[self.trained[slot[1]]]
            return moments["exp_avg" if role == "avg" else "exp_avg_sq"]
        if role == "batch":
            return batch.tensors[slot[1]]
        if role == "loss":
            return loss_total
        if role == "numbers":
            return numbers
        if role == "seed":
            return _xla.current_seed(numbers.device)
        return slot[1]
