"""`prepare_fine_tune`: everything `fine_tune` does before forking, as named steps.

Runs in the notebook kernel without starting the XLA runtime: check the options, load the
config and tokenizer, choose the task, read and check the data, tokenize into fixed-shape
buckets, check the output folder and a checkpoint to resume. A causal LM's data steps are in
`prepare_lm.py`. Writes nothing; any refusal is a `FineTuneError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .. import batching, lora
from ..config import FineTuneConfig, FineTuneError
from ..memory_plan import MemoryPlan, meta_classifier
from ..plan import TrainPlan
from ..tasks.registry import TASKS
from . import data, sources, steps
from .prepare_lm import memory_plan_of, prepare_causal_lm


@dataclass
class TaskContext:
    """What a task's `prepare` gets besides the data and the config: the model as loaded in
    the kernel (config, tokenizer, no weights)."""

    model: Any  # as passed
    source: Any  # what the worker loads: a name/folder (str) or the instance
    model_config: Any
    fixed_labels: int | None  # the head size of a model instance (it cannot change)
    tokenizer: Any
    model_name: str


@dataclass
class _Texts:
    """The checked columns of every split (train first), before tokenizing."""

    texts: dict[str, list[str]]
    pairs: dict[str, list[str]]
    label_names: list[str]
    label_ids: dict[str, Any]
    eval_name: str | None
    notes: list[str] = field(default_factory=list)


def prepare_fine_tune(
    model: Any, dataset: Any, config: FineTuneConfig | None = None, **options: Any
) -> TrainPlan:
    """Everything `fine_tune` does before forking, without starting the XLA runtime.

    Same arguments as `fine_tune`. Returns the `TrainPlan` its worker runs; raises
    `FineTuneError` (a `ValueError`) with a message naming the fix for anything that cannot
    work. Writes nothing.
    """
    config = FineTuneConfig.build(config, options)
    source, model_config, fixed_labels, model_name = sources.model_source(model)
    task = sources.resolve_task(config.task, model, model_config)
    tokenizer = sources.load_tokenizer(config.tokenizer, model, source)
    if task == "causal-lm":
        return prepare_causal_lm(dataset, config, source, model_config, tokenizer, model_name)
    picked = None
    if config.task == "auto" and sources.head_task(model, model_config) is None:
        picked = task_from_columns(dataset, config)
        task = picked or task
    check_lora_task(config, task)
    context = TaskContext(model, source, model_config, fixed_labels, tokenizer, model_name)
    plan = TASKS[task].prepare(dataset, config, context)
    if plan is not None:
        if picked:
            plan.data.notes.insert(0, f"task='auto' picked {picked!r} from the data's columns")
        return plan
    columns = _read_columns(dataset, config, model_config, fixed_labels)
    cap = steps.length_cap(config, model_config, tokenizer)
    encoded, truncated = {}, {}
    for split, texts in columns.texts.items():
        encoded[split], truncated[split] = batching.tokenize(
            tokenizer, texts, columns.pairs.get(split), cap)
    steps.check_batch_fits(config, len(columns.texts["train"]))
    buckets = batching.split_buckets(encoded, cap, config.max_length, config.rows_per_step)
    pad_id = steps.pad_id(tokenizer, columns.notes)
    input_names = batching.input_names_of(tokenizer, encoded["train"])
    pad_values = {
        "input_ids": pad_id if pad_id is not None else 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0) or 0,
    }
    side = getattr(tokenizer, "padding_side", "right") or "right"
    splits = {
        split: batching.encode_split(split, encoded[split], columns.label_ids[split],
                                     input_names, buckets, pad_values, side, truncated[split])
        for split in encoded
    }
    per_epoch = _steps_per_epoch(config, splits, columns, buckets)
    total = (int(config.max_steps) if config.max_steps is not None
             else max(1, math.ceil(config.epochs * per_epoch)))
    devices = steps.devices(config)
    lora_json, memory = _classifier_lora(config, source, model_config,
                                         fixed_labels or len(columns.label_names),
                                         int(buckets[-1]), devices, columns.notes)
    output_dir = sources.check_output_dir(config.output_dir, model_name)
    fingerprint = {
        "train_rows": len(columns.texts["train"]),
        "batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "buckets": list(map(int, buckets)),
        "seed": config.seed,
        "total_steps": total,
        "labels": list(columns.label_names),
        "train_digest": steps.digest(splits["train"]),
    }
    if lora_json:  # a resume with other LoRA settings is refused
        fingerprint["lora"] = lora_json
    resume = steps.checkpoint_to_resume(config, output_dir, fingerprint)
    encoded_data = batching.EncodedData(
        train=splits["train"],
        eval=splits.get(columns.eval_name) if columns.eval_name else None,
        input_names=input_names,
        bucket_lengths=list(map(int, buckets)),
        label_names=list(columns.label_names),
        notes=columns.notes,
    )
    return TrainPlan(
        model=source,
        model_kwargs=_model_kwargs(model_config, fixed_labels, columns.label_names, pad_id),
        tokenizer=tokenizer,
        data=encoded_data,
        total_steps=total,
        steps_per_epoch=per_epoch,
        metrics=tuple(config.metrics),
        devices=devices,
        fingerprint=fingerprint,
        **steps.config_fields(config, output_dir, resume),
        sharding="data" if config.sharding == "auto" else config.sharding,
        lora=lora_json, memory=memory,
    )


def check_lora_task(config: FineTuneConfig, task: str) -> None:
    """`lora=` refused, before any work, for a task it does not support yet."""
    if config.lora in (False, None, "auto") or task in lora.TASK_TYPES:
        return
    supported = " and ".join(f"task={name!r}" for name in lora.TASK_TYPES)
    raise FineTuneError(f"lora= works for {supported} so far; this is a {task!r} fine-tune: "
                        "drop lora= to fine-tune every weight.")


def _classifier_lora(config: FineTuneConfig, source: Any, model_config: Any, labels: int,
                     max_length: int, devices: int, notes: list[str]
                     ) -> tuple[dict[str, Any] | None, MemoryPlan | None]:
    """A sequence classifier's LoRA settings (peft's SEQ_CLS: the head trained whole) and the
    memory plan they were checked with; (None, None) without lora=. The model is the
    instance given, else the config's classifier built on the meta device (no memory), so
    that the head peft trains whole is counted."""
    if config.lora in (False, None):
        return None, None
    model = source if not isinstance(source, str) else meta_classifier(model_config, labels)
    requested = config.lora if config.lora != "auto" else False
    lora_json = lora.lora_settings(requested, model, model_config, "classification")
    memory = memory_plan_of(config, model, lora_json, max_length, devices, notes)
    if memory.lora_rank and lora_json is None:  # lora="auto" chose LoRA
        lora_json = lora.lora_settings(True, model, model_config, "classification")
    return lora_json, memory


def _read_columns(dataset: Any, config: FineTuneConfig, model_config: Any,
                  fixed_labels: int | None) -> _Texts:
    """Texts, pairs and labels of every split, checked; labels mapped to the model's ids."""
    try:
        train_ds, eval_ds, eval_name = data.pick_splits(dataset, config.eval_dataset)
        splits = {"train": train_ds} if eval_ds is None else {"train": train_ds, eval_name: eval_ds}
        texts, pairs, raw_labels, class_names = {}, {}, {}, {}
        for split, ds in splits.items():
            if len(ds) == 0:
                raise data.DataError(f"the {split} data is empty: it needs at least one row.")
            data.check_columns(ds, split, [config.text_column, config.text_pair_column,
                                        config.label_column])
            texts[split] = data.check_texts(data.column_values(ds, config.text_column),
                                         config.text_column, split)
            if config.text_pair_column:
                pairs[split] = data.check_texts(data.column_values(ds, config.text_pair_column),
                                             config.text_pair_column, split)
            raw_labels[split] = data.column_values(ds, config.label_column)
            class_names[split] = data.class_label_names(ds, config.label_column)
        label_names, label_ids = data.map_labels(
            raw_labels,
            column=config.label_column,
            dataset_names=class_names,
            model_names=data.meaningful_label_names(getattr(model_config, "id2label", None)),
            model_num_labels=fixed_labels,
        )
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    return _Texts(texts, pairs, list(label_names), label_ids, eval_name if eval_ds is not None
                  else None)


