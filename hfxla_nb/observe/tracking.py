"""Experiment tracking (`report_to=`): a launch's events written to TensorBoard or W&B, in the
notebook process.

The tracker follows the same events as the panels (`LaunchReader` hands it each one), so it
adds no device sync and nothing runs in the workers for it:

- a `Progress` event's values: `<label>/<name>` at its step (`train/loss`, `train/lr`, the
  values a user's `hx.report(...)` sends), with `<label>/samples_per_second` at each logging
  point (the bar's steady rate, `observe.reader.steady_rates`);
- a `MetricsSnapshot`: `xla/compiles`, `xla/executions`, `xla/transfers_from_device`,
  `xla/transfers_to_device` and `xla/compile_seconds` at its step (the latest reading of
  each step);
- `finish(step, figures)`: the run's final figures (`fine_tune`'s evaluation metrics,
  throughput, compile and transfer counts).

Rank 0's events only, as `transformers.Trainer` logs from its main process. The names are
checked in the kernel before the fork (`check_report_to`). The writers are each library's own
(TensorBoard through `torch.utils.tensorboard`, W&B through `wandb`), given a
`TrackingSettings`; this is the only module that imports either library, and only when a
writer is made: at a launch's first value, after the fork.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..events import Event, MetricsSnapshot, Progress, Started
from .metrics import summarize
from .reader import BarTrack, advance, snapshot_ranks, steady_rates

# -- the writers: TensorBoard and W&B --

#: What a hyper-parameter can be in every tracker.
HParam = str | int | float | bool | None


@dataclass(frozen=True)
class TrackingSettings:
    """What a launch reports to, and with which names.

    Attributes:
        report_to: the trackers (`check_report_to`'s names).
        log_dir: TensorBoard's folder for this run's event files.
        project: the W&B project (None: `WANDB_PROJECT`, else "hfxla_nb").
        run_name: the run's name in W&B (None: W&B's own).
        hparams: the run's hyper-parameters, flat (`plain` values).
    """

    report_to: tuple[str, ...]
    log_dir: str | None = None
    project: str | None = None
    run_name: str | None = None
    hparams: dict[str, HParam] = field(default_factory=dict)


class TrackerWriter(Protocol):
    """One tracker's output (`tracking_writers`): scalars by step, the final figures."""

    def scalars(self, step: int, values: Mapping[str, float], walltime: float | None) -> None:
        """Write `values` at `step` (`walltime`: when they were measured)."""

    def close(self, final: Mapping[str, float], failed: bool) -> None:
        """Write the final figures (already written as scalars) and close the run."""

#: The W&B project when neither `project=` nor `WANDB_PROJECT` names one.
DEFAULT_PROJECT = "hfxla_nb"

#: The x axis of every W&B chart: the run's step, logged with each row (`define_metric`), so
#: a value fetched late for an earlier step is kept (W&B drops rows logged at an earlier
#: `step=` than the last).
WANDB_STEP = "step"

#: The values of `WANDB_MODE` that `wandb.init(mode=)` takes.
WANDB_MODES = ("online", "offline", "disabled", "shared")


def open_writer(name: str, settings: TrackingSettings) -> TrackerWriter:
    """The writer of tracker `name` ("tensorboard", "wandb") for `settings`, its run started
    and its hyper-parameters written."""
    if name == "tensorboard":
        return TensorBoardWriter(settings)
    if name == "wandb":
        return WandbWriter(settings)
    raise ValueError(f"no writer for tracker {name!r}")


def _tensorboard_value(value: HParam) -> str | int | float | bool:
    """What TensorBoard's hparams can hold: None becomes "None" (torch leaves it out)."""
    return "None" if value is None else value


class TensorBoardWriter:
    """A `torch.utils.tensorboard.SummaryWriter` on `settings.log_dir`: scalars at their
    steps, the hyper-parameters (the HParams plugin's session start) when it opens, and the
    final figures as the HParams metrics when it closes."""

    def __init__(self, settings: TrackingSettings) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self._hparams = hparams
        self.values = {name: _tensorboard_value(value)
                       for name, value in settings.hparams.items()}
        self.writer = SummaryWriter(log_dir=settings.log_dir)
        _, start, _ = hparams(self.values, {})
        self.writer.file_writer.add_summary(start)

    def scalars(self, step: int, values: Mapping[str, float], walltime: float | None) -> None:
        """Each value as a scalar of its tag at `step`."""
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step, walltime=walltime)

    def close(self, final: Mapping[str, float], failed: bool) -> None:
        """The experiment (the final figures are its metrics) and the session's end."""
        experiment, _, end = self._hparams(self.values, dict(final))
        if failed:  # torch's `hparams` only says success
            end = _failed_session_end()
        self.writer.file_writer.add_summary(experiment)
        self.writer.file_writer.add_summary(end)
        self.writer.close()


