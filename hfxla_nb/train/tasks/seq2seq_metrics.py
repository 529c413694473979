"""ROUGE and BLEU of generated texts against their references, on the host.

ROUGE is Google's `rouge-score` package (what `evaluate.load("rouge")` wraps): rouge1, rouge2,
rougeL and rougeLsum F-measures with Porter stemming, the mean over rows, times 100 (as
Hugging Face's summarization notebook reports them). rougeLsum splits summaries at newlines;
texts without newlines score as rougeL. BLEU is `sacrebleu.corpus_bleu` with its defaults
(13a tokenization), as the translation notebook reports it.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The text metrics a seq2seq run can report.
TEXT_METRICS = ("rouge", "bleu")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """`{"rouge1": ..., "rouge2": ..., "rougeL": ..., "rougeLsum": ...}`: mean F-measures x 100."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for prediction, reference in zip(predictions, references, strict=True):
        scores = scorer.score(reference, prediction)
        for name in ROUGE_TYPES:
            totals[name] += scores[name].fmeasure
    count = max(len(predictions), 1)
    return {name: 100.0 * total / count for name, total in totals.items()}


def bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (0-100) with one reference per row."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def text_metrics(names: Sequence[str], predictions: Sequence[str],
                 references: Sequence[str]) -> dict[str, float]:
    """`eval_<name>` for each of `names` ("rouge" gives its four F-measures, "bleu" one)."""
    values: dict[str, float] = {}
    for name in names:
        if name == "rouge":
            values.update({f"eval_{key}": value
                           for key, value in rouge(predictions, references).items()})
        elif name == "bleu":
            values["eval_bleu"] = bleu(predictions, references)
        else:
            raise ValueError(f"unknown text metric {name!r}: use one of {TEXT_METRICS}.")
    return values


def metrics_missing(names: Sequence[str]) -> str | None:
    """What to install when a package of `names` is missing (checked in the kernel, before
    anything is forked), or None."""
    import importlib.util

    packages = {"rouge": ("rouge_score", "rouge-score"), "bleu": ("sacrebleu", "sacrebleu")}
    missing = [pip for name, (module, pip) in packages.items()
               if name in names and importlib.util.find_spec(module) is None]
    if not missing:
        return None
    return (f"the {' and '.join(names)} metric needs {', '.join(missing)}: pip install "
            f"{' '.join(missing)} (or pip install 'hfxla_nb[tasks]').")
