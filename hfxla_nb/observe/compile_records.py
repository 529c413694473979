"""What torch_xla's compilation analysis says, as records: a frame, a compilation, an
execution, and executions tallied per line (`compile_trace` parses the text into these)."""

from __future__ import annotations

import os
from dataclasses import dataclass

# What torch_xla prints as the cause when a tensor's value is read before the step's sync.
FETCH_CAUSE = "most likely user code trying to access tensor value"
# Distinct graph hashes remembered per execution site or row; past it, a lower bound.
MAX_HASHES = 4096


@dataclass(frozen=True)
class Frame:
    """One Python frame of torch_xla's analysis.

    Attributes:
        function: the function's name (`<module>` for a cell's or script's top level).
        file: the file as Python knows it (a cell's is IPython's temporary file name).
        line: the line number, within the cell for a notebook cell.
        cell: the cell's execution count (`In [5]`) when the file is a notebook cell.
    """

    function: str
    file: str
    line: int
    cell: int | None = None

    def text(self) -> str:
        """"`train` in cell 5, line 12", "`train` in train.py, line 12", "cell 5, line 3"."""
        place = f"cell {self.cell}" if self.cell is not None else os.path.basename(self.file)
        where = f"{place}, line {self.line}"
        return where if self.function == "<module>" else f"`{self.function}` in {where}"

    def short(self) -> str:
        """"masking_utils.py:123 `_ignore_bidirectional_mask_sdpa`" (a library frame)."""
        return f"{os.path.basename(self.file)}:{self.line} `{self.function}`"


@dataclass(frozen=True)
class CompileRecord:
    """One compilation, as torch_xla's analysis described it.

    Attributes:
        index: its order among this process's compilations, from 1.
        cause: torch_xla's words for what triggered it ("user torch_xla.sync", ...).
        graph_hash: the lazy graph's hash (the same hash: the same graph).
        inputs, outputs: the number of graph inputs and outputs.
        where: the first frame in the user's code, or None when every frame is a library's.
        via: the innermost frame outside torch and torch_xla when it is not `where` (the
            library line that cut the graph), else None.
        computation_hash: the hash of the compiled HLO module.
        sizes: bytes of the graph's "input", "output", "aliased", "intermediate" buffers and
            of its "program", from the post-compilation analysis (None before it arrives).
        compile_time: seconds, from torch_xla's CompileTime metric (None when unknown).
    """

    index: int
    cause: str
    graph_hash: str
    inputs: int | None = None
    outputs: int | None = None
    where: Frame | None = None
    via: Frame | None = None
    computation_hash: str | None = None
    sizes: dict[str, int] | None = None
    compile_time: float | None = None

    @property
    def memory(self) -> int | None:
        """Bytes the graph needs on its device while it runs: inputs, outputs not aliased to
        inputs, intermediate buffers and the program (XLA's own memory analysis)."""
        if not self.sizes:
            return None
        sizes = self.sizes
        return max(sizes.get("input", 0) + sizes.get("output", 0) - sizes.get("aliased", 0), 0) + (
            sizes.get("intermediate", 0) + sizes.get("program", 0))

    @property
    def fetched(self) -> bool:
        """Whether reading a tensor's value (`.item()`, `print`, `if tensor:`) cut this graph."""
        return self.cause.startswith(FETCH_CAUSE)


@dataclass(frozen=True)
class Execution:
    """One execution, as torch_xla's analysis described it (cause, graph, frames)."""

    cause: str
    graph_hash: str
    where: Frame | None = None
    via: Frame | None = None

    @property
    def fetched(self) -> bool:
        return self.cause.startswith(FETCH_CAUSE)


@dataclass(frozen=True)
class ExecutionSite:
    """Executions with the same cause from the same user line (and library line).

    Attributes:
        count: how many executions; graphs: how many distinct graphs they ran.
    """

    cause: str
    where: Frame | None
    via: Frame | None
    count: int
    graphs: int

    @property
    def fetched(self) -> bool:
        return self.cause.startswith(FETCH_CAUSE)


def cause_text(cause: str) -> str:
    """torch_xla's cause in a few words: "torch_xla.sync()", "value fetched (.item(), print,
    if)", "MpDeviceLoader step", ..."""
    if cause.startswith(FETCH_CAUSE):
        return "value fetched (.item(), print or if on a tensor)"
    if cause.startswith("user "):  # "user torch_xla.sync", "user mark_step"
        return cause[len("user "):] + "()"
    if "parallel loader" in cause:
        return "MpDeviceLoader step"
    if "profiler" in cause:
        return "profiler StepTrace"
    if "dynamo" in cause:
        return "torch.compile (dynamo)"
    return cause
