"""fine_tune(task="token-classification") and predict on real XLA:CPU over 4 virtual devices:
it learns conll-shaped NER, its metrics are seqeval's on the same predictions, predict agrees
with a CPU forward pass of the saved model, the compile contract holds, bad input is refused
before anything is forked or written."""

from __future__ import annotations

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.tasks import CONLL_TAGS, ner_dataset, ner_model_dir, ner_rows
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from hfxla_nb.train.tasks.token_classification import IGNORE
from tests.helpers import refuse_launches

ROWS = 400  # 320 train, 80 validation
TEXTS = ["alice smith lives in berlin .", "nothing happened today ."]


@pytest.fixture(scope="module")
def ner(cache, tmp_path_factory):
    """One fine-tune and one predict launch for every test of this file: predict takes the
    validation rows' words and two plain texts together (one bucket, one graph)."""
    data = ner_dataset(ROWS)
    result = hx.fine_tune(ner_model_dir(cache=cache), data, task="token-classification",
                          batch_size=32, epochs=3, learning_rate=1e-2, num_processes=4,
                          output_dir=tmp_path_factory.mktemp("ner") / "out", progress=False)
    words = [list(row) for row in data["validation"]["tokens"]]
    predicted = hx.predict(result.output_dir, words + TEXTS, task="token-classification",
                           batch_size=32, max_length=result.bucket_lengths[-1],
                           num_processes=4, progress=False)
    return result, data, predicted


@pytest.mark.launch
def test_it_learns_conll_shaped_ner(ner):
    result, _, _ = ner
    assert result.task == "token-classification"
    assert result.metrics["eval_f1"] >= 0.8
    assert result.loss_history[-1][1] < 0.5 * result.loss_history[0][1]
    assert {"eval_PER_f1", "eval_LOC_f1", "eval_ORG_f1", "eval_MISC_f1"} <= set(result.metrics)
    assert result.metrics["eval_rows"] == ROWS // 5
    assert result.label_names == list(CONLL_TAGS)


@pytest.mark.launch
def test_compile_contract(ner):
    result, _, predicted = ner
    # One training graph and one evaluation graph per length bucket; predict: one per bucket.
    assert len(result.bucket_lengths) == 1
    assert result.compiles == 1
    assert result.eval_compiles == 1
    assert predicted.bucket_lengths == result.bucket_lengths
    assert predicted.compiles == 1


@pytest.mark.launch
def test_predict_matches_a_cpu_forward_and_metrics_are_seqeval_on_it(ner):
    import torch
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

    result, data, predicted = ner
    validation = data["validation"]
    predicted = predicted[:len(validation)]
    truth = [[CONLL_TAGS[t] for t in row] for row in validation["ner_tags"]]
    # The reference: the saved model on the CPU, each word's tag from its first sub-token.
    model, tokenizer = result.load_model(), result.load_tokenizer()
    model.eval()
    words = [list(row) for row in validation["tokens"]]
    encoded = tokenizer(words, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        ids = model(**encoded).logits.argmax(-1).numpy()
    reference = []
    for row in range(len(words)):
        word_ids, seen, tags = encoded.word_ids(row), set(), []
        for position, word in enumerate(word_ids):
            if word is not None and word not in seen:
                seen.add(word)
                tags.append(model.config.id2label[int(ids[row, position])])
        reference.append(tags)
    assert [item["tags"] for item in predicted] == reference
    assert [item["words"] for item in predicted] == words
    metrics = result.metrics
    assert metrics["eval_f1"] == pytest.approx(f1_score(truth, reference), abs=1e-12)
    assert metrics["eval_precision"] == pytest.approx(precision_score(truth, reference),
                                                      abs=1e-12)
    assert metrics["eval_recall"] == pytest.approx(recall_score(truth, reference), abs=1e-12)
    report = classification_report(truth, reference, output_dict=True)
    for kind in ("PER", "LOC", "ORG", "MISC"):
        assert metrics[f"eval_{kind}_f1"] == pytest.approx(report[kind]["f1-score"], abs=1e-12)


@pytest.mark.launch
def test_predict_on_texts_gives_entities_with_character_spans(ner):
    _, data, predicted = ner
    out = predicted[len(data["validation"]):]
    assert len(out) == len(TEXTS)
    for text, item in zip(TEXTS, out, strict=True):
        for entity in item["entities"]:
            assert text[entity["start"]:entity["end"]] == entity["text"]
            assert 0 < entity["score"] <= 1
    found = {(e["entity"], e["text"]) for e in out[0]["entities"]}
    assert ("PER", "alice smith") in found and ("LOC", "berlin") in found
    frame = predicted.to_dataframe()
    assert list(frame.columns) == ["input", "entity", "text", "start", "end", "score"]
    assert len(frame) == sum(len(item["entities"]) for item in predicted)
    assert set(frame["input"]) <= set(range(len(predicted)))


def test_labels_on_the_first_sub_token_only(cache):
    rows = ner_rows(40)
    plan = prepare_fine_tune(ner_model_dir(cache=cache), rows, task="token-classification",
                             batch_size=4, output_dir=None)
    tokenizer = plan.tokenizer
    bucket = plan.data.train.buckets[0]
    length = bucket.length
    for i, row in enumerate(bucket.rows[:10]):
        words, tags = rows[row]["tokens"], rows[row]["ner_tags"]
        ids = bucket.inputs[i, :length]
        labels = bucket.labels[i]
        word_ids = tokenizer(words, is_split_into_words=True).word_ids()
        kept = [labels[p] for p in range(len(word_ids)) if labels[p] != IGNORE]
        assert [plan.data.label_names[k] for k in kept] == tags  # one label per word, in order
        firsts = {word_ids.index(w) for w in set(word_ids) if w is not None}
        assert {p for p in range(length) if labels[p] != IGNORE} == firsts
        assert (labels[len(word_ids):] == IGNORE).all() and ids[len(word_ids):].sum() == 0


def _rows_with(changes: dict[int, dict]) -> list[dict]:
    rows = [dict(r) for r in ner_rows(16)]
    for index, row in changes.items():
        rows[index].update(row)
    return rows


BAD = {
    "misnamed columns": ([{"words": r["tokens"], "tags": r["ner_tags"]} for r in ner_rows(16)],
                         {}, "has no column 'tokens' and no 'ner_tags'; its columns are: "
                         "'words', 'tags'"),
    "strings, not words": ([{"tokens": " ".join(r["tokens"]), "ner_tags": r["ner_tags"]}
                            for r in ner_rows(16)], {},
                           "row 0 of 'tokens' (train) is a string"),
    "tags not matching words": (_rows_with({2: {"ner_tags": ["O"]}, 5: {"ner_tags": []}}), {},
                                "2 train row(s) have tags that do not match their words"),
    "classifier instance": (None, {"model": "classifier"}, "has no head for it"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_anything_happens(case, cache, tmp_path, monkeypatch):
    refuse_launches(monkeypatch)
    rows, options, message = BAD[case]
    model = ner_model_dir(cache=cache)
    if options.pop("model", None) == "classifier":
        from transformers import AutoModelForSequenceClassification

        from hfxla_nb.demo import demo_model_dir
        model = AutoModelForSequenceClassification.from_pretrained(demo_model_dir(cache=cache))
        rows = ner_rows(16)
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(model, rows, task="token-classification", batch_size=4,
                     output_dir=tmp_path / "out", progress=False, **options)
    assert message in str(raised.value)
    assert list(tmp_path.iterdir()) == []
    assert not _xla.runtime_is_initialized()
