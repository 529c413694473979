"""hfxla_nb.runtime: hardware detection on fake sysfs/dev trees, environments, problems,
redaction, the panels, configure(), and the guarantee that detect() never starts XLA."""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import pytest

from hfxla_nb import _xla
from hfxla_nb.runtime import (
    Accelerator,
    Problem,
    RuntimeAlreadyStartedError,
    RuntimeInfo,
    TpuNotFoundError,
    accelerator_from_facts,
    configure,
    detect,
    detect_accelerator,
    detect_environment,
    find_device_holders,
    find_problems,
    generation_from_accelerator_type,
    redact_environment,
    scan_device_files,
)
from hfxla_nb.ui.panels import runtime_html, runtime_text
from tests.helpers import run_python

EXPECTED = {  # generation: (cores per chip, HBM GiB per chip, device-file kind)
    "v2": (2, 16, "/dev/accel"),
    "v3": (2, 32, "/dev/accel"),
    "v4": (1, 32, "/dev/accel"),
    "v5e": (1, 16, "/dev/vfio/"),
    "v5p": (1, 95, "/dev/vfio/"),
    "v6e": (1, 32, "/dev/vfio/"),
    "7x": (2, 192, "/dev/vfio/"),
}

# PCI (device, subsystem) ids written down independently of the implementation's table, from
# tpu-info (tpu_info/device.py) and torch_xla 2.9 (torch_xla/_internal/tpu.py).
PCI_IDS = {
    "v2": ("0x0027", "0x004e"),
    "v3": ("0x0027", "0x004f"),
    "v4": ("0x005e", "0x0000"),
    "v5e": ("0x0063", "0x0000"),
    "v5p": ("0x0062", "0x0000"),
    "v6e": ("0x006f", "0x0000"),
    "7x": ("0x0076", "0x0000"),
}
MATCHING = {"python": "3.11.7", "torch": "2.9.0", "torch_xla": "2.9.0", "libtpu": "0.0.21"}


# ---------------------------------------------------------------------------------------------
# Fake machines
# ---------------------------------------------------------------------------------------------


def make_tpu_host(
    root: Path, generation: str, chips: int = 4, *, subsystem: str | None = None, dev: bool = True
) -> Path:
    """A fake `/sys` + `/dev` tree with `chips` TPU chips of `generation` and one Intel device."""
    device, default_subsystem = PCI_IDS.get(generation, ("0x0027", "0x0000"))
    pci = root / "sys/bus/pci/devices"
    other = pci / "0000:00:01.0"  # a non-Google device must be ignored
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x8086\n")
    (other / "device").write_text("0x0027\n")
    for index in range(chips):
        folder = pci / f"0000:00:{index + 4:02x}.0"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text("0x1ae0\n")
        (folder / "device").write_text(f"{device}\n")
        sub = subsystem or default_subsystem
        (folder / "subsystem_device").write_text(f"{sub}\n")
    if dev:
        make_device_files(root, generation, chips)
    return root


def make_device_files(root: Path, generation: str, chips: int) -> None:
    (root / "dev/vfio").mkdir(parents=True, exist_ok=True)
    if generation in ("v2", "v3", "v4"):
        for index in range(chips):
            (root / f"dev/accel{index}").write_text("")
    else:
        (root / "dev/vfio/vfio").write_text("")  # VFIO's control file: not a chip
        for index in range(chips):
            (root / f"dev/vfio/{index}").write_text("")


def holds(root: Path, pid: int, target: str, comm: str = "python3") -> None:
    """Fake `/proc/<pid>` whose fd 3 links to `target`."""
    fd = root / f"proc/{pid}/fd"
    fd.mkdir(parents=True, exist_ok=True)
    (root / f"proc/{pid}/comm").write_text(f"{comm}\n")
    os.symlink(target, fd / "3")


def problems_for(**overrides) -> list[Problem]:
    """`find_problems` on a healthy CPU machine, with some facts replaced."""
    facts = {
        "accelerator": Accelerator(kind="cpu", devices=1, host_cores=2),
        "environment": "terminal",
        "versions": dict(MATCHING),
        "runtime_initialized": False,
        "environ": {"PJRT_DEVICE": "CPU"},
    }
    facts.update(overrides)
    return find_problems(**facts)


def tpu(generation: str = "v5e", chips: int = 4, **fields) -> Accelerator:
    cores, hbm, _ = EXPECTED[generation]
    values = {
        "kind": "tpu",
        "generation": generation,
        "chips": chips,
        "cores_per_chip": cores,
        "devices": chips * cores,
        "hbm_per_chip_gib": hbm,
        "found_by": ["PCI", "/dev/vfio/* x4"],
    }
    values.update(fields)
    return Accelerator(**values)


