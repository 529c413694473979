"""The analyzer: a run's `XlaSummary` in, alerts in plain language out.

It applies PyTorch/XLA's own thresholds (the ones `PT_XLA_DEBUG_LEVEL` reports): more than 0.5
compiles per step once past 10 warm-up steps, more than 0.5 device-to-host transfers per step,
any CPU fallback other than `aten::_local_scalar_dense`, any compile over 300 s or execution
over 30 s. Beyond torch_xla's rules, an input reported with more than `MAX_QUIET_SHAPES` shapes
is named even when every compilation fell in the warm-up; a run that compiled a new graph at
nearly every step is flagged even in its warm-up; transfers per step wait for
`MIN_RATE_STEPS` steps.

When the run was traced (`summary.trace`, torch_xla's own analysis of each compilation), the
alerts name the line: the one that compiled the different graphs, the one that fetched a
value, the one whose graph needs more device memory than the device has. The trace alone is
enough to warn of recompiling (`recompiling_line`): a line of the user's that first compiled
a graph after the warm-up, or more graphs than a few buckets explain, is named whether or not
`report(inputs=...)` said which input changed shape; `inputs=` adds that.

Severity follows what a problem costs, not how often it happens: recompilation that took most
of the XLA time (`COSTLY_COMPILE_SHARE`) is a warning even below torch_xla's rate threshold.
The fix for changing shapes names the kind of input: tokenizer outputs are padded by the
tokenizer, other tensors by the code that builds them.
"""

from __future__ import annotations

from .._units import data_size, duration
from .._words import plural
from .alert_words import (
    INPUTS_HINT,
    MAX_TRANSFERS_PER_STEP,
    Alert,
    compile_cause,
    cost_severity,
    last_batch_fix,
    shapes_cause,
    shapes_fix,
    shapes_listed,
    share_text,
)
from .metrics import WARMUP_STEPS, XlaSummary
from .shapes import MAX_QUIET_SHAPES, InputShapes, shape_changes
from .trace_log import CompileRow

# torch_xla/csrc/runtime/metrics_analysis.cc
MAX_COMPILES_PER_STEP = 0.5
MAX_COMPILE_SECONDS = 300.0
MAX_EXECUTE_SECONDS = 30.0
# Beyond torch_xla's rules: a run of at least this many steps that compiled a new graph at
# nearly every step (compiles >= steps) is flagged even inside the warm-up...
MIN_EVERY_STEP = 3
# ... and transfers per step are judged only over this many steps (one fetch in a 2-step
# cell is not a habit).
MIN_RATE_STEPS = 3
# More different graphs than this at one line of the user's is recompiling, even when all of
# them compiled in the warm-up: the first step's graph, and one per bucket of up to
# `MAX_QUIET_SHAPES` buckets (the fix the alert itself recommends).
MAX_QUIET_GRAPHS = MAX_QUIET_SHAPES + 1


def _shape_changes_alert(summary: XlaSummary, many: dict[str, InputShapes],
                         warmup_steps: int) -> Alert:
    """Inputs with many shapes, when the rate rules stay silent: every compile may have
    happened during warm-up (shapes that cycle), but each shape still cost a compilation and
    any new one costs another."""
    names = ", ".join(f"'{name}'" for name in many)
    if len(many) == 1:
        title = f"Input {names} took {next(iter(many.values())).count_text()}"
    else:
        title = f"Inputs {names} took many different shapes"
    listed = shapes_listed(many, opening="Input")
    compiled = ""
    if summary.compiles:
        during = _compiled_during(many, warmup_steps) if summary.compiles_after_warmup == 0 else ""
        compiled = (f" This run compiled {plural(summary.compiles, 'graph')}{during}."
                    f"{share_text(summary)}")
    return Alert(
        "shape-changes", cost_severity(summary), title,
        f"{listed}. XLA compiles a new graph for every new input "
        f"shape.{compiled} Later steps reuse those graphs, but each compilation can take "
        "minutes on a TPU, and every shape not seen yet (a longer text, a smaller last "
        "batch, an evaluation batch) compiles again.",
        shapes_fix(many, summary),
    )


