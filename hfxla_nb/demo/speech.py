"""The embedded default for speech recognition, offline: made-up spoken "words" and a tiny
wav2vec2 CTC model, or a tiny Whisper (`demo_whisper_model_dir`).

```python
from hfxla_nb.demo.speech import demo_speech_dataset, demo_speech_model_dir
result = hx.fine_tune(demo_speech_model_dir(), demo_speech_dataset(),
                      task="speech-recognition")
```

Each "word" is one letter of `SPEECH_LETTERS` said as a tone of its own frequency (0.12 to
0.18 s, a random phase and loudness), a clip is 2 or 3 words apart by silences of 0.06 to
0.1 s (0.4 to 0.9 s at 16 kHz, with a little background noise), and its transcript the
letters, spaced: "a c b". The audio column holds decoded dicts (`{"array",
"sampling_rate"}`), as `datasets.Audio` gives them. The model is a 2-layer wav2vec2 CTC model
(hidden size 32; layer norms as wav2vec2-large's, with which it learns these clips in about
half the steps the base model's group norm takes; a convolutional front end of stride 640:
25 frames a second, half wav2vec2's rate, so that the CTC recursion has few frames to
unroll) built from a config and saved with its `Wav2Vec2Processor`: a `Wav2Vec2CTCTokenizer`
of the letters (and the word delimiter "|") and a `Wav2Vec2FeatureExtractor`.

The tiny Whisper (2 encoder and 2 decoder layers, width 32) takes 1 s windows of 80 log-mel
bins (`max_source_positions` 50) and is saved with a `WhisperProcessor` built here: a
byte-level BPE `WhisperTokenizer` with Whisper's special tokens, set to English
transcription, and a `WhisperFeatureExtractor` of `chunk_length=1`; it learns the same clips
in about 200 steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import RECIPE_VERSION, build_atomically, cache_dir, save_seeded_model

if TYPE_CHECKING:
    import datasets

RATE = 16_000
#: The letters the clips say, and the tone each is said as (Hz): far apart, so that the
#: tiny model's first convolution tells them apart.
SPEECH_LETTERS = ("a", "b", "c", "d")
TONES = (300.0, 700.0, 1500.0, 3200.0)
#: How long a letter is said, and the silence after it (s): a few frames each.
LETTER_SECONDS = (0.12, 0.18)
GAP_SECONDS = (0.06, 0.10)
#: The CTC vocabulary's special tokens: the padding token is CTC's blank.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
WORD_DELIMITER = "|"


def demo_speech_clip(letters: list[int], rng: np.random.Generator) -> np.ndarray:
    """One float32 clip saying `letters` (indices of `SPEECH_LETTERS`): a tone per letter,
    short silences before, between and after them."""
    parts = [np.zeros(int(rng.uniform(0.02, 0.06) * RATE))]
    for letter in letters:
        samples = int(rng.uniform(*LETTER_SECONDS) * RATE)
        times = np.arange(samples) / RATE
        tone = rng.uniform(0.3, 0.9) * np.sin(
            2 * np.pi * TONES[letter] * times + rng.uniform(0, 2 * np.pi))
        parts += [tone, np.zeros(int(rng.uniform(*GAP_SECONDS) * RATE))]
    clip = np.concatenate(parts)
    return (clip + rng.standard_normal(len(clip)) * 0.01).astype(np.float32)


def demo_speech_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` rows of `{"audio": {"array", "sampling_rate"}, "text": "a c b"}`: 2 or 3 random
    letters each."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        letters = [int(i) for i in rng.integers(0, len(SPEECH_LETTERS), rng.integers(2, 4))]
        rows.append({"audio": {"array": demo_speech_clip(letters, rng), "sampling_rate": RATE},
                     "text": " ".join(SPEECH_LETTERS[i] for i in letters)})
    return rows


def demo_speech_dataset(n: int = 400, seed: int = 0) -> datasets.DatasetDict:
    """`n` made-up clips as a `DatasetDict`: train (80%) and validation, an audio column of
    decoded dicts and a "text" column of transcripts."""
    import datasets

    features = datasets.Features({
        "audio": {"array": datasets.Sequence(datasets.Value("float32")),
                  "sampling_rate": datasets.Value("int64")},
        "text": datasets.Value("string"),
    })
    rows = demo_speech_rows(n, seed)
    cut = int(n * 0.8)
    return datasets.DatasetDict({
        "train": datasets.Dataset.from_list(rows[:cut], features=features),
        "validation": datasets.Dataset.from_list(rows[cut:], features=features),
    })


def demo_speech_processor(folder: str | os.PathLike):
    """A `Wav2Vec2Processor` for the letters: a CTC tokenizer whose vocabulary (written to
    `folder/vocab.json`) is the special tokens, the word delimiter and the letters, and a
    feature extractor at 16 kHz that normalizes each clip."""
    from transformers import Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2Processor

    vocab = {token: i for i, token in
             enumerate((*SPECIAL_TOKENS, WORD_DELIMITER, *SPEECH_LETTERS))}
    path = Path(folder) / "vocab.json"
    path.write_text(json.dumps(vocab))
    tokenizer = Wav2Vec2CTCTokenizer(str(path), unk_token="<unk>", pad_token="<pad>",
                                     word_delimiter_token=WORD_DELIMITER)
    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=RATE, padding_value=0.0,
                                         do_normalize=True, return_attention_mask=False)
    return Wav2Vec2Processor(feature_extractor=extractor, tokenizer=tokenizer)


def demo_speech_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """A tiny wav2vec2 CTC model for the letters and its processor, saved in a versioned
    folder under `cache_dir(cache)` (reused when there)."""
    target = cache_dir(cache) / f"demo-wav2vec2-ctc-v{RECIPE_VERSION}-seed{seed}"
    if (target / "config.json").is_file():
        return str(target)

    def build(tmp: Path) -> None:
        from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

        processor = demo_speech_processor(tmp)
        tokenizer = processor.tokenizer
        config = Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            conv_dim=(32,) * 5, conv_kernel=(10, 8, 4, 4, 2), conv_stride=(5, 4, 4, 4, 2),
            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, layerdrop=0.0,
            hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0,
            final_dropout=0.0, feat_extract_norm="layer", do_stable_layer_norm=True,
            apply_spec_augment=False, vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id, ctc_loss_reduction="mean",
            ctc_zero_infinity=True)
        config.architectures = ["Wav2Vec2ForCTC"]
        save_seeded_model(Wav2Vec2ForCTC, config, seed, processor, tmp)

    return str(build_atomically(target, build))


# -- Whisper -----------------------------------------------------------------------------------

#: The tiny Whisper's window (s): its feature extractor pads or cuts every clip to this, and
#: its encoder embeds that many frames (`max_source_positions`). Real Whisper: 30 s.
WHISPER_CHUNK_SECONDS = 1
#: The mel bins of the tiny Whisper's features (real Whisper: 80, or 128 for large-v3).
WHISPER_MEL_BINS = 80
#: The decoder positions of the tiny Whisper: its prompt, a transcript and the end token.
WHISPER_TARGET_POSITIONS = 32
#: Whisper's special tokens, in Whisper's order: the language token's id must follow
#: `<|startoftranscript|>`'s (WhisperTokenizer counts it from there), and `<|notimestamps|>`
#: comes last (timestamp tokens would start after it). English is the only language here.
WHISPER_SPECIAL_TOKENS = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>",
                          "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
                          "<|nocaptions|>", "<|notimestamps|>")


def byte_alphabet() -> list[str]:
    """The 256 characters byte-level BPE (GPT-2's, Whisper's) writes the bytes 0-255 as."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    shifted, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            shifted[byte] = chr(byte)
        else:
            shifted[byte] = chr(256 + extra)
            extra += 1
    return [shifted[byte] for byte in range(256)]