def titles(problems: list[Problem], severity: str | None = None) -> str:
    return "\n".join(p.title for p in problems if severity in (None, p.severity))


@pytest.fixture
def runtime_not_started(monkeypatch):
    """Other test modules may start XLA in this pytest process; configure() refuses then.
    The real check runs in a fresh subprocess below."""
    monkeypatch.setattr(_xla, "runtime_is_initialized", lambda: False)


# ---------------------------------------------------------------------------------------------
# Hardware
# ---------------------------------------------------------------------------------------------



@pytest.mark.parametrize("generation", sorted(EXPECTED))
def test_each_tpu_generation_from_a_fake_tree(tmp_path, generation):
    cores, hbm, files = EXPECTED[generation]
    make_tpu_host(tmp_path, generation, chips=4)
    accelerator = detect_accelerator(str(tmp_path), {})
    assert accelerator.kind == "tpu"
    assert accelerator.generation == generation
    assert (accelerator.chips, accelerator.cores_per_chip) == (4, cores)
    assert accelerator.devices == 4 * cores
    assert accelerator.hbm_per_chip_gib == hbm
    assert accelerator.found_by[0].startswith("PCI 0x1ae0:")
    assert any(item.startswith(files) for item in accelerator.found_by)
    assert accelerator.holders == {}


def test_no_tpu_is_a_cpu_with_virtual_devices(tmp_path):
    accelerator = detect_accelerator(str(tmp_path), {})
    assert (accelerator.kind, accelerator.devices, accelerator.chips) == ("cpu", 1, 0)
    assert accelerator.host_cores == os.cpu_count()
    assert accelerator.generation is None and accelerator.hbm_per_chip_gib is None
    assert detect_accelerator(str(tmp_path), {"CPU_NUM_DEVICES": "8"}).devices == 8
    # Variables alone never make a TPU.
    assert detect_accelerator(str(tmp_path), {"PJRT_DEVICE": "TPU"}).kind == "cpu"


def test_device_files_without_pci_use_the_accelerator_type(tmp_path):
    make_device_files(tmp_path, "v5e", 8)
    accelerator = detect_accelerator(str(tmp_path), {"TPU_ACCELERATOR_TYPE": "v5litepod-8"})
    assert (accelerator.kind, accelerator.generation, accelerator.devices) == ("tpu", "v5e", 8)
    assert "TPU_ACCELERATOR_TYPE=v5litepod-8" in accelerator.found_by
    assert scan_device_files(str(tmp_path)) == [f"/dev/vfio/{i}" for i in range(8)]


def test_v2_or_v3_with_unknown_subsystem_still_has_two_cores(tmp_path):
    make_tpu_host(tmp_path, "v3", chips=4, subsystem="0x0999")
    accelerator = detect_accelerator(str(tmp_path), {})
    assert (accelerator.generation, accelerator.devices, accelerator.hbm_per_chip_gib) == (
        "v2/v3",
        8,
        None,
    )


@pytest.mark.parametrize(
    "value, expected",
    [
        ("v2-8", "v2"),
        ("v3-8", "v3"),
        ("v4-16", "v4"),
        ("v5litepod-8", "v5e"),
        ("v5e-4", "v5e"),
        ("v5p-8", "v5p"),
        ("v6e-8", "v6e"),
        ("tpu7x-8", "7x"),
        ("", None),
        ("a100", None),
    ],
)
def test_generation_from_accelerator_type(value, expected):
    assert generation_from_accelerator_type(value) == expected


def test_pci_decides_chips_and_generation_over_device_files():
    pci = [("0x0063", "0x0000")] * 4
    files = [f"/dev/vfio/{i}" for i in range(2)]  # a container that passed only two chips
    accelerator = accelerator_from_facts(
        pci, files, {"TPU_ACCELERATOR_TYPE": "v6e-8"}, host_cores=96, holders={9: "python"}
    )
    assert (accelerator.generation, accelerator.chips, accelerator.devices) == ("v5e", 4, 4)
    assert accelerator.holders == {9: "python"} and accelerator.host_cores == 96
    assert accelerator.found_by == ["PCI 0x1ae0:0x0063 x4", "/dev/vfio/* x2"]


def test_gpus_are_noted_and_used_only_when_pjrt_asks(tmp_path):
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / name).write_text("")
    accelerator = detect_accelerator(str(tmp_path), {"PJRT_DEVICE": "CPU"})
    assert (accelerator.kind, accelerator.gpus) == ("cpu", 2)
    assert "2 NVIDIA GPUs" in accelerator.description
    assert "2 NVIDIA GPUs found" in titles(problems_for(accelerator=accelerator), "info")
    gpu = detect_accelerator(str(tmp_path), {"PJRT_DEVICE": "CUDA"})
    assert (gpu.kind, gpu.devices) == ("gpu", 2)
    driver_only = tmp_path / "driver_only"
    (driver_only / "proc/driver/nvidia").mkdir(parents=True)
    assert detect_accelerator(str(driver_only), {}).gpus == 1


