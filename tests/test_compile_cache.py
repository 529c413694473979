"""The managed persistent compile cache: folders, keys, safety, eviction, counters, and a real
pair of launches on XLA:CPU (which writes entries but cannot load them back)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

import hfxla_nb as hx
from hfxla_nb.launch.preflight import LaunchRefusedError
from hfxla_nb.runtime import compile_cache as cache
from hfxla_nb.runtime.configure import configure
from hfxla_nb.ui.panels import runtime_text
from tests.helpers import subprocess_env
from tests.test_runtime import make_tpu_host, tpu

VERSIONS = {"torch_xla": "2.9.0", "libtpu": "0.0.21.1"}
CPU = hx.runtime.Accelerator("cpu")


def test_folders_per_environment_and_keys_per_version_device_and_flags():
    assert cache.default_root("kaggle") == "/kaggle/working/.cache/hfxla_nb/xla"
    assert cache.default_root("colab") == "/content/.cache/hfxla_nb/xla"
    assert cache.default_root("jupyter", home="/home/ana") == "/home/ana/.cache/hfxla_nb/xla"
    assert cache.cache_key(VERSIONS, tpu("v5e")) == "torch_xla-2.9.0_libtpu-0.0.21.1_tpu-v5e"
    assert cache.cache_key(VERSIONS, CPU) == "torch_xla-2.9.0_cpu"
    assert cache.cache_key({"torch_xla": "2.8.0", "libtpu": "0.0.17"}, tpu("v6e")) == (
        "torch_xla-2.8.0_libtpu-0.0.17_tpu-v6e")
    # Compiler flags: a subfolder each (the worker reads them after torch_xla added its own).
    defaults = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    folder = cache.flags_folder(defaults)
    assert folder.startswith("flags-") and len(folder) == len("flags-") + 8
    assert cache.flags_folder(dict(defaults)) == folder
    assert cache.flags_folder({"XLA_FLAGS": " --xla_cpu_enable_fast_math=false "}) == folder
    assert cache.flags_folder({**defaults, "LIBTPU_INIT_ARGS": "--xla_tpu_x=true"}) != folder
    assert cache.flags_folder({"XLA_FLAGS": "--xla_dump_to=/d"}) != folder


def settings(setting, accelerator, tmp_path, environ=None, environment="jupyter"):
    return cache.resolve(setting, accelerator=accelerator, environment=environment,
                         versions=VERSIONS, environ=environ or {}, home=str(tmp_path))


def test_on_by_default_on_tpu_hosts_only(tmp_path):
    on = settings(None, tpu("v5e"), tmp_path)
    assert on.root == str(tmp_path / ".cache/hfxla_nb/xla")
    assert on.folder == os.path.join(on.root, "torch_xla-2.9.0_libtpu-0.0.21.1_tpu-v5e")
    assert on.limit == 10 * 1024**3
    assert settings(None, CPU, tmp_path) is None
    assert settings(True, CPU, tmp_path).folder.endswith("/torch_xla-2.9.0_cpu")
    assert settings(False, tpu("v5e"), tmp_path) is None
    assert settings(None, tpu("v5e"), tmp_path, environment="kaggle").limit == 4 * 1024**3
    chosen = settings(str(tmp_path / "mine"), CPU, tmp_path, {cache.LIMIT: "0.5"})
    assert (chosen.root, chosen.limit) == (str(tmp_path / "mine"), 512 * 1024**2)
    # What hx.configure chose is what a launch uses when it passes nothing.
    environ = {}
    assert configure("cpu", compile_cache=tmp_path / "c", compile_cache_gib=2,
                     environ=environ, sys_root=str(tmp_path)) == {
        "PJRT_DEVICE": "CPU", cache.LIMIT: "2.0", cache.SETTING: str(tmp_path / "c")}
    assert settings(None, CPU, tmp_path, environ).root == str(tmp_path / "c")
    configure("cpu", compile_cache=False, environ=environ, sys_root=str(tmp_path))
    assert settings(None, tpu("v5e"), tmp_path, environ) is None
    with pytest.raises(ValueError, match="compile_cache_gib"):
        configure("cpu", compile_cache_gib=0, environ={}, sys_root=str(tmp_path))


def test_folders_others_can_write_to_are_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(cache.CompileCacheRefusedError, match="written by other users"):
        settings(str(shared), CPU, tmp_path)
    with pytest.raises(cache.CompileCacheRefusedError):
        configure("cpu", compile_cache=shared, environ={}, sys_root=str(tmp_path))
    # Not there yet, inside a folder anyone can write to without the sticky bit: refused;
    # with it (like /tmp), fine.
    with pytest.raises(cache.CompileCacheRefusedError, match="every user can write"):
        cache.check_folder(str(shared / "new" / "xla"))
    shared.chmod(0o1777)
    cache.check_folder(str(shared / "new" / "xla"))
    group = tmp_path / "group"
    group.mkdir(mode=0o770)
    group.chmod(0o770)
    with pytest.raises(cache.CompileCacheRefusedError, match="mode 770"):
        cache.check_folder(str(group))
    if os.getuid() == 0:  # root can make a folder that belongs to someone else
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 4321, -1)
        with pytest.raises(cache.CompileCacheRefusedError, match="another user"):
            cache.check_folder(str(theirs))


@pytest.mark.launch
def test_a_launch_with_an_unsafe_folder_is_refused_before_forking(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    before = hx.last_launch()
    with pytest.raises(LaunchRefusedError, match="written by other users"):
        hx.notebook_launcher(lambda: None, compile_cache=str(shared), progress=False)
    assert hx.last_launch() is before  # refused before any record, fork or file


def test_folders_are_created_owner_only_and_evicted_oldest_first(tmp_path):
    folder = cache.prepare(str(tmp_path / "a" / "b" / "key"))
    for path in (tmp_path / "a", tmp_path / "a/b", tmp_path / "a/b/key"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    for index, size in enumerate((300, 200, 100, 400)):
        entry = tmp_path / "a/b/key" / f"entry{index}"
        entry.write_bytes(b"x" * size)
        os.utime(entry, (1000 + index, 1000 + index))
    assert cache.status(folder, 600) == {"folder": folder, "entries": 4, "bytes": 1000,
                                         "limit": 600}
    assert cache.evict(folder, 600) == (2, 500)  # the two oldest: 300 and 200 bytes
    assert sorted(os.listdir(folder)) == ["entry2", "entry3"]
    assert cache.evict(folder, 600) == (0, 0)
    assert cache.evict(folder, 0) == (2, 500) and os.listdir(folder) == []


def test_xla_cpus_load_warning_becomes_one_line():
    said: dict = {}
    warning = ("2026-12-01 07:53:15.992695: W torch_xla/csrc/runtime/pjrt_computation_client"
               ".cpp:694] Failed to deserialize executable: UNIMPLEMENTED: Deserializing "
               "serialized executable not supported.\n")
    assert cache.native_line(warning, said) == cache.CPU_LOAD_LINE + "\n"
    assert cache.native_line(warning, said) is None
    assert cache.native_line("other output\n", said) == "other output\n"


def test_xla_info_says_where_the_cache_is(tmp_path):
    host = make_tpu_host(tmp_path / "host", "v5e", chips=1)
    info = hx.detect(sys_root=str(host), environ={"PJRT_DEVICE": "TPU", "HOME": str(tmp_path)})
    assert info.compile_cache.startswith(str(tmp_path / ".cache/hfxla_nb/xla/torch_xla-"))
    assert "_tpu-v5e (0 entries, 0.00 GiB of 10 GiB)" in info.compile_cache
    assert "compile cache" in runtime_text(info)
    cpu = hx.detect(sys_root=str(tmp_path / "none"), environ={})
    assert cpu.compile_cache.startswith("off: XLA on the CPU cannot load compiled programs back")


TWO_LAUNCHES = """
import json, os
import hfxla_nb as hx

