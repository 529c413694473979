"""The Hub: a fine-tuned model's folder and its model card, uploaded with `huggingface_hub`.

`fine_tune(..., push_to_hub=True)` checks the Hub in the kernel before the fork (`check_hub`):
a token, a Hub that answers, a token that may write, a valid repository id. A refusal is a
`FineTuneError` that says what to do (log in, set HF_TOKEN, check HF_ENDPOINT). After the
launch returns, still in the kernel, it pushes the saved folder (`push_after_training`);
`FineTuneResult.push_to_hub` pushes a result later. One commit holds every file of the output
folder but its checkpoints (the merged model and, for LoRA, `adapter/`), and the model card as
`README.md`; nothing is written to the folder itself.

The model card is `huggingface_hub`'s `ModelCard` with its `ModelCardData` (README.md's YAML
metadata) and a short text. `provenance` is written in the kernel before the fork and rides on
the result (`FineTuneResult.provenance`, also in the run summary): the base model, the data by
name or by shape, the training settings, the hardware and hfxla_nb's version. `model_card`
adds what the run did: metrics, steps, graphs compiled.

The token is read by `huggingface_hub` (`HF_TOKEN`, else the saved login) and never printed:
every message that leaves this module has it replaced (`_hidden`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._version import __version__
from .._words import is_count, plural
from .config import FineTuneConfig, FineTuneError
from .tasks import TASKS
from .worker import saving as ckpt

if TYPE_CHECKING:
    from .config import FineTuneConfig


# -- the model card and the run's provenance --

class FineTuneRun(Protocol):
    """What the card and the push read of a `FineTuneResult` (a Protocol, so that this module
    and `hub.py` do not import `result.py`, which imports them)."""

    output_dir: str | None
    held_model: Any
    hub_url: str | None
    provenance: dict[str, Any]
    task: str
    task_title: str | None
    metrics: dict[str, float]
    notes: list[str]
    steps: int
    epochs: float
    devices: int
    strategy: str
    precision: str
    sharding: str
    compiles: int
    eval_compiles: int
    setup_compiles: int
    bucket_lengths: list[int]
    train_seconds: float
    samples_per_second: float | None
    lora: dict[str, Any] | None

#: The settings of `FineTuneConfig` that the card lists (plain values only).
SETTINGS = ("learning_rate", "epochs", "max_steps", "batch_size", "gradient_accumulation_steps",
            "weight_decay", "warmup_steps", "max_grad_norm", "max_length", "precision",
            "strategy", "sharding", "gradient_checkpointing", "seed")


def hub_name(value: Any) -> str | None:
    """`value` when it names something on the Hub ("org/name", "name") rather than a local
    file or folder; else None."""
    if not isinstance(value, (str, os.PathLike)):
        return None
    name = os.fspath(value)
    local = os.path.exists(os.path.expanduser(name)) or name.startswith((".", "~", "/"))
    return None if local or not name or name.count("/") > 1 else name


def provenance(model: Any, dataset: Any, config: FineTuneConfig, columns: list[str],
               rows: Mapping[str, int], hardware: str) -> dict[str, Any]:
    """Where a run's model comes from, as plain (JSON) data for its model card.

    Args:
        model: `fine_tune`'s model argument (a Hub id, a folder, an instance).
        dataset: its dataset argument (a Hub name is kept; other data by shape only).
        config: the run's options.
        columns: the training data's columns.
        rows: rows per split ({"train": 960, "validation": 120}).
        hardware: the accelerator in one line (`Accelerator.description`).
    """
    config_name = getattr(getattr(model, "config", None), "_name_or_path", None)
    return {
        "base_model": hub_name(model) or hub_name(config_name),
        "dataset": hub_name(dataset),
        "columns": list(columns),
        "rows": {name: int(count) for name, count in rows.items()},
        "settings": {name: getattr(config, name) for name in SETTINGS},
        "hardware": hardware,
        "hfxla_nb_version": __version__,
    }


def _metadata(result: FineTuneRun, repo_id: str) -> dict[str, Any]:
    """The card's own block of the YAML metadata (`hfxla_nb:`): what ran and how."""
    facts = result.provenance
    return {
        "version": facts.get("hfxla_nb_version", __version__),
        "task": result.task,
        "hardware": facts.get("hardware"),
        "devices": result.devices,
        "strategy": result.strategy,
        "precision": result.precision,
        "sharding": result.sharding,
        "graphs_compiled": {"training": result.compiles, "evaluation": result.eval_compiles,
                            "setup": result.setup_compiles},
        "training": {**facts.get("settings", {}), "steps": result.steps,
                     "epochs": result.epochs, "bucket_lengths": list(result.bucket_lengths),
                     "train_seconds": round(result.train_seconds, 2),
                     "samples_per_second": result.samples_per_second},
        "data": {"name": facts.get("dataset"), "columns": facts.get("columns", []),
                 "rows": facts.get("rows", {})},
        "metrics": dict(result.metrics),
        "lora": result.lora,
        "repo_id": repo_id,
    }