def _compiled_during(many: dict[str, InputShapes], warmup_steps: int) -> str:
    """`, in steps 1-6, as each new shape first appeared`: the steps the shapes' first
    appearances span, when every shape is listed with its step; else the warm-up's bound
    (#28: "all in the first 10 steps" was said of compiles made in steps 1-6)."""
    steps = [step for info in many.values() for step in info.first_steps]
    if steps and None not in steps and all(info.more == 0 for info in many.values()):
        low, high = min(steps), max(steps)
        span = f"step {low}" if low == high else f"steps {low}-{high}"
        return f", in {span}, as each new shape first appeared"
    return f", none after step {warmup_steps}"


def analyze(summary: XlaSummary, *, warmup_steps: int = WARMUP_STEPS) -> list[Alert]:
    """Alerts for a summary, at PyTorch/XLA's own thresholds, most severe first.

    Args:
        summary: from `summarize`.
        warmup_steps: steps allowed to compile freely before compiles per step count.
    """
    # Compilations after the last step (saving, evaluation) are not the training step's.
    alerts = _compile_alerts(summary.steps_only(), warmup_steps)
    for rule in (_transfers_alert, graph_memory_alert, _fallback_alert, _slow_compile_alert,
                 _slow_execution_alert):
        alert = rule(summary)
        if alert is not None:
            alerts.append(alert)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(alerts, key=lambda alert: order.get(alert.severity, 3))


def _unit(summary: XlaSummary) -> str:
    return "step" if summary.ranks <= 1 else f"step of each of the {summary.ranks} ranks"


def _compile_alerts(summary: XlaSummary, warmup_steps: int) -> list[Alert]:
    """At most one of: compiles nearly every step, recompiles after warm-up (with the input
    whose shape changed), or inputs of many shapes that have not (yet) recompiled much."""
    steps = summary.steps
    changed = shape_changes(summary.input_shapes)
    compile_rate = summary.per_step(summary.compiles)
    every_step = compiles_every_step(summary)
    fires = bool(steps) and ((steps > warmup_steps and compile_rate > MAX_COMPILES_PER_STEP)
                             or every_step)
    row = recompiling_row(summary)
    many = {name: info for name, info in changed.items() if info.distinct > MAX_QUIET_SHAPES}
    line = recompiling_line(summary)
    if fires or (many and row is not None and row.graphs >= 2) or line is not None:
        # An input of many shapes and the line that compiled a graph per shape are settled facts:
        # from the first snapshot that shows both, the alert stays this one, its numbers
        # updated, whatever the rate does (#28: the live panel switched between two alerts
        # as the rate crossed torch_xla's threshold, and its height jumped each time). The
        # trace alone settles it too, `inputs=` or not: a line of the user's that compiled a
        # new graph after the warm-up, or more graphs than a few buckets explain.
        severity = "warning" if fires else cost_severity(summary)
        named = row if fires or many else line
        return [_frequent_compiles(summary, warmup_steps, _unit(summary), named, severity)]
    if summary.compiles_after_warmup and summary.steps_after_warmup and changed:
        cause, fix = compile_cause(summary)
        return [Alert(
            "recompiled", cost_severity(summary),
            f"Recompiling: {plural(summary.compiles, 'compile')} in {plural(steps or 0, 'step')}, "
            f"{summary.compiles_after_warmup} after warm-up",
            f"XLA compiled {plural(summary.compiles_after_warmup, 'new graph')} in the "
            f"{plural(summary.steps_after_warmup, 'step')} after warm-up."
            f"{share_text(summary)} {cause}",
            fix,
        )]
    return [_shape_changes_alert(summary, many, warmup_steps)] if many else []


