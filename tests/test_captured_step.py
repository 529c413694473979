"""The training step run by its compiled graph (`train/worker/captured.py`): the first step of
a batch shape is traced, every later one runs the compiled graph on its data. Real fine_tune
workers on XLA:CPU, each step's loss compared with a run that traces every step."""

from __future__ import annotations

import dataclasses

import pytest

import hfxla_nb as hx
from hfxla_nb import demo
from hfxla_nb.train import prepare_fine_tune

pytestmark = pytest.mark.launch


def counted_worker(index: int, plan):
    """`fine_tune`'s worker, with the operations it traced on XLA (torch_xla counts each,
    `xla::add`...) and its executions."""
    import torch_xla.debug.metrics as met

    from hfxla_nb.train.worker import loop

    def traced() -> int:
        return sum(met.counter_value(name) or 0 for name in met.counter_names()
                   if name.startswith("xla::"))

    result = loop.train_worker(index, plan)
    aliased = met.metric_data("InputOutputAliasCount")  # per compiled graph: donated inputs
    return {"traced": traced(), "history": result["loss_history"],
            "compiles": result["compiles"], "executions": result["executions_per_step"],
            "aliased": int(aliased[2][-1][1]) if aliased else 0}


def run(plan, capture: bool = True, num_processes: int = 1, strategy: str = "spmd") -> dict:
    plan = dataclasses.replace(plan, capture_steps=capture)
    return hx.notebook_launcher(counted_worker, args=(plan,), num_processes=num_processes,
                                strategy=strategy, progress=False)


@pytest.fixture(scope="module")
def plans(cache):
    folder = demo.demo_model_dir(cache=cache)
    rows = demo.demo_dataset(n=400)

    def plan(steps: int, **options):
        return prepare_fine_tune(folder, rows, max_steps=steps, batch_size=16, log_every=1,
                                 output_dir=None, progress=False, **options)

    return plan


def test_later_steps_run_the_compiled_graph_and_trace_no_model_operation(plans):
    short, long, traced = run(plans(8)), run(plans(16)), run(plans(8), capture=False)
    # 8 more steps of the same shape: the batch and AdamW's numbers uploaded, the parameters
    # given the outputs' data (a `set_` each), against the model's thousands of ops a step.
    per_step = (long["traced"] - short["traced"]) / 8
    assert per_step < traced["traced"] / 8 / 10, (per_step, traced["traced"])
    assert short["compiles"] == long["compiles"] == traced["compiles"] == 1
    assert short["executions"] == long["executions"] == 1.0


def test_compiled_steps_give_the_traced_steps_losses_bit_for_bit(plans):
    plan = plans(12, max_grad_norm=1.0, gradient_accumulation_steps=2)
    compiled, traced = run(plan), run(plan, capture=False)
    assert compiled["history"] == traced["history"]  # dropout's seed moves on alike
    assert len({loss for _, loss in compiled["history"]}) > 1
    assert compiled["compiles"] == traced["compiles"] == 1
    assert compiled["executions"] == traced["executions"] == 1.0
    assert traced["traced"] > 3 * compiled["traced"]
    # A traced step's buffers: each parameter's, updated in place. A compiled step's: each
    # parameter's and its two moments' (one copy of each in memory).
    assert compiled["aliased"] == 3 * traced["aliased"] > 0


def test_over_a_mesh_of_4_devices_the_losses_are_the_traced_ones(plans):
    plan = plans(8)
    compiled = run(plan, num_processes=4)
    traced = run(plan, capture=False, num_processes=4)
    assert compiled["history"] == traced["history"] and compiled["compiles"] == 1
