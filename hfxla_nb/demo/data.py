"""The demo corpus: short reviews made from word lists and templates, with their labels.

The rows are a pure function of `(n, seed, num_classes)`: the same on every machine, and no
download. `hfxla_nb.demo` builds the tokenizer and the tiny BERT on them.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported lazily: `import hfxla_nb.demo` stays cheap
    import datasets

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
