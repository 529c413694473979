"""`hx.doctor()` and `%xla_doctor`: one command that checks this host end to end and gives a
report to paste into an issue.

In at most `TIME_LIMIT` seconds, each step with a limit of its own (`STEPS`): the versions and
whether they pair, the host and its chips, who holds the device files, the environment
variables, a trivial launch, every device (a compile and execution, an all-reduce over an SPMD
mesh, a bf16 matmul against fp32, memory), the compile cache across two processes (TPU only),
and a 20-step demo fine-tune.

The steps that only read run in the kernel and start nothing. Each is a function of what
`detect()` found and of the real environment (`environ`: `detect()` keeps only a redacted
copy), and returns a `Check`.

The steps that launch do it in workers, so the kernel's XLA runtime stays unstarted. Each gets
a time limit (its `timeout=`): a step that hangs becomes a "timed out" line, and nothing is
left running.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone

from .._version import __version__
from .._words import plural
from ..runtime import info as known
from ..runtime.doctor_report import Check, DoctorReport
from ..runtime.info import Facts, Problem, RuntimeInfo, detect
from . import device_checks

# -- the steps that only read, in the kernel --

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


# -- the steps that launch workers, each with a time limit --

#: The demo fine-tune's steps, rows and batch.
FINE_TUNE_STEPS, FINE_TUNE_ROWS, FINE_TUNE_BATCH = 20, 400, 16


def _launch(function: Callable, limit: float, **options) -> object:
    from ..launch.launcher import notebook_launcher

    return notebook_launcher(function, progress=False, output="none", timeout=limit, **options)


def _failed(name: str, error: BaseException, began: float, fix: str) -> Check:
    """A step that raised: its first line, and what to do."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    timed_out = "timed out" in first or "timeout" in first.lower()
    return Check(name, "timed out" if timed_out else "failed",
                 f"{type(error).__name__}: {first}", seconds=time.perf_counter() - began,
                 fix=fix)


def launch(info: RuntimeInfo, limit: float) -> Check:
    """A trivial function launched as a user's launch is (the default strategy), and back."""
    began = time.perf_counter()
    try:
        facts = _launch(device_checks.process_facts, limit)
    except Exception as error:  # noqa: BLE001 - the doctor reports every failure
        return _failed("launch", error, began, "run %xla_info for what is wrong; a hang at "
                       "the first launch usually means the XLA runtime started in this kernel "
                       "(restart it, launch before any device use).")
    seconds = time.perf_counter() - began
    return Check("launch", "ok", f"forked, ran and stopped in {seconds:.1f} s",
                 seconds=seconds, details=facts)


def devices(info: RuntimeInfo, limit: float) -> Check:
    """One compile and execution over every device, an all-reduce, bf16 against fp32."""
    began = time.perf_counter()
    try:
        facts = _launch(device_checks.every_device, limit, strategy="spmd")
    except Exception as error:  # noqa: BLE001
        return _failed("devices", error, began, "the devices do not run a program: see the "
                       "error above, and %xla_info's problems.")
    seconds = time.perf_counter() - began
    memory = facts["memory"]
    said_memory = ("device memory: not reported by XLA on the CPU" if memory is None else
                   f"{memory.get('bytes_limit', 0) / 2**30:.1f} GiB per device")
    summary = (f"{plural(facts['devices'], 'device')} ({facts['device_type']}): "
               f"{plural(facts['compiles'], 'graph')} compiled, the all-reduce's sum "
               f"{'right' if facts['sum'] == facts['expected_sum'] else 'WRONG'}, bf16 "
               f"matmul within {facts['bf16_error']:.1e} of fp32; {said_memory}")
    wrong = []
    if facts["sum"] != facts["expected_sum"]:
        wrong.append(f"the sum over the mesh is {facts['sum']}, not {facts['expected_sum']}")
    if not facts["bf16_error"] <= device_checks.BF16_TOLERANCE:
        wrong.append(f"bf16 is {facts['bf16_error']:.2e} off fp32 (more than "
                     f"{device_checks.BF16_TOLERANCE})")
    if wrong:
        return Check("devices", "failed", summary, seconds=seconds, details=facts,
                     fix="; ".join(wrong) + ": the devices compute wrong results. Report it "
                     "with this report.")
    return Check("devices", "ok", summary, seconds=seconds, details=facts)


