"""Compilation tracing: switch torch_xla's own analysis on, read it, send it as events.

torch_xla reads `PT_XLA_DEBUG_LEVEL`, `PT_XLA_DEBUG_FILE` and `PT_XLA_DEBUG_MAX_FRAME` once,
at the first graph a process compiles or executes (C++ function-level statics in
`torch_xla/csrc/debug_util.cpp`), not when it is imported or when its runtime starts. So a
forked worker can switch the analysis on for itself just before running the user's function,
even when the kernel imported torch_xla, as long as the worker has run no graph yet; and the
kernel can do the same for `%%xla_metrics` until its first graph.

- In a worker (`start_in_worker`, `rank_ended`): the analysis goes to a file of the launch's
  channel folder (never raw into the cell); a thread reads what was appended every
  `POLL_INTERVAL` seconds, parses it (`compile_trace`) and sends `Compiled` events: each
  compilation once, with its compile time from torch_xla's `CompileTime` metric, and the
  execution sites counted per line. The last rank of the process to end reads the rest.
- In the kernel (`begin_cell`): `%%xla_metrics` switches the analysis on for the kernel's
  life (torch_xla cannot switch it off again) and reads what the cell's graphs wrote; when
  the kernel already ran graphs without it, the panel says so in one line.

torch_xla writes its analysis only in the process whose `PJRT_LOCAL_PROCESS_RANK` is 0: on a
TPU host with one process per chip, the compilations shown are those of the first process.
"""

from __future__ import annotations

import atexit
import codecs
import dataclasses
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from .. import _xla
from ..events import Channel, Compiled
from .compile_records import CompileRecord
from .compile_trace import TraceParser, execution_sites, tally_executions
from .trace_log import TraceLog

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
    from ..runtime.hardware import accelerator_from_facts, scan_device_files, scan_pci

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


def rank_ended(rank: int) -> None:
    """`rank` returned or raised: when it was the last running rank of this process, read
    and send the rest of the analysis (before the rank's `Finished` or `Failed`)."""
    tracer = _tracer if _tracer_pid == os.getpid() else None
    if tracer is None:
        return
    with tracer.lock:
        tracer.running.discard(rank)
        last = not tracer.running
    if not last:
        return
    tracer.stop.set()
    try:
        tracer.poll(final=True)
    except Exception as error:  # noqa: BLE001 - the rank's outcome matters more
        warnings.warn(f"hfxla_nb: could not read the compilation analysis: {error!r}",
                      RuntimeWarning, stacklevel=2)
    finally:
        # torch_xla read them already; processes this one starts see the user's settings.
        _restore(tracer.previous)


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
