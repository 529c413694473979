"""The embedded demo data, tokenizer and tiny BERT (hfxla_nb.demo): offline and deterministic."""

from __future__ import annotations

import collections
import os

import pytest

from hfxla_nb import _xla, demo


def test_dataset_is_deterministic_labeled_and_split():
    first = demo.demo_dataset(n=500, seed=0)
    again = demo.demo_dataset(n=500, seed=0)
    other = demo.demo_dataset(n=500, seed=1)
    assert list(first) == ["train", "validation", "test"]
    assert [len(first[s]) for s in first] == [400, 50, 50]
    assert first["train"].features["label"].names == ["negative", "positive"]
    assert list(first["train"]["text"]) == list(again["train"]["text"])
    assert list(first["train"]["text"]) != list(other["train"]["text"])
    counts = collections.Counter(first["train"]["label"])
    assert abs(counts[0] - counts[1]) < 40  # balanced
    words = [len(text.split()) for text in first["train"]["text"]]
    assert min(words) <= 6 and max(words) >= 30  # varying lengths


def test_three_classes():
    data = demo.demo_dataset(n=300, num_classes=3)
    assert data["train"].features["label"].names == ["negative", "neutral", "positive"]
    assert set(data["train"]["label"]) == {0, 1, 2}
    with pytest.raises(ValueError, match="num_classes must be 2 or 3"):
        demo.demo_dataset(num_classes=4)


def test_tokenizer_covers_the_demo_words_and_is_cached(cache):
    tokenizer = demo.demo_tokenizer(cache)
    folder = cache / f"demo-tokenizer-v{demo.RECIPE_VERSION}-1000"
    stamp = os.stat(folder / "tokenizer.json").st_mtime_ns
    texts = list(demo.demo_dataset(n=300, seed=7)["train"]["text"])
    encoded = tokenizer(texts)
    assert all(tokenizer.unk_token_id not in ids for ids in encoded["input_ids"])
    assert encoded["input_ids"][0][0] == tokenizer.cls_token_id
    assert encoded["input_ids"][0][-1] == tokenizer.sep_token_id
    assert tokenizer.pad_token == "[PAD]" and tokenizer.model_max_length == 128
    pair = tokenizer("the movie", "was great")
    assert pair["token_type_ids"][-1] == 1
    demo.demo_tokenizer(cache)  # reused, not retrained
    assert os.stat(folder / "tokenizer.json").st_mtime_ns == stamp


@pytest.mark.slow  # trains 2 tokenizers
def test_two_fresh_caches_get_the_same_tokenizer(tmp_path):
    """Token ids are the same on every machine, so demo models and their results are too."""
    first = demo.demo_tokenizer(tmp_path / "one")
    second = demo.demo_tokenizer(tmp_path / "two")
    assert first.get_vocab() == second.get_vocab()
    # Each demo word is one token: the vocabulary holds them whole.
    assert len(first("the movie was great")["input_ids"]) == 6


def test_the_causal_lm_demo_has_its_labels_as_whole_words(cache):
    """The tiny Llama's tokenizer (what `demo_lm_model_dir` saves) holds every label and
    template word as one token, so its response is one word it can learn (and `generate`
    shows); the classifier's tokenizer, in its own folder, stays as it was."""
    from hfxla_nb.demo.lm import TEMPLATE, VOCABULARY_WORDS

    tokenizer = demo.demo_tokenizer(cache, extra_words=VOCABULARY_WORDS)
    text = TEMPLATE.format(prompt="the coffee was great.", response="positive")
    assert tokenizer.tokenize(text) == ["review", ":", "the", "coffee", "was", "great", ".",
                                        "verdict", ":", "positive"]
    assert all(len(tokenizer.tokenize(word)) == 1 for word in VOCABULARY_WORDS)
    plain = demo.demo_tokenizer(cache)
    assert "verdict" not in plain.get_vocab() and len(plain) < len(tokenizer)
    assert plain.tokenize("neutral") != ["neutral"]  # spelled: not a word of the reviews