def card_data(result: FineTuneRun, repo_id: str) -> Any:
    """The card's `ModelCardData`: base model, data, task, metrics (as `model-index`), tags,
    and hfxla_nb's block."""
    from huggingface_hub import EvalResult, ModelCardData

    facts = result.provenance
    task = TASKS.get(result.task)
    pipeline = (task.pipeline_tag if task is not None else "") or None
    dataset = facts.get("dataset")
    rows = facts.get("rows", {}).get("train")
    described = dataset or (f"local data ({rows} training rows)" if rows else "local data")
    scores = {name: value for name, value in result.metrics.items()
              if not is_count(name, value)}
    evals = [EvalResult(task_type=pipeline or result.task, dataset_type=dataset or "local",
                        dataset_name=described, metric_type=name.removeprefix("eval_"),
                        metric_value=float(value)) for name, value in scores.items()]
    tags = ["hfxla_nb", "xla", result.task] + (["lora", "peft"] if result.lora else [])
    return ModelCardData(
        base_model=facts.get("base_model"), datasets=[dataset] if dataset else None,
        library_name="transformers", pipeline_tag=pipeline, tags=tags,
        model_name=repo_id.split("/")[-1], eval_results=evals or None,
        hfxla_nb=_metadata(result, repo_id))


def model_card(result: FineTuneRun, repo_id: str) -> str:
    """README.md of the repository: the YAML metadata (`card_data`) and a short text."""
    from huggingface_hub import ModelCard

    data = card_data(result, repo_id)
    facts = result.provenance
    base = facts.get("base_model") or "a local model"
    dataset = facts.get("dataset") or "local data"
    settings = facts.get("settings", {})
    title = result.task_title or result.task
    lines = [
        f"# {repo_id.split('/')[-1]}", "",
        f"{title[:1].upper() + title[1:]} fine-tune of {base} on {dataset}, trained with "
        f"hfxla_nb {facts.get('hfxla_nb_version', __version__)}"
        f" (PyTorch/XLA) on {facts.get('hardware') or plural(result.devices, 'XLA device')}.",
        "", "## Evaluation", "",
        *(_table({name: _shown(name, value) for name, value in result.metrics.items()},
                 "metric") if result.metrics else ["No evaluation data."]), "",
        "## Training", "",
        *_table({"steps": result.steps, "epochs": round(result.epochs, 4),
                 **{name: value for name, value in settings.items() if value is not None},
                 "graphs compiled (training, evaluation)":
                     f"{result.compiles}, {result.eval_compiles}"}, "setting"), "",
        "## Use", "",
        "```python", f"from transformers import {_auto_class(result)}", "",
        f"model = {_auto_class(result)}.from_pretrained({repo_id!r})", "```",
    ]
    if result.lora:
        lines += ["", "The LoRA adapter alone (PEFT's format) is in `adapter/`: "
                  f"`PeftModel.from_pretrained(base, {repo_id!r}, subfolder=\"adapter\")`."]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"))


def _auto_class(result: FineTuneRun) -> str:
    task = TASKS.get(result.task)
    return task.auto_class if task is not None and task.auto_class else "AutoModel"


def _shown(name: str, value: float) -> str:
    """A metric as the result's panel shows it: a count whole, a score to 4 decimals."""
    return f"{int(value):,}" if is_count(name, value) else f"{value:.4f}"


