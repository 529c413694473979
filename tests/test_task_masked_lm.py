"""fine_tune(task="masked-lm") on real XLA:CPU over 4 virtual devices: host-side masking by the
15% / 80-10-10 rules at fixed shapes, it learns the demo reviews, its loss equals a CPU forward
pass of the saved model on the same masked rows, one graph per bucket."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import hfxla_nb as hx
from hfxla_nb.demo import demo_dataset
from hfxla_nb.demo_tasks import mlm_model_dir
from hfxla_nb.train import prepare_fine_tune
from hfxla_nb.train.masked_lm import mask_tokens

OPTIONS = dict(task="masked-lm", batch_size=32, epochs=3, learning_rate=5e-3, num_processes=4,
               progress=False)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "hfxla_nb_cache"


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


def test_it_learns_and_its_loss_is_a_cpu_forwards_on_the_same_masked_rows(cache, tmp_path):
    data = demo_dataset(n=400)
    folder = mlm_model_dir(cache=cache)
    result = hx.fine_tune(folder, data, output_dir=tmp_path / "out", **OPTIONS)
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
