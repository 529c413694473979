"""Named batches of any dtype (`batching.HostBatch`, `worker.context.Batch`): a task that carries a
float32 field beside its token ids is one module, uploads its batch in one call per step,
and compiles exactly what a token-only task compiles; the field's values reach the device
unchanged, in training and in the evaluation graphs compiled ahead."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import demo
from hfxla_nb.train import batching
from hfxla_nb.train.tasks.base import TASKS, register_task
from hfxla_nb.train.tasks.classification import Classification

ROWS = 400
BATCH = 16


def row_weights(rows: np.ndarray) -> np.ndarray:
    """The field the test task carries: a float32 weight per row (0.5, 1.0 or 1.5)."""
    return (0.5 + 0.5 * (rows % 3)).astype(np.float32)


class WeightedClassification(Classification):
    """Classification whose loss weighs each row by a float32 field of the batch: the whole
    task, as a user would write it (tests/test_batch_fields.py)."""

    name = "weighted-classification"
    pick_by_head = False
    outputs_per_batch = 4

    def prepare(self, splits: Any, config: Any, context: Any) -> Any:
        prepared = super().prepare(splits, config, context)
        for split in (prepared.data.train, prepared.data.eval):
            for bucket in split.buckets if split is not None else ():
                bucket.fields["row_weight"] = row_weights(bucket.rows)
        return prepared

    def train_loss(self, ctx: Any, batch: Any) -> Any:
        import torch

        losses = torch.nn.functional.cross_entropy(
            ctx.logits(batch), batch.tokens[:, -1].long(), reduction="none")
        weight = batch["row_weight"]
        return (losses * weight).sum() / weight.sum()

    def eval_outputs(self, ctx: Any, batch: Any) -> list:
        return [*super().eval_outputs(ctx, batch), batch["row_weight"] * batch.weights.float()]

    def eval_metrics(self, ctx: Any, batches: list, fetched: list) -> dict[str, float]:
        k = self.outputs_per_batch  # classification's outputs, then the weights
        values = Classification().eval_metrics(ctx, batches, [f for i, f in enumerate(fetched)
                                                              if i % k != k - 1])
        values["eval_weight_sum"] = float(sum(f.double().sum() for f in fetched[k - 1::k]))
        return values


@pytest.fixture(scope="module")
def weighted_task():
    task = register_task(WeightedClassification())
    yield task
    TASKS.unregister(task.name)


# -- the host side ---------------------------------------------------------------------------


def test_fields_pack_into_one_buffer_per_dtype():
    rows = 6
    fields = {"pixel_values": np.linspace(-1, 1, rows * 12, dtype=np.float32).reshape(
        rows, 3, 2, 2), "mask": np.ones((rows, 5), np.int64),
        "scale": np.linspace(0, 1, rows, dtype=np.float32)}
    tokens = np.arange(rows * 17, dtype=np.int32).reshape(rows, 17)
    host = batching.host_batch(8, tokens, fields, (2,))
    assert host.tokens.shape == (2, 3, 17) and host.tokens.dtype == np.int32
    assert [(b.dtype, b.shape) for b in host.buffers] == [
        (np.float32, (2, 3, 13)), (np.int64, (2, 3, 5))]
    slots = {slot.name: slot for slot in host.slots}
    pixels = slots["pixel_values"]
    assert (pixels.buffer, pixels.start, pixels.stop, pixels.shape) == (1, 0, 12, (3, 2, 2))
    assert (slots["scale"].start, slots["scale"].stop, slots["scale"].shape) == (12, 13, ())
    assert (slots["mask"].buffer, slots["mask"].start) == (2, 0)
    back = host.buffers[0].reshape(rows, 13)[:, :12].reshape(rows, 3, 2, 2)
    assert np.array_equal(back, fields["pixel_values"])  # the layout loses nothing


def test_token_only_batches_keep_their_one_int32_tensor():
    bucket = batching.Bucket(8, np.ones((10, 16), np.int32), np.arange(10), np.arange(10))
    host = batching.train_batch(bucket, np.arange(8), micro_batches=1)
    assert host.tokens.shape == (8, 17) and host.tokens.dtype == np.int32
    assert host.buffers == [] and host.slots == []
    bucket.fields["row_weight"] = row_weights(bucket.rows)
    host = batching.eval_batch(bucket, np.array([3, 4, 0, 0]), real=2)
    assert host.tokens[:, -1].tolist() == [1, 1, 0, 0]
    assert host.buffers[0][:, 0].tolist() == row_weights(np.array([3, 4, 0, 0])).tolist()


# -- on XLA:CPU, through fine_tune -----------------------------------------------------------


@pytest.fixture(scope="module")
def runs(weighted_task, cache):
    """The same short fine-tune, as the weighted task and as plain classification, under
    SPMD (the default) and replicated (one process per device, here one)."""
    data = demo.demo_dataset(n=ROWS)
    model = demo.demo_model_dir(cache=cache)
    common = dict(batch_size=BATCH, max_steps=12, learning_rate=2e-3, progress=False,
                  log_every=4, output_dir=None)
    return data, {(task, strategy): hx.fine_tune(model, data, task=task, strategy=strategy,
                                                 **common)
                  for task in (weighted_task.name, "classification")
                  for strategy in ("spmd", "replicated")}


@pytest.mark.launch
def test_a_float_field_compiles_as_a_token_only_batch(runs):
    _, results = runs
    for result in results.values():
        assert result.compiles == 1
        assert result.eval_compiles == 1
        assert result.executions_per_step == 1.0
    for strategy in ("spmd", "replicated"):  # the graph compiled ahead takes both tensors
        assert results["weighted-classification", strategy].eval_compiled_ahead == 1


@pytest.mark.launch
def test_a_float_field_goes_up_in_the_batchs_one_call(runs):
    _, results = runs
    weighted = {s: results["weighted-classification", s].uploads_per_step for s in
                ("spmd", "replicated")}
    plain = {s: results["classification", s].uploads_per_step for s in ("spmd", "replicated")}
    # One call, one transfer: the int32 tokens and the float32 field together.
    assert weighted["replicated"] == plain["replicated"]
    # Under SPMD torch_xla transfers each sharded array by itself: one more for the float32
    # buffer (worker/context.py says so).
    assert weighted["spmd"] == plain["spmd"] + 1


@pytest.mark.launch
def test_the_field_reaches_the_device_unchanged(runs):
    data, results = runs
    rows = len(data["validation"])
    expected = float(row_weights(np.arange(rows)).astype(np.float64).sum())
    for strategy in ("spmd", "replicated"):
        weighted = results["weighted-classification", strategy]
        assert weighted.metrics["eval_weight_sum"] == pytest.approx(expected, rel=1e-6)
        assert weighted.metrics["eval_rows"] == rows