def _transfers_alert(summary: XlaSummary) -> Alert | None:
    steps, transfers = summary.steps, summary.transfers_from_device
    transfer_rate = summary.per_step(transfers)
    if not (steps and steps >= MIN_RATE_STEPS and transfer_rate > MAX_TRANSFERS_PER_STEP):
        return None
    if summary.reshards:
        return _reshard_alert(summary)
    items = f", {summary.item_calls} of them .item() calls" if summary.item_calls else ""
    title, where, fix = _fetch_sites(summary)
    if _mask_check(summary):
        return Alert(
            "frequent-transfers", "warning",
            f"Device-to-host transfers: {transfers} in {steps} steps{title}",
            f"The program fetched values from the device {transfer_rate:.2f} times per "
            f"{_unit(summary)} (more than {MAX_TRANSFERS_PER_STEP}).{where} That is "
            "transformers' attention-mask check: it asks the device whether the padding mask "
            "is all ones (padding_mask.all()) at every forward pass, which cuts the step's "
            "graph in two and waits for the device.",
            "Pad every batch to one fixed length (tokenizer(..., padding='max_length', "
            "max_length=N, truncation=True)) and apply hfxla_nb's transformers patches around "
            "the training: `with hx.patches.applied(): ...` (hx.patches keeps the mask on "
            "XLA, with the same results; fine_tune applies them itself).",
        )
    return Alert(
        "frequent-transfers", "warning",
        f"Device-to-host transfers: {transfers} in {steps} steps{title}",
        f"The program fetched values from the device {transfer_rate:.2f} times per "
        f"{_unit(summary)} (more than {MAX_TRANSFERS_PER_STEP}){items}.{where} Each fetch waits "
        "for the device to finish and stops the next step's tracing from overlapping with it. "
        "Typical causes: .item(), print(tensor), `if tensor:`, logging every step (Trainer "
        "with logging_steps=1), and transformers' attention-mask check on padded batches.",
        f"{fix}{'f' if fix else 'F'}etch values only every N steps: "
        "hfxla_nb.report(loss=loss, log_every=N) or "
        "xm.add_step_closure; log less often; keep decisions on the host.",
    )


def _reshard_alert(summary: XlaSummary) -> Alert:
    """The transfers made by `xs.mark_sharding` on tensors already used (`observe.reshards`
    counted each by its line): found, not guessed (#28 item 3)."""
    steps, transfers = summary.steps, summary.transfers_from_device
    copies = sum(count for _, count in summary.reshards)
    first = summary.reshards[0][0].text()
    listed = "; ".join(f"{frame.text()} ({plural(count, 'time')})"
                       for frame, count in summary.reshards[:3])
    size = ""
    if summary.bytes_from_device and steps:
        size = f", {data_size(summary.bytes_from_device / steps)} a step"
    rest = transfers - copies
    others = (f" The other {plural(rest, 'transfer')} came from elsewhere (value reads)."
              if rest > 0 else "")
    return Alert(
        "frequent-transfers", "warning",
        f"Device-to-host transfers: {transfers} in {steps} steps, by mark_sharding at {first}",
        f"{copies} of the {plural(transfers, 'transfer')} were made by xs.mark_sharding on a "
        "tensor that an operation had already used, so torch_xla copied the tensor to the "
        f"host and back to shard it{size}: {listed}. Each copy waits for the device.{others}",
        f"At {first}: call xs.mark_sharding on the tensor right after it is created or moved "
        "to the device, before any operation uses it (or upload it sharded: "
        "MpDeviceLoader's input_sharding).",
    )


def _fallback_alert(summary: XlaSummary) -> Alert | None:
    if not summary.fallbacks:
        return None
    ops = ", ".join(f"{op} ({count}x)" for op, count in summary.fallbacks.items())
    return Alert(
        "cpu-fallback", "warning",
        f"Operations ran on the CPU: {', '.join(summary.fallbacks)}",
        f"PyTorch/XLA has no XLA lowering for {ops}: each call copies its inputs to the "
        "host, runs there and copies the result back, which splits the graph.",
        "Replace the operation with one XLA supports (for example masks and torch.where "
        "instead of nonzero/boolean indexing), or move it outside the training step.",
    )


def _slow_compile_alert(summary: XlaSummary) -> Alert | None:
    if summary.max_compile_seconds <= MAX_COMPILE_SECONDS:
        return None
    return Alert(
        "slow-compile", "warning",
        f"A compilation took {duration(summary.max_compile_seconds)}",
        f"One graph took longer than {MAX_COMPILE_SECONDS:.0f} s to compile; large graphs "
        "(long unrolled loops, huge models traced at once) compile slowly.",
        "Sync more often (torch_xla.sync() inside long loops), use scan for repeated "
        "layers, or turn on the persistent compile cache on TPU.",
    )


