"""The doctor's steps that only read (in the kernel, nothing started): versions, the host and
its chips, who holds the device files, the environment variables. Each is a function of what
`detect()` found (and the real environment, `environ`: `detect()` keeps only a redacted
copy), returning a `Check`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping

from ..runtime import problems as known
from ..runtime.doctor_report import Check
from ..runtime.info import RuntimeInfo
from ..runtime.problems import Facts, Problem

#: The packages the versions step names, in this order (None: not installed).
PACKAGES = ("python", "torch", "torch_xla", "torch_tpu", "libtpu", "jax", "transformers",
            "accelerate", "peft", "datasets", "ipywidgets", "ipykernel", "hfxla_nb")
ProblemCheck = Callable[[Facts], Iterator[Problem]]
#: The checks of `runtime/problems.py` each step reports (the environment step: the rest).
_VERSION_CHECKS: tuple[ProblemCheck, ...] = (
    known.torch_missing, known.torch_xla_missing, known.torch_tpu_too,
    known.versions_mismatch, known.libtpu_missing)
_DEVICE_CHECKS: tuple[ProblemCheck, ...] = (known.device_files_hidden,
                                            known.tpu_held_elsewhere)
_HOST_CHECKS: tuple[ProblemCheck, ...] = (
    known.tpu_left_idle, known.tpu_asked_but_missing, known.pjrt_device_unknown,
    known.gpu_unused, known.cpu_device_count_odd)


def _problems(info: RuntimeInfo, checks: tuple[ProblemCheck, ...],
              environ: Mapping[str, str] | None = None) -> list[Problem]:
    """What `checks` find in `info`'s facts (and the real environment, not the redacted)."""
    facts = Facts(info.accelerator, info.environment, info.versions, info.runtime_initialized,
                  os.environ if environ is None else environ)
    return [problem for check in checks for problem in check(facts)]


def _with_problems(name: str, summary: str, problems: list[Problem],
                   details: dict | None = None) -> Check:
    """`summary` as an ok `Check`, or failed (an error among `problems`) or warning, with
    every problem's fix as what to do (info notes: ok, said)."""
    details = details or {}
    if not problems:
        return Check(name, "ok", summary, details=details)
    status = "failed" if any(p.severity == "error" for p in problems) else "warning"
    if all(p.severity == "info" for p in problems):
        status = "ok"
    said = "; ".join(p.title for p in problems)
    fix = " ".join(p.fix for p in problems if p.fix and p.severity != "info")
    return Check(name, status, f"{summary}; {said}", fix=fix, details=details)


def versions(info: RuntimeInfo, environ: Mapping[str, str] | None = None) -> Check:
    """Every package that matters, and whether torch and torch_xla are a pair that works."""
    found = {name: info.versions.get(name) for name in PACKAGES}
    summary = ", ".join(f"{name} {version}" for name, version in found.items() if version)
    missing = [name for name, version in found.items() if version is None]
    if missing:
        summary += f" (not installed: {', '.join(missing)})"
    return _with_problems("versions", summary, _problems(info, _VERSION_CHECKS, environ),
                          {"versions": found})


def host(info: RuntimeInfo, environ: Mapping[str, str] | None = None) -> Check:
    """Where this runs (Colab, Kaggle, a TPU VM, ...) and its chips, cores and HBM."""
    accelerator = info.accelerator
    summary = f"{info.host or info.environment}: {accelerator.description}"
    details = {"environment": info.environment, "host": info.host, "kind": accelerator.kind,
               "generation": accelerator.generation, "chips": accelerator.chips,
               "devices": accelerator.devices, "hbm_per_chip_gib": accelerator.hbm_per_chip_gib,
               "found_by": list(accelerator.found_by), "host_cores": accelerator.host_cores}
    return _with_problems("host", summary, _problems(info, _HOST_CHECKS, environ), details)


def device_files(info: RuntimeInfo, environ: Mapping[str, str] | None = None) -> Check:
    """Who else holds the TPU's device files (`/dev/vfio`, `/dev/accel*`), with the command
    that stops each."""
    holders = info.accelerator.holders
    if info.accelerator.kind != "tpu" and not holders:
        return Check("device files", "tpu only",
                     "no TPU device files on this host: nothing can hold them")
    summary = ("no other process holds them" if not holders else ", ".join(
        f"pid {pid} ({command})" for pid, command in sorted(holders.items())))
    check = _with_problems("device files", summary, _problems(info, _DEVICE_CHECKS, environ),
                           {"holders": {str(pid): cmd for pid, cmd in holders.items()}})
    if holders and not check.fix:
        check.status = "failed"
        check.fix = "stop them: " + "; ".join(f"kill {pid}" for pid in sorted(holders))
    return check


def environment(info: RuntimeInfo, environ: Mapping[str, str] | None = None) -> Check:
    """The variables that matter (secrets hidden), and what is wrong with them."""
    owned = {*_VERSION_CHECKS, *_DEVICE_CHECKS, *_HOST_CHECKS}
    problems = _problems(info, tuple(check for check in known.CHECKS if check not in owned),
                         environ)
    names = ", ".join(sorted(info.env)) or "none set"
    return _with_problems("environment", f"{len(info.env)} set: {names}", problems,
                          {"variables": sorted(info.env)})
