"""Compilation tracing: torch_xla's own analysis of each compilation, switched on, read, parsed
and grouped by the user's line.

torch_xla reads `PT_XLA_DEBUG_LEVEL`, `PT_XLA_DEBUG_FILE` and `PT_XLA_DEBUG_MAX_FRAME` once,
at the first graph a process compiles or executes, not when it is imported or when its runtime
starts. So a forked worker can switch the analysis on for itself just before running the
user's function, as long as it has run no graph yet; and the kernel can do the same for
`%%xla_metrics` until its first graph.

- In a worker (`start_in_worker`, `rank_ended`): the analysis goes to a file of the launch's
  channel folder (never raw into the cell); a thread reads what was appended every
  `POLL_INTERVAL` seconds and sends `Compiled` events: each compilation once, with its compile
  time from torch_xla's `CompileTime` metric, and the execution sites counted per line.
- In the kernel (`begin_cell`): `%%xla_metrics` switches the analysis on for the kernel's life
  (torch_xla cannot switch it off again) and reads what the cell's graphs wrote; when the
  kernel already ran graphs without it, the panel says so in one line.

The text (`PT_XLA_DEBUG_LEVEL=2`: a block per compilation and per execution) is parsed by
`TraceParser`, fed in any pieces, into `CompileRecord`s and `Execution`s. Each names the first
frame in the user's own code (`Frame`, "`train` in cell 5, line 12": their notebook, script or
own modules, not Python's, an installed package's or hfxla_nb's) and, when the graph was cut
inside a library, the innermost library frame too. The text names no input and no shape, so
which input changed shape comes from `report(inputs=...)` alone.

`TraceLog` keeps one process's records and answers the compilations view's questions: which
lines compiled how many graphs, how many of them different, in how long and why; which graph
needs the most device memory; where values were read from the device inside the step.

torch_xla writes its analysis only in the process whose `PJRT_LOCAL_PROCESS_RANK` is 0: on a
TPU host with one process per chip, the compilations shown are those of the first process.
"""

from __future__ import annotations

import atexit
import codecs
import dataclasses
import os
import re
import site
import sysconfig
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _xla
from ..events import Channel, Compiled

# -- the records: a frame, a compilation, an execution --

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


# -- which frames are the user's --

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
# hfxla_nb's own thin wrapper of torch_xla (the package `_xla`) reports cuts, like torch_xla.
_XLA_WRAPPER = os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(__file__)), "_xla"))


def is_library(path: str) -> bool:
    """Whether a frame's file belongs to Python, an installed package or hfxla_nb (not to the
    user's notebook, script or own modules)."""
    if path.startswith("<frozen") or "/site-packages/" in path or "/dist-packages/" in path:
        return True
    if path.startswith("<"):  # <ipython-input-...>, <string>: the user's code
        return False
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in _LIBRARY_ROOTS)


_HFXLA_NB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.realpath(_HFXLA_NB)
_LAUNCHER = os.path.join(_HFXLA_NB, "launch")


def is_ours(path: str) -> bool:
    """Whether a frame's file is hfxla_nb's own."""
    return os.path.realpath(path).startswith(_PACKAGE + os.sep)


def is_launcher(path: str) -> bool:
    """Whether a frame's file is hfxla_nb's launcher (`hfxla_nb/launch/`). In a worker, the
    frames older than the launcher's are the notebook's as they were at the fork (a warm
    session's worker still holds the cell that started it): never where a job is."""
    return path.startswith(_LAUNCHER + os.sep)


def _is_internal(path: str) -> bool:
    """torch's and torch_xla's own frames (where the cut is reported, not made)."""
    if "_xla" in path and os.path.realpath(path).startswith(_XLA_WRAPPER + os.sep):
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


_FILE_LINE = re.compile(r'^(\s*)File "([^"]+)", line (\d+)', re.MULTILINE)
_IPYTHON7_CELL = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>")


