"""LoRA vs full fine-tuning of the demo's tiny Llama under FSDPv2 on 4 devices (CPU virtual
devices without a TPU): tokens/s of each and their ratio, training graphs (1 expected), the
trainable share, and the memory plan's total per device against what XLA's post-compilation
analysis says the largest traced graph needs (target: within 0.5x-2x), for the tiny Llama and
for a larger Llama built from a config (3.0M parameters; a few steps, for its graph only).

Each run is a fresh forked worker; rates are medians over the progress updates after the
warm-up of one run (the two runs are not alternated). `run() -> list[Figure]`; wire it into
bench/run.py's FIGURES as `11: ("LoRA", "lora")`.
"""

from __future__ import annotations

import contextlib

from . import common, workloads
from .scaling import SKIP_STEPS, TraceRecorder, steps_per_second

GROUP = "11 LoRA"
DEVICES = 4


@contextlib.contextmanager
def recorded():
    """Launches in this block keep their compilations in the yielded list's recorders."""
    from hfxla_nb.launch import launcher

    made: list[TraceRecorder] = []
    original = launcher.launch_display

    def display(world, *args, **kwargs):  # whatever else the launcher passes
        made.append(TraceRecorder(world))
        return made[-1]

    launcher.launch_display = display
    try:
        yield made
    finally:
        launcher.launch_display = original


def run() -> list[common.Figure]:
    import hfxla_nb as hx
    from hfxla_nb.demo.lm import TEMPLATE, demo_lm_dataset, demo_lm_model_dir

    steps = 30 if common.QUICK else 40
    model = demo_lm_model_dir()
    length, batch = 64, 16
    data = demo_lm_dataset(n=steps * batch * 2)["train"]
    figures, rates = [], {}
    for lora in (False, True):
        with recorded() as displays:
            raw = workloads.fine_tune_measured(
                model, data, task="causal-lm", prompt_column="prompt",
                response_column="response", template=TEMPLATE, max_length=length,
                max_steps=steps, batch_size=batch, learning_rate=3e-3, sharding="fsdp",
                num_processes=DEVICES, output_dir=None, progress=False, lora=lora)
        kind = "LoRA" if lora else "full"
        rate = steps_per_second(raw)
        rates[kind] = rate * batch * length if rate else None
        largest = displays[0].trace.largest() if displays else None
        measured = largest.memory if largest is not None else None
        # The plan fine_tune made before the fork, for the same settings.
        plan = hx.plan_memory(model, batch_size=batch, max_length=length, lora=lora,
                              sharding="fsdp", devices=DEVICES, hardware="cpu")
        planned = plan.total_gib * 2**30
        updates = len(workloads.steady_step_seconds(raw["bench_step_times"], SKIP_STEPS))
        common.say(f"  {kind}: {rates[kind]} tokens/s, {raw['compiles']} compiles, largest "
                   f"graph {measured} B, plan {planned} B")
        where = f"tiny Llama, {kind} fine-tune, fsdp on {DEVICES} devices"
        figures.append(common.Figure(GROUP, f"{where}: tokens/s", rates[kind], "tokens/s",
                                     repeats=updates, note=f"batch {batch} x {length}, "
                                     f"{steps} steps; median of the updates"))
        figures.append(common.Figure(GROUP, f"{where}: training graphs", raw["compiles"],
                                     "graphs", "== 1", raw["compiles"] == 1, 1, "1 run"))
        if lora and raw.get("parameters"):
            figures.append(common.Figure(
                GROUP, f"{where}: trainable share",
                raw["trainable_parameters"] / raw["parameters"], "x", repeats=1,
                note=f"{raw['trainable_parameters']:,} of {raw['parameters']:,} parameters"))
        ratio = measured / planned if measured and planned else None
        figures.append(common.Figure(
            GROUP, f"{where}: largest graph's memory / memory plan", ratio, "x",
            "0.5-2", None if ratio is None else 0.5 <= ratio <= 2, 1,
            f"XLA {measured} B per device, plan {planned} B; 1 run"))
    full, lora_rate = rates.get("full"), rates.get("LoRA")
    figures.append(common.Figure(
        GROUP, f"tiny Llama on {DEVICES} devices: tokens/s LoRA / full",
        lora_rate / full if lora_rate and full else None, "x", repeats=1,
        note="ratio of the two medians above (separate runs)"))
    figures += [larger_memory_figure(lora, model, data, batch, length) for lora in (False, True)]
    return figures


def larger_llama() -> object:
    """A Llama built from a config, 28x the tiny one's parameters (on the CPU, no download)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=266, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return transformers.LlamaForCausalLM(config)


def larger_memory_figure(lora: bool, tokenizer: str, data: object, batch: int,
                         length: int) -> common.Figure:
    """XLA's measured graph memory / the plan for the larger Llama (4 steps: its graph)."""
    import hfxla_nb as hx
    from hfxla_nb.demo.lm import TEMPLATE

    model = larger_llama()
    with recorded() as displays:
        workloads.fine_tune_measured(
            model, data, task="causal-lm", prompt_column="prompt", response_column="response",
            template=TEMPLATE, max_length=length, max_steps=4, batch_size=batch,
            learning_rate=3e-3, sharding="fsdp", num_processes=DEVICES, output_dir=None,
            progress=False, lora=lora, tokenizer=tokenizer)
    largest = displays[0].trace.largest() if displays else None
    measured = largest.memory if largest is not None else None
    plan = hx.plan_memory(model, batch_size=batch, max_length=length, lora=lora,
                          sharding="fsdp", devices=DEVICES, hardware="cpu")
    planned = plan.total_gib * 2**30
    ratio = measured / planned if measured and planned else None
    kind = "LoRA" if lora else "full"
    return common.Figure(
        GROUP, f"Llama from a config ({plan.parameters:,} parameters), {kind} fine-tune, fsdp "
        f"on {DEVICES} devices: largest graph's memory / memory plan", ratio, "x", "0.5-2",
        None if ratio is None else 0.5 <= ratio <= 2, 1,
        f"XLA {measured} B per device, plan {planned:.0f} B; 1 run")
