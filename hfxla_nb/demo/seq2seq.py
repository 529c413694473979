"""The embedded sequence-to-sequence default: a tiny T5, its tokenizer and data, all offline.

```python
from hfxla_nb.demo.seq2seq import demo_seq2seq_dataset, demo_seq2seq_model_dir
result = hx.fine_tune(demo_seq2seq_model_dir(), demo_seq2seq_dataset(), task="seq2seq",
                      source_lang="en", target_lang="rev", batch_size=32, max_steps=100,
                      learning_rate=5e-3, num_processes=4)
result.metrics["eval_bleu"]
```

The data are short phrases made from a word list, "translated" into a made-up language whose
words are the English words spelled backwards ("the red cat" -> "eht der tac"), in WMT's
layout (a `translation` column of `{"en": ..., "rev": ...}` dicts). `kind="summarization"`
gives XSum's layout instead (`document` / `summary`: the summary keeps a document's nouns).
The tokenizer has one token per word (both languages, T5's special tokens), so a 2-layer
BART built from a config learns the task in about 100 steps; `architecture="t5"` gives a tiny
T5 instead.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

from . import build_atomically, cache_dir, demo_output_dir, save_seeded_model

if TYPE_CHECKING:
    import datasets
    import transformers

RECIPE_VERSION = 1
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
#: Words a source prefix may use ("translate English to Reverse: ", "summarize: ").
PREFIX_WORDS = ("translate", "english", "to", "reverse", "summarize", ":")
_NOUNS = ("cat", "dog", "bird", "fish", "fox", "frog", "duck", "goat")
_ADJECTIVES = ("red", "blue", "small", "big", "old", "happy")
_VERBS = ("sees", "likes", "chases", "finds")
_ARTICLES = ("the", "a", "my")


def _english_words() -> list[str]:
    return sorted({*_NOUNS, *_ADJECTIVES, *_VERBS, *_ARTICLES})


def reverse_words(text: str) -> str:
    """The made-up language: every word spelled backwards."""
    return " ".join(word[::-1] for word in text.split())


def _phrase(rng: random.Random) -> tuple[str, list[str]]:
    """A short English phrase and its nouns."""
    words, nouns = [], []
    for _ in range(rng.choice((1, 2))):
        noun = rng.choice(_NOUNS)
        part = [rng.choice(_ARTICLES)] + ([rng.choice(_ADJECTIVES)] if rng.random() < 0.6
                                          else []) + [noun]
        if words:
            words.append(rng.choice(_VERBS))
        words += part
        nouns.append(noun)
    return " ".join(words), nouns


def demo_seq2seq_dataset(n: int = 1200, seed: int = 0,
                         kind: str = "translation") -> datasets.DatasetDict:
    """Sentence pairs made deterministically from word lists (a pure function of the arguments).

    Args:
        n: rows in all (90% "train", 10% "validation").
        kind: "translation" (a `translation` column of `{"en": ..., "rev": ...}` dicts, as
            WMT's datasets have) or "summarization" (`document` and `summary` columns, as
            XSum has: the summary lists the document's nouns).
    """
    import datasets

    if kind not in ("translation", "summarization"):
        raise ValueError(f"kind must be 'translation' or 'summarization', got {kind!r}.")
    rng = random.Random(f"hfxla_nb-seq2seq-{seed}")
    rows = []
    for _ in range(n):
        text, nouns = _phrase(rng)
        if kind == "translation":
            rows.append({"translation": {"en": text, "rev": reverse_words(text)}})
        else:
            rows.append({"document": text, "summary": " ".join(nouns)})
    cut = int(n * 0.9)
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:cut]),
                                 "validation": datasets.Dataset.from_list(rows[cut:])})


def demo_seq2seq_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer with one token per demo word in both languages, T5's special
    tokens (`<pad>` 0, `</s>` 1, `<unk>` 2) and `</s>` appended to every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    english = _english_words()
    words = [*english, *(w[::-1] for w in english if w[::-1] not in english), *PREFIX_WORDS]
    vocab = {token: i for i, token in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *words]))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", vocab["</s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        model_max_length=64, model_input_names=["input_ids", "attention_mask"])


def demo_t5_config(vocab_size: int):
    """A tiny T5: 2 encoder and 2 decoder layers, hidden 64, 4 heads, no dropout."""
    from transformers import T5Config

    return T5Config(vocab_size=vocab_size, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                    num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=32,
                    dropout_rate=0.0, feed_forward_proj="relu", pad_token_id=0,
                    eos_token_id=1, decoder_start_token_id=0)


def demo_bart_config(vocab_size: int):
    """A tiny BART with the demo tokenizer's ids (`</s>` starts the decoder, as BART's does)."""
    from transformers import BartConfig

    return BartConfig(vocab_size=vocab_size, d_model=64, encoder_layers=2, decoder_layers=2,
                      encoder_attention_heads=4, decoder_attention_heads=4,
                      encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
                      dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1,
                      decoder_start_token_id=1, forced_eos_token_id=None)


def demo_seq2seq_model_dir(architecture: str = "bart", seed: int = 0,
                           cache: str | os.PathLike | None = None) -> str:
    """A freshly initialized tiny encoder-decoder model and the demo tokenizer, in a cached
    folder (`AutoModelForSeq2SeqLM.from_pretrained(folder)` loads it offline).

    Args:
        architecture: "bart" (the default: its learned absolute positions let it learn the
            demo's word order in about 100 steps) or "t5" (relative positions: it learns the
            words as fast, their order more slowly).
        seed: the initial weights are a pure function of it.
        cache: cache folder (see `hfxla_nb.demo.cache_dir`).
    """
    if architecture not in ("bart", "t5"):
        raise ValueError(f"architecture must be 'bart' or 't5', got {architecture!r}.")
    target = cache_dir(cache) / f"demo-{architecture}-v{RECIPE_VERSION}-seed{seed}"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return str(target)

    def build(tmp: Path) -> None:
        from transformers import BartForConditionalGeneration, T5ForConditionalGeneration

        tokenizer = demo_seq2seq_tokenizer()
        if architecture == "t5":
            model_class, config = T5ForConditionalGeneration, demo_t5_config(len(tokenizer))
        else:
            model_class, config = BartForConditionalGeneration, demo_bart_config(len(tokenizer))
        save_seeded_model(model_class, config, seed, tokenizer, tmp)

    build_atomically(target, build)
    return str(target)


def run_demo_seq2seq(rows: int = 1200, max_steps: int = 100, batch_size: int = 32,
                     learning_rate: float = 5e-3, devices: int = 4, architecture: str = "bart",
                     eval_rows: int | None = None,
                     output_dir: str | os.PathLike | None = "auto",
                     progress: bool | str = "console", cache: str | os.PathLike | None = None,
                     **fine_tune_kwargs):
    """Fine-tune the tiny BART (or T5) on the demo translations with `task="seq2seq"`.

    Args:
        eval_rows: evaluate on the first this many validation rows (default: all 10%).
        devices: virtual XLA devices when there is no TPU (on a TPU, all its devices).
        output_dir: as in `fine_tune`; "auto" (default): a new folder for each run,
            `demo_output/tiny-bart-<start time>`.
        fine_tune_kwargs: more `fine_tune` arguments.
    """
    from hfxla_nb.runtime import detect_accelerator
    from hfxla_nb.train import fine_tune

    data = demo_seq2seq_dataset(n=rows)
    evaluation = data["validation"]
    if eval_rows is not None:
        evaluation = evaluation.select(range(min(eval_rows, len(evaluation))))
    on_tpu = detect_accelerator().kind == "tpu"
    return fine_tune(
        demo_seq2seq_model_dir(architecture, cache=cache), data["train"],
        eval_dataset=evaluation, task="seq2seq", source_lang="en", target_lang="rev",
        max_steps=max_steps, batch_size=batch_size, learning_rate=learning_rate,
        num_processes=None if on_tpu else devices,
        output_dir=demo_output_dir(output_dir, "tiny-bart"), progress=progress,
        **fine_tune_kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    """`make demo TASK=seq2seq`: fine-tune the tiny BART on the demo translations."""
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m hfxla_nb.demo.seq2seq",
                                     description=main.__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--devices", type=int, default=4, help="virtual XLA devices (no TPU)")
    parser.add_argument("--architecture", default="bart", choices=("bart", "t5"))
    parser.add_argument("--output-dir", default="auto",
                        help="default: a new folder demo_output/tiny-bart-<start time>")
    args = parser.parse_args(argv)

    from hfxla_nb.runtime import detect_accelerator
    from hfxla_nb.ui.panels import result_text

    from . import start_demo

    start = start_demo(args.devices)
    result = run_demo_seq2seq(max_steps=args.steps, devices=args.devices,
                              architecture=args.architecture, output_dir=args.output_dir)
    print(result_text(result), flush=True)
    sources = ["the happy dog finds my red bird", "a small fox"]
    predictions = result.predict(sources, num_processes=None if detect_accelerator().kind ==
                                 "tpu" else args.devices, progress=False)
    for source, item in zip(sources, predictions, strict=True):
        print(f"{source!r} -> {item['generated_text']!r}", flush=True)
    bleu = result.metrics.get("eval_bleu", float("nan"))
    print(f"BLEU {bleu:.1f}   graphs compiled: {result.compiles} training + "
          f"{result.eval_compiles} evaluation (generation included)   wall time: "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return 0 if bleu > 50 else 1


if __name__ == "__main__":
    raise SystemExit(main())
