"""`hx.predict` and `FineTuneResult.predict`: prediction on every XLA device, in a launched
worker, with the same batches and the same post-processing as `fine_tune`'s evaluation.

```python
result.predict(["alice smith lives in paris ."])          # NER: entities with char spans
hx.predict(folder, [{"question": q, "context": c}], task="question-answering")
```

In the kernel the inputs are checked and tokenized into length buckets (the task's
`prepare_predict`); the worker (`worker.evaluate.predict_worker`) shards each padded batch
over every device (SPMD, data parallel), one graph per bucket, fetches everything in one
transfer and decodes on the host with the task's `decode`, the function evaluation uses. What
comes back is plain Python: one dict per input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._words import plural
from . import preparation
from .config import FineTuneError, is_conversation, model_generation_config
from .plan import TrainPlan
from .tasks import AUTO, DEFAULT_TASK, TASKS, plain_prediction_table

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

#: Rows per device in a batch when `batch_size` is not given: at most this many (fewer for
#: fewer inputs, at least `MIN_ROWS_PER_DEVICE`). A batch is traced once whatever its size, so
#: larger batches spend less host time per row (on XLA:CPU, 4 devices, a tiny BERT: 8 rows a
#: device traced for about half of predict's time, 32 for about a quarter).
ROWS_PER_DEVICE = 32
MIN_ROWS_PER_DEVICE = 8


@dataclass
class PredictContext:
    """What a task's `prepare_predict` gets: the model's config and tokenizer."""

    model_config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    allow_no_answer: bool = True  # question answering: an empty answer may win (SQuAD v2)
    max_new_tokens: int | None = None  # causal LM: tokens generated per prompt
    top_k: int | None = None  # masked LM: candidates per mask token
    generation_config: Any = None  # causal LM: a GenerationConfig (the model's own by default)
    generation: dict[str, Any] | None = None  # causal LM: do_sample, temperature, ...


class Predictions(list):
    """One prediction (a dict) per input, in order; `to_dataframe()` makes a table of them.

    In a notebook it is drawn as that table, its values rounded (`hfxla_nb.ui.panels`);
    the dicts and `to_dataframe()` keep them exact.

    Attributes:
        task: the task that predicted.
        inputs: the inputs predicted on, in order (the table shows each row's input by
            them); None for a list made by hand.
        compiles: graphs compiled (one per length bucket, or none from the compile cache).
        bucket_lengths: the padded lengths used.
        seconds: wall time of the prediction in the worker (model loading left out).
        compile_seconds: the part of `seconds` spent compiling graphs.
    """

    task: str = ""
    compiles: int = 0
    inputs: list[Any] | None = None  # what was predicted on, in order (the table names them)
    bucket_lengths: list[int]
    seconds: float = 0.0
    compile_seconds: float = 0.0

    def table(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The table's rows and columns, as the task makes them (`Task.prediction_table`: one
        row per input; per entity for token classification, per candidate token for masked
        LM). Plain data, values exact: what `to_dataframe()` and the notebook's table show.

        Returns:
            `(rows, columns)`: a dict per row, and the column names in order (the rows' keys
            in the order they first appear when the task names none).
        """
        # A list made by hand (no task, or one since unregistered) still shows: the base
        # table, one row per input.
        if self.task in TASKS:
            rows, columns = TASKS[self.task].prediction_table(list(self))
        else:
            rows, columns = plain_prediction_table(list(self))
        if columns is None:  # every key of every row, as pandas would make the columns
            columns = list(dict.fromkeys(key for row in rows for key in row))
        return rows, list(columns)

    def to_dataframe(self):
        """A pandas DataFrame: one row per input, or as the task makes its table
        (`Task.prediction_table`: per entity for token classification, per candidate token
        for masked LM)."""
        import pandas as pd

        rows, columns = self.table()
        return pd.DataFrame(rows, columns=columns)

    def __repr__(self) -> str:
        # One line of data, as `FineTuneResult`'s: the dicts' floats at 16 digits are no
        # way to read predictions; the notebook draws the table (`ui.panels`).
        return (f"<Predictions: {len(self)} from {self.task or 'no task'}, "
                f"{plural(self.compiles, 'graph')} compiled; to_dataframe() for the table>")


