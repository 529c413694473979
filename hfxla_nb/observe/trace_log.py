"""The compilations view as data: a process's `CompileRecord`s grouped by the user's line.

`TraceLog` keeps what `observe.tracing` read from torch_xla's analysis for one process (each
compilation once, the execution sites as counted), and answers the panel's questions: which
lines compiled how many graphs, how many of them different, in how long and why; which graph
needs the most device memory; where values were read from the device inside the step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from .compile_records import (
    FETCH_CAUSE,
    MAX_HASHES,
    CompileRecord,
    ExecutionSite,
    Frame,
    cause_text,
)

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
        is not blamed on `.item()` or print, which the user did not write (#28, item 9)."""
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