def _steps_per_epoch(config: FineTuneConfig, splits: dict, columns: _Texts,
                     buckets: list[int]) -> int:
    """Full steps in one epoch; notes what is dropped or truncated."""
    train_rows = len(columns.texts["train"])
    per_epoch = batching.steps_per_epoch(splits["train"], config.rows_per_step)
    if per_epoch == 0:
        raise FineTuneError(
            f"no length bucket has {config.rows_per_step} training rows for a full step; pass "
            "max_length=... (one bucket) or a smaller batch_size."
        )
    used = per_epoch * config.rows_per_step
    if used < train_rows:
        columns.notes.append(f"{train_rows - used} of {train_rows} training rows left out per "
                             "epoch (ragged batches are dropped; a different remainder each "
                             "epoch)")
    for split in splits.values():
        if split.truncated:
            columns.notes.append(f"{split.truncated} {split.name} rows truncated to "
                                 f"{buckets[-1]} tokens")
    return per_epoch


def _model_kwargs(model_config: Any, fixed_labels: int | None, label_names: list[str],
                  pad_id: int | None) -> dict[str, Any]:
    """`from_pretrained` arguments that size the head for the labels (a loaded instance
    keeps its own)."""
    if fixed_labels is not None:
        return {}
    kwargs: dict[str, Any] = {
        "num_labels": len(label_names),
        "id2label": dict(enumerate(label_names)),
        "label2id": {name: i for i, name in enumerate(label_names)},
    }
    if int(getattr(model_config, "num_labels", 0)) != len(label_names):
        kwargs["ignore_mismatched_sizes"] = True
    if getattr(model_config, "pad_token_id", None) is None and pad_id is not None:
        kwargs["pad_token_id"] = int(pad_id)
    return kwargs




