"""fine_tune(task="causal-lm") on XLA:CPU virtual devices: data and FSDPv2 sharding, fixed
shapes, saving, resume, generation; every bad input refused before anything is forked.

The pytest process never starts the XLA runtime: training and `hx.generate` run in launched
workers, `result.generate` on the CPU.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.lm import TEMPLATE, demo_lm_dataset, run_demo_lm
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from hfxla_nb.train.worker import saving
from tests.helpers import losses

ROWS = 400  # 360 training pairs: 22 steps of 16
STEPS = 16


def run(cache, out, devices, sharding, **options):
    return run_demo_lm(rows=ROWS, devices=devices, sharding=sharding, output_dir=out,
                       progress=False, cache=cache, max_steps=STEPS, log_every=4, **options)


@pytest.fixture(scope="module")
def one_device(cache, tmp_path_factory):
    return run(cache, tmp_path_factory.mktemp("one") / "llama", 1, "data", save_steps=8)


@pytest.fixture(scope="module")
def fsdp_4(cache, tmp_path_factory):
    return run(cache, tmp_path_factory.mktemp("fsdp4") / "llama", 4, "fsdp")


@pytest.mark.launch
def test_it_learns_and_reports_perplexity(one_device):
    history = losses(one_device)
    assert history[-1] < 0.75 * history[0]
    metrics = one_device.metrics
    assert metrics["eval_perplexity"] == pytest.approx(np.exp(metrics["eval_loss"]))
    assert metrics["eval_rows"] == 40 and metrics["eval_tokens"] > 0
    assert one_device.task == "causal-lm" and one_device.bucket_lengths == [64]


@pytest.mark.launch
def test_compile_contract(one_device, fsdp_4):
    # One length (max_length) for every row: a fixed number of graphs whatever the steps.
    for result in (one_device, fsdp_4):
        assert (result.compiles, result.eval_compiles) == (1, 1)  # one training graph; eval
        assert result.executions_per_step == 1.0


@pytest.mark.launch
def test_fsdp_shards_the_parameters_and_matches_one_device(one_device, fsdp_4):
    assert fsdp_4.sharding == "fsdp" and fsdp_4.devices == 4
    layout = fsdp_4.parameter_sharding
    assert layout["model.embed_tokens.weight"] == "{devices=[4,1]0,1,2,3}"
    assert all("devices=" in spec for spec in layout.values())
    assert set(one_device.parameter_sharding.values()) == {"{replicated}"}
    np.testing.assert_allclose(losses(fsdp_4), losses(one_device), rtol=1e-4, atol=1e-5)
    assert fsdp_4.metrics["eval_loss"] == pytest.approx(one_device.metrics["eval_loss"],
                                                         rel=1e-4)


@pytest.mark.launch
def test_data_and_fsdp_on_8_devices_match_one_device(cache, one_device):
    for sharding in ("data", "fsdp"):
        result = run(cache, None, 8, sharding)
        assert result.devices == 8
        np.testing.assert_allclose(losses(result), losses(one_device), rtol=1e-4, atol=1e-5)


@pytest.mark.launch
def test_the_saved_folder_is_an_ordinary_model_that_generates_on_the_cpu(one_device):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    folder = Path(one_device.output_dir)
    with safe_open(folder / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert not any("_orig_module" in name for name in names)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "LlamaForCausalLM"
    prompt = TEMPLATE.split("{response}")[0].format(prompt="the coffee was truly wonderful.")
    (answer,) = one_device.generate([prompt], max_new_tokens=3)
    # Each label is one token: even a short run answers with a whole verdict, not a spelling.
    assert answer.strip() in ("positive", "negative"), answer
    assert answer == greedy_continuation(model, one_device.load_tokenizer(), prompt, 3)
    assert not _xla.runtime_is_initialized()


def greedy_continuation(model, tokenizer, prompt: str, new_tokens: int) -> str:
    """The model's own greedy choice, one token at a time from its logits (no `generate`),
    up to `new_tokens` tokens or its end-of-sequence token."""
    import torch

    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    added = []
    with torch.no_grad():
        for _ in range(new_tokens):
            token = int(model(torch.tensor([ids + added])).logits[0, -1].argmax())
            if token == tokenizer.eos_token_id:
                break
            added.append(token)
    return tokenizer.decode(added, skip_special_tokens=True)


@pytest.mark.launch
def test_the_fsdp_checkpoint_is_gathered_into_the_same_model(fsdp_4):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(fsdp_4.output_dir)
    embed = model.model.embed_tokens.weight
    assert tuple(embed.shape) == (model.config.vocab_size, 64)  # whole, not a quarter


@pytest.mark.launch
def test_resume_continues_to_the_same_result(cache, one_device, tmp_path):
    checkpoints = saving.list_checkpoints(one_device.output_dir)
    assert [step for step, _ in checkpoints] == [8, 16]
    resumed = run(cache, tmp_path / "resumed", 1, "data",
                  resume_from_checkpoint=checkpoints[0][1])
    np.testing.assert_allclose(losses(resumed), losses(one_device), rtol=1e-5, atol=1e-6)
    assert resumed.metrics["eval_loss"] == pytest.approx(one_device.metrics["eval_loss"],
                                                         rel=1e-5)


@pytest.mark.launch
def test_generate_on_xla_compiles_a_fixed_number_of_graphs(one_device):
    folder = one_device.output_dir
    prompts = [TEMPLATE.split("{response}")[0].format(prompt=p)
               for p in ("the coffee was truly wonderful.", "i hated it.")]

    def work():
        import torch_xla.debug.metrics as met

        def compiles():
            data = met.metric_data("CompileTime")
            return data[0] if data else 0

        short = hx.generate(folder, prompts, max_new_tokens=4)
        after_short = compiles()
        long = hx.generate(folder, prompts, max_new_tokens=12)
        return short, long, after_short, compiles() - after_short

    short, long, first, second = hx.notebook_launcher(work, progress=False)
    assert (first, second) == (2, 2)  # the prompt's graph and one step's: any length
    # Its loading bar ("Loading weights 21/21") is not one of the launch's bars.
    assert not any(label.startswith("Loading") for rank in hx.last_launch().ranks
                   for label in rank.bars)
    assert len(short) == len(long) == 2 and all(isinstance(text, str) for text in long)
    assert long[0].startswith(short[0].split(" ")[0])  # greedy: the longer run extends


@pytest.mark.launch
def test_generate_in_the_kernel_points_to_the_cpu_path():
    with pytest.raises(RuntimeError, match=r"result.generate\(prompts\)"):
        hx.generate("folder", ["a prompt"])


def refusal(lm_dir, tmp_path, dataset=None, **options) -> str:
    before = set(os.listdir(tmp_path))
    with pytest.raises(FineTuneError) as error:
        prepare_fine_tune(lm_dir, dataset if dataset is not None else demo_lm_dataset(n=100),
                          output_dir=tmp_path / "out", **options)
    assert set(os.listdir(tmp_path)) == before  # nothing written
    assert not _xla.runtime_is_initialized()
    return str(error.value)


@pytest.mark.slow  # builds a Llama
def test_bad_inputs_are_refused_before_anything_happens(lm_dir, tmp_path):
    pairs = {"prompt_column": "prompt", "response_column": "response"}
    message = refusal(lm_dir, tmp_path, prompt_column="question", response_column="response")
    assert "question" in message
    assert "{response} placeholder" in refusal(lm_dir, tmp_path, template="Q: {prompt}", **pairs)
    assert "prompt_column and response_column go together" in refusal(
        lm_dir, tmp_path, prompt_column="prompt")
    assert "beyond the 128 positions" in refusal(lm_dir, tmp_path, max_length=256, **pairs)
    assert "does not split evenly over the 3 devices" in refusal(
        lm_dir, tmp_path, sharding="fsdp", num_processes=3, batch_size=16, **pairs)
    assert "FSDPv2, which runs under SPMD" in refusal(
        lm_dir, tmp_path, sharding="fsdp", strategy="replicated", **pairs)
    assert "packing=True is for plain text" in refusal(lm_dir, tmp_path, packing=True, **pairs)
    assert "is not one of" in refusal(lm_dir, tmp_path, task="translation")


def test_texts_longer_than_max_length_are_counted_before_the_run(lm_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = prepare_fine_tune(lm_dir, demo_lm_dataset(n=100), prompt_column="prompt",
                                 response_column="response", max_length=16, output_dir=None)
    cut = [note for note in plan.data.notes if "longer than max_length=16" in note]
    assert cut and any("longer than max_length=16" in str(w.message) for w in caught)
    assert plan.task == "causal-lm" and plan.data.bucket_lengths == [16]


def test_packing_fills_every_row_and_a_missing_pad_token_is_named(lm_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(lm_dir)
    tokenizer.pad_token = None
    plan = prepare_fine_tune(lm_dir, demo_lm_dataset(n=200), tokenizer=tokenizer, max_length=32,
                             output_dir=None)
    (bucket,) = plan.data.train.buckets
    assert bucket.inputs[:, 32:64].min() == 1  # attention mask: no padding at all
    assert any("texts packed into rows of 32 tokens" in note for note in plan.data.notes)
    assert any("padding with its end-of-text token '[SEP]'" in note for note in plan.data.notes)


def test_pairs_learn_only_the_response(lm_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(lm_dir)
    plan = prepare_fine_tune(lm_dir, demo_lm_dataset(n=100), prompt_column="prompt",
                             response_column="response", template=TEMPLATE, max_length=64,
                             output_dir=None)
    (bucket,) = plan.data.train.buckets
    row = bucket.inputs[0]
    ids, mask, labels = row[:64], row[64:128], row[128:]
    learned = labels[labels != -100].tolist()
    assert tokenizer.decode(learned).replace(" ", "").replace("#", "") in (
        "positive[SEP]", "negative[SEP]")
    assert (labels[mask == 0] == -100).all()
    assert ids[0] == tokenizer.bos_token_id


@pytest.mark.launch
def test_gradient_checkpointing_with_torch_xlas_checkpoint_keeps_the_losses(cache, fsdp_4):
    for sharding, devices in (("fsdp", 4), ("data", 1)):
        result = run(cache, None, devices, sharding, gradient_checkpointing=True)
        assert result.gradient_checkpointing is True
        assert any("torch_xla's checkpoint on each layer (LlamaDecoderLayer)" in note
                   for note in result.notes)
        np.testing.assert_allclose(losses(result), losses(fsdp_4), rtol=1e-4, atol=1e-5)


def test_auto_sharding_picks_fsdp_when_the_state_outgrows_one_chip():
    """`sharding="auto"` is decided by the memory plan (one place, `plan_memory`): FSDPv2
    where parameters, gradients and AdamW state do not fit one chip's HBM, else data."""
    from transformers import LlamaConfig

    from hfxla_nb.train.memory import plan_memory

    def llama(hidden: int, layers: int, intermediate: int) -> LlamaConfig:
        return LlamaConfig(hidden_size=hidden, intermediate_size=intermediate,
                           num_hidden_layers=layers, num_attention_heads=16,
                           num_key_value_heads=16, vocab_size=32000)

    small, large = llama(768, 12, 2048), llama(2048, 16, 8192)  # 134M and 1.2B parameters

    def plan(config, hardware):
        return plan_memory(config, hardware=hardware, sharding="auto", batch_size=8,
                           max_length=512)

    assert plan(small, "v5e-8").sharding == "data"  # about 2 GiB of state: fits 16 GiB
    chosen = plan(large, "v5e-8")  # about 18 GiB of state: more than one v5e chip
    assert chosen.sharding == "fsdp"
    assert "sharding='auto' chose 'fsdp': the state does not fit one device" in " ".join(
        chosen.notes)
    assert plan(large, "v6e-8").sharding == "data"  # 32 GiB per chip: fits
    assert plan(large, "cpu").sharding == "data"  # one memory for every CPU device



