"""Streamed training data (`load_dataset(..., streaming=True)`, a `datasets.IterableDataset`):
read and tokenized in the worker as training consumes it, so the kernel's memory stays flat
whatever the corpus size; one training graph (one row length); `max_steps` required, as
Trainer requires it. And the kernel's peak memory for data in memory, against
`datasets.map` + padding.

Peak memory is measured in fresh processes (`tests/memory_probe.py`): one mode's peak is
never another's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb.demo import demo_dataset, demo_model_dir, demo_texts
from hfxla_nb.demo.lm import demo_lm_dataset, demo_lm_model_dir
from hfxla_nb.train import FineTuneError, batching, data, prepare_fine_tune
from hfxla_nb.train.tasks.classification import ClassifyStream
from tests.helpers import ROOT, refuse_launches, subprocess_env


def probe(mode: str, rows: int, cache) -> dict:
    """`tests/memory_probe.py` in a fresh interpreter: its peak and base memory in MB."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "memory_probe.py"), mode, str(rows), "64",
         str(cache)], capture_output=True, text=True, timeout=300,
        env=subprocess_env(TOKENIZERS_PARALLELISM="false"), cwd=str(ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def text_stream(texts: list[str], rows: int):
    """A streamed corpus of `rows` rows (the texts over and over), made as it is read."""
    import datasets

    def generate(count):
        for i in range(count):
            yield {"text": texts[i % len(texts)]}

    return datasets.IterableDataset.from_generator(generate, gen_kwargs={"count": rows})


@pytest.fixture
def no_launch(monkeypatch):
    """Any attempt to fork a worker fails the test: bad input must be caught before."""
    refuse_launches(monkeypatch)


@pytest.fixture(scope="module")
def lm_dir(cache):
    return demo_lm_model_dir(cache=cache)


@pytest.fixture(scope="module")
def classifier_dir(cache):
    return demo_model_dir(cache=cache)


# -- training on a stream --------------------------------------------------------------------


@pytest.mark.launch
def test_a_streamed_corpus_trains_a_causal_lm_with_one_graph(lm_dir):
    pairs = demo_lm_dataset(400)
    # 1M rows: far more than the run reads (12 steps of 8 packed rows), never held anywhere.
    stream = text_stream(pairs["train"]["text"], 1_000_000)
    result = hx.fine_tune(lm_dir, stream, task="causal-lm", max_steps=12, max_length=64,
                          batch_size=8, learning_rate=3e-3, eval_dataset=pairs["validation"],
                          output_dir=None, progress=False, num_processes=1, log_every=4)
    assert (result.compiles, result.eval_compiles) == (1, 1)
    assert result.executions_per_step == 1.0
    losses = [loss for _, loss in result.loss_history]
    assert [step for step, _ in result.loss_history] == [4, 8, 12]
    assert losses[-1] < 0.9 * losses[0]
    assert result.metrics["eval_rows"] == 17  # the 40 evaluation texts, packed
    assert result.bucket_lengths == [64]
    assert any("streamed" in note for note in result.notes)


@pytest.mark.launch
def test_a_streamed_json_file_trains_a_classifier_with_one_graph(classifier_dir, tmp_path):
    import datasets

    splits = demo_dataset(2000)
    names = splits["train"].features["label"].names
    path = tmp_path / "train.jsonl"
    with open(path, "w") as file:
        for row in splits["train"]:  # labels as class names, as a JSON file holds them
            file.write(json.dumps({"text": row["text"], "label": names[row["label"]]}) + "\n")
    stream = datasets.load_dataset("json", data_files=str(path), split="train", streaming=True)
    evaluation = splits["validation"].cast_column("label", datasets.Value("string"))
    evaluation = evaluation.map(lambda row: {"label": names[int(row["label"])]})
    result = hx.fine_tune(classifier_dir, stream, max_steps=80, batch_size=32,
                          learning_rate=1e-3, eval_dataset=evaluation, output_dir=None,
                          progress=False, num_processes=1, log_every=20)
    assert (result.compiles, result.eval_compiles) == (1, 1)
    assert len(result.bucket_lengths) == 1
    assert sorted(result.label_names) == sorted(names)
    assert result.metrics["eval_accuracy"] > 0.7  # 1600 rows: the stream starts again


# -- the kernel's memory ---------------------------------------------------------------------


@pytest.mark.launch
def test_the_kernels_memory_stays_flat_whatever_the_streamed_corpus_size(cache):
    small, large = probe("stream", 10_000, cache), probe("stream", 1_000_000, cache)
    # 100x the rows, the same peak: the kernel reads the first rows only (the check).
    assert large["peak_mb"] - small["peak_mb"] < 30, (small, large)
    # What the kernel adds reading the first rows (about 100-360 MB here, by how much of the
    # datasets and tokenizer machinery a fresh venv loads): the 1M rows in memory, tokenized,
    # would take several GB.
    assert large["peak_mb"] - large["base_mb"] < 600, large


@pytest.mark.launch
def test_in_memory_data_peaks_within_1_5x_of_datasets_map_and_padding(cache):
    # docs/fine-tune.md has the figures of 200k rows (the same script, rows=200000).
    mapped, prepared = probe("map", 50_000, cache), probe("prepare", 50_000, cache)
    grown = {name: run["peak_mb"] - run["base_mb"] for name, run in
             (("map", mapped), ("prepare", prepared))}
    assert grown["prepare"] <= 1.5 * grown["map"], (mapped, prepared)
    assert prepared["peak_mb"] <= 1.5 * mapped["peak_mb"], (mapped, prepared)


# -- refusals, before any fork ---------------------------------------------------------------


@pytest.mark.launch
def test_a_stream_without_max_steps_is_refused_before_anything(lm_dir, no_launch):
    stream = text_stream(["some text"], 10)
    with pytest.raises(FineTuneError, match=r"streamed.*Pass max_steps=N"):
        hx.fine_tune(lm_dir, stream, task="causal-lm", output_dir=None, progress=False)


@pytest.mark.launch
def test_a_stream_for_a_task_that_cannot_read_one_is_refused(classifier_dir, no_launch):
    stream = text_stream(["some text"], 10)
    with pytest.raises(FineTuneError, match=r"'causal-lm' and 'classification'.*'masked-lm'"):
        hx.fine_tune(classifier_dir, stream, task="masked-lm", max_steps=2, output_dir=None,
                     progress=False)


def test_a_stream_whose_first_rows_hold_one_class_is_refused(classifier_dir, no_launch):
    import datasets

    def generate():
        for i in range(5000):
            yield {"text": f"row {i}", "label": "spam" if i < 2000 else "ham"}

    stream = datasets.IterableDataset.from_generator(generate)
    with pytest.raises(FineTuneError, match=r"one class \('spam'\).*ClassLabel"):
        hx.fine_tune(classifier_dir, stream, max_steps=2, output_dir=None, progress=False)


def test_a_streamed_row_of_an_unknown_class_names_its_row(classifier_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(classifier_dir)
    encode = ClassifyStream(tokenizer, ("text", None, "label"), ["negative", "positive"],
                            "str", ["input_ids", "attention_mask"], {"input_ids": 0}, "right", 16)
    bucket = encode([{"text": "good", "label": "positive"}, {"text": "bad", "label": "negative"}])
    assert bucket.inputs.shape == (2, 32) and list(bucket.labels) == [1, 0]
    with pytest.raises(data.DataError, match=r"row 3 .*'neutral'.*ClassLabel"):
        encode([{"text": "a", "label": "positive"}, {"text": "b", "label": "neutral"}])


@pytest.mark.launch
def test_an_empty_stream_is_refused(lm_dir, no_launch):
    with pytest.raises(FineTuneError, match="streamed training data is empty"):
        hx.fine_tune(lm_dir, text_stream(["x"], 0), task="causal-lm", max_steps=2,
                     output_dir=None, progress=False)


# -- the stream's rows, step by step ---------------------------------------------------------


class Counting:
    """Rows of a stream as rows of 4 ids: each row's number, four times."""

    def __call__(self, rows):
        ids = np.repeat(np.array([row["i"] for row in rows], np.int32)[:, None], 4, axis=1)
        return batching.Bucket(4, ids, np.zeros(len(rows), np.int64), np.arange(len(rows)))


def test_a_streamed_split_gives_each_step_the_same_rows_resumed_or_not():
    stream = [{"i": i} for i in range(1000)]  # ends: it starts again, as a new epoch
    split = batching.StreamedSplit("train", stream, Counting(), 4)
    steps = [split.step_rows(step, 300) for step in range(5)]
    firsts = [int(bucket.inputs[0, 0]) for bucket in steps]
    assert firsts == [0, 300, 600, 900, 200]  # step 3 ends the stream's first pass at 999
    assert [int(v) for v in steps[3].inputs[:, 0][95:105]] == list(range(995, 1000)) + list(
        range(5))
    resumed = batching.StreamedSplit("train", stream, Counting(), 4)
    np.testing.assert_array_equal(resumed.step_rows(3, 300).inputs, steps[3].inputs)
    assert all(bucket.inputs.shape == (300, 4) for bucket in steps)


@pytest.mark.launch
def test_pick_splits_reads_only_the_first_rows_of_a_streamed_evaluation_split():
    import datasets

    read = []

    def generate():
        for i in range(10**9):
            read.append(i)
            yield {"text": str(i)}

    stream = datasets.IterableDataset.from_generator(generate)
    train, evaluation, name = data.pick_splits(stream, stream)
    assert train is stream and name == "eval"
    assert len(evaluation) == data.STREAMED_EVAL_ROWS
    assert len(read) < 2 * data.STREAMED_EVAL_ROWS


@pytest.mark.launch
def test_prepare_reads_a_streamed_classifier_without_reading_the_stream(classifier_dir):
    import datasets

    texts, labels = demo_texts(3000)
    read = []

    def generate():
        for text, label in zip(texts, labels, strict=True):
            read.append(1)
            yield {"text": text, "label": label}

    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    stream = datasets.IterableDataset.from_generator(generate, features=features)
    plan = prepare_fine_tune(classifier_dir, stream, max_steps=5, output_dir=None,
                             max_length=32)
    assert isinstance(plan.data.train, batching.StreamedSplit)
    assert plan.total_steps == 5 and plan.data.bucket_lengths == [32]
    assert plan.data.label_names == ["negative", "positive"]
    assert len(read) <= data.PEEK_ROWS + 1
    assert plan.fingerprint["train_rows"] is None and plan.fingerprint["train_digest"]
