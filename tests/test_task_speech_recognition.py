"""fine_tune(task="speech-recognition") and predict on real XLA:CPU over 4 virtual devices: a
tiny wav2vec2 CTC model learns made-up clips (each letter a tone of its own, "a c b"), each
clip cut or padded to one of two durations (0.5 s, 1 s), one training and one evaluation
graph per duration; the CTC loss traced into the graph equals torch's; predict on the saved
model equals `pipeline("automatic-speech-recognition")` on the CPU; bad input is refused
before anything is forked or written."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.speech import (
    RATE,
    demo_speech_clip,
    demo_speech_dataset,
    demo_speech_model_dir,
    demo_speech_rows,
)
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from hfxla_nb.train.tasks.speech_recognition import error_rates
from tests.helpers import refuse_launches, run_python

ROWS = 400  # 320 train, 80 validation
STEPS = 300


def exact_clips() -> list[np.ndarray]:
    """Clips of each bucket's exact length (0.5 s and 1 s): no padding, so the pipeline
    (which pads nothing) sees what the worker sees."""
    rng = np.random.default_rng(7)
    clips = []
    for samples, letters in ((RATE // 2, [0, 2]), (RATE // 2, [3, 1]), (RATE, [1, 0, 3]),
                             (RATE, [2, 2, 0])):
        clip = demo_speech_clip(letters, rng)
        clips.append(np.pad(clip, (0, max(0, samples - len(clip))))[:samples])
    return clips


@pytest.fixture(scope="module")
def speech(cache, tmp_path_factory):
    """One fine-tune and one predict launch for every test of this file."""
    data = demo_speech_dataset(ROWS)
    result = hx.fine_tune(demo_speech_model_dir(cache=cache), data,
                          task="speech-recognition", batch_size=16, max_steps=STEPS,
                          learning_rate=3e-3, num_processes=4,
                          output_dir=tmp_path_factory.mktemp("speech") / "out", progress=False)
    clips = exact_clips()
    predicted = result.predict([{"array": clip, "sampling_rate": RATE} for clip in clips],
                               progress=False)
    return result, clips, predicted


@pytest.mark.launch
def test_it_learns_made_up_speech(speech):
    result, _, _ = speech
    assert result.task == "speech-recognition"  # task="auto" would pick it too (...ForCTC)
    # An untrained model says nothing (WER 1.0); after training most letters are right.
    assert result.metrics["eval_wer"] < 0.5
    assert result.metrics["eval_rows"] == ROWS // 5
    assert result.loss_history[-1][1] < 0.5 * result.loss_history[0][1]


@pytest.mark.launch
def test_one_training_and_one_evaluation_graph_per_duration(speech):
    result, _, predicted = speech
    assert result.bucket_lengths == [RATE // 2, RATE]
    assert result.compiles == len(result.bucket_lengths)
    assert result.eval_compiles == len(result.bucket_lengths)
    assert predicted.bucket_lengths == result.bucket_lengths
    assert predicted.compiles == len(result.bucket_lengths)


@pytest.mark.launch
def test_predict_equals_the_pipeline_on_the_cpu(speech):
    from transformers import pipeline

    result, clips, predicted = speech
    recognize = pipeline("automatic-speech-recognition", model=result.output_dir,
                         device="cpu")
    expected = [recognize(clip)["text"] for clip in clips]
    assert [item["text"] for item in predicted] == expected
    assert any(text.strip() for text in expected)  # the model says something
    frame = predicted.to_dataframe()
    assert list(frame.columns) == ["text"] and len(frame) == len(clips)


@pytest.mark.launch
def test_the_traced_ctc_loss_equals_torchs_with_its_gradient():
    # In a fresh interpreter: a backward pass starts the autograd engine's device threads,
    # sized for the devices this process sees, and processes forked later (the launches of
    # the next test modules) inherit that and fail their first backward on an XLA device.
    found = run_python("""
        import json
        import torch
        from hfxla_nb.train.tasks.speech_recognition import ctc_losses

        torch.manual_seed(0)
        logits = torch.randn(5, 12, 7, dtype=torch.float64, requires_grad=True)
        log_probs = logits.log_softmax(-1)
        # Repeats, a row without labels, a row its frames cannot hold (infinite, zeroed).
        labels = torch.tensor([[1, 2, 2, 3], [4, 4, -100, -100], [-100] * 4, [1, 2, 3, 4],
                               [5, 5, 5, 5]])
        lengths = torch.tensor([12, 10, 3, 5, 6])
        counts = (labels >= 0).sum(-1)
        expected = torch.nn.functional.ctc_loss(
            log_probs.transpose(0, 1), labels.clamp(min=0), lengths, counts, blank=0,
            reduction="none", zero_infinity=True)
        ours = ctc_losses(log_probs, labels, 0, lengths, zero_infinity=True)
        (theirs,) = torch.autograd.grad(expected.sum(), logits, retain_graph=True)
        (mine,) = torch.autograd.grad(ours.sum(), logits)
        everything = ctc_losses(log_probs[:4], labels[:4], 0)  # no lengths: every frame
        print(json.dumps({"ours": ours.detach().tolist(), "expected": expected.detach().tolist(),
                          "gradient_gap": float((mine - theirs).abs().max()),
                          "every_frame": float(everything[0].detach())}))
        """)
    assert found["ours"] == pytest.approx(found["expected"], rel=1e-5)
    assert found["ours"][4] == 0.0
    assert found["gradient_gap"] <= 1e-5
    assert found["every_frame"] == pytest.approx(found["expected"][0], rel=1e-5)


def test_word_error_rate_counts_as_evaluate_does():
    # 1 substitution + 1 deletion over 5 reference words; the second row is right.
    rates = error_rates(("wer", "cer"), ["a b c", "a b"], ["a d", "a b"])
    assert rates["eval_wer"] == pytest.approx(2 / 5)
    assert rates["eval_cer"] == pytest.approx(3 / 8)


def test_clips_and_transcripts_are_bucketed_with_padded_labels(cache):
    rows = demo_speech_rows(48)
    # task="auto": the ...ForCTC head means speech recognition.
    plan = prepare_fine_tune(demo_speech_model_dir(cache=cache), rows, batch_size=4,
                             output_dir=None)
    assert plan.task == "speech-recognition"
    assert plan.data.input_names == ["input_values"]
    assert plan.data.label_length == 8
    tokenizer = plan.tokenizer.tokenizer
    for bucket in plan.data.train.buckets:
        values = bucket.fields["input_values"]
        assert values.dtype == np.float32 and values.shape == (len(bucket), bucket.length)
        assert bucket.labels.shape == (len(bucket), 8)
        for row, labels in zip(bucket.rows, bucket.labels, strict=True):
            ids = [int(i) for i in labels if i >= 0]
            assert ids == tokenizer(rows[row]["text"])["input_ids"]
            assert (labels[len(ids):] == -100).all()


def _bad(kind: str) -> list[dict]:
    rows = demo_speech_rows(16)
    if kind == "no transcripts":
        return [{"audio": row["audio"]} for row in rows]
    if kind == "empty transcript":
        rows[4]["text"] = " "
    if kind == "characters not in the vocabulary":
        rows[3]["text"] = "a B c!"
    if kind == "transcript longer than max_target_length":
        rows[2]["text"] = "a b c d a b"
    if kind == "transcript longer than the clip's frames":
        rows[5]["text"] = " ".join("abcd" * 4)
    return rows


BAD = {
    "no transcripts": ("needs a transcript column ('text', 'sentence', 'transcription')",
                       "Pass text_column="),
    "empty transcript": ("row 4 of column 'text' (train) is an empty transcript",
                         "Drop such rows first"),
    "characters not in the vocabulary": ("characters the tokenizer's vocabulary lacks: 'B' "
                                         "(1 time, first in row 3), '!' (1 time, first in "
                                         "row 3)", "Normalize the transcripts"),
    "transcript longer than max_target_length": ("the train data has 1 transcript longer "
                                                 "than max_target_length=8 labels (row 2: 11",),
    "transcript longer than the clip's frames": ("the train data has 1 transcript needing "
                                                 "more frames than its clip gives (row 5: 31 "
                                                 "labels",
                                                 "CTC cannot emit them"),
    "no processor": ("could not load a processor (a tokenizer and a feature extractor)",
                     "Wav2Vec2Processor(feature_extractor=..., tokenizer=...).save_pretrained"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_anything_happens(case, cache, tmp_path, monkeypatch):
    refuse_launches(monkeypatch)
    model = demo_speech_model_dir(cache=cache)
    if case == "no processor":  # the model without its tokenizer
        model = shutil.copytree(model, tmp_path / "model", ignore=shutil.ignore_patterns(
            "vocab.json", "tokenizer_config.json", "special_tokens_map.json",
            "added_tokens.json", "processor_config.json"))
    options = {"max_target_length": 8} if "max_target_length" in case else {}
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(model, _bad(case), task="speech-recognition", batch_size=4,
                     output_dir=tmp_path / "out", progress=False, **options)
    for message in BAD[case]:
        assert message in str(raised.value)
    assert not (tmp_path / "out").exists()
    assert not _xla.runtime_is_initialized()
