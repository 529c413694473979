"""`prepare_fine_tune`: everything `fine_tune` does before forking, one step after the other.

1. load: the model's source and config, the task its head names, the tokenizer, the devices
   (`train.preparation`);
2. pick the data's splits, once (`pick_splits`);
3. check: the task (for `task="auto"` without a task head: from the training split's
   columns), the model for the task, `lora=` for the task, no empty split;
4. the task's `prepare` (its module in `tasks/`): the encoded data and what the plan needs
   besides (a `preparation.Prepared`);
5. the plan: steps per epoch and in total, room in the output folder for what the run
   writes, the checkpoint to resume, and where the model comes from (for its model card:
   `hub.provenance`).

The output folder is checked right after the model's config is read, before the data:
`output_dir="auto"` names a new folder for the run, and a folder that holds a saved model is
refused without `overwrite_output_dir=True` (`preparation.check_output_dir`). Its free space
is checked against what this run writes (`check_output_space`: the counts of the run, the
memory plan's parameters when there is one, estimated by `train.memory`).

Runs in the notebook kernel without starting the XLA runtime. Writes nothing; any refusal is
a `FineTuneError` that says what to change.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

from ..runtime import detect_accelerator
from . import data, preparation
from .batching import EncodedData, StreamedSplit, steps_per_epoch
from .config import FineTuneConfig, FineTuneError
from .flow import TrainerMetrics, trainer_settings
from .hub import provenance
from .memory import DiskEstimate, check_free_space, checkpoints_written, estimate_output, on_meta
from .plan import TrainPlan
from .preparation import Prepared, Splits, TaskContext
from .tasks import AUTO, DEFAULT_TASK, TASKS
from .tasks.base import Task
from .worker import saving as ckpt

if TYPE_CHECKING:
    import torch



# -- the output folder's free space --

#: Bytes per parameter of the dtype names a config may give (`config.dtype`).
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float64": 8, "double": 8}


def check_output_space(context: TaskContext, task: Task, prepared: Prepared,
                       output_dir: str | None, total_steps: int, save_steps: int | None,
                       resume: Any) -> DiskEstimate | None:
    """Refuse the run when its output would not fit the free space of `output_dir`.

    Args:
        context, task, prepared: the run as prepared in the kernel.
        output_dir: the checked output folder (None: nothing is saved, nothing checked).
        total_steps, save_steps: the run's length and its checkpoint interval.
        resume: the checkpoint the run continues from, or None.

    Returns:
        The estimate checked, or None when nothing is saved.

    Raises:
        DiskSpaceError: the free space is smaller than the estimate (and its margin).
    """
    if output_dir is None:
        return None
    memory = prepared.memory
    if memory is not None:  # counted once, exactly, for the memory plan
        parameters, trainable = memory.parameters, memory.trainable_parameters
    else:
        parameters = trainable = parameter_count(context, task, prepared)
    per_parameter = saved_bytes_per_parameter(context)
    if prepared.lora and memory is not None and memory.precision == "bf16":
        per_parameter = 2  # the frozen base is stored in bfloat16, so is the merged model
    start = int(ckpt.read_checkpoint_info(resume).get("step", 0)) if resume else 0
    checkpoints = checkpoints_written(total_steps, save_steps, start)
    estimate = estimate_output(parameters, per_parameter, trainable, lora=bool(prepared.lora),
                               vocab=vocab_size(context.tokenizer), checkpoints=checkpoints)
    check_free_space(estimate, output_dir)
    return estimate


def parameter_count(context: TaskContext, task: Task, prepared: Prepared) -> int:
    """The parameters of the model the worker trains: the instance's, else those of the task's
    model built from the config on the `meta` device (exact shapes, no memory), with the
    head the worker gives it."""
    if context.instance is not None:
        return _unique_count(context.instance)
    import transformers

    config = copy.deepcopy(context.model_config)
    for key, value in prepared.model_kwargs.items():
        if key != "ignore_mismatched_sizes":  # a loading option, not a config field
            setattr(config, key, value)
    auto_class = getattr(transformers, task.auto_class_for(context.model_config))
    return _unique_count(on_meta(auto_class, config))


def saved_bytes_per_parameter(context: TaskContext) -> int:
    """Bytes per parameter of the saved model: the dtype the worker loads it in (the
    instance's, else the config's, which `from_pretrained` keeps), float32 when unsaid."""
    instance = context.instance
    if instance is not None:
        first = next(iter(instance.parameters()), None)
        return first.element_size() if first is not None else 4
    dtype = (getattr(context.model_config, "dtype", None)
             or getattr(context.model_config, "torch_dtype", None))
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    return DTYPE_BYTES.get(name, 4)


def vocab_size(tokenizer: Any) -> int:
    """The tokenizer's vocabulary with its added tokens (0 for a callable without one)."""
    try:
        return len(tokenizer)
    except TypeError:
        return int(getattr(tokenizer, "vocab_size", 0) or 0)