@pytest.mark.kernel
@pytest.mark.launch
def test_in_the_kernel_loading_shows_no_bar_and_warnings_name_the_users_line(lm_dir):
    """In a real kernel: `result.generate` (which loads the model there) leaves no "Loading
    weights" bar in the cell, while the user's own `from_pretrained` keeps its bar; a warning
    from `fine_tune`'s checks points at the user's line, not at hfxla_nb's internals."""
    import textwrap

    from tests.helpers import Kernel

    def shown(output) -> str:
        return output.text + repr(output.displays) + repr(output.updates)

    kernel = Kernel(TOKENIZERS_PARALLELISM="false")
    try:
        cells = (
            f"""
            from transformers import AutoModelForCausalLM
            from hfxla_nb.demo.lm import TEMPLATE, demo_lm_dataset
            from hfxla_nb.train import FineTuneResult, prepare_fine_tune
            result = FineTuneResult(
                output_dir={str(lm_dir)!r}, loss_history=[], metrics={{}}, steps=0, epochs=0.0,
                samples_per_second=None, train_seconds=0.0, compiles=0, eval_compiles=0,
                executions_per_step=None, transfers_per_step=None, label_names=[],
                strategy="spmd", devices=1, precision="fp32", bucket_lengths=[64],
                task="causal-lm")
            """,
            'answers = result.generate(["review: great.\\nverdict:"], max_new_tokens=2)',
            f"model = AutoModelForCausalLM.from_pretrained({str(lm_dir)!r})",
            """
            plan = prepare_fine_tune(result.output_dir, demo_lm_dataset(n=100), max_length=16,
                                     prompt_column="prompt", response_column="response",
                                     output_dir=None)
            """,
        )
        outputs = [kernel.run(textwrap.dedent(code), timeout=240) for code in cells]
        setup, generated, plain, warned = outputs
        for output in (setup, generated, plain, warned):
            assert output.error is None, "\n".join((output.error or {}).get("traceback", []))
        assert "Loading weights" not in shown(generated)
        assert "Loading weights" in shown(plain)  # the user's own load: its bar as before
        assert "UserWarning: hfxla_nb.fine_tune: " in warned.stderr, warned.stderr
        assert "longer than max_length=16" in warned.stderr
        assert "plan = prepare_fine_tune(" in warned.stderr  # the line shown is the user's
        assert "hfxla_nb/train" not in warned.stderr, warned.stderr
    finally:
        kernel.close()
