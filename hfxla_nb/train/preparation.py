"""The kernel side of fine_tune and predict: what every task's preparation shares.

- What a task's kernel side receives and returns: `Splits` (the data's splits, picked once),
  `TaskContext` (the model as loaded in the kernel) and `Prepared` (the encoded data and what
  the plan needs besides). `train.prepare` builds the first two and turns the third into the
  plan.
- What `fine_tune` loads in the kernel: the model's source and config, the task its head
  names, its tokenizer, and the output folder.
- The steps every task's preparation shares: the row length, the batch size against the
  data, the padding token, the devices, the LoRA settings and the memory plan, the checkpoint
  to resume, a digest of the training rows.

Runs before any fork, without starting the XLA runtime. Each function refuses what cannot
work with a `FineTuneError` that says what to pass instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..launch.preflight import LaunchRefusedError, launch_devices
from ..runtime import detect_accelerator
from . import lora
from .batching import EncodedData
from .config import FineTuneConfig, FineTuneError
from .memory import MemoryPlan, MemoryPlanError, plan_memory
from .tasks import AUTO, DEFAULT_TASK, TASKS
from .worker import saving as ckpt

if TYPE_CHECKING:
    import datasets
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


# -- what a task's kernel side receives and returns --

@dataclass
class Splits:
    """The data's splits, picked once by `data.pick_splits`.

    Attributes:
        named: split name -> `datasets.Dataset`, training first (`{"train": ..., name: ...}`).
        eval_name: the evaluation split's name (None: no evaluation).
    """

    named: dict[str, datasets.Dataset]
    eval_name: str | None

    @property
    def train(self) -> datasets.Dataset:
        return self.named["train"]


@dataclass
class TaskContext:
    """The model as loaded in the kernel (config and tokenizer, no weights), for a task's
    `prepare`.

    Attributes:
        source: what the worker loads: a name or folder (str), or the model instance given.
        model_config: the model's transformers config.
        fixed_labels: the head size of a model instance (it cannot change), else None.
        tokenizer: the tokenizer the data is encoded with.
        model_name: a short name (the default output folder's).
        devices: the devices the run trains on.
    """

    source: str | torch.nn.Module
    model_config: PretrainedConfig
    fixed_labels: int | None
    tokenizer: PreTrainedTokenizerBase
    model_name: str
    devices: int

    @property
    def instance(self) -> torch.nn.Module | None:
        """The model instance given, or None for a name or folder."""
        return None if isinstance(self.source, str) else self.source


@dataclass
class Prepared:
    """What a task's `prepare` returns: the encoded data and what the plan needs besides.

    Attributes:
        data: the encoded splits (`batching.EncodedData` or a task's subclass of it).
        model_kwargs: `from_pretrained` arguments for the worker (a head sized for the labels).
        lora: the LoRA settings (`lora.lora_settings`' JSON), None for a full fine-tune.
        memory: the `MemoryPlan` the run was checked with, when it was.
        sharding: the parameter layout the task decided ("data", "fsdp"); None: the config's
            (`sharding="auto"` is "data").
    """

    data: EncodedData
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] | None = None
    memory: MemoryPlan | None = None
    sharding: str | None = None


# -- what fine_tune loads: the model, its tokenizer, the output folder --

def _fail(message: str) -> FineTuneError:
    return FineTuneError(message)


def model_source(model: Any) -> tuple[Any, Any, int | None, str]:
    """(what the worker loads, its config, the fixed head size or None, a short name)."""
    if isinstance(model, (str, os.PathLike)):
        source = local_folder(os.fspath(model))
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(source)
        except Exception as error:  # noqa: BLE001 - say what to do, whatever failed
            reason = str(error).rstrip(". ")
            if os.path.isdir(source):
                raise _fail(f"could not load the config of model folder "
                            f"{os.path.abspath(source)}: {reason}. Pass a folder written by "
                            "save_pretrained.") from None
            raise _fail(
                f"could not load the config of Hub model id {source!r}: {reason}. Check the "
                f"id (no folder {os.path.abspath(source)} here either) and the network (no "
                "Hub access: download the model on a machine that has it and copy the "
                "folder), or pass a local folder written by save_pretrained."
            ) from None
        return source, config, None, Path(source.rstrip("/")).name or "model"
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "forward"):
        raise _fail(
            f"model must be a model name, a folder, or a transformers model instance; got "
            f"{type(model).__name__}."
        )
    heads = _task_heads()
    if not any(type(model).__name__.endswith(suffix) for suffixes in heads.values()
               for suffix in suffixes):
        raise _fail(
            f"model is a {type(model).__name__}, which has no head fine_tune trains (a "
            f"class name ending in {', '.join(s for v in heads.values() for s in v)}). Pass "
            "e.g. AutoModelForSequenceClassification.from_pretrained(..., num_labels=N) or "
            "AutoModelForCausalLM.from_pretrained(...), or the model's name or folder."
        )
    if any(getattr(p, "device", None) is not None and p.device.type != "cpu"
           for p in model.parameters()):
        raise _fail(
            "the model instance is not on the CPU. Pass it on the CPU (or its name/folder): "
            "the worker moves it to the XLA devices itself."
        )
    name = Path(str(getattr(config, "_name_or_path", "") or "").rstrip("/")).name
    return model, config, int(config.num_labels), name or type(model).__name__


def local_folder(name: str) -> str:
    """`name` as given when it reads as a Hub model id (`org/name`, `name`), else the local
    folder it names (`~` expanded), refused when that is not a model folder.

    A Hub id has at most one "/" and never starts with ".", "/" or "~", so a missing folder
    like "./my-model" is named as a folder, not sent to the Hub as an invalid id.
    """
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise _fail(
                f"model folder {os.path.abspath(path)} has no config.json; pass a folder "
                "written by save_pretrained (config.json and weights) or a model name on the "
                "Hub."
            )
        return path
    hub_like = (not name.startswith((".", "~", "/", os.sep)) and name.count("/") <= 1
                and "\\" not in name)
    if hub_like and not os.path.exists(path):
        return name
    what = "is a file, not a folder" if os.path.exists(path) else "does not exist"
    given = (f"model={name!r}" if os.path.isabs(path)
             else f"model={name!r}, relative to the working directory {os.getcwd()}")
    raise _fail(
        f"model folder {os.path.abspath(path)} {what} ({given}). Pass the folder that "
        "save_pretrained wrote (config.json and weights), or a model id on the Hub such as "
        "'bert-base-cased' or 'org/name'."
    )


def _task_heads(picking: bool = False) -> dict[str, tuple[str, ...]]:
    """Task name -> the model class name endings that mean it (every registered task; with
    `picking`, only those that task="auto" may pick by the head)."""
    return {name: tuple(TASKS[name].head_suffixes) for name in TASKS
            if not picking or TASKS[name].pick_by_head}


def head_task(model: Any, model_config: Any, every_head: bool = False) -> str | None:
    """The task whose head the model (its class, or its config's architectures) has; only
    tasks that task="auto" picks by the head (`Task.pick_by_head`) unless `every_head`."""
    names = list(getattr(model_config, "architectures", None) or [])
    if not isinstance(model, (str, os.PathLike)):
        names = [type(model).__name__]
    heads = _task_heads(picking=not every_head)
    for name in names:
        matching = [task for task, suffixes in heads.items()
                    if any(name.endswith(suffix) for suffix in suffixes)]
        # A head ending several tasks share (...ForSequenceClassification: text or audio) goes
        # to the task that claims the model's config, else to the first.
        claimed = [task for task in matching if TASKS[task].claims_model(model_config)]
        if matching:
            return (claimed or matching)[0]
    return None


def resolve_task(task: str, model: Any, model_config: Any,
                 every_head: bool = False) -> str | None:
    """The task name: as asked (checked against a model instance's head), or (for "auto")
    the task whose head the model has (`head_task`), None when it has none."""
    if task == AUTO:
        return head_task(model, model_config, every_head)
    if not isinstance(model, (str, os.PathLike)):
        name = type(model).__name__
        suffixes = _task_heads().get(task, ())
        if not any(name.endswith(suffix) for suffix in suffixes):
            wanted = " or ".join(f"...{suffix}" for suffix in suffixes) or "its head"
            found = head_task(model, model_config) or DEFAULT_TASK
            raise _fail(f"task={task!r}, but model is a {name}, which has no head for it: "
                        f"pass a {wanted} model (or the model's name or folder), or "
                        f"task={found!r}.")
    return task


def load_tokenizer(tokenizer: Any, model: Any, source: Any):
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        if not callable(tokenizer):
            raise _fail(f"tokenizer must be a tokenizer, a name or a folder; got "
                        f"{type(tokenizer).__name__}.")
        return tokenizer
    where = tokenizer
    if where is None:
        if isinstance(source, str):
            where = source
        else:
            where = getattr(model.config, "_name_or_path", None)
            if not where or not os.path.isdir(where):
                raise _fail(
                    "the model instance does not say where its tokenizer is: pass "
                    "tokenizer=AutoTokenizer.from_pretrained(...) (or its name or folder)."
                )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(os.fspath(where))
    except Exception as error:  # noqa: BLE001
        raise _fail(
            f"could not load a tokenizer from {os.fspath(where)!r}: {error}. Pass "
            "tokenizer=... (a tokenizer, a name, or a folder with tokenizer files)."
        ) from None


def position_limit(config: Any) -> int | None:
    """How many positions the model can embed (None when it does not say)."""
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    # RoBERTa-style models offset positions by padding_idx + 1.
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "longformer",
                                             "data2vec-text", "xmod"):
        pad = getattr(config, "pad_token_id", 1) or 1
        limit -= pad + 1
    return limit


# Where output_dir="auto" puts each run's folder (relative to the working folder).
OUTPUT_ROOT = "hfxla_nb_output"
# Names that mark a folder holding a saved model: a run there would replace it.
SAVED_MODEL_FILES = frozenset({
    "config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
    "pytorch_model.bin.index.json", "adapter_config.json", "adapter_model.safetensors",
    "adapter_model.bin", "adapter", ckpt.RUN_FILE, ckpt.CHECKPOINTS,
})


def new_output_dir(model_name: str, started: datetime | None = None,
                   root: str | os.PathLike = OUTPUT_ROOT) -> Path:
    """The folder `output_dir="auto"` gives a run: new for each run, so that no run replaces
    another's model.

    Args:
        model_name: the model's short name (a Hub id's last part, a folder's name).
        started: when the run started (default: now).
        root: the folder that holds every run's folder.

    Returns:
        `root/<model_name>-<YYYYmmdd-HHMMSS>`, or that name with `-2`, `-3`, ... after it when
        it exists already (two runs started in the same second).
    """
    started = started or datetime.now()
    return next_free(Path(root) / f"{model_name}-{started:%Y%m%d-%H%M%S}")


def next_free(base: Path) -> Path:
    """`base` when nothing is there, else the first of `base-2`, `base-3`, ... that is free."""
    path, count = base, 1
    while os.path.lexists(path):
        count += 1
        path = base.with_name(f"{base.name}-{count}")
    return path


def claim_output_dir(path: str | os.PathLike) -> str:
    """Create a run's new default folder before the fork, so that a run started in the same
    second by another kernel takes the next free name instead of this one.

    Args:
        path: the folder `new_output_dir` named.

    Returns:
        The folder created, absolute: `path`, or the next free name after it.

    Raises:
        FineTuneError: the folder cannot be created.
    """
    base = Path(path)
    while True:
        target = next_free(base)
        try:
            target.mkdir(parents=True)
        except FileExistsError:
            continue  # taken between the look and the mkdir: try the next name
        except OSError as error:
            raise _fail(f"could not create output_dir {target}: {error}. Pass output_dir=... "
                        "a folder you can write to (or output_dir=None to save nothing).") from None
        return str(target)


def release_output_dir(path: str | os.PathLike | None) -> None:
    """Remove a folder `claim_output_dir` created when the run wrote nothing in it (it
    failed before saving), and `hfxla_nb_output` itself when that is empty then; a folder
    with anything in it stays."""
    if path is None:
        return
    folder = Path(path)
    with contextlib.suppress(OSError):  # not empty, or gone: left as it is
        os.rmdir(folder)
        if folder.parent.name == OUTPUT_ROOT:
            os.rmdir(folder.parent)


def check_output_dir(output_dir: Any, model_name: str, *, overwrite: bool = False,
                     resume: Any = None, started: datetime | None = None) -> str | None:
    """The run's output folder, absolute, refused when a run there could not work or would
    replace a saved model without being asked to.

    Args:
        output_dir: the `output_dir` option: "auto" (a new folder, `new_output_dir`), None
            (save nothing), or a folder.
        model_name: the model's short name, for the default folder.
        overwrite: `overwrite_output_dir`: a named folder that holds a saved model may be
            replaced.
        resume: `resume_from_checkpoint`: a run that resumes from the checkpoints of the
            folder it writes needs no `overwrite`.
        started: when the run started (the default folder's name; default: now).

    Returns:
        The folder (None when nothing is saved). Nothing is created here.

    Raises:
        FineTuneError: a file, a folder that cannot be written, a folder with other files, a
            folder with a saved model without `overwrite_output_dir=True`, or
            `resume_from_checkpoint=True` with the default (new) folder.
    """
    if output_dir is None:
        return None
    if output_dir == "auto":
        if resume is True:
            raise _fail(resume_needs_a_folder(model_name))
        output_dir = new_output_dir(model_name, started)
    path = Path(os.fspath(output_dir)).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            raise _fail(f"output_dir {path} exists and is a file; pass a folder path.")
        if not os.access(path, os.W_OK | os.X_OK):
            raise _fail(f"output_dir {path} is not writable; pass a folder you can write to.")
        entries = [e for e in os.listdir(path) if not e.startswith(".")]
        saved = sorted(e for e in entries if e in SAVED_MODEL_FILES or e.endswith(".safetensors"))
        if saved:
            if not (overwrite or resumes_into(resume, path)):
                raise _fail(
                    f"output_dir {path} already holds a saved model ({', '.join(saved[:5])}), "
                    "and this run would replace it. Pass overwrite_output_dir=True to replace "
                    "it, or pass another output_dir, or leave output_dir out: each run then "
                    f"gets a new folder ({OUTPUT_ROOT}/<model name>-<start time>)."
                )
        elif set(entries) - {ckpt.RUNS}:
            raise _fail(
                f"output_dir {path} already holds other files ({', '.join(sorted(entries)[:5])})"
                "; pass a new or empty folder (or leave output_dir out for a new folder)."
            )
        return str(path)
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise _fail(
            f"output_dir {path} cannot be created: {parent} is not a writable folder. Pass a "
            "folder you can write to (or output_dir=None to save nothing)."
        )
    return str(path)


def resumes_into(resume: Any, folder: Path) -> bool:
    """Whether `resume_from_checkpoint` continues from checkpoints inside `folder` (True: the
    latest of `folder`'s own): resuming writes the folder it resumes from."""
    if resume is True:
        return True
    if resume is None or resume is False:
        return False
    where = Path(os.fspath(resume)).expanduser().absolute()
    return where == folder or folder in where.parents


def resume_needs_a_folder(model_name: str) -> str:
    """The refusal of `resume_from_checkpoint=True` without `output_dir`: the default folder
    is new, so it holds no checkpoint; names the newest folder of this model that has some."""
    root = Path(OUTPUT_ROOT).absolute()
    folders = [root / model_name, *root.glob(f"{model_name}-*")] if root.is_dir() else []
    found = sorted((f.stat().st_mtime, f) for f in folders if ckpt.list_checkpoints(f))
    hint = f" (the newest with checkpoints here: output_dir={str(found[-1][1])!r})" if found else ""
    return ("resume_from_checkpoint=True continues from the checkpoints in output_dir, and "
            "the default output_dir is a new folder for each run, with none in it: pass the "
            f"interrupted run's folder as output_dir{hint}, or the checkpoint folder itself "
            "as resume_from_checkpoint.")


def on_tpu() -> bool:
    return detect_accelerator().kind == "tpu"


def device_count(num_processes: int | None) -> int:
    """The XLA devices the run gets, decided as the launcher decides them (refused when
    `num_processes` asks for more than this machine has), without starting the runtime."""
    accelerator = detect_accelerator()
    try:
        return launch_devices(num_processes, accelerator.kind, accelerator.devices)
    except LaunchRefusedError as error:
        raise _fail(str(error)) from None


# -- the steps every task's preparation shares --

def length_cap(config: FineTuneConfig, model_config: Any, tokenizer: Any,
               default: int | None = None) -> int:
    """The longest row in tokens: `max_length` (refused beyond the model's positions), else
    the least of what the model, the tokenizer and `default` allow (512 without any)."""
    limit = position_limit(model_config)
    if config.max_length is not None:
        if limit is not None and config.max_length > limit:
            raise FineTuneError(
                f"max_length={config.max_length} is beyond the {limit} positions the model has "
                f"(max_position_embeddings); pass max_length<={limit} (longer texts are cut)."
            )
        return int(config.max_length)
    candidates = [value for value in (limit, default) if value]
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 100_000:
        candidates.append(tokenizer_limit)
    return min(candidates) if candidates else 512


def check_batch_fits(config: FineTuneConfig, train_rows: int) -> None:
    if config.rows_per_step > train_rows:
        what = "batch_size" if config.gradient_accumulation_steps == 1 else (
            "batch_size x gradient_accumulation_steps")
        raise FineTuneError(
            f"{what} = {config.rows_per_step} is larger than the {train_rows} training rows; "
            f"use batch_size <= {train_rows // config.gradient_accumulation_steps} or more data."
        )


def pad_id(tokenizer: Any, notes: list[str]) -> int | None:
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        # Decoder tokenizers (GPT-2 style) have no padding token; the end-of-text token is the
        # usual stand-in, and the model must know it to find each row's last real token.
        pad_id = getattr(tokenizer, "eos_token_id", None)
        notes.append("the tokenizer has no padding token: padding with its end-of-text token")
    return pad_id


def devices(config: FineTuneConfig) -> int:
    devices = device_count(config.num_processes)
    if config.strategy == "replicated" and devices > 1 and not on_tpu():
        raise FineTuneError(
            f"strategy='replicated' over {devices} devices cannot train on the CPU: XLA's "
            "gradient all-reduce between CPU virtual devices hangs upstream (pytorch/xla#5005, "
            "pytorch/xla#9089). Use strategy='spmd' (the default; real data parallelism on the "
            "CPU too), or num_processes=1."
        )
    if config.strategy == "spmd" and config.batch_size % devices:
        raise FineTuneError(
            f"batch_size={config.batch_size} does not split evenly over the {devices} devices; "
            f"use a multiple of {devices} (e.g. {devices * max(1, config.batch_size // devices)})."
        )
    return devices


def lora_and_memory(config: FineTuneConfig, model: Any, model_config: Any, task_type: str,
                    max_length: int, devices: int, notes: list[str]
                    ) -> tuple[dict[str, Any] | None, MemoryPlan]:
    """`lora=` checked into peft's settings (None: a full fine-tune), and the memory plan of
    the run, which decides `lora="auto"` (noted).

    Args:
        model: what LoRA and the memory are sized on: the instance given, or a model built on
            the meta device, or its config.
        task_type: peft's task type (`Task.peft_task_type`).

    Raises:
        FineTuneError: the LoRA settings cannot work.
        MemoryPlanError: the run does not fit the device memory.
    """
    requested = config.lora if config.lora != "auto" else False
    lora_json = lora.lora_settings(requested, model, model_config, task_type)
    memory = memory_plan_of(config, model, lora_json, max_length, devices, notes)
    if memory.lora_rank and lora_json is None:  # lora="auto" chose LoRA
        lora_json = lora.lora_settings(True, model, model_config, task_type)
    return lora_json, memory


def memory_plan_of(config: FineTuneConfig, model: Any, lora_json: dict[str, Any] | None,
                   max_length: int, devices: int, notes: list[str]) -> MemoryPlan:
    """The memory plan of this run on this machine's devices; "auto" sharding and LoRA are
    decided by it (and noted); refused, with its numbers and the changes that would make it
    fit, when it cannot fit."""
    spmd = config.strategy == "spmd" and devices > 1
    plan = plan_memory(
        model, batch_size=int(config.batch_size), max_length=max_length,
        precision=config.precision, lora=lora_json or config.lora,
        sharding=config.sharding if spmd else "data",
        gradient_checkpointing=bool(config.gradient_checkpointing), devices=devices)
    notes.extend(plan.notes)
    if not plan.fits:
        raise MemoryPlanError(f"this fine-tune does not fit the device memory, so nothing was "
                              f"started:\n{plan}")
    return plan


def config_fields(config: FineTuneConfig, output_dir: str | None,
                  resume: Any) -> dict[str, Any]:
    """The `TrainPlan` fields every task takes from its config as they are (optimizer, schedule,
    precision, strategy, logging), with the output folder and the checkpoint to resume."""
    return dict(
        batch_size=int(config.batch_size),
        gradient_accumulation_steps=int(config.gradient_accumulation_steps),
        learning_rate=float(config.learning_rate),
        weight_decay=float(config.weight_decay),
        warmup_steps=int(config.warmup_steps) if config.warmup_steps >= 1 else 0,
        max_grad_norm=None if config.max_grad_norm is None else float(config.max_grad_norm),
        precision=config.precision,
        strategy=config.strategy,
        output_dir=output_dir,
        save_steps=config.save_steps,
        resume_from=str(resume) if resume is not None else None,
        seed=int(config.seed),
        log_every=int(config.log_every),
        save=output_dir is not None,
        fallback_dir=None if config.fallback_dir is None else str(config.fallback_dir),
        augment=bool(config.augment),
        capture_steps=config.replays_steps,
    )


def checkpoint_to_resume(config: FineTuneConfig, output_dir: str | None,
                          fingerprint: dict[str, Any]):
    """The checkpoint to continue from (or None); refused when it was written by other
    settings or other data."""
    try:
        resume = ckpt.resolve_checkpoint(config.resume_from_checkpoint, output_dir or ".")
    except ValueError as error:
        raise FineTuneError(str(error)) from None
    if resume is None:
        return None
    previous = ckpt.read_checkpoint_info(resume).get("fingerprint", {})
    different = sorted(k for k in fingerprint if previous.get(k) != fingerprint[k])
    if different:
        details = ", ".join(f"{k}: {previous.get(k)!r} then, {fingerprint[k]!r} now"
                            for k in different if k != "train_digest")
        if "train_digest" in different:
            details = (details + ", " if details else "") + "the training rows differ"
        raise FineTuneError(
            f"the checkpoint {resume} was written by a run with other settings ({details}). "
            "Resume with the same data, batch_size, seed, max_steps/epochs and max_length, or "
            "start a new run without resume_from_checkpoint."
        )
    return resume


def digest(split) -> str:
    digest = hashlib.sha1()
    for bucket in split.buckets:
        # The arrays' own buffers: `tobytes` would copy each bucket whole (the peak).
        digest.update(np.ascontiguousarray(bucket.inputs))
        digest.update(np.ascontiguousarray(bucket.labels))
        for name, values in sorted(bucket.fields.items()):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(values))
    return digest.hexdigest()[:16]
