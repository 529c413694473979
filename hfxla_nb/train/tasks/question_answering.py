"""`fine_tune(task="question-answering")`: extractive QA on SQuAD's columns (v1 and v2).

Kernel side: `question`, `context` and `answers` (`{"text": [...], "answer_start": [...]}`;
empty lists for an unanswerable question, SQuAD v2) are checked (every `answer_start` must
point at its text in the context), and each question with its context is tokenized into one
or more *features*: a context longer than the row length is split into windows that overlap
by a stride. A training feature's labels are the start and end token of the answer, or the
first token ([CLS]) when the window does not hold the whole answer (or there is none).

Worker side: the loss is the mean of the start and end cross-entropies (transformers'
recipe); evaluation fetches the start and end logits of every feature, and the host takes the
answer of each question from the `N_BEST` best starts and ends of all its windows (spans inside
the context, at most `MAX_ANSWER_TOKENS` long), by score start + end logit; with unanswerable
questions in the data, no answer wins when the [CLS] score beats the best span. Exact match
and F1 (0..100) by SQuAD's official rules, over answerable and unanswerable questions too.
"""

from __future__ import annotations

import collections
import re
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching, data, preparation
from ..config import FineTuneError
from ..preparation import Prepared
from . import register_task
from .base import MaxLength, Task
from .token_classification import pad_values

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Splits, TaskContext
    from ..worker.context import Batch, WorkerContext

N_BEST = 20
MAX_ANSWER_TOKENS = 30
DEFAULT_MAX_LENGTH = 384


@dataclass
class QaHost:
    """What the host keeps to turn logits into answers."""

    feature_example: np.ndarray  # feature -> example index
    offsets: list[list[tuple[int, int] | None]]  # per feature: characters of context tokens
    contexts: list[str]
    answers: list[list[str]] | None  # per example: the gold answers (evaluation)
    ids: list[Any]
    allow_no_answer: bool


def _columns(config: Any) -> tuple[str, str, str]:
    question = config.text_column if config.text_column != "text" else "question"
    context = config.text_pair_column or "context"
    answers = config.label_column if config.label_column != "label" else "answers"
    return question, context, answers


def check_answers(contexts: list[str], answers: list[Any], split: str, column: str) -> None:
    """Every answer a dict of `text` and `answer_start` lists, each start pointing at its
    text in the context; say how many do not, and the first."""
    bad = []
    for row, answer in enumerate(answers):
        if not isinstance(answer, dict) or "text" not in answer or "answer_start" not in answer:
            raise FineTuneError(
                f"row {row} of {column!r} ({split}) is {data.short(answer)}; answers must be "
                "SQuAD's {'text': [answer, ...], 'answer_start': [character, ...]} (empty "
                "lists for a question without an answer).")
        texts, starts = list(answer["text"]), list(answer["answer_start"])
        if len(texts) != len(starts):
            bad.append((row, f"{len(texts)} texts but {len(starts)} starts"))
            continue
        for text, start in zip(texts, starts, strict=True):
            start = int(start)
            if contexts[row][start:start + len(text)] != text:
                found = contexts[row][start:start + len(text)]
                bad.append((row, f"answer_start {start} points at {found!r}, not at {text!r}"))
                break
    if bad:
        row, what = bad[0]
        raise FineTuneError(
            f"{len(bad)} {split} answer(s) do not point at their text in the context; the first "
            f"is row {row}: {what}. answer_start is the character where the answer starts in "
            "`context` (fix or drop those rows).")


def read_split(ds: Any, split: str, q_column: str, c_column: str,
               a_column: str) -> tuple[list[str], list[str], list[Any], list[Any]]:
    """The questions, contexts, answers and ids of one split, refused with `FineTuneError`
    when a column is missing, or when a text or an answer is wrong (`check_answers`)."""
    present = list(ds.column_names)
    missing = [c for c in (q_column, c_column, a_column) if c not in present]
    if missing:
        raise FineTuneError(
            f"the {split} data has no column {' and no '.join(map(repr, missing))}; "
            f"its columns are: {', '.join(map(repr, present)) or '(none)'}. "
            "task='question-answering' needs SQuAD's columns: a question "
            f"({q_column!r}), a context ({c_column!r}) and answers ({a_column!r}, "
            "{'text': [...], 'answer_start': [...]}); pass text_column=... (question), "
            "text_pair_column=... (context), label_column=... (answers) to name yours.")
    try:
        questions = data.check_texts(list(ds[q_column]), q_column, split)
        contexts = data.check_texts(list(ds[c_column]), c_column, split)
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    answers = [dict(a) if isinstance(a, dict) else a for a in ds[a_column]]
    check_answers(contexts, answers, split, a_column)
    ids = list(ds["id"]) if "id" in present else list(range(len(ds)))
    return questions, contexts, answers, ids


