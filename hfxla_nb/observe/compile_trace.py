"""PyTorch/XLA's own compilation analysis (`PT_XLA_DEBUG_LEVEL=2`), parsed into records.

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

`TraceParser` turns that text, fed in any pieces, into `CompileRecord`s and `Execution`s
(`compile_records`); each names the first frame in the user's own code (`Frame`, "`train` in
cell 5, line 12") and, when the graph was cut inside a library (transformers' mask check,
Trainer), the innermost library frame too (`trace_log.TraceLog` groups them by user line:
the compilations view). Plain data in, plain data out: the file is read by `observe.tracing`.

The text names no input and no shape (only how many inputs a graph has and their total
size), so which input changed shape comes from `report(inputs=...)` alone (see
`alert_words.INPUTS_HINT`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .compile_records import MAX_HASHES, CompileRecord, Execution, ExecutionSite, Frame
from .user_frames import locate

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
