"""TPU memory (HBM) exhaustion: XLA's RESOURCE_EXHAUSTED texts read into data and explained.

XLA says a program does not fit a TPU's HBM in a few forms, all a wall of allocator text:

- at compile time: "Ran out of memory in memory space hbm. Used 21.95G of 15.48G hbm.
  Exceeded hbm capacity by 6.47G." (with "Program hbm requirement" and the largest allocations);
- at run time: "Attempting to reserve 10.51G at the bottom of memory. That was not possible.
  There are 8.97G free" (with the "Program hbm requirement" breakdown), or under PJRT
  "Error allocating device buffer: Attempting to allocate 196.00M. That was not possible. There
  are 134.44M free.";
- the older "Resource exhausted: ..." spelling of the same, with "HBM capacity 8.00G".

`parse_hbm_exhaustion` reads any of them into an `HbmExhaustion`; its `explain()` gives one line
that says what needed how much of how much, then the fixes in order of cost. Pure functions of
the text: nothing here imports torch_xla or renders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# XLA prints sizes with tsl's HumanReadableNumBytes: binary units, "0B", "4.0K", "21.95G".
_SIZE = r"(-?[\d.,]+\s*(?:[KMGTPE](?:iB|B)?|B))"
_UNITS = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}

_EXHAUSTED = re.compile(r"RESOURCE_EXHAUSTED|Resource exhausted", re.IGNORECASE)
_MEMORY_SPACE = re.compile(r"Ran out of memory in memory space (\w+)")
_COMPILE = re.compile(rf"Used {_SIZE} of {_SIZE} hbm")
_EXCEEDED = re.compile(rf"Exceeded hbm capacity by {_SIZE}")
_RESERVE = re.compile(
    rf"Attempting to (reserve|allocate) {_SIZE}(?: at the bottom of memory)?\. "
    rf"That was not possible\. There are {_SIZE} free")
_CAPACITY = re.compile(rf"HBM capacity {_SIZE}", re.IGNORECASE)
_ALLOCATED = re.compile(rf"Currently allocated:\s*{_SIZE}")
_PROGRAM = re.compile(rf"Program hbm requirement {_SIZE}")
_OPERATOR = re.compile(r'Operator: op_name="([^"]*)"')
_SOURCE = re.compile(r'source_file="([^"]+)" source_line=(\d+)')

# The same changes, in the same order of cost, as `hx.plan_memory` proposes (docs/memory.md).
FIXES = (
    "LoRA (fine_tune(..., lora=True)): only small adapters train; the frozen base needs no "
    "gradients and no optimizer state",
    "bfloat16 (precision='bf16'): activations take half the memory, and so does a frozen base",
    "gradient checkpointing: only each layer's input is kept, the rest is recomputed in the "
    "backward pass",
    "sharding='fsdp': parameters, gradients and optimizer state split over the devices (more "
    "chips, e.g. a v5e-8, split them further)",
    "a smaller batch_size (with gradient_accumulation_steps to keep the effective batch)",
)


def parse_size(text: str) -> int:
    """Bytes of a size as XLA prints it ("21.95G", "530.00M", "4.0K", "0B"; binary units)."""
    match = re.fullmatch(r"(-?[\d.,]+)\s*([KMGTPE]?)(?:iB|B)?", text.strip())
    if match is None:
        raise ValueError(f"not a size as XLA prints one: {text!r}")
    number, unit = match.groups()
    return round(float(number.replace(",", "")) * 1024 ** _UNITS[unit or "B"])


def format_size(size: int) -> str:
    """A size for people: "21.95 GiB", "530 MiB", "4 KiB", "12 B"."""
    magnitude = abs(size)
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if magnitude >= 1024**power:
            value = size / 1024**power
            return f"{value:.2f} {unit}" if unit in ("TiB", "GiB") else f"{value:.0f} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class HbmExhaustion:
    """What a RESOURCE_EXHAUSTED text says about a TPU device's memory. Sizes are bytes; a
    figure the text does not give is None.

    Attributes:
        when: "compile" (the program cannot fit at all), "run" (it did not fit what was free
            when it ran), or "unknown" (the text names no figures).
        needed: what was asked for: the program's HBM use at compile time, the reservation or
            buffer at run time.
        available: what there was: the device's usable HBM at compile time, what was free at
            run time.
        capacity: the device's HBM, when the text gives it ("HBM capacity 8.00G", or the
            compile-time "of 15.48G").
        exceeded: by how much the compiled program is over (compile time).
        allocated: what live buffers held when the run-time request came ("Currently
            allocated"): tensors kept from earlier steps, the model, the optimizer state.
        program: the "Program hbm requirement" total.
        operator: the op of the largest program allocation, when the text lists it.
        source: "file:line" of that allocation, when the text gives it.
    """

    when: Literal["compile", "run", "unknown"]
    needed: int | None = None
    available: int | None = None
    capacity: int | None = None
    exceeded: int | None = None
    allocated: int | None = None
    program: int | None = None
    operator: str | None = None
    source: str | None = None

    def first_line(self, where: str | None = None) -> str:
        """One line: what needed how much of how much. `where` names the graph or the user's
        line ("fine_tune's training step", "train.py:42") when the caller knows it."""
        place = f" in {where}" if where else ""
        if self.when == "compile" and self.needed is not None and self.available is not None:
            over = self.exceeded if self.exceeded is not None else self.needed - self.available
            return (f"TPU memory (HBM) exhausted while compiling{place}: the program needs "
                    f"{format_size(self.needed)} of the {format_size(self.available)} one device "
                    f"has ({format_size(over)} too much).")
        if self.when == "run" and self.needed is not None and self.available is not None:
            text = (f"TPU memory (HBM) exhausted at run time{place}: "
                    f"{format_size(self.needed)} were needed and {format_size(self.available)} "
                    "were free")
            if self.capacity is not None:
                text += f" of the device's {format_size(self.capacity)}"
            if self.allocated is not None:
                text += f" ({format_size(self.allocated)} held by tensors already on the device)"
            return text + "."
        return (f"TPU memory (HBM) exhausted{place}; XLA's message gives no figures "
                "(the allocator's full text is kept with the launch).")

    @property
    def fixes(self) -> tuple[str, ...]:
        """What to change, cheapest first; a run-time failure with much memory already held
        first points at tensors kept alive across steps."""
        fixes = list(FIXES)
        if self.when == "run" and self.allocated and self.needed and (
                self.allocated >= self.needed):
            fixes.insert(0, "tensors held across steps: keep no device tensors alive between "
                            "steps (a list of losses: fetch them as floats every N steps), and "
                            "delete what the previous cell left on the device")
        if self.source:
            fixes.append(f"the largest allocation comes from {self.source}")
        return tuple(fixes)

    def explain(self, where: str | None = None) -> str:
        """The first line, then the fixes numbered in order of cost."""
        lines = [self.first_line(where), "What would make it fit, cheapest first:"]
        lines += [f"  {number}. {fix}" for number, fix in enumerate(self.fixes, start=1)]
        lines.append("hx.plan_memory(model, batch_size=..., max_length=...) shows what fits "
                     "before a launch.")
        return "\n".join(lines)


def parse_hbm_exhaustion(text: str) -> HbmExhaustion | None:
    """Read XLA's text about exhausted TPU memory into an `HbmExhaustion`.

    Args:
        text: an exception message, a traceback or a worker's output.

    Returns:
        The figures the text gives, or None when it is not about HBM: no RESOURCE_EXHAUSTED,
        or another memory space (vmem, smem: compiler limits a smaller batch does not fix).
    """
    space = _MEMORY_SPACE.search(text)
    if space is not None and space.group(1).lower() != "hbm":
        return None
    if _EXHAUSTED.search(text) is None:
        return None
    details = {
        "capacity": _size(_CAPACITY, text),
        "allocated": _size(_ALLOCATED, text),
        "program": _size(_PROGRAM, text),
        "operator": _group(_OPERATOR, text),
        "source": _source(text),
    }
    compile_match = _COMPILE.search(text)
    if compile_match is not None:
        used, usable = (parse_size(size) for size in compile_match.groups())
        details["capacity"] = details["capacity"] or usable
        return HbmExhaustion("compile", needed=used, available=usable,
                             exceeded=_size(_EXCEEDED, text), **details)
    run_match = _RESERVE.search(text)
    if run_match is not None:
        _, needed, free = run_match.groups()
        return HbmExhaustion("run", needed=parse_size(needed), available=parse_size(free),
                             **details)
    return HbmExhaustion("unknown", **details)


def explain_hbm_exhaustion(text: str, where: str | None = None) -> str | None:
    """`parse_hbm_exhaustion(text).explain(where)`, or None when the text is not about HBM."""
    exhaustion = parse_hbm_exhaustion(text)
    return None if exhaustion is None else exhaustion.explain(where)


def _size(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return None if match is None else parse_size(match.group(1))


def _group(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    return None if match is None else match.group(1)


def _source(text: str) -> str | None:
    match = _SOURCE.search(text)
    return None if match is None else f"{match.group(1)}:{match.group(2)}"