def _features(tokenizer: Any, questions: list[str], contexts: list[str], cap: int,
              stride: int) -> Any:
    if not getattr(tokenizer, "is_fast", False):
        raise FineTuneError(
            "task='question-answering' needs a fast tokenizer (character offsets of tokens): "
            "pass tokenizer=AutoTokenizer.from_pretrained(..., use_fast=True).")
    side = getattr(tokenizer, "padding_side", "right") or "right"
    if side != "right":
        raise FineTuneError("question-answering puts the question first: use a tokenizer with "
                            "padding_side='right'.")
    return tokenizer(questions, contexts, truncation="only_second", max_length=cap,
                     stride=stride, return_overflowing_tokens=True,
                     return_offsets_mapping=True, padding=False)


def encode_examples(tokenizer: Any, questions: list[str], contexts: list[str],
                    answers: list[dict] | None, cap: int, stride: int
                    ) -> tuple[dict, np.ndarray, np.ndarray, list]:
    """Features of every example: the tokenizer's output, `[features, 2]` start/end labels,
    feature -> example, and each feature's context offsets (None outside the context)."""
    encoded = _features(tokenizer, questions, contexts, cap, stride)
    mapping = np.asarray(encoded["overflow_to_sample_mapping"], dtype=np.int64)
    labels = np.zeros((len(mapping), 2), dtype=np.int64)
    offsets = []
    for feature, example in enumerate(mapping):
        sequence = encoded.sequence_ids(feature)
        row_offsets = [tuple(o) if s == 1 else None
                       for o, s in zip(encoded["offset_mapping"][feature], sequence, strict=True)]
        offsets.append(row_offsets)
        if not answers or not answers[example]["text"]:
            continue
        start_char = int(answers[example]["answer_start"][0])
        end_char = start_char + len(answers[example]["text"][0])
        inside = [i for i, o in enumerate(row_offsets) if o is not None]
        if not inside or row_offsets[inside[0]][0] > start_char or (
                row_offsets[inside[-1]][1] < end_char):
            continue  # the window does not hold the whole answer: [CLS]
        start = next(i for i in inside if row_offsets[i][1] > start_char)
        end = next(i for i in reversed(inside) if row_offsets[i][0] < end_char)
        labels[feature] = (start, end)
    result = {key: list(value) for key, value in encoded.items()
              if key not in ("offset_mapping", "overflow_to_sample_mapping")}
    return result, labels, mapping, offsets


