"""fine_tune(task="masked-lm") on real XLA:CPU over 4 virtual devices: host-side masking by the
15% / 80-10-10 rules at fixed shapes, it learns the demo reviews, its loss equals a CPU forward
pass of the saved model on the same masked rows, one graph per bucket. Then `predict` on texts
with mask tokens: the fill-mask pipeline's candidates (same tokens, scores, sequences) on the
CPU, one graph per bucket; bad input refused before any fork."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo import demo_dataset
from hfxla_nb.demo.tasks import mlm_model_dir
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from hfxla_nb.train.predict import prepare_predict
from hfxla_nb.train.tasks.masked_lm import mask_tokens
from tests.helpers import refuse_launches

OPTIONS = dict(task="masked-lm", batch_size=32, epochs=3, learning_rate=5e-3, num_processes=4,
               progress=False)


@pytest.fixture(scope="module")
def trained(cache, tmp_path_factory):
    data = demo_dataset(n=400)
    folder = mlm_model_dir(cache=cache)
    result = hx.fine_tune(folder, data, output_dir=tmp_path_factory.mktemp("mlm") / "out",
                          **OPTIONS)
    return folder, data, result


def masked_texts(data, mask: str) -> list[str]:
    """The validation reviews with their third word masked (and a second mask in every
    fourth), and one text much longer than the rest."""
    texts = []
    for i, text in enumerate(data["validation"]["text"]):
        words = text.split()
        words[2] = mask
        if i % 4 == 0 and len(words) > 5:
            words[-2] = mask
        texts.append(" ".join(words))
    texts.append(" ".join([texts[0]] * 6))
    return texts


def test_masking_follows_the_15_80_10_10_rules():
    rng = np.random.default_rng(0)
    ids = list(range(5, 1005))
    special = [1] + [0] * 998 + [1]
    chosen = masked = kept = 0
    for _ in range(20):
        inputs, labels = mask_tokens(ids, special, rng, mask_id=4, vocab_size=2000)
        picked = np.flatnonzero(labels != -100)
        assert labels[0] == labels[-1] == -100  # special tokens are never chosen
        assert (labels[picked] == np.asarray(ids)[picked]).all()
        assert all(inputs[i] == ids[i] for i in range(len(ids)) if labels[i] == -100)
        chosen += len(picked)
        masked += sum(inputs[i] == 4 for i in picked)
        kept += sum(inputs[i] == ids[i] for i in picked)
    assert chosen / (20 * 998) == pytest.approx(0.15, abs=0.01)
    assert masked / chosen == pytest.approx(0.8, abs=0.02)
    assert kept / chosen == pytest.approx(0.1, abs=0.02)


@pytest.mark.launch
def test_it_learns_and_its_loss_is_a_cpu_forwards_on_the_same_masked_rows(trained):
    folder, data, result = trained
    assert result.task == "masked-lm"
    assert result.compiles == len(result.bucket_lengths) == 1
    assert result.eval_compiles == 1
    assert result.metrics["eval_perplexity"] < 100  # from about the vocabulary size (~1000)
    assert result.metrics["eval_perplexity"] == pytest.approx(
        math.exp(result.metrics["eval_loss"]))
    # The same masked evaluation rows (drawn from the seed), through the saved model on the CPU.
    plan = prepare_fine_tune(folder, data, output_dir=None, **OPTIONS)
    model = result.load_model()
    model.eval()
    total = tokens = 0.0
    for bucket in plan.data.eval.buckets:
        length = bucket.length
        inputs = {name: torch.from_numpy(bucket.inputs[:, k * length:(k + 1) * length]).long()
                  for k, name in enumerate(plan.data.input_names)}
        labels = torch.from_numpy(bucket.labels)
        with torch.no_grad():
            logits = model(**inputs).logits
        losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   labels.reshape(-1), ignore_index=-100,
                                                   reduction="sum")
        total += float(losses)
        tokens += float((labels != -100).sum())
    assert result.metrics["eval_masked_tokens"] == tokens
    assert result.metrics["eval_loss"] == pytest.approx(total / tokens, rel=1e-4)


@pytest.mark.launch
def test_predict_gives_the_fill_mask_pipelines_candidates(trained):
    from transformers import pipeline

    _, data, result = trained
    texts = masked_texts(data, "[MASK]")
    predicted = result.predict(texts, top_k=3, progress=False)
    assert predicted.task == "masked-lm"
    assert predicted.compiles == len(predicted.bucket_lengths)  # one graph per bucket
    assert 0 < predicted.compile_seconds < predicted.seconds
    fill = pipeline("fill-mask", model=result.output_dir, device="cpu", top_k=3)
    reference = fill(texts)
    several = 0
    for item, expected in zip(predicted, reference, strict=True):
        assert type(item) is dict and list(item) == ["masks"]
        expected = expected if isinstance(expected[0], list) else [expected]
        several += len(expected) > 1
        assert len(item["masks"]) == len(expected)
        for ours, theirs in zip(item["masks"], expected, strict=True):
            assert [c["token"] for c in ours] == [c["token"] for c in theirs]
            assert [c["token_str"] for c in ours] == [c["token_str"] for c in theirs]
            assert [c["sequence"] for c in ours] == [c["sequence"] for c in theirs]
            assert [c["score"] for c in ours] == pytest.approx(
                [c["score"] for c in theirs], abs=1e-4)
            assert all(type(c["score"]) is float and type(c["token"]) is int for c in ours)
    assert several >= 5
    frame = predicted.to_dataframe()
    assert list(frame.columns) == ["input", "mask", "score", "token", "token_str", "sequence"]
    assert len(frame) == 3 * sum(len(item["masks"]) for item in predicted)


def test_predict_on_a_masked_lm_folder_picks_masked_lm(cache):
    texts = masked_texts(demo_dataset(n=100), "[MASK]")[:4]
    plan = prepare_predict(mlm_model_dir(cache=cache), texts, num_processes=4)
    assert plan.task == "masked-lm" and plan.data.top_k == 5


@pytest.mark.parametrize("inputs, options, message", [
    (["no mask here", "the [MASK] one"], {}, "1 input(s) have no mask token (the first: input 0"),
    ([3], {}, "input 0 is a int; masked-lm predicts on texts (str) with '[MASK]'"),
    (["the [MASK] one"], {"top_k": 0}, "top_k must be an integer from 1 to the vocabulary"),
    (["word " * 20 + "[MASK]"], {"max_length": 8},
     "1 input(s) are longer than 8 tokens and would lose mask tokens"),
])
def test_bad_predict_input_is_refused_before_forking(cache, inputs, options, message,
                                                      monkeypatch):
    refuse_launches(monkeypatch)
    folder = mlm_model_dir(cache=cache)
    with pytest.raises(FineTuneError) as raised:
        hx.predict(folder, inputs, task="masked-lm", num_processes=4, **options)
    assert message in str(raised.value)
    assert not _xla.runtime_is_initialized()
