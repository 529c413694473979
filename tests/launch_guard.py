"""A guard for the refusal tests: bad input must be refused before anything is forked."""

from __future__ import annotations

import pytest


def refuse_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any `notebook_launcher` call fail the test, where the launch package defines it and
    where `fine_tune` uses it."""
    import hfxla_nb.launch
    import hfxla_nb.train.finetune

    def refuse(*args, **kwargs):
        raise AssertionError("notebook_launcher was called")

    monkeypatch.setattr(hfxla_nb.launch, "notebook_launcher", refuse)
    monkeypatch.setattr(hfxla_nb.launch, "launch", refuse)  # what fine_tune calls
    monkeypatch.setattr(hfxla_nb.train.finetune, "launch", refuse)
