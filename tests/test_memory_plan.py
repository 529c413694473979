"""hx.plan_memory: exact parameter counts from meta-device models, bytes per parameter per
precision, LoRA adapter counts against peft's own, the changes that make a plan fit, and the
refusals. Real transformers models and configs, built locally (never the Hub)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

import hfxla_nb as hx
from hfxla_nb.train.config import FineTuneError
from hfxla_nb.train.memory import TPU_RESERVED_BYTES, MemoryPlan, MemoryPlanError, plan_memory
from tests.helpers import formatted_by_a_shell

transformers = pytest.importorskip("transformers")
GIB = 2**30


def llama_7b():
    return transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008,
                                    num_hidden_layers=32, num_attention_heads=32,
                                    vocab_size=32000)


def gemma_2b():
    # google/gemma-2b's published config.json (2.51B parameters; the head is tied).
    return transformers.GemmaConfig(hidden_size=2048, intermediate_size=16384,
                                    num_hidden_layers=18, num_attention_heads=8,
                                    num_key_value_heads=1, head_dim=256, vocab_size=256000)


def llama_1b():
    # meta-llama/Llama-3.2-1B's shape (tied head).
    return transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192,
                                    num_hidden_layers=16, num_attention_heads=32,
                                    num_key_value_heads=8, vocab_size=128256,
                                    tie_word_embeddings=True)


def tiny_llama():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    vocab_size=256)


def test_llama_7b_parameters_are_exact():
    plan = plan_memory(llama_7b(), hardware="v5e-8")
    assert plan.parameters == 6_738_415_616


def test_gemma_2b_parameters_match_the_architecture_by_hand():
    h, inter, layers, heads, kv, head_dim, vocab = 2048, 16384, 18, 8, 1, 256, 256000
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2
    per_layer = attention + 3 * h * inter + 2 * h  # q/o, k/v, gate/up/down, two norms
    expected = vocab * h + layers * per_layer + h  # tied head: the embedding counted once
    assert expected == 2_506_172_416  # Gemma 2B's published count
    assert plan_memory(gemma_2b(), hardware="v5e-1").parameters == expected


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_full_fine_tune_bytes_per_parameter(precision):
    """Autocast keeps float32 master weights: 4 + 4 (gradient) + 8 (AdamW m, v) bytes."""
    plan = plan_memory(llama_7b(), hardware="v5e-1", precision=precision)
    n = plan.parameters
    assert plan.trainable_parameters == n
    assert (plan.parameters_gib, plan.gradients_gib, plan.optimizer_gib) == pytest.approx(
        (4 * n / GIB, 4 * n / GIB, 8 * n / GIB), abs=1e-6)


@pytest.mark.parametrize(("precision", "frozen_bytes"), [("fp32", 4), ("bf16", 2)])
def test_lora_keeps_the_frozen_base_in_its_precision_and_adapters_in_fp32(precision,
                                                                          frozen_bytes):
    plan = plan_memory(llama_7b(), hardware="v5e-1", precision=precision, lora=True)
    n, t = plan.parameters, plan.trainable_parameters
    assert plan.lora_rank == 16
    assert plan.parameters_gib * GIB == pytest.approx(frozen_bytes * n + 4 * t, abs=1)
    assert plan.gradients_gib * GIB == pytest.approx(4 * t, abs=1)
    assert plan.optimizer_gib * GIB == pytest.approx(8 * t, abs=1)


def test_lora_rank_on_llama_7b_is_counted_by_hand():
    """r x (in + out) for q, k, v, o, gate, up, down in each of 32 layers (not lm_head)."""
    h, inter = 4096, 11008
    per_layer = 4 * (h + h) + 2 * (h + inter) + (inter + h)
    plan = plan_memory(llama_7b(), hardware="v5e-1", lora={"r": 8})
    assert plan.trainable_parameters == 8 * 32 * per_layer


def peft_trainable(model, **lora):
    peft = pytest.importorskip("peft")
    wrapped = peft.get_peft_model(model, peft.LoraConfig(**lora))
    trainable, _ = wrapped.get_nb_trainable_parameters()
    return trainable


@pytest.mark.parametrize("make", ["llama", "gpt2"])
@pytest.mark.parametrize("rank", [4, 16])
def test_lora_counts_equal_peft_all_linear(make, rank):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    if make == "llama":
        config = tiny_llama()
        model = transformers.LlamaForCausalLM(config)
    else:  # GPT-2's projections are transformers Conv1D layers, which all-linear targets too
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256,
                                         n_positions=128)
        model = transformers.GPT2LMHeadModel(config)
    planned = plan_memory(config, hardware="cpu", lora={"r": rank}).trainable_parameters
    assert planned == peft_trainable(model, r=rank, target_modules="all-linear")


def test_lora_counts_equal_peft_with_named_target_modules():
    config = tiny_llama()
    model = transformers.LlamaForCausalLM(config)
    lora = {"r": 8, "target_modules": ["q_proj", "v_proj"]}
    planned = plan_memory(config, hardware="cpu", lora=lora).trainable_parameters
    # q_proj 64 -> 64, v_proj 64 -> 32 (2 key-value heads of 16), in 2 layers
    assert planned == peft_trainable(model, **lora) == 8 * 2 * ((64 + 64) + (64 + 32))


def test_a_peft_lora_config_is_read():
    peft = pytest.importorskip("peft")
    plan = plan_memory(tiny_llama(), hardware="cpu",
                       lora=peft.LoraConfig(r=4, target_modules="all-linear"))
    assert plan.lora_rank == 4


def test_a_model_instance_and_a_saved_folder_give_the_same_plan(tmp_path):
    config = tiny_llama()
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path)
    from_folder = plan_memory(str(tmp_path), hardware="v5e-1", batch_size=2, max_length=64)
    from_model = plan_memory(model, hardware="v5e-1", batch_size=2, max_length=64)
    assert from_model.parameters == sum(p.numel() for p in model.parameters())
    assert from_folder.parameters == from_model.parameters
    assert from_folder.total_gib == pytest.approx(from_model.total_gib)
    assert from_folder.model == tmp_path.name


def test_fsdp_splits_the_state_and_the_batch_is_split_over_devices():
    data = plan_memory(gemma_2b(), hardware="v5e-8", batch_size=8, max_length=512)
    fsdp = plan_memory(gemma_2b(), hardware="v5e-8", batch_size=8, max_length=512,
                       sharding="fsdp")
    assert fsdp.parameters_gib == pytest.approx(data.parameters_gib / 8, rel=1e-6)
    assert fsdp.optimizer_gib == pytest.approx(data.optimizer_gib / 8, rel=1e-6)
    assert fsdp.activations_gib == pytest.approx(data.activations_gib)
    one_device = plan_memory(gemma_2b(), hardware="v5e-8", devices=1, batch_size=8,
                             max_length=512)
    assert one_device.activations_gib == pytest.approx(8 * data.activations_gib, rel=1e-6)


def test_activations_with_and_without_gradient_checkpointing():
    plan = plan_memory(llama_1b(), hardware="v5e-1", batch_size=4, max_length=1024)
    assert plan.activations_gib == plan.activations_full_gib
    # Checkpointing keeps each layer's input (h) instead of what the layer keeps (E), and one
    # layer recomputed: 4096 tokens x (16 E - 16 h - E) x 2 bytes (bf16 on a TPU) fewer.
    per_layer = 4 * 2048 + 2 * 32 * 64 + 2 * 8 * 64 + 32 * 1024 + 3 * 8192
    saved = 4096 * (16 * per_layer - 16 * 2048 - per_layer) * 2
    assert (plan.activations_full_gib - plan.activations_checkpointed_gib) * GIB == saved
    checkpointed = plan_memory(llama_1b(), hardware="v5e-1", batch_size=4, max_length=1024,
                               gradient_checkpointing=True)
    assert checkpointed.activations_gib == plan.activations_checkpointed_gib
    double = plan_memory(llama_1b(), hardware="v5e-1", batch_size=8, max_length=1024)
    assert double.activations_full_gib == pytest.approx(2 * plan.activations_full_gib)


@pytest.mark.parametrize(("hardware", "devices", "per_device_gib"), [
    ("v5e-1", 1, 16), ("v5e-8", 8, 16), ("v6e-1", 1, 32), ("v4-8", 4, 32), ("v3-8", 8, 16),
    ("v2-8", 8, 8),
])
def test_hbm_per_xla_device(hardware, devices, per_device_gib):
    plan = plan_memory(tiny_llama(), hardware=hardware, batch_size=8, max_length=64)
    assert plan.devices == devices
    assert plan.device_memory_gib * GIB == per_device_gib * GIB - TPU_RESERVED_BYTES


def test_a_7b_full_fine_tune_does_not_fit_a_v5e_1_and_lora_bf16_on_a_1b_does():
    seven = plan_memory(llama_7b(), hardware="v5e-1", batch_size=8, max_length=1024)
    assert not seven.fits
    assert seven.total_gib > 100  # 16 bytes per parameter alone are 100 GiB
    one = plan_memory(llama_1b(), hardware="v5e-1", batch_size=4, max_length=512,
                      lora=True, precision="bf16")
    assert one.fits, str(one)
    assert one.trainable_parameters < 0.01 * one.parameters


def test_the_changes_are_cumulative_in_order_of_cost_and_end_fitting():
    plan = plan_memory(llama_7b(), hardware="v5e-1", batch_size=8, max_length=1024,
                       precision="fp32")
    arguments = [change.argument for change in plan.changes]
    assert arguments[:3] == ["lora=True", "precision='bf16'", "gradient_checkpointing=True"]
    totals = [change.total_gib for change in plan.changes]
    assert totals == sorted(totals, reverse=True) and totals[0] < plan.total_gib
    assert plan.changes[-1].fits and not any(change.fits for change in plan.changes[:-1])
    # Each total is the plan of those settings, computed again from scratch.
    again = plan_memory(llama_7b(), hardware="v5e-1", batch_size=8, max_length=1024,
                        precision="bf16", lora=True, gradient_checkpointing=True)
    assert again.total_gib == pytest.approx(plan.changes[2].total_gib, abs=0.01)


def test_fsdp_over_more_chips_then_a_smaller_batch():
    """Already LoRA, bf16 and checkpointed: FSDP over the host's chips comes next, then the
    largest batch that fits, with the accumulation that keeps the effective batch."""
    plan = plan_memory(llama_7b(), hardware="v5e-8", batch_size=32, max_length=2048,
                       lora=True, gradient_checkpointing=True)
    assert [change.argument for change in plan.changes] == ["sharding='fsdp'"]
    assert plan.changes[0].change == "FSDP over 8 devices (this host's)"
    assert plan.changes[0].fits
    one_chip = plan_memory(llama_7b(), hardware="v5e-1", batch_size=512, max_length=2048,
                           lora=True, gradient_checkpointing=True)
    assert one_chip.changes[0].change == "FSDP over 8 devices (a v5e-8)"
    assert not one_chip.changes[0].fits
    batch = one_chip.changes[1]
    assert batch.fits and batch.argument.startswith("batch_size=")
    size = int(batch.argument.split("=")[1].split(",")[0])
    assert batch.argument.endswith(f"gradient_accumulation_steps={512 // size}")
    again = plan_memory(llama_7b(), hardware="v5e-8", batch_size=size, max_length=2048,
                        lora=True, gradient_checkpointing=True, sharding="fsdp")
    assert again.total_gib == pytest.approx(batch.total_gib, abs=0.01) and again.fits
    twice = plan_memory(llama_7b(), hardware="v5e-8", batch_size=2 * size, max_length=2048,
                        lora=True, gradient_checkpointing=True, sharding="fsdp")
    assert not twice.fits  # the largest batch that fits, not just one that does


def test_a_plan_that_does_not_fit_is_refused_with_its_numbers_and_changes():
    plan = plan_memory(llama_7b(), hardware="v5e-1", batch_size=8, max_length=1024)
    with pytest.raises(MemoryPlanError) as refused:
        plan.check()
    message = str(refused.value)
    assert isinstance(refused.value, FineTuneError)
    assert f"{plan.total_gib:.2f} GiB per device" in message and "of 15.48" in message
    for change in plan.changes:
        assert change.argument in message and f"{change.total_gib:.2f} GiB" in message
    fitting = plan_memory(tiny_llama(), hardware="v5e-1", batch_size=2, max_length=64)
    assert fitting.check() is fitting and fitting.changes == ()


def test_auto_settings_decide_from_the_plan_and_say_why():
    plan = plan_memory(llama_7b(), hardware="v5e-8", batch_size=8, max_length=512,
                       lora="auto", sharding="auto")
    assert plan.lora_rank == 16 and plan.sharding == "fsdp"
    assert any("lora='auto' chose LoRA" in note for note in plan.notes)
    assert any("sharding='auto' chose 'fsdp'" in note for note in plan.notes)
    small = plan_memory(tiny_llama(), hardware="v5e-8", lora="auto", sharding="auto")
    assert small.lora_rank is None and small.sharding == "data"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lora": {"r": 0}}, "LoRA r must be a positive integer"),
    ({"lora": {"r": 8, "target_modules": ["nothing_here"]}}, "match no linear layer"),
    ({"hardware": "v9z-8"}, "is not one plan_memory knows"),
    ({"hardware": "v5e-1", "devices": 2}, "v5e-1 has 1"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
    ({"precision": "fp16"}, "precision must be"),
    ({"sharding": "tensor"}, "sharding must be"),
    ({"lora": 3.5}, "lora must be True, False"),
])
def test_bad_arguments_are_refused_with_what_to_pass(kwargs, message):
    kwargs = {"hardware": "cpu", **kwargs}
    with pytest.raises(FineTuneError, match=message):
        plan_memory(tiny_llama(), **kwargs)


def test_a_plain_module_or_a_missing_folder_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    with pytest.raises(FineTuneError, match="pass its transformers config"):
        plan_memory(torch.nn.Linear(4, 4), hardware="cpu")
    with pytest.raises(FineTuneError, match="could not load the config"):
        plan_memory(str(tmp_path / "missing"), hardware="cpu")


def test_public_names_and_the_table():
    from hfxla_nb.ui.panels import plan_table

    assert hx.plan_memory is plan_memory and hx.MemoryPlan is MemoryPlan
    assert hx.MemoryPlanError is MemoryPlanError
    plan = plan_memory(gemma_2b(), hardware="v5e-1", batch_size=8, max_length=1024)
    text = plan_table(plan)
    assert text.splitlines()[0].startswith("Gemma on v5e-1 (1 device, 15.48 GiB each): ")
    assert "2.51B" in text and "AdamW" in text and "does not fit" in text
    assert "1. LoRA r=16 on all linear layers (lora=True)" in text
    # print() and messages: the total against the device and the changes, in words.
    words = str(plan)
    assert words.splitlines()[0] == ("Gemma on v5e-1 (1 device): 77.21 GiB per device of "
                                     "15.48, does not fit")
    assert "  1. LoRA r=16 on all linear layers (lora=True): 60.61 GiB per device" in words
    assert repr(plan).startswith("MemoryPlan(model='Gemma', hardware='v5e-1', devices=1, ")


def test_a_shell_draws_the_plan_as_its_table():
    # IPython's own formatters, registered by type name (ui/panels.py): train imports
    # nothing from ui, yet a plan as a cell's value shows the table, as text and as HTML.
    from hfxla_nb.ui.panels import plan_table

    plan = plan_memory(gemma_2b(), hardware="v5e-1", batch_size=8, max_length=1024)
    bundle = formatted_by_a_shell(plan)
    assert bundle["text/plain"] == plan_table(plan)
    assert "<pre>" not in bundle["text/html"]
    assert "LoRA r=16 on all linear layers (<code>lora=True</code>): 60.6" in bundle["text/html"]


def test_the_plan_is_a_table_of_its_parts_and_settings_not_fine_tunes_line_again():
    # docs/memory.md: parameters, gradients, optimizer state, activations and the settings,
    # as an HTML table and a text table with the same figures. The line fine_tune shows
    # before the fork is not drawn again: a cell that shows the plan then fine-tunes shows
    # that line once.
    import re

    from hfxla_nb.ui.panels import PlanNotice, plan_line, plan_table, plan_table_html

    plan = plan_memory(gemma_2b(), hardware="v5e-1", batch_size=8, max_length=1024)
    page, text = plan_table_html(plan), plan_table(plan)
    assert page.count("<table") == 1
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", page)
    assert heads == ["parameters", "trainable", "gradients", "optimizer state", "activations",
                     "total per device"]
    lines = text.splitlines()
    for part, gib in (("parameters", plan.parameters_gib), ("gradients", plan.gradients_gib),
                      ("optimizer state", plan.optimizer_gib),
                      ("activations", plan.activations_gib), ("total per device",
                                                              plan.total_gib)):
        (line,) = [line for line in lines if line.startswith(f"  {part} ")]
        assert f"{gib:.2f} GiB" in line and f"{gib:.2f} GiB</td>" in page, part
    settings = ("batch 8 x 1024 tokens, bf16, full fine-tune, data sharding, "
                "no gradient checkpointing")
    assert lines[1] == f"  {settings}" and f">{settings}</div>" in page
    assert "does not fit" in page and "AdamW" in page
    assert plan_line(plan) not in page and plan_line(plan) not in text
    notice = PlanNotice(plan, "none")  # what fine_tune draws before the fork: the line, once
    assert notice.text.count(plan_line(plan)) == 1 and notice.html.count("per device on") == 1


def tiny_bert():
    return transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=64, num_labels=3)


@pytest.mark.parametrize("lora", [{"r": 4}, {"r": 8, "modules_to_save": ["word_embeddings"]}])
def test_a_classifiers_lora_counts_equal_peft_seq_cls(lora):
    # SEQ_CLS trains the head whole, and modules_to_save too: counted exactly, each once.
    from hfxla_nb.train.memory import meta_classifier

    config = tiny_bert()
    model = transformers.BertForSequenceClassification(config)
    planned = plan_memory(meta_classifier(config, 3), hardware="cpu", lora=lora)
    assert planned.parameters == sum(p.numel() for p in model.parameters())
    assert planned.trainable_parameters == peft_trainable(
        model, task_type="SEQ_CLS", target_modules="all-linear", **copy.deepcopy(lora))


def finished(**changes):
    from hfxla_nb.train.result import FineTuneResult

    plan = plan_memory(tiny_llama(), hardware="cpu", devices=4, batch_size=16, max_length=64)
    values = dict(output_dir=None, loss_history=[(5, 2.0), (10, 1.0)], metrics={}, steps=10,
                  epochs=1.0, samples_per_second=10.0, train_seconds=1.0, compiles=1,
                  eval_compiles=0, executions_per_step=1.0, transfers_per_step=0.1,
                  label_names=[], strategy="spmd", devices=4, precision="fp32",
                  bucket_lengths=[64], task="causal-lm",
                  memory_plan=dataclasses.asdict(plan), xla={"largest_graph_bytes": 3 * 2**20})
    values.update(changes)
    return FineTuneResult(**values), plan


def test_the_result_shows_the_plan_beside_xlas_measured_graph_memory_as_text_and_html():
    from hfxla_nb.ui.panels import result_html, result_text

    result, plan = finished()
    row = next(line for line in result_text(result).splitlines() if "memory" in line)
    ratio = 3 * 2**20 / (plan.total_gib * GIB)
    assert f"plan {plan.total_gib * 1024:.1f} MiB per device" in row
    assert f"XLA measured 3.0 MiB (the largest graph): {ratio:.2f}x the plan" in row
    assert "XLA measured 3.0 MiB" in result_html(result)
    untraced, _ = finished(xla={})
    assert "XLA measured nothing (trace_compiles=False)" in result_text(untraced)
    assert "memory" not in result_text(finished(memory_plan=None)[0])


def test_lora_adapters_and_the_backward_working_set_are_counted_by_hand():
    # tiny_llama: h 64, 4 heads of 16, 2 kv heads, I 128 (gated), V 256, 2 layers; 4 rows of
    # 64 tokens on one device in fp32. Per token and layer E = 4h + 2*64 + 2*32 + 4*64 + 3I.
    tokens, e, per_layer = 4 * 64, 4, 4 * 64 + 2 * 64 + 2 * 32 + 4 * 64 + 3 * 128
    kept = tokens * 2 * per_layer * e + tokens * 256 * (e + 4)
    working = tokens * (per_layer * e + 256 * 4)  # one layer's gradients, the logits' gradient
    full = plan_memory(tiny_llama(), hardware="cpu", devices=1, batch_size=4, max_length=64)
    assert full.activations_gib * GIB == kept + working
    # LoRA r=8 on the 7 linear layers of each layer: x @ A (8 values each) and, with dropout,
    # a dropped copy of each layer's input and its mask (q, k, v, o, gate, up: 64; down: 128).
    adapters = tokens * 2 * (8 * 7 * e + (6 * 64 + 128) * 2 * e)
    lora = plan_memory(tiny_llama(), hardware="cpu", devices=1, batch_size=4, max_length=64,
                       lora={"r": 8, "lora_dropout": 0.1})
    assert lora.activations_gib * GIB == kept + working + adapters
    no_dropout = plan_memory(tiny_llama(), hardware="cpu", devices=1, batch_size=4,
                             max_length=64, lora={"r": 8, "lora_dropout": 0.0})
    assert no_dropout.activations_gib * GIB == kept + working + tokens * 2 * 8 * 7 * e
