"""What `hx.doctor()` found: `DoctorReport`, a `Check` per step, as data, JSON and markdown.

Plain data (the steps are in `hfxla_nb.doctor`, the panel in `ui.panels`): the JSON is
the format in which a host's facts travel (a user's report, a recorded TPU run for the tests),
the markdown is what a user pastes into an issue. Neither holds a secret: the environment
variables come from `detect()`, secrets already replaced by "<hidden>".
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

#: What a step can end as, best first. "tpu only": the step cannot run without a TPU (its
#: summary says why); "skipped": not asked for, or an earlier step it needs failed.
STATUSES = ("ok", "tpu only", "skipped", "warning", "failed", "timed out")
#: The statuses that make a report not OK.
BAD = ("failed", "timed out")
_MARKS = {"ok": "✔", "tpu only": "–", "skipped": "–", "warning": "!", "failed": "✘",
          "timed out": "✘"}


@dataclass
class Check:
    """One step of the doctor.

    Attributes:
        name: the step ("versions", "launch", "devices", ...).
        status: one of `STATUSES`.
        summary: one line: what was found, or what failed.
        seconds: how long the step took.
        fix: what to do (empty when there is nothing to do).
        details: the step's facts, JSON values only (versions, device counts, timings).
    """

    name: str
    status: str
    summary: str
    seconds: float = 0.0
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}.")

    @property
    def mark(self) -> str:
        """✔, ✘, ! or – for the status."""
        return _MARKS[self.status]


@dataclass(repr=False)
class DoctorReport:
    """Every step `hx.doctor()` ran, in order. Shows as a panel in a notebook, as text elsewhere.

    Attributes:
        checks: one `Check` per step.
        seconds: the whole run's wall time.
        created: when it ran (UTC, ISO 8601).
        version: hfxla_nb's version.
        env: the environment variables that matter, secrets replaced by "<hidden>".
        source: where a recorded report's facts come from (public issues, docs), and which
            are derived; empty for a report the doctor made.
    """

    checks: list[Check]
    seconds: float
    created: str
    version: str
    env: dict[str, str] = field(default_factory=dict)
    source: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether no step failed or timed out ("tpu only" and warnings are OK)."""
        return not any(check.status in BAD for check in self.checks)

    def check(self, name: str) -> Check:
        """The step called `name`.

        Raises:
            KeyError: no step has that name (the message lists them).
        """
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no step {name!r}; the steps are "
                       f"{', '.join(check.name for check in self.checks)}.")

    def counts(self) -> dict[str, int]:
        """Steps per status, in `STATUSES` order, statuses no step has left out."""
        counts = {status: 0 for status in STATUSES}
        for check in self.checks:
            counts[check.status] += 1
        return {status: n for status, n in counts.items() if n}

    def status_line(self) -> str:
        """"7 ok, 1 tpu only" (every status that occurs, best first)."""
        return ", ".join(f"{n} {status}" for status, n in self.counts().items())

    def to_json(self) -> str:
        """The report as JSON (`DoctorReport.from_json` reads it back)."""
        return json.dumps(asdict(self), indent=1, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> DoctorReport:
        """A report from `to_json()`'s text (a user's report, or a recorded run)."""
        data = json.loads(text)
        checks = [Check(**check) for check in data.pop("checks")]
        return cls(checks=checks, **data)

    def to_markdown(self) -> str:
        """The report as markdown, to paste into an issue: a table of the steps, what to do,
        and the environment variables (secrets hidden) in a fold."""
        lines = [f"## hfxla_nb doctor: {self.status_line()}", "",
                 f"hfxla_nb {self.version}, {self.created}, {self.seconds:.1f} s", "",
                 "| step | status | found | time |", "|---|---|---|---|"]
        for check in self.checks:
            summary = check.summary.replace("|", "\\|")
            lines.append(f"| {check.name} | {check.mark} {check.status} | {summary} "
                         f"| {check.seconds:.1f} s |")
        fixes = [check for check in self.checks if check.fix]
        if fixes:
            lines += ["", "### What to do", ""]
            lines += [f"- **{check.name}**: {check.fix}" for check in fixes]
        if self.env:
            lines += ["", "<details><summary>environment variables</summary>", "", "```"]
            lines += [f"{name}={value}" for name, value in sorted(self.env.items())]
            lines += ["```", "", "</details>"]
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return (f"<DoctorReport: {self.status_line()} in {self.seconds:.1f} s; "
                "to_markdown() for an issue, to_json() as data>")