def train():
    import torch, torch_xla
    x = torch.ones(3, 4, device=torch_xla.device())
    for step in range(1, 4):
        x = x * 2
        hx.report(step=step, total=3)
        torch_xla.sync()
    assert float(x.sum().item()) == 96.0
    from hfxla_nb.runtime import compile_cache
    return compile_cache.worker_status()["folder"], sorted(os.listdir(
        compile_cache.worker_status()["folder"]))

hx.configure(compile_cache=os.environ["CACHE"], compile_cache_gib=1)
first = hx.notebook_launcher(train, progress="console")
second = hx.notebook_launcher(train, progress="console")
print(json.dumps({"first": first, "second": second}))
"""


@pytest.mark.launch
def test_two_launches_write_then_find_their_entries(tmp_path):
    root = tmp_path / "cache"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(TWO_LAUNCHES)],
                          capture_output=True, text=True, timeout=300,
                          env=subprocess_env(CACHE=str(root)), cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    (key,) = os.listdir(root)
    assert key == f"torch_xla-{hx.detect().versions['torch_xla']}_cpu"
    (flags,) = os.listdir(root / key)
    folder = str(root / key / flags)
    assert flags.startswith("flags-") and result["first"][0] == result["second"][0] == folder
    entries = sorted(os.listdir(folder))
    # Three graphs (first step, steady step, the final fetch); written once, found again.
    assert len(entries) == 3 and result["first"][1] == result["second"][1] == entries
    for path in (root, root / key, root / key / flags):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    first, second = done.stdout.split("✔ launch finished")[1:3]
    assert "compile cache: 0 hits, 3 misses; 3 entries," in first and folder in first
    assert "compile cache: 0 hits, 0 misses, 3 not loadable on XLA:CPU (compiled again); " \
           "3 entries," in second
    out = done.stdout + done.stderr
    assert out.count(cache.CPU_LOAD_LINE) == 1
    assert cache.CPU_LOAD_WARNING not in out
