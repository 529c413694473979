"""fine_tune(..., lora=...) on 4 XLA:CPU virtual devices with FSDPv2: the loss falls, only the
adapters train (the base bit for bit as it was), the compile contract is the full fine-tune's
(1 training + 1 evaluation graph), the adapter folder (PEFT's format) and the merged folder load
on the CPU and generate the same tokens, a resume is exact; bad input refused before any fork.

Two fine-tunes in all (the run and its resume); the pytest process never starts XLA.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.lm import TEMPLATE, demo_lm_dataset, run_demo_lm
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from hfxla_nb.train.worker import saving
from tests.helpers import losses, run_python

# peft is imported by the tests that use it: it takes seconds, and `make test-fast` collects
# this module only to deselect its tests.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("peft") is None,
                                reason='peft is not installed: pip install "hfxla_nb[lora]"')

ROWS = 400
STEPS = 16
PROMPTS = [TEMPLATE.split("{response}")[0].format(prompt=text)
           for text in ("the coffee was truly wonderful.", "i hated it.")]


def run(cache, out, **options):
    return run_demo_lm(rows=ROWS, devices=4, sharding="fsdp", output_dir=out, progress=False,
                       cache=cache, max_steps=STEPS, log_every=4, learning_rate=1e-2,
                       lora=True, **options)


@pytest.fixture(scope="module")
def lora_fsdp(cache, tmp_path_factory):
    return run(cache, tmp_path_factory.mktemp("lora") / "llama", save_steps=8)


LORA_RUN_RELAYING = """
import contextlib, io, json
import hfxla_nb as hx
from hfxla_nb.demo.lm import run_demo_lm

relayed = io.StringIO()
with contextlib.redirect_stderr(relayed):
    run_demo_lm(rows=64, devices=4, sharding="fsdp", output_dir=None, progress="console",
                cache={cache!r}, max_steps=2,
                log_every=1, lora=True)
