"""README.md is the door: its links exist, and its quickstart runs as printed in a fresh Jupyter
kernel, with no network, and shows what the README says it shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import Kernel

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def quickstart() -> str:
    """The first ```python block of the README's Quickstart section, as printed."""
    section = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    (code, *_) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return code


def test_every_relative_link_of_the_readme_and_the_docs_exists():
    """Links and images (`[text](path)`, `![alt](path)`) that are not URLs point at files."""
    for page in [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "notebooks/README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            assert path.exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"


def test_the_quickstart_is_short():
    lines = [line for line in quickstart().splitlines() if line.strip()]
    assert len(lines) <= 7, lines


@pytest.mark.kernel
def test_the_quickstart_runs_as_printed_in_a_fresh_kernel(tmp_path):
    """One cell, exactly the README's block, in a new kernel whose working folder is empty
    (fine_tune's `output_dir="auto"` writes there). It prints the result's one line, and its
    last line shows the predictions as a table: a row per text, its label and score."""
    kernel = Kernel(**_offline())
    try:
        kernel.run_ok(f"import os; os.chdir({str(tmp_path)!r})")
        output = kernel.run(quickstart(), timeout=600)
        assert output.error is None, "\n".join(output.error["traceback"])
        assert re.search(r"<FineTuneResult: 40 steps, .*eval_accuracy=[\d.]+.*saved to ",
                         output.stdout), output.stdout
        # From the call's first moment the cell says what the kernel prepares (it loads and
        # tokenizes for seconds); the memory plan then takes that line's place, with the time.
        first = output.displays[0]
        assert first["data"]["text/plain"].startswith("fine_tune  preparing in this process")
        (last,) = [u["data"]["text/plain"] for u in output.updates
                   if u["transient"]["display_id"] == first["transient"]["display_id"]]
        assert re.match(r"(memory  plan .*; |fine_tune  )prepared in [\d.]+ (ms|s) in this "
                        r"process", last), last
        (returned,) = [d["data"]["text/plain"] for d in output.displays if "execution_count" in d]
        # The predictions show as a table: a heading, the columns, one row per text.
        heading, columns, row, *_ = returned.splitlines()
        assert heading.startswith("Predictions: 1 input (classification)"), returned
        assert columns.split() == ["input", "label", "score"], returned
        # The row names its input by its text (cut to the column's width), then label and score.
        *words, label, score = row.split()
        assert " ".join(words).startswith("A wonderful place"), returned
        assert label == "positive" and 0.5 < float(score) <= 1, returned
    finally:
        kernel.close()


def _offline() -> dict[str, str]:
    """Hugging Face's offline switches: the quickstart must not need the network."""
    return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
