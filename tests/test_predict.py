"""hx.predict / FineTuneResult.predict for classification on real XLA:CPU over 4 virtual
devices: the same answers as evaluation for the evaluation rows, the probabilities of a CPU
forward pass, one graph per bucket, plain Python out, bad input refused before any fork."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, demo
from hfxla_nb.demo.tasks import classifier_model_dir
from hfxla_nb.train import FineTuneError
from hfxla_nb.train.predict import default_batch_size
from tests.helpers import refuse_launches

ROWS = 400  # 320 train, 40 validation


@pytest.fixture(scope="module")
def classifier(cache, tmp_path_factory):
    data = demo.demo_dataset(n=ROWS)
    result = hx.fine_tune(classifier_model_dir(cache=cache), data, batch_size=32, epochs=2,
                          learning_rate=4e-3, num_processes=4, progress=False,
                          output_dir=tmp_path_factory.mktemp("cls") / "out")
    texts = list(data["validation"]["text"])
    return result, data, result.predict(texts, batch_size=16, progress=False)


@pytest.mark.launch
def test_predict_gives_evaluations_answers_for_the_evaluation_rows(classifier):
    result, data, predicted = classifier
    labels = [result.label_names[y] for y in data["validation"]["label"]]
    accuracy = np.mean([p["label"] == y for p, y in zip(predicted, labels, strict=True)])
    assert accuracy == pytest.approx(result.metrics["eval_accuracy"], abs=1e-12)
    assert predicted.task == "classification"
    assert predicted.compiles == len(predicted.bucket_lengths)  # one graph per bucket


@pytest.mark.launch
def test_predict_returns_plain_python_with_a_cpu_forwards_probabilities(classifier):
    import torch

    result, data, predicted = classifier
    texts = list(data["validation"]["text"])
    model, tokenizer = result.load_model(), result.load_tokenizer()
    model.eval()
    with torch.no_grad():
        probabilities = torch.softmax(model(**tokenizer(texts, padding=True,
                                                        return_tensors="pt")).logits, -1)
    for item, row in zip(predicted, probabilities.numpy(), strict=True):
        assert type(item) is dict and type(item["score"]) is float
        assert set(item["probabilities"]) == set(result.label_names)
        assert [item["probabilities"][n] for n in result.label_names] == pytest.approx(
            row.tolist(), abs=1e-4)
        assert item["label"] == result.label_names[int(row.argmax())]
    frame = predicted.to_dataframe()
    assert list(frame.columns) == ["label", "score"] and len(frame) == len(texts)


@pytest.mark.launch
def test_predict_keeps_its_inputs_and_its_table_names_each_row_by_its_text(classifier):
    from hfxla_nb.ui.panels import predictions_text

    _, data, predicted = classifier
    texts = list(data["validation"]["text"])
    assert predicted.inputs == texts
    first = predictions_text(predicted).splitlines()[2]
    assert first.startswith("  " + " ".join(texts[0].split())[:20]), first


def test_stream_is_refused_in_one_error_before_the_model_is_read(monkeypatch):
    # predict never streams (hx.generate does): refused before any library call, so no
    # library traceback comes first, even for a model that cannot be read here.
    refuse_launches(monkeypatch)

    def unread(*args, **kwargs):
        raise AssertionError("the model was read before stream was refused")

    monkeypatch.setattr("hfxla_nb.train.preparation.model_source", unread)
    for model in ("no-such-org/no-such-model", "/no/such/folder"):
        with pytest.raises(FineTuneError) as raised:
            hx.predict(model, ["a text"], stream=True)
        message = str(raised.value)
        assert message.startswith("predict does not stream") and "stream=True" in message
        assert raised.value.__cause__ is None and raised.value.__context__ is None


@pytest.mark.parametrize("inputs, options, message", [
    ([], {}, "inputs is empty"),
    (["a text"], {"batch_size": 6}, "does not split evenly over the 4 devices"),
    ([3], {}, "input 0 is a int; classification predicts on texts"),
    (["a text"], {"task": "summarize"}, "task='summarize' is not one of"),
    ([{"question": "q", "context": "c"}], {"task": "question-answering"},
     "has no head for it"),
])
def test_bad_predict_input_is_refused_before_forking(inputs, options, message, cache,
                                                      monkeypatch):
    refuse_launches(monkeypatch)
    from transformers import AutoModelForSequenceClassification

    folder = classifier_model_dir(cache=cache)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    model.config._name_or_path = folder  # where its tokenizer is
    with pytest.raises(FineTuneError) as raised:
        hx.predict(model, inputs, num_processes=4, **options)
    assert message in str(raised.value)
    assert not _xla.runtime_is_initialized()


@pytest.mark.parametrize("task, rows, expected", [
    ("classification", 1, 32), ("classification", 40, 64), ("classification", 100, 128),
    ("classification", 2000, 128), ("question-answering", 2000, 128),
    ("causal-lm", 2000, 32), ("seq2seq", 2000, 32),
])
def test_the_default_batch_is_up_to_32_rows_a_device_and_8_when_generating(task, rows,
                                                                           expected):
    assert default_batch_size(task, rows, 4) == expected


@pytest.mark.launch
def test_a_real_predicts_figures_count_its_batches_as_its_bar_does(cache, capsys):
    # One batch: the bar says `predict ✔ 1/1`; the metrics used to say "in 3 steps" (the
    # syncs of loading, the batch and the fetch) and rate XLA's time per one of those.
    folder = classifier_model_dir(cache=cache)
    hx.predict(folder, ["a fine film", "a dull film"], num_processes=1, progress="console")
    printed = capsys.readouterr().out
    rank = hx.last_launch().ranks[0]
    assert rank.bars["predict"] == (1, 1)
    assert rank.metrics.steps == 1  # the record counts what the bar counts
    assert re.search(r"^predict +✔ \|█+\| 1/1 ", printed, re.M), printed
    assert "XLA in 1 batch: " in printed and "steps" not in printed, printed
    assert "XLA per" not in printed, printed  # no rate over one batch
