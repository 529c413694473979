"""`push_to_hub=True` checked in the kernel before the fork: a token, a Hub that answers, a
token that may write, a valid repository id. Refused with a `FineTuneError` that says what to
do (log in, set HF_TOKEN, check HF_ENDPOINT); the token itself is never in it.
"""

from __future__ import annotations

from pathlib import Path

from ..config import FineTuneConfig, FineTuneError
from ..hub import HubError, HubTarget, hub_target


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