def _slow_execution_alert(summary: XlaSummary) -> Alert | None:
    if summary.max_execute_seconds <= MAX_EXECUTE_SECONDS:
        return None
    return Alert(
        "slow-execution", "warning",
        f"An execution took {duration(summary.max_execute_seconds)}",
        f"One graph ran for longer than {MAX_EXECUTE_SECONDS:.0f} s: the step may be doing "
        "far more work than intended (a graph that keeps growing because it is never cut).",
        "Call torch_xla.sync() (or use MpDeviceLoader) once per step.",
    )


# ---------------------------------------------------------------------------------------------
# Rules that use the compilation trace (torch_xla's analysis, `summary.trace`)
# ---------------------------------------------------------------------------------------------


def compiles_every_step(summary: XlaSummary) -> bool:
    """Whether nearly every step compiled a new graph, over at least `MIN_EVERY_STEP` steps
    (per rank, for rank threads sharing a process's counters): with a trace, one line
    compiled at least as many different graphs as there were steps (so the usual first-step
    graph and a final fetch do not count); without one, compiles >= steps."""
    if not summary.steps or summary.steps < MIN_EVERY_STEP:
        return False
    row = recompiling_row(summary)
    rate = summary.per_step(row.graphs if row is not None else summary.compiles)
    return rate is not None and rate >= 1.0


def recompiling_line(summary: XlaSummary) -> CompileRow | None:
    """The line of the user's code that recompiled, from the trace alone (no `inputs=`
    needed): it compiled at least 2 different graphs, and either first compiled one of them
    after the warm-up, or compiled more than `MAX_QUIET_GRAPHS` (the first step's graph and
    one per bucket of a few). The one with the most graphs; None without a trace or such a
    line. Once a snapshot shows it, every later one does (graphs are only added), so the
    alert it raises holds still."""
    trace = summary.trace
    if trace is None:
        return None
    warm = (summary.warmup_compiles
            if summary.compiles_after_warmup and summary.steps_after_warmup else None)
    for row in sorted(trace.rows(), key=lambda row: (-row.graphs, -row.compiles)):
        if row.where is None or row.graphs < 2:
            continue
        if row.graphs > MAX_QUIET_GRAPHS or (warm is not None and row.graphs_since(warm)):
            return row
    return None


def recompiling_row(summary: XlaSummary) -> CompileRow | None:
    """The traced line that compiled the most different graphs (None without a trace)."""
    trace = summary.trace
    rows = trace.rows() if trace is not None else []
    return max(rows, key=lambda row: (row.graphs, row.compiles), default=None)


def _frequent_compiles(summary: XlaSummary, warmup_steps: int, unit: str,
                       row: CompileRow | None, severity: str) -> Alert:
    """The recompile alert; `row` is the traced line that compiled the most different graphs
    (`recompiling_row`), None without a trace."""
    steps = summary.steps
    rate = summary.per_step(summary.compiles) or 0.0
    if steps <= warmup_steps:  # no warm-up words for a run no longer than the warm-up
        rule = "a new graph at nearly every step"
    else:
        rule = f"torch_xla warns above {MAX_COMPILES_PER_STEP}"
        # Only over enough steps to be a rate (the warm-up snapshot is read a step late).
        if (summary.compiles_after_warmup and summary.steps_after_warmup
                and summary.steps_after_warmup >= MIN_RATE_STEPS):
            rule += (f"; {summary.compiles_after_warmup} of them in the "
                     f"{plural(summary.steps_after_warmup, 'step')} after the first "
                     f"{warmup_steps}")
    numbers = (f"XLA compiled {rate:.2f} graphs per {unit} ({rule}), taking "
               f"{duration(summary.compile_seconds)}.{share_text(summary)}")
    if row is None or row.graphs < 2:
        cause, fix = compile_cause(summary)
        return Alert("frequent-compiles", severity,
                     f"Recompiling: {plural(summary.compiles, 'compile')} in "
                     f"{plural(steps or 0, 'step')}", f"{numbers} {cause}", fix)
    place = row.place()
    changed = shape_changes(summary.input_shapes)
    if changed:
        cause, fix = shapes_cause(changed), shapes_fix(changed, summary, opening="give")
    elif row.fetched:
        cause = ("Each of them was cut there by reading a tensor's value (torch_xla: "
                 f"\"{row.cause}\"), and the part of the step before the read differs from "
                 "step to step.")
        fix = ("remove the .item(), print(tensor) or `if tensor:` there; report values with "
               "hfxla_nb.report(loss=loss), which fetches them every few steps.")
    else:
        cause = ("A different graph from the same line means the step's graph changes: a "
                 "tensor shape that changes (dynamic padding, a smaller last batch, boolean "
                 "indexing, nonzero), or a branch or loop that depends on the data."
                 + ("" if summary.input_shapes else f" {INPUTS_HINT}"))
        fix = ("keep shapes and Python control flow the same in every step: pad to fixed "
               f"shapes (or a few buckets){last_batch_fix(summary)}.")
    return Alert(
        "frequent-compiles", severity,
        f"Recompiling: {place} compiled {row.graphs} different graphs in "
        f"{plural(steps or 0, 'step')}",
        f"{numbers} {row.compiles} of the {summary.compiles} graphs end at {place} "
        f"({row.cause_words()}), {row.graphs} of them different: what changes is in the "
        f"step's code that runs before that line. {cause}",
        f"At {place}: {fix}",
    )


