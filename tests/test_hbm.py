"""HBM exhaustion explained: XLA's real RESOURCE_EXHAUSTED texts (tests/data/hbm, each from the
public issue its first line names) give one line that says what needed how much of how much."""

from __future__ import annotations

from pathlib import Path

import pytest

from hfxla_nb.observe.alerts import (
    FIXES,
    explain_hbm_exhaustion,
    format_size,
    parse_hbm_exhaustion,
    parse_size,
)

DATA = Path(__file__).parent / "data" / "hbm"
GIB, MIB = 1024**3, 1024**2


def fixture(name: str) -> str:
    """A saved text without its first line (the issue it comes from)."""
    lines = (DATA / name).read_text().splitlines()
    assert lines[0].startswith("# https://github.com/"), f"{name} must name its source issue"
    return "\n".join(lines[1:])


FIRST_LINES = {
    "lwm_60_compile_v3.txt": (
        "TPU memory (HBM) exhausted while compiling: the program needs 21.95 GiB of the "
        "15.48 GiB one device has (6.47 GiB too much)."),
    "pytorch_xla_3532_compile.txt": (
        "TPU memory (HBM) exhausted while compiling: the program needs 29.80 GiB of the "
        "7.98 GiB one device has (21.82 GiB too much)."),
    "easydel_166_compile_program.txt": (
        "TPU memory (HBM) exhausted while compiling: the program needs 63.80 GiB of the "
        "30.75 GiB one device has (33.05 GiB too much)."),
    "pytorch_xla_1735_older_runtime.txt": (
        "TPU memory (HBM) exhausted at run time: 3.95 GiB were needed and 1.92 GiB were free of "
        "the device's 8.00 GiB (6.08 GiB held by tensors already on the device)."),
    "transformers_22328_runtime.txt": (
        "TPU memory (HBM) exhausted at run time: 10.51 GiB were needed and 8.97 GiB were free."),
    "pytorch_xla_8020_pjrt_allocate.txt": (
        "TPU memory (HBM) exhausted at run time: 196 MiB were needed and 134 MiB were free."),
    "pytorch_xla_7827_mark_step.txt": (
        "TPU memory (HBM) exhausted; XLA's message gives no figures (the allocator's full text "
        "is kept with the launch)."),
}


def test_every_saved_text_is_tested():
    saved = {path.name for path in DATA.glob("*.txt")}
    assert saved == set(FIRST_LINES) | {"not_hbm_pytorch_xla_9524_vmem.txt"}


@pytest.mark.parametrize("name", sorted(FIRST_LINES))
def test_each_real_text_gives_its_first_line(name):
    explanation = explain_hbm_exhaustion(fixture(name))
    assert explanation is not None
    assert explanation.splitlines()[0] == FIRST_LINES[name]


@pytest.mark.parametrize("name", sorted(FIRST_LINES))
def test_the_fixes_follow_in_order_of_cost(name):
    lines = explain_hbm_exhaustion(fixture(name)).splitlines()
    listed = [line.split(". ", 1)[1] for line in lines if line.startswith("  ")]
    order = [listed.index(fix) for fix in FIXES]
    assert order == sorted(order), "LoRA, bf16, checkpointing, fsdp, a smaller batch"
    assert "hx.plan_memory" in lines[-1]


def test_compile_time_figures():
    exhaustion = parse_hbm_exhaustion(fixture("lwm_60_compile_v3.txt"))
    assert exhaustion.when == "compile"
    assert exhaustion.needed == round(21.95 * GIB)
    assert exhaustion.available == exhaustion.capacity == round(15.48 * GIB)
    assert exhaustion.exceeded == round(6.47 * GIB)


def test_run_time_figures_and_the_program_breakdown():
    exhaustion = parse_hbm_exhaustion(fixture("pytorch_xla_1735_older_runtime.txt"))
    assert (exhaustion.when, exhaustion.needed, exhaustion.available) == (
        "run", round(3.95 * GIB), round(1.92 * GIB))
    assert exhaustion.capacity == 8 * GIB
    assert exhaustion.allocated == round(6.08 * GIB)
    assert exhaustion.program == round(4.34 * GIB)
    # 6.08 GiB already held, more than the program asked for: tensors kept across steps come
    # first among the fixes.
    assert exhaustion.fixes[0].startswith("tensors held across steps")


def test_the_largest_allocation_names_its_operator_and_line():
    exhaustion = parse_hbm_exhaustion(fixture("easydel_166_compile_program.txt"))
    assert exhaustion.program == round(63.80 * GIB)
    assert exhaustion.source == (
        "/home/air/workspace/EasyDel/src/easydel/modules/attention_module.py:1059")
    assert "self_attention" in exhaustion.operator
    assert exhaustion.fixes[-1].endswith("attention_module.py:1059")


def test_the_graph_or_line_is_named_when_the_caller_knows_it():
    text = fixture("pytorch_xla_3532_compile.txt")
    first = explain_hbm_exhaustion(text, where="fine_tune's training step").splitlines()[0]
    assert first.startswith("TPU memory (HBM) exhausted while compiling in fine_tune's training "
                            "step: the program needs 29.80 GiB")


def test_other_memory_spaces_and_other_errors_are_not_hbm():
    assert parse_hbm_exhaustion(fixture("not_hbm_pytorch_xla_9524_vmem.txt")) is None
    assert explain_hbm_exhaustion("RuntimeError: shape mismatch") is None
    assert parse_hbm_exhaustion("Ran out of memory in memory space hbm, no status") is None


@pytest.mark.parametrize(("text", "size"), [
    ("0B", 0), ("4.0K", 4096), ("530.00M", 530 * MIB), ("21.95G", round(21.95 * GIB)),
    ("1.5GiB", round(1.5 * GIB)), ("-2.55G", round(-2.55 * GIB)),
])
def test_sizes_are_read_in_binary_units(text, size):
    assert parse_size(text) == size


def test_sizes_are_written_for_people():
    assert format_size(round(21.95 * GIB)) == "21.95 GiB"
    assert format_size(530 * MIB) == "530 MiB"
    assert format_size(12) == "12 B"
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
