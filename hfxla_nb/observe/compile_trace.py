"""PyTorch/XLA's own compilation analysis (`PT_XLA_DEBUG_LEVEL=2`), as records and per-line rows.

With `PT_XLA_DEBUG_LEVEL=2`, torch_xla writes a block of text for every compilation and every
execution (to `PT_XLA_DEBUG_FILE`, else stderr):

```
Compilation Analysis: Compilation Cause
Compilation Analysis:   user torch_xla.sync
Compilation Analysis: Graph Info:
Compilation Analysis:   Graph Hash: ea2895204b36808feac7e1fa1e976019
Compilation Analysis:   Number of Graph Inputs: 1
Compilation Analysis:   Number of Graph Outputs: 2
Compilation Analysis: Python Frame Triggered Execution:
Compilation Analysis:   sync (.../torch_xla/torch_xla.py:87)
Compilation Analysis:   train (/tmp/ipykernel_81/2390.py:12)
Computation hash: 2838d9f0623d9a31aa36bc97b80dabe3
Post Compilation Analysis: Graph input size: 0.000113 GB
Post Compilation Analysis: Intermediate tensor size: 0.002001 GB
...
Execution Analysis: Execution Cause
Execution Analysis:   most likely user code trying to access tensor value before torch_xla.sync
...
```

`TraceParser` turns that text, fed in any pieces, into `CompileRecord`s and `Execution`s;
each names the first frame in the user's own code (`Frame`, "`train` in cell 5, line 12") and,
when the graph was cut inside a library (transformers' mask check, Trainer), the innermost
library frame too. `TraceLog` groups compilations by user line: the compilations view. Plain
data in, plain data out: the file is read by `observe.tracing`.
"""

from __future__ import annotations

import os
import re
import site
import sysconfig
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Block prefixes of torch_xla/csrc/debug_util.cpp (torch_xla 2.5 to 2.9).
_COMPILE = "Compilation Analysis: "
_EXECUTE = "Execution Analysis: "
_UNEXPECTED = "Unexpected Execution Analysis: "
_POST = "Post Compilation Analysis: "
_COMPUTATION_HASH = "Computation hash: "
# What torch_xla prints as the cause when a tensor's value is read before the step's sync.
FETCH_CAUSE = "most likely user code trying to access tensor value"
# Post-compilation sizes, as torch_xla names them -> our keys (bytes).
_SIZES = {
    "Graph input size": "input",
    "Graph output size": "output",
    "Aliased Input size": "aliased",
    "Intermediate tensor size": "intermediate",
    "Compiled program size": "program",
}
_GIB = 1024**3
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_IPYTHON_INPUT = re.compile(r"^<ipython-input-(?P<cell>\d+)-[0-9a-f]+>$")
# Distinct graph hashes remembered per row; past it the count is a lower bound.
MAX_HASHES = 4096
# Compile records kept for `records` (the rows keep counting past it).
MAX_RECORDS = 2000


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


# ---------------------------------------------------------------------------------------------
# Which frames are the user's
# ---------------------------------------------------------------------------------------------


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.add(os.path.realpath(path))
    try:
        roots.update(os.path.realpath(path) for path in site.getsitepackages())
    except AttributeError:  # pragma: no cover - virtualenvs without it
        pass
    roots.add(os.path.realpath(os.path.dirname(os.path.dirname(__file__))))  # hfxla_nb itself
    return tuple(sorted(roots, key=len, reverse=True))


_LIBRARY_ROOTS = _library_roots()
_INTERNAL = ("torch_xla", "torch")
# hfxla_nb's own thin wrapper of torch_xla reports cuts, like torch_xla itself.
_XLA_WRAPPER = os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                             "_xla.py"))


def is_library(path: str) -> bool:
    """Whether a frame's file belongs to Python, an installed package or hfxla_nb (not to the
    user's notebook, script or own modules)."""
    if path.startswith("<frozen") or "/site-packages/" in path or "/dist-packages/" in path:
        return True
    if path.startswith("<"):  # <ipython-input-...>, <string>: the user's code
        return False
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in _LIBRARY_ROOTS)


def _is_internal(path: str) -> bool:
    """torch's and torch_xla's own frames (where the cut is reported, not made)."""
    if path.endswith("_xla.py") and os.path.realpath(path) == _XLA_WRAPPER:
        return True
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            index = parts.index(marker)
            return len(parts) > index + 1 and parts[index + 1] in _INTERNAL
    return False


def locate(frames: list[Frame]) -> tuple[Frame | None, Frame | None]:
    """(first frame in the user's code, innermost library frame when it is another one)."""
    where = next((frame for frame in frames if not is_library(frame.file)), None)
    via = next((frame for frame in frames if not _is_internal(frame.file)), None)
    return where, (via if via is not None and via != where else None)


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------