def predict(model: Any, inputs: Any, task: str = "auto", *, batch_size: int | None = None,
            max_length: int | None = None, tokenizer: Any = None,
            num_processes: int | None = None, allow_no_answer: bool = True,
            max_new_tokens: int | None = None, top_k: int | None = None,
            progress: bool | str = "auto", timeout: float | None = None,
            generation_config: Any = None, **generation: Any) -> Predictions:
    """Predict with a model on every XLA device, in a launched worker.

    Args:
        model: a fine-tuned model's folder or name, a model instance on the CPU, or a
            `FineTuneResult`.
        inputs: one input or a list. Classification: texts (or (text, pair) tuples);
            token-classification: texts or lists of words; question-answering:
            `{"question": ..., "context": ...}` dicts; multiple-choice: SWAG rows
            (`sent1`, `sent2`, `ending0`, ...) or `{"context": ..., "endings": [...]}` dicts;
            causal-lm: prompts, or chats (lists of `{"role", "content"}` dicts, rendered by
            the tokenizer's chat template); seq2seq: source texts; masked-lm: texts with the
            tokenizer's mask token (`"[MASK]"`) where a token is to be filled in.
        task: a task name, or "auto" (from the model's architecture; a `...ForMaskedLM`
            model's folder or name predicts masked tokens).
        batch_size: rows per batch over all devices (a multiple of the devices); default up
            to 32 per device (fewer for fewer inputs; 8 for causal-lm and seq2seq).
        max_length: pad every input to this length (one graph); default: a few buckets.
        tokenizer: default the model's own.
        num_processes: devices (on the CPU: virtual devices; default as `fine_tune`).
        allow_no_answer: question answering: answer "" when no span beats [CLS] (SQuAD v2).
        max_new_tokens: causal LM: at most this many tokens per prompt (default: the
            generation config's, else 32; the loop stops once every row of a batch ended).
        top_k: masked LM: candidates per mask token (default 5, as the fill-mask pipeline);
            causal LM and seq2seq: the sampler's `top_k`, as `generate`'s.
        progress: the launch panel (True/"auto", False, ...).
        timeout: stop the worker after this many seconds.
        generation_config: causal LM: a `transformers.GenerationConfig` (default: the
            model's own `generation_config.json`).
        generation: causal LM: `do_sample`, `temperature`, `top_k`, `top_p`, `min_p`,
            `repetition_penalty`, `num_return_sequences`, `seed`, `eos_token_id`,
            `stop_strings`, `check_every` (`docs/tasks.md`).

    Returns:
        `Predictions`: a list with one plain-Python dict per input (classification: label,
        score, probabilities; token classification: words, tags, scores and entities with
        character spans; question answering: answer, start, end, score; multiple choice:
        label, ending, score, probabilities; causal LM and seq2seq: generated_text (causal
        LM with num_return_sequences > 1: a list of texts); masked
        LM: masks, each mask's candidates as the fill-mask pipeline gives them: score,
        token, token_str, sequence), and
        `to_dataframe()`.

    Raises:
        FineTuneError: before anything is forked, for inputs or options that cannot work.
    """
    from ..launch import notebook_launcher
    from ..launch.preflight import check_backend
    from ..runtime.environment import one_call

    if "stream" in generation:  # no task's predict streams: said before any library runs
        raise FineTuneError(
            "predict does not stream: its answers come back together, as a table. To see a "
            "causal LM's text as it is generated, use hx.generate(model, prompts, "
            "stream=True) (or result.generate(prompts, stream=True) on the CPU).")
    with one_call():  # one look at the host for the checks, the plan and the launch
        check_backend("spmd")  # no torch_xla (TorchTPU only): refused before any work
        session = None
        if type(model).__name__ == "FineTuneResult":
            if model.output_dir is None:
                raise FineTuneError("this run saved no model (output_dir was None): fine-tune "
                                    "with an output_dir to predict with it.")
            task = model.task if task == AUTO else task
            # Warm: the worker that trained it still holds it on the devices (same devices,
            # same tokenizer: the kernel's encoding is the same).
            if model.warm and tokenizer is None and num_processes in (None, model.devices):
                session, num_processes = model.session, model.devices
            model = model.output_dir
        inputs = input_list(inputs)  # once: a generator is read here, and kept for the table
        plan = prepare_predict(model, inputs, task, batch_size=batch_size, max_length=max_length,
                               tokenizer=tokenizer, num_processes=num_processes,
                               allow_no_answer=allow_no_answer, max_new_tokens=max_new_tokens,
                               top_k=top_k, generation_config=generation_config, **generation)
        if session is not None:
            from .worker import warm

            raw, _ = session.call(warm.predict, (plan,), progress=progress)
        else:
            from .worker.evaluate import predict_worker

            raw = notebook_launcher(predict_worker, args=(plan,), num_processes=plan.devices,
                                    strategy="spmd", progress=progress, timeout=timeout)
    out = Predictions(raw["predictions"])
    out.task, out.compiles, out.seconds = plan.task, raw["compiles"], raw["seconds"]
    out.inputs = inputs
    out.compile_seconds = raw["compile_seconds"]
    out.bucket_lengths = list(plan.data.bucket_lengths)
    return out