def compile_cache(info: RuntimeInfo, limit: float) -> Check:
    """A graph compiled into a persistent cache by one process and loaded by the next (TPU
    only: on the CPU, XLA writes the entries but cannot load them back)."""
    if info.accelerator.kind != "tpu":
        return Check("compile cache", "tpu only", "XLA on the CPU writes the cache's entries "
                     "but cannot load them back: nothing to check without a TPU")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hfxla_nb-doctor-cache-") as folder:
        try:
            first = _launch(device_checks.compile_and_count, limit / 2, args=(folder,),
                            strategy="spmd", compile_cache=folder)
            second = _launch(device_checks.compile_and_count, limit / 2, args=(folder,),
                             strategy="spmd", compile_cache=folder)
        except Exception as error:  # noqa: BLE001
            return _failed("compile cache", error, began, "launch with compile_cache=False "
                           "and report this report.")
    seconds = time.perf_counter() - began
    details = {"first": first, "second": second}
    if second.get("hits", 0) < 1:
        return Check("compile cache", "failed", "the second process compiled again: "
                     f"{second}", seconds=seconds, details=details,
                     fix="check that the cache folder is writable and that both launches "
                     "use the same torch_xla and libtpu (%xla_info).")
    return Check("compile cache", "ok", f"written by one process, loaded by the next "
                 f"({second['hits']} hit)", seconds=seconds, details=details)


def fine_tune(info: RuntimeInfo, limit: float) -> Check:
    """The demo's tiny BERT, 20 steps over every device: its graphs and samples/s."""
    from ..demo import demo_dataset, demo_model_dir
    from ..train.finetune import fine_tune as run

    began = time.perf_counter()
    try:
        result = run(demo_model_dir(), demo_dataset(n=FINE_TUNE_ROWS),
                     max_steps=FINE_TUNE_STEPS, batch_size=FINE_TUNE_BATCH, output_dir=None,
                     progress=False, timeout=limit)
    except Exception as error:  # noqa: BLE001
        return _failed("fine-tune", error, began, "fine_tune fails on the demo: see the "
                       "error above; %xla_info lists what is wrong with the runtime.")
    seconds = time.perf_counter() - began
    buckets = len(result.bucket_lengths)
    rate = result.samples_per_second or result.samples_per_second_overall or 0.0
    summary = (f"{FINE_TUNE_STEPS} steps: {plural(result.compiles, 'training graph')} + "
               f"{plural(result.eval_compiles, 'evaluation graph')} for "
               f"{plural(buckets, 'length')}, {rate:.0f} samples/s")
    details = {"compiles": result.compiles, "eval_compiles": result.eval_compiles,
               "buckets": list(result.bucket_lengths),
               "samples_per_second": rate}
    if result.compiles > buckets:
        return Check("fine-tune", "warning", summary + ": more graphs than lengths",
                     seconds=seconds, details=details,
                     fix="a graph per length is the contract: report this report.")
    return Check("fine-tune", "ok", summary, seconds=seconds, details=details)


# -- the doctor: every step in turn, within one time limit --

__all__ = ["STEPS", "TIME_LIMIT", "doctor"]

#: The whole run's limit, in seconds.
TIME_LIMIT = 90.0
#: Each step: its name, its function, and its own limit in seconds (fewer when less of
#: `TIME_LIMIT` is left).
STEPS: tuple[tuple[str, Callable[[RuntimeInfo, float], Check], float], ...] = (
    ("versions", lambda info, limit: versions(info), 5.0),
    ("host", lambda info, limit: host(info), 5.0),
    ("device files", lambda info, limit: device_files(info), 5.0),
    ("environment", lambda info, limit: environment(info), 5.0),
    ("launch", launch, 25.0),
    ("devices", devices, 30.0),
    ("compile cache", compile_cache, 40.0),
    ("fine-tune", fine_tune, 45.0),
)
#: The least time a step starts with; with less left, it is skipped.
_LEAST = 2.0
#: A step's thread is waited for this long past its limit (its launch stops at the limit).
_GRACE = 10.0