def _table(values: Mapping[str, Any], heading: str) -> list[str]:
    """A two-column markdown table: `heading` and value."""
    return [f"| {heading} | value |", "|---|---|",
            *(f"| {name} | {value} |" for name, value in values.items())]


# -- pushing to the Hub --

#: What the refusals say to do when there is no token.
LOGIN = ("log in once with `hf auth login` (formerly `huggingface-cli login`) in a terminal, "
         "or `from huggingface_hub import notebook_login; notebook_login()` in a cell, or set "
         "the HF_TOKEN environment variable to a token with write access "
         "(https://huggingface.co/settings/tokens)")


class HubError(RuntimeError):
    """The Hub cannot take the model as asked; the message says what to do (never the
    token)."""


@dataclass(frozen=True)
class HubTarget:
    """Where a push goes, checked against the Hub (the token is not kept: `huggingface_hub`
    reads it again for the upload).

    Attributes:
        repo_id: the model repository, "namespace/name".
        private: whether a new repository is made private (None: the namespace's default).
        endpoint: the Hub's address (`HF_ENDPOINT`, default https://huggingface.co).
        user: the name the token belongs to.
    """

    repo_id: str
    private: bool | None
    endpoint: str
    user: str

    @property
    def url(self) -> str:
        return f"{self.endpoint}/{self.repo_id}"


def _api() -> Any:
    """A `HfApi` on the endpoint of this moment (`huggingface_hub.constants.ENDPOINT`, read from
    HF_ENDPOINT when huggingface_hub was imported)."""
    from huggingface_hub import HfApi, constants

    return HfApi(endpoint=constants.ENDPOINT)


def _hidden(text: str) -> str:
    """`text` with the token, wherever it appears, replaced by `***`."""
    from huggingface_hub import get_token

    token = get_token()
    return text.replace(token, "***") if token else text


def _reason(error: BaseException) -> str:
    """Why a Hub call failed, in one line, without the token."""
    text = str(error).strip().splitlines()
    return _hidden(text[0] if text else type(error).__name__)


def hub_target(repo_id: str | None, private: bool | None, default_name: str) -> HubTarget:
    """The repository a push goes to, after checking that a token is there, that the Hub
    answers, and that the token may write.

    Args:
        repo_id: "namespace/name", "name" (in the token's own namespace), or None: the token's
            namespace and `default_name`.
        private: make a new repository private (None: the namespace's default).
        default_name: the repository's name when `repo_id` is None (the output folder's).

    Returns:
        The checked `HubTarget`.

    Raises:
        HubError: no token, Hub offline mode, an unreachable Hub, a token the Hub refuses or
            that can only read, or a repository id the Hub would refuse.
    """
    from huggingface_hub import constants, get_token

    if constants.is_offline_mode():
        raise HubError("pushing to the Hub needs the network, and HF_HUB_OFFLINE is set: "
                       "unset it (and TRANSFORMERS_OFFLINE) and restart the kernel: "
                       "huggingface_hub reads it when it is imported.")
    if get_token() is None:
        raise HubError(f"pushing to the Hub needs a Hugging Face token, and none is set: {LOGIN}.")
    user = _whoami(constants.ENDPOINT)
    name = repo_id if repo_id is not None else default_name
    full = name if "/" in name else f"{user}/{name}"
    _check_repo_id(full)
    return HubTarget(repo_id=full, private=private, endpoint=constants.ENDPOINT, user=user)