def prepare_predict(model: Any, inputs: Any, task: str = "auto", *,
                    batch_size: int | None = None, max_length: int | None = None,
                    tokenizer: Any = None, num_processes: int | None = None,
                    allow_no_answer: bool = True,
                    max_new_tokens: int | None = None, top_k: int | None = None,
                    generation_config: Any = None, **generation: Any) -> TrainPlan:
    """Everything `predict` does before forking; returns the worker's plan (a `TrainPlan`
    with the inputs as its evaluation split, no training)."""
    source, model_config, _, _ = preparation.model_source(model)
    if task != AUTO and task not in TASKS:
        raise FineTuneError(f"task={task!r} is not one of {', '.join(map(repr, TASKS))}.")
    # Every head counts: fine_tune keeps "auto" a classifier for a ...ForMaskedLM (pretrained
    # encoders are saved so); predicting, a classification head it does not have is random.
    task = preparation.resolve_task(task, model, model_config, every_head=True) or DEFAULT_TASK
    taken = TASKS[task].generation_options
    if top_k is not None and "top_k" in taken:  # a generating task's top_k is the sampler's
        generation = {**generation, "top_k": top_k}
    wrong = sorted(set(generation) - set(taken)) or (
        ["generation_config"] if generation_config is not None and not taken else [])
    if wrong:
        raise FineTuneError(
            f"{task}'s predict does not take {', '.join(wrong)}"
            + (f"; it takes {', '.join(taken)}." if taken else "; only generating tasks do."))
    if TASKS[task].continues_prompts and generation_config is None:
        generation_config = model_generation_config(model)  # its generation_config.json
    inputs = input_list(inputs)
    if not inputs:
        raise FineTuneError("inputs is empty: pass at least one input.")
    context = PredictContext(model_config, TASKS[task].load_processor(tokenizer, model, source),
                             allow_no_answer, max_new_tokens, top_k, generation_config,
                             generation)
    encoded = TASKS[task].prepare_predict(inputs, context, max_length)
    devices = preparation.device_count(num_processes)
    batch_size = int(batch_size or default_batch_size(task, encoded.eval.num_rows, devices))
    if batch_size % devices:
        raise FineTuneError(f"batch_size={batch_size} does not split evenly over the {devices} "
                            f"devices; use a multiple of {devices}.")
    return TrainPlan(
        model=source if isinstance(source, str) else model, model_kwargs={},
        tokenizer=context.tokenizer, data=encoded, batch_size=batch_size,
        gradient_accumulation_steps=1, learning_rate=0.0, weight_decay=0.0, warmup_steps=0,
        max_grad_norm=None, total_steps=0, steps_per_epoch=1, precision="auto",
        strategy="spmd", output_dir=os.devnull, save_steps=None, resume_from=None, seed=0,
        metrics=(), log_every=1, devices=devices, save=False, task=task,
        auto_class=TASKS[task].auto_class_for(model_config),
    )


def input_list(inputs: Any) -> list[Any]:
    """`predict`'s inputs as a list, one item per input: a single input (a text, a dict, a
    chat) in a list of its own, a DataFrame's rows as dicts."""
    if isinstance(inputs, (str, dict)) or is_conversation(inputs):
        return [inputs]
    if hasattr(inputs, "to_dict") and hasattr(inputs, "columns"):  # a DataFrame
        return inputs.to_dict("records")
    return list(inputs)


def default_batch_size(task: str, rows: int, devices: int) -> int:
    """Rows per batch over `devices` when `batch_size` is not given: a power of two per
    device, enough for `rows` (the encoded rows: windows, prompts) up to `ROWS_PER_DEVICE`;
    the task's `predict_rows_per_device` when it has one (tasks that generate)."""
    fixed = TASKS[task].predict_rows_per_device
    if fixed is not None:
        return fixed * devices
    per_device = MIN_ROWS_PER_DEVICE
    while per_device < ROWS_PER_DEVICE and per_device * devices < rows:
        per_device *= 2
    return per_device * devices