def _unique_count(model: torch.nn.Module) -> int:
    # parameters() yields a tied weight (embeddings and LM head) once, as it is saved.
    return sum(parameter.numel() for parameter in model.parameters())


# -- prepare_fine_tune, step by step --

def prepare_fine_tune(
    model: Any, dataset: Any, config: FineTuneConfig | None = None, **options: Any
) -> TrainPlan:
    """Everything `fine_tune` does before forking, without starting the XLA runtime.

    Same arguments as `fine_tune`. Returns the `TrainPlan` its worker runs; raises
    `FineTuneError` (a `ValueError`) with a message naming the fix for anything that cannot
    work. Writes nothing.
    """
    config = FineTuneConfig.build(config, options)
    check_stream_steps(dataset, config)
    source, model_config, fixed_labels, model_name = preparation.model_source(model)
    # The output folder first: a folder that holds a saved model is refused before the data
    # is tokenized (minutes for a large set), and the default folder is named by the start.
    output_dir = preparation.check_output_dir(
        config.output_dir, model_name, overwrite=config.overwrite_output_dir,
        resume=config.resume_from_checkpoint)
    head = preparation.resolve_task(config.task, model, model_config)
    splits = pick_splits(dataset, config)
    picked = task_from_columns(splits.train, config) if head is None else None
    task = TASKS[head or picked or DEFAULT_TASK]
    # The task loads what its data is encoded with: a tokenizer, or (audio) a feature
    # extractor (`Task.load_processor`).
    tokenizer = task.load_processor(config.tokenizer, model, source)
    context = TaskContext(source, model_config, fixed_labels, tokenizer, model_name,
                          preparation.devices(config))
    check_stream_task(task, splits)
    check(config, task, context, splits)
    prepared = task.prepare(splits, config, context)
    if picked:
        prepared.data.notes.insert(0, f"task={AUTO!r} picked {picked!r} from the data's columns")
    plan = build_plan(config, context, task, prepared, output_dir)
    # Where the model comes from, for its model card (`hub.provenance`), on the result too.
    plan.provenance = provenance(
        model, dataset, config, data.columns_of(splits.train),
        {name: len(ds) for name, ds in splits.named.items() if not data.is_stream(ds)},
        detect_accelerator().description)
    return plan


def check_stream_steps(dataset: Any, config: FineTuneConfig) -> None:
    """A streamed training set needs `max_steps` (its length is not known: an epoch cannot
    be counted), as Trainer requires for an `IterableDataset`; refused before any work."""
    if config.max_steps is not None or not data.is_stream(dataset):
        return
    raise FineTuneError(
        "the training data is streamed (an IterableDataset, streaming=True): its length is "
        "not known, so epochs cannot be counted. Pass max_steps=N (the optimizer steps to "
        "run; each reads batch_size x gradient_accumulation_steps rows from the stream, which "
        "starts again if it ends), or load the data without streaming=True.")


def check_stream_task(task: Task, splits: Splits) -> None:
    """A streamed training split, refused for a task that cannot read one (`Task.streams`)."""
    if task.streams or not data.is_stream(splits.train):
        return
    able = " and ".join(repr(name) for name in sorted(TASKS) if TASKS[name].streams)
    raise FineTuneError(
        f"streamed training data (an IterableDataset) is read as training consumes it for "
        f"task={able} so far; this is a {task.name!r} fine-tune. Load the data without "
        "streaming=True, or take the rows you train on: "
        "datasets.Dataset.from_list(list(stream.take(n))).")


def pick_splits(dataset: Any, config: FineTuneConfig) -> Splits:
    """The training split and the evaluation split (if any) of what the user passed."""
    try:
        train, evaluation, eval_name = data.pick_splits(dataset, config.eval_dataset)
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    if evaluation is None:
        return Splits({"train": train}, None)
    return Splits({"train": train, eval_name: evaluation}, eval_name)


def task_from_columns(train: Any, config: FineTuneConfig) -> str | None:
    """task="auto" for a model without a task head: the one task whose columns (`Task.columns`)
    the training split has; None when none has them (the default task); refused when several
    fit."""
    present = set(data.columns_of(train))
    if config.text_column in present and config.text_column != "text":
        return None  # columns named for classification
    fits = [name for name in TASKS if TASKS[name].columns
            and set(TASKS[name].columns) <= present]
    if len(fits) > 1:
        raise FineTuneError(
            f"task='auto' cannot tell the task from the columns ({', '.join(sorted(present))}): "
            f"they fit {', '.join(map(repr, fits))}. Pass task=... .")
    return fits[0] if fits else None