def _whoami(endpoint: str) -> str:
    """The token's user name, asked of the Hub; refused with what to do."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        answer = _api().whoami()
    except HfHubHTTPError as error:
        status = getattr(error.response, "status_code", None)
        if status == 401:
            raise HubError(f"the Hub at {endpoint} refused the token (401: invalid or expired): "
                           f"{LOGIN}.") from None
        raise HubError(f"the Hub at {endpoint} answered {status}: {_reason(error)}. Try again "
                       "later.") from None
    except Exception as error:  # noqa: BLE001 - a network failure of any kind: say so
        raise HubError(
            f"the Hub at {endpoint} cannot be reached ({type(error).__name__}: "
            f"{_reason(error)}). Check the network, and HF_ENDPOINT if it is set.") from None
    role = ((answer.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubError("the Hugging Face token can only read, and a push writes: make a token "
                       "with write access at https://huggingface.co/settings/tokens, and log "
                       "in with it (`hf auth login`) or set HF_TOKEN to it.")
    return str(answer.get("name") or "")


def _check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise HubError(f"hub_model_id {repo_id!r} is not a valid repository id: "
                       f"{_reason(error)} Pass 'namespace/name' or 'name'.") from None


def uploaded_files(folder: str | os.PathLike) -> dict[str, Path]:
    """The files of an output folder that a push uploads, by their path in the repository:
    every file but the checkpoints (the model, tokenizer, run summary, LoRA's `adapter/`)."""
    root = Path(folder)
    files = {path.relative_to(root).as_posix(): path for path in sorted(root.rglob("*"))
             if path.is_file()}
    return {name: path for name, path in files.items()
            if not name.startswith(f"{ckpt.CHECKPOINTS}/") and name != "README.md"}


def push_folder(target: HubTarget, folder: str | os.PathLike, card: str,
                message: str) -> str:
    """Create the repository when missing and commit the folder's files and `card` (as
    README.md) in one commit.

    Returns:
        The repository's address.

    Raises:
        HubError: the Hub refused or could not be reached (the message says why).
    """
    from huggingface_hub import CommitOperationAdd

    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
                  for name, path in uploaded_files(folder).items()]
    operations.append(CommitOperationAdd(path_in_repo="README.md",
                                         path_or_fileobj=card.encode()))
    api = _api()
    try:
        api.create_repo(target.repo_id, private=target.private, exist_ok=True)
        api.create_commit(target.repo_id, operations=operations, commit_message=message)
    except Exception as error:  # noqa: BLE001 - any failure: one line, without the token
        raise HubError(f"could not push {folder} to {target.url} "
                       f"({type(error).__name__}: {_reason(error)}).") from None
    return target.url


def push_result(result: FineTuneRun, target: HubTarget) -> str:
    """Push `result`'s saved folder with its model card to `target`; the result then has the
    repository's address (`hub_url`).

    Raises:
        HubError: the result has no saved folder, or the push failed.
    """
    if result.output_dir is None or not Path(result.output_dir).is_dir():
        if result.held_model is not None:
            where = "the model is held in memory: result.save(folder) writes it first"
        elif result.output_dir is None:
            where = "this run saved no model (output_dir was None)"
        else:
            where = f"the saved folder {result.output_dir} is not on this machine"
        raise HubError(f"nothing to push: {where}.")
    card = model_card(result, target.repo_id)
    message = f"hfxla_nb fine_tune: {result.task}, {result.steps} steps"
    result.hub_url = push_folder(target, result.output_dir, card, message)
    return result.hub_url


def push_after_training(result: FineTuneRun, target: HubTarget) -> None:
    """`fine_tune`'s push after the launch: a failure costs nothing of the result; it is said
    in one line and in the result's notes, with how to try again."""
    try:
        url = push_result(result, target)
    except HubError as error:
        said = (f"hfxla_nb: the model was not pushed to the Hub: {error} "
                f"result.push_to_hub({target.repo_id!r}) tries again.")
        result.notes.insert(0, said)
        print(said, flush=True)
        return
    result.notes.append(f"pushed to the Hub: {url}")


# -- push_to_hub=True checked in the kernel before the fork --

def check_hub(config: FineTuneConfig, output_dir: str | None) -> HubTarget | None:
    """Where the run's push goes, checked against the Hub now; None without push_to_hub.

    Args:
        config: the run's options (`push_to_hub`, `hub_model_id`, `hub_private_repo`).
        output_dir: the run's output folder (the default repository's name is its name).

    Raises:
        FineTuneError: no token, an unreachable Hub, a token refused or read-only, a bad
            repository id; before anything is forked or written.
    """
    if not config.push_to_hub:
        return None
    name = Path(output_dir).name if output_dir else "model"
    try:
        return hub_target(config.hub_model_id, config.hub_private_repo, name)
    except HubError as error:
        raise FineTuneError(f"push_to_hub=True: {error} Or train without push_to_hub and push "
                            "the result later: result.push_to_hub(repo_id).") from None
