"""fine_tune(task="multiple-choice") and predict on real XLA:CPU over 4 virtual devices: it
learns SWAG-shaped rows (a context, four endings), rows x choices x length at one fixed
shape, its accuracy equals a CPU forward pass of the saved model on the same rows, predict
gives evaluation's choices, the compile contract holds, bad input is refused before anything
is forked or written."""

from __future__ import annotations

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.tasks import mc_dataset, mc_model_dir, mc_rows
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from tests.helpers import refuse_launches

ROWS = 400  # 320 train, 80 validation


@pytest.fixture(scope="module")
def swag(cache, tmp_path_factory):
    """One fine-tune and one predict launch for every test of this file."""
    data = mc_dataset(ROWS)
    result = hx.fine_tune(mc_model_dir(cache=cache), data, task="multiple-choice",
                          batch_size=32, epochs=6, learning_rate=5e-3, num_processes=4,
                          output_dir=tmp_path_factory.mktemp("mc") / "out", progress=False)
    validation = list(data["validation"])
    inputs = [{k: v for k, v in row.items() if k != "label"} for row in validation]
    # The other form predict takes: a context and a list of endings.
    inputs.append({"context": "it rained all day in oslo . so emma stone",
                   "endings": ["went to the beach .", "told everyone about it .",
                               "stayed inside .", "left before the end ."]})
    predicted = result.predict(inputs, batch_size=32,
                               max_length=result.bucket_lengths[-1], progress=False)
    return result, data, predicted


@pytest.mark.launch
def test_it_learns_swag_shaped_rows(swag):
    result, _, _ = swag
    assert result.task == "multiple-choice"
    assert result.metrics["eval_accuracy"] >= 0.75  # chance: 0.25
    assert result.loss_history[-1][1] < 0.5 * result.loss_history[0][1]
    assert result.metrics["eval_rows"] == ROWS // 5


@pytest.mark.launch
def test_compile_contract(swag):
    result, _, predicted = swag
    # One training and one evaluation graph per bucket (rows x 4 endings x length); predict:
    # one graph per bucket.
    assert len(result.bucket_lengths) == 1
    assert result.compiles == 1 and result.eval_compiles == 1
    assert predicted.bucket_lengths == result.bucket_lengths and predicted.compiles == 1


@pytest.mark.launch
def test_accuracy_and_predict_equal_a_cpu_forward_on_the_same_rows(swag):
    import torch

    result, data, predicted = swag
    validation = data["validation"]
    model, tokenizer = result.load_model(), result.load_tokenizer()
    model.eval()
    # Hugging Face's recipe: the context with each ending (sent2 in front), padded together.
    firsts = [c for c in validation["sent1"] for _ in range(4)]
    seconds = [f"{row['sent2']} {row[f'ending{k}']}" for row in validation for k in range(4)]
    encoded = tokenizer(firsts, seconds, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**{k: v.view(len(validation), 4, -1) for k, v in encoded.items()}).logits
    probabilities = torch.softmax(logits, -1).numpy()
    reference = probabilities.argmax(-1)
    labels = np.asarray(validation["label"])
    assert result.metrics["eval_accuracy"] == pytest.approx(float((reference == labels).mean()),
                                                            abs=1e-12)
    assert [item["label"] for item in predicted[:-1]] == reference.tolist()
    for item, row, p in zip(predicted[:-1], validation, probabilities, strict=True):
        label = item["label"]
        chosen = row[f"ending{label}"]
        assert item["ending"] == f"{row['sent2']} {chosen}"
        assert item["probabilities"] == pytest.approx(p.tolist(), abs=1e-4)
    frame = predicted.to_dataframe()
    assert list(frame.columns) == ["label", "ending", "score"] and len(frame) == len(labels) + 1
    assert predicted[-1]["ending"] == "stayed inside ."  # a context and a list of endings


def test_rows_are_choices_by_length_at_one_shape(cache):
    rows = mc_rows(40)
    plan = prepare_fine_tune(mc_model_dir(cache=cache), rows, task="multiple-choice",
                             batch_size=4, output_dir=None)
    tokenizer, bucket = plan.tokenizer, plan.data.train.buckets[0]
    length, names = bucket.length, plan.data.input_names
    assert bucket.inputs.shape == (40, len(names) * 4 * length)
    ids = bucket.inputs[:, :4 * length].reshape(40, 4, length)
    for i, row in enumerate(bucket.rows[:5]):
        for k in range(4):
            expected = tokenizer(rows[row]["sent1"],
                                 f"{rows[row]['sent2']} {rows[row][f'ending{k}']}")["input_ids"]
            assert ids[i, k, :len(expected)].tolist() == expected
            assert (ids[i, k, len(expected):] == tokenizer.pad_token_id).all()
    assert bucket.labels.tolist() == [rows[r]["label"] for r in bucket.rows]


def _labels(changes):
    rows = mc_rows(16)
    for index, label in changes.items():
        rows[index]["label"] = label
    return rows


BAD = {
    "missing endings": ([{k: v for k, v in row.items() if not k.startswith("ending")}
                         for row in mc_rows(16)],
                        "does not have the columns task='multiple-choice' needs"),
    "no context": ([{k: v for k, v in row.items() if k not in ("sent1", "startphrase")}
                    for row in mc_rows(16)], "its columns are: 'video-id', 'fold-ind', "),
    "label out of range": (_labels({3: 4, 9: -1}), "2 train label(s) in 'label' are not the "
                           "index of an ending (0..3); the first is row 3: 4"),
    "ending not text": ("ending 7", "column 'ending2' mixes types"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_anything_happens(case, cache, tmp_path, monkeypatch):
    refuse_launches(monkeypatch)
    rows, message = BAD[case]
    if rows == "ending 7":
        rows = mc_rows(16)
        rows[5]["ending2"] = 7
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(mc_model_dir(cache=cache), rows, task="multiple-choice", batch_size=4,
                     output_dir=tmp_path / "out", progress=False)
    assert message in str(raised.value)
    assert list(tmp_path.iterdir()) == []
    assert not _xla.runtime_is_initialized()