def test_processes_holding_the_tpu_are_found_except_this_one(tmp_path):
    make_tpu_host(tmp_path, "v5e", chips=4)
    holds(tmp_path, 4242, "/dev/vfio/0", comm="python3")
    holds(tmp_path, 77, "/dev/accel1", comm="jupyter")
    holds(tmp_path, 4243, "/dev/null")
    holds(tmp_path, os.getpid(), "/dev/vfio/1")
    assert find_device_holders(str(tmp_path)) == {4242: "python3", 77: "jupyter"}
    info = detect(sys_root=str(tmp_path), environ={"PJRT_DEVICE": "TPU"})
    assert info.accelerator.holders == {77: "jupyter", 4242: "python3"}
    held = [p for p in info.problems if "held by another process" in p.title]
    assert len(held) == 1 and held[0].severity == "error"
    assert "77 (jupyter)" in held[0].title and "kill 77 4242" in held[0].fix
    assert not info.ok


def test_a_sessions_worker_holding_the_tpu_is_not_another_process(tmp_path):
    """A warm session's workers (this process's children and grandchildren) hold the TPU by
    design: a launch closes them before it forks, so they are no problem and no refusal. A
    worker whose kernel died (its parent is init now) is one."""
    make_tpu_host(tmp_path, "v5e", chips=4)
    own = os.getpid()
    for pid, parent in ((501, own), (502, 501), (503, 1)):
        holds(tmp_path, pid, "/dev/vfio/0")
        (tmp_path / f"proc/{pid}/stat").write_text(f"{pid} (python3) S {parent} {pid} 0\n")
    assert find_device_holders(str(tmp_path)) == {503: "python3"}
    info = detect(sys_root=str(tmp_path), environ={"PJRT_DEVICE": "TPU"})
    assert info.accelerator.holders == {503: "python3"}


@pytest.mark.launch
def test_one_call_looks_at_the_host_once_and_the_next_call_looks_again(tmp_path, monkeypatch):
    """Within `one_call()` (one fine_tune / notebook_launcher / predict) the host is scanned
    once, a nested call included; the environment is still read each time. After it, a new
    holder of the TPU (another notebook started between two cells) is seen."""
    from hfxla_nb.runtime import environment, one_call

    make_tpu_host(tmp_path, "v5e", chips=4)
    scans = []
    holders = environment.find_device_holders
    monkeypatch.setattr(environment, "find_device_holders",
                        lambda root, own_pid=None: scans.append(root) or holders(root, own_pid))
    root = str(tmp_path)
    with one_call():
        assert detect_accelerator(root, {}).holders == {}
        holds(tmp_path, 4242, "/dev/vfio/0")
        with one_call():
            assert detect(sys_root=root, environ={}).accelerator.holders == {}
        assert detect_accelerator(root, {"PJRT_DEVICE": "TPU"}).found_by[-1] == "PJRT_DEVICE=TPU"
    assert len(scans) == 1
    assert detect_accelerator(root, {}).holders == {4242: "python3"}
    assert len(scans) == 2
    # A process forked within a call (a worker) inherits no answers: it looks for itself.
    with one_call():
        detect_accelerator(root, {})
        pid = os.fork()
        if pid == 0:
            detect_accelerator(root, {})
            os._exit(0 if len(scans) == 4 else 1)
        assert os.waitpid(pid, 0)[1] == 0
    assert len(scans) == 3


def test_a_holder_is_named_by_its_command_line_when_proc_shows_it(tmp_path):
    make_tpu_host(tmp_path, "v5e", chips=1)
    holds(tmp_path, 4242, "/dev/vfio/0", comm="python3")
    (tmp_path / "proc/4242/cmdline").write_bytes(b"python3\0-m\0ipykernel_launcher\0-f\0k.json\0")
    assert find_device_holders(str(tmp_path)) == {4242: "python3 -m ipykernel_launcher -f k.json"}


# ---------------------------------------------------------------------------------------------
# Where it runs
# ---------------------------------------------------------------------------------------------


class ZMQInteractiveShell:
    """Stands in for ipykernel's shell class (only its name is looked at)."""


class TerminalInteractiveShell:
    pass


def ipython_modules(shell_class) -> dict:
    ipython = types.SimpleNamespace(get_ipython=lambda: shell_class())
    return {"IPython": ipython, "ipykernel": types.ModuleType("ipykernel")}


