"""The doctor's steps that launch workers: a trivial launch, every device (compile, execute, an
all-reduce over an SPMD mesh, bf16 against fp32, memory), the compile cache across two
processes, and a 20-step demo fine-tune. Each gets a time limit (its `timeout=`), so a hang
becomes a "timed out" line and nothing is left running."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

from .._words import plural
from ..runtime.doctor_report import Check
from ..runtime.info import RuntimeInfo
from . import device_checks

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