def check(config: FineTuneConfig, task: Task, context: TaskContext, splits: Splits) -> None:
    """The model and `lora=` for the task, and every split, refused before any work when
    they cannot work."""
    instance = context.instance
    names = ([type(instance).__name__] if instance is not None
             else list(getattr(context.model_config, "architectures", None) or []))
    task.check_model(context.model_config, names)
    check_lora_task(config, task)
    if config.augment and not task.augments:
        raise FineTuneError(f"augment=True is for image classification; this is a {task.name!r} "
                            "fine-tune: drop augment=.")
    for split, ds in splits.named.items():
        if not data.is_stream(ds) and len(ds) == 0:  # a stream: its first rows are checked
            raise FineTuneError(f"the {split} data is empty: it needs at least one row.")


def check_lora_task(config: FineTuneConfig, task: Task) -> None:
    """`lora=` refused, before any work, for a task without peft's support here."""
    if config.lora in (False, None, "auto") or task.peft_task_type is not None:
        return
    supported = " and ".join(f"task={name!r}" for name in sorted(TASKS)
                             if TASKS[name].peft_task_type is not None)
    raise FineTuneError(f"lora= works for {supported} so far; this is a {task.name!r} "
                        "fine-tune: drop lora= to fine-tune every weight.")


def build_plan(config: FineTuneConfig, context: TaskContext, task: Task,
               prepared: Prepared, output_dir: str | None) -> TrainPlan:
    """The `TrainPlan` of a task's prepared data: steps per epoch and in total, devices,
    output folder (`output_dir`, checked by `preparation.check_output_dir`), the checkpoint to
    resume."""
    encoded = prepared.data
    streamed = isinstance(encoded.train, StreamedSplit)
    # A stream's epoch is not known: max_steps (required) is the whole run, one "epoch".
    per_epoch = int(config.max_steps) if streamed else steps_of_an_epoch(config, encoded)
    total = (int(config.max_steps) if config.max_steps is not None
             else max(1, math.ceil(config.epochs * per_epoch)))
    fingerprint = {
        "train_rows": None if streamed else encoded.train.num_rows,
        "batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "buckets": list(map(int, encoded.bucket_lengths)),
        "seed": config.seed,
        "total_steps": total,
        "labels": list(encoded.label_names),
        "train_digest": (encoded.train.digest if streamed
                         else preparation.digest(encoded.train)),
    }
    if config.augment:  # other images each step: a resume without it is refused
        fingerprint["augment"] = True
    if prepared.lora:  # a resume with other LoRA settings is refused
        fingerprint["lora"] = prepared.lora
    resume = preparation.checkpoint_to_resume(config, output_dir, fingerprint)
    check_output_space(context, task, prepared, output_dir, total, config.save_steps, resume)
    sharding = prepared.sharding or ("data" if config.sharding == "auto" else config.sharding)
    has_eval = encoded.eval is not None and encoded.eval.num_rows > 0
    trainer = trainer_settings(config, task, total, has_eval)
    fields = preparation.config_fields(config, output_dir, resume)
    fields["warmup_steps"] = trainer.warmup_steps  # a ratio resolved to steps
    return TrainPlan(
        model=context.source,
        model_kwargs=prepared.model_kwargs,
        tokenizer=context.tokenizer,
        data=encoded,
        total_steps=total,
        steps_per_epoch=per_epoch,
        metrics=tuple(config.metrics) + ((TrainerMetrics(config.compute_metrics),)
                                         if config.compute_metrics is not None else ()),
        devices=context.devices,
        fingerprint=fingerprint,
        **fields,
        task=task.name,
        trainer=trainer,
        sharding=sharding,
        gradient_checkpointing=bool(config.gradient_checkpointing),
        lora=prepared.lora,
        memory=prepared.memory,
        auto_class=task.auto_class_for(context.model_config),
    )


def steps_of_an_epoch(config: FineTuneConfig, encoded: EncodedData) -> int:
    """Full steps in one epoch (refused when there is none); notes what is dropped or
    truncated."""
    train = encoded.train
    preparation.check_batch_fits(config, train.num_rows)
    per_epoch = steps_per_epoch(train, config.rows_per_step)
    if per_epoch == 0:
        raise FineTuneError(
            f"no length bucket has {config.rows_per_step} training rows for a full step; pass "
            "max_length=... (one bucket) or a smaller batch_size."
        )
    used = per_epoch * config.rows_per_step
    if used < train.num_rows:
        encoded.notes.append(f"{train.num_rows - used} of {train.num_rows} training rows left "
                             "out per epoch (ragged batches are dropped; a different remainder "
                             "each epoch)")
    for split in (encoded.train, encoded.eval):
        if split is not None and split.truncated:
            encoded.notes.append(f"{split.truncated} {split.name} rows truncated to "
                                 f"{encoded.bucket_lengths[-1]} tokens")
    return per_epoch
