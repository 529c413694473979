"""TorchTPU (`torch-tpu`, torch_xla's successor) recognised: by its distribution's name, never
by a module another project may install under the same name; said by `%xla_info` and the
doctor; every entry point that needs torch_xla refuses, before anything starts, with what to
do. The distribution is faked (its metadata only): no TPU, no TorchTPU here."""

from __future__ import annotations

from pathlib import Path

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, diagnosis
from hfxla_nb.launch.preflight import LaunchRefusedError
from hfxla_nb.runtime import info as problems
from hfxla_nb.runtime.environment import package_versions
from hfxla_nb.runtime.info import detect
from tests.test_runtime import tpu


def _distribution(root: Path, name: str, version: str, top_level: str) -> None:
    """A `.dist-info` folder of `name` whose top-level module is `top_level` (no code)."""
    folder = root / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (folder / "top_level.txt").write_text(f"{top_level}\n")


@pytest.fixture
def torch_tpu_only(tmp_path, monkeypatch):
    """TorchTPU 0.2.0 installed (metadata), torch_xla not importable."""
    _distribution(tmp_path / "site", "torch-tpu", "0.2.0", "torch_tpu")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(_xla, "is_installed", lambda: False)
    return tmp_path


def test_torch_tpu_is_found_by_its_distribution_not_by_its_module_name(tmp_path, monkeypatch):
    assert package_versions()["torch_tpu"] is None
    _distribution(tmp_path / "decoy", "torchtpu-tools", "1.0", "torch_tpu")
    monkeypatch.syspath_prepend(str(tmp_path / "decoy"))
    assert package_versions()["torch_tpu"] is None  # another project's `torch_tpu` module
    _distribution(tmp_path / "real", "torch-tpu", "0.2.0", "torch_tpu")
    monkeypatch.syspath_prepend(str(tmp_path / "real"))
    assert package_versions()["torch_tpu"] == "0.2.0"


def _facts(**versions) -> problems.Facts:
    return problems.Facts(tpu(), "tpu-vm", {"torch": "2.12.0", "libtpu": "0.0.30", **versions},
                          False, {"PJRT_DEVICE": "TPU"})


def test_xla_info_says_torch_tpu_is_there_and_what_runs_with_it():
    only = list(problems.torch_xla_missing(_facts(torch_xla=None, torch_tpu="0.2.0")))
    assert len(only) == 1 and only[0].severity == "error"
    assert only[0].title.startswith("TorchTPU (torch-tpu 0.2.0) is installed, and torch_xla is "
                                    "not: hfxla_nb launches, trains and predicts with torch_xla")
    assert "cannot run inside a notebook kernel" in only[0].title
    assert "torch_xla[tpu]==2.9.*" in only[0].fix and "hx.doctor()" in only[0].fix
    both = list(problems.torch_tpu_too(_facts(torch_xla="2.9.0", torch_tpu="0.2.0")))
    assert [p.severity for p in both] == ["info"] and "use torch_xla" in both[0].title
    assert not list(problems.torch_tpu_too(_facts(torch_xla="2.9.0", torch_tpu=None)))


def test_the_doctor_fails_the_versions_step_with_what_to_do(tmp_path):
    info = detect(sys_root=str(tmp_path), environ={"PJRT_DEVICE": "CPU"})
    info.versions.update(torch_xla=None, torch_tpu="0.2.0")
    check = diagnosis.versions(info, {"PJRT_DEVICE": "CPU"})
    assert check.status == "failed" and "torch_tpu 0.2.0" in check.summary
    assert "TorchTPU (torch-tpu 0.2.0) is installed" in check.summary
    assert "torch_xla[tpu]==2.9.*" in check.fix


@pytest.mark.launch
def test_every_entry_point_that_needs_torch_xla_refuses_before_anything(torch_tpu_only,
                                                                        cache):
    from hfxla_nb.demo import demo_dataset, demo_model_dir

    out = torch_tpu_only / "out"
    for call in (lambda: hx.notebook_launcher(print),
                 lambda: hx.fine_tune(demo_model_dir(cache=cache), demo_dataset(n=40),
                                      output_dir=out, progress=False),
                 lambda: hx.predict(demo_model_dir(cache=cache), ["a text"], progress=False)):
        with pytest.raises(LaunchRefusedError, match=r"TorchTPU \(torch-tpu 0\.2\.0\)"):
            call()
    assert not out.exists() and not _xla.runtime_is_initialized()


@pytest.mark.launch
def test_without_torch_xla_or_torch_tpu_the_refusal_says_what_to_install(monkeypatch):
    monkeypatch.setattr(_xla, "is_installed", lambda: False)
    with pytest.raises(LaunchRefusedError, match="torch_xla is not installed, and every worker"):
        hx.notebook_launcher(print)