class QuestionAnswering(Task):
    """Start and end of the answer span; SQuAD's exact match and F1 on the host."""

    name = "question-answering"
    reported_metrics = ("loss", "exact_match", "f1")
    pipeline_tag = "question-answering"
    eval_ahead = True
    auto_class = "AutoModelForQuestionAnswering"
    head_suffixes = ("ForQuestionAnswering",)
    columns = ("question", "context", "answers")
    outputs_per_batch = 3
    title = "question answering"
    predict_example = '[{"question": "...", "context": "..."}]'

    # -- kernel side -----------------------------------------------------------------------

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Read each split (`read_split`), then cut each question's context into windows of
        the length cap with a stride of a quarter of it (one row per window; `QaHost` keeps
        which example and which characters each row holds, for decoding on the host), and
        bucket the rows."""
        columns = _columns(config)
        eval_name = splits.eval_name
        read = {split: read_split(ds, split, *columns) for split, ds in splits.named.items()}
        allow_no_answer = any(not a["text"] for split in read.values() for a in split[2])
        tokenizer = context.tokenizer
        cap = preparation.length_cap(config, context.model_config, tokenizer, DEFAULT_MAX_LENGTH)
        stride = cap // 4
        notes: list[str] = []
        encoded, labels, hosts = {}, {}, {}
        for split, (questions, contexts, answers, ids) in read.items():
            encoded[split], labels[split], mapping, offsets = encode_examples(
                tokenizer, questions, contexts, answers, cap, stride)
            hosts[split] = QaHost(mapping, offsets, contexts,
                                  [list(a["text"]) for a in answers], ids, allow_no_answer)
            split_windows = len(mapping) - len(questions)
            if split_windows:
                notes.append(f"{split}: {split_windows} more windows for long contexts "
                             f"({cap} tokens, stride {stride})")
        preparation.check_batch_fits(config, len(labels["train"]))
        buckets = batching.split_buckets(encoded, cap, config.max_length, config.rows_per_step)
        pads = pad_values(tokenizer, notes)
        input_names = batching.input_names_of(tokenizer, encoded["train"])
        encoded_splits = {split: batching.encode_split(split, encoded[split], labels[split],
                                                       input_names, buckets, pads)
                          for split in read}
        encoded_data = batching.EncodedData(
            train=encoded_splits["train"],
            eval=encoded_splits.get(eval_name) if eval_name is not None else None,
            input_names=input_names, bucket_lengths=list(map(int, buckets)), label_names=[],
            notes=notes, host={"eval": hosts.get(eval_name) if eval_name is not None else None},
        )
        kwargs = ({} if context.fixed_labels is not None
                  or getattr(context.model_config, "pad_token_id", None) is not None
                  else {"pad_token_id": pads["input_ids"]})
        return Prepared(encoded_data, kwargs)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """`{"question": ..., "context": ...}` dicts (or (question, context) pairs)."""
        questions, contexts = [], []
        for row, value in enumerate(inputs):
            if isinstance(value, dict) and {"question", "context"} <= set(value):
                question, text = value["question"], value["context"]
            elif isinstance(value, (list, tuple)) and len(value) == 2:
                question, text = value
            else:
                raise FineTuneError(
                    f"input {row} is {data.short(value)}; question-answering predicts on "
                    "{'question': ..., 'context': ...} dicts or (question, context) pairs.")
            if not (isinstance(question, str) and isinstance(text, str)):
                raise FineTuneError(f"input {row}: the question and the context must be text.")
            questions.append(question)
            contexts.append(text)
        tokenizer = context.tokenizer
        cap = preparation.length_cap(MaxLength(max_length), context.model_config, tokenizer,
                               DEFAULT_MAX_LENGTH)
        encoded, labels, mapping, offsets = encode_examples(tokenizer, questions, contexts,
                                                            None, cap, cap // 4)
        lengths = [len(ids) for ids in encoded["input_ids"]]
        buckets = [max_length] if max_length else batching.choose_buckets(lengths, cap)
        notes: list[str] = []
        input_names = batching.input_names_of(tokenizer, encoded)
        split = batching.encode_split("predict", encoded, labels, input_names, buckets,
                                      pad_values(tokenizer, notes))
        host = QaHost(mapping, offsets, contexts, None, list(range(len(questions))),
                      context.allow_no_answer)
        return batching.EncodedData(train=None, eval=split, input_names=input_names,
                                    bucket_lengths=list(map(int, buckets)), label_names=[],
                                    notes=notes, host={"eval": host})

    # -- worker side -----------------------------------------------------------------------

    def _logits(self, ctx: WorkerContext, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        with ctx.autocast():
            output = ctx.model(**batch.inputs())
        return output.start_logits.float(), output.end_logits.float()

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        import torch

        cross_entropy = torch.nn.functional.cross_entropy
        start, end = self._logits(ctx, batch)
        starts, ends = batch.tokens[:, -2].long(), batch.tokens[:, -1].long()
        return (cross_entropy(start, starts) + cross_entropy(end, ends)) / 2

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        cross_entropy = torch.nn.functional.cross_entropy
        start, end = self._logits(ctx, batch)
        weights = batch.weights.float()
        losses = (cross_entropy(start, batch.tokens[:, -3].long(), reduction="none")
                  + cross_entropy(end, batch.tokens[:, -2].long(), reduction="none")) / 2
        losses = torch.where(weights > 0, losses, torch.zeros_like(losses))
        return [start, end, losses]

    def decode(self, data_: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each question's answer: text, character span in its context, score (start + end
        logit; the [CLS] score for no answer)."""
        split, host = data_.eval, data_.host["eval"]
        features = len(host.feature_example)
        length = max(data_.bucket_lengths)
        starts = np.full((features, length), -np.inf, dtype=np.float32)
        ends = np.full((features, length), -np.inf, dtype=np.float32)
        for (bucket_index, positions, real), (start, end, _) in self.per_batch(batches,
                                                                                fetched):
            bucket = split.buckets[bucket_index]
            rows = bucket.rows[positions[:real]]
            starts[rows, :bucket.length] = start.float().numpy()[:real]
            ends[rows, :bucket.length] = end.float().numpy()[:real]
        by_example = collections.defaultdict(list)
        for feature, example in enumerate(host.feature_example):
            by_example[int(example)].append(feature)
        return [best_answer([(starts[f], ends[f], host.offsets[f]) for f in by_example[e]],
                            host.contexts[e], host.allow_no_answer)
                for e in range(len(host.contexts))]

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        loss = sum(float(losses.double().sum()) for _, (_, _, losses) in
                   self.per_batch(batches, fetched))
        decoded = self.decode(ctx.plan.data, batches, fetched)
        host = ctx.plan.data.host["eval"]
        values = {"eval_loss": loss / max(ctx.plan.data.eval.num_rows, 1)}
        values.update(squad_metrics([d["answer"] for d in decoded], host.answers))
        values["eval_rows"] = float(len(host.contexts))
        return values


