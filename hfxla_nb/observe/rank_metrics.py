"""The final XLA figures of each rank of a launch, as plain data (`RankRecord.metrics`).

Numbers a notebook can put in a DataFrame or assert, instead of reading them off a panel. The
figures have the names of `XlaSummary`'s (`compile_seconds`, `execute_seconds`...): a rank's
figures are its process's summary, as the panel shows it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .analyzer import analyze
from .metrics import XlaCounts, XlaSummary


@dataclass
class RankMetrics(XlaCounts):
    """What XLA did for one rank, as of the launch's last metrics snapshot: its process's
    `XlaCounts`, and the rank's own figures.

    Attributes:
        shared_with: the ranks whose work these counters hold (torch_xla counts per process;
            rank threads of one process, as in replicated mode on the CPU, share them).
        steps: the step the counters were read at (for `predict`, which reports no step,
            the batches its bar counts, as the panel says them).
        compiles, cached_compiles: graphs compiled, and compilations found in the cache.
        compile_seconds: time spent compiling.
        executions, execute_seconds: graph executions and their time.
        transfers_from_device, transfer_from_device_seconds, bytes_from_device: device-to-host
            copies (bytes None where torch_xla does not count them).
        transfers_to_device, transfer_to_device_seconds, bytes_to_device: host-to-device.
        item_calls: `.item()` calls (each one a device-to-host transfer inside the step).
        fallbacks: CPU fallback operations and their counts.
        step_times: `(step, seconds per step)` for each progress update of the rank's first
            bar: the mean over the steps since the previous update.
        alerts: the alerts of the final panel, as dicts (code, severity, title, explanation,
            fix).
        largest_graph_bytes: what the compiled graph that needs the most device memory
            needs (XLA's post-compilation analysis: inputs, outputs not aliased,
            temporaries, the program); None when the launch was not traced.
    """

    shared_with: list[int] = field(default_factory=list)
    step_times: list[tuple[int, float]] = field(default_factory=list)
    alerts: list[dict[str, str]] = field(default_factory=list)
    largest_graph_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every figure as a plain dict (lists and dicts copied)."""
        return asdict(self)


# The figures a rank's metrics copy from its process's summary.
_SHARED = tuple(f.name for f in fields(XlaCounts))


def rank_metrics(summary: XlaSummary, ranks: list[int], step_times: list[tuple[int, float]],
                 warmup_steps: int) -> RankMetrics:
    """One rank's figures: those of `summary` (its process's), with its step times and the
    final panel's alerts.

    Args:
        summary: the summary of the process that ran the rank.
        ranks: the ranks whose work the summary counts.
        step_times: the rank's `(step, seconds per step)` (see `RankMetrics.step_times`).
        warmup_steps: the steps the alerts count as warm-up.
    """
    figures = {name: getattr(summary, name) for name in _SHARED}
    figures["fallbacks"] = dict(summary.fallbacks)
    figures["steps"] = summary.counted()[0]  # what the panel counts: predict's batches
    largest = summary.trace.largest() if summary.trace is not None else None
    return RankMetrics(
        shared_with=list(ranks),
        step_times=list(step_times),
        alerts=[asdict(alert) for alert in analyze(summary, warmup_steps=warmup_steps)],
        largest_graph_bytes=largest.memory if largest is not None else None,
        **figures,
    )


def dataframe(rows: list[dict[str, Any]]) -> Any:
    """`rows` as a pandas DataFrame (pandas is imported here, only when asked for)."""
    try:
        import pandas
    except ImportError as error:  # pragma: no cover - pandas comes with datasets
        raise ImportError("to_dataframe() needs pandas: pip install pandas") from error
    return pandas.DataFrame(rows)
