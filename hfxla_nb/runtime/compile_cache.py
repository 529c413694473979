"""The persistent compile cache, managed: where it lives, its key, its size, its safety.

torch_xla writes every compiled program to the folder given to
`torch_xla.runtime.initialize_cache` and loads it back instead of compiling when the same graph
comes again, in a later process: minutes saved per restart on a TPU. hfxla_nb manages it:

- **Where.** On by default on TPU hosts, in a per-environment folder (`default_root`):
  Kaggle's working folder, Colab's `/content`, `~/.cache/hfxla_nb/xla` elsewhere.
  `hx.configure(compile_cache=...)` or `notebook_launcher(..., compile_cache=...)` choose
  another folder, turn it on elsewhere, or off.
- **Key.** A subfolder per torch_xla and libtpu version and device kind (`cache_key`), and in
  it one per compiler flags (`flags_folder`), so an entry made by another version or with
  other flags is never loaded; with one process per chip, one subfolder per process
  (torch_xla's own advice for multiprocessing).
- **Size.** At most `DEFAULT_LIMIT_GIB` (`compile_cache_gib=`): the oldest entries are removed
  when a worker starts and when it ends.
- **Safety.** A cached program is executed as the user's own, so the folder is created
  owner-only and a folder that other users can write to is refused.

On XLA:CPU torch_xla writes the entries but cannot load them back ("Deserializing serialized
executable not supported"): the cache is off there unless asked for, and that warning
becomes one line (`native_line`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import threading
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _xla

if TYPE_CHECKING:
    from .environment import Accelerator

#: What `configure(compile_cache=...)` sets: a folder, "on" (the default folder) or "off".
SETTING = "HFXLA_NB_COMPILE_CACHE"
LIMIT = "HFXLA_NB_COMPILE_CACHE_GIB"
#: What the launcher sets in workers: the keyed folder, and whether each process has its own.
FOLDER = "HFXLA_NB_COMPILE_CACHE_DIR"
PER_PROCESS = "HFXLA_NB_COMPILE_CACHE_PER_PROCESS"
DEFAULT_LIMIT_GIB = 10.0
KAGGLE_LIMIT_GIB = 4.0  # /kaggle/working holds 20 GB for everything a notebook writes
_GIB = 1024**3
# What torch_xla logs on XLA:CPU for every entry it finds but cannot load.
CPU_LOAD_WARNING = "Deserializing serialized executable not supported"
CPU_LOAD_LINE = (
    "hfxla_nb: the compile cache has entries for these graphs, but XLA on the CPU cannot load "
    "compiled programs back (only write them), so it compiled them again; on a TPU the same "
    "cache skips these compilations."
)


class CompileCacheRefusedError(ValueError):
    """The compile cache folder is not safe to load programs from (others can write to it)."""


@dataclass(frozen=True)
class CacheSettings:
    """Where a launch's compile cache is, and how large it may grow.

    Attributes:
        root: the folder the user chose (or the default one).
        folder: `root/<key>`, where the entries go.
        limit: bytes the folder may hold.
    """

    root: str
    folder: str
    limit: int


def default_root(environment: str, home: str | None = None) -> str:
    """The cache folder of an environment: Kaggle's working folder (kept with the notebook's
    output), Colab's `/content`, `~/.cache/hfxla_nb/xla` elsewhere."""
    if environment == "kaggle":
        return "/kaggle/working/.cache/hfxla_nb/xla"
    if environment == "colab":
        return "/content/.cache/hfxla_nb/xla"
    home = home or os.path.expanduser("~")
    return os.path.join(home, ".cache", "hfxla_nb", "xla")


def cache_key(versions: Mapping[str, str | None], accelerator: Accelerator) -> str:
    """`torch_xla-2.9.0_libtpu-0.0.21.1_tpu-v5e` (`torch_xla-2.9.0_cpu` without a TPU). Each
    worker adds a subfolder for its compiler flags (`flags_folder`)."""
    parts = [f"torch_xla-{versions.get('torch_xla') or 'unknown'}"]
    if accelerator.kind == "tpu":
        parts.append(f"libtpu-{versions.get('libtpu') or 'unknown'}")
        parts.append(f"tpu-{accelerator.generation or 'unknown'}")
    else:
        parts.append(accelerator.kind)
    return "_".join(part.replace(os.sep, "-").replace(" ", "-") for part in parts)