def _failed_session_end() -> Any:
    """The HParams plugin's session-end summary of a failed run."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    status = api_pb2.Status.Value("STATUS_FAILURE")
    content = plugin_data_pb2.HParamsPluginData(
        session_end_info=plugin_data_pb2.SessionEndInfo(status=status),
        version=metadata.PLUGIN_DATA_VERSION)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag=metadata.SESSION_END_INFO_TAG, metadata=meta)])


class WandbWriter:
    """A W&B run (`wandb.init`; `WANDB_MODE=offline` and the other W&B variables are W&B's
    own): the hyper-parameters as its config, each row with its `step`, the final figures in
    its summary. Its console capture is off: the cell's output stays the notebook's."""

    def __init__(self, settings: TrackingSettings) -> None:
        import wandb

        project = settings.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        # W&B reads its variables once per process: passed again, they are the ones set now
        # (a notebook changes WANDB_DIR or WANDB_MODE between two runs).
        mode = os.environ.get("WANDB_MODE", "").lower()
        self.run = wandb.init(project=project, name=settings.run_name,
                              config=dict(settings.hparams), reinit="create_new",
                              dir=os.environ.get("WANDB_DIR") or None,
                              mode=mode if mode in WANDB_MODES else None,
                              settings=wandb.Settings(console="off"))
        self.run.define_metric(WANDB_STEP)
        self.run.define_metric("*", step_metric=WANDB_STEP)

    def scalars(self, step: int, values: Mapping[str, float], walltime: float | None) -> None:
        """One row: the values and their step."""
        self.run.log({WANDB_STEP: step, **values})

    def close(self, final: Mapping[str, float], failed: bool) -> None:
        """The final figures in the summary; the run finished (as failed: exit code 1)."""
        self.run.summary.update(dict(final))
        self.run.finish(exit_code=1 if failed else 0)


# -- the tracker: a launch's events, written --

__all__ = ["TRACKERS", "HParam", "Tracker", "TrackerWriter", "TrackingError", "TrackingSettings",
           "check_report_to", "closed_after", "default_log_dir", "plain", "tracker_for"]

WriterFactory = Callable[[str, TrackingSettings], TrackerWriter]

#: The trackers `report_to=` takes: name -> (the module it needs, the pip line that installs it).
TRACKERS = {
    "tensorboard": ("tensorboard", 'pip install "hfxla_nb[tensorboard]"  (or: pip install '
                                   'tensorboard)'),
    "wandb": ("wandb", 'pip install "hfxla_nb[wandb]"  (or: pip install wandb)'),
}

class TrackingError(ValueError):
    """`report_to=` cannot work as asked; raised in the kernel before anything is forked."""


def check_report_to(report_to: str | Sequence[str] | None) -> tuple[str, ...]:
    """The trackers `report_to` names, each checked: known, and its library installed.

    Args:
        report_to: "tensorboard", "wandb", a list of them, or None / "none" / [] (no tracker).

    Returns:
        The names, in order, without repeats; () for no tracker.

    Raises:
        TrackingError: an unknown name (with the closest known one), or a tracker whose
            library is not installed (with the pip line that installs it).
    """
    if report_to is None or report_to == "none":
        return ()
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    chosen: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in TRACKERS:
            close = difflib.get_close_matches(str(name), list(TRACKERS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TrackingError(
                f"report_to={name!r} is not a tracker{hint}: use "
                f"{', '.join(map(repr, TRACKERS))}, a list of them, or 'none'.")
        module, install = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise TrackingError(f"report_to={name!r} needs the {module} package, which is not "
                                f"installed: {install}")
        if name not in chosen:
            chosen.append(name)
    if "wandb" in chosen:
        _check_wandb_login()
    return tuple(chosen)


def _check_wandb_login() -> None:
    """W&B online without a key would ask for one in the middle of the launch: refused. A
    kernel that imported wandb (`wandb.login()` in a cell) is left to W&B's own login."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if (mode in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY")
            or "wandb" in sys.modules):
        return
    netrc = os.path.expanduser(os.environ.get("NETRC", "~/.netrc"))
    try:
        with open(netrc, encoding="utf-8") as file:
            if "api.wandb.ai" in file.read() or os.environ.get("WANDB_BASE_URL"):
                return
    except OSError:
        pass
    raise TrackingError(
        "report_to='wandb' needs a W&B login, and none was found (no WANDB_API_KEY, no "
        "~/.netrc entry): run `wandb login` (or set WANDB_API_KEY) first, or set "
        "WANDB_MODE=offline to write the run locally (`wandb sync` uploads it later).")