# transformers' functions that read the padding mask on the device (`hx.patches` fixes them).
MASK_CHECKS = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa")


def _mask_check(summary: XlaSummary) -> bool:
    """Whether the traced fetches came from transformers' attention-mask check."""
    trace = summary.trace
    sites = trace.fetch_sites() if trace is not None else []
    return any(site.via is not None and site.via.function in MASK_CHECKS for site in sites)


def _fetch_sites(summary: XlaSummary) -> tuple[str, str, str]:
    """(title suffix, explanation, fix prefix) naming the lines whose value fetches ran the
    graph, from the trace; empty strings without one."""
    trace = summary.trace
    sites = [site for site in (trace.fetch_sites() if trace is not None else [])
             if site.where is not None or site.via is not None]
    if not sites and summary.item_calls and summary.item_lines:
        first = summary.item_lines[0]
        return (f", .item() at {first}",
                f" .item() is called at: {'; '.join(summary.item_lines[:3])}.", f"At {first}: ")
    if not sites:
        return "", "", ""
    first = sites[0]
    place = first.where.text() if first.where is not None else "library code"
    listed = "; ".join(
        (site.where.text() if site.where is not None else "library code")
        + (f" via {site.via.short()}" if site.via is not None else "")
        + f" ({site.count} {'time' if site.count == 1 else 'times'})"
        for site in sites[:3])
    where = (" torch_xla ran the step's graph early to read a value at: "
             f"{listed}.")
    return f", values read at {place}", where, f"At {place}: "


def graph_memory_alert(summary: XlaSummary) -> Alert | None:
    """A warning when the traced graph that needs the most memory needs more than one device
    has (a TPU's HBM, from the live memory or the generation table)."""
    trace = summary.trace
    largest = trace.largest() if trace is not None else None
    limit = (summary.memory or {}).get("bytes_limit") or (trace.device_memory if trace else None)
    if largest is None or not limit or (largest.memory or 0) <= limit:
        return None
    name = trace.device_name if trace.device_name else "one device"
    place = largest.where.text() if largest.where is not None else "library code"
    gib = 1024**3
    return Alert(
        "graph-memory", "warning",
        f"The graph compiled at {place} needs {largest.memory / gib:.1f} GiB; {name} has "
        f"{limit / gib:.1f} GiB",
        f"XLA's analysis of that graph: inputs, outputs, intermediate buffers and program need "
        f"{largest.memory / gib:.1f} GiB on each device, more than the {limit / gib:.1f} GiB "
        "there are: expect RESOURCE_EXHAUSTED (out of device memory) when it runs.",
        "Make the step smaller: a smaller batch (gradient_accumulation_steps keeps the "
        "effective batch), bfloat16 (precision='bf16'), gradient checkpointing with torch_xla's "
        "own checkpoint (torch_xla.utils.checkpoint; torch's is undone by the compiler), or "
        "shard parameters and optimizer state over the devices (FSDP via SPMD).",
    )