def name_cells(traceback: str, cells: dict[str, int]) -> str:
    """A formatted traceback whose notebook-cell frames are named as IPython names them:
    `File "/tmp/ipykernel_7/2093.py", line 12, in train` becomes `Cell In[5], line 12, in
    train`. `cells` maps IPython's cell file names to execution counts
    (`launch.worker.cell_numbers`); IPython 7's `<ipython-input-5-...>` names carry it."""

    def rename(match: re.Match) -> str:
        indent, path, line = match.groups()
        count = cells.get(path)
        if count is None:
            ipython7 = _IPYTHON7_CELL.fullmatch(path)
            count = int(ipython7.group(1)) if ipython7 else None
        return match.group(0) if count is None else f"{indent}Cell In[{count}], line {line}"

    return _FILE_LINE.sub(rename, traceback)


# -- the analysis's text, parsed into records --

# Block prefixes of torch_xla/csrc/debug_util.cpp (torch_xla 2.5 to 2.9).
_COMPILE = "Compilation Analysis: "
_EXECUTE = "Execution Analysis: "
_UNEXPECTED = "Unexpected Execution Analysis: "
_POST = "Post Compilation Analysis: "
_COMPUTATION_HASH = "Computation hash: "
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
    """One block of PT_XLA_DEBUG's analysis, line by line: the first line under its cause
    heading, the graph's hash and input and output counts under "Graph Info", and each
    Python frame that parses (`_frame`); returns `(cause, graph_hash, inputs, outputs,
    frames)`, with "" or None for what the block does not say."""
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
            if frame is not None and is_launcher(frame.file):
                section = None  # the launcher's frames, then the cell that forked the worker
            elif frame is not None:
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


# -- the compilations view as data: records grouped by the user's line --

# Compile records kept for `records` (the rows keep counting past it).
MAX_RECORDS = 2000


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
    _first: dict = field(default_factory=dict, repr=False)  # graph hash -> its first index

    @property
    def graphs(self) -> int:
        return len(self._first)

    def graphs_since(self, index: int) -> int:
        """How many of the different graphs were first compiled here after the `index`-th
        compilation of the process (a new graph, not one compiled again)."""
        return sum(first > index for first in self._first.values())

    @property
    def cause(self) -> str:
        """The most frequent cause."""
        return self.causes.most_common(1)[0][0] if self.causes else ""

    @property
    def fetched(self) -> bool:
        return self.cause.startswith(FETCH_CAUSE)

    def place(self) -> str:
        """"`train` in cell 5, line 12 (via masking_utils.py:123 `f`)"; for a graph no line of
        the user's made, the library line: "library: evaluate.py:57 `run_batches`" (or
        "library code" when even that is unknown)."""
        if self.where is None:
            return f"library: {self.via.short()}" if self.via is not None else "library code"
        text = self.where.text()
        if self.via is not None:
            text += f" (via {self.via.short()})"
        return text

    def cause_words(self) -> str:
        """The most frequent cause in a few words (`cause_text`); a value a library fetched
        is not blamed on `.item()` or print, which the user did not write: what hfxla_nb's own
        code fetched or compiled ahead (torch_xla gives both that cause) is said to be its,
        even under the user's `fine_tune` line."""
        if self.fetched and self.via is not None and is_ours(self.via.file):
            return "hfxla_nb's own work, not your code"
        if self.where is None and self.fetched:
            return "value fetched by the library"
        return cause_text(self.cause)

    def add(self, record: CompileRecord) -> None:
        self.compiles += 1
        self.compile_time += record.compile_time or 0.0
        self.causes[record.cause] += 1
        if len(self._first) < MAX_HASHES:
            self._first.setdefault(record.graph_hash, record.index)
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

    def until(self, index: int) -> TraceLog:
        """The same log with only the compilations up to the `index`-th (those of the steps,
        without what compiled after the last one)."""
        log = TraceLog(self.device_memory, self.device_name, self.note, self.executions)
        log.add(record for record in self.records if record.index <= index)
        return log

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


# -- tracing: the analysis switched on and read, in a worker or the kernel --