def test_config_is_tiny():
    config = demo.demo_config(3, vocab_size=500)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (2, 64, 2)
    assert (config.intermediate_size, config.max_position_embeddings) == (128, 128)
    assert config.num_labels == 3 and config.id2label[1] == "neutral"


def test_model_dir_loads_through_from_pretrained(cache, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = demo.demo_model_dir(cache=cache)
    assert {"config.json", "model.safetensors"} <= set(os.listdir(folder))
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.id2label == {0: "negative", 1: "positive"}
    # A second folder with the same seed holds the same weights; another seed does not.
    same = AutoModelForSequenceClassification.from_pretrained(
        demo.demo_model_dir(tmp_path / "same", cache=cache)
    )
    other = AutoModelForSequenceClassification.from_pretrained(
        demo.demo_model_dir(tmp_path / "other", seed=1, cache=cache)
    )
    weight = "classifier.weight"
    assert torch.equal(model.state_dict()[weight], same.state_dict()[weight])
    assert not torch.equal(model.state_dict()[weight], other.state_dict()[weight])
    logits = model(**tokenizer(["what a great movie"], return_tensors="pt")).logits
    assert logits.shape == (1, 2)
    assert demo.demo_model_dir(folder) == folder  # an existing model folder is reused
    assert not _xla.runtime_is_initialized()


def test_model_dir_refuses_a_folder_with_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="does not hold a model"):
        demo.demo_model_dir(tmp_path)
    assert os.listdir(tmp_path) == ["notes.txt"]


@pytest.mark.launch
def test_make_demo_shows_what_the_run_uses_and_no_setup_noise(tmp_path):
    """`python -m hfxla_nb.demo` (what `make demo` runs), from an empty cache so the demo's
    own setup writes the model: the runtime panel names the devices the run then uses, and
    transformers' "Writing model shards" bar of that setup stays out of the output."""
    import re
    import subprocess
    import sys

    from tests.helpers import ROOT, subprocess_env

    env = subprocess_env(HFXLA_NB_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-m", "hfxla_nb.demo", "--rows", "200", "--epochs", "1",
         "--devices", "2", "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(ROOT))
    output = done.stdout + done.stderr
    assert "Writing model shards" not in output and "%|" not in output, output
    assert "CPU: 2 virtual XLA devices" in output, output
    assert re.search(r"setup\s+spmd over 2 devices", output), output
    assert "1 virtual XLA device" not in output


@pytest.mark.launch
@pytest.mark.parametrize("task, command", [
    ("classification", "-m hfxla_nb.demo"),
    ("causal-lm", "-m hfxla_nb.demo.lm"),
    ("token-classification", "-m hfxla_nb.demo.tasks --task token-classification"),
    ("question-answering", "-m hfxla_nb.demo.tasks --task question-answering"),
    ("multiple-choice", "-m hfxla_nb.demo.tasks --task multiple-choice"),
    ("seq2seq", "-m hfxla_nb.demo.seq2seq"),
    ("image-classification", "-m hfxla_nb.demo.tasks --task image-classification"),
    ("audio-classification", "-m hfxla_nb.demo.tasks --task audio-classification"),
    ("speech-recognition", "-m hfxla_nb.demo.tasks --task speech-recognition"),
])
def test_make_demo_runs_each_tasks_default(task, command):
    """`make demo TASK=<task>` runs that task's demo module (the same embedded data and tiny
    models the task's own tests fine-tune), and the module's command line answers."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    planned = subprocess.run(["make", "-n", "--no-print-directory", "demo", f"TASK={task}",
                              "STAMP=/dev/null"], capture_output=True, text=True, cwd=str(ROOT),
                             timeout=60)
    (line,) = [line for line in planned.stdout.splitlines() if " -m hfxla_nb." in line]
    assert line.endswith(command), line
    module_args = command.split()[1:]
    helped = subprocess.run([sys.executable, "-m", *module_args[:1], "--help"],
                            capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert helped.returncode == 0 and "usage:" in helped.stdout, helped.stderr
