"""The torch.distributed-style variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) of
a rank, so that accelerate's `PartialState()` inside a launched function knows its indexes.

accelerate takes the global index from `xr.global_ordinal()` but, on XLA devices other than
a TPU, the local one from `LOCAL_RANK` (-1 when unset): on XLA:CPU every rank said
`Local process index: -1`. Where a process runs one rank, the variables are the process's
(on a TPU host, from what torch_xla's `xmp.spawn` set: `tpu_rank_variables`); where a
process runs several rank threads (XLA:CPU, TPU v2/v3), `os.environ` answers these four
names per rank thread.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def rank_variables(rank: int, local_rank: int, world: int,
                   local_world: int | None = None) -> dict[str, str]:
    """The four variables of one rank."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world if local_world is None else local_world)}


def tpu_rank_variables(environ: Mapping[str, str]) -> dict[str, str] | None:
    """A TPU process's variables from those torch_xla sets in each process of `xmp.spawn`
    (`PJRT_LOCAL_PROCESS_RANK`/`_COUNT`, `CLOUD_TPU_TASK_ID`: the process's index in the
    slice, `TPU_PROCESS_BOUNDS`: the slice's processes as a mesh); None where they are not
    set (not a TPU process of xmp.spawn)."""
    local = environ.get("PJRT_LOCAL_PROCESS_RANK")
    if local is None or not local.strip().isdigit():
        return None
    local_rank = int(local)
    local_world = int(environ.get("PJRT_LOCAL_PROCESS_COUNT", "1") or 1)
    task = environ.get("CLOUD_TPU_TASK_ID", "")
    rank = int(task) if task.strip().isdigit() else local_rank
    bounds = environ.get("TPU_PROCESS_BOUNDS", "")
    try:
        world = math.prod(int(dim) for dim in bounds.split(",")) if bounds else local_world
    except ValueError:
        world = local_world
    return rank_variables(rank, local_rank, max(world, rank + 1), local_world)


def set_process_variables(variables: Mapping[str, str]) -> None:
    """The variables of a process that runs exactly one rank."""
    os.environ.update(variables)


class _PerThreadEnviron(dict):
    """`os.environ`'s storage (bytes -> bytes), answering `NAMES` with the calling rank
    thread's own values; every other name, and other threads, as before."""

    local = threading.local()

    def __getitem__(self, key: bytes) -> bytes:
        values = getattr(self.local, "values", None)
        if values is not None and key in values:
            return values[key]
        return super().__getitem__(key)


def set_thread_variables(variables: Mapping[str, str]) -> None:
    """The variables of the calling rank thread (a process running several ranks): Python
    code reading `os.environ` in this thread sees them; the process's own values (the
    first rank's) are what native code and other threads see."""
    storage = getattr(os.environ, "_data", None)
    if not isinstance(storage, dict):  # another Python's os.environ: the process's only
        for name, value in variables.items():
            os.environ.setdefault(name, value)
        return
    if not isinstance(storage, _PerThreadEnviron):
        storage = _PerThreadEnviron(storage)
        os.environ._data = storage  # type: ignore[attr-defined]
    for name, value in variables.items():
        os.environ.setdefault(name, value)  # the names exist for iteration and copies
    _PerThreadEnviron.local.values = {
        os.environ.encodekey(name): os.environ.encodevalue(value)  # type: ignore[attr-defined]
        for name, value in variables.items()}
