"""Mixture-of-experts models on XLA (`train/experts.py`): every expert on every token, weighted by
the routing, gives transformers' own experts' outputs; a tiny Mixtral fine-tunes (and with LoRA)
with one training graph, its steps replayed, its losses the traced loop's."""

from __future__ import annotations

import pytest
import torch

from hfxla_nb.train.experts import DENSE, use_dense_experts

SIZES = dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=48,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             vocab_size=97, max_position_embeddings=64)
FAMILIES = {  # config class -> its experts' count and top-k, as the family names them
    "MixtralConfig": dict(num_local_experts=4, num_experts_per_tok=2),
    "Qwen3MoeConfig": dict(num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1),
    "OlmoeConfig": dict(num_experts=4, num_experts_per_tok=2),
    "GptOssConfig": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=16),
}


def _tiny(name: str) -> torch.nn.Module:
    import transformers

    config = getattr(transformers, name)(**SIZES, **FAMILIES[name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # routers and experts away from zero, biases too (GPT-OSS has them)
        for parameter in model.parameters():
            parameter.normal_(0, 0.2)
    return model.eval()


@pytest.mark.parametrize("name", FAMILIES)
def test_dense_experts_give_transformers_own_experts_outputs(name):
    model = _tiny(name)
    tokens = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    model.set_experts_implementation("eager")
    with torch.no_grad():
        expected = model(input_ids=tokens).logits
    note = use_dense_experts(model)
    assert note is not None and "'eager' experts" in note
    assert model.config._experts_implementation == DENSE
    with torch.no_grad():
        dense = model(input_ids=tokens).logits
    torch.testing.assert_close(dense, expected, rtol=1e-4, atol=1e-4)
    assert use_dense_experts(model) is None  # once


def test_a_model_without_experts_is_left_as_it_is():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in SIZES.items()
                                            if k != "moe_intermediate_size"}))
    assert use_dense_experts(model) is None


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory, cache):
    """A tiny Mixtral as its checkpoints ship (router aux loss on), with the demo tokenizer."""
    from transformers import AutoTokenizer, MixtralConfig, MixtralForCausalLM

    from hfxla_nb.demo.lm import demo_lm_model_dir

    tokenizer = AutoTokenizer.from_pretrained(demo_lm_model_dir(cache=cache))
    config = MixtralConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=128, output_router_logits=True,
        router_aux_loss_coef=0.02, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("mixtral")
    MixtralForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _tune(folder: str, **options):
    import hfxla_nb as hx
    from hfxla_nb.demo.lm import demo_lm_dataset

    return hx.fine_tune(folder, demo_lm_dataset(200), max_steps=6, batch_size=8, log_every=1,
                        learning_rate=3e-3, progress=False, output_dir=None, **options)


@pytest.mark.launch
def test_a_mixtral_fine_tunes_with_one_graph_its_steps_replayed_as_the_traced_loop(mixtral_dir):
    replayed, traced = _tune(mixtral_dir), _tune(mixtral_dir, compiled_steps=False)
    assert replayed.compiles == traced.compiles == 1
    assert list(replayed.compiled_steps.values()) == ["replayed"]
    assert replayed.loss_history == traced.loss_history  # bit for bit
    assert replayed.loss_history[-1][1] < replayed.loss_history[0][1]
    assert any(note.startswith("mixture of experts: every expert runs on every token")
               for note in replayed.notes)
    assert not replayed.xla.get("fallback_ops")


@pytest.mark.launch
def test_lora_on_a_mixtral_trains_its_adapters_with_one_graph(mixtral_dir):
    pytest.importorskip("peft")
    result = _tune(mixtral_dir, lora=True)
    assert result.compiles == 1 and list(result.compiled_steps.values()) == ["replayed"]
    assert result.lora["lora_dropout"] == 0.0  # peft's adapters of expert weights take none
    assert result.trainable_parameters < result.parameters
