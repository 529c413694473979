"""fine_tune(task="speech-recognition") with Whisper on real XLA:CPU over 4 virtual devices: a
tiny `WhisperForConditionalGeneration` (its processor built here: a byte-level BPE with
Whisper's special tokens, a feature extractor of 1 s windows) learns made-up clips (each
letter a tone of its own, "a c b"); one training graph, and evaluation's fixed-shape greedy
generation compiles two graphs however many tokens; predict on the saved model equals
`pipeline("automatic-speech-recognition")` on the CPU, greedy; bad input is refused before
anything is forked or written."""

from __future__ import annotations

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.speech import (
    RATE,
    demo_speech_clip,
    demo_speech_dataset,
    demo_speech_rows,
    demo_whisper_model_dir,
)
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from tests.helpers import refuse_launches

ROWS = 400  # 320 train, 80 validation
STEPS = 200


@pytest.fixture(scope="module")
def whisper_dir(cache):
    return demo_whisper_model_dir(cache=cache)


@pytest.fixture(scope="module")
def whisper(whisper_dir, tmp_path_factory):
    """One fine-tune and one predict launch for the tests that train."""
    result = hx.fine_tune(whisper_dir, demo_speech_dataset(ROWS), task="speech-recognition",
                          batch_size=16, max_steps=STEPS, learning_rate=3e-3, num_processes=4,
                          output_dir=tmp_path_factory.mktemp("whisper") / "out",
                          progress=False)
    rng = np.random.default_rng(7)
    clips = [demo_speech_clip(letters, rng) for letters in ([0, 2], [3, 1], [1, 0, 3],
                                                             [2, 2, 0], [3, 3])]
    predicted = result.predict([{"array": clip, "sampling_rate": RATE} for clip in clips],
                               progress=False)
    return result, clips, predicted


@pytest.mark.launch
def test_whisper_learns_made_up_speech(whisper):
    result, _, _ = whisper
    assert result.task == "speech-recognition"
    # An untrained model says nothing of the letters (WER 1.0 or more).
    assert result.metrics["eval_wer"] < 0.25
    assert result.metrics["eval_rows"] == ROWS // 5
    assert result.loss_history[-1][1] < 0.1 * result.loss_history[0][1]
    assert not result.warnings


@pytest.mark.launch
def test_whisper_compiles_one_training_graph_and_two_for_generation(whisper):
    result, _, predicted = whisper
    assert result.bucket_lengths == [RATE]  # the extractor's window: one shape for all
    assert result.compiles == 1
    # The loss forward pass with the encoder, and one decoding step for every token.
    assert result.eval_compiles == 2
    assert result.executions_per_step == 1
    assert predicted.compiles == 2


@pytest.mark.launch
def test_whisper_predict_equals_the_pipeline_on_the_cpu(whisper):
    from transformers import WhisperForConditionalGeneration, pipeline

    result, clips, predicted = whisper
    recognize = pipeline("automatic-speech-recognition", model=result.output_dir,
                         device="cpu")
    # Greedy: the pipeline's Whisper default is a beam search of 5.
    expected = [recognize(clip, generate_kwargs={"num_beams": 1})["text"] for clip in clips]
    assert [item["text"] for item in predicted] == expected
    assert expected[0].strip() == "a c"  # the model says the letters
    assert isinstance(result.load_model(), WhisperForConditionalGeneration)


@pytest.mark.launch
def test_whisper_fixed_shape_generation_equals_generate(whisper_dir):
    """The device loop's arithmetic with Whisper's prompt, on the CPU: `generate`'s tokens."""
    import torch
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    from hfxla_nb.train.tasks.seq2seq import greedy_generate

    processor = AutoProcessor.from_pretrained(whisper_dir)
    model = AutoModelForSpeechSeq2Seq.from_pretrained(whisper_dir).eval()
    torch.manual_seed(1)
    with torch.no_grad():  # untrained weights: give them a voice
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    clips = [row["audio"]["array"] for row in demo_speech_rows(4)]
    features = processor.feature_extractor(clips, sampling_rate=RATE,
                                           return_tensors="pt").input_features
    prompt = processor.tokenizer.prefix_tokens
    assert processor.tokenizer.convert_ids_to_tokens(prompt) == [
        "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    ours = greedy_generate(model, features, None, 12, prompt=prompt)
    with torch.no_grad():
        theirs = model.generate(features, do_sample=False, num_beams=1, max_new_tokens=9)
    assert ours[:, :3].tolist() == [prompt[1:]] * 4
    assert ours[:, 3:].tolist() == theirs[:, :9].tolist()


def test_whisper_rows_and_refusals_before_anything_happens(whisper_dir, tmp_path, monkeypatch):
    from transformers import AutoProcessor, WhisperFeatureExtractor, WhisperProcessor

    refuse_launches(monkeypatch)
    rows = demo_speech_rows(32)
    # task="auto": Whisper's ...ForConditionalGeneration is speech recognition, not seq2seq.
    plan = prepare_fine_tune(whisper_dir, rows, batch_size=4, output_dir=None)
    processor = AutoProcessor.from_pretrained(whisper_dir)
    assert plan.task == "speech-recognition"
    assert plan.auto_class == "AutoModelForSpeechSeq2Seq"
    assert plan.data.input_names == ["input_features"]
    assert plan.data.prompt == processor.tokenizer.prefix_tokens
    (bucket,) = plan.data.train.buckets
    assert bucket.fields["input_features"].shape == (len(bucket), 80, 100)
    width = plan.data.target_length
    for row, labels in zip(bucket.rows, bucket.labels, strict=True):
        ids = processor.tokenizer(rows[row]["text"]).input_ids[1:]  # no start token
        assert labels.tolist() == ids + [-100] * (width - len(ids))

    def refused(rows, **options) -> str:
        with pytest.raises(FineTuneError) as raised:
            hx.fine_tune(whisper_dir, rows, task="speech-recognition", batch_size=4,
                         output_dir=tmp_path / "out", progress=False, **options)
        return str(raised.value)

    long = demo_speech_rows(16)
    long[2]["text"] = "a b c d a b"
    assert ("the train data has 1 transcript longer than max_target_length=8 labels (row 2: "
            "10" in refused(long, max_target_length=8))
    assert ("Pass max_target_length=16, or drop or shorten those rows first. A Whisper label "
            "counts the prompt after its start token (3 tokens)" in refused(long,
                                                                         max_target_length=8))
    assert "the Whisper decoder embeds 32 (max_target_positions)" in refused(
        long, max_target_length=40)
    window = WhisperProcessor(feature_extractor=WhisperFeatureExtractor(chunk_length=2),
                              tokenizer=processor.tokenizer)
    assert "the feature extractor makes 200 frames a clip (chunk_length=2 s)" in refused(
        rows, tokenizer=window)
    assert not (tmp_path / "out").exists()
    assert not _xla.runtime_is_initialized()
