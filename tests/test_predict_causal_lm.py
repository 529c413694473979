"""hx.predict for a causal LM on real XLA:CPU over 4 virtual devices: each prompt's greedy
continuation, the same text as transformers' generate on the CPU, a fixed number of graphs
whatever the number of new tokens, bad input refused before any fork."""

from __future__ import annotations

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.lm import TEMPLATE, demo_lm_model_dir
from hfxla_nb.train import FineTuneError
from tests.helpers import refuse_launches

PROMPTS = [TEMPLATE.format(prompt=text, response="").rstrip() for text in (
    "the coffee was great.", "a boring film, slow and long, with a weak ending.",
    "loved it.", "the service was terrible and the food was cold.", "fine.")]
NEW = 6


@pytest.fixture(scope="module")
def generated(cache):
    folder = demo_lm_model_dir(cache=cache)
    return folder, hx.predict(folder, PROMPTS, batch_size=4, max_new_tokens=NEW,
                              num_processes=4, progress=False)


@pytest.mark.launch
def test_predict_generates_what_transformers_generates_on_the_cpu(generated):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, out = generated
    assert out.task == "causal-lm"  # task="auto": the model's head
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    for prompt, item in zip(PROMPTS, out, strict=True):
        ids = [tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False)["input_ids"]]
        with torch.no_grad():
            tokens = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                                    max_new_tokens=NEW, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
        if tokenizer.eos_token_id in tokens:
            tokens = tokens[:tokens.index(tokenizer.eos_token_id)]
        assert item == {"generated_text": tokenizer.decode(tokens, skip_special_tokens=True)}
    assert list(out.to_dataframe().columns) == ["generated_text"]


@pytest.mark.launch
def test_a_fixed_number_of_graphs(generated):
    _, out = generated
    # Two batches of one bucket (the second padded with filler rows): the prompt's graph and
    # one decoding step's (every token's: its inputs replicated, so the first step is the
    # same graph as the others); the second batch reuses both.
    assert len(out.bucket_lengths) == 1
    assert out.compiles == 2


@pytest.mark.parametrize("inputs, options, message", [
    ([3], {}, "input 0 is a int; causal-lm predicts on prompts (str)"),
    (["a prompt"], {"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
    (["a prompt"], {"max_new_tokens": 500}, "the model has 128. Pass a smaller max_new_tokens"),
])
def test_bad_input_is_refused_before_forking(inputs, options, message, cache, monkeypatch):
    refuse_launches(monkeypatch)
    with pytest.raises(FineTuneError) as raised:
        hx.predict(demo_lm_model_dir(cache=cache), inputs, num_processes=4, **options)
    assert message in str(raised.value)
    assert not _xla.runtime_is_initialized()
