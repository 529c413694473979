"""Pre-flight checks: every refusal happens before forking and says what to do."""

from __future__ import annotations

import pytest

from hfxla_nb.launch.preflight import LaunchRefusedError, check_function, plan_launch


def test_index_is_passed_when_the_function_needs_one_more_argument():
    assert check_function(lambda index, cfg: None, (1,)) is True
    assert check_function(lambda index: None, ()) is True
    assert check_function(lambda index, *rest: None, ()) is True


def test_accelerate_style_functions_get_only_args():
    assert check_function(lambda cfg: None, (1,)) is False
    assert check_function(lambda: None, ()) is False
    assert check_function(lambda cfg, extra=None: None, (1,)) is False


@pytest.mark.launch
def test_the_first_four_parameters_are_accelerates():
    """`from hfxla_nb import notebook_launcher` replaces accelerate's: the same first four
    parameters, by name, order, kind and default."""
    import inspect

    import accelerate

    import hfxla_nb

    def first_four(function):
        parameters = list(inspect.signature(function).parameters.values())[:4]
        return [(p.name, p.kind, p.default) for p in parameters]

    ours = first_four(hfxla_nb.notebook_launcher)
    assert ours == first_four(accelerate.notebook_launcher)
    assert [name for name, _, _ in ours] == ["function", "args", "num_processes",
                                             "mixed_precision"]


@pytest.mark.parametrize(
    ("function", "args", "expected"),
    [
        (42, (), "must be callable"),
        (lambda a: a, 5, "must be a tuple"),
        (lambda a: a, (1, 2, 3), "cannot be called with args=(1, 2, 3)"),
    ],
)
def test_bad_functions_and_args(function, args, expected):
    with pytest.raises(LaunchRefusedError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        check_function(function, args)


def test_cpu_replicated_means_virtual_devices_and_warns_about_collectives():
    plan = plan_launch("replicated", 4, "no", "cpu", 1)
    assert plan.world == 4
    assert plan.env["PJRT_DEVICE"] == "CPU" and plan.env["CPU_NUM_DEVICES"] == "4"
    assert any("strategy='spmd'" in note for note in plan.collective_notes)
    assert plan_launch("replicated", 1, "no", "cpu", 1).collective_notes == ()


def test_spmd_is_one_rank_over_every_device():
    plan = plan_launch("spmd", 8, "bf16", "cpu", 1)
    assert plan.world == 1 and plan.env["CPU_NUM_DEVICES"] == "8"
    assert plan.env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    tpu = plan_launch("spmd", None, "no", "tpu", 8)
    assert tpu.world == 1 and tpu.env["PJRT_DEVICE"] == "TPU" and "CPU_NUM_DEVICES" not in tpu.env


def test_debug_plans_cpu_processes_even_on_a_tpu_host():
    # That they are forked processes joined by gloo: tests/test_launch.py.
    plan = plan_launch("debug", 3, "no", "tpu", 8)
    assert plan.world == 3 and plan.env["PJRT_DEVICE"] == "CPU"
    assert plan_launch("debug", None, "no", "cpu", 1).world == 2


def test_tpu_uses_every_core():
    assert plan_launch("replicated", None, "no", "tpu", 8).world == 8
    with pytest.raises(LaunchRefusedError, match="this TPU host has 8 cores"):
        plan_launch("replicated", 3, "no", "tpu", 8)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"strategy": "ddp"}, "is not one of"),
        ({"mixed_precision": "fp8"}, "is not one of"),
        ({"num_processes": 0}, "positive integer"),
        ({"num_processes": True}, "positive integer"),
        ({"num_processes": 1000}, "at most 256"),
        ({"strategy": "debug", "num_processes": 65}, "more than this launcher allows"),
        ({"mixed_precision": "fp16", "accelerator_kind": "tpu", "device_count": 8}, "bf16"),
    ],
)
def test_impossible_plans_are_refused(kwargs, expected):
    arguments = dict(
        strategy="replicated",
        num_processes=None,
        mixed_precision="no",
        accelerator_kind="cpu",
        device_count=1,
    )
    arguments.update(kwargs)
    with pytest.raises(LaunchRefusedError, match=expected):
        plan_launch(**arguments)


def test_kaggle_tpu_workers_lose_the_multi_host_variables():
    plan = plan_launch("replicated", None, "no", "tpu", 8, environment="kaggle")
    assert plan.env["TPU_PROCESS_ADDRESSES"] is None and plan.env["CLOUD_TPU_TASK_ID"] is None
    assert "TPU_PROCESS_ADDRESSES" not in plan_launch("replicated", None, "no", "tpu", 8).env


def test_a_tpu_held_by_another_process_is_refused_with_its_pid_and_command():
    from hfxla_nb.launch.preflight import check_environment
    from hfxla_nb.runtime import Accelerator

    held = Accelerator("tpu", generation="v5e", chips=1, devices=1,
                       holders={4242: "python -m ipykernel_launcher -f kernel-1.json"})
    with pytest.raises(LaunchRefusedError) as error:
        check_environment(held, {"PJRT_DEVICE": "TPU"})
    message = str(error.value)
    assert "pid 4242: python -m ipykernel_launcher -f kernel-1.json" in message
    assert "kill 4242" in message
    check_environment(Accelerator("tpu", chips=1, devices=1), {"PJRT_DEVICE": "TPU"})
    with pytest.raises(LaunchRefusedError, match="CPU_NUM_DEVICES='0' is not a positive"):
        check_environment(Accelerator("cpu"), {"CPU_NUM_DEVICES": "0"})
