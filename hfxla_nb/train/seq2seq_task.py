"""`fine_tune(task="seq2seq")`: summarization and translation with encoder-decoder models
(T5, BART, Marian, Pegasus, ...).

```python
result = hx.fine_tune("t5-small", xsum, task="seq2seq", source_prefix="summarize: ")
result = hx.fine_tune(folder, wmt16, task="seq2seq", source_lang="en", target_lang="ro")
result.metrics   # eval_loss, eval_rouge1.. (summaries) or eval_bleu (translations)
```

Kernel side (`prepare`): the source and target texts (`seq2seq_data.py`) tokenized into rows
`[input_ids | attention_mask | labels]`, sources in length buckets, targets at one length.
Worker side: teacher-forced training (the model shifts the labels right into its decoder
inputs, -100 is not learned); evaluation computes the loss and generates greedily on the
device with fixed shapes (`seq2seq_generation.py`): per source bucket one graph for the
forward pass and encoder, one for every decoding step. The texts are scored on the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import batching, data, seq2seq_data, steps
from .config import FineTuneError
from .registry import register_task
from .seq2seq_data import Seq2SeqColumns, Seq2SeqData
from .seq2seq_generation import generated_texts, greedy_generate
from .seq2seq_metrics import TEXT_METRICS, metrics_missing, text_metrics
from .tasks import Task

#: Model class name endings of encoder-decoder language models.
HEAD_SUFFIXES = ("ForConditionalGeneration", "MTModel")
DEFAULT_METRICS = ("accuracy",)  # FineTuneConfig's default: "pick for the task" here


def check_model(model_config: Any, names: list[str]) -> None:
    """Refuse a decoder-only (or encoder-only) model for task="seq2seq"."""
    if getattr(model_config, "is_encoder_decoder", False):
        return
    what = names[0] if names else getattr(model_config, "model_type", "this model")
    raise FineTuneError(
        f"task='seq2seq' needs an encoder-decoder model (T5, BART, Marian, Pegasus, ...), and "
        f"{what} is not one (its config has no is_encoder_decoder). For a decoder-only "
        "model use task='causal-lm' with prompt_column= and response_column=; for "
        "summarization or translation pass e.g. a T5 or BART model."
    )


def refuse_encoder_decoder(task: str, model_config: Any) -> None:
    """Refuse an encoder-decoder language model for a decoder-only task ("causal-lm")."""
    names = list(getattr(model_config, "architectures", None) or [])
    if task == "causal-lm" and getattr(model_config, "is_encoder_decoder", False):
        raise FineTuneError(
            f"task='causal-lm', but the model ({', '.join(names) or model_config.model_type}) "
            "is an encoder-decoder model: it learns a target from a source. Use "
            "task='seq2seq' with source_column= and target_column= (or source_lang= and "
            "target_lang=), or a decoder-only model."
        )


def columns_of(config: Any) -> Seq2SeqColumns:
    return Seq2SeqColumns(
        source_column=getattr(config, "source_column", None),
        target_column=getattr(config, "target_column", None),
        source_lang=getattr(config, "source_lang", None),
        target_lang=getattr(config, "target_lang", None),
        prefix=getattr(config, "source_prefix", None),
    )


def metric_names(config: Any, translation: bool) -> tuple[str, ...]:
    """The text metrics to report: those asked for, else BLEU for translation, ROUGE else."""
    asked = tuple(config.metrics)
    if asked == DEFAULT_METRICS:
        return ("bleu",) if translation else ("rouge",)
    wrong = [m for m in asked if callable(m) or m not in TEXT_METRICS]
    if wrong:
        raise FineTuneError(
            f"task='seq2seq' reports {' and '.join(map(repr, TEXT_METRICS))} (and the loss); "
            f"metrics={asked!r} has {', '.join(map(repr, wrong))}. Pass metrics=('rouge',), "
            "('bleu',) or both."
        )
    return asked


class Seq2Seq(Task):
    """Sequence to sequence: teacher-forced cross-entropy; evaluation by loss and by greedy
    generation on the device, scored with ROUGE or BLEU on the host."""

    name = "seq2seq"
    auto_class = "AutoModelForSeq2SeqLM"
    head_suffixes = HEAD_SUFFIXES
    outputs_per_batch = 3

    # -- kernel side ---------------------------------------------------------------------------

    def prepare(self, dataset: Any, config: Any, context: Any) -> Any:
        from .prepare import build_plan

        names = ([type(context.source).__name__] if not isinstance(context.source, str)
                 else list(getattr(context.model_config, "architectures", None) or []))
        check_model(context.model_config, names)
        columns = columns_of(config)
        metrics = metric_names(config, columns.translation)
        missing = metrics_missing(metrics)
        if missing:
            raise FineTuneError(missing)
        encoded = encode(dataset, config, context, columns, metrics)
        plan = build_plan(config, context, self.name, encoded, model_kwargs={})
        # build_plan keeps config.metrics; the worker reads the chosen ones from the data.
        return plan

    # -- worker side ---------------------------------------------------------------------------

    def _parts(self, run: Any, x: Any, length: int):
        width = run.plan.data.target_length
        labels = x[:, 2 * length:2 * length + width].long()
        return x[:, :length], x[:, length:2 * length], labels

    def _forward(self, run: Any, x: Any, length: int, labels: bool = True):
        input_ids, mask, targets = self._parts(run, x, length)
        with run.autocast():
            # The model makes the decoder inputs from the labels (shifted right, -100 turned
            # into padding, its decoder start token first), as in Hugging Face's notebooks.
            output = run.model(input_ids=input_ids, attention_mask=mask, labels=targets,
                               use_cache=False)
        return output, input_ids, mask, targets

    def train_loss(self, run: Any, x: Any, length: int) -> Any:
        return self._forward(run, x, length)[0].loss.float()

    def eval_outputs(self, run: Any, x: Any, length: int) -> list[Any]:
        torch = run.torch
        output, input_ids, mask, targets = self._forward(run, x, length)
        logits = output.logits.float()
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
            reduction="none").view(targets.shape)
        weights = (targets != -100).float() * x[:, -1].float()[:, None]
        sums, counts = (losses * weights).sum(-1), weights.sum(-1)

        first = [sums, counts]

        def sync(state: dict[str, Any]) -> None:
            if run.mesh is not None:
                # Replicated inside each graph: fetching sharded results would compile a
                # gather per tensor, and the first step then sees the same input shardings
                # as every later one (one step graph, not two).
                for tensor in [*first, *state.values()]:
                    run.xla.replicate(tensor, run.mesh)
                first.clear()
            run.xla.sync()

        with run.autocast():
            tokens = greedy_generate(run.model, input_ids, mask, run.plan.data.target_length,
                                     sync=sync, encoder_hidden=output.encoder_last_hidden_state)
        return [sums, counts, tokens]

    def eval_metrics(self, run: Any, batches: list, fetched: list) -> dict[str, float]:
        data = run.plan.data
        predictions = self.decode(data, batches, fetched)
        total = tokens = 0.0
        for (_, _, real), (sums, counts, _) in self.per_batch(batches, fetched):
            total += float(sums.double().numpy()[:real].sum())
            tokens += float(counts.double().numpy()[:real].sum())
        values = {"eval_loss": total / max(tokens, 1.0)}
        values.update(text_metrics(data.text_metrics, predictions, references(data)))
        lengths = [len(text.split()) for text in predictions]
        values["eval_gen_words"] = float(np.mean(lengths)) if lengths else 0.0
        values["eval_rows"] = float(data.eval.num_rows)
        return values

    def decode(self, data: Seq2SeqData, batches: list, fetched: list) -> list[str]:
        """The generated text of every row of `data.eval`, in its order."""
        split = data.eval
        texts = [""] * split.num_rows
        for (bucket_index, positions, real), (_, _, tokens) in self.per_batch(batches, fetched):
            rows = split.buckets[bucket_index].rows[positions[:real]]
            for row, text in zip(rows, generated_texts(data.host, tokens[:real]), strict=True):
                texts[row] = text
        return texts


def references(data: Seq2SeqData) -> list[str]:
    """The target of every row of `data.eval`: its label tokens decoded by the same rules as
    the generated tokens (as Hugging Face's notebooks decode their labels)."""
    import torch

    tokenizer, split = data.host, data.eval
    pad = tokenizer.pad_token_id
    texts = [""] * split.num_rows
    for bucket in split.buckets:
        labels = seq2seq_data.label_block(bucket, data.target_length)
        ids = torch.from_numpy(np.where(labels == seq2seq_data.IGNORE, pad, labels))
        for row, text in zip(bucket.rows, generated_texts(tokenizer, ids), strict=True):
            texts[row] = text
    return texts


def encode(dataset: Any, config: Any, context: Any, columns: Seq2SeqColumns,
           metrics: tuple[str, ...]) -> Seq2SeqData:
    """Read, check and tokenize every split into fixed-shape rows."""
    tokenizer, model_config = context.tokenizer, context.model_config
    try:
        pairs, described = seq2seq_data.read_pairs(dataset, config.eval_dataset, columns)
        targets = {split: seq2seq_data.tokenize_targets(tokenizer, p.targets)
                   for split, p in pairs.items()}
        length = seq2seq_data.target_length(
            targets, getattr(config, "max_target_length", None), _decoder_positions(model_config))
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    cap = steps.length_cap(config, model_config, tokenizer)
    sources, truncated = {}, {}
    for split, p in pairs.items():
        sources[split], truncated[split] = batching.tokenize(tokenizer, p.sources, None, cap)
    if config.max_length is not None:
        buckets = [int(config.max_length)]
    else:
        train_lengths = [len(ids) for ids in sources["train"]["input_ids"]]
        buckets = batching.choose_buckets(train_lengths, cap, min_rows=4 * config.rows_per_step)
        longest = min(cap, batching.round_up(max(len(ids) for s in sources.values()
                                                 for ids in s["input_ids"])))
        buckets[-1] = max(buckets[-1], longest)
    pad = tokenizer.pad_token_id
    if pad is None:
        raise FineTuneError("the tokenizer has no padding token; set one (tokenizer.pad_token "
                            "= ...) or pass another tokenizer.")
    splits = {split: seq2seq_data.encode_split(split, sources[split], targets[split], buckets,
                                               length, int(pad), truncated[split])
              for split in pairs}
    eval_name = next((name for name in splits if name != "train"), None)
    notes = [f"seq2seq: {described}; sources padded to {', '.join(map(str, buckets))} tokens, "
             f"targets to {length}; evaluation generates {length} tokens greedily and reports "
             f"{' and '.join(metrics)}"]
    return Seq2SeqData(
        train=splits["train"], eval=splits.get(eval_name) if eval_name else None,
        input_names=["input_ids", "attention_mask"], bucket_lengths=list(map(int, buckets)),
        label_names=[], notes=notes, host=tokenizer, target_length=length,
        text_metrics=tuple(metrics), described=described)


def _decoder_positions(model_config: Any) -> int | None:
    """How many target positions the decoder embeds (None for relative positions, as T5)."""
    for name in ("max_target_positions", "max_position_embeddings"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


register_task(Seq2Seq())
