"""The precision a run uses, decided once for the kernel's memory plan and the worker alike
(below both `plan.py` and `memory_plan.py`, which import it)."""

from __future__ import annotations


def resolve_precision(requested: str, device_type: str | None) -> str:
    """The precision a run uses: "auto" is bfloat16 autocast on a TPU (its native fast
    type), float32 elsewhere (XLA on the CPU has no fast bfloat16)."""
    if requested != "auto":
        return requested
    return "bf16" if device_type == "TPU" else "fp32"
