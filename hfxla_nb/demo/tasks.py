"""The embedded defaults for token classification, question answering, multiple choice,
image and audio classification and speech recognition, offline (`make demo TASK=...`).

```python
from hfxla_nb.demo.tasks import ner_dataset, ner_model_dir, qa_dataset, qa_model_dir
result = hx.fine_tune(ner_model_dir(), ner_dataset(), task="token-classification")
result = hx.fine_tune(qa_model_dir(), qa_dataset(), task="question-answering")
```

The data are sentences made from templates and short lists of people, places and
organisations, in conll2003's layout (`tokens`, `ner_tags` as a `ClassLabel` sequence with
conll's tag names) and SQuAD v2's (`id`, `title`, `context`, `question`, `answers` with `text`
and `answer_start`; no answer for some questions). The models are the tiny BERT of
`hfxla_nb.demo` with one layer (`DEMO_LAYERS`) and a task head, built from a config;
the demo tokenizer spells unknown names in characters, so words span several sub-tokens.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

from . import (
    RECIPE_VERSION,
    build_atomically,
    cache_dir,
    demo_config,
    demo_tokenizer,
    save_seeded_model,
)
from .audio import demo_audio_dataset, demo_audio_model_dir, demo_audio_rows
from .images import demo_image_dataset, demo_images, demo_vit_model_dir
from .speech import demo_speech_dataset, demo_speech_model_dir, demo_speech_rows

if TYPE_CHECKING:
    import datasets

#: Layers of the task demos' tiny BERT: one learns every demo task here, and compiles (and
#: steps) in about half the time of `hfxla_nb.demo`'s two.
DEMO_LAYERS = 1

#: conll2003's `ner_tags` names, in its order.
CONLL_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
PEOPLE = ("alice smith", "bob jones", "carol white", "david brown", "emma stone",
          "frank miller", "grace lee", "henry ford", "ivan petrov", "julia roberts")
PLACES = ("paris", "new york", "berlin", "tokyo", "london", "san francisco", "madrid", "rome",
          "oslo", "cairo")
ORGANISATIONS = ("google", "acme corp", "red cross", "nasa", "siemens", "general motors",
                 "unicef", "ibm")
LANGUAGES = ("french", "german", "english", "spanish")  # MISC
_NER_TEMPLATES = (
    "{PER} lives in {LOC} .",
    "{PER} works for {ORG} in {LOC} .",
    "yesterday {ORG} opened an office in {LOC} .",
    "{PER} met {PER} at {ORG} .",
    "the weather in {LOC} was great .",
    "{PER} speaks {MISC} .",
    "nothing happened today .",
)
_FILLER = ("the weather was nice .", "it rained all day .", "the movie was great .",
           "people liked the food .", "the story was boring .")


def _fill(template: str, rng: random.Random) -> tuple[list[str], list[str]]:
    words, tags = [], []
    lists = {"PER": PEOPLE, "LOC": PLACES, "ORG": ORGANISATIONS, "MISC": LANGUAGES}
    for piece in template.split():
        if piece.startswith("{") and piece.endswith("}"):
            kind = piece[1:-1]
            entity = rng.choice(lists[kind]).split()
            words += entity
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(entity) - 1)
        else:
            words.append(piece)
            tags.append("O")
    return words, tags


def ner_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` rows of `{"tokens": [...], "ner_tags": [tag names]}`."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words, tags = _fill(rng.choice(_NER_TEMPLATES), rng)
        rows.append({"tokens": words, "ner_tags": tags})
    return rows


def ner_dataset(n: int = 400, seed: int = 0) -> datasets.DatasetDict:
    """A conll2003-shaped `DatasetDict` (train 80%, validation 20%): `tokens` and `ner_tags`,
    a `Sequence(ClassLabel)` with conll's names."""
    import datasets

    features = datasets.Features({
        "tokens": datasets.Sequence(datasets.Value("string")),
        "ner_tags": datasets.Sequence(datasets.ClassLabel(names=list(CONLL_TAGS))),
    })
    index = {tag: i for i, tag in enumerate(CONLL_TAGS)}
    rows = [{"tokens": r["tokens"], "ner_tags": [index[t] for t in r["ner_tags"]]}
            for r in ner_rows(n, seed)]
    cut = int(n * 0.8)
    return datasets.DatasetDict({
        "train": datasets.Dataset.from_list(rows[:cut], features=features),
        "validation": datasets.Dataset.from_list(rows[cut:], features=features),
    })