@dataclass
class _Block:
    kind: str  # "compile" or "execute"
    lines: list[str] = field(default_factory=list)


class TraceParser:
    """Turns torch_xla's analysis text into records, fed a piece at a time (what was appended
    to the file since the last read); partial lines wait for the next piece.

    Args:
        cells: IPython's cell file names -> execution counts, to name cells ("cell 5").

    `feed` returns the `CompileRecord`s completed by the text (once their post-compilation
    sizes arrived) and the `Execution`s; `finish` returns compilations still waiting for
    their sizes (a compilation that failed, or the end of the text).
    """

    def __init__(self, cells: Mapping[str, int] | None = None) -> None:
        self.cells = dict(cells or {})
        self.compiles = 0  # compilations seen so far (their index)
        self._partial = ""
        self._block: _Block | None = None
        self._closing = False  # after a block's dashes, its closing "====" line follows
        self._pending: list[CompileRecord] = []  # waiting for their post-compilation sizes
        self._post: dict[str, int] | None = None
        self._computation: str | None = None

    def feed(self, text: str) -> tuple[list[CompileRecord], list[Execution]]:
        """Parse more text; returns what it completed."""
        done: list[CompileRecord] = []
        executions: list[Execution] = []
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line.rstrip("\r"), done, executions)
        return done, executions

    def finish(self) -> list[CompileRecord]:
        """Compilations still waiting for their sizes, as they are."""
        pending, self._pending = self._pending, []
        return pending

    def _line(self, line: str, done: list[CompileRecord], executions: list[Execution]) -> None:
        if line.startswith(_COMPUTATION_HASH):
            self._computation = line[len(_COMPUTATION_HASH):].strip()
            return
        for prefix, kind in ((_COMPILE, "compile"), (_UNEXPECTED, "execute"),
                             (_EXECUTE, "execute"), (_POST, "post")):
            if line.startswith(prefix):
                self._body(kind, line[len(prefix):], done, executions)
                return

    def _body(self, kind: str, body: str, done: list[CompileRecord],
              executions: list[Execution]) -> None:
        if body.startswith("===="):
            if self._closing:
                self._closing = False
            elif kind == "post":
                self._post = {}
            else:
                self._block = _Block(kind)
            return
        if body.startswith("----"):
            self._closing = True
            if kind == "post":
                self._end_post(done)
            elif self._block is not None:
                self._end_block(self._block, executions)
                self._block = None
            return
        if kind == "post":
            self._size(body)
        elif self._block is not None:
            self._block.lines.append(body)

    def _size(self, body: str) -> None:
        name, _, value = body.partition(":")
        key = _SIZES.get(name.strip())
        if key is None or self._post is None:
            return
        try:
            self._post[key] = int(round(float(value.strip().split()[0]) * _GIB))
        except (ValueError, IndexError):  # "Unknown "
            pass

    def _end_post(self, done: list[CompileRecord]) -> None:
        sizes, self._post = self._post, None
        computation, self._computation = self._computation, None
        if not self._pending:
            return
        record = self._pending.pop(0)
        done.append(_replace(record, sizes=sizes or None, computation_hash=computation))

    def _end_block(self, block: _Block, executions: list[Execution]) -> None:
        cause, graph_hash, inputs, outputs, frames = _read_block(block.lines, self.cells)
        where, via = locate(frames)
        if block.kind == "compile":
            self.compiles += 1
            self._pending.append(CompileRecord(self.compiles, cause, graph_hash, inputs,
                                               outputs, where, via))
        else:
            executions.append(Execution(cause, graph_hash, where, via))


def _replace(record: CompileRecord, **changes) -> CompileRecord:
    import dataclasses

    return dataclasses.replace(record, **changes)


def _read_block(lines: list[str], cells: Mapping[str, int]):
    cause, graph_hash, inputs, outputs = "", "", None, None
    frames: list[Frame] = []
    section = None
    for raw in lines:
        line = raw.strip()
        if line in ("Compilation Cause", "Execution Cause"):
            section = "cause"
        elif line.startswith("Graph Info"):
            section = "graph"
        elif line.startswith("Python Frame Triggered Execution"):
            section = "frames"
        elif section == "cause" and not cause:
            cause = line
        elif section == "graph":
            name, _, value = line.partition(":")
            value = value.strip()
            if name == "Graph Hash":
                graph_hash = value
            elif name == "Number of Graph Inputs" and value.isdigit():
                inputs = int(value)
            elif name == "Number of Graph Outputs" and value.isdigit():
                outputs = int(value)
        elif section == "frames":
            frame = _frame(line, cells)
            if frame is not None:
                frames.append(frame)
    return cause, graph_hash, inputs, outputs, frames


