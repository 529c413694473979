"""SPMD: meshes, shardings, FSDPv2 and torch_xla's layer checkpointing. These start the runtime
(or need tensors on a device): only inside a launched worker.
"""

from __future__ import annotations

from collections.abc import Callable

from .loader import require_torch_xla
from .process import TRANSFER_FROM_DEVICE_TIME, global_device_count


def data_parallel_mesh(axis: str = "data"):
    """A `(devices, 1)` mesh named `(axis, "model")` over every device, for SPMD: "data" for
    data parallelism, "fsdp" for FSDPv2 (parameters sharded on the same axis as the batch)."""
    require_torch_xla()
    import numpy as np
    import torch_xla.distributed.spmd as xs

    count = global_device_count()
    return xs.Mesh(np.arange(count), (count, 1), (axis, "model"))


def fsdp_v2(model, mesh, layer_classes: set | None = None, checkpoint: bool = False):
    """Wrap `model` in PyTorch/XLA's SPMD FSDPv2: parameters sharded over the mesh's "fsdp"
    axis, the logits of the output sharded on the batch; each layer of `layer_classes`
    wrapped (and recomputed in the backward pass with torch_xla's checkpoint when asked)."""
    require_torch_xla()
    import functools
    import warnings

    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.fsdp import checkpoint_module
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    def shard_output(output, mesh):
        # A layer returns a tensor (or a tuple); the model a ModelOutput with logits.
        if isinstance(output, tuple):
            output = output[0]
        tensor = getattr(output, "logits", output)
        xs.mark_sharding(tensor, mesh, ("fsdp",) + (None,) * (tensor.dim() - 1))

    # FSDPv2 puts an optimization barrier on each wrapped module's backward through a full
    # backward hook; the whole model returns a ModelOutput, so torch warns ("For backward hooks
    # to be called, module output should be a Tensor...") on the first step: the layers'
    # barriers still run, and the user can do nothing about it. Silenced in this worker only.
    warnings.filterwarnings("ignore", message="For backward hooks to be called",
                            category=UserWarning, module="torch.nn.modules.module")
    # The same hook on a layer whose inputs need no gradient (under LoRA the frozen embedding
    # feeds the first layer) fires with the output gradients only, as it should: the barrier
    # still holds the layer's parameter gradients. torch warns that it does ("Full backward
    # hook is firing when gradients are computed with respect to module outputs"), at the
    # frame that called backward(), on the first step. Silenced in this worker only.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are "
                            "computed with respect to module outputs", category=UserWarning)
    policy = wrapper = None
    if layer_classes:
        policy = functools.partial(transformer_auto_wrap_policy,
                                   transformer_layer_cls=set(layer_classes))
        if checkpoint:
            def wrapper(module, *args, **kwargs):
                return FSDPv2(checkpoint_module(module), *args, **kwargs)
    return FSDPv2(model, mesh=mesh, shard_output=shard_output, auto_wrap_policy=policy,
                  auto_wrapper_callable=wrapper)


def checkpoint_layers(model, layer_classes: set) -> int:
    """Recompute each layer of `layer_classes` in the backward pass with torch_xla's own
    checkpoint (transformers' gradient checkpointing is removed by XLA's compiler); returns
    how many layers were wrapped."""
    require_torch_xla()
    from torch_xla.distributed.fsdp import checkpoint_module

    wrapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in layer_classes:
                setattr(parent, name, checkpoint_module(child))
                wrapped += 1
    return wrapped


def sharding_spec(tensor) -> str:
    """How `tensor` is sharded ("" or "{replicated}" when it is not)."""
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(tensor)


def share_sharding(tensor, like) -> None:
    """Give `tensor` the SPMD sharding of `like` (nothing when `like` has none)."""
    import torch_xla

    sharding = torch_xla._XLAC._get_xla_op_sharding(like)
    if sharding is not None:
        torch_xla._XLAC._xla_mark_sharding(tensor, sharding)


def mark_sharding(tensor, mesh, spec: tuple) -> None:
    """`xs.mark_sharding`: lay `tensor` out over `mesh`, one mesh axis name (or None) per
    dimension."""
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(tensor, mesh, spec)


_watched: Callable | None = None  # the wrapper `watch_mark_sharding` installed


def watch_mark_sharding(on_copy: Callable[[int], None]) -> None:
    """Call `on_copy(transfers)` after each `xs.mark_sharding` that copied its tensor to the
    host, in this process, from now on (a worker's; starts nothing).

    `xs.mark_sharding(x, ...)` on a tensor that an operation already used makes torch_xla
    copy `x` to the host and back, sharded (its `ReplicateShardedData` counter), at every
    step that does so, without a line in its own analysis, so the transfer alert would blame
    `.item()`, which the user never called. The wrapper counts device-to-host transfers around
    each call; the call itself is unchanged. Calls through `xs.mark_sharding` (the module
    attribute, as torch_xla's docs write it) are seen; a `from ... import mark_sharding` made
    earlier is not.
    """
    require_torch_xla()
    import functools

    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs

    global _watched
    original = xs.mark_sharding
    if original is _watched:
        return  # already wrapped in this process (or inherited from the forking one)

    def transfers() -> int:
        data = met.metric_data(TRANSFER_FROM_DEVICE_TIME)
        return int(data[0]) if data else 0

    @functools.wraps(original)
    def mark_sharding(*args, **kwargs):
        before = transfers()
        result = original(*args, **kwargs)
        copied = transfers() - before
        if copied > 0:
            on_copy(copied)
        return result

    xs.mark_sharding = _watched = mark_sharding


def replicate_unsharded(tensors, mesh) -> None:
    """Mark each of `tensors` that has no SPMD sharding yet as replicated over `mesh`.

    A graph's output is always annotated (at least "{replicated}"), while a tensor uploaded
    without a sharding has none, and the two count as different inputs: without this, the
    second training step compiles a second graph although nothing else changed."""
    import torch_xla.distributed.spmd as xs

    for tensor in tensors:
        if sharding_spec(tensor) == "":
            xs.mark_sharding(tensor, mesh, (None,) * tensor.dim())


def replicate(tensor, mesh) -> None:
    """Mark `tensor` fully replicated over the mesh, in place.

    Fetching a tensor that is sharded compiles a gather per tensor; a result marked replicated
    inside the step's graph is fetched with no extra compilation.
    """
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(tensor, mesh, (None,) * tensor.dim())


def send_to_device(tensors: list, dev, mesh=None, partition_spec: tuple | None = None) -> list:
    """Copy CPU tensors to the device in one transfer; with a mesh, each device receives only
    its shard of each (the tensors have the same rank: one spec fits them all).

    Sharding at upload (`send_cpu_data_to_device` with a `ShardingSpec`) avoids uploading
    the whole batch to every device and resharding it there.
    """
    require_torch_xla()
    import torch_xla.core.xla_model as xm

    sharding = None
    if mesh is not None:
        import torch_xla.distributed.spmd as xs

        sharding = xs.ShardingSpec(mesh, partition_spec)
    return list(xm.send_cpu_data_to_device(list(tensors), dev, sharding))
