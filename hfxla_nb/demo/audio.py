"""The embedded default for audio classification, offline: made-up clips and a tiny wav2vec2.

```python
from hfxla_nb.demo.audio import demo_audio_dataset, demo_audio_model_dir
result = hx.fine_tune(demo_audio_model_dir(), demo_audio_dataset(),
                      task="audio-classification")
```

The clips are synthesized at 16 kHz, 0.3 to 1.0 s long, of three classes a tiny model tells
apart: a low tone (150-400 Hz), a high tone (2-4 kHz), and bursts of white noise; each with a
random phase, amplitude and length and a little background noise. The audio column holds
decoded dicts (`{"array", "sampling_rate"}`), as `datasets.Audio` gives them, without its
decoder (torchcodec). The model is a 2-layer wav2vec2 classifier (hidden size 32, a
convolutional front end of stride 80: 200 frames a second) built from a config and saved with
its `Wav2Vec2FeatureExtractor`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import RECIPE_VERSION, build_atomically, cache_dir, save_seeded_model

if TYPE_CHECKING:
    import datasets

RATE = 16_000
AUDIO_LABELS = ("low tone", "high tone", "noise")


def demo_audio_clip(kind: int, rng: np.random.Generator) -> np.ndarray:
    """One float32 clip of class `kind` (an index of `AUDIO_LABELS`), 0.3 to 1.0 s."""
    samples = int(rng.uniform(0.3, 1.0) * RATE)
    times = np.arange(samples) / RATE
    amplitude = rng.uniform(0.1, 0.9)
    if kind == 2:
        bursts = np.repeat(rng.random(samples // 800 + 1) < 0.6, 800)[:samples]
        clip = rng.standard_normal(samples) * bursts * amplitude / 2
    else:
        low, high = (150.0, 400.0) if kind == 0 else (2000.0, 4000.0)
        frequency = rng.uniform(low, high)
        clip = amplitude * np.sin(2 * np.pi * frequency * times + rng.uniform(0, 2 * np.pi))
    clip = clip + rng.standard_normal(samples) * 0.01
    return clip.astype(np.float32)


def demo_audio_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` rows of `{"audio": {"array", "sampling_rate"}, "label": class id}`, the classes
    in turn."""
    rng = np.random.default_rng(seed)
    return [{"audio": {"array": demo_audio_clip(i % 3, rng), "sampling_rate": RATE},
             "label": i % 3} for i in range(n)]


def demo_audio_dataset(n: int = 480, seed: int = 0) -> datasets.DatasetDict:
    """`n` made-up clips as a `DatasetDict`: train (80%) and validation, an audio column of
    decoded dicts and a `ClassLabel` "label" (`AUDIO_LABELS`)."""
    import datasets

    features = datasets.Features({
        "audio": {"array": datasets.Sequence(datasets.Value("float32")),
                  "sampling_rate": datasets.Value("int64")},
        "label": datasets.ClassLabel(names=list(AUDIO_LABELS)),
    })
    rows = demo_audio_rows(n, seed)
    cut = int(n * 0.8)
    return datasets.DatasetDict({
        "train": datasets.Dataset.from_list(rows[:cut], features=features),
        "validation": datasets.Dataset.from_list(rows[cut:], features=features),
    })


def demo_audio_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """A tiny wav2vec2 audio classifier for `AUDIO_LABELS` and its feature extractor, saved
    in a versioned folder under `cache_dir(cache)` (reused when there)."""
    target = cache_dir(cache) / f"demo-wav2vec2-v{RECIPE_VERSION}-seed{seed}"
    if (target / "config.json").is_file():
        return str(target)

    def build(tmp: Path) -> None:
        from transformers import (
            Wav2Vec2Config,
            Wav2Vec2FeatureExtractor,
            Wav2Vec2ForSequenceClassification,
        )

        config = Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            conv_dim=(32, 32, 32), conv_kernel=(10, 8, 4), conv_stride=(5, 4, 4),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            classifier_proj_size=32, layerdrop=0.0, apply_spec_augment=False,
            num_labels=len(AUDIO_LABELS), id2label=dict(enumerate(AUDIO_LABELS)),
            label2id={name: i for i, name in enumerate(AUDIO_LABELS)})
        config.architectures = ["Wav2Vec2ForSequenceClassification"]
        extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=RATE,
                                             padding_value=0.0, do_normalize=True,
                                             return_attention_mask=False)
        save_seeded_model(Wav2Vec2ForSequenceClassification, config, seed, extractor, tmp)

    return str(build_atomically(target, build))