def demo_whisper_tokenizer():
    """A `WhisperTokenizer` built here: byte-level BPE over the 256 bytes (any text
    tokenizes), one merge per letter said after a space ("Ġa"), Whisper's special tokens,
    and the prefix English / transcribe / no timestamps."""
    from transformers import WhisperTokenizer

    alphabet = byte_alphabet()
    space = alphabet[ord(" ")]
    merges = [(space, letter) for letter in SPEECH_LETTERS]
    tokens = [*alphabet, *(a + b for a, b in merges)]
    vocab = {token: i for i, token in enumerate(tokens)}
    vocab.update({token: len(tokens) + i for i, token in enumerate(WHISPER_SPECIAL_TOKENS)})
    tokenizer = WhisperTokenizer(vocab=vocab, merges=merges, language="english",
                                 task="transcribe", predict_timestamps=False,
                                 pad_token="<|endoftext|>")
    tokenizer.add_special_tokens(
        {"additional_special_tokens": list(WHISPER_SPECIAL_TOKENS[1:])})
    tokenizer.model_max_length = WHISPER_TARGET_POSITIONS
    return tokenizer


def demo_whisper_processor():
    """A `WhisperProcessor`: the tokenizer above and a `WhisperFeatureExtractor` whose
    window is `WHISPER_CHUNK_SECONDS` (log-mel features of 10 ms frames)."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    extractor = WhisperFeatureExtractor(feature_size=WHISPER_MEL_BINS, sampling_rate=RATE,
                                        chunk_length=WHISPER_CHUNK_SECONDS)
    return WhisperProcessor(feature_extractor=extractor, tokenizer=demo_whisper_tokenizer())


def demo_whisper_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """A tiny `WhisperForConditionalGeneration` for the letters (2 encoder and 2 decoder
    layers, width 32) and its processor, saved in a versioned folder under `cache_dir(cache)`
    (reused when there). Its generation config prompts English transcription without
    timestamps and suppresses no token, so `generate` decodes greedily what
    `fine_tune`'s evaluation does."""
    target = cache_dir(cache) / f"demo-whisper-v{RECIPE_VERSION}-seed{seed}"
    if (target / "config.json").is_file():
        return str(target)

    def build(tmp: Path) -> None:
        from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

        processor = demo_whisper_processor()
        tokenizer = processor.tokenizer
        ids = {token: tokenizer.convert_tokens_to_ids(token) for token in WHISPER_SPECIAL_TOKENS}
        end, start = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
        frames = processor.feature_extractor.nb_max_frames
        config = WhisperConfig(
            vocab_size=len(tokenizer), num_mel_bins=WHISPER_MEL_BINS, d_model=32,
            encoder_layers=2, encoder_attention_heads=2, decoder_layers=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_source_positions=frames // 2, max_target_positions=WHISPER_TARGET_POSITIONS,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
            decoder_layerdrop=0.0, pad_token_id=end, bos_token_id=end, eos_token_id=end,
            decoder_start_token_id=start, suppress_tokens=None, begin_suppress_tokens=None)
        config.architectures = ["WhisperForConditionalGeneration"]
        save_seeded_model(WhisperForConditionalGeneration, config, seed, processor, tmp)
        GenerationConfig(
            decoder_start_token_id=start, pad_token_id=end, bos_token_id=end, eos_token_id=end,
            max_length=WHISPER_TARGET_POSITIONS, is_multilingual=True,
            lang_to_id={"<|en|>": ids["<|en|>"]},
            task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
            no_timestamps_token_id=ids["<|notimestamps|>"], language="<|en|>",
            task="transcribe", forced_decoder_ids=None, suppress_tokens=None,
            begin_suppress_tokens=None).save_pretrained(tmp)

    return str(build_atomically(target, build))