kept = [warning.message for warning in hx.last_launch().warnings]
print(json.dumps({{"relayed": relayed.getvalue(), "kept": kept}}))
"""


@pytest.mark.launch
def test_a_lora_fine_tune_relays_no_warning_of_frozen_inputs_or_deprecated_attributes(cache):
    # In a fresh process, as a script or a cell shows it (pytest records warnings itself):
    # torch's warning of FSDPv2's backward hook on the first layer, whose inputs (the frozen
    # embedding's output) need no gradient, and transformers' of the deprecated attribute that
    # peft reads when it wraps the model.
    found = run_python(LORA_RUN_RELAYING.format(cache=str(cache)), timeout=300)
    relayed = found["relayed"]
    for words in ("Full backward hook", "is_gradient_checkpointing"):
        assert words not in relayed, relayed
        assert not any(words in message for message in found["kept"]), found["kept"]


@pytest.mark.launch
def test_lora_learns_with_fsdp_and_the_full_fine_tunes_compile_contract(lora_fsdp, lm_dir):
    import peft
    from transformers import AutoModelForCausalLM

    history = losses(lora_fsdp)
    assert history[-1] < 0.9 * history[0]
    assert (lora_fsdp.compiles, lora_fsdp.eval_compiles) == (1, 1)
    assert lora_fsdp.executions_per_step == 1.0
    assert lora_fsdp.sharding == "fsdp" and lora_fsdp.devices == 4
    layout = lora_fsdp.parameter_sharding
    assert all("devices=" in spec for spec in layout.values())  # base and adapters sharded
    assert any("lora_A" in name for name in layout)
    # What trained is exactly peft's adapters, and the memory plan counted the same.
    reference = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(lm_dir),
                                    peft.LoraConfig(**lora_fsdp.lora))
    trainable, total = reference.get_nb_trainable_parameters()
    assert (lora_fsdp.trainable_parameters, lora_fsdp.parameters) == (trainable, total)
    assert lora_fsdp.lora["r"] == 8 and lora_fsdp.lora["target_modules"] == "all-linear"
    assert lora_fsdp.memory_plan["trainable_parameters"] == trainable
    assert lora_fsdp.memory_plan["lora_rank"] == 8 and lora_fsdp.memory_plan["fits"]


def adapter_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter" / "adapter_model.safetensors")


@pytest.mark.launch
def test_only_the_adapters_changed_the_base_is_bit_identical(lora_fsdp, lm_dir):
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(lora_fsdp.output_dir)
    original = AutoModelForCausalLM.from_pretrained(lm_dir).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    adapters = adapter_weights(folder)
    scale = lora_fsdp.lora["lora_alpha"] / lora_fsdp.lora["r"]
    targeted = 0
    for name, weight in original.items():
        prefix = "base_model.model." + name.removesuffix(".weight")
        a, b = adapters.get(prefix + ".lora_A.weight"), adapters.get(prefix + ".lora_B.weight")
        if a is None:  # embeddings, norms: bit for bit the base
            assert torch.equal(merged[name], weight), name
            continue
        targeted += 1
        assert b.abs().max() > 0  # lora_B starts at zero: it trained
        # The merged weight is the untouched base plus the adapter's product, nothing else.
        torch.testing.assert_close(merged[name] - scale * (b @ a), weight, rtol=0, atol=1e-6)
    assert targeted == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers


def greedy(model, tokenizer, prompt: str, new_tokens: int = 4) -> list[int]:
    import torch

    ids = [tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    added: list[int] = []
    with torch.no_grad():
        for _ in range(new_tokens):
            added.append(int(model(torch.tensor([ids + added])).logits[0, -1].argmax()))
    return added


@pytest.mark.launch
def test_adapter_and_merged_folders_load_on_the_cpu_and_generate_the_same(lora_fsdp, lm_dir):
    import peft
    from transformers import AutoModelForCausalLM

    folder = Path(lora_fsdp.output_dir)
    config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == lm_dir
    adapter = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lm_dir),
                                             folder / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(merged).__name__ == "LlamaForCausalLM"
    assert isinstance(lora_fsdp.load_model(merge=False), peft.PeftModel)
    tokenizer = lora_fsdp.load_tokenizer()
    for prompt in PROMPTS:
        tokens = greedy(merged, tokenizer, prompt)
        assert tokens == greedy(adapter, tokenizer, prompt)
    answers = lora_fsdp.generate(PROMPTS, max_new_tokens=3)
    assert answers[0].strip() and len(answers) == 2
    assert not _xla.runtime_is_initialized()


@pytest.mark.launch
def test_lora_checkpoints_hold_the_adapter_and_resume_exactly(lora_fsdp, cache, tmp_path):
    checkpoints = saving.list_checkpoints(lora_fsdp.output_dir)
    assert [step for step, _ in checkpoints] == [8, 16]
    assert (Path(checkpoints[0][1]) / "adapter_config.json").is_file()
    resumed = run(cache, tmp_path / "resumed", resume_from_checkpoint=checkpoints[0][1])
    np.testing.assert_allclose(losses(resumed), losses(lora_fsdp), rtol=1e-5, atol=1e-6)
    assert resumed.metrics["eval_loss"] == pytest.approx(lora_fsdp.metrics["eval_loss"],
                                                         rel=1e-5)
    assert resumed.compiles == 1


def refusal(lm_dir, tmp_path, model=None, **options) -> str:
    before = set(os.listdir(tmp_path))
    with pytest.raises(FineTuneError) as error:
        prepare_fine_tune(model if model is not None else lm_dir, demo_lm_dataset(n=100),
                          prompt_column="prompt", response_column="response",
                          output_dir=tmp_path / "out", **options)
    assert set(os.listdir(tmp_path)) == before  # nothing written
    assert not _xla.runtime_is_initialized()
    return str(error.value)


@pytest.mark.slow  # imports peft: 15 s
def test_bad_lora_input_is_refused_before_anything_happens(lm_dir, tmp_path, monkeypatch):
    import peft
    from transformers import AutoModelForCausalLM

    assert "r must be a positive integer" in refusal(lm_dir, tmp_path, lora={"r": 0})
    assert "r must be a positive integer" in refusal(lm_dir, tmp_path,
                                                      lora=peft.LoraConfig(r=-2))
    message = refusal(lm_dir, tmp_path, lora={"target_modules": ["query", "value"]})
    assert "match no linear layer" in message and "q_proj" in message
    assert "peft.LoraConfig does not take" in refusal(lm_dir, tmp_path, lora={"rank": 8})
    assert "lora must be True, False, 'auto'" in refusal(lm_dir, tmp_path, lora="yes")
    quantized = AutoModelForCausalLM.from_pretrained(lm_dir)
    quantized.config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    assert "base is quantized" in refusal(lm_dir, tmp_path, model=quantized, lora=True)
    monkeypatch.setitem(sys.modules, "peft", None)  # as if it were not installed
    assert 'pip install "hfxla_nb[lora]"' in refusal(lm_dir, tmp_path, lora=True)


@pytest.mark.slow  # imports peft: 15 s
def test_lora_auto_and_the_plan_decide_before_the_fork(lm_dir):
    plan = prepare_fine_tune(lm_dir, demo_lm_dataset(n=100), prompt_column="prompt",
                             response_column="response", output_dir=None, lora="auto",
                             num_processes=4, batch_size=16, sharding="auto")
    # The tiny Llama fits a full fine-tune: "auto" keeps it, and says so.
    assert plan.lora is None and plan.sharding == "data"
    assert plan.memory.fits and plan.memory.devices == 4
    assert "lora='auto' chose a full fine-tune: it fits" in plan.data.notes
    assert "sharding='auto' chose 'data': the state fits every device" in plan.data.notes
    assert hx.plan_memory(lm_dir, lora=True).trainable_parameters == 16384