def best_answer(features: list[tuple[np.ndarray, np.ndarray, list]], context: str,
                allow_no_answer: bool) -> dict[str, Any]:
    """The best span over an example's windows from the `N_BEST` best starts and ends of each
    (transformers' `postprocess_qa_predictions` rules)."""
    best: dict[str, Any] | None = None
    null_score = None
    for start_logits, end_logits, offsets in features:
        score = float(start_logits[0] + end_logits[0])
        null_score = score if null_score is None else min(null_score, score)
        limit = len(offsets)
        top_starts = np.argsort(start_logits[:limit])[::-1][:N_BEST]
        top_ends = np.argsort(end_logits[:limit])[::-1][:N_BEST]
        for s in top_starts:
            for e in top_ends:
                if offsets[s] is None or offsets[e] is None or e < s or (
                        e - s + 1 > MAX_ANSWER_TOKENS):
                    continue
                score = float(start_logits[s] + end_logits[e])
                if best is None or score > best["score"]:
                    first, last = offsets[s][0], offsets[e][1]
                    best = {"answer": context[first:last], "start": int(first),
                            "end": int(last), "score": score}
    if best is None or (allow_no_answer and null_score is not None
                        and null_score > best["score"]):
        return {"answer": "", "start": None, "end": None,
                "score": float(null_score if null_score is not None else 0.0)}
    return best


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _f1(prediction: str, truth: str) -> float:
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not predicted or not gold:
        return float(predicted == gold)  # SQuAD v2: both empty is a match
    common = collections.Counter(predicted) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: list[str], answers: list[list[str]]) -> dict[str, float]:
    """Exact match and F1 (0..100) by SQuAD v2's official rules: the best over the gold
    answers; a question without one is right only when the prediction is empty. Split into
    answerable and unanswerable questions when there are both."""
    exact, f1, has = [], [], []
    for prediction, gold in zip(predictions, answers, strict=True):
        golds = [g for g in gold if normalize_answer(g)] or [""]
        exact.append(max(float(normalize_answer(prediction) == normalize_answer(g))
                         for g in golds))
        f1.append(max(_f1(prediction, g) for g in golds))
        has.append(golds != [""])
    exact_a, f1_a, has_a = np.asarray(exact), np.asarray(f1), np.asarray(has)
    values = {"eval_exact_match": 100 * float(exact_a.mean()),
              "eval_f1": 100 * float(f1_a.mean())}
    if has_a.any() and not has_a.all():
        values["eval_has_answer_exact_match"] = 100 * float(exact_a[has_a].mean())
        values["eval_has_answer_f1"] = 100 * float(f1_a[has_a].mean())
        values["eval_no_answer_exact_match"] = 100 * float(exact_a[~has_a].mean())
    return values


register_task(QuestionAnswering())