#: Set to "0" in a worker's environment (the launcher's `trace_compiles=False`) to turn off.
SWITCH = "HFXLA_NB_TRACE_COMPILES"
POLL_INTERVAL = 0.5
# Executions alone (no new compilation) are sent at most this often.
EXECUTIONS_INTERVAL = 2.0
# A file we own is rotated past this size (each execution appends about 1 KB).
ROTATE_BYTES = 8 * 1024 * 1024
# Frames torch_xla prints per block (its default, 8, often stops inside transformers).
MAX_FRAMES = "40"

_LEVEL, _FILE, _MAX_FRAME = "PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG_MAX_FRAME"


class FileTail:
    """What was appended to a file torch_xla reopens (append mode) for every block.

    A file we own is rotated when large: renamed aside, read to its end at the next call (a
    block being written into it when renamed is complete by then), then removed.
    """

    def __init__(self, path: str, owned: bool, from_end: bool = False) -> None:
        self.path = path
        self.owned = owned
        self._offset = os.path.getsize(path) if from_end and os.path.exists(path) else 0
        self._rotated: str | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self) -> str:
        """The text appended since the last call."""
        data = b""
        if self._rotated is not None:
            data += self._read(self._rotated)
            os.unlink(self._rotated)
            self._rotated, self._offset = None, 0
        data += self._read(self.path)
        if self.owned and self._offset > ROTATE_BYTES:
            self._rotated = self.path + ".1"
            os.replace(self.path, self._rotated)
        return self._decoder.decode(data)

    def _read(self, path: str) -> bytes:
        try:
            with open(path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return b""
        self._offset += len(data)
        return data

    def remove(self) -> None:
        """Delete the file (and a rotated one) when we own it."""
        if not self.owned:
            return
        for path in (self.path, self._rotated):
            if path is not None:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


def _switch_on(path: str) -> dict[str, str | None]:
    """Set the variables torch_xla reads at its first graph; returns their previous values."""
    previous = {name: os.environ.get(name) for name in (_LEVEL, _FILE, _MAX_FRAME)}
    try:
        level = int(previous[_LEVEL] or 0)
    except ValueError:
        level = 0
    os.environ[_LEVEL] = str(max(level, 2))  # 2: executions too, not only compilations
    os.environ[_FILE] = path
    os.environ.setdefault(_MAX_FRAME, MAX_FRAMES)
    return previous


def _restore(previous: Mapping[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _users_file() -> str | None:
    """`PT_XLA_DEBUG_FILE` when the user set one torch_xla can write (its folder exists)."""
    path = os.environ.get(_FILE)
    if path and os.path.isdir(os.path.dirname(os.path.abspath(path))):
        return path
    return None


def with_compile_times(records: list[CompileRecord]) -> list[CompileRecord]:
    """The records with their seconds from torch_xla's `CompileTime` metric: the n-th
    compilation of a process is its n-th sample (the metric keeps the latest samples)."""
    if not records:
        return records
    count, samples = _xla.compile_times()
    first = count - len(samples)  # index (from 0) of the oldest sample held
    timed = []
    for record in records:
        position = record.index - 1 - first
        if 0 <= position < len(samples) and record.index <= count:
            record = dataclasses.replace(record, compile_time=samples[position])
        timed.append(record)
    return timed


def device_of(sys_root: str = "/", environ: Mapping[str, str] | None = None
              ) -> dict[str, Any] | None:
    """What one XLA device of this host has, from the hardware (no runtime): on a TPU,
    `{"memory": bytes, "name": "a v5e chip"}`; None elsewhere or when unknown."""
    from ..runtime.environment import accelerator_from_facts, scan_device_files, scan_pci

    # Not `detect_accelerator`: who else holds the chips does not matter here, and finding out
    # scans every process's descriptors.
    accelerator = accelerator_from_facts(scan_pci(sys_root), scan_device_files(sys_root),
                                         os.environ if environ is None else environ)
    if accelerator.kind != "tpu" or not accelerator.hbm_per_chip_gib:
        return None
    cores = max(accelerator.cores_per_chip, 1)
    generation = accelerator.generation or "TPU"
    name = f"a {generation} chip" if cores == 1 else (
        f"a {generation} core ({accelerator.hbm_per_chip_gib} GiB per chip of {cores} cores)")
    return {"memory": accelerator.hbm_per_chip_gib * 1024**3 // cores, "name": name}


# ---------------------------------------------------------------------------------------------
# In a worker
# ---------------------------------------------------------------------------------------------


class ProcessTracer:
    """Reads a worker process's analysis file and sends what it found as `Compiled` events."""

    def __init__(self, tail: FileTail, send: Callable[[Compiled], Any],
                 cells: Mapping[str, int] | None, device: dict[str, Any] | None) -> None:
        self.tail = tail
        self.send = send
        self.device = device
        self.parser = TraceParser(cells)
        self.sites: dict[tuple, list] = {}
        self.ranks: set[int] = set()
        self.running: set[int] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._executions_changed = False
        self._last_sent = float("-inf")
        self.previous: dict[str, str | None] = {}  # the variables before `_switch_on`

    def poll(self, final: bool = False) -> None:
        """Read, parse and send what torch_xla wrote since the last poll."""
        with self.lock:
            records, executions = self.parser.feed(self.tail.read())
            if final:
                records += self.parser.finish()
            if executions:
                tally_executions(executions, self.sites)
                self._executions_changed = True
            now = time.monotonic()
            due = self._executions_changed and now - self._last_sent >= EXECUTIONS_INTERVAL
            if not (records or due or (final and self._executions_changed)):
                return
            self._last_sent, self._executions_changed = now, False
            rank = min(self.ranks) if self.ranks else None
            self.send(Compiled(rank, os.getpid(), tuple(with_compile_times(records)),
                               execution_sites(self.sites), self.device))

    def run(self) -> None:
        """The polling thread's body; a failure stops tracing, never the training."""
        while not self.stop.wait(POLL_INTERVAL):
            try:
                self.poll()
            except Exception as error:  # noqa: BLE001
                warnings.warn(f"hfxla_nb: compilation tracing stopped: {error!r}",
                              RuntimeWarning, stacklevel=1)
                return


_tracer: ProcessTracer | None = None
_tracer_pid: int | None = None
_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _tracer, _tracer_pid, _lock
    _tracer, _tracer_pid, _lock = None, None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def start_in_worker(channel: Channel, rank: int, cells: Mapping[str, int] | None = None,
                    ) -> bool:
    """Switch torch_xla's analysis on in this worker process (once per process, any rank
    thread) before the user's function runs; returns whether this process is traced.

    Off when `HFXLA_NB_TRACE_COMPILES=0`, in processes other than torch_xla's local process 0
    (it writes nothing there), and where a graph already ran (too late to switch on).
    """
    global _tracer, _tracer_pid
    with _lock:
        if _tracer_pid == os.getpid():
            if _tracer is not None:
                with _tracer.lock:
                    _tracer.ranks.add(rank)
                    _tracer.running.add(rank)
            return _tracer is not None
        _tracer_pid = os.getpid()
        if os.environ.get(SWITCH, "1") == "0" or _xla.graphs_ran():
            return False
        if os.environ.get("PJRT_LOCAL_PROCESS_RANK", "0") not in ("", "0"):
            return False
        users = _users_file()  # the user's own file: read it, leave it in place
        path = users or channel.scratch_path(f"xla-analysis-{os.getpid()}.log")
        previous = _switch_on(path)
        tail = FileTail(path, owned=users is None, from_end=bool(users))
        _tracer = ProcessTracer(tail, channel.send, cells, device_of())
        _tracer.previous = previous
        _tracer.ranks.add(rank)
        _tracer.running.add(rank)
        threading.Thread(target=_tracer.run, name="hfxla_nb-compile-trace", daemon=True).start()
        return True


def rank_ended(rank: int, keep: bool = False) -> None:
    """`rank` returned or raised: when it was the last running rank of this process, read
    and send the rest of the analysis (before the rank's `Finished` or `Failed`).

    `keep`: the process stays for more jobs (a warm session): the tracer goes on reading,
    and the next job's first rank starts it again with `new_job`."""
    tracer = _tracer if _tracer_pid == os.getpid() else None
    if tracer is None:
        return
    with tracer.lock:
        tracer.running.discard(rank)
        last = not tracer.running
    if not last:
        return
    if not keep:
        tracer.stop.set()
    try:
        tracer.poll(final=True)
    except Exception as error:  # noqa: BLE001 - the rank's outcome matters more
        warnings.warn(f"hfxla_nb: could not read the compilation analysis: {error!r}",
                      RuntimeWarning, stacklevel=2)
    finally:
        if not keep:
            # torch_xla read them already; processes this one starts see the user's settings.
            _restore(tracer.previous)


def new_job(cells: Mapping[str, int]) -> None:
    """A warm session's next job starts in this process: its compilations and executions are
    counted from none, as in a new process (the tracer itself goes on); `cells` names the
    notebook's cells run since."""
    tracer = _tracer if _tracer_pid == os.getpid() else None
    if tracer is None:
        return
    with tracer.lock:
        tracer.parser.cells.update(cells)
        tracer.sites = {}
        tracer._executions_changed = False


# ---------------------------------------------------------------------------------------------
# In the kernel: %%xla_metrics
# ---------------------------------------------------------------------------------------------

TOO_LATE = (
    "Compilations are not traced in this kernel: it ran XLA graphs before the first "
    "%%xla_metrics cell, and torch_xla reads PT_XLA_DEBUG_LEVEL only at its first graph. "
    "Restart the kernel and run %%xla_metrics first to see the line behind each compilation."
)


@dataclasses.dataclass
class _KernelState:
    tail: FileTail
    parser: TraceParser


_kernel: _KernelState | None = None


class CellTrace:
    """The analysis of one `%%xla_metrics` cell: `begin_cell()` before it, `end()` after."""

    def __init__(self, state: _KernelState | None, previous: Mapping[str, str | None] | None,
                 note: str | None, fresh: bool) -> None:
        self._state = state
        self._previous = previous
        self._note = note
        self._fresh = fresh  # this cell switched the analysis on

    def end(self) -> TraceLog | None:
        """What the cell's graphs compiled and executed (None when tracing is off)."""
        global _kernel
        state = self._state
        if state is None:
            return TraceLog(note=self._note) if self._note else None
        try:
            records, executions = state.parser.feed(state.tail.read())
            records += state.parser.finish()
            device = device_of() or {}
            log = TraceLog(device_memory=device.get("memory"), device_name=device.get("name"))
            log.add(with_compile_times(records))
            log.executions = execution_sites(tally_executions(executions))
        finally:
            if self._previous is not None:
                _restore(self._previous)
            if self._fresh and not _xla.graphs_ran():
                _kernel = None  # nothing ran: torch_xla has not read the variables yet
                state.tail.remove()
        return log


def begin_cell(cells: Mapping[str, int] | None = None) -> CellTrace:
    """Before a `%%xla_metrics` cell: switch the analysis on in this kernel if it still can
    be, and mark where the cell's part of it begins."""
    global _kernel
    if os.environ.get(SWITCH, "1") == "0":
        return CellTrace(None, None, None, False)
    if _kernel is not None:
        _kernel.parser.cells.update(cells or {})
        _kernel.parser.feed(_kernel.tail.read())  # what other cells ran: not this cell's
        _kernel.parser.finish()
        return CellTrace(_kernel, None, None, False)
    if _xla.graphs_ran():
        users = os.environ.get(_FILE)
        if users and os.environ.get(_LEVEL, "0") not in ("", "0"):
            # Switched on by the user before the kernel's first graph: read their file.
            _kernel = _KernelState(FileTail(users, owned=False, from_end=True),
                                   TraceParser(cells))
            return CellTrace(_kernel, None, None, False)
        return CellTrace(None, None, TOO_LATE, False)
    users = _users_file()  # the user's own file: read it, leave it in place
    if users:
        tail = FileTail(users, owned=False, from_end=True)
    else:
        fd, path = tempfile.mkstemp(prefix="hfxla_nb-xla-analysis-", suffix=".log")
        os.close(fd)
        tail = FileTail(path, owned=True)
        atexit.register(tail.remove)
    previous = _switch_on(tail.path)
    _kernel = _KernelState(tail, TraceParser(cells))
    return CellTrace(_kernel, previous, None, True)