def _frame(line: str, cells: Mapping[str, int]) -> Frame | None:
    match = _FRAME.match(line)
    if match is None:
        return None  # ".........." (more frames than PT_XLA_DEBUG_MAX_FRAME)
    file = match["file"]
    cell = cells.get(file)
    if cell is None:
        ipython = _IPYTHON_INPUT.match(file)  # IPython 7 names cells <ipython-input-5-...>
        cell = int(ipython["cell"]) if ipython else None
    return Frame(match["function"], file, int(match["line"]), cell)


def tally_executions(executions: Iterable[Execution],
                     sites: dict[tuple, list] | None = None) -> dict[tuple, list]:
    """Count executions per (cause, user line, library line): `{key: [count, hashes]}`."""
    sites = {} if sites is None else sites
    for execution in executions:
        key = (execution.cause, execution.where, execution.via)
        entry = sites.setdefault(key, [0, set()])
        entry[0] += 1
        if len(entry[1]) < MAX_HASHES:
            entry[1].add(execution.graph_hash)
    return sites


def execution_sites(sites: dict[tuple, list]) -> tuple[ExecutionSite, ...]:
    """The tally as `ExecutionSite`s, most executions first."""
    result = [ExecutionSite(cause, where, via, count, len(hashes))
              for (cause, where, via), (count, hashes) in sites.items()]
    return tuple(sorted(result, key=lambda site: -site.count))


# ---------------------------------------------------------------------------------------------
# The compilations view: one row per user line
# ---------------------------------------------------------------------------------------------


@dataclass
class CompileRow:
    """The compilations made at one user line (and library line).

    Attributes:
        where, via: as in `CompileRecord`.
        compiles: graphs compiled there; graphs: how many were different (graph hashes).
        compile_time: seconds, over the compilations whose time is known.
        causes: torch_xla's causes, counted.
        largest: the compilation there that needs the most device memory.
    """

    where: Frame | None
    via: Frame | None
    compiles: int = 0
    compile_time: float = 0.0
    causes: Counter = field(default_factory=Counter)
    largest: CompileRecord | None = None
    _hashes: set = field(default_factory=set, repr=False)

    @property
    def graphs(self) -> int:
        return len(self._hashes)

    @property
    def cause(self) -> str:
        """The most frequent cause."""
        return self.causes.most_common(1)[0][0] if self.causes else ""

    @property
    def fetched(self) -> bool:
        return self.cause.startswith(FETCH_CAUSE)

    def place(self) -> str:
        """"`train` in cell 5, line 12 (via masking_utils.py:123 `f`)", or "library code"."""
        text = self.where.text() if self.where is not None else "library code"
        if self.via is not None:
            text += f" (via {self.via.short()})"
        return text

    def add(self, record: CompileRecord) -> None:
        self.compiles += 1
        self.compile_time += record.compile_time or 0.0
        self.causes[record.cause] += 1
        if len(self._hashes) < MAX_HASHES:
            self._hashes.add(record.graph_hash)
        memory = record.memory
        if memory is not None and (self.largest is None or memory > (self.largest.memory or 0)):
            self.largest = record


@dataclass
class TraceLog:
    """A process's compilations and executions as torch_xla's analysis reported them.

    Attributes:
        device_memory: bytes one device has, when known from the hardware (a TPU's HBM).
        device_name: what has that memory, in words ("a v5e chip").
        note: one line when tracing could not be switched on (the panel says it instead).
        executions: execution sites (cumulative, as the worker counted them).
    """

    device_memory: int | None = None
    device_name: str | None = None
    note: str | None = None
    executions: tuple[ExecutionSite, ...] = ()
    records: list[CompileRecord] = field(default_factory=list)
    _rows: dict[tuple, CompileRow] = field(default_factory=dict, repr=False)
    _last_index: int = 0
    _compiles: int = 0

    def add(self, records: Iterable[CompileRecord]) -> None:
        """Add compilations (each once: an index already seen is skipped)."""
        for record in records:
            if record.index <= self._last_index:
                continue
            self._last_index = record.index
            self._compiles += 1
            if len(self.records) < MAX_RECORDS:
                self.records.append(record)
            key = (record.where, record.via)
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = CompileRow(record.where, record.via)
            row.add(record)

    @property
    def compiles(self) -> int:
        return self._compiles

    def rows(self) -> list[CompileRow]:
        """One row per user line, most graphs compiled first."""
        return sorted(self._rows.values(), key=lambda row: (-row.compiles, -row.compile_time))

    def largest(self) -> CompileRecord | None:
        """The compilation whose graph needs the most device memory."""
        candidates = [row.largest for row in self._rows.values() if row.largest is not None]
        return max(candidates, key=lambda record: record.memory or 0, default=None)

    def fetch_sites(self) -> list[ExecutionSite]:
        """Executions started by reading a tensor's value, per line, most first."""
        return [site for site in self.executions if site.fetched]
