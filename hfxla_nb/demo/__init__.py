"""The embedded default for demos, tests and tutorials: data, tokenizer and a tiny BERT, offline.

Nothing here needs the network. The dataset is made from word lists and templates (short
reviews, "negative" / "positive", optionally "neutral"): its rows are a pure function of
`(n, seed, num_classes)`, the same on every machine. The tokenizer is a WordPiece whose
vocabulary is built from that corpus, and the model is a 2-layer BERT built from a config and
written with `save_pretrained`, so that demos and tests go through the real
`from_pretrained(folder)` loading path.

```python
from hfxla_nb.demo import demo_dataset, demo_model_dir
import hfxla_nb as hx

data = demo_dataset()                     # DatasetDict: train / validation / test
folder = demo_model_dir()                 # tiny BERT + tokenizer, cached on disk
result = hx.fine_tune(folder, data, learning_rate=1e-3, epochs=1)
```

`python -m hfxla_nb.demo` (what `make demo` runs) shows `hfxla_nb.detect()` and fine-tunes
the tiny BERT on this data.

Built artefacts are cached under `$HFXLA_NB_CACHE` (default `~/.cache/hfxla_nb`); the cache
folders carry a version in their name, so a change of the recipe never reuses stale files.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets
    import transformers


# -- the corpus: short reviews from word lists and templates --

LABELS_2 = ("negative", "positive")
LABELS_3 = ("negative", "neutral", "positive")

# ---------------------------------------------------------------------------------------------
# Word lists. Sentiment lives in a few words; the rest is neutral filler of varying length, so
# the model has to find the words that matter among many that do not.
# ---------------------------------------------------------------------------------------------

_NOUNS = (
    "movie", "film", "book", "restaurant", "hotel", "phone", "laptop", "concert", "meal",
    "service", "show", "album", "game", "camera", "course", "trip", "room", "coffee", "pizza",
    "guide", "app", "keyboard", "museum", "play", "novel", "soup", "bike", "headset", "tour",
)
_POSITIVE_ADJ = (
    "great", "wonderful", "excellent", "delightful", "superb", "fantastic", "lovely",
    "brilliant", "charming", "enjoyable", "amazing", "pleasant", "outstanding", "impressive",
    "perfect", "fun", "beautiful", "solid", "smooth", "friendly",
)
_NEGATIVE_ADJ = (
    "terrible", "awful", "boring", "dreadful", "poor", "horrible", "disappointing", "bland",
    "mediocre", "annoying", "broken", "dull", "painful", "useless", "ugly", "slow", "rude",
    "noisy", "messy", "cheap",
)
_NEUTRAL_ADJ = ("okay", "average", "ordinary", "acceptable", "standard", "typical", "fine")
_POSITIVE_VERB = ("loved", "enjoyed", "adored", "liked", "appreciated", "admired")
_NEGATIVE_VERB = ("hated", "disliked", "regretted", "loathed", "despised", "resented")
_NEUTRAL_VERB = ("tried", "used", "saw", "bought", "watched", "visited")
_INTENSIFIERS = ("really", "very", "truly", "quite", "incredibly", "absolutely", "so", "pretty")
_FILLERS = (
    "we went there on a tuesday",
    "my friend picked it for us",
    "it arrived last week",
    "i tried it with my family",
    "the price was what i expected",
    "after a long day at work",
    "we had booked it a month ago",
    "my sister told me about it",
    "it was raining all afternoon",
    "there were many people around",
    "i read about it in a magazine",
    "we only had an hour",
    "this was my second time",
    "the parking was across the street",
    "i used it every day for two weeks",
    "my neighbour has the same one",
)
_POSITIVE_CLOSERS = (
    "i would go back again", "highly recommended", "worth every penny", "five stars",
    "i will tell my friends", "can not wait to return",
)
_NEGATIVE_CLOSERS = (
    "never again", "what a waste of money", "one star", "i want a refund",
    "avoid it if you can", "i will not return",
)
_NEUTRAL_CLOSERS = (
    "nothing more to say", "three stars", "it did the job", "maybe i will try it again",
)


def _sentiment_clause(rng: random.Random, label: str) -> str:
    adjectives = {"positive": _POSITIVE_ADJ, "negative": _NEGATIVE_ADJ, "neutral": _NEUTRAL_ADJ}
    verbs = {"positive": _POSITIVE_VERB, "negative": _NEGATIVE_VERB, "neutral": _NEUTRAL_VERB}
    noun = rng.choice(_NOUNS)
    adjective = rng.choice(adjectives[label])
    intensifier = rng.choice(_INTENSIFIERS) + " " if rng.random() < 0.5 else ""
    form = rng.randrange(4)
    if form == 0:
        return f"the {noun} was {intensifier}{adjective}"
    if form == 1:
        return f"i {rng.choice(verbs[label])} this {noun}"
    if form == 2:
        phrase = f"{intensifier}{adjective} {noun}"
        return f"what {'an' if phrase[0] in 'aeiou' else 'a'} {phrase}"
    return f"honestly the {noun} felt {intensifier}{adjective} to me"


def _sentence(rng: random.Random, label: str) -> str:
    closers = {
        "positive": _POSITIVE_CLOSERS, "negative": _NEGATIVE_CLOSERS, "neutral": _NEUTRAL_CLOSERS,
    }
    parts = [_sentiment_clause(rng, label)]
    # 0 to 4 neutral fillers give lengths from about 5 to about 45 words.
    for _ in range(rng.choice((0, 0, 1, 1, 2, 3, 4))):
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(_FILLERS))
    if rng.random() < 0.4:
        parts.append(rng.choice(closers[label]))
    text = ". ".join(parts) + "."
    return text[0].upper() + text[1:]


def demo_texts(n: int = 3000, seed: int = 0, num_classes: int = 2) -> tuple[list[str], list[int]]:
    """The raw demo rows as plain lists (no `datasets` import): texts and label ids.

    Args:
        n: number of rows.
        seed: the rows are a pure function of `(n, seed, num_classes)`.
        num_classes: 2 ("negative", "positive") or 3 (adds "neutral").

    Returns:
        `(texts, labels)`, labels indexing `demo_label_names(num_classes)`; classes balanced.
    """
    names = demo_label_names(num_classes)
    rng = random.Random(f"hfxla_nb-demo-{seed}-{num_classes}")
    labels = [i % num_classes for i in range(n)]
    rng.shuffle(labels)
    texts = [_sentence(rng, names[label]) for label in labels]
    return texts, labels


def demo_label_names(num_classes: int = 2) -> tuple[str, ...]:
    """Label names of the demo data: ("negative", "positive") or with "neutral" in between."""
    if num_classes not in (2, 3):
        raise ValueError(f"num_classes must be 2 or 3, got {num_classes!r}.")
    return LABELS_2 if num_classes == 2 else LABELS_3


def demo_dataset(
    n: int = 3000, seed: int = 0, num_classes: int = 2, splits: tuple[float, float] = (0.8, 0.1)
) -> datasets.DatasetDict:
    """A labeled text-classification dataset, made deterministically, no download.

    Short product and place reviews built from word lists and templates; the label is the
    sentiment. Lengths vary from about 5 to about 50 words. A 2-layer BERT learns it to
    >= 0.9 accuracy within one short epoch.

    Args:
        n: total rows over all splits.
        seed: rows are a pure function of the arguments.
        num_classes: 2 ("negative", "positive") or 3 (adds "neutral").
        splits: fractions for train and validation; the rest is the test split.

    Returns:
        `datasets.DatasetDict` with "train", "validation" and "test" splits and the columns
        `text` (string) and `label` (`ClassLabel`).

    Example:

    ```python
    >>> data = demo_dataset(n=100)
    >>> data["train"].features["label"].names
    ['negative', 'positive']
    ```
    """
    import datasets

    if n < 10:
        raise ValueError(f"n must be at least 10 so that every split has rows, got {n}.")
    texts, labels = demo_texts(n, seed, num_classes)
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "label": datasets.ClassLabel(names=list(demo_label_names(num_classes))),
        }
    )
    n_train = int(n * splits[0])
    n_validation = int(n * splits[1])
    bounds = {
        "train": (0, n_train),
        "validation": (n_train, n_train + n_validation),
        "test": (n_train + n_validation, n),
    }
    return datasets.DatasetDict(
        {
            name: datasets.Dataset.from_dict(
                {"text": texts[start:stop], "label": labels[start:stop]}, features=features
            )
            for name, (start, stop) in bounds.items()
        }
    )


# -- the tokenizer and the tiny BERT, built and cached --

# Bump when the recipe of any artefact changes: cached folders are keyed on it.
RECIPE_VERSION = 2

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_POSITIONS = 128

# ---------------------------------------------------------------------------------------------
# Cache folders
# ---------------------------------------------------------------------------------------------


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """Where built artefacts live: `path`, else `$HFXLA_NB_CACHE`, else `~/.cache/hfxla_nb`."""
    if path is None:
        path = os.environ.get("HFXLA_NB_CACHE") or Path.home() / ".cache" / "hfxla_nb"
    return Path(path).expanduser()


def build_atomically(target: Path, build) -> Path:
    """Run `build(tmp_folder)` and rename the folder to `target`; concurrent builders race
    harmlessly (the first rename wins, the others discard their copy)."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------------
