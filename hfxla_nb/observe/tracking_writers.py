"""The trackers' writers (`report_to=`): TensorBoard through `torch.utils.tensorboard`, W&B
through `wandb`, each library's own writer, run in the notebook process; what they are given
(`TrackingSettings`).

The only module that imports either library, when a writer is made: at a launch's first
value (`tracking.Tracker`), after the fork.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

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