@pytest.mark.parametrize(
    "environ, kwargs, expected",
    [
        ({"COLAB_RELEASE_TAG": "release-colab_20260801"}, {"tpu_present": True}, "colab"),
        ({"COLAB_GPU": "0"}, {}, "colab"),
        ({}, {"colab_installed": True}, "colab"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, {"tpu_present": True}, "kaggle"),
        ({"KAGGLE_URL_BASE": "https://www.kaggle.com"}, {}, "kaggle"),
        ({"TPU_ACCELERATOR_TYPE": "v4-8"}, {}, "tpu-vm"),
        ({"TPU_WORKER_ID": "0"}, {}, "tpu-vm"),
        ({}, {"tpu_present": True}, "tpu-vm"),
        ({"VSCODE_PID": "123"}, {}, "vscode"),
        ({"VSCODE_IPC_HOOK_CLI": "/tmp/x"}, {}, "vscode"),
        ({}, {"modules": ipython_modules(ZMQInteractiveShell)}, "jupyter"),
        ({}, {"modules": ipython_modules(TerminalInteractiveShell)}, "terminal"),
        ({"HOME": "/root", "TERM": "xterm"}, {}, "terminal"),
    ],
)
def test_environment(environ, kwargs, expected):
    kwargs.setdefault("modules", {})
    assert detect_environment(environ, **kwargs) == expected


def test_jupyter_needs_ipykernel_loaded():
    modules = ipython_modules(ZMQInteractiveShell)
    del modules["ipykernel"]
    assert detect_environment({}, modules=modules) == "terminal"


def test_detect_reads_the_given_environ(tmp_path):
    info = detect(sys_root=str(tmp_path), environ={"KAGGLE_KERNEL_RUN_TYPE": "Batch"})
    assert info.environment == "kaggle"
    assert detect(sys_root=str(tmp_path), environ={"VSCODE_PID": "1"}).environment == "vscode"


# ---------------------------------------------------------------------------------------------
# Problems
# ---------------------------------------------------------------------------------------------


def test_a_healthy_machine_has_no_problems():
    assert problems_for() == []
    assert problems_for(accelerator=tpu(), environ={"PJRT_DEVICE": "TPU"}) == []


def test_torch_and_torch_xla_minor_mismatch():
    versions = dict(MATCHING, torch="2.9.0+cpu", torch_xla="2.8.1")
    (problem,) = problems_for(versions=versions)
    assert problem.severity == "error"
    assert "2.9.0+cpu" in problem.title and "2.8.1" in problem.title
    assert "pip install 'torch_xla==2.9.*' to match torch 2.9" in problem.fix
    (colab,) = problems_for(versions=versions, environment="colab")
    assert "Do not reinstall torch on Colab" in colab.fix
    assert problems_for(versions=dict(MATCHING, torch_xla="2.9.1")) == []


def test_torch_newer_than_every_torch_xla_goes_back_to_torch_xlas_release():
    # pip pairs its newest torch (2.14) with the newest torch_xla (2.9, built for torch 2.9):
    # the fix is torch 2.9, since no torch_xla 2.14 exists.
    (problem,) = problems_for(versions=dict(MATCHING, torch="2.14.1", torch_xla="2.9.0"))
    assert "pip install 'torch==2.9.*'" in problem.fix, problem.fix
    assert "torch_xla==2.14" not in problem.fix and "torch_xla 2.9 is built for torch 2.9" \
        in problem.fix
    (missing,) = problems_for(versions=dict(MATCHING, torch="2.14.1", torch_xla=None))
    assert "pip install 'torch==2.9.*' 'torch_xla==2.9.*'" in missing.fix, missing.fix
    # Kaggle's torch 2.8 with a newer torch_xla: torch stays, torch_xla matches it.
    (kaggle,) = problems_for(versions=dict(MATCHING, torch="2.8.0", torch_xla="2.9.0"))
    assert "pip install 'torch_xla==2.8.*' to match torch 2.8" in kaggle.fix


def test_a_launch_refuses_a_torch_xla_of_another_torch_before_forking(monkeypatch):
    from hfxla_nb.launch import preflight
    from hfxla_nb.runtime import environment

    real = environment.package_versions()
    monkeypatch.setattr(environment, "package_versions",
                        lambda environ=None: dict(real, torch="2.14.1", torch_xla="2.9.0"))
    with pytest.raises(preflight.LaunchRefusedError, match=r"pip install 'torch==2\.9\.\*'"):
        preflight.check_backend("spmd")
    preflight.check_backend("debug")  # gloo on the CPU: no torch_xla needed
    monkeypatch.setattr(environment, "package_versions", lambda environ=None: real)
    preflight.check_backend("spmd")  # the pinned test stack matches


