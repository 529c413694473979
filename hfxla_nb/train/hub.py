"""The Hub: a fine-tuned model's folder and its model card, uploaded with `huggingface_hub`.

`fine_tune(..., push_to_hub=True)` checks the token and the Hub in the kernel before the fork
(`kernel/hub.py` calls `hub_target`), and after the launch returns, still in the kernel, pushes
the saved folder (`push_after_training`); `FineTuneResult.push_to_hub` pushes a result later.
One commit holds every file of the output folder but its checkpoints (the merged model and,
for LoRA, `adapter/`), and the model card (`hub_card.py`) as `README.md`; nothing is written
to the folder itself.

The token is read by `huggingface_hub` (`HF_TOKEN`, else the saved login) and never printed:
every message that leaves this module has it replaced (`_hidden`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hub_card import FineTuneRun, model_card
from .worker import checkpoint as ckpt

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
