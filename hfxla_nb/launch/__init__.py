"""The launch layer: pre-flight checks, the forked workers, and the notebook side that watches
them (docs/architecture.md)."""

from .launcher import last_launch, notebook_launcher
from .preflight import LaunchRefusedError
from .processes import group_processes
from .record import LaunchError, LaunchRecord, RankRecord, RecordKeeper

__all__ = ["LaunchError", "LaunchRecord", "LaunchRefusedError", "RankRecord", "RecordKeeper",
           "group_processes", "last_launch", "notebook_launcher"]
