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

A step is run again only where nothing in its trace can differ at the next step:
- no op ran on the CPU while it was traced (a value read back from the device, such as
  `.item()`, `bool(tensor)` or `nonzero`, would decide what is traced);
- every input of its graph is a role (a parameter, a moment, the batch, the running loss,
  AdamW's numbers), the seed, or a parameter or buffer of the model; a constant made on the host
  while tracing (a Python number, a numpy mask, a host random draw) is fetched at the shape's
  first and second trace, and the step is run again only once the two are equal;
- the model draws no LayerDrop coin on the host (`layerdrop` in its config).
Where a step cannot be run so (`compiled_steps=False`, torch's own AdamW step, gradients
all-reduced across processes by `optimizer_step`, a parameter left without a gradient, a weight
changed in place by the step: batch norm's statistics, torch_xla's gradient checkpointing; an
output whose sharding differs from its input's), that shape's steps are traced as before, and
the result says why (`FineTuneResult.compiled_steps`). Python branches on host values that
leave no trace in the graph (a `random.random()` in a model's forward) cannot be seen: turn
replay off for such a model (`compiled_steps=False`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
        fallbacks: torch_xla's counts of the ops run on the CPU so far.
    """

    roles: dict[int, tuple]
    shardings: list[str]
    fallbacks: dict[str, int]

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
        shardings = [_xla.sharding_spec(t)
                     for t in outputs_of(trained, optimizer, loss_total)]
        return cls(roles, shardings, _xla.fallback_counts())


def outputs_of(trained: list, optimizer: AdamW, loss_total: torch.Tensor,
               values: dict[int, torch.Tensor] | None = None) -> list:
    """A step's outputs in the compiled program's order: the parameters (or their new
    values, `values`: `id(parameter)` -> value), their first moments, their second moments,
    the running loss."""
    moments = [optimizer.state[p] for p in trained]
    parameters = list(trained) if values is None else [values[id(p)] for p in trained]
    return [*parameters, *(m["exp_avg"] for m in moments),
            *(m["exp_avg_sq"] for m in moments), loss_total]


class TrainedState:
    """The trained parameters' values and AdamW's moments as the last compiled step left them.

    A step run by its compiled graph outputs a new value for each parameter and moment. Putting
    each in place (a parameter's data, AdamW's state) costs the host a call per tensor, hundreds
    per step; the next compiled step only needs them as its inputs. So they are held here as
    the program's outputs and put in place (`bind`) only before something else reads the
    parameters or the optimizer: a traced step, an evaluation, a checkpoint, a callback, the
    end of the training. Until then a parameter's own data is the buffer the step was given
    (deleted): nothing may read it.

    Args:
        trained: the trained parameters, in the order the compiled steps number them.
        optimizer: the AdamW whose moments they are.
    """

    def __init__(self, trained: list, optimizer: AdamW) -> None:
        self.trained, self.optimizer = list(trained), optimizer
        # None: the parameters and the optimizer's state hold the current values.
        self.held: tuple[list, list, list] | None = None

    def current(self) -> tuple[list, list, list]:
        """The parameters' current values, their first moments and their second moments."""
        if self.held is not None:
            return self.held
        moments = [self.optimizer.state[p] for p in self.trained]
        return (list(self.trained), [m["exp_avg"] for m in moments],
                [m["exp_avg_sq"] for m in moments])

    def hold(self, values: tuple[list, list, list]) -> None:
        """Hold `current()`'s lists, with a compiled step's outputs in them."""
        self.held = values

    def bind(self) -> None:
        """Put the held values in place: each parameter's data (`_xla.replace_data`: no op
        traced) and AdamW's moments."""
        if self.held is None:
            return
        values, avgs, squares = self.held
        self.held = None
        for parameter, value, avg, square in zip(self.trained, values, avgs, squares,
                                                 strict=True):
            if value is not parameter:  # one the step left as it is holds its own data
                _xla.replace_data(parameter, value)
            state = self.optimizer.state[parameter]
            state["exp_avg"], state["exp_avg_sq"] = avg, square


class CapturedStep:
    """One batch shape's training step, compiled, run on each step's data.

    Args:
        graph: the compiled step; its roles are `Before`'s and ("numbers",).
        state: the trained parameters (as `Before` numbered them: the inputs' roles) and
            their moments, which every compiled step of the run reads and leaves there.
        updated: the parameters the step updates, in the outputs' order: those that got a
            gradient (default: all). One without is read as it is, as torch's AdamW leaves a
            parameter whose `grad` is None.
    """

    def __init__(self, graph: _xla.CompiledGraph, state: TrainedState,
                 updated: list | None = None) -> None:
        self.graph, self.state = graph, state
        self.trained, self.optimizer = state.trained, state.optimizer
        self.updated = list(self.trained) if updated is None else updated
        ids = {id(p) for p in self.updated}
        # Where each output goes among the trained parameters.
        self.places = [i for i, p in enumerate(self.trained) if id(p) in ids]
        #: The names of the trained parameters the step left without a gradient (read as
        #: they are): a second trace must give the same graph before the step is replayed.
        self.unchanged: list[str] = []

    @classmethod
    def capture(cls, before: Before, state: TrainedState, loss_total: torch.Tensor,
                frozen: list, names: Mapping[int, str] | None = None, masks: bool = False
                ) -> tuple[CapturedStep, list] | _xla.Declined:
        """The traced step's graph, compiled, and the inputs it was traced on; `Declined`,
        with its cause, where it cannot be run again on new data (the traced step is then
        synced as always).

        Args:
            before: what the step read, taken before its trace.
            state: the trained parameters (their new values traced) and the AdamW that traced
                the update (the parameters' new values in `new_values`, its moments' in its
                state, its step numbers in `last_numbers`).
            loss_total: the new running loss (traced).
            frozen: the model's other parameters and buffers (inputs passed as they are).
            names: `id(parameter)` -> its name in the model, for what a decline says.
            masks: the model draws SpecAugment masks on the host (`mask_time_prob`).
        """
        trained, optimizer = state.trained, state.optimizer
        ran_on_cpu = _xla.fallbacks_since(before.fallbacks)
        if ran_on_cpu:
            return _xla.Declined(
                f"the step ran {', '.join(ran_on_cpu)} on the CPU while it was traced (an op "
                "XLA does not lower, or a value read back from the device: .item(), "
                "bool(tensor), nonzero): the graph is cut there, and what is read may differ "
                "at the next step")
        numbers, values = optimizer.last_numbers, optimizer.new_values or {}
        if numbers is None:
            return _xla.Declined("the optimizer's step numbers were not one uploaded tensor")
        # A parameter without a gradient that the step never reads (an unused embedding) is
        # left as it is, as torch's AdamW skips it. One that gets a gradient at a later step (a
        # layer a host coin dropped) traces another graph: the caller proves the step the same
        # at a second trace (`unchanged`). One the step reads without a gradient (a mask's
        # embedding where the mask drawn was empty) may get one at the next: declined.
        updated = [p for p in trained if id(p) in values]
        unchanged = [i for i, p in enumerate(trained) if id(p) not in values]

        def named(places: list[int]) -> str:
            return ", ".join((names or {}).get(id(trained[i]), "a parameter of shape "
                                               + str(tuple(trained[i].shape)))
                             for i in places[:3]) + (", ..." if len(places) > 3 else "")

        if unchanged and masks:  # decided before any compile: the step is traced as always
            return _xla.Declined(f"{len(unchanged)} trained parameter(s) got no gradient at "
                                 f"the step ({named(unchanged)}): SpecAugment's mask, drawn on "
                                 "the host at each step, decides whether they get one")
        # A weight the step changed in place is not an output: a batch norm's running
        # statistics would stop moving, and torch_xla's checkpoint (its optimization barrier
        # on the parameters) would leave traced values that read buffers given away.
        if any(_xla.pending([*trained, *frozen])):
            return _xla.Declined(
                "the step changes a weight in place (batch norm's running statistics, or "
                "torch_xla's gradient checkpointing)")
        roles = dict(before.roles)
        roles[_xla.tensor_id(numbers)] = ("numbers",)
        # The parameters' and moments' buffers go to their new values, as a traced step's
        # in-place updates do: one copy of each in memory. Not the running loss: a
        # logging point's fetch reads it after the next step ran; nor a parameter the step
        # leaves as it is (nor its moments).
        keep = frozenset((kind, i) for i in unchanged for kind in ("param", "avg", "square"))
        captured = _xla.CompiledGraph.capture(outputs_of(updated, optimizer, loss_total, values),
                                              roles, frozen, donate=("param", "avg", "square"),
                                              keep=keep)
        if isinstance(captured, _xla.Declined):
            return captured
        graph, inputs = captured
        read = [i for i in unchanged if ("param", i) in graph.slots]
        if read:
            return _xla.Declined(f"{len(read)} trained parameter(s) got no gradient at the "
                                 f"step though it reads them ({named(read)}): a gradient "
                                 "that depends on the data may come at the next step")
        step = cls(graph, state, updated)
        step.unchanged = [named([i]) for i in unchanged]
        return step, inputs

    def run(self, batch: Batch, numbers: torch.Tensor, loss_total: torch.Tensor,
            inputs: list | None = None) -> torch.Tensor:
        """Run the step on the current parameters and moments (as `state` holds them: another
        shape's step may have moved them since this one ran), `batch`, `numbers` (AdamW's,
        from `count_step`) and the device's seed; leave the outputs in `state` and return the
        new running loss. `inputs`: the traced step's own (its first run)."""
        values, avgs, squares = current = self.state.current()
        if inputs is None:
            inputs = self.graph.inputs({
                "param": values, "avg": avgs, "square": squares, "batch": batch.tensors,
                "loss": loss_total, "numbers": numbers})
        outputs = self.graph.run(inputs)
        count = len(self.places)
        for k, i in enumerate(self.places):
            values[i], avgs[i], squares[i] = (outputs[k], outputs[count + k],
                                              outputs[2 * count + k])
        self.state.hold(current)
        return outputs[-1]

    def shardings(self, loss_total: torch.Tensor) -> list[str]:
        """The sharding of each output as the last run left it, in the outputs' order (put
        in place first)."""
        self.state.bind()
        return [_xla.sharding_spec(t)
                for t in outputs_of(self.updated, self.optimizer, loss_total)]

    def expected_shardings(self, before: Before) -> list[str]:
        """`before.shardings` (every trained parameter's) for this step's outputs only."""
        count, updated = len(self.trained), {id(p) for p in self.updated}
        places = [i for i, p in enumerate(self.trained) if id(p) in updated]
        return ([before.shardings[i] for i in places]
                + [before.shardings[count + i] for i in places]
                + [before.shardings[2 * count + i] for i in places] + [before.shardings[-1]])