def test_torch_xla_missing():
    (problem,) = problems_for(versions=dict(MATCHING, torch_xla=None))
    assert problem.severity == "error" and "torch_xla is not installed" in problem.title
    assert "pip install 'torch_xla==2.9.*' to match torch 2.9" in problem.fix
    on_tpu = problems_for(
        versions=dict(MATCHING, torch_xla=None, libtpu=None),
        accelerator=tpu(),
        environ={"PJRT_DEVICE": "TPU"},
    )
    assert [p.title for p in on_tpu] == ["torch_xla is not installed."]
    assert "torch_xla[tpu]==2.9.*" in on_tpu[0].fix


def test_runtime_already_initialized():
    (problem,) = problems_for(runtime_initialized=True)
    assert problem.severity == "error" and "refuse to fork" in problem.title
    needles = ("Restart the kernel", "torch_xla.device()", "TrainingArguments", "metrics_report")
    assert all(needle in problem.fix for needle in needles)


@pytest.mark.parametrize(
    "names", [["COLAB_TPU_ADDR"], ["XRT_TPU_CONFIG"], ["COLAB_TPU_ADDR", "XRT_TPU_CONFIG"]]
)
def test_old_tpu_node_variables(names):
    environ = {"PJRT_DEVICE": "CPU", **{name: "10.0.0.2:8470" for name in names}}
    (problem,) = problems_for(environ=environ)
    assert problem.severity == "warning" and "torch_xla 2.x ignores" in problem.title
    for name in names:
        assert name in problem.title and f"os.environ.pop({name!r}, None)" in problem.fix
    assert "10.0.0.2" not in problem.title + problem.fix


def test_tpu_without_libtpu():
    (problem,) = problems_for(
        accelerator=tpu(), versions=dict(MATCHING, libtpu=None), environ={"PJRT_DEVICE": "TPU"}
    )
    assert problem.severity == "error" and "libtpu" in problem.title
    assert "pip install 'torch_xla[tpu]==2.9.0'" in problem.fix


def test_pjrt_device_disagrees_with_the_hardware():
    (idle,) = problems_for(accelerator=tpu("v6e"), environ={"PJRT_DEVICE": "CPU"})
    assert idle.severity == "warning" and "TPU v6e" in idle.title
    assert "PJRT_DEVICE=CPU" in idle.title
    assert "configure(device='tpu')" in idle.fix
    (missing,) = problems_for(environ={"PJRT_DEVICE": "TPU"})
    assert missing.severity == "error" and "no TPU was found" in missing.title
    assert "configure(device='cpu'" in missing.fix
    (unknown,) = problems_for(environ={"PJRT_DEVICE": "NPU"})
    assert unknown.severity == "error" and "PJRT_DEVICE=NPU" in unknown.title
    (unset,) = problems_for(environ={})
    assert unset.severity == "info" and "PJRT_DEVICE is not set" in unset.title


def test_tpu_on_pci_without_device_files(tmp_path):
    make_tpu_host(tmp_path, "v4", chips=4, dev=False)
    accelerator = detect_accelerator(str(tmp_path), {})
    assert accelerator.kind == "tpu"
    (problem,) = problems_for(accelerator=accelerator, environ={"PJRT_DEVICE": "TPU"})
    assert problem.severity == "error" and "--privileged" in problem.fix


def test_kaggle_v3_variables():
    environ = {"PJRT_DEVICE": "TPU", "TPU_PROCESS_ADDRESSES": "a,b", "CLOUD_TPU_TASK_ID": "0"}
    (problem,) = problems_for(accelerator=tpu("v3"), environment="kaggle", environ=environ)
    assert problem.severity == "warning"
    assert "os.environ.pop('TPU_PROCESS_ADDRESSES', None)" in problem.fix
    assert "os.environ.pop('CLOUD_TPU_TASK_ID', None)" in problem.fix
    assert problems_for(accelerator=tpu("v3"), environment="tpu-vm", environ=environ) == []


def test_cpu_num_devices():
    (many,) = problems_for(environ={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "64"})
    assert many.severity == "info" and "64" in many.title and "2 host cores" in many.title
    (bad,) = problems_for(environ={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "lots"})
    assert bad.severity == "error" and "'lots'" in bad.title
    assert problems_for(environ={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}) == []


def test_deprecated_bf16_variable():
    (problem,) = problems_for(environ={"PJRT_DEVICE": "CPU", "XLA_USE_BF16": "1"})
    assert problem.severity == "warning" and "XLA_USE_BF16" in problem.title
    assert "torch.bfloat16" in problem.fix