def flags_folder(flags: Mapping[str, str]) -> str:
    """`flags-<hash>` of XLA_FLAGS and LIBTPU_INIT_ARGS: compiler flags change the program,
    and torch_xla's own cache key ignores them (pytorch/xla #7169). Read in the worker after
    torch_xla's import added its defaults, so a kernel that imported torch_xla and one that did
    not give the same folder."""
    text = "\n".join(" ".join(flags.get(name, "").split())
                     for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"))
    return "flags-" + hashlib.sha256(text.encode()).hexdigest()[:8]


def _limit(environ: Mapping[str, str], environment: str) -> int:
    value = environ.get(LIMIT)
    default = KAGGLE_LIMIT_GIB if environment == "kaggle" else DEFAULT_LIMIT_GIB
    try:
        gib = float(value) if value else default
    except ValueError:
        gib = default
    return int(max(gib, 0.0) * _GIB)


def resolve(setting: bool | str | os.PathLike | None, *, accelerator: Accelerator, environment: str,
            versions: Mapping[str, str | None], environ: Mapping[str, str],
            home: str | None = None) -> CacheSettings | None:
    """The cache a launch uses, or None when it is off.

    Args:
        setting: None (what `hx.configure` chose, else on for TPU hosts only), True (the
            default folder, also on the CPU), False (off) or a folder.
        accelerator, environment, versions: from `detect()`.
        environ: the kernel's variables (`HFXLA_NB_COMPILE_CACHE`, `..._GIB`, XLA_FLAGS...).

    Raises:
        CompileCacheRefusedError: the folder, or the folder that holds it, can be written by
            other users.
    """
    if setting is None:
        configured = environ.get(SETTING, "").strip()
        if configured.lower() in ("", "auto"):
            setting = accelerator.kind == "tpu"
        elif configured.lower() in ("off", "0", "false"):
            setting = False
        elif configured.lower() in ("on", "1", "true"):
            setting = True
        else:
            setting = configured
    if setting is False:
        return None
    home = home or environ.get("HOME")
    root = default_root(environment, home) if setting is True else os.fspath(setting)
    root = os.path.abspath(os.path.expanduser(root))
    folder = os.path.join(root, cache_key(versions, accelerator))
    for path in (root, folder):
        check_folder(path)
    return CacheSettings(root, folder, _limit(environ, environment))


def describe(*, accelerator: Accelerator, environment: str, versions: Mapping[str, str | None],
             environ: Mapping[str, str], home: str | None = None) -> str:
    """Where launches keep compiled programs, in one line for `%xla_info`."""
    try:
        settings = resolve(None, accelerator=accelerator, environment=environment,
                           versions=versions, environ=environ, home=home)
    except CompileCacheRefusedError as error:
        return f"refused: {error}"
    if settings is None:
        if accelerator.kind == "tpu":
            return "off (hx.configure(compile_cache=True) turns it on)"
        return ("off: XLA on the CPU cannot load compiled programs back "
                "(hx.configure(compile_cache=True) writes them anyway); on by default on TPUs")
    found = entries(settings.folder)
    size = sum(entry[1] for entry in found)
    return (f"{settings.folder} ({len(found)} {'entry' if len(found) == 1 else 'entries'}, "
            f"{size / _GIB:.2f} GiB of {settings.limit / _GIB:g} GiB)")


def check_folder(path: str) -> None:
    """Refuse a cache folder that someone else could plant a program in: one owned by another
    user or writable by group or others, or, before it exists, an existing parent writable by
    others without the sticky bit (they could put their own folder in its place)."""
    probe = path
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    info = os.stat(probe)
    if probe == path:
        if info.st_uid != os.getuid():
            raise CompileCacheRefusedError(
                f"The compile cache folder {path} belongs to another user, and a program put "
                "there would run as yours. Use a folder of your own: "
                "hx.configure(compile_cache='~/.cache/hfxla_nb/xla')."
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CompileCacheRefusedError(
                f"The compile cache folder {path} can be written by other users (mode "
                f"{stat.S_IMODE(info.st_mode):o}), and a program put there would run as yours. "
                f"Make it yours only (chmod 700 {path}) or use another folder."
            )
    elif info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise CompileCacheRefusedError(
            f"The compile cache would be created in {probe}, which every user can write to: "
            "another user could create the cache folder first. Choose a folder inside your "
            "home: hx.configure(compile_cache='~/.cache/hfxla_nb/xla')."
        )


def prepare(folder: str) -> str:
    """Create `folder` and every missing folder above it owner-only, and check it; returns
    it. (`os.makedirs` gives only the last one the mode.)"""
    missing = []
    path = os.path.abspath(folder)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    check_folder(folder)
    return folder


def entries(folder: str) -> list[tuple[float, int, str]]:
    """(modification time, bytes, path) of each entry, oldest first."""
    found = []
    try:
        scanner = os.scandir(folder)
    except FileNotFoundError:
        return []
    with scanner:
        for entry in scanner:
            try:
                if entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    found.append((info.st_mtime, info.st_size, entry.path))
            except FileNotFoundError:
                continue
    return sorted(found)


def evict(folder: str, limit: int) -> tuple[int, int]:
    """Remove the oldest entries until the folder holds at most `limit` bytes; returns
    (entries removed, bytes freed)."""
    found = entries(folder)
    total = sum(size for _, size, _ in found)
    removed = freed = 0
    for _, size, path in found:
        if total <= limit:
            break
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        total -= size
        removed += 1
        freed += size
    return removed, freed


def status(folder: str, limit: int | None = None) -> dict[str, Any]:
    """`{"folder", "entries", "bytes", "limit"}` of a cache folder now."""
    found = entries(folder)
    return {"folder": folder, "entries": len(found), "bytes": sum(s for _, s, _ in found),
            "limit": limit}


def worker_env(settings: CacheSettings | None, per_process: bool) -> dict[str, str | None]:
    """The variables a launch's workers get for its cache (None: removed)."""
    if settings is None:
        return {FOLDER: None, PER_PROCESS: None}
    return {FOLDER: settings.folder, LIMIT: str(settings.limit / _GIB),
            PER_PROCESS: "1" if per_process else None}


def native_line(line: str, seen: MutableMapping[str, bool]) -> str | None:
    """torch_xla's XLA:CPU load warning becomes `CPU_LOAD_LINE`, once per launch (`seen`
    holds that state); other lines pass unchanged. None: drop the line."""
    if CPU_LOAD_WARNING not in line:
        return line
    if seen.get("cpu-load"):
        return None
    seen["cpu-load"] = True
    return CPU_LOAD_LINE + "\n"


# ---------------------------------------------------------------------------------------------
# In a worker
# ---------------------------------------------------------------------------------------------

_active: dict[str, Any] | None = None
_started_pid: int | None = None
_lock = threading.Lock()


def start_in_worker(rank: int) -> str | None:
    """Set up this worker process's cache before its first compilation (once per process;
    rank threads of one process share it); returns its folder, or None when off."""
    global _active, _started_pid
    folder = os.environ.get(FOLDER)
    with _lock:
        if _started_pid == os.getpid():
            return _active["folder"] if _active else None
        _started_pid = os.getpid()
        _active = None
        if not folder or _xla.computation_cache_initialized():
            return None
        folder = os.path.join(folder, flags_folder(_xla.compiler_flags()))
        if os.environ.get(PER_PROCESS) == "1":
            index = os.environ.get("PJRT_LOCAL_PROCESS_RANK") or os.environ.get("RANK")
            folder = os.path.join(folder, f"process-{index or rank}")
        limit = int(float(os.environ.get(LIMIT) or DEFAULT_LIMIT_GIB) * _GIB)
        try:
            prepare(folder)
            evict(folder, limit)
            _xla.initialize_cache(folder, readonly=False)
        except (OSError, CompileCacheRefusedError) as error:
            print(f"hfxla_nb: compile cache off: {error}", file=sys.stderr)
            return None
        _active = {"folder": folder, "limit": limit}
        return folder


# Seconds a worker reuses its last look at the folder (snapshots come every few seconds).
STATUS_INTERVAL = 5.0


def worker_status(fresh: bool = False) -> dict[str, Any] | None:
    """This worker's cache folder (entries, bytes, limit), looked at most every
    `STATUS_INTERVAL` seconds unless `fresh`; None when it has none."""
    if _active is None or _started_pid != os.getpid():
        return None
    now = time.monotonic()
    if fresh or now - _active.get("seen", float("-inf")) >= STATUS_INTERVAL:
        _active["status"] = status(_active["folder"], _active["limit"])
        _active["seen"] = now
    return dict(_active["status"])


def finish_in_worker() -> None:
    """At the end of the worker: keep the folder under its limit; the next status looks
    at the folder again (the final metrics count the entries this run wrote)."""
    if _active is not None and _started_pid == os.getpid():
        evict(_active["folder"], _active["limit"])
        _active["seen"] = float("-inf")
