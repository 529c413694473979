"""The persistent compile cache's key: a program compiled for one torch_xla version, model
config or input shape is never the one loaded for another.

Two levels make the key. hfxla_nb's folder (`cache_key`, `flags_folder`) holds one torch_xla
(and libtpu) version, device kind and set of compiler flags; in it, torch_xla names each entry
by the hash of the graph, which holds the model's shapes and computation. Tested on XLA:CPU,
which writes entries (it cannot load them back: docs/compile_cache.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import hfxla_nb as hx
from hfxla_nb.runtime import compile_cache as cache
from tests.helpers import subprocess_env
from tests.test_runtime import tpu


def test_the_folder_changes_with_each_version_alone():
    base = {"torch_xla": "2.9.0", "libtpu": "0.0.21.1"}
    cpu = hx.runtime.Accelerator("cpu")
    keys = {
        cache.cache_key(base, tpu("v5e")),
        cache.cache_key({**base, "torch_xla": "2.9.1"}, tpu("v5e")),  # torch_xla alone
        cache.cache_key({**base, "libtpu": "0.0.22"}, tpu("v5e")),  # libtpu alone
        cache.cache_key(base, tpu("v6e")),  # the chip alone
        cache.cache_key(base, cpu),
        cache.cache_key({**base, "torch_xla": "2.8.0"}, cpu),
    }
    assert len(keys) == 6
    assert cache.cache_key({**base, "torch_xla": "2.9.0+git1234"}, cpu) != (
        cache.cache_key(base, cpu))


ENTRIES = """
import json, os
import hfxla_nb as hx

def forward(cases):
    import torch, torch_xla
    from transformers import LlamaConfig, LlamaForCausalLM
    from hfxla_nb.runtime import compile_cache
    folder = compile_cache.worker_status()["folder"]
    seen = []
    for hidden, length in cases:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=32,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                             max_position_embeddings=32)
        model = LlamaForCausalLM(config).to(torch_xla.device()).eval()
        with torch.no_grad():
            logits = model(torch.ones(2, length, dtype=torch.long,
                                      device=torch_xla.device())).logits
        torch_xla.sync()
        seen.append(sorted(os.listdir(folder)))
    return seen

hx.configure(compile_cache=os.environ["CACHE"], compile_cache_gib=1)
cases = [(16, 8), (16, 8), (32, 8), (16, 12)]  # again the same; another config; another shape
print(json.dumps(hx.notebook_launcher(forward, args=(cases,), progress=False)))
"""


@pytest.mark.launch
def test_an_entry_per_config_and_shape_and_the_same_one_for_the_same_graph(tmp_path):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(ENTRIES)],
                          capture_output=True, text=True, timeout=400,
                          env=subprocess_env(CACHE=str(tmp_path / "cache"),
                                             TF_CPP_MIN_LOG_LEVEL="2"),
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    base, again, other_config, other_shape = map(
        set, json.loads(done.stdout.strip().splitlines()[-1]))
    assert base and again == base  # the same model and shape: nothing new to write
    assert other_config > again  # another hidden size: new programs beside the old ones
    assert other_shape > other_config  # another sequence length: new programs again
    # (A later process finds the same entries: test_compile_cache.py, two launches.)