def qa_rows(n: int, seed: int = 0, unanswerable: float = 0.2,
            max_filler: int = 6) -> list[dict]:
    """`n` SQuAD v2 rows: a context of facts among filler sentences (some long enough to be
    split with a stride), a question, its answer (or none)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        person, other = rng.sample(PEOPLE, 2)
        place, org = rng.choice(PLACES), rng.choice(ORGANISATIONS)
        facts = [f"{person} lives in {place} .", f"{other} works for {org} ."]
        filler = [rng.choice(_FILLER) for _ in range(rng.randint(0, max_filler))]
        sentences = facts + filler
        rng.shuffle(sentences)
        context = " ".join(sentences)
        kind = rng.random()
        if kind < unanswerable:
            question, answer = f"what is the capital of {place} ?", None
        elif kind < (1 + unanswerable) / 2:
            question, answer = f"where does {person} live ?", place
        else:
            question, answer = f"who works for {org} ?", other
        if answer is None:
            answers = {"text": [], "answer_start": []}
        else:
            fact = facts[0] if answer == place else facts[1]
            start = context.index(fact) + fact.index(answer)
            answers = {"text": [answer], "answer_start": [start]}
        rows.append({"id": f"q{i}", "title": "demo", "context": context,
                     "question": question, "answers": answers})
    return rows


def qa_dataset(n: int = 400, seed: int = 0, **options) -> datasets.DatasetDict:
    """A SQuAD v2-shaped `DatasetDict` (train 80%, validation 20%)."""
    import datasets

    rows = qa_rows(n, seed, **options)
    cut = int(n * 0.8)
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:cut]),
                                 "validation": datasets.Dataset.from_list(rows[cut:])})


_MC_KINDS = (  # (contexts, the ending that follows them); sent2 is "so {PER}"
    (("it rained all day in {LOC} .", "a storm hit {LOC} ."), "stayed inside ."),
    (("the sun was out in {LOC} .", "it was hot in {LOC} ."), "went to the beach ."),
    (("{PER} saw a great movie .", "the movie was great ."), "told everyone about it ."),
    (("{PER} saw a boring movie .", "the movie was boring ."), "left before the end ."),
)


def mc_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` SWAG rows (`sent1`, `sent2`, `startphrase`, `ending0..3`, `label`): a context of
    one of four kinds; the four endings are the four kinds' endings, the right one is its
    kind's."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        order = list(range(len(_MC_KINDS)))
        rng.shuffle(order)
        label = rng.randrange(len(order))
        contexts, _ = _MC_KINDS[order[label]]
        person = rng.choice(PEOPLE)
        sent1 = rng.choice(contexts).format(PER=person, LOC=rng.choice(PLACES))
        sent2 = f"so {rng.choice(PEOPLE)}"
        rows.append({"video-id": f"demo{i}", "fold-ind": str(i), "startphrase":
                     f"{sent1} {sent2}", "sent1": sent1, "sent2": sent2, "gold-source": "gen",
                     **{f"ending{k}": _MC_KINDS[kind][1] for k, kind in enumerate(order)},
                     "label": label})
    return rows


def mc_dataset(n: int = 400, seed: int = 0) -> datasets.DatasetDict:
    """A SWAG-shaped `DatasetDict` (train 80%, validation 20%)."""
    import datasets

    rows = mc_rows(n, seed)
    cut = int(n * 0.8)
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:cut]),
                                 "validation": datasets.Dataset.from_list(rows[cut:])})


def _mc_words() -> tuple[str, ...]:
    """Every word of the multiple-choice recipe: one token each (4 endings x a short row)."""
    text = " ".join([*PEOPLE, *PLACES, "so", *(" ".join([*c, e]) for c, e in _MC_KINDS)])
    words = set(text.replace("{", " ").replace("}", " ").split())
    return tuple(sorted(words - {"PER", "LOC"}))


def _qa_words() -> tuple[str, ...]:
    """Every word of the QA recipe: one token each, so its rows stay short."""
    text = " ".join([*PEOPLE, *PLACES, *ORGANISATIONS, *_FILLER,
                     "lives in . works for ? what is the capital of where does live who"])
    return tuple(sorted(set(text.split())))


def _head_model_dir(kind: str, label_names: tuple[str, ...] | None,
                    cache: str | os.PathLike | None, seed: int,
                    extra_words: tuple[str, ...] = (), layers: int | None = None) -> str:
    layers = DEMO_LAYERS if layers is None else int(layers)
    suffix = ("-words" if extra_words else "") + f"-{layers}layer"
    target = cache_dir(cache) / f"demo-bert-v{RECIPE_VERSION}-{kind}{suffix}-seed{seed}"
    if (target / "config.json").is_file():
        return str(target)

    def build(tmp: Path) -> None:
        import transformers

        tokenizer = demo_tokenizer(cache, extra_words=extra_words)
        num_labels = len(label_names) if label_names else 2
        config = demo_config(num_labels, vocab_size=len(tokenizer), label_names=label_names)
        config.num_hidden_layers = layers
        model_class = getattr(transformers, f"BertFor{kind}")
        save_seeded_model(model_class, config, seed, tokenizer, tmp)

    return str(build_atomically(target, build))


def ner_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """A tiny BERT with a token-classification head for conll's 9 tags, and its tokenizer."""
    return _head_model_dir("TokenClassification", CONLL_TAGS, cache, seed)


