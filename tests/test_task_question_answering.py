"""fine_tune(task="question-answering") and predict on real XLA:CPU over 4 virtual devices:
it learns SQuAD v2-shaped data (long contexts split with a stride, unanswerable questions),
exact match and F1 equal SQuAD's rules applied to predict's answers, predict agrees with the
same decoding of a CPU forward pass, the compile contract holds, bad input is refused before
anything is forked or written."""

from __future__ import annotations

import collections
import re
import string

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.tasks import qa_dataset, qa_model_dir, qa_rows
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from tests.helpers import refuse_launches

ROWS = 400  # 320 train, 80 validation


@pytest.fixture(scope="module")
def qa(cache, tmp_path_factory):
    data = qa_dataset(ROWS)
    result = hx.fine_tune(qa_model_dir(cache=cache), data, task="question-answering",
                          batch_size=32, epochs=5, learning_rate=1e-2, max_length=48,
                          num_processes=4,
                          output_dir=tmp_path_factory.mktemp("qa") / "out", progress=False)
    return result, data


@pytest.fixture(scope="module")
def predicted(qa):
    result, data = qa
    rows = [{"question": r["question"], "context": r["context"]} for r in data["validation"]]
    return result.predict(rows, batch_size=32, max_length=result.bucket_lengths[-1],
                          progress=False)


@pytest.mark.launch
def test_it_learns_squad_v2_shaped_qa(qa):
    result, _ = qa
    assert result.task == "question-answering"
    assert result.metrics["eval_exact_match"] >= 60
    assert result.metrics["eval_has_answer_exact_match"] >= 50
    assert result.metrics["eval_no_answer_exact_match"] >= 50
    assert result.loss_history[-1][1] < 0.5 * result.loss_history[0][1]
    assert any("more windows for long contexts" in note for note in result.notes)


@pytest.mark.launch
def test_compile_contract(qa, predicted):
    result, _ = qa
    buckets = len(result.bucket_lengths)
    assert result.compiles == buckets and result.eval_compiles == buckets
    assert predicted.compiles == len(predicted.bucket_lengths)


def _normalize(text):  # SQuAD v2's official evaluation script, written out again
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _squad_f1(prediction, gold):
    p, g = _normalize(prediction).split(), _normalize(gold).split()
    if not p or not g:
        return float(p == g)
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    return 0.0 if same == 0 else 2 * same / (len(p) + len(g))


@pytest.mark.launch
def test_metrics_are_squads_rules_on_predicts_answers(qa, predicted):
    result, data = qa
    validation = data["validation"]
    exact, f1 = [], []
    for item, row in zip(predicted, validation, strict=True):
        golds = list(row["answers"]["text"]) or [""]
        exact.append(max(float(_normalize(item["answer"]) == _normalize(g)) for g in golds))
        f1.append(max(_squad_f1(item["answer"], g) for g in golds))
        if item["answer"]:
            assert row["context"][item["start"]:item["end"]] == item["answer"]
    assert result.metrics["eval_exact_match"] == pytest.approx(100 * np.mean(exact), abs=1e-9)
    assert result.metrics["eval_f1"] == pytest.approx(100 * np.mean(f1), abs=1e-9)


@pytest.mark.launch
def test_predict_matches_a_cpu_forward_decoded_the_same_way(qa, predicted):
    import torch

    from hfxla_nb.train.tasks.question_answering import best_answer, encode_examples

    result, data = qa
    validation = data["validation"]
    model, tokenizer = result.load_model(), result.load_tokenizer()
    model.eval()
    length = result.bucket_lengths[-1]
    encoded, _, mapping, offsets = encode_examples(
        tokenizer, list(validation["question"]), list(validation["context"]), None, length,
        length // 4)
    ids = [row + [0] * (length - len(row)) for row in encoded["input_ids"]]
    mask = [row + [0] * (length - len(row)) for row in encoded["attention_mask"]]
    types = [row + [0] * (length - len(row)) for row in encoded["token_type_ids"]]
    with torch.no_grad():
        output = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                       token_type_ids=torch.tensor(types))
    starts, ends = output.start_logits.numpy(), output.end_logits.numpy()
    for example, item in enumerate(predicted):
        features = [(starts[f], ends[f], offsets[f]) for f in np.flatnonzero(mapping == example)]
        reference = best_answer(features, validation[example]["context"], True)
        assert item["answer"] == reference["answer"]
        assert item["score"] == pytest.approx(reference["score"], abs=1e-3)


def test_long_contexts_become_overlapping_windows_with_the_answer_positions(cache):
    rows = qa_rows(64, seed=3, max_filler=12)
    plan = prepare_fine_tune(qa_model_dir(cache=cache), rows, task="question-answering",
                             batch_size=4, max_length=32, output_dir=None)
    tokenizer = plan.tokenizer
    split = plan.data.train
    assert split.num_rows > len(rows)  # some contexts needed several windows
    for bucket in split.buckets:
        for i in range(len(bucket)):
            start, end = bucket.labels[i]
            if start == 0:
                continue
            ids = bucket.inputs[i, :bucket.length]
            answer = tokenizer.decode(ids[start:end + 1])
            assert any(answer == r["answers"]["text"][0] for r in rows if r["answers"]["text"])


BAD = {
    "misnamed columns": ([{"q": r["question"], "context": r["context"], "answers": r["answers"]}
                          for r in qa_rows(16)],
                         "has no column 'question'; its columns are: 'q', 'context', 'answers'"),
    "answer_start not at its text": ("shifted", "2 train answer(s) do not point at their text "
                                     "in the context; the first is row 1: answer_start"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_anything_happens(case, cache, tmp_path, monkeypatch):
    refuse_launches(monkeypatch)
    rows, message = BAD[case]
    if rows == "shifted":
        rows = [r for r in qa_rows(40) if r["answers"]["text"]][:16]
        for index in (1, 7):
            answers = rows[index]["answers"]
            rows[index]["answers"] = {"text": answers["text"],
                                      "answer_start": [answers["answer_start"][0] + 2]}
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(qa_model_dir(cache=cache), rows, task="question-answering", batch_size=4,
                     output_dir=tmp_path / "out", progress=False)
    assert message in str(raised.value)
    assert list(tmp_path.iterdir()) == []
    assert not _xla.runtime_is_initialized()