def plain(value: Any) -> HParam:
    """`value` as a hyper-parameter every tracker can hold: numbers, strings, booleans and
    None as they are; paths as strings; sequences joined; functions by name; anything else
    (a tokenizer, a dataset, a config object) by a short description."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)) or type(value).__module__ == "numpy":
        try:
            return value.item() if hasattr(value, "item") else value
        except (TypeError, ValueError):
            pass
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    if isinstance(value, (list, tuple)):
        return ", ".join(str(plain(item)) for item in value)
    name = getattr(value, "name_or_path", None)  # a tokenizer, a model
    if isinstance(name, str) and name:
        return f"{type(value).__name__}({name})"
    rows = getattr(value, "num_rows", None)  # a datasets.Dataset
    if isinstance(rows, int):
        return f"{type(value).__name__} of {rows} rows"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def default_log_dir(parent: str | os.PathLike, run_name: str | None = None) -> str:
    """`parent/<run_name>`, or `parent/<date-time>_<host>` (a new folder per run, as the
    Trainer's `runs/`)."""
    name = run_name or f"{time.strftime('%Y%m%d-%H%M%S')}_{socket.gethostname()}"
    return os.path.join(os.fspath(parent), name)


def tracker_for(report_to: str | Sequence[str] | None, log_dir: str | os.PathLike | None,
                project: str | None, run_name: str | None,
                hparams: Mapping[str, Any] | None) -> Tracker | None:
    """`notebook_launcher`'s tracker: the values its function reports, to `report_to`'s
    trackers (TensorBoard's folder: `log_dir`, default `runs/<date-time>_<host>`); None when
    it names none.

    Raises:
        TrackingError: bad `report_to` (`check_report_to`), or `hparams` not a dict.
    """
    names = check_report_to(report_to)
    if hparams is not None and not isinstance(hparams, Mapping):
        raise TrackingError(f"hparams must be a dict of names to values, got "
                            f"{type(hparams).__name__}.")
    if not names:
        return None
    folder = os.fspath(log_dir) if log_dir is not None else default_log_dir("runs", run_name)
    values = {str(name): plain(value) for name, value in (hparams or {}).items()}
    return Tracker(TrackingSettings(names, folder, project, run_name, values))


@contextmanager
def closed_after(tracker: Tracker) -> Iterator[Tracker]:
    """Within the block, `tracker` follows a launch; then its runs are closed (as failed when
    the block raised)."""
    failed = True
    try:
        yield tracker
        failed = False
    finally:
        tracker.close(failed=failed)


class Tracker:
    """A launch's events, written to every tracker of `settings` (see the module docstring).

    Args:
        settings: the trackers and the run's names and hyper-parameters.
        open_writer: makes one tracker's writer (tests may pass their own).
    """

    def __init__(self, settings: TrackingSettings,
                 open_writer: WriterFactory = open_writer) -> None:
        self.settings = settings
        self._open_writer = open_writer
        self._writers: dict[str, TrackerWriter] | None = None
        self._written: set[tuple[str, int]] = set()
        self._bars: dict[str, BarTrack] = {}
        self._snapshot: tuple[int, dict[str, float], float | None] | None = None
        self._final: dict[str, float] = {}
        self._failed = False

    def handle(self, event: Event) -> None:
        """Write what `event` carries (rank 0's progress values and metrics); a relaunch
        (`max_restarts=`: rank 0 starts again) writes its steps again."""
        try:
            if isinstance(event, Started) and event.rank == 0:
                self._written.clear()
                self._bars.clear()
            elif isinstance(event, Progress) and event.rank == 0:
                self._progress(event)
            elif isinstance(event, MetricsSnapshot) and 0 in snapshot_ranks(event):
                self._metrics(event)
        except Exception as error:  # noqa: BLE001 - tracking must never stop training
            if not self._failed:
                self._failed = True
                _warn(", ".join(self.settings.report_to), "could not read an event", error)

    def finish(self, step: int, figures: Mapping[str, float]) -> None:
        """Write the run's final figures at `step` (they also become the run's summary)."""
        self._flush_snapshot()
        values = {name: float(value) for name, value in figures.items()
                  if isinstance(value, (int, float)) and not isinstance(value, bool)}
        self._final.update(values)
        self._write(step, values, time.time(), again=True)

    def close(self, failed: bool = False) -> None:
        """Write what is still held, close every tracker's run (`failed`: as failed)."""
        self._flush_snapshot()
        for name, writer in list((self._writers or {}).items()):
            self._call(name, lambda w=writer: w.close(dict(self._final), failed))
        self._writers = {}

    # -- the events ------------------------------------------------------------------------------

    def _progress(self, event: Progress) -> None:
        bar = self._bars.setdefault(event.label, BarTrack(event.label, event.rank))
        advance(bar, event)
        if not event.values:
            return
        # An evaluation's metrics (`eval_loss`, sent on the train bar at its step) go where
        # the Trainer writes them: `eval/loss`.
        values = {f"eval/{name[5:]}" if name.startswith("eval_") else f"{event.label}/{name}":
                  value for name, value in event.values.items()}
        rates = steady_rates(bar)
        if rates is not None and rates[1] is not None:
            values[f"{event.label}/samples_per_second"] = rates[1]
        self._write(event.step, values, event.time)

    def _metrics(self, event: MetricsSnapshot) -> None:
        summary = summarize(event.data, steps=event.step)
        values = {
            "xla/compiles": summary.compiles,
            "xla/executions": summary.executions,
            "xla/transfers_from_device": summary.transfers_from_device,
            "xla/transfers_to_device": summary.transfers_to_device,
            "xla/compile_seconds": summary.compile_seconds,
        }
        held = self._snapshot
        if held is not None and held[0] != event.step:
            self._flush_snapshot()
        # Several readings of one step (the last one after evaluation): the latest is kept.
        self._snapshot = (event.step, {k: float(v) for k, v in values.items()}, event.time)

    def _flush_snapshot(self) -> None:
        if self._snapshot is not None:
            step, values, walltime = self._snapshot
            self._snapshot = None
            self._write(step, values, walltime)

    # -- the writers -----------------------------------------------------------------------------

    def _write(self, step: int, values: Mapping[str, float], walltime: float | None,
               again: bool = False) -> None:
        """Each value once per step (a fetched value comes again with the plain ones of its
        step); `again`: the final figures, written whatever came before."""
        fresh = {tag: float(value) for tag, value in values.items()
                 if again or (tag, step) not in self._written}
        if not fresh:
            return
        self._written.update((tag, step) for tag in fresh)
        for name, writer in list(self._opened().items()):
            self._call(name, lambda w=writer: w.scalars(step, fresh, walltime))

    def _opened(self) -> dict[str, TrackerWriter]:
        """The writers, opened at the first value (in the kernel, after the fork)."""
        if self._writers is None:
            self._writers = {}
            for name in self.settings.report_to:
                try:
                    self._writers[name] = self._open_writer(name, self.settings)
                except Exception as error:  # noqa: BLE001 - tracking must never stop training
                    _warn(name, "could not start", error)
        return self._writers

    def _call(self, name: str, write: Callable[[], None]) -> None:
        try:
            write()
        except Exception as error:  # noqa: BLE001 - tracking must never stop training
            _warn(name, "failed, and writes nothing more for this run", error)
            if self._writers is not None:
                self._writers.pop(name, None)


def _warn(name: str, what: str, error: BaseException) -> None:
    warnings.warn(f"hfxla_nb: report_to={name!r} {what}: {error!r}", RuntimeWarning,
                  stacklevel=3)