def classifier_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """`hfxla_nb.demo`'s tiny BERT classifier (two labels, the demo reviews' names) with one
    layer: for tests of what comes after training (predict), where learning is not the point."""
    return _head_model_dir("SequenceClassification", None, cache, seed)


def mlm_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """A tiny BERT with a masked-LM head, and the demo tokenizer (for the demo reviews)."""
    return _head_model_dir("MaskedLM", None, cache, seed)


def qa_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """A tiny BERT with a question-answering head (start and end logits), and its tokenizer
    (every word of the recipe one token)."""
    return _head_model_dir("QuestionAnswering", None, cache, seed, _qa_words())


def mc_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """A tiny BERT with a multiple-choice head (a score per ending), and its tokenizer (every
    word of the recipe one token). Two layers: an ending's score depends on its context,
    which one layer learns too slowly here."""
    return _head_model_dir("MultipleChoice", None, cache, seed, _mc_words(), layers=2)


def _new_images() -> list:
    """Three drawn images not in the demo's splits (seed 7), as HWC uint8 arrays."""
    return list(demo_images(3, seed=7)[0])


def _new_clips() -> list[dict]:
    """Three made-up clips not in the demo's splits (seed 7), one of each class."""
    return [row["audio"] for row in demo_audio_rows(3, seed=7)]


def _new_speech() -> list[dict]:
    """Three made-up spoken clips not in the demo's splits (seed 7)."""
    return [row["audio"] for row in demo_speech_rows(3, seed=7)]


#: `python -m hfxla_nb.demo.tasks --task ...`: what each demo runs and predicts on (the
#: model and data makers, fine_tune's options, predict's inputs or a function making them).
DEMOS = {
    "multiple-choice": (mc_model_dir, mc_dataset, {"epochs": 6, "learning_rate": 5e-3},
                        [{"sent1": "it rained all day in oslo .", "sent2": "so emma stone",
                          **{f"ending{k}": kind[1] for k, kind in enumerate(_MC_KINDS)}}]),
    "token-classification": (ner_model_dir, ner_dataset,
                             {"epochs": 3, "learning_rate": 1e-2},
                             ["alice smith lives in berlin .",
                              "yesterday unicef opened an office in tokyo ."]),
    "question-answering": (qa_model_dir, qa_dataset,
                           {"epochs": 5, "learning_rate": 1e-2, "max_length": 48},
                           [{"question": "where does grace lee live ?",
                             "context": "grace lee lives in oslo . bob jones works for nasa ."},
                            {"question": "what is the capital of oslo ?",
                             "context": "grace lee lives in oslo . bob jones works for nasa ."}]),
    "image-classification": (demo_vit_model_dir, demo_image_dataset,
                             {"max_steps": 100, "learning_rate": 3e-3}, _new_images),
    "audio-classification": (demo_audio_model_dir, demo_audio_dataset,
                             {"epochs": 2, "learning_rate": 1e-2, "batch_size": 16},
                             _new_clips),
    "speech-recognition": (demo_speech_model_dir, demo_speech_dataset,
                           {"max_steps": 300, "learning_rate": 3e-3, "batch_size": 16},
                           _new_speech),
}


def main(argv: list[str] | None = None) -> int:
    """Fine-tune the tiny BERT on one task's demo data over every device, then predict."""
    import argparse

    from ..train.finetune import fine_tune

    parser = argparse.ArgumentParser(prog="python -m hfxla_nb.demo.tasks",
                                     description=main.__doc__)
    parser.add_argument("--task", choices=sorted(DEMOS), default="token-classification")
    parser.add_argument("--devices", type=int, default=None,
                        help="XLA devices (on the CPU: virtual devices; default 4)")
    args = parser.parse_args(argv)
    model_dir, dataset, options, inputs = DEMOS[args.task]
    devices = args.devices or (None if os.environ.get("PJRT_DEVICE") == "TPU" else 4)
    result = fine_tune(model_dir(), dataset(), task=args.task, num_processes=devices,
                       **{"batch_size": 32, **options})
    print(result)
    rows, _ = result.predict(inputs() if callable(inputs) else inputs).table()
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