# Tokenizer, config, model folder
# ---------------------------------------------------------------------------------------------


def _train_tokenizer(vocab_size: int, extra_words: tuple[str, ...] = ()):
    """A WordPiece tokenizer whose vocabulary is built, not trained: tokenizers' trainer breaks
    ties between equally frequent pieces differently from run to run, so two fresh caches got
    different token ids (and different demo models). Built from the corpus, the vocabulary is
    the same everywhere: the special tokens, every character, every character as a
    continuation, then `extra_words` (each one token, whatever the corpus holds), then the
    words, most frequent first (alphabetical among equals)."""
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words: Counter[str] = Counter()
    for num_classes in (2, 3):  # all variants, so every word of the recipe is in the vocabulary
        for text in demo_texts(4000, seed=12345, num_classes=num_classes)[0]:
            words.update(word for word, _ in
                         pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    extras = [normalizer.normalize_str(word) for word in extra_words]
    chars = sorted({char for word in [*words, *extras] for char in word})
    pieces = [*SPECIAL_TOKENS, *chars, *(f"##{char}" for char in chars)]
    for word in [*extras, *(word for word, _ in sorted(words.items(),
                                                         key=lambda item: (-item[1], item[0])))]:
        if word not in pieces:
            pieces.append(word)
    vocab = {piece: i for i, piece in enumerate(pieces[:vocab_size])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return tokenizer


def _wrap_tokenizer(tokenizer_object) -> transformers.PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def demo_tokenizer(
    cache: str | os.PathLike | None = None, vocab_size: int = 1000,
    extra_words: tuple[str, ...] = (),
) -> transformers.PreTrainedTokenizerFast:
    """A WordPiece tokenizer trained locally on the demo texts (BERT-style, lower case).

    Args:
        cache: cache folder (see `cache_dir`); the trained tokenizer is kept there.
        vocab_size: upper bound of the vocabulary; the demo words need a few hundred.
        extra_words: words that are one token each even where the texts do not hold them
            (the causal-LM demo's labels and template words, so that it generates whole
            words rather than spelling them letter by letter).

    Returns:
        `transformers.PreTrainedTokenizerFast` with `[CLS] ... [SEP]` templates, `[PAD]` as
        padding token and `model_max_length` 128.
    """
    from tokenizers import Tokenizer

    name = f"demo-tokenizer-v{RECIPE_VERSION}-{vocab_size}"
    if extra_words:  # its own folder: the plain demo tokenizer (and tiny BERT) stay as they are
        name += "-" + hashlib.sha1("\n".join(extra_words).encode()).hexdigest()[:10]
    folder = cache_dir(cache) / name
    build_atomically(
        folder,
        lambda tmp: _train_tokenizer(vocab_size, extra_words).save(str(tmp / "tokenizer.json")),
    )
    return _wrap_tokenizer(Tokenizer.from_file(str(folder / "tokenizer.json")))


def demo_config(
    num_labels: int = 2, vocab_size: int | None = None, label_names: tuple[str, ...] | None = None
) -> transformers.BertConfig:
    """A tiny BERT config: 2 layers, hidden 64, 2 heads, intermediate 128, 128 positions.

    Args:
        num_labels: size of the classification head.
        vocab_size: defaults to the size of `demo_tokenizer()`'s vocabulary.
        label_names: names for `id2label`; defaults to the demo names when `num_labels` is 2
            or 3.
    """
    from transformers import BertConfig

    if vocab_size is None:
        vocab_size = len(demo_tokenizer())
    if label_names is None and num_labels in (2, 3):
        label_names = demo_label_names(num_labels)
    kwargs = {}
    if label_names is not None:
        kwargs["id2label"] = dict(enumerate(label_names))
        kwargs["label2id"] = {name: i for i, name in enumerate(label_names)}
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS,
        num_labels=num_labels,
        **kwargs,
    )


def demo_model_dir(
    path: str | os.PathLike | None = None,
    num_labels: int = 2,
    seed: int = 0,
    cache: str | os.PathLike | None = None,
) -> str:
    """Write a freshly initialized tiny BERT classifier and its tokenizer to a folder.

    The folder looks like any Hugging Face checkpoint (`config.json`, `model.safetensors`,
    tokenizer files), so `AutoModelForSequenceClassification.from_pretrained(folder)` and
    `AutoTokenizer.from_pretrained(folder)` load it offline.

    Args:
        path: the folder; default: a versioned folder under `cache_dir()`. An existing folder
            that already holds a model is reused as it is.
        num_labels: size of the classification head.
        seed: the initial weights are a pure function of it.
        cache: cache folder (see `cache_dir`) for the default folder and the tokenizer.

    Returns:
        The folder, as a string.
    """
    if path is None:
        target = cache_dir(cache) / f"demo-bert-v{RECIPE_VERSION}-labels{num_labels}-seed{seed}"
    else:
        target = Path(path).expanduser()
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return str(target)

    def build(tmp: Path) -> None:
        from transformers import BertForSequenceClassification

        tokenizer = demo_tokenizer(cache)
        config = demo_config(num_labels, vocab_size=len(tokenizer))
        save_seeded_model(BertForSequenceClassification, config, seed, tokenizer, tmp)

    if target.exists() and any(target.iterdir()):
        raise FileExistsError(
            f"{target} exists and does not hold a model; pass an empty or new folder."
        )
    if target.exists():
        target.rmdir()
    build_atomically(target, build)
    return str(target)


def save_seeded_model(model_class: Any, config: Any, seed: int, tokenizer: Any,
                       folder: Path) -> None:
    """`model_class(config)` with initial weights drawn from `seed` alone (the caller's random
    state untouched), saved with `tokenizer` in `folder`; the demo's own setup, so without
    transformers' "Writing model shards" bar."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    with _no_progress_bars():
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off within the block, as they were after it (the demo
    quiets its own setup, never the library globally)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------------------------
# python -m hfxla_nb.demo
# ---------------------------------------------------------------------------------------------


def demo_output_dir(output_dir: str | os.PathLike | None,
                    name: str) -> str | os.PathLike | None:
    """`output_dir` as a demo passes it to `fine_tune`: "auto" (every demo's default) is a new
    folder for each run, `demo_output/<name>-<start time>`, so that running a demo again
    never replaces the model an earlier run saved; any other value is passed as it is."""
    if isinstance(output_dir, str) and output_dir == "auto":
        from hfxla_nb.train.preparation import new_output_dir

        return str(new_output_dir(name, root="demo_output"))
    return output_dir


def run_demo(
    rows: int = 3000,
    epochs: float = 2,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    devices: int = 4,
    strategy: str = "spmd",
    output_dir: str | os.PathLike | None = "auto",
    progress: bool | str = "console",
    cache: str | os.PathLike | None = None,
    **fine_tune_kwargs,
):
    """Fine-tune the tiny BERT on the demo data with `hfxla_nb.fine_tune`.

    Args:
        rows: rows of demo data (80% train, 10% validation, 10% test).
        epochs, batch_size, learning_rate, strategy, progress: as in `fine_tune`.
        output_dir: as in `fine_tune`; "auto" (default): a new folder for each run,
            `demo_output/tiny-bert-<start time>`.
        devices: virtual XLA devices when there is no TPU (on a TPU, all its devices).
        cache: cache folder for the tokenizer and model (see `cache_dir`).
        fine_tune_kwargs: more `fine_tune` arguments.

    Returns:
        The `FineTuneResult`. The randomly initialized tiny BERT reaches >= 0.9 validation
        accuracy with the defaults (2 epochs of 2,400 rows, about a minute on 2 CPU cores).
    """
    from hfxla_nb.runtime import detect_accelerator
    from hfxla_nb.train import fine_tune

    # Without a TPU, rehearse one: XLA on the CPU with virtual devices, the batch sharded.
    on_tpu = detect_accelerator().kind == "tpu"
    return fine_tune(
        demo_model_dir(cache=cache),
        demo_dataset(n=rows),
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        strategy=strategy,
        num_processes=None if on_tpu else devices,
        output_dir=demo_output_dir(output_dir, "tiny-bert"),
        progress=progress,
        **fine_tune_kwargs,
    )


def start_demo(devices: int) -> float:
    """What every demo's command line does first: `devices` virtual XLA devices when there is
    no TPU, XLA's C++ warnings quiet, the runtime panel printed. Returns the start time
    (`time.perf_counter()`)."""
    from hfxla_nb.runtime import configure, detect, detect_accelerator
    from hfxla_nb.ui.panels import runtime_text

    if detect_accelerator().kind != "tpu":
        # What the panel below shows is what the run uses: this many virtual devices.
        configure(device="cpu", cores=devices)
    # XLA's C++ warnings (a GSPMD deprecation notice per compiled graph) would bury the demo's
    # own output; errors still show. Only for the demo: the library leaves logging alone.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start = time.perf_counter()
    print(runtime_text(detect()), flush=True)
    return start


def main(argv: list[str] | None = None) -> int:
    """`make demo`: show what runtime is there, then fine-tune the tiny BERT on the demo data."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hfxla_nb.demo", description=main.__doc__)
    parser.add_argument("--rows", type=int, default=3000, help="rows of demo data")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--devices", type=int, default=4, help="virtual XLA devices (no TPU)")
    parser.add_argument("--strategy", default="spmd", choices=("spmd", "replicated"))
    parser.add_argument("--output-dir", default="auto",
                        help="default: a new folder demo_output/tiny-bert-<start time>")
    args = parser.parse_args(argv)

    from hfxla_nb.ui.panels import result_text

    start = start_demo(args.devices)
    result = run_demo(
        rows=args.rows,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        devices=args.devices,
        strategy=args.strategy,
        output_dir=args.output_dir,
    )
    print(result_text(result), flush=True)
    accuracy = result.metrics.get("eval_accuracy", float("nan"))
    print(
        f"final accuracy: {accuracy:.4f}   graphs compiled: {result.compiles} training + "
        f"{result.eval_compiles} evaluation   wall time: {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    return 0 if accuracy >= 0.9 else 1