def run_step(name: str, step: Callable[[RuntimeInfo, float], Check], info: RuntimeInfo,
             limit: float, grace: float = _GRACE) -> Check:
    """`step(info, limit)` in a thread, given `limit` seconds and `grace` more (a launch
    stops itself at `limit`); a step not back by then is "timed out", one that raised
    "failed"."""
    outcome: list[Check | BaseException] = []

    def body() -> None:
        try:
            outcome.append(step(info, limit))
        except BaseException as error:  # noqa: BLE001 - a step's bug is a failed step
            outcome.append(error)

    began = time.perf_counter()
    thread = threading.Thread(target=body, name=f"hfxla_nb-doctor-{name}", daemon=True)
    thread.start()
    thread.join(limit + grace)
    seconds = time.perf_counter() - began
    if not outcome:
        return Check(name, "timed out", f"not done in {limit:.0f} s, its limit", seconds=seconds,
                     fix=f"a busy host is slow and a hang never ends: give it more time, "
                     f"hx.doctor(steps=({name!r},), time_limit=300), and if it still times "
                     "out, report this report.")
    result = outcome[0]
    if isinstance(result, BaseException):
        return Check(name, "failed", f"{type(result).__name__}: {result}", seconds=seconds,
                     fix="this is a bug in the doctor: report it with this report.")
    if not result.seconds:
        result.seconds = seconds
    return result


def doctor(*, steps: tuple[str, ...] | None = None, time_limit: float = TIME_LIMIT,
           show: bool = True) -> DoctorReport:
    """Check this host end to end, each step within its limit, and report.

    Args:
        steps: the names of the steps to run (default: every step of `STEPS`); the others
            are "skipped".
        time_limit: the whole run's limit in seconds; each step's own limit (`STEPS`) grows
            or shrinks with it.
        show: in a notebook, say which step runs while it runs.

    Returns:
        A `DoctorReport`: a panel in a notebook; `to_markdown()` for an issue, `to_json()` as
        data.

    Raises:
        ValueError: a step name that does not exist (the message lists them).
    """
    names = [name for name, _, _ in STEPS]
    unknown = sorted(set(steps or ()) - set(names))
    if unknown:
        raise ValueError(f"no step {', '.join(map(repr, unknown))}; the steps are "
                         f"{', '.join(map(repr, names))}.")
    began = time.perf_counter()
    info = detect()
    progress = _Progress(show)
    checks = []
    scale = time_limit / TIME_LIMIT  # each step's own limit, in proportion
    for index, (name, step, own_limit) in enumerate(STEPS):
        left = time_limit - (time.perf_counter() - began)
        if steps is not None and name not in steps:
            checks.append(Check(name, "skipped", "not asked for"))
            continue
        if left < _LEAST:
            checks.append(Check(name, "skipped", f"the run's {time_limit:.0f} s were spent"))
            continue
        progress.say(f"hfxla_nb doctor: step {index + 1} of {len(STEPS)}, {name} ...")
        limit = min(own_limit * scale, left)
        checks.append(run_step(name, step, info, limit, grace=max(0.0, min(_GRACE, left - limit))))
    progress.close()
    return DoctorReport(checks=checks, seconds=time.perf_counter() - began,
                        created=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        version=__version__, env=dict(info.env))


class _Progress:
    """One line in the cell, replaced as the steps go, emptied at the end (a notebook only).

    The line is sent as a raw text/plain bundle: `display(str)` would show the string's repr,
    quotes included, and an empty string as a stray `''` line above the report.
    """

    def __init__(self, show: bool) -> None:
        self._show = False
        self._handle = None
        if show:
            from ..ui import in_notebook

            self._show = in_notebook()

    def say(self, line: str) -> None:
        if not self._show:
            return
        if self._handle is None:
            from IPython.display import display

            self._handle = display({"text/plain": line}, raw=True, display_id=True)
        else:
            self._handle.update({"text/plain": line}, raw=True)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
