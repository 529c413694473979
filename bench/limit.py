"""Group 6: how close `fine_tune` keeps the device to its limit. Steady wall time per step
over XLA's own execution time per step (`ExecuteTime`, `torch_xla.debug.metrics`): 1.0 means
the device never waits for Python (tracing, data, reporting); on a CPU, tracing the next step
and executing this one share the same 2 cores.

Wall time per step: the median over the progress updates after the warm-up (each the mean
over the steps since the previous one); execution time: the median of XLA's per-execution
times (one execution per step). One run per model, no evaluation.
"""

from __future__ import annotations

from . import common, workloads

GROUP = "6 the limit"
CASES = (  # model, target, steps, batch, length, steps left out (compiling, first updates)
    ("tiny BERT", 1.6, 60, 16, 64, 10),
    ("BERT 4x256", 1.08, 28, 16, 64, 6),
    ("MiniLM-L6", None, 10, 8, 32, 4),  # the pretrained checkpoint: ~1 s a step here
)


def measure(model: str, steps: int, batch: int, length: int, skip: int) -> dict:
    raw = workloads.fine_tune_measured(
        model, workloads.demo_rows(max(steps * batch, 64)), max_steps=steps, batch_size=batch,
        max_length=length, output_dir=None, progress=False, learning_rate=1e-4)
    walls = workloads.steady_step_seconds(raw["bench_step_times"], skip)
    executions = raw["bench_execute_seconds"][-(steps - skip):]
    wall, execute = common.median(walls), common.median(executions)
    return {"walls": walls, "wall": wall, "execute": execute,
            "ratio": wall / execute if wall and execute else None,
            "executions_per_step": raw["executions_per_step"],
            "samples_per_second": raw["samples_per_second"]}


def run() -> list[common.Figure]:
    figures = []
    for name, target, steps, batch, length, skip in CASES:
        model = workloads.MODELS[name]()
        if model is None:
            figures.append(common.Figure(GROUP, f"{name}: wall / execution time per step", None,
                                         "x", target=f"<= {target}" if target else "",
                                         note="model not installed"))
            continue
        if common.QUICK:
            steps = max(skip + 5, steps // 2)
        m = measure(model, steps, batch, length, skip)
        common.say(f"  {name}: wall {m['wall']}, execute {m['execute']}, "
                   f"{m['executions_per_step']} executions/step")
        note = (f"{m['wall'] * 1000:.1f} ms wall vs {m['execute'] * 1000:.1f} ms executing per "
                f"step ({m['executions_per_step']:.2f} executions/step), batch {batch}, "
                f"length {length}, {steps} steps, one device; median of {len(m['walls'])} "
                "progress updates")
        label = f"{name}: steady wall / XLA execution time per step"
        if target is None:
            figures.append(common.Figure(GROUP, label, m["ratio"], "x", repeats=len(m["walls"]),
                                         note=note + " (pretrained checkpoint; reported)"))
        else:
            if m["ratio"] is not None and m["ratio"] > target:
                note += ("; why: the training thread's host CPU per step (group 12: tracing, "
                         "mostly torch's and transformers' Python) is not hidden behind the "
                         "execution on XLA:CPU, which runs on the same 2 cores")
            figures.append(common.target_figure(GROUP, label, m["ratio"], "<=", target, "x",
                                                len(m["walls"]), note,
                                                [w / m["execute"] for w in m["walls"]]))
    return figures