def task_from_columns(dataset: Any, config: FineTuneConfig) -> str | None:
    """task="auto" for a model without a task head: the one task whose columns (`Task.columns`)
    the training data has; None when none has them (classification, as before); refused when
    several fit."""
    try:
        train, _, _ = data.pick_splits(dataset, None)
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    present = set(getattr(train, "column_names", ()) or ())
    if config.text_column in present and config.text_column != "text":
        return None  # columns named for classification
    fits = [name for name in TASKS if TASKS[name].columns
            and set(TASKS[name].columns) <= present]
    if len(fits) > 1:
        raise FineTuneError(
            f"task='auto' cannot tell the task from the columns ({', '.join(sorted(present))}): "
            f"they fit {', '.join(map(repr, fits))}. Pass task=... .")
    return fits[0] if fits else None


def build_plan(config: FineTuneConfig, context: TaskContext, task: str,
               encoded: batching.EncodedData, model_kwargs: dict[str, Any]) -> TrainPlan:
    """The `TrainPlan` of a task whose data is encoded: steps per epoch and in total, devices,
    output folder, the checkpoint to resume; what every task's `prepare` ends with."""
    train = encoded.train
    steps.check_batch_fits(config, train.num_rows)
    per_epoch = batching.steps_per_epoch(train, config.rows_per_step)
    if per_epoch == 0:
        raise FineTuneError(
            f"no length bucket has {config.rows_per_step} training rows for a full step; pass "
            "max_length=... (one bucket) or a smaller batch_size."
        )
    used = per_epoch * config.rows_per_step
    if used < train.num_rows:
        encoded.notes.append(f"{train.num_rows - used} of {train.num_rows} training rows left "
                             "out per epoch (ragged batches are dropped)")
    for split in (encoded.train, encoded.eval):
        if split is not None and split.truncated:
            encoded.notes.append(f"{split.truncated} {split.name} rows truncated to "
                                 f"{encoded.bucket_lengths[-1]} tokens")
    total = (int(config.max_steps) if config.max_steps is not None
             else max(1, math.ceil(config.epochs * per_epoch)))
    devices = steps.devices(config)
    output_dir = sources.check_output_dir(config.output_dir, context.model_name)
    fingerprint = {
        "train_rows": train.num_rows,
        "batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "buckets": list(map(int, encoded.bucket_lengths)),
        "seed": config.seed,
        "total_steps": total,
        "labels": list(encoded.label_names),
        "train_digest": steps.digest(train),
    }
    resume = steps.checkpoint_to_resume(config, output_dir, fingerprint)
    return TrainPlan(
        model=context.source,
        model_kwargs=model_kwargs,
        tokenizer=context.tokenizer,
        data=encoded,
        total_steps=total,
        steps_per_epoch=per_epoch,
        metrics=tuple(config.metrics),
        devices=devices,
        fingerprint=fingerprint,
        **steps.config_fields(config, output_dir, resume),
        task=task,
        sharding="data" if config.sharding == "auto" else config.sharding,
        gradient_checkpointing=bool(config.gradient_checkpointing),
    )


def head_kwargs(model_config: Any, fixed_labels: int | None, label_names: list[str],
                pad_id: int | None) -> dict[str, Any]:
    """`from_pretrained` arguments that size a head for these labels (public for tasks)."""
    return _model_kwargs(model_config, fixed_labels, label_names, pad_id)