def test_errors_come_first_and_ok_follows_them():
    problems = problems_for(
        runtime_initialized=True, environ={"COLAB_TPU_ADDR": "x", "CPU_NUM_DEVICES": "64"}
    )
    assert [p.severity for p in problems] == ["error", "warning", "info", "info"]
    info = RuntimeInfo(Accelerator("cpu"), "terminal", dict(MATCHING), True, {}, problems)
    assert not info.ok
    notes = [p for p in problems if p.severity != "error"]
    assert RuntimeInfo(Accelerator("cpu"), "terminal", dict(MATCHING), False, {}, notes).ok


# ---------------------------------------------------------------------------------------------
# Secrets, panels, to_dict
# ---------------------------------------------------------------------------------------------

SECRETS = {
    "HF_TOKEN": "hf_abcdefSECRET1",
    "KAGGLE_KEY": "kagglekeySECRET2",
    "KAGGLE_DATA_PROXY_TOKEN": "proxySECRET3",
    "TPU_API_KEY": "tpukeySECRET4",
    "XLA_PASSWORD": "pwSECRET5",
    "PT_XLA_credential_file": "credSECRET6",
    "ACCELERATE_SECRET": "accSECRET7",
}


def test_redact_environment():
    redacted = redact_environment({**SECRETS, "PJRT_DEVICE": "CPU", "XLA_FLAGS": "--xla_dump"})
    assert redacted["PJRT_DEVICE"] == "CPU" and redacted["XLA_FLAGS"] == "--xla_dump"
    for name in SECRETS:
        assert redacted[name] == "<hidden>"


def test_secrets_never_appear_in_any_form(tmp_path):
    environ = {**SECRETS, "PJRT_DEVICE": "TPU", "TPU_ACCELERATOR_TYPE": "v5litepod-4"}
    info = detect(sys_root=str(make_tpu_host(tmp_path, "v5e")), environ=environ)
    assert info.env["HF_TOKEN"] == "<hidden>" and info.env["TPU_API_KEY"] == "<hidden>"
    forms = [runtime_text(info), repr(info), runtime_html(info), json.dumps(info.to_dict())]
    for form in forms:
        for value in SECRETS.values():
            assert value not in form
    assert "HF_TOKEN" in forms[0] and "&lt;hidden&gt;" in forms[2]


def test_text_and_html_panels_show_the_key_facts(tmp_path):
    make_tpu_host(tmp_path, "v5e", chips=4)
    environ = {"PJRT_DEVICE": "CPU", "COLAB_RELEASE_TAG": "r1", "XLA_FLAGS": "<script>x</script>"}
    info = detect(sys_root=str(tmp_path), environ=environ)
    text, page = runtime_text(info), runtime_html(info)
    assert repr(info).startswith("<RuntimeInfo: TPU v5e: 4 chips")
    needles = ("TPU v5e", "4 chips", "4 devices", "16 GiB HBM", "colab", "torch_xla", "PJRT_DEVICE")
    for needle in needles:
        assert needle in text and needle in page
    idle = next(p for p in info.problems if "PJRT_DEVICE=CPU" in p.title)
    assert "fix: Call hx.configure(device='tpu')" in " ".join(text.split())
    assert "warning" in text and "error" in text.splitlines()[0]
    assert idle.fix.replace("'", "&#x27;") in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "not started in this process" in text


