"""The evaluation's graphs compiled ahead (`train/worker/evaluate.py`, `EvalAhead`), on real
XLA:CPU: with two length buckets, both evaluation graphs compile while training runs,
evaluation compiles nothing, training still compiles one graph per bucket, and the metrics are
those of the saved model evaluated on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import demo

pytestmark = pytest.mark.launch

BATCH = 8


@pytest.fixture(scope="module")
def two_buckets(cache, tmp_path_factory):
    """Short demo reviews and reviews four times as long: two length buckets."""
    import datasets

    base = demo.demo_dataset(n=400)["train"]
    texts, labels = list(base["text"]), list(base["label"])

    def rows(start: int, count: int) -> dict:
        short = texts[start:start + count]
        long = [" ".join(texts[i:i + 4]) for i in range(start, start + 4 * count, 4)]
        return {"text": short + long, "label": labels[start:start + count] * 2}

    train = datasets.Dataset.from_dict(rows(0, 64), features=base.features)
    validation = datasets.Dataset.from_dict(rows(300, 12), features=base.features)
    out = tmp_path_factory.mktemp("ahead") / "tiny-bert"
    result = hx.fine_tune(demo.demo_model_dir(cache=cache), train, eval_dataset=validation,
                          batch_size=BATCH, epochs=1, learning_rate=1e-3, output_dir=out,
                          progress=False, log_every=4)
    return result, validation


def test_evaluation_graphs_compile_while_training_runs(two_buckets):
    result, _ = two_buckets
    buckets = len(result.bucket_lengths)
    assert buckets >= 2  # the ahead compile of several graphs at once is what is tested
    assert result.compiles == buckets  # training's graphs: one per bucket, as before
    assert result.eval_compiles == buckets
    assert result.eval_compiled_ahead == buckets  # evaluation itself compiled nothing


def test_metrics_are_the_saved_models_on_the_cpu(two_buckets):
    import torch

    result, validation = two_buckets
    model = result.load_model().eval()
    tokenizer = result.load_tokenizer()
    inputs = tokenizer(list(validation["text"]), padding=True, truncation=True,
                       max_length=max(result.bucket_lengths), return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    labels = torch.tensor(validation["label"])
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    accuracy = float(np.mean(logits.argmax(-1).numpy() == labels.numpy()))
    assert result.metrics["eval_rows"] == len(validation)
    assert result.metrics["eval_loss"] == pytest.approx(loss, abs=1e-4)
    assert result.metrics["eval_accuracy"] == pytest.approx(accuracy)
