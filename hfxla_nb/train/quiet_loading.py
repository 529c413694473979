"""Library progress bars kept out of the notebook cell while hfxla_nb loads a model there.

`FineTuneResult.load_model` (and so `generate`) runs `from_pretrained` in the kernel, where
transformers draws a "Loading weights 100% 21/21" bar under the cell's own output. Only our own
loads are quieted: the bars' on/off state is as it was afterwards, so the user's own
`from_pretrained` calls keep theirs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' and huggingface_hub's progress bars off within the block, each restored
    to its own state after it (even when the block raises)."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from huggingface_hub.utils import disable_progress_bars as hub_disable
    from huggingface_hub.utils import enable_progress_bars as hub_enable
    from transformers.utils import logging as hf_logging

    transformers_on = hf_logging.is_progress_bar_enabled()
    hub_on = not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # also turns the hub's bars off
    try:
        yield
    finally:
        if transformers_on:
            hf_logging.enable_progress_bar()  # also turns the hub's bars on
        if hub_on:
            hub_enable()
        else:
            hub_disable()
