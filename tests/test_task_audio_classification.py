"""fine_tune(task="audio-classification") and predict on real XLA:CPU over 4 virtual devices: a
tiny wav2vec2 learns made-up clips (low tones, high tones, noise bursts), each clip cut or
padded to one of two durations (0.5 s, 1 s), one training and one evaluation graph per
duration; predict on the saved model equals `pipeline("audio-classification")` on the CPU;
bad input is refused before anything is forked or written."""

from __future__ import annotations

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.audio import (
    AUDIO_LABELS,
    RATE,
    demo_audio_clip,
    demo_audio_dataset,
    demo_audio_model_dir,
    demo_audio_rows,
)
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from tests.helpers import refuse_launches

ROWS = 360  # 288 train, 72 validation


def exact_clips() -> list[np.ndarray]:
    """Clips of each bucket's exact length (0.5 s and 1 s), every class: no padding, so
    the pipeline (which pads nothing) sees what the worker sees."""
    rng = np.random.default_rng(7)
    clips = []
    for samples in (RATE // 2, RATE):
        for kind in range(len(AUDIO_LABELS)):
            clip = demo_audio_clip(kind, rng)
            clips.append(np.resize(clip, samples))
    return clips


@pytest.fixture(scope="module")
def audio(cache, tmp_path_factory):
    """One fine-tune and one predict launch for every test of this file."""
    data = demo_audio_dataset(ROWS)
    # task="auto": wav2vec2's ...ForSequenceClassification head is claimed by the audio task.
    result = hx.fine_tune(demo_audio_model_dir(cache=cache), data, batch_size=16, epochs=2,
                          learning_rate=1e-2, num_processes=4,
                          output_dir=tmp_path_factory.mktemp("audio") / "out", progress=False)
    clips = exact_clips()
    inputs = [{"array": clip, "sampling_rate": RATE} for clip in clips]
    predicted = result.predict(inputs, progress=False)
    return result, clips, predicted


@pytest.mark.launch
def test_it_learns_made_up_clips(audio):
    result, _, _ = audio
    assert result.task == "audio-classification"
    assert result.metrics["eval_accuracy"] >= 0.9  # chance: 1/3
    assert result.metrics["eval_rows"] == ROWS // 5
    assert result.loss_history[-1][1] < 0.5 * result.loss_history[0][1]


@pytest.mark.launch
def test_one_training_and_one_evaluation_graph_per_duration(audio):
    result, _, predicted = audio
    assert result.bucket_lengths == [RATE // 2, RATE]
    assert result.compiles == len(result.bucket_lengths)
    assert result.eval_compiles == len(result.bucket_lengths)
    assert predicted.bucket_lengths == result.bucket_lengths
    assert predicted.compiles == len(result.bucket_lengths)


@pytest.mark.launch
def test_predict_equals_the_pipeline_on_the_cpu(audio):
    from transformers import AutoFeatureExtractor, pipeline

    result, clips, predicted = audio
    classify = pipeline("audio-classification", model=result.load_model(),
                        feature_extractor=AutoFeatureExtractor.from_pretrained(
                            result.output_dir), device="cpu")
    for clip, item in zip(clips, predicted, strict=True):
        expected = classify(clip)
        assert [top["label"] for top in item["top"]] == [top["label"] for top in expected]
        assert item["label"] == expected[0]["label"]
        assert [top["score"] for top in item["top"]] == pytest.approx(
            [top["score"] for top in expected], abs=1e-4)
    frame = predicted.to_dataframe()
    assert list(frame.columns) == ["label", "score"] and len(frame) == len(clips)


def test_clips_are_resampled_mixed_down_and_bucketed(cache):
    rows = demo_audio_rows(48)
    # Every clip in stereo ([channels, samples]), the first at 8 kHz (half the samples).
    for row in rows:
        mono = row["audio"]["array"]
        row["audio"]["array"] = np.stack([mono, mono])
    rows[0]["audio"] = {"array": rows[0]["audio"]["array"][:, ::2], "sampling_rate": RATE // 2}
    plan = prepare_fine_tune(demo_audio_model_dir(cache=cache), rows,
                             task="audio-classification", batch_size=4, output_dir=None)
    assert plan.data.input_names == ["input_values"]
    assert "48 train clips mixed down to one channel (from 2 at most)" in plan.data.notes
    train = plan.data.train
    for bucket in train.buckets:
        values = bucket.fields["input_values"]
        assert values.dtype == np.float32 and values.shape == (len(bucket), bucket.length)
        assert bucket.inputs.shape == (len(bucket), 0)  # no attention mask for this model
        assert bucket.labels.tolist() == [rows[r]["label"] for r in bucket.rows]
    lengths = {int(r): b.length for b in train.buckets for r in b.rows}
    original = len(demo_audio_rows(1)[0]["audio"]["array"])
    assert lengths[0] == (RATE // 2 if original <= RATE // 2 else RATE)


def _bad(kind: str):
    rows = demo_audio_rows(16)
    if kind == "no labels":
        return [{"audio": row["audio"]} for row in rows]
    if kind == "no rate":
        return [{"audio": row["audio"]["array"], "label": row["label"]} for row in rows]
    if kind == "many channels":
        for row in rows:  # 12 channels: too many to tell from samples
            row["audio"]["array"] = np.zeros((12, 4000), np.float32)
        return rows
    return rows


BAD = {
    "no labels": ("no column 'label'",),
    "no rate": ("row 0 of column 'audio' (train) has no sampling rate",
                "'sampling_rate'"),
    "many channels": ("row 0 of column 'audio' (train) has shape (12, 4000)",
                      "Pass 1-D arrays"),
    "no feature extractor": ("could not load a feature extractor from",
                             "feature_extractor.save_pretrained(folder)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_anything_happens(case, cache, tmp_path, monkeypatch):
    refuse_launches(monkeypatch)
    model = demo_audio_model_dir(cache=cache)
    if case == "no feature extractor":
        import shutil

        model = shutil.copytree(model, tmp_path / "model",
                                ignore=shutil.ignore_patterns("preprocessor_config.json"))
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(model, _bad(case), task="audio-classification", batch_size=4,
                     output_dir=tmp_path / "out", progress=False)
    for message in BAD[case]:
        assert message in str(raised.value)
    assert not (tmp_path / "out").exists()
    assert not _xla.runtime_is_initialized()
