"""What `fine_tune` loads in the kernel: the model's config, its tokenizer, the output folder.

Each function refuses what cannot work with a `FineTuneError` that says what to pass instead.
"""

from __future__ import annotations

import contextlib
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from ...launch.preflight import LaunchRefusedError, launch_devices
from ...runtime import detect_accelerator
from ..config import FineTuneError
from ..tasks.registry import AUTO, DEFAULT_TASK, TASKS
from ..worker import checkpoint as ckpt


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
