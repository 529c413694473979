"""Input shapes: which input of a step changed shape, and when (`hx.report(inputs=...)`).

A `ShapeTracker` in the worker remembers each input's distinct shapes; the snapshot carries
them as plain data (`data()`), and `shape_changes` reads back the inputs whose shape changed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

# How many distinct shapes one input lists in a `ShapeTracker` (the rest are only counted)...
MAX_SHAPES_PER_INPUT = 16
# ... exactly up to this many more (past it, the count is a lower bound): bounded memory.
MAX_SHAPES_COUNTED = 4096
# More distinct shapes than this for one input gets an alert even when every compilation
# happened during warm-up. A few fixed bucket lengths are the recommended fix itself
# (`hfxla_nb.data` pads to at most 3 buckets), so up to 3 shapes stay quiet.
MAX_QUIET_SHAPES = 3


class ShapeTracker:
    """Remembers the distinct shapes each named input had, cheaply (a dict lookup per input).

    `record(step, {"input_ids": (16, 64), ...})` per step; `data()` gives
    `{name: [{"shape": [16, 64], "first": step, "last": step, "count": n}, ...]}` in order of
    first appearance, which the analyzer uses to say which input's shape changed. Thread-safe.

    Storage is bounded: the first `MAX_SHAPES_PER_INPUT` shapes of an input are listed; later
    ones are only counted (exactly up to `MAX_SHAPES_COUNTED` more) in one last entry
    `{"shape": ["..."], "first", "last", "count", "more": how many more distinct shapes,
    "exact": whether "more" is exact}`. Read the data with `input_shapes_of`.
    """

    def __init__(self) -> None:
        self._shapes: dict[str, dict[tuple, dict[str, Any]]] = {}
        self._unlisted: dict[str, set] = {}  # distinct shapes past the listed ones (bounded)
        self._overflow: dict[str, dict[str, Any]] = {}  # the steps that had unlisted shapes
        self._lock = threading.Lock()

    def record(self, step: int, shapes: dict[str, tuple]) -> bool:
        """Record this step's shapes; returns whether any input showed a shape not seen before."""
        new = False
        with self._lock:
            for name, shape in shapes.items():
                seen = self._shapes.setdefault(name, {})
                entry = seen.get(shape)
                if entry is None and len(seen) < MAX_SHAPES_PER_INPUT:
                    entry = seen[shape] = {"shape": list(shape), "first": step, "count": 0}
                    new = new or len(seen) > 1
                elif entry is None:  # too many to list: count the rest
                    entry = self._overflow.get(name)
                    if entry is None:
                        entry = self._overflow[name] = {
                            "shape": ["..."], "first": step, "count": 0, "more": 0, "exact": True,
                        }
                    unlisted = self._unlisted.setdefault(name, set())
                    if shape not in unlisted:
                        new = True
                        if len(unlisted) < MAX_SHAPES_COUNTED:
                            unlisted.add(shape)
                            entry["more"] = len(unlisted)
                        else:
                            entry["exact"] = False
                entry["count"] += 1
                entry["last"] = step
        return new

    def data(self) -> dict[str, list[dict[str, Any]]]:
        """A picklable copy of what was recorded."""
        with self._lock:
            result = {}
            for name, seen in self._shapes.items():
                entries = [dict(entry) for entry in seen.values()]
                if name in self._overflow:
                    entries.append(dict(self._overflow[name]))
                result[name] = entries
            return result


def shape_text(shape: tuple) -> str:
    """"(16, 64)" for a shape."""
    return "(" + ", ".join(str(size) for size in shape) + ")"


@dataclass(frozen=True)
class InputShapes:
    """The shapes one input had: the first ones seen (listed) and how many in all.

    Attributes:
        shapes: the listed shapes, in order of first appearance.
        first_steps: the step at which each listed shape first appeared.
        distinct: how many distinct shapes the input had (at least `len(shapes)`).
        exact: False when there were so many that `distinct` is only a lower bound.
    """

    shapes: list[tuple]
    first_steps: list[int | None]
    distinct: int
    exact: bool = True

    @property
    def more(self) -> int:
        """How many distinct shapes are not listed."""
        return max(self.distinct - len(self.shapes), 0)

    def count_text(self) -> str:
        """`23 different shapes`, or `more than 4112 different shapes`."""
        return f"{'' if self.exact else 'more than '}{self.distinct} different shapes"

    def listed_text(self, limit: int) -> str:
        """`(9, 8), (10, 8), (11, 8) and 20 more`: the first `limit` shapes, then how many
        were not shown."""
        if self.distinct == limit + 1:
            limit += 1  # "and 1 more" says less than the shape itself
        shown = self.shapes[:limit]
        text = ", ".join(shape_text(shape) for shape in shown)
        rest = self.distinct - len(shown)
        if rest > 0:
            text += f" and {'' if self.exact else 'over '}{rest} more"
        return text


def input_shapes_of(data: dict[str, list[dict[str, Any]]] | None) -> dict[str, InputShapes]:
    """`ShapeTracker.data()` (or a snapshot's `input_shapes`) as `{name: InputShapes}`."""
    result = {}
    for name, entries in (data or {}).items():
        shapes, first_steps, distinct, exact = [], [], 0, True
        for entry in entries:
            if list(entry.get("shape", [])) == ["..."]:  # the shapes that were not listed
                distinct += int(entry.get("more", 1))
                exact = exact and "more" in entry and bool(entry.get("exact", True))
                continue
            shapes.append(tuple(entry["shape"]))
            first_steps.append(entry.get("first"))
            distinct += 1
        result[name] = InputShapes(shapes, first_steps, distinct, exact)
    return result


def shapes_of(inputs: Any) -> dict[str, tuple]:
    """`{name: shape}` for the tensors (anything with `.shape`) in a dict or batch; no sync."""
    items = inputs.items() if hasattr(inputs, "items") else ()
    shapes = {}
    for name, value in items:
        shape = getattr(value, "shape", None)
        if shape is None:
            continue
        try:
            shapes[str(name)] = tuple(int(size) for size in shape)
        except (TypeError, ValueError):  # symbolic sizes: keep their text
            shapes[str(name)] = tuple(str(size) for size in shape)
    return shapes


def shape_changes(input_shapes: dict[str, list[dict[str, Any]]] | None) -> dict[str, InputShapes]:
    """`{name: InputShapes}` for every input that was seen with more than one shape."""
    return {name: info for name, info in input_shapes_of(input_shapes).items()
            if info.distinct > 1}
