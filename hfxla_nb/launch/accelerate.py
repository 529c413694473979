"""accelerate in a launch: `notebook_launcher`'s accelerate parameters, and accelerate's state
in a debug process.

accelerate's own `notebook_launcher` hands its parameters to torchelastic; here one host forks
its workers. So each parameter either acts (restarts, the supervision loop's period, the debug
strategy's gloo rendezvous, the output prefix), is refused when it asks for what one host
cannot do (several nodes), or is accepted and ignored with one line saying so. Everything is
checked in the kernel before anything is forked.

In a `strategy="debug"` process, `PartialState` must see the gloo world, not XLA's. accelerate
picks its XLA backend whenever torch_xla can be imported, and then every debug process (an
XLA:CPU client of its own) said "process 0 of 1"; neither `ACCELERATE_USE_CPU` nor
`USE_TORCH_XLA=0` helps. So each debug process, once its gloo group is up, makes accelerate's
state itself, as accelerate's `debug_launcher` would: `PartialState(cpu=True)` with
`is_torch_xla_available` answering False while it is made (patched in this process only, and
restored). Later `PartialState()` and `Accelerator()` calls share it. Where the function
imports accelerate itself, this happens when `accelerate.state` is first imported (an import
hook), so a launch that never uses accelerate pays nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import string
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .preflight import LaunchRefusedError

# -- accelerate's launcher parameters, checked in the kernel --

#: accelerate's defaults (1.14, 1.15) for the parameters after its first four. `use_port` is
#: the one default kept different: None picks a free port (accelerate's "29500" is taken as
#: soon as two launches or two users share a machine); an explicit port is used as given.
ACCELERATE_DEFAULTS: dict[str, Any] = {
    "use_port": "29500",
    "master_addr": "127.0.0.1",
    "node_rank": 0,
    "num_nodes": 1,
    "rdzv_backend": "static",
    "rdzv_endpoint": "",
    "rdzv_conf": None,
    "rdzv_id": "none",
    "max_restarts": 0,
    "monitor_interval": 0.1,
    "log_line_prefix_template": None,
}

# torchelastic's placeholders in `log_line_prefix_template`.
_TEMPLATE_FIELDS = {"rank", "local_rank", "role_name"}

_said: set[str] = set()  # notes already said in this process (each is said once)


@dataclass
class AccelerateOptions:
    """What accelerate's parameters mean for one launch.

    Attributes:
        max_attempts: `max_restarts + 1`.
        monitor_interval: seconds between two looks of the supervision loop at its workers.
        rendezvous: (address, port) of the debug strategy's gloo rendezvous; port None
            means a free one, chosen for each attempt.
        line_prefix: `log_line_prefix_template`, or None for the default `[rank N] `.
        notes: one line per parameter accepted without effect.
    """

    max_attempts: int = 1
    monitor_interval: float = 0.1
    rendezvous: tuple[str, int | None] = ("127.0.0.1", None)
    line_prefix: str | None = None
    notes: list[str] = field(default_factory=list)

    def prefix(self, rank: int) -> str:
        """The prefix of a line printed by `rank` (this launcher runs one node: the local
        rank is the rank)."""
        assert self.line_prefix is not None
        return string.Template(self.line_prefix).safe_substitute(
            rank=rank, local_rank=rank, role_name="default")


def check_accelerate_options(
    strategy: str,
    *,
    use_port: str | int | None,
    master_addr: str,
    node_rank: int,
    num_nodes: int,
    rdzv_backend: str,
    rdzv_endpoint: str,
    rdzv_conf: dict | None,
    rdzv_id: str,
    max_restarts: int,
    monitor_interval: float,
    log_line_prefix_template: str | None,
    cluster: bool = False,
) -> AccelerateOptions:
    """Check accelerate's parameters and say what they mean here (before any fork).

    `cluster`: the launch runs on several hosts (`cluster=`/`hosts=`), whose rendezvous
    uses `use_port` too: no note about it.

    Raises:
        LaunchRefusedError: a value that cannot work (a negative `max_restarts`, a
            `monitor_interval` that is not a positive number, a bad port or endpoint, a
            template with unknown fields), or several nodes (`num_nodes > 1`).
    """
    options = AccelerateOptions()
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise LaunchRefusedError(
            f"max_restarts must be a whole number >= 0 (how many times the function is "
            f"relaunched after a failure), got {max_restarts!r}.")
    options.max_attempts = max_restarts + 1
    if (isinstance(monitor_interval, bool) or not isinstance(monitor_interval, (int, float))
            or not monitor_interval > 0):
        raise LaunchRefusedError(
            f"monitor_interval must be a positive number of seconds (how often the launcher "
            f"looks at its workers), got {monitor_interval!r}.")
    options.monitor_interval = float(monitor_interval)
    _check_nodes(node_rank, num_nodes)
    address, port = _rendezvous(use_port, master_addr, rdzv_endpoint)
    options.rendezvous = (address, port)
    if log_line_prefix_template is not None:
        options.line_prefix = _check_template(log_line_prefix_template)

    ignored = [
        f"{name}={value!r}" for name, value in (("rdzv_backend", rdzv_backend),
                                                ("rdzv_id", rdzv_id), ("rdzv_conf", rdzv_conf))
        if value != ACCELERATE_DEFAULTS[name] and not (name == "rdzv_conf" and value == {})
    ]
    if ignored:
        options.notes.append(
            f"{', '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} no meaning for a "
            "single-host fork launch; ignored.")
    rendezvous_given = [
        f"{name}={value!r}" for name, value, default in (
            ("use_port", use_port, None), ("master_addr", master_addr, "127.0.0.1"),
            ("rdzv_endpoint", rdzv_endpoint, ""))
        if value not in (default, ACCELERATE_DEFAULTS[name])
    ]
    if rendezvous_given and strategy != "debug" and not cluster:
        options.notes.append(
            f"{', '.join(rendezvous_given)}: the gloo rendezvous of strategy='debug' only; "
            f"strategy={strategy!r} needs none (its processes find each other); ignored.")
    return options


def say_notes(options: AccelerateOptions, stacklevel: int) -> None:
    """Say each note once in this process (a `UserWarning` at the caller's line)."""
    for note in options.notes:
        if note not in _said:
            _said.add(note)
            warnings.warn(f"hfxla_nb: {note}", UserWarning, stacklevel=stacklevel + 1)


def _check_nodes(node_rank: int, num_nodes: int) -> None:
    for name, value in (("node_rank", node_rank), ("num_nodes", num_nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LaunchRefusedError(f"{name} must be a whole number >= 0, got {value!r}.")
    if node_rank >= num_nodes:
        raise LaunchRefusedError(
            f"node_rank={node_rank} must be less than num_nodes={num_nodes}.")
    if num_nodes > 1:
        raise LaunchRefusedError(
            f"num_nodes={num_nodes}: notebook_launcher starts processes on this host only. "
            "Leave num_nodes=1 here; to run on several hosts of a Ray cluster (a TPU pod "
            "slice), pass cluster= and hosts= instead.")


def _rendezvous(use_port: str | int | None, master_addr: str,
                endpoint: str) -> tuple[str, int | None]:
    """(address, port) of the debug rendezvous: `rdzv_endpoint` ("host:port") when given, as
    accelerate's static rendezvous does, else `master_addr` and `use_port`."""
    if not isinstance(master_addr, str) or not master_addr:
        raise LaunchRefusedError(f"master_addr must be a host name or address, got "
                                 f"{master_addr!r}.")
    if endpoint:
        host, _, port_text = str(endpoint).rpartition(":")
        if not host:
            raise LaunchRefusedError(
                f"rdzv_endpoint={endpoint!r}: write it as 'host:port' (e.g. '127.0.0.1:29500').")
        return host, _port(port_text, "rdzv_endpoint's port")
    return master_addr, None if use_port in (None, "") else _port(use_port, "use_port")


def _port(value: str | int, name: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise LaunchRefusedError(f"{name} must be a TCP port (1-65535), got {value!r}.")
    return port


def _check_template(template: str) -> str:
    if not isinstance(template, str):
        raise LaunchRefusedError(
            f"log_line_prefix_template must be a string such as '[${{rank}}]: ', got "
            f"{template!r}.")
    try:
        names = {groups[1] or groups[2] for groups in
                 string.Template.pattern.findall(template) if groups[1] or groups[2]}
    except ValueError:  # pragma: no cover - findall does not raise
        names = set()
    unknown = names - _TEMPLATE_FIELDS
    if unknown:
        raise LaunchRefusedError(
            f"log_line_prefix_template={template!r}: unknown field(s) "
            f"{', '.join(sorted(unknown))}; use ${{rank}}, ${{local_rank}} or ${{role_name}}.")
    return template


# -- accelerate's state in a debug process: the gloo world --

MODULE = "accelerate.state"


def gloo_world_for_accelerate() -> None:
    """In a process of `strategy="debug"`, after its gloo process group is initialized:
    accelerate's `PartialState` (and `Accelerator`) report that group's rank and world, now
    if accelerate is imported, else when it first is."""
    os.environ.setdefault("ACCELERATE_USE_CPU", "yes")
    module = sys.modules.get(MODULE)
    if module is not None:
        _make_state(module)
    elif importlib.util.find_spec("accelerate") is not None:
        sys.meta_path.insert(0, _AfterImport(MODULE, _make_state))


def forget_thread_state() -> None:
    """Start this rank thread with none of accelerate's state, where accelerate is loaded.

    Under PyTorch/XLA accelerate keeps `PartialState`, `AcceleratorState` and `GradientState`
    per thread (a `threading.local` descriptor). xmp.spawn runs rank threads from a thread
    pool, which gives a thread that finished its rank the next one when the other threads
    have not started yet (a loaded machine): that rank found the first's state, and its
    `process_index` with it.
    """
    module = sys.modules.get(MODULE)
    for name in ("PartialState", "AcceleratorState", "GradientState"):
        holder = getattr(module, name, None)
        descriptor = vars(holder).get("_shared_state") if holder is not None else None
        if isinstance(descriptor, threading.local):  # never a process-wide dict
            holder._shared_state.clear()


def _make_state(module: ModuleType) -> None:
    """`PartialState(cpu=True)` over the existing gloo group, unless a state exists."""
    try:
        state_class = module.PartialState
        if state_class._shared_state:  # made already: leave it as it is
            return
        original = module.is_torch_xla_available
        module.is_torch_xla_available = _no_xla
        try:
            with warnings.catch_warnings():
                # "OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at N": once per rank
                warnings.filterwarnings("ignore", message="OMP_NUM_THREADS")
                state_class(cpu=True)
        finally:
            module.is_torch_xla_available = original
    except Exception as error:  # noqa: BLE001 - accelerate's own state stays as it would be
        warnings.warn(f"hfxla_nb could not give accelerate the debug launch's gloo world: "
                      f"{error!r}", RuntimeWarning, stacklevel=2)


def _no_xla(*_: Any, **__: Any) -> bool:
    return False


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once `name` is imported (then steps out of the import system)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        then = self.then

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            then(module)

        loader.exec_module = exec_then  # this module's loader instance only
        return spec