def test_panel_of_a_healthy_cpu():
    info = RuntimeInfo(
        Accelerator("cpu", devices=8, host_cores=2, found_by=["CPU_NUM_DEVICES=8"]),
        "jupyter",
        dict(MATCHING),
        False,
        {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8"},
        [],
    )
    text = runtime_text(info)
    assert text.splitlines()[0] == "hfxla_nb runtime: OK"
    assert "CPU: 8 virtual XLA devices on 2 host cores" in text
    assert "host          Jupyter, no TPU" in text
    assert "launcher      XLA on the CPU with 8 virtual devices" in text
    assert ">OK<" in runtime_html(info) and "problems:" not in text


def test_to_dict_and_device_count(tmp_path):
    make_tpu_host(tmp_path, "v3", chips=4)
    holds(tmp_path, 4242, "/dev/accel0")
    info = detect(sys_root=str(tmp_path), environ={"PJRT_DEVICE": "TPU"})
    assert info.device_count == 8
    data = json.loads(json.dumps(info.to_dict()))
    assert data["device_count"] == 8 and data["ok"] is False
    assert data["accelerator"]["generation"] == "v3"
    assert data["accelerator"]["holders"] == {"4242": "python3"}
    assert data["problems"][0]["severity"] == "error"
    assert set(data["versions"]) >= {"python", "torch", "torch_xla", "libtpu", "hfxla_nb"}


# ---------------------------------------------------------------------------------------------
# configure()
# ---------------------------------------------------------------------------------------------


def test_configure_cpu(tmp_path, runtime_not_started):
    environ = {"HOME": "/root"}
    assert configure(cores=4, environ=environ, sys_root=str(tmp_path)) == {
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": "4",
    }
    assert environ == {"HOME": "/root", "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}
    assert configure("cpu", debug=True, environ=environ, sys_root=str(tmp_path)) == {
        "PJRT_DEVICE": "CPU",
        "PT_XLA_DEBUG_LEVEL": "2",
    }
    assert environ["PT_XLA_DEBUG_LEVEL"] == "2"


def test_configure_auto_picks_the_tpu(tmp_path, runtime_not_started):
    make_tpu_host(tmp_path, "v6e", chips=8)
    environ: dict[str, str] = {}
    assert configure(environ=environ, sys_root=str(tmp_path)) == {"PJRT_DEVICE": "TPU"}
    assert configure("tpu", cores=8, environ=environ, sys_root=str(tmp_path)) == {
        "PJRT_DEVICE": "TPU"
    }
    one_chip = configure("tpu", cores=1, environ=environ, sys_root=str(tmp_path))
    assert one_chip["TPU_VISIBLE_CHIPS"] == "0" and one_chip["TPU_PROCESS_BOUNDS"] == "1,1,1"
    # CPU rehearsal on a TPU host is allowed when asked for.
    rehearsal = configure("cpu", cores=2, environ=environ, sys_root=str(tmp_path))
    assert rehearsal == {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}


def test_configure_refuses_what_cannot_work(tmp_path, runtime_not_started):
    environ: dict[str, str] = {}
    with pytest.raises(ValueError, match="'auto', 'tpu', 'cpu'"):
        configure("gpu", environ=environ, sys_root=str(tmp_path))
    for cores in (0, -2, 2.5, "4", True):
        with pytest.raises(ValueError, match="positive integer"):
            configure(cores=cores, environ=environ, sys_root=str(tmp_path))
    with pytest.raises(TpuNotFoundError, match="no TPU was found"):
        configure("tpu", environ=environ, sys_root=str(tmp_path))
    assert environ == {}  # nothing half-set
    tpu_host = make_tpu_host(tmp_path / "tpu", "v3", chips=4)
    with pytest.raises(ValueError, match="only 8 TPU devices"):
        configure("tpu", cores=16, environ=environ, sys_root=str(tpu_host))
    with pytest.raises(ValueError, match="cores=None for all 8 devices, or cores=2"):
        configure("tpu", cores=4, environ=environ, sys_root=str(tpu_host))
    assert environ == {}


def test_configure_after_start_raises(monkeypatch, tmp_path):
    monkeypatch.setattr(_xla, "runtime_is_initialized", lambda: True)
    environ: dict[str, str] = {}
    with pytest.raises(RuntimeAlreadyStartedError, match="Restart the kernel"):
        configure(cores=2, environ=environ, sys_root=str(tmp_path))
    assert environ == {}
    assert issubclass(RuntimeAlreadyStartedError, RuntimeError)


# ---------------------------------------------------------------------------------------------
# Fresh processes: the no-initialization guarantee, with and without torch_xla
# ---------------------------------------------------------------------------------------------


@pytest.mark.launch
def test_configure_cores_8_gives_8_xla_devices_on_a_cpu():
    """What the README's `hx.configure(cores=8)` promises: the runtime started afterwards has
    8 XLA devices (on a machine without a TPU: 8 virtual CPU devices)."""
    out = run_python(
        """
        import json, os
        os.environ.pop("PJRT_DEVICE")  # device="auto": the CPU here, since there is no TPU
        import hfxla_nb as hx
        hx.configure(cores=8)
        import torch_xla, torch_xla.runtime as xr
        devices = [str(torch_xla.device(i)) for i in range(xr.global_runtime_device_count())]
        print(json.dumps({"devices": devices, "kind": xr.device_type()}))
        """
    )
    assert out["kind"] == "CPU"
    assert out["devices"] == [f"xla:{index}" for index in range(8)]


@pytest.fixture(scope="module")
def with_torch_xla() -> dict:
    """One process: import torch_xla, detect, configure, start the runtime, detect, configure."""
    return run_python(
        """
        import json, os
        import torch_xla
        import hfxla_nb as hx
        from hfxla_nb.runtime import RuntimeAlreadyStartedError
        out = {}
        info = hx.detect()
        out["initialized_after_detect"] = bool(torch_xla._XLAC._xla_runtime_is_initialized())
        out["reported_before"] = info.runtime_initialized
        out["configured"] = hx.configure(device="cpu", cores=2)
        out["initialized_after_configure"] = bool(torch_xla._XLAC._xla_runtime_is_initialized())
        torch_xla.device()
        out["initialized_after_device"] = bool(torch_xla._XLAC._xla_runtime_is_initialized())
        after = hx.detect()
        out["reported_after"] = after.runtime_initialized
        out["ok_after"] = after.ok
        try:
            hx.configure(device="cpu", cores=4)
            out["error"] = None
        except RuntimeAlreadyStartedError as error:
            out["error"] = str(error)
        out["cpu_num_devices"] = os.environ.get("CPU_NUM_DEVICES")
        print(json.dumps(out))
        """
    )


@pytest.mark.launch
def test_detect_and_configure_never_start_the_runtime(with_torch_xla):
    assert with_torch_xla["initialized_after_detect"] is False
    assert with_torch_xla["reported_before"] is False
    assert with_torch_xla["configured"] == {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    assert with_torch_xla["initialized_after_configure"] is False


@pytest.mark.launch
def test_configure_after_the_runtime_started_raises(with_torch_xla):
    assert with_torch_xla["initialized_after_device"] is True
    assert with_torch_xla["reported_after"] is True and with_torch_xla["ok_after"] is False
    assert "Restart the kernel" in with_torch_xla["error"]
    assert "configure" in with_torch_xla["error"]
    assert with_torch_xla["cpu_num_devices"] == "2"  # the refused call changed nothing


@pytest.mark.launch
def test_detect_imports_no_heavy_package():
    out = run_python(
        """
        import json, sys
        import hfxla_nb as hx
        from hfxla_nb.ui.panels import runtime_text
        info = hx.detect()
        names = ("torch", "torch_xla", "transformers", "datasets", "IPython")
        heavy = [name for name in names if name in sys.modules]
        print(json.dumps({"heavy": heavy, "torch_xla": info.versions["torch_xla"]}))
        """
    )
    assert out["heavy"] == []
    assert out["torch_xla"]  # found from metadata, without importing it


@pytest.mark.launch
def test_detect_without_torch_xla():
    out = run_python(
        """
        import json, sys

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name == "torch_xla" or name.startswith("torch_xla."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, Blocker())
        import hfxla_nb as hx
        from hfxla_nb.ui.panels import runtime_text
        info = hx.detect()
        configured = hx.configure(device="cpu", cores=2)
        print(json.dumps({
            "torch_xla": info.versions["torch_xla"],
            "initialized": info.runtime_initialized,
            "titles": [p.title for p in info.problems],
            "ok": info.ok,
            "configured": configured,
            "text": runtime_text(info),
        }))
        """
    )
    assert out["torch_xla"] is None and out["initialized"] is False
    assert "torch_xla is not installed." in out["titles"] and out["ok"] is False
    assert out["configured"] == {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    assert "torch_xla not installed" in out["text"]


def test_package_versions_are_what_pip_says():
    """Read from the `Version:` header (fast, it runs before every launch), the same answer
    as importlib.metadata's full parse, and None for a package that is not installed."""
    import importlib.metadata

    from hfxla_nb.runtime import environment

    versions = environment.package_versions()
    for key in ("torch", "torch_xla", "transformers", "datasets", "ipykernel"):
        assert versions[key] == importlib.metadata.version(key)
    assert environment._distribution_version(("no-such-package-hfxla",)) is None


def test_a_stopped_launch_note_is_a_warning_once(tmp_path, monkeypatch):
    """A note the supervisor of a dead kernel wrote is a warning of `detect()` until `forget`;
    an old or broken note is not shown; a fake /sys tree reads none of this machine's notes."""
    from hfxla_nb.runtime import info as stopped_launches

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the notes' folder: the test's
    now = time.time()
    stopped_launches.record(stopped_launches.StoppedLaunch(
        111, 222, now, ["python -m ipykernel_launcher (pid 222)", "sleep 600 (pid 333)"]))
    stopped_launches.record(stopped_launches.StoppedLaunch(1, 2, now - 8 * 24 * 3600))
    (stopped_launches.notes_folder() / "broken.json").write_text("{")
    info = detect()
    warnings = [p.title for p in info.problems if "kernel that died" in p.title]
    assert len(warnings) == 1 and "(pid 111)" in warnings[0], warnings
    assert "sleep 600 (pid 333)" in warnings[0]
    assert [launch.kernel_pid for launch in info.stopped_launches] == [111]
    assert not any("kernel that died" in p.title for p in detect(sys_root=str(tmp_path)).problems)
    stopped_launches.forget(info.stopped_launches)
    assert not any("kernel that died" in p.title for p in detect().problems)
