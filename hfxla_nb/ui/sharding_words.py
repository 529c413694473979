"""XLA sharding specs in words: `{devices=[4,1]0,1,2,3}` reads "sharded 4 ways on dim 0".

torch_xla names a tensor's SPMD layout with XLA's `HloSharding` text (what
`_xla.sharding_spec` returns and `FineTuneResult.parameter_sharding` keeps): the tile
assignment's shape, one entry per tensor dimension (how many pieces that dimension is cut
into), then the devices, listed (`0,1,2,3`) or as an iota (`<=[4]`, `<=[2,2]T(1,0)`). With
`last_tile_dim_replicate`, or `last_tile_dims={replicated}`, the last entries are not tensor
dimensions but how many devices hold each piece. The result's panel says what that means;
the data keeps the spec as XLA wrote it.
"""

from __future__ import annotations

import math
import re

from .._words import series

_TILED = re.compile(r"^\{devices=\[(?P<shape>\d+(?:,\d+)*)\](?P<devices>\S+)(?P<rest>.*)\}$")
_MAXIMAL = re.compile(r"^\{maximal device=(?P<device>\d+)\}$")
_SUBGROUPS = re.compile(r"last_tile_dims=\{(?P<kinds>[^}]*)\}")
_METADATA = re.compile(r"metadata=\{.*\}")


def sharding_words(spec: str, axis: str | None = None) -> str:
    """A sharding spec as people say it.

    Args:
        spec: XLA's text of a sharding (`{replicated}`, `{devices=[4,1]0,1,2,3}`, ...).
        axis: the mesh axis a single cut dimension lies on, when the mesh is known to have one
            axis of more than one device (hfxla_nb's `(devices, 1)` meshes: "fsdp", "data");
            None: the dimension is named instead.

    Returns:
        `replicated`, `sharded 4 ways on dim 0` (`on fsdp` with `axis`; `on fsdp (dim 1)` for
        another dimension), `sharded 2x2 (dims 0 and 1)`, `sharded 2 ways on dim 0, each
        shard on 2 devices`, `on device 0 only`; a spec of another form (manual, a tuple of
        shardings) as it is.

    Example:
        `sharding_words("{devices=[4,1]0,1,2,3}", axis="fsdp")` is `sharded 4 ways on fsdp`.
    """
    text = spec.strip()
    if text == "{replicated}":
        return "replicated"
    maximal = _MAXIMAL.match(text)
    if maximal:
        return f"on device {maximal['device']} only"
    tiled = _TILED.match(text)
    cuts = _cuts(tiled) if tiled else None
    if cuts is None:
        return spec
    shape, copies = cuts
    split = [(dim, ways) for dim, ways in enumerate(shape) if ways > 1]
    if not split:
        return "replicated"
    if len(split) == 1:
        dim, ways = split[0]
        # On a named axis, the first dimension goes unsaid: it is the one FSDPv2 cuts.
        where = f"dim {dim}" if not axis else axis if dim == 0 else f"{axis} (dim {dim})"
        words = f"sharded {ways} ways on {where}"
    else:
        words = (f"sharded {'x'.join(str(ways) for _, ways in split)} "
                 f"(dims {series([dim for dim, _ in split])})")
    return words + (f", each shard on {copies} devices" if copies > 1 else "")


def _cuts(tiled: re.Match) -> tuple[list[int], int] | None:
    """(pieces per tensor dimension, devices holding each piece) of a tiled spec; None for a
    form not read here (manual subgroups, unknown words after the devices)."""
    shape = [int(ways) for ways in tiled["shape"].split(",")]
    rest = _METADATA.sub("", tiled["rest"]).strip()
    copies = 1
    if rest == "last_tile_dim_replicate":
        copies = shape.pop()
    elif rest:
        subgroups = _SUBGROUPS.fullmatch(rest)
        kinds = [kind.strip() for kind in subgroups["kinds"].split(",")] if subgroups else []
        if not kinds or set(kinds) != {"replicated"} or len(kinds) > len(shape):
            return None
        copies = math.prod(shape[-len(kinds):])
        shape = shape[:-len(kinds)]
    return shape, copies
